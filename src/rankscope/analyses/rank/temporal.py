"""Temporal breakdown of one rank's device time: idle / compute / non-compute (docs/hta-parity.md).

Anchor: HTA 0.5 `TraceAnalysis.get_temporal_breakdown` (hta/trace_analysis.py), implemented in
`BreakdownAnalysis.get_temporal_breakdown` / `_get_idle_time_for_kernels` (hta/analyzers/breakdown_analysis.py).

Definition (per rank), over the device events in the HTA scope (`hta_scope_mask`, below):
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

HTA scope (`hta_scope_mask`), as HTA 0.5 `Trace._filter_irrelevant_gpu_kernels` (hta/common/trace.py) applies it to
every analysis when a trace has at least two distinct `ProfilerStep*` names: host events are kept when they
start before the start of the last profiler step (the profiler usually cuts that step short;
`include_last_step=True`: when they start at or before its end), and device events only when their launch
(same correlation id) is among the kept host events. Device events with no launch in the trace go too.
With fewer than two step names nothing is dropped.
"""
from __future__ import annotations

import numpy as np

from rankscope.analyses.intervals import find_sorted, union
from rankscope.analyses.rank.views import distinct_names, is_kind, launch_calls_by_id, memo, named_mask, rows_of_kinds
from rankscope.model import DEVICE_KINDS, Kind, KernelClass, RankTrace, name_codes
from rankscope.units import NS_PER_MS
from rankscope.results.rank import TemporalBreakdown

#: HTA treats these cuda_sync events as device-side even without a correlation id (trace_filter.py).
_HTA_DEVICE_SYNC_NAMES = ("Event Sync", "Context Sync")
_STEP_MARK = "ProfilerStep"
_COLUMNS = ("kind", "ts_ns", "dur_ns", "device", "stream", "correlation", "kclass")


# ------------------------------------------------------------------------------------------------
# array helpers
def first_per_id(ids: np.ndarray) -> np.ndarray:
    """Whether each entry of these sorted ids is the first of its id."""
    return np.r_[True, ids[1:] != ids[:-1]] if len(ids) else np.zeros(0, bool)


def run_bounds(*keys: np.ndarray) -> np.ndarray:
    """Where each run of equal keys starts along these sorted key arrays, and then their length."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(1, np.int64)
    change = np.zeros(n - 1, bool)
    for k in keys:
        change |= k[1:] != k[:-1]
    return np.flatnonzero(np.r_[True, change, True])


# ------------------------------------------------------------------------------------------------
# the events of the HTA analyses, as rows of `trace.events`, each made once per trace
def event_columns(trace: RankTrace) -> dict[str, np.ndarray]:
    """The numeric columns of `trace.events` as numpy arrays (kind, ts_ns, dur_ns, device, stream,
    correlation, kclass), indexed by row."""
    return memo(trace, ("temporal", "columns"),
                lambda: {c: trace.events[c].to_numpy() for c in _COLUMNS})


def hta_scope_mask(trace: RankTrace, include_last_step: bool = False) -> np.ndarray:
    """Per row of `trace.events`, whether it is in the HTA scope (module docstring). HTA's device side
    is "has a stream and a correlation id" (plus Event/Context Sync); everything else is host side."""
    return memo(trace, ("temporal", "scope_mask", include_last_step),
                lambda: _hta_scope_mask(trace, include_last_step))


def _hta_scope_mask(trace: RankTrace, include_last_step: bool) -> np.ndarray:
    col = event_columns(trace)
    every_row = np.ones(len(col["kind"]), dtype=bool)
    step_names = [n for n in distinct_names(trace) if _STEP_MARK in n]
    if len(step_names) < 2:
        return every_row
    ts, corr = col["ts_ns"], col["correlation"]
    device_side = ((col["stream"] >= 0) & (corr >= 0)) | named_mask(trace, _HTA_DEVICE_SYNC_NAMES)
    # an unnamed event that is not device side by its stream and correlation is on neither side (as polars'
    # null-aware filters left it)
    host = ~device_side & name_codes(trace.events).named
    marks = host & named_mask(trace, step_names)
    if not marks.any():
        return every_row
    if include_last_step:
        kept = host & (ts <= (ts[marks] + col["dur_ns"][marks]).max())
    else:
        kept = host & (ts < ts[marks].max())
    device_rows = np.flatnonzero(device_side)
    # the correlation ids of the kept host events, sorted: the launch calls' (sorted once per rank),
    # and any other host event's
    ids, calls = launch_calls_by_id(trace)
    kept_ids = ids[kept[calls]]
    others = kept & (corr >= 0) & ~is_kind(col["kind"], (Kind.RUNTIME, Kind.DRIVER))
    if others.any():
        kept_ids = np.sort(np.concatenate([kept_ids, corr[others]]))
    kept[device_rows] = find_sorted(kept_ids, corr[device_rows]) >= 0
    return kept


def scope_device_rows(trace: RankTrace, include_last_step: bool = False) -> np.ndarray:
    """The rows of the device events (kernels, memcpy, memset) in the HTA scope, ascending."""
    def make() -> np.ndarray:
        rows = rows_of_kinds(trace, DEVICE_KINDS)
        return rows[hta_scope_mask(trace, include_last_step)[rows]]
    return memo(trace, ("temporal", "scope_device_rows", include_last_step), make)


def scope_launch_calls(trace: RankTrace, include_last_step: bool = False) -> np.ndarray:
    """The rows of the runtime / driver calls with a correlation id in the HTA scope, by correlation id
    (stable: row order within one id)."""
    def make() -> np.ndarray:
        rows = launch_calls_by_id(trace)[1]
        return rows[hta_scope_mask(trace, include_last_step)[rows]]
    return memo(trace, ("temporal", "scope_launch_calls", include_last_step), make)


def class_intervals(trace: RankTrace, device_rows: np.ndarray,
                    kernel_class: KernelClass | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) in ns of these device events (rows of `trace.events`); with `kernel_class`, only
    kernels of that class (COMP and COMM are kernels; MEM is memcpy/memset too)."""
    col = event_columns(trace)
    rows = device_rows
    if kernel_class is not None:
        of_class = col["kclass"][rows] == int(kernel_class)
        if kernel_class in (KernelClass.COMP, KernelClass.COMM):
            of_class &= col["kind"][rows] == int(Kind.KERNEL)
        rows = rows[of_class]
    s = col["ts_ns"][rows].astype(np.int64, copy=False)
    return s, s + col["dur_ns"][rows].astype(np.int64, copy=False)


def union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    s, e = union(starts, ends)
    return int((e - s).sum())


def temporal_breakdown(trace: RankTrace, include_last_step: bool = False) -> TemporalBreakdown:
    rows = scope_device_rows(trace, include_last_step)
    s, e = class_intervals(trace, rows)
    keep = e >= s
    s, e = s[keep], e[keep]
    if len(s) == 0:
        return TemporalBreakdown(None, None, None, None, None, None, None, 0, include_last_step)
    span = int(e.max() - s.min())
    busy = union_length(s, e)
    compute = union_length(*class_intervals(trace, rows, KernelClass.COMP))
    idle = span - busy
    non_compute = span - compute - idle

    def pct(x: int) -> float | None:
        return 100.0 * x / span if span > 0 else None

    return TemporalBreakdown(
        span_ms=span / NS_PER_MS, idle_ms=idle / NS_PER_MS, compute_ms=compute / NS_PER_MS,
        non_compute_ms=non_compute / NS_PER_MS, idle_pct=pct(idle), compute_pct=pct(compute),
        non_compute_pct=pct(non_compute), device_events=int(len(s)), include_last_step=include_last_step)
