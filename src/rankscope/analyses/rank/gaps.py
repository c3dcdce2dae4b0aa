"""What caused each GPU idle gap: the CPU op behind it, as a timeline tooltip would show it.

A gap is a stretch of at least GAP_MIN_US with no kernel, memcpy or memset running on a device,
between two device activities inside a step. For each gap:
  - what the host was doing meanwhile: the breakdown categories of the gap (dataloader, sync,
    host, idle_other; `analyses.breakdown`) and the dominant one;
  - the CPU op that ended it: the innermost CPU op enclosing the runtime call that launched the
    device activity starting at the gap's end (tb-profiler's attribution of kernels to ops);
  - the CPU op most present during the gap on the launching thread (largest overlap); where no CPU
    op runs then, the Python function most present (`with_stack=True` traces; the innermost of
    equal overlap).
Per rank the result keeps the total gap time per dominant category and the TOP_GAPS longest gaps.
"""
from __future__ import annotations

from typing import Iterable

import msgspec
import numpy as np
import polars as pl

from rankscope.analyses.rank.breakdown import CATEGORIES, Timeline, classify_timeline
from rankscope.analyses.intervals import union
from rankscope.analyses.rank.steps import StepWindows, step_windows
from rankscope.analyses.rank.views import event_end_ns, kind_mask, launch_calls_by_id, name_mask, rows_of_kinds
from rankscope.model import (DATALOADER_PATTERN, DEVICE_KINDS, HOST_OP_KINDS, PROFILER_STEP_PATTERN, Kind, RankTrace,
                             name_codes)

#: Shorter idle stretches are launch jitter, not gaps (tb-profiler's GPU-idle view shows >= 0.1 ms).
GAP_MIN_US = 100.0
TOP_GAPS = 20
_IDLE_CATEGORIES = ("dataloader", "sync", "host", "idle_other")


class Gap(msgspec.Struct):
    step: int
    start_in_step_ms: float
    duration_ms: float
    host_activity: str                     # dominant of dataloader / sync / host / idle_other
    host_ms: dict[str, float]              # the gap's time per idle category
    next_device_op: str                    # kernel / memcpy that ended the gap
    launched_by: str | None                # innermost CPU op around its launch
    busy_host_op: str | None               # CPU op most present during the gap (launching thread)


class GapSummary(msgspec.Struct):
    gap_min_us: float
    gaps: int
    gap_ms: float
    gap_ms_by_host_activity: dict[str, float]
    top: list[Gap] = []


def idle_gaps(trace: RankTrace, windows: StepWindows | None = None, timeline: Timeline | None = None,
              gap_min_us: float = GAP_MIN_US, top: int = TOP_GAPS) -> GapSummary:
    empty = GapSummary(gap_min_us, 0, 0.0, {c: 0.0 for c in _IDLE_CATEGORIES})
    dev_rows = rows_of_kinds(trace, DEVICE_KINDS)
    if len(dev_rows) == 0:
        return empty
    windows = windows or step_windows(trace)
    w = windows.frame
    w_start, w_end = w["start_ns"].to_numpy(), w["end_ns"].to_numpy()

    ts_all, end_all = trace.events["ts_ns"].to_numpy(), event_end_ns(trace)
    device = trace.events["device"].to_numpy()[dev_rows]
    starts, ends, nxt = [], [], []
    for d in np.unique(device):
        rows = dev_rows[device == d]
        ts = ts_all[rows]
        s, e = union(ts, end_all[rows])
        gap_s, gap_e = e[:-1], s[1:]
        keep = (gap_e - gap_s) >= gap_min_us * 1e3
        order = np.argsort(ts, kind="stable")
        first_at = rows[order][np.searchsorted(ts[order], gap_e[keep])]
        starts.append(gap_s[keep])
        ends.append(gap_e[keep])
        nxt.append(first_at)
    gap_s, gap_e, next_row = np.concatenate(starts), np.concatenate(ends), np.concatenate(nxt)
    step_i = np.searchsorted(w_start, gap_s, side="right") - 1
    inside = (step_i >= 0) & (gap_e <= w_end[np.maximum(step_i, 0)])
    gap_s, gap_e, next_row, step_i = gap_s[inside], gap_e[inside], next_row[inside], step_i[inside]
    if len(gap_s) == 0:
        return empty

    timeline = timeline or classify_timeline(trace, [w_start, w_end])
    per_cat = timeline.in_windows(gap_s, gap_e)
    idle_idx = [CATEGORIES.index(c) for c in _IDLE_CATEGORIES]
    idle = per_cat[:, idle_idx]
    dominant = np.argmax(idle, axis=1)
    by_activity = {c: float((gap_e - gap_s)[dominant == i].sum()) / 1e6 for i, c in enumerate(_IDLE_CATEGORIES)}

    longest = np.argsort(gap_s - gap_e, kind="stable")[:top]
    nxt = trace.events.select("name", "correlation")[next_row[longest]]
    launch_of = _launches(trace, nxt["correlation"].to_list())
    tids = {tid for _, tid in launch_of.values()}
    ops_by_tid = _host_ops_by_thread(trace, tids, HOST_OP_KINDS)
    py_by_tid = _host_ops_by_thread(trace, tids, [Kind.PYTHON_FUNCTION])
    names = trace.events["name"]
    top_gaps = []
    for i, name, corr in zip(longest, nxt["name"].cast(pl.String), nxt["correlation"]):
        launched_by = busy = None
        if corr in launch_of:
            t_launch, tid = launch_of[corr]
            op_ts, op_end, op_rows = ops_by_tid[tid]
            launched_by = _innermost(op_ts, op_end, op_rows, t_launch)
            busy = _most_present(op_ts, op_end, op_rows, int(gap_s[i]), int(gap_e[i]))
            if busy is None:
                py_ts, py_end, py_rows = py_by_tid[tid]
                busy = _most_present(py_ts, py_end, py_rows, int(gap_s[i]), int(gap_e[i]), innermost=True)
        top_gaps.append(Gap(
            step=int(w["step"][int(step_i[i])]),
            start_in_step_ms=float(gap_s[i] - w_start[step_i[i]]) / 1e6,
            duration_ms=float(gap_e[i] - gap_s[i]) / 1e6,
            host_activity=_IDLE_CATEGORIES[int(dominant[i])],
            host_ms={c: float(idle[i, k]) / 1e6 for k, c in enumerate(_IDLE_CATEGORIES)},
            next_device_op=str(name),
            launched_by=None if launched_by is None else str(names[int(launched_by)]),
            busy_host_op=None if busy is None else str(names[int(busy)]),
        ))
    return GapSummary(gap_min_us, len(gap_s), float((gap_e - gap_s).sum()) / 1e6, by_activity, top_gaps)


