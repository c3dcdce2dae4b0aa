"""Temporal breakdown of one rank's device time: idle / compute / non-compute (docs/hta-parity.md).

Anchor: HTA 0.5 `TraceAnalysis.get_temporal_breakdown` (hta/trace_analysis.py), implemented in
`BreakdownAnalysis.get_temporal_breakdown` / `_get_idle_time_for_kernels` (hta/analyzers/breakdown_analysis.py).

Definition (per rank), over the device events in the HTA scope (`hta_scope`, below):
  span         = end of the last device event - start of the first one ("kernel time" in HTA)
  idle         = span - |union of all device events|         (no kernel, memcpy or memset running)
  compute      = |union of COMP kernels|                      (docs/concepts.md kernel classes)
  non_compute  = span - compute - idle                        (only COMM / MEM activity running)
and each as a percentage of span. Device events are kernels, memcpy and memset.

Where we differ from HTA on purpose (docs/hta-parity.md has the numbers):
  * COMP is the kernel class of docs/concepts.md (every kernel that is neither a collective nor a memory op).
    HTA calls a kernel communication only when its name matches `^nccl.*Kernel`, so symmetric-memory
    collectives (`multimem_*`, `*cross_device_reduce*`) count as compute there, and any name
    containing "Sync" or "Memcpy" is neither compute nor communication there.
  * HTA takes every event with a `stream` arg as device activity; that includes `cuda_sync` events
    (Stream Wait Event, Stream/Context Sync: the device waiting, not working). We do not.
  * Times are exact integer nanoseconds. By default HTA rounds fractional-microsecond timestamps
    (start up, end down; HTA_DISABLE_NS_ROUNDING=1 turns it off), which shortens every event.

HTA scope (`hta_scope`), as HTA 0.5 `Trace._filter_irrelevant_gpu_kernels` (hta/common/trace.py) applies it to
every analysis when a trace has at least two distinct `ProfilerStep*` names: host events are kept when they
start before the start of the last profiler step (the profiler usually cuts that step short;
`include_last_step=True`: when they start at or before its end), and device events only when their launch
(same correlation id) is among the kept host events. Device events with no launch in the trace go too.
With fewer than two step names nothing is dropped.
"""
from __future__ import annotations

import msgspec
import numpy as np
import polars as pl

from rankscope.analyses.intervals import union
from rankscope.model import DEVICE_KINDS, Kind, KernelClass, RankTrace, distinct_names
from rankscope.units import NS_PER_MS

#: HTA treats these cuda_sync events as device-side even without a correlation id (trace_filter.py).
_HTA_DEVICE_SYNC_NAMES = ("Event Sync", "Context Sync")
_STEP_MARK = "ProfilerStep"
_DEVICE = [int(k) for k in DEVICE_KINDS]


def hta_scope(trace: RankTrace, include_last_step: bool = False) -> pl.DataFrame:
    """The events HTA 0.5 analyses for this rank (see module docstring), with their `row` in `trace.events`.

    HTA's device side is "has a stream and a correlation id" (plus Event/Context Sync); everything else is
    host side. Order of rows is kept. Computed once per trace (several analyses use it)."""
    key = ("hta_scope", include_last_step)
    if key not in trace.derived:
        trace.derived[key] = _hta_scope(trace, include_last_step)
    return trace.derived[key]


def _hta_scope(trace: RankTrace, include_last_step: bool) -> pl.DataFrame:
    ev = trace.events.with_row_index("row")
    if ev.is_empty():
        return ev
    step_names = [n for n in distinct_names(trace.events) if _STEP_MARK in n]
    if len(step_names) < 2:
        return ev
    device_side = (((pl.col("stream") >= 0) & (pl.col("correlation") >= 0))
                   | pl.col("name").is_in(list(_HTA_DEVICE_SYNC_NAMES)))
    host = ev.filter(~device_side)
    marks = host.filter(pl.col("name").is_in(step_names))
    if marks.is_empty():
        return ev
    if include_last_step:
        cut = int((marks["ts_ns"] + marks["dur_ns"]).max())
        host_kept = host.filter(pl.col("ts_ns") <= cut)
    else:
        cut = int(marks["ts_ns"].max())
        host_kept = host.filter(pl.col("ts_ns") < cut)
    launched = host_kept["correlation"].unique().implode()
    device_kept = ev.filter(device_side & pl.col("correlation").is_in(launched))
    return pl.concat([host_kept, device_kept]).sort("row")


def device_intervals(events: pl.DataFrame, kernel_class: KernelClass | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) in ns of the device events (kernels, memcpy, memset) of `events`; with
    `kernel_class`, only kernels of that class (COMP and COMM are kernels; MEM is memcpy/memset too)."""
    cond = pl.col("kind").is_in(_DEVICE)
    if kernel_class is not None:
        cond = cond & (pl.col("kclass") == int(kernel_class))
        if kernel_class in (KernelClass.COMP, KernelClass.COMM):
            cond = cond & (pl.col("kind") == int(Kind.KERNEL))
    d = events.filter(cond)
    s = d["ts_ns"].to_numpy().astype(np.int64, copy=False)
    return s, s + d["dur_ns"].to_numpy().astype(np.int64, copy=False)


def union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    s, e = union(starts, ends)
    return int((e - s).sum())


class TemporalBreakdown(msgspec.Struct):
    """One rank. All None when the rank has no device activity (CPU-only trace)."""
    span_ms: float | None             # first device event start .. last device event end
    idle_ms: float | None
    compute_ms: float | None
    non_compute_ms: float | None
    idle_pct: float | None
    compute_pct: float | None
    non_compute_pct: float | None
    device_events: int                # device events in the scope
    include_last_step: bool


def temporal_breakdown(trace: RankTrace, include_last_step: bool = False) -> TemporalBreakdown:
    ev = hta_scope(trace, include_last_step)
    s, e = device_intervals(ev)
    keep = e >= s
    s, e = s[keep], e[keep]
    if len(s) == 0:
        return TemporalBreakdown(None, None, None, None, None, None, None, 0, include_last_step)
    span = int(e.max() - s.min())
    busy = union_length(s, e)
    compute = union_length(*device_intervals(ev, KernelClass.COMP))
    idle = span - busy
    non_compute = span - compute - idle

    def pct(x: int) -> float | None:
        return 100.0 * x / span if span > 0 else None

    return TemporalBreakdown(
        span_ms=span / NS_PER_MS, idle_ms=idle / NS_PER_MS, compute_ms=compute / NS_PER_MS,
        non_compute_ms=non_compute / NS_PER_MS, idle_pct=pct(idle), compute_pct=pct(compute),
        non_compute_pct=pct(non_compute), device_events=int(len(s)), include_last_step=include_last_step)
