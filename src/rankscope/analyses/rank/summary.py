"""What one rank's trace holds: event counts, devices, steps, device-busy time and the exact
breakdown of every step.

`summarize_rank` is the per-rank map step: it runs every per-rank analysis once and keeps only
their small results (no event frames), so the driver holds summaries, whatever the number of
ranks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from rankscope.analyses.rank.breakdown import CATEGORIES, classify_timeline, step_breakdown
from rankscope.analyses.rank.collectives import RankCollectives, rank_collectives
from rankscope.analyses.rank.dataloader import dataloader_share
from rankscope.analyses.rank.gaps import GapSummary, idle_gaps
from rankscope.analyses.rank.grad_sync import gradient_sync_schedule
from rankscope.analyses.rank.flops import rank_flops
from rankscope.analyses.rank.idle import idle_time_breakdown
from rankscope.analyses.rank.kernels import kernel_breakdown, kernel_stats
from rankscope.analyses.rank.operators import operator_stats
from rankscope.analyses.rank.launch import kernel_launch_stats, memory_bandwidth, queue_length
from rankscope.analyses.rank.memory import memory_timeline, pageable_memcpy
from rankscope.analyses.rank.overlap import comm_comp_overlap
from rankscope.analyses.rank.temporal import temporal_breakdown
from rankscope.analyses.rank.steps import device_busy_ns, step_windows
from rankscope.model import (DEVICE_KINDS, HOST_OP_KINDS, PROFILER_STEP_PATTERN, Kind, KernelClass, RankMeta,
                             RankTrace, names_matching)
from rankscope.units import NS_PER_MS

#: Memory samples kept per device in the summary (peaks kept exactly): enough for a chart.
MEMORY_POINTS = 200
#: Rows kept in top-N tables (kernels, operators) per rank.
TOP_N = 10


def as_plain(obj: Any) -> Any:
    """An analysis result (dataclasses, polars frames, numpy numbers) as plain data that travels
    from a worker and is cached as msgpack: frames become {column: list}."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: as_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, pl.DataFrame):
        return {c: as_plain(v) for c, v in obj.to_dict(as_series=False).items()}
    if isinstance(obj, dict):
        return {str(k): as_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


_NUMBERS = {int, float, bool, type(None)}


def share_strings(obj: Any, pool: dict[str, str]) -> Any:
    """`obj` with every string replaced by the equal one in `pool` (added there when new). The
    ranks of a job repeat the same kernel, op, category and column names, and each rank's summary
    arrives (unpickled from a worker, or decoded from the cache) with its own copies: at 10 MB
    synth ranks, 49 KB of a summary's 127 KB of Python objects outside its collectives are strings,
    35 KB of them the same on every rank. Dicts and tuples are rebuilt, lists and (non-frozen)
    dataclasses changed in place; everything else is left as it is."""
    if isinstance(obj, str):
        return pool.setdefault(obj, obj)
    if isinstance(obj, dict):
        return {share_strings(k, pool): share_strings(v, pool) for k, v in obj.items()}
    if isinstance(obj, list):
        if not set(map(type, obj)) <= _NUMBERS:          # most lists are columns of numbers
            for i, v in enumerate(obj):
                obj[i] = share_strings(v, pool)
        return obj
    if isinstance(obj, tuple):
        return tuple(share_strings(v, pool) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and not obj.__dataclass_params__.frozen:
        for f in dataclasses.fields(obj):
            setattr(obj, f.name, share_strings(getattr(obj, f.name), pool))
    return obj


@dataclass
class RankSummary:
    meta: RankMeta
    steps: list[dict]                 # step, start_ns, end_ns, duration_ms, device_busy_ms, breakdown_ms
    steps_source: str                 # "profiler_step" | "whole_trace"
    kind_counts: dict[str, int]       # complete events per kind name
    device_events: int                # kernels + memcpy + memset
    comm_kernels: int                 # device events of class COMM
    streams: int                      # distinct (device, stream) with device activity
    breakdown_mode: str = "device"    # "device" | "cpu_only" (the training thread plays the device)
    breakdown_mean_ms: dict[str, float] = field(default_factory=dict)   # per category, mean per step
    overlap_efficiency: float | None = None
    gaps: GapSummary | None = None    # device idle gaps and what the host did meanwhile
    dataloader: dict | None = None    # analyses.dataloader.DataLoaderShare as plain data
    memory: dict | None = None        # analyses.memory.MemoryTimeline (<= MEMORY_POINTS per device)
    memcpy: dict | None = None        # analyses.memory.MemcpyReport
    hta: dict | None = None           # HTA-parity figures: temporal, overlap, idle, launch, queue, memory_bw
    kernels: dict | None = None       # kernel classes, top kernels, occupancy, Tensor Core / FP32 GEMM share
    operators: dict | None = None     # top ops by self device / CPU time, grouped by name
    collectives: RankCollectives | None = None   # this rank's collectives, for the cross-rank reduce
    name_totals: dict | None = None   # every kernel / op name: {"kernels"|"ops": name_totals(...)} (diff)
    grad_sync: dict | None = None     # analyses.grad_sync.GradSyncSchedule: gradient collectives vs backward
    flops: dict | None = None         # analyses.mfu.RankFlops: traced FLOPs per step (for MFU)
    from_cache: bool = False

    @property
    def rank(self) -> int:
        return self.meta.rank

    @property
    def has_device(self) -> bool:
        return self.device_events > 0


def summarize_rank(trace: RankTrace) -> RankSummary:
    ev = trace.events
    windows = step_windows(trace)
    busy = device_busy_ns(trace, windows)
    f = windows.frame
    timeline = classify_timeline(trace, [f["start_ns"].to_numpy(), f["end_ns"].to_numpy()])
    breakdown = step_breakdown(trace, windows, timeline)
    parts = breakdown.frame.select(CATEGORIES).rows()
    steps = [
        {"step": int(s), "start_ns": int(a), "end_ns": int(b), "duration_ms": float(d) / NS_PER_MS,
         "device_busy_ms": float(u) / NS_PER_MS, "breakdown_ms": dict(zip(CATEGORIES, p))}
        for s, a, b, d, u, p in zip(f["step"], f["start_ns"], f["end_ns"], f["duration_ns"], busy, parts)
    ]
    counts = ev.group_by("kind").len()
    kind_counts = {Kind(int(k)).name.lower(): int(n) for k, n in zip(counts["kind"], counts["len"])}
    dev = ev.filter(pl.col("kind").is_in([int(k) for k in DEVICE_KINDS]))
    return RankSummary(
        meta=trace.meta, steps=steps, steps_source=windows.source, kind_counts=kind_counts,
        device_events=len(dev),
        comm_kernels=int((dev["kclass"] == int(KernelClass.COMM)).sum()),
        streams=dev.select("device", "stream").unique().height,
        breakdown_mode=breakdown.mode, breakdown_mean_ms=breakdown.mean_ms(),
        overlap_efficiency=breakdown.overlap_efficiency,
        gaps=idle_gaps(trace, windows, timeline) if len(dev) else None,
        dataloader=as_plain(dataloader_share(trace, windows)),
        memory=as_plain(memory_timeline(trace, MEMORY_POINTS, windows)) if len(trace.memory) else None,
        memcpy=as_plain(pageable_memcpy(trace, windows)) if len(dev) else None,
        hta=_hta_parity(trace) if len(dev) else None,
        kernels=as_plain({"breakdown": kernel_breakdown(trace, top_k=TOP_N), "stats": kernel_stats(trace, top_n=TOP_N)})
        if len(dev) else None,
        operators=as_plain(operator_stats(trace, top_n=TOP_N)),
        collectives=rank_collectives(trace, timeline, windows),
        name_totals={"kernels": name_totals(dev), "ops": name_totals(_host_ops(ev))},
        grad_sync=as_plain(gradient_sync_schedule(trace)),
        flops=as_plain(rank_flops(trace)),
    )


def name_totals(events: pl.DataFrame) -> dict:
    """Per event name, as columns: name, count, total_ns (summed duration) and sumsq_ns2 (summed
    squared duration, float: the per-call variance for the diff's Welch test). Every name, sorted."""
    t = (events.group_by(pl.col("name").cast(pl.String))
         .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("dur_ns").sum().cast(pl.Int64).alias("total_ns"),
              (pl.col("dur_ns").cast(pl.Float64) ** 2).sum().alias("sumsq_ns2"))
         .sort("name"))
    return as_plain(t)


def _host_ops(ev: pl.DataFrame) -> pl.DataFrame:
    """Host ops (CPU ops, user annotations) without the ProfilerStep spans."""
    ops = ev.filter(pl.col("kind").is_in([int(k) for k in HOST_OP_KINDS]))
    return ops.filter(~pl.col("name").is_in(names_matching(ops, PROFILER_STEP_PATTERN)))


def _hta_parity(trace: RankTrace) -> dict:
    """HTA's per-rank figures (docs/hta-parity.md), without the time series (kept small)."""
    def fields(result, skip: tuple[str, ...] = ()) -> dict:
        return {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name not in skip}
    return as_plain({
        "temporal": fields(temporal_breakdown(trace)),
        "overlap": fields(comm_comp_overlap(trace)),
        "idle": fields(idle_time_breakdown(trace)),
        "launch": fields(kernel_launch_stats(trace)),
        "queue": fields(queue_length(trace), ("series",)),
        "memory_bw": fields(memory_bandwidth(trace), ("series",)),
    })
@dataclass
class StepTimeStats:
    mean_ms: float | None
    median_ms: float | None
    max_ms: float | None
    device_busy_pct: float | None     # None for ranks without device activity


def step_time_stats(summary: RankSummary) -> StepTimeStats:
    if not summary.steps:
        return StepTimeStats(None, None, None, None)
    d = np.array([s["duration_ms"] for s in summary.steps])
    busy = np.array([s["device_busy_ms"] for s in summary.steps])
    pct = float(100.0 * busy.sum() / d.sum()) if summary.has_device and d.sum() > 0 else None
    return StepTimeStats(float(d.mean()), float(np.median(d)), float(d.max()), pct)
