"""Operators: calls, self CPU time and device time of the kernels they launch (one rank).

Definitions (after the TensorBoard profiler's Operator view and torch.profiler `key_averages`):
  * host op: a complete event of kind CPU_OP or USER_ANNOTATION (`record_function`), on its
    thread (pid, tid). `ProfilerStep#N` spans take part in the nesting but are left out of the
    result tables (as tb-profiler does).
  * nesting: the parent of op C is the innermost op P on the same thread with
    P.start <= C.start and C.end <= P.end. Ties on the start: the longer op is the outer one.
  * self CPU time = duration - sum of the durations of the direct child ops. Runtime calls
    (cudaLaunchKernel, ...) and Python frames are not ops: their time stays in the op's self time,
    as in PyTorch's "Self CPU".
  * self device time: every device event (kernel, memcpy, memset) whose correlation id matches a
    runtime/driver call is given to the innermost op on the call's thread that encloses the
    call's start (tb-profiler's "device self duration"); total device time = self + descendants'.
  * total CPU time = sum of durations, total device time = sum of the ops' inclusive device
    time: an op nested in an op of the same group counts twice (as in tb-profiler), which makes
    the total_* columns of the "stack" grouping (child ops inherit their parent's location)
    mostly double counts: read the self_* columns there. Self times never double count.
  * whole trace (all steps and the time outside them); every thread of the trace.

Grouping (`group_by`):
  "name"    op name;
  "shapes"  (op name, input shapes): `op_args.input_dims`, recorded with `record_shapes=True`
            (null when the trace has none);
  "stack"   source location, "file(line): function", from what the trace holds (`stack_source`):
            - "call_stack": the op's own `Call stack` arg (2021 Kineto format, `with_stack=True`);
            - "python_function": the `python_function` events on the op's thread (current Kineto,
              `with_stack=True`): the Python frames that enclose the op's start;
            - None: no stack in the trace (every op lands in location null).
            `stack_frame="user"` (default) takes the innermost frame that is not library code
            (`LIBRARY_MODULES`, the standard library, site-/dist-packages, `<built-in ...>`);
            when every frame is library code, the innermost source frame. `stack_frame="top"`
            takes the innermost source frame. An op without a stack of its own (a child aten op,
            or an op on the autograd thread under a parent that has one) inherits the location of
            its nearest enclosing op that has one; ops on threads without Python frames (the
            backward thread of a python_function trace) stay at null.

Method (vectorized, no per-event Python loop): ops of all threads are sorted by (thread, start,
-end); a (thread, time) pair is one int64 key, thread * span + time offset. An op's depth = ops before it in that order on its thread minus those that ended at or
before its start (two binary searches on the sorted keys); its parent is the last op before it
with depth - 1, found with one more binary search on (depth, position) keys, then checked for
containment. Ops that only partly overlap (clock rounding) fail the check and are counted in
`nesting_conflicts` instead of being nested. "Innermost op enclosing time t" (for launches and
Python frames) is the last op starting at or before t on the thread, walked up its ancestors
while it ends at or before t: one vectorized step per nesting level. Where the C sweep
(`rankscope.analyses._nesting`, built at install) is present, both are one pass in C with the same
results: the ops of a thread in that order, a heap of the ends of those still open (depth = its
size), the last op of each depth so far.

Pure function: no printing, no file I/O. Results are the top-N groups only.
"""
from __future__ import annotations

import re
import sys
from typing import NamedTuple

import numpy as np
import polars as pl

from rankscope.analyses.intervals import sorted_unique
try:
    from rankscope.analyses import _nesting
except ImportError:                     # built without a C compiler: the numpy method
    _nesting = None  # type: ignore[assignment]  # no C module: None (its stub types the built one)
from rankscope.analyses.rank.views import (column, first_launch_rows, name_mask, of_kinds,
                                          rows_of_kinds)
from rankscope.model import DEVICE_KINDS, HOST_OP_KINDS, PROFILER_STEP_PATTERN, Kind, RankTrace, name_codes
from rankscope.units import NS_PER_MS
from rankscope.results.rank import OperatorGroups, OperatorStats

GROUPINGS = ("name", "shapes", "stack")

