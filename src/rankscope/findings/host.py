"""Findings where the host holds the device back: DataLoader stalls, host-bound steps, launch
overhead, device synchronization."""
from __future__ import annotations

from statistics import median
from typing import Any, Iterable

from rankscope.findings.registry import NOT_RETIMED, JobView, job_or_rank_tier, rank_shares, rule, saving, tier
from rankscope.numbers import rounded
from rankscope.results import Finding
from rankscope.results.findings import FindingId


def _ranks_text(ranks: list[int]) -> str:
    return "rank " + str(ranks[0]) if len(ranks) == 1 else f"{len(ranks)} ranks"


@rule("dataloader_stall", reads=("dataloader_low_pct", "dataloader_medium_pct", "dataloader_high_pct"))
def dataloader_stall(job: JobView) -> Iterable[Finding]:
    """Time the device (or training thread) waits inside DataLoader.__next__, as a share of the step:
    the median rank's share tiered by `dataloader_low_pct` / `dataloader_medium_pct` /
    `dataloader_high_pct`, or single ranks over the high tier (one tier lower)."""
    shares = rank_shares(job, lambda s: job.pct_of_step(job.part(s, "dataloader")))
    if not shares:
        return
    t = job.thresholds
    severity, ranks = job_or_rank_tier(shares, t, ("dataloader_low_pct", "dataloader_medium_pct",
                                                   "dataloader_high_pct"))
    if severity is None:
        return
    by_rank = {s.rank: s for s in job.ranks}
    loaders = [by_rank[r].dataloader for r in ranks]
    workers = sorted({d.num_workers for d in loaders if d and d.num_workers is not None})
    ms = median(job.part(by_rank[r], "dataloader") for r in ranks)
    # the fix on every rank (num_workers is one setting), or on the one rank that stalls
    sv = saving(job, *((f"rank:{ranks[0]}:dataloader",) if len(ranks) == 1 < len(shares) else ()),
                "every:dataloader")
    severity = sv.severity if sv else severity
    workers_text = ("" if not workers else f" (num_workers={'/'.join(map(str, workers))})")
    more = ("set num_workers to 4-8 per GPU (it is 0: data is loaded on the training thread)"
            if workers == [0] else "raise num_workers")
    yield Finding(
        id="dataloader_stall", severity=severity, ranks=ranks, steps=job.steps(),
        summary=(f"the {'device' if any(s.has_device for s in job.ranks) else 'training thread'} waits for the "
                 f"DataLoader {median(shares[r] for r in ranks):.1f}% of each step on {_ranks_text(ranks)} "
                 f"({ms:.1f} ms per step){workers_text}" + (f"; {sv.text()}" if sv else "")),
        evidence={"dataloader_pct_of_step": {r: rounded(v, 1) for r, v in sorted(shares.items())},
                  "median_pct_of_step": rounded(median(shares.values()), 1), "dataloader_ms_per_step": rounded(ms, 3),
                  "num_workers": workers,
                  "dataloader_span_share_pct": {r: rounded(d.share_pct, 1) if d else None
                                                for r, d in zip(ranks, loaders)}, **(sv.evidence() if sv else {})},
        explanation=("Time inside enumerate(DataLoader).__next__ with nothing else running: the next batch was "
                     "not ready when the step wanted it, so compute stalls on input."),
        fix=(f"{more}; pin_memory=True; persistent_workers=True and prefetch_factor=2-4; move decoding and "
             "augmentation offline or to the GPU (e.g. DALI) when workers are not enough"),
        threshold=dict(t), cost_ms_per_step=sv.ms if sv else ms)


