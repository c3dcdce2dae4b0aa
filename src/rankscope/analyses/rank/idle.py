"""Idle time of each device stream, by cause: host wait / kernel wait / other (docs/hta-parity.md).

Anchor: HTA 0.5 `TraceAnalysis.get_idle_time_breakdown` (hta/trace_analysis.py), implemented in
`BreakdownAnalysis.get_idle_time_breakdown` / `_analyze_idle_time_for_stream` (hta/analyzers/breakdown_analysis.py).

Definition, per (device, stream), over its device events (kernels, memcpy, memset) in the HTA scope
(`temporal.hta_scope_mask`) ordered by start: the idle interval before each event (all but the first) is
  gap = its start - the end of the previous event on the stream
and it is
  host_wait    when the event's launch (runtime/driver call with the same correlation id) started after
               the previous event ended: the host had not enqueued it yet;
  kernel_wait  else, when gap < `consecutive_kernel_delay_us` (default 30 µs): launch overhead between
               back-to-back kernels;
  other        else (e.g. a kernel waiting on an event from another stream).
Idle time per category = sum of its gaps; ratio = category / all three. Interval statistics per category:
count, mean, p50, p95, max (µs). Like HTA, gaps are not clipped: events that overlap on one stream give
negative gaps (kernel_wait), zero gaps count too.

Threshold: HTA documents `consecutive_kernel_delay=30` as nanoseconds, but compares it with timestamps in
the trace's unit, microseconds, so the threshold HTA applies is 30 µs; we use 30 µs to match what HTA
computes. Differences from HTA: we group by (device, stream), HTA by the stream number alone (the same on
one-GPU ranks); times are exact ns (HTA rounds fractional µs timestamps by default).
"""
from __future__ import annotations

import msgspec
import numpy as np
import polars as pl

from rankscope.analyses.rank.launch import quantiles
from rankscope.analyses.intervals import find_sorted
from rankscope.analyses.rank.temporal import (event_columns, first_per_id, run_bounds, scope_device_rows,
                                             scope_launch_calls)
from rankscope.analyses.rank.views import rows_of_kinds
from rankscope.model import DEVICE_KINDS, RankTrace
from rankscope.units import NS_PER_US, NS_PER_MS
from rankscope.results.rank import IDLE_CATEGORIES, IdleIntervals, IdleTimeBreakdown, StreamIdle

#: HTA 0.5 default of get_idle_time_breakdown (applied in µs, see module docstring).
CONSECUTIVE_KERNEL_DELAY_US = 30.0
CATEGORIES = IDLE_CATEGORIES


def _ratios(parts: dict[str, float]) -> dict[str, float | None]:
    total = sum(parts.values())
    return {c: (parts[c] / total if total != 0 else None) for c in CATEGORIES}


class _Gaps(msgspec.Struct):
    """The idle intervals of the rank in (device, stream, start) order: the event after each gap, its
    gap and category (index into CATEGORIES)."""
    device: np.ndarray
    stream: np.ndarray
    ts_ns: np.ndarray
    gap_ns: np.ndarray
    category: np.ndarray


def _first_launches(trace: RankTrace, include_last_step: bool) -> tuple[np.ndarray, np.ndarray]:
    """(correlation ids, start ns) of the launch calls (runtime / driver) in the HTA scope, sorted by id:
    the first call (frame order) of each id."""
    col = event_columns(trace)
    calls = scope_launch_calls(trace, include_last_step)
    corr = col["correlation"][calls]
    first = first_per_id(corr)
    return corr[first], col["ts_ns"][calls[first]]


def _gaps(trace: RankTrace, consecutive_kernel_delay_us: float, include_last_step: bool) -> _Gaps:
    col = event_columns(trace)
    dev = scope_device_rows(trace, include_last_step)
    dev = dev[np.lexsort((col["ts_ns"][dev], col["stream"][dev], col["device"][dev]))]   # ties keep row order
    device, stream = col["device"][dev], col["stream"][dev]
    # every event but the first of its (device, stream) follows a gap
    follows = np.flatnonzero((device[1:] == device[:-1]) & (stream[1:] == stream[:-1])) + 1
    before = dev[follows - 1]
    prev_end = col["ts_ns"][before] + col["dur_ns"][before]
    after = dev[follows]
    ts = col["ts_ns"][after]
    gap = ts - prev_end
    launch_corr, launch_ns = _first_launches(trace, include_last_step)
    launch = find_sorted(launch_corr, col["correlation"][after])
    host_wait = launch >= 0
    host_wait[host_wait] = launch_ns[launch[host_wait]] > prev_end[host_wait]
    category = np.where(host_wait, 0, np.where(gap < consecutive_kernel_delay_us * NS_PER_US, 1, 2))
    return _Gaps(device[follows], stream[follows], ts, gap, category)


def idle_intervals(trace: RankTrace, consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US,
                   include_last_step: bool = False) -> pl.DataFrame:
    """One row per idle interval: device, stream, ts_ns (start of the event after the gap), gap_ns,
    category. The intervals `idle_time_breakdown` sums up (can be large; not a result to ship)."""
    g = _gaps(trace, consecutive_kernel_delay_us, include_last_step)
    return pl.DataFrame({"device": g.device, "stream": g.stream, "ts_ns": g.ts_ns, "gap_ns": g.gap_ns,
                         "category": np.array(CATEGORIES)[g.category]},
                        schema={"device": pl.Int32, "stream": pl.Int64, "ts_ns": pl.Int64, "gap_ns": pl.Int64,
                                "category": pl.String})


def _intervals(gap_ns: np.ndarray) -> IdleIntervals:
    if len(gap_ns) == 0:
        return IdleIntervals(0, None, None, None, None)
    g = gap_ns.astype(np.float64) / NS_PER_US
    p50, p95 = quantiles(g, [0.50, 0.95])
    return IdleIntervals(int(len(g)), float(g.mean()), p50, p95, float(g.max()))


def idle_time_breakdown(trace: RankTrace, consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US,
                        include_last_step: bool = False) -> IdleTimeBreakdown:
    result = IdleTimeBreakdown(consecutive_kernel_delay_us, include_last_step)
    col = event_columns(trace)
    dev = rows_of_kinds(trace, DEVICE_KINDS)
    if len(dev) == 0:
        return result
    g = _gaps(trace, consecutive_kernel_delay_us, include_last_step)
    dev = dev[np.lexsort((col["stream"][dev], col["device"][dev]))]
    first = dev[run_bounds(col["device"][dev], col["stream"][dev])[:-1]]
    streams = list(zip(col["device"][first].tolist(), col["stream"][first].tolist()))
    # the gaps come by (device, stream): one slice each
    bounds = run_bounds(g.device, g.stream)
    slices = {(int(g.device[i]), int(g.stream[i])): slice(i, j) for i, j in zip(bounds[:-1], bounds[1:])}
    totals = {c: 0.0 for c in CATEGORIES}
    for device, stream in streams:
        on = slices.get((device, stream), slice(0, 0))
        gaps, category = g.gap_ns[on], g.category[on]
        by_category = {c: gaps[category == i] for i, c in enumerate(CATEGORIES)}
        idle_ms = {c: int(x.sum()) / NS_PER_MS for c, x in by_category.items()}
        for c in CATEGORIES:
            totals[c] += idle_ms[c]
        result.streams.append(StreamIdle(
            device=int(device), stream=int(stream), idle_ms=idle_ms, idle_total_ms=sum(idle_ms.values()),
            ratio=_ratios(idle_ms), intervals={c: _intervals(x) for c, x in by_category.items()}))
    result.idle_ms = totals
    result.ratio = _ratios(totals)
    return result
