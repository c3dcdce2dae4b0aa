"""Idle time of each device stream, by cause: host wait / kernel wait / other (docs/hta-parity.md).

Anchor: HTA 0.5 `TraceAnalysis.get_idle_time_breakdown` (hta/trace_analysis.py), implemented in
`BreakdownAnalysis.get_idle_time_breakdown` / `_analyze_idle_time_for_stream` (hta/analyzers/breakdown_analysis.py).

Definition, per (device, stream), over its device events (kernels, memcpy, memset) in the HTA scope
(`temporal.hta_scope`) ordered by start: the idle interval before each event (all but the first) is
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
import polars as pl

from rankscope.analyses.rank.temporal import hta_scope
from rankscope.model import DEVICE_KINDS, Kind, RankTrace
from rankscope.units import NS_PER_US, NS_PER_MS

#: HTA 0.5 default of get_idle_time_breakdown (applied in µs, see module docstring).
CONSECUTIVE_KERNEL_DELAY_US = 30.0
CATEGORIES = ("host_wait", "kernel_wait", "other")
_DEVICE = [int(k) for k in DEVICE_KINDS]
_LAUNCH = [int(Kind.RUNTIME), int(Kind.DRIVER)]


class IdleIntervals(msgspec.Struct):
    """Statistics of one category's idle intervals on a stream (µs; None without intervals)."""
    count: int
    mean_us: float | None
    p50_us: float | None
    p95_us: float | None
    max_us: float | None


class StreamIdle(msgspec.Struct):
    """One (device, stream): idle ms per category, their total, each category's share of it (None when
    the stream has no idle time) and interval statistics per category."""
    device: int
    stream: int
    idle_ms: dict[str, float]
    idle_total_ms: float
    ratio: dict[str, float | None]
    intervals: dict[str, IdleIntervals]


class IdleTimeBreakdown(msgspec.Struct):
    """`streams`: one per (device, stream). `idle_ms` / `ratio`: the rank's totals over all streams."""
    consecutive_kernel_delay_us: float
    include_last_step: bool
    idle_ms: dict[str, float] = msgspec.field(default_factory=lambda: {c: 0.0 for c in CATEGORIES})
    ratio: dict[str, float | None] = msgspec.field(default_factory=lambda: {c: None for c in CATEGORIES})
    streams: list[StreamIdle] = []


def _ratios(parts: dict[str, float]) -> dict[str, float | None]:
    total = sum(parts.values())
    return {c: (parts[c] / total if total != 0 else None) for c in CATEGORIES}


def idle_intervals(trace: RankTrace, consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US,
                   include_last_step: bool = False) -> pl.DataFrame:
    """One row per idle interval: device, stream, ts_ns (start of the event after the gap), gap_ns,
    category. The per-event frame behind `idle_time_breakdown` (can be large; not a result to ship)."""
    ev = hta_scope(trace, include_last_step)
    empty = pl.DataFrame(schema={"device": pl.Int32, "stream": pl.Int64, "ts_ns": pl.Int64, "gap_ns": pl.Int64,
                                 "category": pl.String})
    dev = ev.filter(pl.col("kind").is_in(_DEVICE))
    if dev.is_empty():
        return empty
    launches = (ev.filter(pl.col("kind").is_in(_LAUNCH) & (pl.col("correlation") >= 0))
                .group_by("correlation").agg(pl.col("ts_ns").first().alias("launch_ns")))
    threshold_ns = consecutive_kernel_delay_us * NS_PER_US
    out = (
        dev.select("device", "stream", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"),
                   "correlation", "row")
        .join(launches, on="correlation", how="left")
        .sort("device", "stream", "ts_ns", "row")
        .with_columns(pl.col("end_ns").shift(1).over("device", "stream").alias("prev_end_ns"))
        .filter(pl.col("prev_end_ns").is_not_null())
        .with_columns((pl.col("ts_ns") - pl.col("prev_end_ns")).alias("gap_ns"))
        .with_columns(
            pl.when(pl.col("launch_ns").is_not_null() & (pl.col("launch_ns") > pl.col("prev_end_ns")))
            .then(pl.lit("host_wait"))
            .when(pl.col("gap_ns") < threshold_ns).then(pl.lit("kernel_wait"))
            .otherwise(pl.lit("other")).alias("category"))
        .select("device", "stream", "ts_ns", "gap_ns", "category")
    )
    return out if not out.is_empty() else empty


def idle_time_breakdown(trace: RankTrace, consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US,
                        include_last_step: bool = False) -> IdleTimeBreakdown:
    result = IdleTimeBreakdown(consecutive_kernel_delay_us, include_last_step)
    gaps = idle_intervals(trace, consecutive_kernel_delay_us, include_last_step)
    streams = (trace.events.filter(pl.col("kind").is_in(_DEVICE)).select("device", "stream").unique()
               .sort("device", "stream"))
    if streams.is_empty():
        return result
    g = pl.col("gap_ns").cast(pl.Float64) / NS_PER_US
    stats = (gaps.group_by("device", "stream", "category")
             .agg(pl.col("gap_ns").sum().alias("sum_ns"), pl.len().alias("count"), g.mean().alias("mean_us"),
                  g.quantile(0.5, "linear").alias("p50_us"), g.quantile(0.95, "linear").alias("p95_us"),
                  g.max().alias("max_us")))
    by_key: dict[tuple, dict] = {}
    for r in stats.iter_rows(named=True):
        by_key.setdefault((r["device"], r["stream"]), {})[r["category"]] = r
    totals = {c: 0.0 for c in CATEGORIES}
    for device, stream in streams.iter_rows():
        cats = by_key.get((device, stream), {})
        idle_ms = {c: (cats[c]["sum_ns"] / NS_PER_MS if c in cats else 0.0) for c in CATEGORIES}
        for c in CATEGORIES:
            totals[c] += idle_ms[c]
        result.streams.append(StreamIdle(
            device=int(device), stream=int(stream), idle_ms=idle_ms, idle_total_ms=sum(idle_ms.values()),
            ratio=_ratios(idle_ms),
            intervals={c: (IdleIntervals(cats[c]["count"], cats[c]["mean_us"], cats[c]["p50_us"], cats[c]["p95_us"],
                                         cats[c]["max_us"]) if c in cats else IdleIntervals(0, None, None, None, None))
                       for c in CATEGORIES}))
    result.idle_ms = totals
    result.ratio = _ratios(totals)
    return result