def _device_category(job: JobView, category: str, finding_id: FindingId, medium: str, high: str, summary: str,
                     explanation: str, fix: str, extra_evidence: dict[str, Any] | None = None,
                     ) -> Iterable[Finding]:
    """A breakdown category in which the device idles (host, sync) tiered on its median share of
    the step; `summary` is formatted with pct (median share) and ms (median per step). The saving:
    the category removed on every rank (what-if `every:<category>`), which sets the severity."""
    t = job.thresholds
    shares = rank_shares(job, lambda s: job.pct_of_step(job.part(s, category))
                         if s.has_device and s.breakdown_mode == "device" else None)
    if not shares:
        return
    pct = median(shares.values())
    severity = tier(pct, t, None, medium, high)
    if severity is None:
        return
    ranks = sorted(r for r, v in shares.items() if v >= t[medium])
    ms = median(job.part(s, category) for s in job.ranks if s.rank in shares)
    sv = saving(job, f"every:{category}")
    yield Finding(
        id=finding_id, severity=sv.severity if sv else severity, ranks=ranks, steps=job.steps(),
        summary=summary.format(pct=pct, ms=ms) + (f"; {sv.text()}" if sv else ""),
        evidence={f"{category}_pct_of_step": {r: rounded(v, 1) for r, v in sorted(shares.items())},
                  f"{category}_ms_per_step": rounded(ms, 3), **(extra_evidence or {}), **(sv.evidence() if sv else {})},
        explanation=explanation, fix=fix, threshold=dict(t), cost_ms_per_step=sv.ms if sv else ms)


#: What the host did during a device-idle gap (its dominant breakdown category), in words.
HOST_ACTIVITY_TEXT = {"host": "busy in CPU ops or Python", "idle_other": "outside any CPU op",
                      "sync": "blocked in a synchronize", "dataloader": "waiting in the DataLoader"}


def compiled_share(job: JobView) -> float | None:
    """Median over the device ranks of the share of kernels a compiler generated (TorchInductor's
    Triton kernels, nvFuser's), by time or by launches, whichever is higher; None without kernels."""
    shares = [max(s.kernels.stats.generated_kernel_pct or 0.0, s.kernels.stats.generated_kernel_count_pct or 0.0)
              for s in job.ranks if s.kernels is not None and s.kernels.stats.kernel_count]
    return median(shares) if shares else None


def _compiled(job: JobView) -> float | None:
    """The compiled share when it reaches `generated_kernel_share_pct` (the model is compiled
    already), else None."""
    share = compiled_share(job)
    return share if share is not None and share >= job.thresholds["generated_kernel_share_pct"] else None


def _host_fix(compiled: float | None) -> str:
    """How to cut host work per step; without torch.compile when the kernels are compiled already."""
    if compiled is not None:
        return (f"the model is compiled already ({compiled:.0f}% of kernels are Triton / nvFuser generated): "
                "capture the step in CUDA graphs (mode='reduce-overhead' where it is compiled, or "
                "torch.cuda.graphs), remove graph breaks so more ops fuse (torch._dynamo.explain lists them), "
                "a larger batch per step, and move Python-side work (metrics, logging, tensor.tolist()) out of "
                "the step")
    return ("cut host work per step: torch.compile (fuses ops, fewer launches), CUDA graphs "
            "(torch.compile(mode='reduce-overhead')), a larger batch per step, and move Python-side work "
            "(metrics, logging, tensor.tolist()) out of the step")


def _longest_gap(job: JobView, ranks: list[int]) -> tuple[int, Any] | None:
    """(rank, gap) of the longest device-idle gap among `ranks`."""
    gaps = [(s.rank, s.gaps.top[0]) for s in job.ranks if s.rank in ranks and s.gaps and s.gaps.top]
    return max(gaps, key=lambda rg: rg[1].duration_ms) if gaps else None


def _gap_evidence(job: JobView, ranks: list[int]) -> dict[str, Any]:
    """GPU busy per rank and the longest device-idle gap with what the host did meanwhile."""
    busy = {s.rank: rounded(s.step_time.device_busy_pct, 2) for s in job.ranks
            if s.rank in ranks and s.step_time.device_busy_pct is not None}
    found = _longest_gap(job, ranks)
    gap = None
    if found:
        r, g = found
        gap = {"rank": r, "step": g.step, "start_in_step_ms": rounded(g.start_in_step_ms, 3),
               "duration_ms": rounded(g.duration_ms, 3), "host_activity": g.host_activity,
               "host_ms": {k: rounded(v, 3) for k, v in g.host_ms.items()},
               "host_op_most_present": g.busy_host_op, "ended_by": g.next_device_op, "launched_by": g.launched_by}
    return {"gpu_busy_pct": busy, "longest_idle_gap": gap}


