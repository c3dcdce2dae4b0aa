"""Vectorized interval arithmetic on int64 nanosecond [start, end) intervals. `union` and
`find_sorted` run their pass in C where it was built (`_intervals.c`); the numpy code below is the
reference and the fallback."""
from __future__ import annotations

import numpy as np

try:
    from rankscope.analyses import _intervals as _c_intervals
except ImportError:                  # built without a C compiler
    _c_intervals = None  # type: ignore[assignment]  # no C module: None (its stub types the built one)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique for large int arrays, by sort and dedupe: numpy 2.4's hash-based np.unique is
    ~40x slower on 2.5 M int64 (measured here: 1.93 s vs 0.05 s)."""
    s = np.sort(np.asarray(values), kind="stable")
    if len(s) == 0:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def find_sorted(keys: np.ndarray, values: np.ndarray, use_c: bool = True) -> np.ndarray:
    """The index of each value in `keys` (sorted; of repeated keys, the first), -1 where it is not there."""
    if use_c and _c_intervals is not None and _integers(keys, values):
        out = np.empty(len(values), dtype=np.int64)
        _c_intervals.find_sorted(np.ascontiguousarray(keys, dtype=np.int64),
                                 np.ascontiguousarray(values, dtype=np.int64), out)
        return out
    at = np.searchsorted(keys, values)
    found = at < len(keys)
    found[found] = keys[at[found]] == values[found]
    return np.where(found, at, -1)


def union(starts: np.ndarray, ends: np.ndarray, use_c: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into sorted, disjoint ones. Empty and negative intervals are dropped."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if use_c and _c_intervals is not None:
        starts, ends = np.ascontiguousarray(starts), np.ascontiguousarray(ends)
        out_s, out_e = np.empty(len(starts), dtype=np.int64), np.empty(len(starts), dtype=np.int64)
        m = _c_intervals.union(starts, ends, np.argsort(starts, kind="stable"), out_s, out_e)
        return out_s[:m].copy(), out_e[:m].copy()
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new_group = np.empty(len(s), dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > reach[:-1]
    group_start = np.flatnonzero(new_group)
    group_end = np.append(group_start[1:], len(s)) - 1
    return s[group_start], reach[group_end]


def _integers(*arrays: np.ndarray) -> bool:
    return all(np.asarray(a).dtype.kind == "i" for a in arrays)


def union_length_per_group(starts: np.ndarray, ends: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per group (`group`: ids 0..G-1, non-decreasing along the rows), the length of the union of
    its intervals. One `union` of every group at once, each group moved into a time range of its
    own, where the shifted times fit int64; else one `union` per group."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    n_groups = int(group[-1]) + 1 if len(group) else 0
    out = np.zeros(n_groups, dtype=np.int64)
    if not n_groups:
        return out
    lo = int(starts.min())
    span = max(int(ends.max()), int(starts.max())) - lo + 1
    if span * n_groups < 2 ** 62:
        shift = group * span - lo
        s, e = union(starts + shift, ends + shift)
        np.add.at(out, s // span, e - s)
        return out
    bounds = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    for i, j in zip(bounds, np.r_[bounds[1:], len(group)]):
        s, e = union(starts[i:j], ends[i:j])
        out[group[i]] = (e - s).sum()
    return out


def covered_between(u_starts: np.ndarray, u_ends: np.ndarray, a: np.ndarray, b: np.ndarray,
                    prefix: np.ndarray | None = None) -> np.ndarray:
    """Length of [a_i, b_i) covered by the disjoint sorted intervals (output of `union`). `prefix`:
    their cumulative lengths, 0 first, when the caller keeps them for many calls."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if len(u_starts) == 0:
        return np.zeros(len(a), dtype=np.int64)
    if prefix is None:
        prefix = np.concatenate(([0], np.cumsum(u_ends - u_starts)))
    return np.maximum(_covered_before(u_starts, u_ends, prefix, b) - _covered_before(u_starts, u_ends, prefix, a), 0)


def _covered_before(s: np.ndarray, e: np.ndarray, prefix: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of the intervals covered before t; `prefix`: the cumulative lengths, 0 first."""
    i = np.searchsorted(e, t, side="right")          # intervals ending at or before t
    partial = np.zeros(len(t), dtype=np.int64)
    inside = i < len(s)
    j = i[inside]
    partial[inside] = np.clip(t[inside] - s[j], 0, None)
    return prefix[i] + partial
