"""Step breakdown that sums exactly to step time (docs/concepts.md "Step breakdown").

Each instant of a step window goes to exactly one category, first match wins:
  compute          COMP running, no COMM
  comm_overlapped  COMP and COMM running
  comm_exposed     COMM running, no COMP
  memcpy           MEM (memcpy/memset) only
  dataloader       device idle, host inside `enumerate(DataLoader)#...__next__`
  sync             device idle, host blocked in cuda*/hip* Device/Stream/Event Synchronize
  host             device idle, host inside a CPU op or a runtime/driver call, or running Python
                   (inside a `python_function` event of a `with_stack=True` trace, not one that
                   sleeps or waits: PYTHON_WAIT_PATTERN)
  idle_other       the rest: device idle and the host outside any profiled op (untraced Python,
                   GC, sleep, waits)

How: the boundaries of every interval set and step window cut time into elementary segments;
one sweep over the sorted boundaries gives each segment the sets it lies in (a bit per set, up at
the set's interval starts and down at its ends), and its category follows the priority above
(`classify_timeline`, through a table over the combinations of sets). Any window's breakdown is
then a sum of segment lengths per category (`Timeline.in_windows`): steps here, the time before
each collective in the cross-rank analysis. The parts add up to the window exactly (integer ns).

CPU-only jobs (no device activity; gloo): the training thread (the one with ProfilerStep marks)
plays the device. Its CPU ops are COMP, except collective ops (`c10d::*`, `record_param_comms`,
`gloo:*`, `nccl:*`) and DataLoader spans; gloo collective spans (any thread) are COMM; other CPU
ops are `host`.

Overlap efficiency, over the step windows: the share of the shorter of compute and communication
that runs under the other, in [0, 1]:
  |COMP ∩ COMM| / min(|COMP|, |COMM|) = (|COMP| + |COMM| - |COMP ∪ COMM|) / min(|COMP|, |COMM|)
    = comm_overlapped / min(compute + comm_overlapped, comm_overlapped + comm_exposed)
with |COMP| the time COMP runs and |COMM| the time COMM runs (unions, not the exclusive categories).
The usual form (compute + comm - step) / min(compute, comm) assumes COMP or COMM runs all
step long; with idle time in the step that numerator is negative whatever the overlap, so the union
|COMP ∪ COMM| takes the step's place. 1 when communication is fully hidden under compute. HTA's
comm-comp overlap (overlap.py) divides by |COMM| alone: the two agree when there is less
communication than compute (up to their scopes: steps here, HTA's trace scope there).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import cast

import numpy as np
import polars as pl

from rankscope.analyses.intervals import covered_between, union
from rankscope.analyses.rank.steps import StepWindows, device_class_union, step_windows
from rankscope.analyses.rank.views import event_end_ns, kind_mask, name_mask
from rankscope.analyses.rank.dataloader import dataloader_span_rows
from rankscope.model import (BLOCKING_SYNC_PATTERN, DATALOADER_PATTERN, DEVICE_KINDS, HOST_COMM_PATTERN,
                             PROFILER_STEP_PATTERN, Kind, KernelClass, RankTrace, names_matching)
from rankscope.results.rank import BREAKDOWN_CATEGORIES
from rankscope.units import NS_PER_MS

CATEGORIES = BREAKDOWN_CATEGORIES
#: Host ops that are collectives, not computation (CPU-only jobs).
HOST_COLLECTIVE_PATTERN = r"^(c10d::|record_param_comms|gloo:|nccl:)"
#: `python_function` events (traces taken with `with_stack=True`) in which the host thread sleeps
#: or blocks rather than computes: `time.sleep`, lock / condition / thread waits, select / poll.
#: Time inside them stays `idle_other`; time inside any other Python function is `host`.
PYTHON_WAIT_PATTERN = (r"<built-in (function|method) (sleep|acquire|wait|select|poll|epoll)\b"
                       r"|threading\.py\(\d+\): (wait|join|_wait_for_tstate_lock)$|\(\d+\): (sleep|wait)$")


@dataclass
class StepBreakdown:
    """`frame`: one row per step: step, duration_ms and one `_ms` column per category
    (they sum to duration_ms). `mode`: "device" or "cpu_only"."""
    frame: pl.DataFrame
    mode: str
    compute_ms: float             # time COMP runs (union), over all steps
    comm_ms: float                # time COMM runs (union), over all steps
    overlapped_ms: float          # time both run (|COMP ∩ COMM|: the comm_overlapped category), over all steps
    training_tid: int | None = None   # cpu_only: the thread playing the device

    def mean_ms(self) -> dict[str, float]:
        """Per category, mean over steps (sums to the mean step time)."""
        if self.frame.is_empty():
            return {c: 0.0 for c in CATEGORIES}
        return {c: float(cast(float, self.frame[c].mean())) for c in CATEGORIES}

    @property
    def overlap_efficiency(self) -> float | None:
        """|COMP ∩ COMM| / min(|COMP|, |COMM|) in [0, 1]; None unless both run (module docstring)."""
        lo = min(self.compute_ms, self.comm_ms)
        if lo <= 0:
            return None
        return float(np.clip(self.overlapped_ms / lo, 0.0, 1.0))


def _intervals(df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    ts = df["ts_ns"].to_numpy()
    return union(ts, ts + df["dur_ns"].to_numpy())


def _union_of(trace: RankTrace, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the events selected by `which` (a mask of the events, or row numbers)."""
    return union(trace.events["ts_ns"].to_numpy()[which], event_end_ns(trace)[which])