def _gap_text(job: JobView, ranks: list[int]) -> str:
    found = _longest_gap(job, ranks)
    if not found:
        return "no idle gap between device work: the idle time lies before the first or after the last kernel"
    r, g = found
    op = ("" if not g.busy_host_op else f" ({g.busy_host_op} open for part of it)" if g.host_activity == "idle_other"
          else f", in {g.busy_host_op}")
    return (f"in the longest idle gap, {g.duration_ms:.1f} ms at +{g.start_in_step_ms:.1f} ms into step {g.step}"
            f"{' on rank ' + str(r) if len(job.ranks) > 1 else ''}, the host was "
            f"{HOST_ACTIVITY_TEXT.get(g.host_activity, g.host_activity)}{op}")


@rule("gpu_idle_host_bound", reads=("host_bound_medium_pct", "host_bound_high_pct", "gpu_busy_low_pct",
                                    "generated_kernel_share_pct"))
def gpu_idle_host_bound(job: JobView) -> Iterable[Finding]:
    """The device idles while the host runs CPU ops, launches or Python (breakdown category `host`), as
    a share of the step (median device rank), tiered by `host_bound_medium_pct` / `host_bound_high_pct`;
    or, whatever the host did, the device is busy less than `gpu_busy_low_pct` of the step (median
    device rank; high) unless the DataLoader or synchronization explain most of the idle time (their
    own findings). torch.compile is left out of the fix when >= `generated_kernel_share_pct` of the
    kernels are compiler-generated."""
    compiled = _compiled(job)
    device_ranks = [s.rank for s in job.ranks if s.has_device and s.breakdown_mode == "device"]
    found = list(_device_category(
        job, "host", "gpu_idle_host_bound", "host_bound_medium_pct", "host_bound_high_pct",
        "the GPU idles {pct:.1f}% of each step ({ms:.1f} ms) while the host runs CPU ops and launches: the job is "
        "host-bound",
        "The device has nothing queued while the CPU is still busy with Python, operator dispatch and kernel "
        "launches: the GPU runs faster than the host can feed it.",
        _host_fix(compiled), extra_evidence=_gap_evidence(job, device_ranks)))
    if found:
        yield from found
        return
    yield from _mostly_idle(job, compiled)


def _mostly_idle(job: JobView, compiled: float | None) -> Iterable[Finding]:
    """The device busy less than `gpu_busy_low_pct` of the step (median device rank)."""
    t = job.thresholds
    busy = {s.rank: s.step_time.device_busy_pct for s in job.ranks
            if s.has_device and s.breakdown_mode == "device" and s.step_time.device_busy_pct is not None}
    if not busy or median(busy.values()) >= t["gpu_busy_low_pct"]:
        return
    ranks = sorted(r for r, v in busy.items() if v < t["gpu_busy_low_pct"])
    by_rank = {s.rank: s for s in job.ranks}
    idle = {c: median(job.part(by_rank[r], c) for r in ranks) for c in ("dataloader", "sync", "host", "idle_other")}
    if max(idle, key=idle.__getitem__) in ("dataloader", "sync"):
        return                                  # dataloader_stall / sync_stall say it
    idle_ms = sum(idle.values())
    step_ms = median(job.step_ms[r] for r in ranks)
    whole = any(by_rank[r].steps_source == "whole_trace" for r in ranks)
    sv = saving(job, "every:host")
    yield Finding(
        id="gpu_idle_host_bound", severity=sv.severity if sv else "high", ranks=ranks, steps=job.steps(),
        summary=(f"the GPU is busy only {median(busy.values()):.1f}% of each step (idle {idle_ms:.1f} of "
                 f"{step_ms:.1f} ms: {idle['host']:.1f} ms with the host in CPU ops, {idle['idle_other']:.1f} ms "
                 f"outside any profiled op); {_gap_text(job, ranks)}" + (f"; {sv.text()}" if sv else "")),
        evidence={**_gap_evidence(job, ranks), "idle_ms_per_step": {c: rounded(v, 3) for c, v in idle.items()},
                  "step_ms": rounded(step_ms, 3), **(sv.evidence() if sv else {})},
        explanation=("The device has nothing to run almost all the time: the host is the bottleneck, or the "
                     "profiled window is warm-up (compilation, autotuning, first-call allocations) rather than "
                     "training; what the host did in the longest gap tells which."),
        fix=("if the window is warm-up (compilation or autotuning in the longest gap), profile steady-state "
             "steps instead: torch.profiler.schedule(wait=1, warmup=2, active=3) with prof.step() every "
             "iteration" + (" (this trace has no step marks)" if whole else "")
             + "; if steady-state steps look like this, the GPU waits on the host: " + _host_fix(compiled)),
        threshold=dict(t), cost_ms_per_step=sv.ms if sv else idle_ms)


