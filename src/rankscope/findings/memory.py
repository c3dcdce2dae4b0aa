"""Memory findings: allocator fragmentation, memory pressure, copies from pageable host memory."""
from __future__ import annotations

from statistics import median
from typing import Iterable, Iterator

from rankscope.results.rank import DeviceMemory
from rankscope.findings.registry import NOT_RETIMED, JobView, job_or_rank_tier, rule
from rankscope.numbers import rounded
from rankscope.results import Finding


def _gpu_devices(job: JobView) -> Iterator[tuple[int, DeviceMemory]]:
    """(rank, device memory summary) of each rank's devices, host memory left out (no allocator
    cache, no capacity)."""
    for s in job.ranks:
        for d in (s.memory.devices if s.memory else []):
            if d.device_type != 0:
                yield s.rank, d


@rule("memory_fragmentation", reads=("fragmentation_pct", "fragmentation_min_mb"))
def memory_fragmentation(job: JobView) -> Iterable[Finding]:
    """At the moment allocated GPU memory peaks, reserved but unallocated memory (reserved -
    allocated then) >= `fragmentation_pct` of the reserved memory then and >= `fragmentation_min_mb`."""
    t = job.thresholds
    frag = {r: d for r, d in _gpu_devices(job) if d.fragmentation_pct is not None and d.fragmentation_mb is not None
            and d.fragmentation_pct >= t["fragmentation_pct"] and d.fragmentation_mb >= t["fragmentation_min_mb"]}
    if not frag:
        return

    def fragmentation_mb(d: DeviceMemory) -> float:
        assert d.fragmentation_mb is not None          # `frag` keeps only devices that have it
        return d.fragmentation_mb
    worst = max(frag.values(), key=fragmentation_mb)
    yield Finding(
        id="memory_fragmentation", severity="medium", ranks=sorted(frag), steps=job.steps(),
        summary=(f"when allocated GPU memory peaks ({worst.peak_allocated_mb:.0f} MB), "
                 f"{worst.fragmentation_mb:.0f} MB ({worst.fragmentation_pct:.0f}%) of the "
                 f"{worst.reserved_at_peak_allocated_mb:.0f} MB reserved then is cached but not allocated "
                 f"(fragmentation: reserved - allocated at peak allocated)"),
        evidence={str(r): {"device": d.device, "peak_allocated_mb": rounded(d.peak_allocated_mb, 1),
                      "reserved_at_peak_allocated_mb": rounded(d.reserved_at_peak_allocated_mb, 1),
                      "fragmentation_mb": rounded(d.fragmentation_mb, 1),
                      "fragmentation_pct_of_reserved": rounded(d.fragmentation_pct, 1),
                      "peak_reserved_mb": rounded(d.peak_reserved_mb, 1)} for r, d in frag.items()},
        explanation=("The caching allocator keeps freed blocks reserved; with varying tensor sizes they split "
                     "into pieces too small to reuse, so even when the job needs the most memory a large part "
                     "of the pool sits cached and unusable, and the next larger batch runs out of memory."),
        fix=("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; keep shapes static (pad or bucket sequence "
             "lengths); avoid torch.cuda.empty_cache() in the loop"),
        threshold=dict(t), cost_ms_per_step=None)


@rule("memory_pressure", reads=("memory_pressure_medium_pct", "memory_pressure_high_pct"))
def memory_pressure(job: JobView) -> Iterable[Finding]:
    """Peak reserved (else allocated) GPU memory as a share of device capacity, tiered by
    `memory_pressure_medium_pct` / `memory_pressure_high_pct` on the highest rank."""
    t = job.thresholds
    pressure = {}
    for r, d in _gpu_devices(job):
        used = d.peak_reserved_pct_of_capacity or d.peak_allocated_pct_of_capacity
        if used is not None and used >= t["memory_pressure_medium_pct"]:
            pressure[r] = (used, d)
    if not pressure:
        return
    top = max(v[0] for v in pressure.values())
    yield Finding(
        id="memory_pressure",
        severity="high" if top >= t["memory_pressure_high_pct"] else "medium", ranks=sorted(pressure),
        steps=job.steps(),
        summary=f"peak GPU memory reaches {top:.0f}% of device capacity",
        evidence={str(r): {"device": d.device, "peak_pct_of_capacity": rounded(u, 1),
                      "capacity_mb": rounded(d.capacity_mb, 0)} for r, (u, d) in pressure.items()},
        explanation=("Close to capacity the allocator retries (synchronizing cudaFree) and the next larger batch "
                     "or sequence runs out of memory."),
        fix=("activation checkpointing (torch.utils.checkpoint), shard parameters/gradients/optimizer states "
             "(FSDP / ZeRO), bf16 autocast, a smaller micro-batch with gradient accumulation"),
        threshold=dict(t), cost_ms_per_step=None)


@rule("unpinned_memcpy", reads=("pageable_memcpy_low_pct", "pageable_memcpy_medium_pct"))
def unpinned_memcpy(job: JobView) -> Iterable[Finding]:
    """Copies from pageable host memory as a share of the step: the median rank's share tiered by
    `pageable_memcpy_low_pct` / `pageable_memcpy_medium_pct`, or single ranks over the medium tier
    (low)."""
    t = job.thresholds
    memcpys = {s.rank: s.memcpy for s in job.ranks if s.memcpy and s.memcpy.pageable.count}
    rows = {r: m.pageable for r, m in memcpys.items()}
    if not rows:
        return
    shares = {r: p.step_share_pct or 0.0 for r, p in rows.items()}
    severity, ranks = job_or_rank_tier(shares, t, ("pageable_memcpy_low_pct", "pageable_memcpy_medium_pct", None))
    if severity is None:
        return
    bw = [b for r in ranks if (b := rows[r].mean_bandwidth_gbps) is not None]
    ratio = [memcpys[r].pinned_vs_pageable_bandwidth_ratio for r in ranks]
    yield Finding(
        id="unpinned_memcpy", severity=severity, ranks=ranks, steps=job.steps(),
        summary=(f"copies from pageable host memory take {median(shares.values()):.1f}% of each step"
                 + (f" at {median(bw):.1f} GB/s" if bw else "")),
        evidence={"pageable_pct_of_step": {r: rounded(v, 2) for r, v in sorted(shares.items())},
                  "pageable_copies": {r: rows[r].count for r in ranks},
                  "pageable_ms": {r: rounded(rows[r].total_ms, 3) for r in ranks},
                  "mean_bandwidth_gbps": rounded(median(bw), 2) if bw else None,
                  "pinned_vs_pageable_bandwidth_ratio": [rounded(x, 2) for x in ratio],
                  "what_if": NOT_RETIMED.format(what="faster copies")},
        explanation=("A copy from pageable memory is staged through a pinned bounce buffer by the driver: it runs "
                     "at a fraction of PCIe bandwidth and cannot overlap with compute."),
        fix="DataLoader(pin_memory=True) and tensor.to(device, non_blocking=True); pin long-lived host buffers "
            "(tensor.pin_memory())",
        threshold=dict(t),
        cost_ms_per_step=median(rows[r].total_ms or 0.0 for r in ranks) / max(len(job.steps()), 1))