#: Top-level modules/packages whose frames are library code for `stack_frame="user"` (besides
#: the standard library, site-/dist-packages paths and `<built-in ...>` frames). Extendable.
LIBRARY_MODULES: set[str] = {
    "torch", "torchvision", "torchaudio", "torchtext", "functorch", "triton", "numpy", "apex",
    "fbgemm_gpu", "flashinfer", "pytorch_lightning", "lightning", "accelerate", "deepspeed",
}
_FRAME = re.compile(r"^(.+?)\((\d+)\): (.*)$")
_STDLIB = set(getattr(sys, "stdlib_module_names", ()))


def is_library_frame(frame: str) -> bool:
    """True for frames of library code (see `LIBRARY_MODULES`); False for user code."""
    m = _FRAME.match(frame)
    if not m:
        return True
    path = m.group(1).replace("\\", "/")
    if path.startswith("<") or "/site-packages/" in path or "/dist-packages/" in path \
            or re.search(r"/lib/python\d", path):
        return True
    if path.startswith("/"):
        return False
    top = path.split("/", 1)[0]
    top = top[:-3] if top.endswith(".py") else top
    return top in LIBRARY_MODULES or top in _STDLIB


def is_source_frame(frame: str) -> bool:
    m = _FRAME.match(frame)
    return m is not None and not m.group(1).startswith("<")


def operator_stats(trace: RankTrace, top_n: int = 20, group_by: str = "name",
                   stack_frame: str = "user") -> OperatorStats:
    if group_by not in GROUPINGS:
        raise ValueError(f"group_by must be one of {GROUPINGS}, not {group_by!r}")
    if stack_frame not in ("user", "top"):
        raise ValueError(f"stack_frame must be 'user' or 'top', not {stack_frame!r}")
    t = _op_times(trace)
    rows = rows_of_kinds(trace, HOST_OP_KINDS)[t.order]
    names = trace.events["name"].gather(rows)
    stack_source = None
    if group_by == "stack":
        location, labels, stack_source = _locations(trace, t, stack_frame)
    codes = name_codes(trace.events)
    keep = codes.named[rows] & ~name_mask(trace, PROFILER_STEP_PATTERN)[rows]
    name_code = codes.code[rows]
    if group_by == "name":
        group = _group_ids(name_code, keep)
    elif group_by == "shapes":
        dims = _op_args(trace, t.order, "input_dims")
        dims_code = _codes(dims)
        group = _group_ids(name_code * (int(dims_code.max(initial=0)) + 1) + dims_code, keep)
    else:
        group = _group_ids(location, keep)
    kept = group >= 0
    member = group[kept]
    n_groups = int(group.max(initial=-1)) + 1
    first = np.full(n_groups, len(group), dtype=np.int64)       # each group's first op
    np.minimum.at(first, member, np.flatnonzero(kept))
    bin_of = group + 1                              # bin 0 collects the ops of no group

    def total(values: np.ndarray) -> np.ndarray:    # exact: per-group sums stay below 2**53
        return np.bincount(bin_of, weights=values, minlength=n_groups + 1)[1:]

    key_names = names.gather(first).cast(pl.String)
    if group_by == "name":
        keys = pl.DataFrame({"name": key_names})
    elif group_by == "shapes":
        keys = pl.DataFrame({"name": key_names, "input_dims": dims.gather(first).cast(pl.String)})
    else:
        location_labels = pl.Series("location", labels + [None], dtype=pl.String)
        keys = pl.DataFrame({"location": location_labels.gather(location[first])})
        keys = keys.with_columns(_top_ops(location_labels.gather(location[kept]), names.filter(kept),
                                          t.self_cpu[kept] + t.self_dev[kept], keys["location"]))
    grouped = keys.with_columns(
        pl.Series("calls", np.bincount(member, minlength=n_groups), dtype=pl.Int64),
        pl.Series("total_cpu_ms", total(t.dur) / NS_PER_MS), pl.Series("self_cpu_ms", total(t.self_cpu) / NS_PER_MS),
        pl.Series("self_device_ms", total(t.self_dev) / NS_PER_MS),
        pl.Series("total_device_ms", total(t.total_dev) / NS_PER_MS),
        pl.Series("device_events", total(t.dev_events).astype(np.int64)))
    key_cols = keys.columns
    by_dev = grouped.sort(["self_device_ms", "self_cpu_ms", *key_cols],
                          descending=[True, True] + [False] * len(key_cols), nulls_last=True).head(top_n)
    by_cpu = grouped.sort(["self_cpu_ms", "self_device_ms", *key_cols],
                          descending=[True, True] + [False] * len(key_cols), nulls_last=True).head(top_n)
    return OperatorStats(
        group_by=group_by, by_self_device=OperatorGroups(**by_dev.to_dict(as_series=False)),
        by_self_cpu=OperatorGroups(**by_cpu.to_dict(as_series=False)), ops=int(kept.sum()), groups=n_groups,
        self_cpu_ms=float(t.self_cpu.sum()) / NS_PER_MS, device_ms=t.device_ns / NS_PER_MS,
        device_attributed_ms=t.attributed_ns / NS_PER_MS, stack_source=stack_source, nesting_conflicts=t.conflicts)