def _python_sets(ev: pl.DataFrame, tid: int | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Python running on the host (`python_function` events, on thread `tid` when given) and the
    Python functions among them that sleep or wait (PYTHON_WAIT_PATTERN)."""
    py = ev.filter(pl.col("kind") == int(Kind.PYTHON_FUNCTION))
    if tid is not None:
        py = py.filter(pl.col("tid") == tid)
    return {"python": _intervals(py),
            "python_wait": _intervals(py.filter(pl.col("name").is_in(names_matching(py, PYTHON_WAIT_PATTERN))))}


def _device_sets(trace: RankTrace) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    marks = name_mask(trace, PROFILER_STEP_PATTERN) | name_mask(trace, DATALOADER_PATTERN)
    python = kind_mask(trace, [Kind.PYTHON_FUNCTION])
    return {
        "comp": device_class_union(trace, KernelClass.COMP),
        "comm": device_class_union(trace, KernelClass.COMM),
        "mem": device_class_union(trace, KernelClass.MEM),
        "dataloader": _union_of(trace, dataloader_span_rows(trace)),
        "sync": _union_of(trace, kind_mask(trace, [Kind.RUNTIME]) & name_mask(trace, BLOCKING_SYNC_PATTERN)),
        "host": _union_of(trace, kind_mask(trace, [Kind.CPU_OP, Kind.RUNTIME, Kind.DRIVER]) & ~marks),
        "python": _union_of(trace, python),
        "python_wait": _union_of(trace, python & name_mask(trace, PYTHON_WAIT_PATTERN)),
    }


def training_thread(ev: pl.DataFrame) -> int | None:
    """The thread with the ProfilerStep marks; else the one with the most CPU op time."""
    steps = ev.filter(pl.col("name").is_in(names_matching(ev, PROFILER_STEP_PATTERN)))
    if not steps.is_empty():
        return int(steps["tid"].mode().sort()[0])
    ops = ev.filter(pl.col("kind") == int(Kind.CPU_OP))
    if ops.is_empty():
        return None
    return int(ops.group_by("tid").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True)["tid"][0])


def _cpu_only_sets(trace: RankTrace) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int | None]:
    ev = trace.events
    tid = training_thread(ev)
    tid_or_none = -(2**62) if tid is None else tid         # no CPU op at all: no training thread
    marks = names_matching(ev, PROFILER_STEP_PATTERN) + names_matching(ev, DATALOADER_PATTERN)
    collective = names_matching(ev, HOST_COLLECTIVE_PATTERN)
    ops = ev.filter(pl.col("kind").is_in([int(Kind.CPU_OP), int(Kind.USER_ANNOTATION)]) & ~pl.col("name").is_in(marks))
    train_ops = ops.filter((pl.col("tid") == tid_or_none) & (pl.col("kind") == int(Kind.CPU_OP)))
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    return {
        "comp": _intervals(train_ops.filter(~pl.col("name").is_in(collective))),
        # collective calls on the training thread (launch, wait) and data loading are not compute; a
        # gloo span there is the lifetime of the work, which the thread may spend computing (an
        # isend / irecv of a pipeline schedule): not a call, so it takes no compute away
        "not_comp": _intervals(ev.filter(((pl.col("tid") == tid_or_none) & pl.col("name").is_in(collective)
                                          & ~pl.col("name").is_in(names_matching(ev, HOST_COMM_PATTERN)))
                                         | pl.col("name").is_in(names_matching(ev, DATALOADER_PATTERN)))),
        "comm": _intervals(ev.filter((pl.col("kclass") == int(KernelClass.COMM)))),
        "mem": empty,
        "dataloader": _union_of(trace, dataloader_span_rows(trace)),
        "sync": empty,
        "host": _intervals(ops.filter(pl.col("kind") == int(Kind.CPU_OP))),
        # Python on the training thread is its CPU time too (host, never compute)
        **_python_sets(ev, tid_or_none),
    }, tid


@dataclass
class Timeline:
    """The rank's time, cut into elementary segments, each with one category (index into
    CATEGORIES). Segments are sorted and disjoint; time outside [span_start, span_end) is not
    covered. `comp` / `comm`: whether COMP / COMM ran in the segment (for overlap figures)."""
    start_ns: np.ndarray
    length_ns: np.ndarray
    category: np.ndarray
    comp: np.ndarray
    comm: np.ndarray
    mode: str                       # "device" | "cpu_only"
    training_tid: int | None = None

    def in_windows(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """ns per category inside each window [a_i, b_i) (windows may overlap): (n, 8) int64.
        Exact: window edges are segment boundaries when the windows were given to
        `classify_timeline`; otherwise segments are cut at the window edges here."""
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        out = np.zeros((len(a), len(CATEGORIES)), dtype=np.int64)
        for c, (start, end, before) in enumerate(self._by_category):
            out[:, c] = covered_between(start, end, a, b, before)
        return out

    @cached_property
    def _by_category(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per category: its segments' starts and ends, and the time of its first k segments
        (k = 0..n), made on the first `in_windows`."""
        order = np.argsort(self.category, kind="stable")
        start, length = self.start_ns[order], self.length_ns[order]
        bounds = np.searchsorted(self.category[order], np.arange(len(CATEGORIES) + 1))
        out = []
        for i, j in zip(bounds[:-1], bounds[1:]):
            out.append((start[i:j], start[i:j] + length[i:j], np.concatenate(([0], np.cumsum(length[i:j])))))
        return out