@rule("launch_overhead", reads=("short_kernel_share_pct", "launch_idle_pct", "generated_kernel_share_pct"))
def launch_overhead(job: JobView) -> Iterable[Finding]:
    """Ranks where >= `short_kernel_share_pct` of kernel launches are shorter than HTA's runtime
    cutoff and the device idles (host + other) >= `launch_idle_pct` of the step. torch.compile is left
    out of the fix when >= `generated_kernel_share_pct` of the kernels are compiler-generated."""
    t = job.thresholds
    compiled = _compiled(job)
    ranks, short_pcts, kernel_p50_us = [], [], []
    for s in job.ranks:
        launch = s.hta.launch if s.hta else None
        if launch is None or not launch.launches or s.breakdown_mode != "device":
            continue
        n = launch.launches
        short_pct = 100.0 * launch.short_kernels / n
        idle_pct = job.pct_of_step(job.part(s, "host") + job.part(s, "idle_other"))
        if short_pct >= t["short_kernel_share_pct"] and idle_pct >= t["launch_idle_pct"]:
            ranks.append(s.rank)
            short_pcts.append(short_pct)
            p50 = launch.gpu_duration.p50_us
            if p50 is not None:
                kernel_p50_us.append(p50)
    if not ranks:
        return
    median_kernel = f" (median kernel {median(kernel_p50_us):.0f} us)" if kernel_p50_us else ""
    yield Finding(
        id="launch_overhead", severity="medium", ranks=ranks, steps=job.steps(),
        summary=(f"{median(short_pcts):.0f}% of kernels are tiny{median_kernel} and the device idles between them: "
                 "launch overhead dominates"),
        evidence={"short_kernel_pct": rounded(median(short_pcts), 1),
                  "median_kernel_us": rounded(median(kernel_p50_us), 1) if kernel_p50_us else None,
                  "what_if": NOT_RETIMED.format(what="fewer, fused launches")},
        explanation=("Each kernel costs several microseconds of CPU launch time; when kernels run for less than "
                     "that, the GPU waits for launches instead of computing."),
        fix=(("fuse and batch: torch.compile, CUDA graphs (torch.compile(mode='reduce-overhead') or "
              "torch.cuda.graphs), foreach/fused optimizers (fused=True), a larger batch") if compiled is None else
             (f"the kernels are compiler-generated already ({compiled:.0f}% from Triton / nvFuser): CUDA graphs "
              "(mode='reduce-overhead' where the model is compiled, or torch.cuda.graphs) to launch the step "
              "at once, remove graph breaks so more ops fuse into each kernel (torch._dynamo.explain), "
              "foreach/fused optimizers (fused=True), a larger batch")),
        threshold=dict(t), cost_ms_per_step=None)


@rule("sync_stall", reads=("sync_medium_pct", "sync_high_pct"))
def sync_stall(job: JobView) -> Iterable[Finding]:
    """The host blocks on device synchronization while the GPU idles (breakdown category `sync`), as
    a share of the step (median device rank), tiered by `sync_medium_pct` / `sync_high_pct`."""
    yield from _device_category(
        job, "sync", "sync_stall", "sync_medium_pct", "sync_high_pct",
        "the host blocks on device synchronization {pct:.1f}% of each step ({ms:.1f} ms) while the GPU idles",
        "cudaDeviceSynchronize / cudaStreamSynchronize / event waits (from .item(), .cpu(), print(tensor), "
        "torch.cuda.synchronize) stop the host until the device drains, so nothing is queued behind.",
        "remove host syncs from the step: keep losses/metrics on the GPU and read them every N steps, use "
        "non_blocking=True copies, avoid .item()/.tolist()/print of tensors and data-dependent Python control "
        "flow; torch.cuda.set_sync_debug_mode('warn') finds them")
