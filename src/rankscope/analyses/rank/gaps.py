"""What caused each GPU idle gap: the CPU op behind it, as a timeline tooltip would show it.

A gap is a stretch of at least GAP_MIN_US with no kernel, memcpy or memset running on a device,
inside a step: between two device activities (`between`), from the step's start to its first
device activity (`before_first`: input decoding, the DataLoader, a sleep before the first
launch), or from its last device activity to the step's end (`after_last`). A gap across a step
boundary is the one step's `after_last` plus the next one's `before_first`. On a CPU-only rank
the training thread plays the device (docs/concepts.md "Step breakdown"): a gap is a stretch
with no computation or collective on it, and the op that ended it is the thread's next CPU op.
For each gap:
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

from typing import Iterable, Literal

import numpy as np

from rankscope.analyses.rank.breakdown import CATEGORIES, Timeline, classify_timeline
from rankscope.analyses.intervals import union
from rankscope.analyses.rank.steps import StepWindows, step_windows
from rankscope.analyses.rank.views import event_end_ns, kind_mask, launch_calls_by_id, name_mask, rows_of_kinds
from rankscope.model import (DATALOADER_PATTERN, DEVICE_KINDS, HOST_OP_KINDS, PROFILER_STEP_PATTERN, Kind, RankTrace,
                             name_codes)
from rankscope.results.rank import Gap, GapSummary

#: Shorter idle stretches are launch jitter, not gaps (tb-profiler's GPU-idle view shows >= 0.1 ms).
GAP_MIN_US = 100.0
TOP_GAPS = 20
_IDLE_CATEGORIES = ("dataloader", "sync", "host", "idle_other")


def idle_gaps(trace: RankTrace, windows: StepWindows | None = None, timeline: Timeline | None = None,
              gap_min_us: float = GAP_MIN_US, top: int = TOP_GAPS) -> GapSummary:
    empty = GapSummary(gap_min_us, 0, 0.0, {c: 0.0 for c in _IDLE_CATEGORIES})
    windows = windows or step_windows(trace)
    w = windows.frame
    w_start, w_end = w["start_ns"].to_numpy(), w["end_ns"].to_numpy()
    if len(w_start) == 0:
        return empty
    ts_all, end_all = trace.events["ts_ns"].to_numpy(), event_end_ns(trace)
    dev_rows = rows_of_kinds(trace, DEVICE_KINDS)
    if len(dev_rows):
        activity_rows = [dev_rows[trace.events["device"].to_numpy()[dev_rows] == d]
                   for d in np.unique(trace.events["device"].to_numpy()[dev_rows])]
        busy = [union(ts_all[rows], end_all[rows]) for rows in activity_rows]
    else:                                     # CPU-only: the training thread's computation and collectives
        timeline = timeline or classify_timeline(trace, [w_start, w_end])
        on = timeline.comp | timeline.comm
        busy = [union(timeline.start_ns[on], timeline.start_ns[on] + timeline.length_ns[on])]
        activity_rows = [_training_ops(trace, timeline.training_tid)]
    found = [_gaps_of(s, e, w_start, w_end, int(gap_min_us * 1e3)) for s, e in busy]
    gap_s = np.concatenate([f[0] for f in found])
    gap_e = np.concatenate([f[1] for f in found])
    step_i = np.concatenate([f[2] for f in found])
    position = np.concatenate([f[3] for f in found])
    next_row = np.concatenate([_first_at(rows, ts_all[rows], f[1], f[3]) for rows, f in zip(activity_rows, found)])
    if len(gap_s) == 0:
        return empty

    timeline = timeline or classify_timeline(trace, [w_start, w_end])
    per_cat = timeline.in_windows(gap_s, gap_e)
    idle_idx = [CATEGORIES.index(c) for c in _IDLE_CATEGORIES]
    idle = per_cat[:, idle_idx]
    dominant = np.argmax(idle, axis=1)
    by_activity = {c: float((gap_e - gap_s)[dominant == i].sum()) / 1e6 for i, c in enumerate(_IDLE_CATEGORIES)}

    longest = np.argsort(gap_s - gap_e, kind="stable")[:top]
    names = trace.events["name"]
    corr_all = trace.events["correlation"]
    launch_of = _launches(trace, [int(corr_all[int(r)]) for r in next_row[longest] if r >= 0])
    tids = {tid for _, tid in launch_of.values()}
    if not len(dev_rows) and timeline.training_tid is not None:
        tids.add(timeline.training_tid)
    ops_by_tid = _host_ops_by_thread(trace, tids, HOST_OP_KINDS)
    py_by_tid = _host_ops_by_thread(trace, tids, [Kind.PYTHON_FUNCTION])
    top_gaps = []
    for i in longest:
        row = int(next_row[i])
        launched_by = busy_op = None
        tid = None
        if row >= 0 and int(corr_all[row]) in launch_of:
            t_launch, tid = launch_of[int(corr_all[row])]
            op_ts, op_end, op_rows = ops_by_tid[tid]
            launched_by = _innermost(op_ts, op_end, op_rows, t_launch)
            busy_op = _most_present(op_ts, op_end, op_rows, int(gap_s[i]), int(gap_e[i]))
        elif not len(dev_rows):
            tid = timeline.training_tid
        if busy_op is None and tid is not None:
            py_ts, py_end, py_rows = py_by_tid[tid]
            busy_op = _most_present(py_ts, py_end, py_rows, int(gap_s[i]), int(gap_e[i]), innermost=True)
        top_gaps.append(Gap(
            step=int(w["step"][int(step_i[i])]),
            start_in_step_ms=float(gap_s[i] - w_start[step_i[i]]) / 1e6,
            duration_ms=float(gap_e[i] - gap_s[i]) / 1e6,
            host_activity=_IDLE_CATEGORIES[int(dominant[i])],
            host_ms={c: float(idle[i, k]) / 1e6 for k, c in enumerate(_IDLE_CATEGORIES)},
            next_device_op="" if row < 0 else str(names[row]),
            launched_by=None if launched_by is None else str(names[int(launched_by)]),
            busy_host_op=None if busy_op is None else str(names[int(busy_op)]),
            position=_POSITIONS[int(position[i])],
        ))
    return GapSummary(gap_min_us, len(gap_s), float((gap_e - gap_s).sum()) / 1e6, by_activity, top_gaps)


_POSITIONS: tuple[Literal["between", "before_first", "after_last"], ...] = ("between", "before_first",
                                                                             "after_last")


def _gaps_of(s: np.ndarray, e: np.ndarray, w_start: np.ndarray, w_end: np.ndarray, min_ns: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The idle gaps of one device whose busy time is the union (s, e) (sorted, disjoint), inside
    the step windows: (start, end, step index, position index into _POSITIONS), at least `min_ns`
    long. A window without activity of this device has no gap."""
    if len(s) == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, z
    # between two activities inside one window
    b_s, b_e = e[:-1], s[1:]
    k = np.searchsorted(w_start, b_s, side="right") - 1
    inside = (k >= 0) & (b_e <= w_end[np.maximum(k, 0)])
    # before each window's first activity, after its last
    first = np.searchsorted(e, w_start, side="right")          # first activity ending after the start
    last = np.searchsorted(s, w_end, side="left") - 1           # last activity starting before the end
    active = (first <= last) & (first < len(s)) & (last >= 0)
    f_at, l_at = np.minimum(first, len(s) - 1), np.maximum(last, 0)
    lead = active & (s[f_at] > w_start)
    trail = active & (e[l_at] < w_end)
    idx = np.arange(len(w_start))
    starts = np.concatenate([b_s[inside], w_start[lead], e[l_at][trail]])
    ends = np.concatenate([b_e[inside], s[f_at][lead], w_end[trail]])
    steps = np.concatenate([k[inside], idx[lead], idx[trail]])
    where = np.concatenate([np.zeros(int(inside.sum()), np.int64), np.ones(int(lead.sum()), np.int64),
                            np.full(int(trail.sum()), 2, np.int64)])
    keep = (ends - starts) >= min_ns
    return starts[keep], ends[keep], steps[keep], where[keep]