def classify_timeline(trace: RankTrace, cuts: list[np.ndarray] | None = None) -> Timeline:
    """Classify every instant of the trace's span (plus the given cut points) by the priority
    rule of this module."""
    cpu_only = not kind_mask(trace, DEVICE_KINDS).any()
    if cpu_only:
        sets, tid = _cpu_only_sets(trace)
    else:
        sets, tid = _device_sets(trace), None
    bounds, inside = _sweep(list(sets.values()), cuts or [])
    # the category of every combination of sets (bit i: inside the i-th set), then of each segment
    names = list(sets)
    states = np.arange(1 << len(names))
    m = {name: (states >> i) & 1 == 1 for i, name in enumerate(names)}
    comp = m["comp"] & ~m["not_comp"] if cpu_only else m["comp"]
    comm, mem = m["comm"], m["mem"]
    host = m["host"] | (m["python"] & ~m["python_wait"])
    category = np.select(
        [comp & ~comm, comp & comm, comm, mem, m["dataloader"], m["sync"], host],
        [0, 1, 2, 3, 4, 5, 6], default=7).astype(np.int8)
    return Timeline(bounds[:-1], np.diff(bounds), category[inside], comp[inside], comm[inside],
                    "cpu_only" if cpu_only else "device", tid)


def _sweep(sets: list[tuple[np.ndarray, np.ndarray]], cuts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct edges of the sets' intervals and the cut points, and for each segment
    between two consecutive edges the sets it lies in (bit i: the i-th set; each set's intervals
    are disjoint, so its bit goes up at each of its starts and down at each of its ends)."""
    edges = [a for u in sets for a in u] + list(cuts)
    change = [np.full(len(a), sign << i, np.int64) for i, (s, e) in enumerate(sets)
              for a, sign in ((s, 1), (e, -1))] + [np.zeros(len(c), np.int64) for c in cuts]
    if not any(len(a) for a in edges):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    t = np.concatenate(edges).astype(np.int64, copy=False)
    order = np.argsort(t, kind="stable")
    t = t[order]
    first = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
    inside = np.cumsum(np.add.reduceat(np.concatenate(change)[order], first))
    return t[first], inside[:-1]


def step_breakdown(trace: RankTrace, windows: StepWindows | None = None,
                   timeline: Timeline | None = None) -> StepBreakdown:
    windows = windows or step_windows(trace)
    w = windows.frame
    w_start, w_end = w["start_ns"].to_numpy(), w["end_ns"].to_numpy()
    timeline = timeline or classify_timeline(trace, [w_start, w_end])
    if len(w_start) == 0:
        return StepBreakdown(pl.DataFrame(schema={"step": pl.Int64, "duration_ms": pl.Float64,
                                                  **{f"{c}": pl.Float64 for c in CATEGORIES}}),
                             timeline.mode, 0.0, 0.0, 0.0, timeline.training_tid)
    totals = timeline.in_windows(w_start, w_end)
    # idle_other also takes window time that no segment covers (nothing at all recorded there)
    durations = w_end - w_start
    totals[:, CATEGORIES.index("idle_other")] += durations - totals.sum(axis=1)
    frame = pl.DataFrame({
        "step": w["step"], "duration_ms": durations / NS_PER_MS,
        **{c: totals[:, i] / NS_PER_MS for i, c in enumerate(CATEGORIES)},
    })
    inside = _inside_any(timeline.start_ns, w_start, w_end)
    comp_ms = float(timeline.length_ns[timeline.comp & inside].sum()) / NS_PER_MS
    comm_ms = float(timeline.length_ns[timeline.comm & inside].sum()) / NS_PER_MS
    overlapped_ms = float(totals[:, CATEGORIES.index("comm_overlapped")].sum()) / NS_PER_MS
    return StepBreakdown(frame, timeline.mode, comp_ms, comm_ms, overlapped_ms, timeline.training_tid)


def _inside_any(points: np.ndarray, w_start: np.ndarray, w_end: np.ndarray) -> np.ndarray:
    """Whether each point lies in one of the (disjoint, sorted) windows."""
    i = np.searchsorted(w_start, points, side="right") - 1
    return (i >= 0) & (points < w_end[np.maximum(i, 0)])
