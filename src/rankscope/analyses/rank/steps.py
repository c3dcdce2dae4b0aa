"""Step windows (docs/concepts.md "Step"; after tb-profiler).

A step is a `ProfilerStep#N` span on the CPU. Its window ends at max(CPU end, end of the last
device activity launched inside it), clipped at the next step's start. A trace without steps
is one step spanning the whole trace (`source == "whole_trace"`), and callers say so.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from rankscope.analyses.intervals import covered_between, union
from rankscope.analyses.rank import views
from rankscope.model import DEVICE_KINDS, HOST_OP_KINDS, PROFILER_STEP_PATTERN, Kind, RankTrace, names_matching

_DEVICE = [int(k) for k in DEVICE_KINDS]
_LAUNCH = [int(Kind.RUNTIME), int(Kind.DRIVER)]


@dataclass
class StepWindows:
    """`frame` columns: step, start_ns, cpu_end_ns, end_ns, duration_ns (one row per step)."""
    frame: pl.DataFrame
    source: str                 # "profiler_step" | "whole_trace"


def step_windows(trace: RankTrace) -> StepWindows:
    """Computed once per trace (every per-step analysis needs them)."""
    return views.memo(trace, ("step_windows",), lambda: _step_windows(trace))


def _step_windows(trace: RankTrace) -> StepWindows:
    ev = trace.events
    step_names = names_matching(ev, PROFILER_STEP_PATTERN)
    marks = (
        ev.filter(pl.col("kind").is_in([int(k) for k in HOST_OP_KINDS]) & pl.col("name").is_in(step_names))
        .select(
            pl.col("name").cast(pl.String).str.extract(PROFILER_STEP_PATTERN, 1).cast(pl.Int64).alias("step"),
            "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("cpu_end_ns"),
        )
        # one span per step number (some traces record it as cpu_op and as annotation)
        .group_by("step").agg(pl.col("ts_ns").min(), pl.col("cpu_end_ns").max())
        .sort("ts_ns")
    )
    if marks.is_empty():
        if ev.is_empty():
            frame = _frame(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
            return StepWindows(frame, "whole_trace")
        start = int(ev["ts_ns"].min())
        end = int((ev["ts_ns"] + ev["dur_ns"]).max())
        return StepWindows(_frame(np.array([0]), np.array([start]), np.array([end]), np.array([end])), "whole_trace")

    steps = marks["step"].to_numpy()
    starts = marks["ts_ns"].to_numpy()
    cpu_ends = marks["cpu_end_ns"].to_numpy()
    device_end = _last_launched_device_end(ev, starts, cpu_ends)
    ends = np.maximum(cpu_ends, device_end)
    ends[:-1] = np.minimum(ends[:-1], starts[1:])
    return StepWindows(_frame(steps, starts, cpu_ends, ends), "profiler_step")


def _frame(steps, starts, cpu_ends, ends) -> pl.DataFrame:
    return pl.DataFrame({"step": steps, "start_ns": starts, "cpu_end_ns": cpu_ends, "end_ns": ends,
                         "duration_ns": ends - starts},
                        schema={"step": pl.Int64, "start_ns": pl.Int64, "cpu_end_ns": pl.Int64,
                                "end_ns": pl.Int64, "duration_ns": pl.Int64})


def _last_launched_device_end(ev: pl.DataFrame, starts: np.ndarray, cpu_ends: np.ndarray) -> np.ndarray:
    """Per step: the latest end of device activity whose launch (runtime call) lies inside the
    step's CPU span; int64 min where none."""
    out = np.full(len(starts), np.iinfo(np.int64).min, dtype=np.int64)
    launches = ev.filter(pl.col("kind").is_in(_LAUNCH) & (pl.col("correlation") >= 0)).select(
        "correlation", pl.col("ts_ns").alias("launch_ns"))
    device = ev.filter(pl.col("kind").is_in(_DEVICE) & (pl.col("correlation") >= 0)).select(
        "correlation", (pl.col("ts_ns") + pl.col("dur_ns")).alias("device_end_ns"))
    if launches.is_empty() or device.is_empty():
        return out
    linked = launches.join(device, on="correlation", how="inner")
    launch_ns = linked["launch_ns"].to_numpy()
    i = np.searchsorted(starts, launch_ns, side="right") - 1
    inside = (i >= 0) & (launch_ns < cpu_ends[np.maximum(i, 0)])
    np.maximum.at(out, i[inside], linked["device_end_ns"].to_numpy()[inside])
    return out


def device_busy_ns(trace: RankTrace, windows: StepWindows) -> np.ndarray:
    """Per step: time with at least one kernel, memcpy or memset running (union of intervals)."""
    dev = trace.events.filter(pl.col("kind").is_in(_DEVICE))
    s, e = union(dev["ts_ns"].to_numpy(), (dev["ts_ns"] + dev["dur_ns"]).to_numpy())
    f = windows.frame
    return covered_between(s, e, f["start_ns"].to_numpy(), f["end_ns"].to_numpy())