def _first_at(rows: np.ndarray, ts: np.ndarray, at: np.ndarray, position: np.ndarray) -> np.ndarray:
    """The row of the first of `rows` (times `ts`) starting at or after each `at` (-1 for gaps
    after a step's last activity, and where none does)."""
    order = np.argsort(ts, kind="stable")
    j = np.searchsorted(ts[order], at)
    found = np.where(j < len(rows), rows[order][np.minimum(j, max(len(rows) - 1, 0))] if len(rows) else -1, -1)
    return np.where(position == 2, -1, found).astype(np.int64)


def _training_ops(trace: RankTrace, tid: int | None) -> np.ndarray:
    """The rows of the CPU ops of the training thread (a CPU-only rank's "device" activity), without the
    step and DataLoader marks."""
    if tid is None:
        return np.zeros(0, np.int64)
    marks = name_mask(trace, PROFILER_STEP_PATTERN) | name_mask(trace, DATALOADER_PATTERN)
    return np.flatnonzero(kind_mask(trace, [Kind.CPU_OP]) & ~marks & (trace.events["tid"].to_numpy() == tid))


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
    """The row of the event overlapping [a, b) the most (the first of equal overlap). With
    `innermost` (Python frames, which nest): the frame with the most time of its own in [a, b),
    its overlap less that of the frames directly inside it (the outermost frames cover every gap;
    the function doing the work is the one whose own code runs there)."""
    overlap = np.minimum(end, b) - np.maximum(start, a)
    if len(overlap) == 0 or overlap.max() <= 0:
        return None
    if not innermost:
        return int(rows[int(np.argmax(overlap))])
    at = np.flatnonzero(overlap > 0)
    at = at[np.lexsort((-end[at], start[at]))]          # parents before their children
    own = overlap[at].astype(np.int64)
    stack: list[int] = []
    for k, i in enumerate(at):
        while stack and end[at[stack[-1]]] <= start[i]:
            stack.pop()
        if stack:
            own[stack[-1]] -= overlap[i]
        stack.append(k)
    best = np.flatnonzero(own == own.max())
    return int(rows[at[best[np.argmin((end - start)[at[best]])]]])
