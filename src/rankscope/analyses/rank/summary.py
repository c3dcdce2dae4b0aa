"""What one rank's trace holds: event counts, devices, steps, device-busy time and the exact
breakdown of every step.

`summarize_rank` is the per-rank map step: it runs every per-rank analysis once and keeps only
their small results (no event frames), so the driver holds summaries, whatever the number of
ranks.
"""
from __future__ import annotations


import numpy as np

from rankscope.analyses.rank.breakdown import CATEGORIES, classify_timeline, step_breakdown
from rankscope.analyses.rank.collectives import rank_collectives
from rankscope.analyses.rank.dataloader import dataloader_share
from rankscope.analyses.rank.gaps import idle_gaps
from rankscope.analyses.rank.grad_sync import gradient_sync_schedule
from rankscope.analyses.rank.flops import rank_flops
from rankscope.analyses.rank.idle import idle_time_breakdown
from rankscope.analyses.rank.kernels import kernel_breakdown, kernel_stats
from rankscope.analyses.rank.operators import operator_stats
from rankscope.analyses.rank.launch import LAUNCH_NAMES, kernel_launch_stats, memory_bandwidth, queue_length
from rankscope.results.rank import MemoryBandwidthStats, QueueLengthStats
from rankscope.analyses.rank.memory import memory_timeline, pageable_memcpy
from rankscope.analyses.rank.overlap import comm_comp_overlap
from rankscope.analyses.rank.temporal import temporal_breakdown
from rankscope.analyses.rank import views
from rankscope.analyses.rank.steps import device_busy_ns, step_windows
from rankscope.model import DEVICE_KINDS, HOST_OP_KINDS, PROFILER_STEP_PATTERN, Kind, KernelClass, RankTrace, name_codes
from rankscope.units import NS_PER_MS
from rankscope.results.rank import (StepSummary, HtaParity, RankKernels, NameTotals, RankNameTotals, StepTimeStats,
                                    RankSummary)

#: Memory samples kept per device in the summary (peaks kept exactly): enough for a chart.
MEMORY_POINTS = 200
#: Rows kept in top-N tables (kernels, operators) per rank.
TOP_N = 10


def step_time_stats(steps: list[StepSummary], has_device: bool) -> StepTimeStats:
    if not steps:
        return StepTimeStats(None, None, None, None)
    d = np.array([s.duration_ms for s in steps])
    busy = np.array([s.device_busy_ms for s in steps])
    pct = float(100.0 * busy.sum() / d.sum()) if has_device and d.sum() > 0 else None
    return StepTimeStats(float(d.mean()), float(np.median(d)), float(d.max()), pct)


def summarize_rank(trace: RankTrace) -> RankSummary:
    ev = trace.events
    windows = step_windows(trace)
    busy = device_busy_ns(trace, windows)
    f = windows.frame
    timeline = classify_timeline(trace, [f["start_ns"].to_numpy(), f["end_ns"].to_numpy()])
    breakdown = step_breakdown(trace, windows, timeline)
    parts = breakdown.frame.select(CATEGORIES).rows()
    steps = [
        StepSummary(step=int(s), start_ns=int(a), end_ns=int(b), duration_ms=float(d) / NS_PER_MS,
                    device_busy_ms=float(u) / NS_PER_MS, breakdown_ms=dict(zip(CATEGORIES, p)))
        for s, a, b, d, u, p in zip(f["step"], f["start_ns"], f["end_ns"], f["duration_ns"], busy, parts)
    ]
    counts = np.bincount(ev["kind"].to_numpy())
    kind_counts = {Kind(k).name.lower(): int(n) for k, n in enumerate(counts) if n}
    dev = views.device_events(trace)
    return RankSummary(
        meta=trace.meta, steps=steps, steps_source=windows.source, kind_counts=kind_counts,
        device_events=len(dev), step_time=step_time_stats(steps, has_device=len(dev) > 0),
        comm_kernels=int((dev["kclass"] == int(KernelClass.COMM)).sum()),
        streams=dev.select("device", "stream").unique().height,
        breakdown_mode=breakdown.mode, breakdown_mean_ms=breakdown.mean_ms(),
        overlap_efficiency=breakdown.overlap_efficiency,
        gaps=idle_gaps(trace, windows, timeline),
        dataloader=dataloader_share(trace, windows),
        memory=memory_timeline(trace, MEMORY_POINTS, windows) if len(trace.memory) else None,
        memcpy=pageable_memcpy(trace, windows) if len(dev) else None,
        hta=_hta_parity(trace) if len(dev) else None,
        kernels=RankKernels(kernel_breakdown(trace, top_k=TOP_N), kernel_stats(trace, top_n=TOP_N))
        if len(dev) else None,
        operators=operator_stats(trace, top_n=TOP_N),
        collectives=rank_collectives(trace, timeline, windows),
        name_totals=RankNameTotals(kernels=name_totals(trace, views.rows_of_kinds(trace, DEVICE_KINDS)),
                                   ops=_op_name_totals(trace)),
        grad_sync=gradient_sync_schedule(trace),
        flops=rank_flops(trace),
        kernel_launches=_kernel_launches(trace),
    )


def _kernel_launches(trace: RankTrace) -> int:
    """Host kernel-launch calls (runtime / driver events named in launch.LAUNCH_NAMES)."""
    return int(views.named_mask(trace, LAUNCH_NAMES)[views.rows_of_kinds(trace, (Kind.RUNTIME, Kind.DRIVER))].sum())


def name_totals(trace: RankTrace, rows: np.ndarray) -> NameTotals:
    """Per event name of the events at `rows` (every name; unnamed events left out): calls, summed
    and summed squared duration. Sums per name code (exact: a name's summed ns stays below 2**53)."""
    codes = name_codes(trace.events)
    rows = rows[codes.named[rows]]
    code, dur = codes.code[rows], trace.events["dur_ns"].to_numpy()[rows]
    n = int(codes.present.max(initial=-1)) + 1
    count, total = np.bincount(code, minlength=n), np.bincount(code, weights=dur, minlength=n)
    sumsq = np.bincount(code, weights=dur.astype(np.float64) ** 2, minlength=n)
    at = sorted(np.flatnonzero(count).tolist(), key=codes.name_of.__getitem__)
    return NameTotals(name=[codes.name_of[c] for c in at], count=count[at].tolist(),
                      total_ns=total[at].astype(np.int64).tolist(), sumsq_ns2=sumsq[at].tolist())


def _op_name_totals(trace: RankTrace) -> NameTotals:
    """`name_totals` of the host ops (CPU ops, user annotations) without the ProfilerStep spans
    (their rows dropped from the totals, not from the events)."""
    rows = views.rows_of_kinds(trace, HOST_OP_KINDS)
    return name_totals(trace, rows[~views.name_mask(trace, PROFILER_STEP_PATTERN)[rows]])


def _hta_parity(trace: RankTrace) -> HtaParity:
    """HTA's per-rank figures, without the time series (kept small)."""
    q, m = queue_length(trace, series=False), memory_bandwidth(trace, series=False)
    return HtaParity(
        temporal=temporal_breakdown(trace), overlap=comm_comp_overlap(trace), idle=idle_time_breakdown(trace),
        launch=kernel_launch_stats(trace), queue=QueueLengthStats(q.include_last_step, q.origin_ns, q.streams),
        memory_bw=MemoryBandwidthStats(m.include_last_step, m.origin_ns, m.kinds))