class _OpTimes(NamedTuple):
    """Per host op, in nesting order (thread, start, longest first; positive-duration ops first,
    then the zero-duration ones): its position in `host_ops(trace)`, thread, start, duration,
    parent (-1: none), self CPU, self and total device time and device events given to it."""
    order: np.ndarray
    thread: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    parent: np.ndarray
    self_cpu: np.ndarray
    self_dev: np.ndarray
    total_dev: np.ndarray
    dev_events: np.ndarray
    threads: _Threads               # the op threads; `thread` above numbers them
    conflicts: int                  # partly overlapping op pairs left unnested
    device_ns: int                  # all device events of the trace
    attributed_ns: int              # device events given to an op


def _op_times(trace: RankTrace) -> _OpTimes:
    threads = _Threads(column(trace, HOST_OP_KINDS, "pid"), column(trace, HOST_OP_KINDS, "tid"))
    g = threads.of_ops
    ts, raw_dur = column(trace, HOST_OP_KINDS, "ts_ns"), column(trace, HOST_OP_KINDS, "dur_ns")
    order = _nesting_order(g, ts, raw_dur)
    positive = raw_dur[order] > 0
    order = np.concatenate([order[positive], order[~positive]])
    g, s = g[order], ts[order]
    dur = np.maximum(raw_dur[order], 0)
    n_pos = int((dur > 0).sum())
    forest = _Forest(g[:n_pos], s[:n_pos], s[:n_pos] + dur[:n_pos])

    # device events of a launch (runtime/driver call; the first one with that correlation id)
    ev = trace.events
    dev_dur = column(trace, DEVICE_KINDS, "dur_ns")
    first_launch = first_launch_rows(trace, column(trace, DEVICE_KINDS, "correlation"))
    linked = first_launch >= 0
    first_launch = first_launch[linked]
    launch_g = threads.ids(ev["pid"].to_numpy()[first_launch], ev["tid"].to_numpy()[first_launch])
    # zero-duration ops hang under the op around them; device events under the op around their launch
    inner = forest.innermost(np.concatenate([g[n_pos:], launch_g]),
                             np.concatenate([s[n_pos:], ev["ts_ns"].to_numpy()[first_launch]]))
    parent = np.concatenate([forest.parent, inner[:len(g) - n_pos]])
    dev_op, linked_dur = inner[len(g) - n_pos:], dev_dur[linked]

    n = len(g)
    # sums by bincount, exact: an op's summed ns stay below 2**53; bin 0 collects op -1 (none)
    child_sum = np.bincount(parent + 1, weights=dur, minlength=n + 1)[1:].astype(np.int64)
    dev_bin = dev_op + 1
    self_dev = np.bincount(dev_bin, weights=linked_dur, minlength=n + 1)[1:].astype(np.int64)
    hit = dev_op >= 0
    total_dev = self_dev.copy()
    node, amount = parent[dev_op[hit]], linked_dur[hit]
    while len(node):
        up = node >= 0
        node, amount = node[up], amount[up]
        np.add.at(total_dev, node, amount)
        node = parent[node]
    return _OpTimes(order=order, thread=g, ts=s, dur=dur, parent=parent, self_cpu=np.maximum(dur - child_sum, 0),
                    self_dev=self_dev, total_dev=total_dev,
                    dev_events=np.bincount(dev_bin, minlength=n + 1)[1:], threads=threads,
                    conflicts=forest.conflicts, device_ns=int(dev_dur.sum()), attributed_ns=int(linked_dur[hit].sum()))