def _launches(trace: RankTrace, correlations: list[int]) -> dict[int, tuple[int, int]]:
    """correlation -> (ts_ns, tid) of the runtime call that launched it (of several with one id, the
    last in the frame)."""
    wanted = np.array(sorted({c for c in correlations if c is not None and c >= 0}), dtype=np.int64)
    ids, calls = launch_calls_by_id(trace)
    end = np.searchsorted(ids, wanted, side="right")
    found = (end > 0) & (ids[np.maximum(end - 1, 0)] == wanted) if len(ids) else np.zeros(len(wanted), bool)
    rows = calls[end[found] - 1]
    ev = trace.events
    return {int(c): (int(t), int(tid)) for c, t, tid in zip(wanted[found], ev["ts_ns"].to_numpy()[rows],
                                                           ev["tid"].to_numpy()[rows])}


def _host_ops_by_thread(trace: RankTrace, tids: set[int], kinds: Iterable[int],
                        ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The named events of these kinds that say what the host does (not the step / DataLoader
    marks), per thread: (start, end, row in trace.events)."""
    marks = name_mask(trace, PROFILER_STEP_PATTERN) | name_mask(trace, DATALOADER_PATTERN)
    ops = kind_mask(trace, kinds) & ~marks & name_codes(trace.events).named
    tid = trace.events["tid"].to_numpy()
    out = {}
    for t in tids:
        rows = np.flatnonzero(ops & (tid == t))
        out[t] = (trace.events["ts_ns"].to_numpy()[rows], event_end_ns(trace)[rows], rows)
    return out


def _innermost(start: np.ndarray, end: np.ndarray, rows: np.ndarray, t: int) -> int | None:
    """The row of the innermost event around t."""
    around = np.flatnonzero((start <= t) & (end > t))
    if len(around) == 0:
        return None
    return int(rows[around[np.lexsort((end[around], -start[around]))[0]]])


def _most_present(start: np.ndarray, end: np.ndarray, rows: np.ndarray, a: int, b: int,
                  innermost: bool = False) -> int | None:
    """The row of the event overlapping [a, b) the most (the first of equal overlap; with
    `innermost`, the shortest of them: Python frames nest, and the outermost covers every gap)."""
    overlap = np.minimum(end, b) - np.maximum(start, a)
    if len(overlap) == 0 or overlap.max() <= 0:
        return None
    if not innermost:
        return int(rows[int(np.argmax(overlap))])
    best = np.flatnonzero(overlap == overlap.max())
    return int(rows[int(best[np.argmin((end - start)[best])])])
