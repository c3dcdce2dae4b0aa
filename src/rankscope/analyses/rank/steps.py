"""Step windows (docs/concepts.md "Step"; after tb-profiler).

A step is a `ProfilerStep#N` span on the CPU. Its window ends at max(CPU end, end of the last
device activity launched inside it), clipped at the next step's start. A trace without steps
is one step spanning the whole trace (`source == "whole_trace"`), and callers say so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast

import numpy as np
import polars as pl

from rankscope.analyses.intervals import covered_between, union
from rankscope.analyses.rank.views import event_end_ns, kind_mask, launch_calls_by_id, memo, name_mask, rows_of_kinds
from rankscope.model import DEVICE_KINDS, HOST_OP_KINDS, PROFILER_STEP_PATTERN, KernelClass, RankTrace


def device_union(trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """The time with at least one kernel, memcpy or memset running: sorted disjoint intervals."""
    def make():
        dev = kind_mask(trace, DEVICE_KINDS)
        return union(trace.events["ts_ns"].to_numpy()[dev], event_end_ns(trace)[dev])
    return memo(trace, ("steps", "device_union"), make)


def device_class_union(trace: RankTrace, kernel_class: KernelClass) -> tuple[np.ndarray, np.ndarray]:
    """The time with at least one device event (kernel, memcpy, memset) of this kernel class running:
    sorted disjoint intervals."""
    def make():
        sel = kind_mask(trace, DEVICE_KINDS) & (trace.events["kclass"].to_numpy() == int(kernel_class))
        return union(trace.events["ts_ns"].to_numpy()[sel], event_end_ns(trace)[sel])
    return memo(trace, ("steps", "device_class_union", int(kernel_class)), make)


# ----------------------------------------------------------------------------------------------
@dataclass
class StepWindows:
    """`frame` columns: step, start_ns, cpu_end_ns, end_ns, duration_ns (one row per step)."""
    frame: pl.DataFrame
    source: str                 # "profiler_step" | "whole_trace"


def step_windows(trace: RankTrace) -> StepWindows:
    """Computed once per trace (every per-step analysis needs them)."""
    return memo(trace, ("step_windows",), lambda: _step_windows(trace))


def _step_number(name: str) -> int:
    m = re.search(PROFILER_STEP_PATTERN, name)
    assert m is not None                      # a step mark's name
    return int(m.group(1))


def _step_windows(trace: RankTrace) -> StepWindows:
    ev = trace.events
    rows = np.flatnonzero(kind_mask(trace, HOST_OP_KINDS) & name_mask(trace, PROFILER_STEP_PATTERN))
    if len(rows) == 0:
        if ev.is_empty():
            frame = _frame(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
            return StepWindows(frame, "whole_trace")
        start = int(cast(int, ev["ts_ns"].min()))
        end = int(event_end_ns(trace).max())
        return StepWindows(_frame(np.array([0]), np.array([start]), np.array([end]), np.array([end])), "whole_trace")

    # one span per step number (some traces record it as cpu_op and as annotation)
    number = np.array([_step_number(n) for n in ev["name"].gather(rows).cast(pl.String).to_list()], dtype=np.int64)
    steps, which = np.unique(number, return_inverse=True)
    starts = np.full(len(steps), np.iinfo(np.int64).max, dtype=np.int64)
    cpu_ends = np.full(len(steps), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(starts, which, ev["ts_ns"].to_numpy()[rows])
    np.maximum.at(cpu_ends, which, event_end_ns(trace)[rows])
    order = np.argsort(starts, kind="stable")
    steps, starts, cpu_ends = steps[order], starts[order], cpu_ends[order]
    device_end = _last_launched_device_end(trace, starts, cpu_ends)
    ends = np.maximum(cpu_ends, device_end)
    ends[:-1] = np.minimum(ends[:-1], starts[1:])
    return StepWindows(_frame(steps, starts, cpu_ends, ends), "profiler_step")


def _frame(steps, starts, cpu_ends, ends) -> pl.DataFrame:
    return pl.DataFrame({"step": steps, "start_ns": starts, "cpu_end_ns": cpu_ends, "end_ns": ends,
                         "duration_ns": ends - starts},
                        schema={"step": pl.Int64, "start_ns": pl.Int64, "cpu_end_ns": pl.Int64,
                                "end_ns": pl.Int64, "duration_ns": pl.Int64})


def _last_launched_device_end(trace: RankTrace, starts: np.ndarray, cpu_ends: np.ndarray) -> np.ndarray:
    """Per step: the latest end of device activity whose launch (runtime call) lies inside the
    step's CPU span; int64 min where none."""
    out = np.full(len(starts), np.iinfo(np.int64).min, dtype=np.int64)
    correlation = trace.events["correlation"].to_numpy()
    ids, by_id = launch_calls_by_id(trace)
    device = rows_of_kinds(trace, DEVICE_KINDS)
    device = device[correlation[device] >= 0]
    if len(by_id) == 0 or len(device) == 0:
        return out
    # every (launch, device event) pair of one correlation id: the launches sorted by id, each device
    # event's range of launches found by binary search, then the ranges expanded
    lo = np.searchsorted(ids, correlation[device], side="left")
    n = np.searchsorted(ids, correlation[device], side="right") - lo
    pair_launch = by_id[np.repeat(lo - np.cumsum(n) + n, n) + np.arange(n.sum())]
    pair_end = np.repeat(event_end_ns(trace)[device], n)
    launch_ns = trace.events["ts_ns"].to_numpy()[pair_launch]
    i = np.searchsorted(starts, launch_ns, side="right") - 1
    inside = (i >= 0) & (launch_ns < cpu_ends[np.maximum(i, 0)])
    np.maximum.at(out, i[inside], pair_end[inside])
    return out


def device_busy_ns(trace: RankTrace, windows: StepWindows) -> np.ndarray:
    """Per step: time with at least one kernel, memcpy or memset running (union of intervals)."""
    s, e = device_union(trace)
    f = windows.frame
    return covered_between(s, e, f["start_ns"].to_numpy(), f["end_ns"].to_numpy())