class _Threads:
    """The (pid, tid) threads of the host ops, numbered 0, 1, ... in (pid, tid) order."""

    def __init__(self, pid: np.ndarray, tid: np.ndarray):
        # an op's thread is mostly its predecessor's: the threads are those of the runs' first ops
        head = np.flatnonzero(np.r_[True, (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])]) if len(pid) else \
            np.zeros(0, dtype=np.int64)
        self.pids, self.tids = sorted_unique(pid[head]), sorted_unique(tid[head])
        key = self._key(pid[head], tid[head])
        self.keys = sorted_unique(key)
        self.of_ops = np.repeat(np.searchsorted(self.keys, key), np.diff(np.r_[head, len(pid)]))

    def _key(self, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """One int per (pid, tid), ordered as (pid, tid) are; -1 where pid or tid is no op's."""
        if not len(self.pids):
            return np.full(len(pid), -1, dtype=np.int64)
        p = np.minimum(np.searchsorted(self.pids, pid), len(self.pids) - 1)
        t = np.minimum(np.searchsorted(self.tids, tid), len(self.tids) - 1)
        return np.where((self.pids[p] == pid) & (self.tids[t] == tid), p * len(self.tids) + t, -1)

    def ids(self, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """Number of each (pid, tid) thread, -1 for threads without ops."""
        key = self._key(pid, tid)
        if not len(self.keys):
            return key
        at = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        return np.where((key >= 0) & (self.keys[at] == key), at, -1)


def _nesting_order(g: np.ndarray, s: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Positions sorted by (g, s, -dur), ties in position order: np.lexsort's order, made faster
    for events that come nearly in time order (timsort on s, radix sort on g, then the runs of
    equal (g, s) sorted by -dur)."""
    if not len(g):
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(s, kind="stable")
    order = order[np.argsort(g[order].astype(np.min_scalar_type(g.max())), kind="stable")]
    gs, ss = g[order], s[order]
    tie = np.flatnonzero((gs[1:] == gs[:-1]) & (ss[1:] == ss[:-1]))
    if len(tie):
        run = sorted_unique(np.concatenate([tie, tie + 1]))
        order[run] = order[run][np.lexsort((-dur[order[run]], ss[run], gs[run]))]
    return order


def _codes(texts: pl.Series) -> np.ndarray:
    """An int >= 0 per distinct value (null included) of a Categorical (or String) series."""
    return texts.cast(pl.Categorical).to_physical().cast(pl.Int64).fill_null(-1).to_numpy() + 1


def _group_ids(key: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """0, 1, ... for the distinct values (ints >= 0) of `key` where `keep`, in value order; -1
    elsewhere."""
    kept = key[keep]
    if len(kept) and kept.max() < 8 * len(kept) + 1024:     # small values: count them, no sort
        number = np.cumsum(np.bincount(kept) > 0) - 1
        return np.where(keep, number[np.minimum(key, len(number) - 1)], -1)
    return np.where(keep, np.searchsorted(sorted_unique(kept), key), -1)


def _op_args(trace: RankTrace, order: np.ndarray, value: str) -> pl.Series:
    """One `op_args` value of each host op in `order` (positions in `host_ops(trace)`), null where none."""
    rows = rows_of_kinds(trace, HOST_OP_KINDS)[order]
    return (pl.DataFrame({"row": rows}, schema={"row": pl.Int64})
            .join(trace.op_args.select("row", value), on="row", how="left", maintain_order="left")
            .to_series(1))


def _top_ops(location: pl.Series, name: pl.Series, self_ns: np.ndarray, locations: pl.Series) -> pl.Series:
    """Per entry of `locations`: the op name with the most self CPU + self device time there."""
    best = (pl.DataFrame({"location": location, "name": name.cast(pl.String), "t": self_ns})
            .group_by("location", "name").agg(pl.col("t").sum())
            .sort(["t", "name"], descending=[True, False])
            .unique("location", keep="first", maintain_order=True))
    return (locations.to_frame().join(best, on="location", how="left", nulls_equal=True, maintain_order="left")
            ["name"].alias("top_op"))


# ----------------------------------------------------------------------------------------------
class _Forest:
    """Nesting of [s, e) intervals (e > s) per group g, in sorted order (g, s, -e), which must be
    the order the caller passes them in. `parent[i]`: index of the innermost enclosing interval
    or -1. See the module docstring for the method."""

    def __init__(self, g: np.ndarray, s: np.ndarray, e: np.ndarray, use_c: bool = True):
        self.g, self.s, self.e = (np.ascontiguousarray(x, dtype=np.int64) for x in (g, s, e))
        g, s, e = self.g, self.s, self.e
        n = len(g)
        self.parent = np.full(n, -1, dtype=np.int64)
        self.conflicts = 0
        self.c = use_c and _nesting is not None
        if n == 0:
            return
        if self.c:
            self.conflicts = _nesting.parents(g, s, e, self.parent)
            return
        self._time_axis(g, s, e)
        self.ks = self._key(g, s)
        ke = np.sort(self._key(g, e), kind="stable")      # timsort: the ends come in near order
        groups = np.arange(g.min(), g.max() + 1)
        group_start = self._key(groups, np.full(len(groups), self.origin))
        before = g - g.min()
        first = np.searchsorted(self.ks, group_start)[before]
        idx = np.arange(n, dtype=np.int64)
        closed = np.searchsorted(ke, self.ks, side="right") - np.searchsorted(ke, group_start)[before]
        depth = (idx - first) - closed
        order2 = np.argsort(depth.astype(np.min_scalar_type(depth.max())), kind="stable")  # by (depth, idx)
        k2s = (depth * n + idx)[order2]
        j = np.empty(n, dtype=np.int64)
        j[order2] = np.searchsorted(k2s, k2s - n) - 1   # last interval before, one level up
        cand = np.where(j >= 0, order2[np.maximum(j, 0)], -1)
        ok = (depth > 0) & (cand >= 0)
        c = np.maximum(cand, 0)
        ok &= (depth[c] == depth - 1) & (g[c] == g) & (s[c] <= s) & (e[c] >= e)
        self.parent = np.where(ok, cand, -1)
        self.conflicts = int(((depth > 0) & ~ok).sum())

    def _time_axis(self, g: np.ndarray, s: np.ndarray, e: np.ndarray) -> None:
        """Keys (group, time) as one int64, group-major: group * width + time offset. The offset
        of a time is its distance to the earliest start; where groups that wide would not fit in
        int64, its rank among the interval bounds (`times`)."""
        self.origin = int(s.min())
        self.width = int(e.max()) - self.origin + 1
        self.times = None
        if (max(-int(g.min()), int(g.max())) + 2) * self.width >= 2 ** 62:
            self.times = sorted_unique(np.concatenate([s, e]))
            self.width = len(self.times)

    def _key(self, g: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Key of time t in group g; a time outside the bounds counts as just before the first or
        as the last one, so that it stays inside its group's keys."""
        if self.times is None:
            offset = np.clip(t - self.origin, -1, self.width - 1)
        else:
            offset = np.searchsorted(self.times, t, side="right") - 1
        return g * self.width + offset

    def innermost(self, qg: np.ndarray, qt: np.ndarray) -> np.ndarray:
        """Index of the innermost interval of group qg that contains time qt (s <= qt < e), or -1."""
        qg = np.ascontiguousarray(qg, dtype=np.int64)
        qt = np.ascontiguousarray(qt, dtype=np.int64)
        out = np.full(len(qg), -1, dtype=np.int64)
        if len(self.g) == 0 or len(qg) == 0:
            return out
        if self.c:
            _nesting.innermost(self.g, self.s, self.e, self.parent, qg, qt, out)
            return out
        c = np.searchsorted(self.ks, self._key(qg, qt), side="right") - 1
        ok = (c >= 0) & (qg >= 0)
        ok &= self.g[np.maximum(c, 0)] == qg
        c = np.where(ok, c, -1)
        while True:
            live = c >= 0
            bad = np.zeros(len(c), dtype=bool)
            bad[live] = self.e[c[live]] <= qt[live]
            if not bad.any():
                break
            c[bad] = self.parent[c[bad]]
        out[:] = c
        return out


def _locations(trace: RankTrace, t: _OpTimes, stack_frame: str) -> tuple[np.ndarray, list[str], str | None]:
    """Per op (in `t` order): its source location, an index in `labels` (len(labels): none); the
    labels; the stack source used."""
    n = len(t.order)
    pick = _pick_user if stack_frame == "user" else _pick_top
    stacks = _op_args(trace, t.order, "call_stack").cast(pl.String)
    loc_id = np.full(n, -1, dtype=np.int64)
    labels: list[str] = []
    source = None
    pyf = of_kinds(trace, [Kind.PYTHON_FUNCTION]).filter(pl.col("dur_ns") > 0)
    if stacks.null_count() < n:
        source = "call_stack"
        distinct = stacks.drop_nulls().unique().to_list()
        picked = {cs: pick([f.strip() for f in cs.split(";") if f.strip()]) for cs in distinct}
        labels = sorted({v for v in picked.values() if v is not None})
        index: dict[str | None, int] = {lab: i for i, lab in enumerate(labels)}
        mapping = pl.DataFrame({"call_stack": distinct,
                                "lid": [index.get(picked[cs], -1) for cs in distinct]},
                               schema={"call_stack": pl.String, "lid": pl.Int64})
        loc_id = (pl.DataFrame({"call_stack": stacks}).join(mapping, on="call_stack", how="left", maintain_order="left")
                  ["lid"].fill_null(-1).to_numpy().copy())
    elif not pyf.is_empty():
        source = "python_function"
        pg = t.threads.ids(pyf["pid"].to_numpy(), pyf["tid"].to_numpy())
        ps, pd = pyf["ts_ns"].to_numpy(), pyf["dur_ns"].to_numpy()
        order = np.lexsort((-pd, ps, pg))
        frames = _Forest(pg[order], ps[order], ps[order] + pd[order])
        names = pyf["name"].cast(pl.String).gather(order).to_list()
        distinct = sorted(set(names))
        src_ok = {nm: is_source_frame(nm) for nm in distinct}
        lib = {nm: is_library_frame(nm) for nm in distinct}
        labels = [nm for nm in distinct if src_ok[nm]]
        index = {lab: i for i, lab in enumerate(labels)}
        fid = np.array([index.get(nm, -1) for nm in names], dtype=np.int64)
        usable = np.array([src_ok[nm] and (stack_frame == "top" or not lib[nm]) for nm in names], dtype=bool)
        source_frame = np.array([src_ok[nm] for nm in names], dtype=bool)
        start = frames.innermost(t.thread, t.ts)
        loc_id = _walk_first(start, frames.parent, usable, fid)
        if stack_frame == "user":           # all library: fall back to the innermost source frame
            fallback = _walk_first(start, frames.parent, source_frame, fid)
            loc_id = np.where(loc_id >= 0, loc_id, fallback)
    # ops without a location inherit the nearest enclosing op's
    parent = t.parent
    cur = parent.copy()
    missing = (loc_id < 0) & (cur >= 0)
    while missing.any():
        take = missing & (loc_id[np.maximum(cur, 0)] >= 0)
        loc_id[take] = loc_id[cur[take]]
        cur[missing] = parent[cur[missing]]
        missing = (loc_id < 0) & (cur >= 0)
    return np.where(loc_id >= 0, loc_id, len(labels)), labels, source


def _walk_first(start: np.ndarray, parent: np.ndarray, usable: np.ndarray, fid: np.ndarray) -> np.ndarray:
    """From each start frame walk up to the first `usable` frame; its id in `fid`, else -1."""
    cur = start.copy()
    while True:
        live = cur >= 0
        skip = np.zeros(len(cur), dtype=bool)
        skip[live] = ~usable[cur[live]]
        if not skip.any():
            break
        cur[skip] = parent[cur[skip]]
    return np.where(cur >= 0, fid[np.maximum(cur, 0)], -1)


def _pick_user(frames: list[str]) -> str | None:
    """Innermost non-library source frame of a 2021 call stack (innermost first), else the
    innermost source frame."""
    for f in frames:
        if is_source_frame(f) and not is_library_frame(f):
            return f
    return _pick_top(frames)


def _pick_top(frames: list[str]) -> str | None:
    return next((f for f in frames if is_source_frame(f)), None)
