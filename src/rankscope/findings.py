"""Findings: analysis results -> diagnoses with evidence and a concrete fix (DESIGN.md "Output").

Each rule reads the per-rank summaries and the cross-rank result of an `api.Analysis` (nothing is
recomputed from events) and returns at most one `Finding` per id. Every threshold is a named
entry of `THRESHOLDS` with its unit and the source it comes from; users override any of them
(`rankscope analyze --threshold dataloader_high_pct=30`, or `evaluate(..., resolve_thresholds(overrides))`).

Job-level shares are the median over ranks of a per-rank share of the mean step (DESIGN.md "Step
breakdown"), so one odd rank does not decide for the job; the ranks a finding names are those
over the lowest tier. Severity tiers: high (fix first: costs a large share of every step),
medium, low. Findings are ordered by severity, then by what they cost per step.

Time that a rank spends waiting at a collective for a late rank is not counted as exposed
communication: it belongs to the straggler / load-imbalance findings that name its cause.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any, Callable, Iterable

from rankscope.analyses.rank.summary import RankSummary
from rankscope.results import Finding, to_plain
from rankscope.hardware import devices_link_peak_gbps
from rankscope.numbers import rounded

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.analyses.inputs.nccl import NcclReport, NcclRun
    from rankscope.results import Analysis

SEVERITIES = ("high", "medium", "low")


@dataclass(frozen=True)
class Threshold:
    value: float
    unit: str
    source: str


_TB = "TensorBoard profiler plugin (torch-tb-profiler) recommendation"
_SEED = "seed 003 performance-analysis notes"
_OURS = "rankscope default, checked on the corpus cpu-gloo-4rank sets (healthy: no high finding)"

THRESHOLDS: dict[str, Threshold] = {
    # DataLoader: share of the step the device (or training thread) waits inside DataLoader.__next__
    "dataloader_low_pct": Threshold(5.0, "% of step", f"{_TB}: DataLoader > 5% of step"),
    "dataloader_medium_pct": Threshold(10.0, "% of step", f"{_SEED}: DataLoader > 5-20% of step"),
    "dataloader_high_pct": Threshold(20.0, "% of step", f"{_SEED}: DataLoader > 5-20% of step"),
    # communication that no computation hides (waits for late ranks excluded)
    "exposed_comm_low_pct": Threshold(5.0, "% of step", _OURS),
    "exposed_comm_medium_pct": Threshold(10.0, "% of step", _OURS),
    "exposed_comm_high_pct": Threshold(60.0, "% of step", _OURS),
    # gradient collectives launched after backward ended (analyses/rank/grad_sync.py)
    "after_backward_pct": Threshold(50.0, "% of gradient collectives", "PyTorch DDP design: buckets all-reduce "
                                    "during backward; most launched after it means no overlap"),
    "low_overlap_pct": Threshold(30.0, "% of comm time overlapped (HTA)", _OURS),
    "comm_significant_pct": Threshold(10.0, "% of step", _OURS),
    "comm_bound_ratio": Threshold(1.2, "comm time / compute time", f"{_SEED}: bottleneck analyzer, 1.2x rule"),
    # device idle while the host runs CPU ops / launches
    "host_bound_medium_pct": Threshold(15.0, "% of step", _OURS),
    "host_bound_high_pct": Threshold(30.0, "% of step", _OURS),
    "short_kernel_share_pct": Threshold(60.0, "% of launches shorter than the runtime cutoff",
                                        "HTA kernel launch statistics (runtime_cutoff 50 us)"),
    "launch_idle_pct": Threshold(20.0, "% of step device idle (host + other)", _OURS),
    "sync_medium_pct": Threshold(5.0, "% of step", _OURS),
    "sync_high_pct": Threshold(15.0, "% of step", _OURS),
    "pageable_memcpy_low_pct": Threshold(1.0, "% of step", _OURS),
    "pageable_memcpy_medium_pct": Threshold(5.0, "% of step", _OURS),
    "gemm_share_pct": Threshold(10.0, "% of kernel time in GEMMs", _OURS),
    "fp32_gemm_pct": Threshold(50.0, "% of GEMM time without Tensor Cores", _OURS),
    "fragmentation_pct": Threshold(30.0, "% of reserved not allocated at peak", _OURS),
    "fragmentation_min_mb": Threshold(512.0, "MB", _OURS),
    "memory_pressure_medium_pct": Threshold(80.0, "% of device capacity", _OURS),
    "memory_pressure_high_pct": Threshold(90.0, "% of device capacity", _OURS),
    "busbw_low_pct_of_peak": Threshold(25.0, "% of the device's link peak", "nccl-tests bus bandwidth"),
    "busbw_min_bytes": Threshold(1 << 20, "bytes per collective (below: latency bound)", "nccl-tests"),
    "straggler_high_cost_pct": Threshold(10.0, "% of median step", _OURS),
    # NCCL debug logs compared as runs (analyses/inputs/nccl.py)
    "nccl_busbw_pct_of_best": Threshold(70.0, "% of the best run's nccl-tests bus bandwidth at the same sizes",
                                        "rankscope default; nccl-tests run-to-run spread is a few %"),
    "nccl_degraded_pct_of_peers": Threshold(75.0, "% of the best peer's channel count / NCCL link bandwidth",
                                            "rankscope default; checked on the corpus nccl-logs-2xA100 (healthy: none)"),
}


def resolve_thresholds(overrides: dict[str, float] | None = None) -> dict[str, float]:
    """The threshold values in force; unknown names raise ValueError listing the known ones."""
    values = {name: t.value for name, t in THRESHOLDS.items()}
    for name, value in (overrides or {}).items():
        if name not in values:
            raise ValueError(f"unknown threshold {name!r}; known: {', '.join(sorted(values))}")
        values[name] = float(value)
    return values


def parse_threshold(text: str) -> tuple[str, float]:
    """`name=value` from the command line."""
    name, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return name.strip(), float(value)
    except ValueError:
        raise ValueError(f"threshold {text!r}: write NAME=NUMBER, e.g. dataloader_high_pct=30") from None


# ---------------------------------------------------------------------------------------------
@dataclass
class _Job:
    """What the rules read: per rank, the mean-step shares; the cross-rank result as plain data."""
    ranks: list[RankSummary]
    cross: dict | None
    t: dict[str, float]
    step_ms: dict[int, float] = field(default_factory=dict)
    wait_ms: dict[int, float] = field(default_factory=dict)     # per step, at collectives, for late ranks

    def share(self, s: RankSummary, ms: float, minus_ms: float = 0.0) -> float:
        """`ms` as a share of the rank's mean step (shortened by `minus_ms`)."""
        step = (self.step_ms.get(s.rank) or 0.0) - minus_ms
        return 100.0 * ms / step if step > 0 else 0.0

    def part(self, s: RankSummary, category: str) -> float:
        return s.breakdown_mean_ms.get(category, 0.0)

    def steps(self) -> list[int]:
        return sorted({st.step for s in self.ranks for st in s.steps})


def _tier(value: float, t: dict[str, float], low: str | None, medium: str | None, high: str | None) -> str | None:
    for name, severity in ((high, "high"), (medium, "medium"), (low, "low")):
        if name is not None and value >= t[name]:
            return severity
    return None


def _job_or_rank_tier(shares: dict[int, float], t: dict[str, float], tiers: tuple[str | None, str | None, str | None]
                      ) -> tuple[str | None, list[int]]:
    """Severity from the median rank's share (tiers: low, medium, high threshold names), and the
    ranks over the lowest tier. When the job as a whole is fine, ranks over the top tier still
    make a finding one tier lower: a fault of one rank (often a straggler's cause)."""
    named = [(name, severity) for name, severity in zip(tiers, ("low", "medium", "high")) if name is not None]
    severity = _tier(median(shares.values()), t, *tiers)
    if severity is not None:
        return severity, sorted(r for r, v in shares.items() if v >= t[named[0][0]])
    top, top_severity = named[-1]
    ranks = sorted(r for r, v in shares.items() if v >= t[top])
    one_down = SEVERITIES[min(SEVERITIES.index(top_severity) + 1, len(SEVERITIES) - 1)]
    return (one_down if ranks else None), ranks


def _ranks_text(ranks: list[int]) -> str:
    return "rank " + str(ranks[0]) if len(ranks) == 1 else f"{len(ranks)} ranks"


def _shares(job: _Job, fn: Callable[[RankSummary], float | None]) -> dict[int, float]:
    """Per rank, a share of the step (ranks where `fn` gives None are left out)."""
    out = {}
    for s in job.ranks:
        v = fn(s)
        if v is not None:
            out[s.rank] = v
    return out


# ------------------------------------------------------------------------------ rules
def _straggler(job: _Job) -> Iterable[Finding]:
    if not job.cross:
        return
    median_step = median(job.step_ms.values()) if job.step_ms else 0.0
    fixes = {
        "dataloader": "give that rank's input pipeline more DataLoader workers (num_workers, pin_memory=True, "
                      "persistent_workers=True) and check its data shard and storage (slow disk, remote reads)",
        "host_idle": "find what its main thread does outside any op: Python garbage collection (gc.freeze() after "
                     "setup, or gc.disable() + gc.collect() every N steps), logging or checkpoint I/O on that rank "
                     "only, time.sleep / barriers; py-spy dump --pid on that rank shows it",
        "cpu_ops": "check CPU contention on that host (other processes, CPU affinity / NUMA binding, "
                   "OMP_NUM_THREADS) and whether that rank runs extra CPU work (metrics, logging)",
        "gpu_compute": "check the GPU for thermal or power throttling (nvidia-smi -q -d PERFORMANCE) and for "
                       "uneven shards (drop_last=True, equal batch sizes / sequence lengths per rank)",
        "memcpy": "pin that rank's host buffers (pin_memory=True, non_blocking=True) and check its PCIe link "
                  "(nvidia-smi topo -m)",
        "communication": "check that rank's network path (NCCL_DEBUG=INFO: transport and NIC per peer)",
        "unknown": "the delay lies outside the profiled ops: profile more steps, and check thermal throttling "
                   "(nvidia-smi -q -d PERFORMANCE), uneven shards (drop_last=True) and host load on that rank",
    }
    for st in job.cross["stragglers"]:
        cost = st["cost_ms_per_step"]
        cost_pct = 100.0 * cost / median_step if median_step > 0 else 0.0
        severity = "high" if cost_pct >= job.t["straggler_high_cost_pct"] else "medium"
        yield Finding(
            id="straggler_rank", severity=severity, ranks=[st["rank"]], steps=list(st["steps"]),
            summary=(f"rank {st['rank']} is a straggler ({st['cause']}): the other ranks lose "
                     f"{cost:.2f} ms per step ({cost_pct:.1f}% of the median step) waiting for it"),
            evidence={"cause": st["cause"], "cost_ms_per_step": rounded(cost, 3),
                      "cost_pct_of_step": rounded(cost_pct, 2), "last_arrival_pct": rounded(st["last_arrival_pct"], 1),
                      "step_time_z": rounded(st["step_time_z"], 2),
                      "wait_imposed_ms_per_step": rounded(st["wait_imposed_ms_per_step"], 3),
                      "excess_ms_per_step": {k: rounded(v, 3) for k, v in st["excess_ms_per_step"].items()},
                      "detail": st["evidence"]},
            explanation=("Every collective finishes only when its last member arrives, so one late rank makes "
                         "all others wait. This rank arrives last at most collectives; the cause is what it did "
                         "before arriving, compared with the median rank."),
            fix=fixes.get(st["cause"], fixes["unknown"]),
            threshold={"straggler_high_cost_pct": job.t["straggler_high_cost_pct"]},
            cost_ms_per_step=cost)


def _dataloader(job: _Job) -> Iterable[Finding]:
    shares = _shares(job, lambda s: job.share(s, job.part(s, "dataloader")))
    if not shares:
        return
    t = job.t
    severity, ranks = _job_or_rank_tier(shares, t, ("dataloader_low_pct", "dataloader_medium_pct",
                                                    "dataloader_high_pct"))
    if severity is None:
        return
    by_rank = {s.rank: s for s in job.ranks}
    loaders = [by_rank[r].dataloader for r in ranks]
    workers = sorted({d.num_workers for d in loaders if d} - {None})
    ms = median(job.part(by_rank[r], "dataloader") for r in ranks)
    workers_text = ("" if not workers else f" (num_workers={'/'.join(map(str, workers))})")
    more = ("set num_workers to 4-8 per GPU (it is 0: data is loaded on the training thread)"
            if workers == [0] else "raise num_workers")
    yield Finding(
        id="dataloader_stall", severity=severity, ranks=ranks, steps=job.steps(),
        summary=(f"the {'device' if any(s.has_device for s in job.ranks) else 'training thread'} waits for the "
                 f"DataLoader {median(shares[r] for r in ranks):.1f}% of each step on {_ranks_text(ranks)} "
                 f"({ms:.1f} ms per step){workers_text}"),
        evidence={"dataloader_pct_of_step": {r: rounded(v, 1) for r, v in sorted(shares.items())},
                  "median_pct_of_step": rounded(median(shares.values()), 1), "dataloader_ms_per_step": rounded(ms, 3),
                  "num_workers": workers,
                  "dataloader_span_share_pct": {r: rounded(d.share_pct, 1) if d else None
                                                for r, d in zip(ranks, loaders)}},
        explanation=("Time inside enumerate(DataLoader).__next__ with nothing else running: the next batch was "
                     "not ready when the step wanted it, so compute stalls on input."),
        fix=(f"{more}; pin_memory=True; persistent_workers=True and prefetch_factor=2-4; move decoding and "
             "augmentation offline or to the GPU (e.g. DALI) when workers are not enough"),
        threshold={k: t[k] for k in ("dataloader_low_pct", "dataloader_medium_pct", "dataloader_high_pct")},
        cost_ms_per_step=ms)


def _comm(job: _Job) -> Iterable[Finding]:
    """exposed_communication, low_overlap and comm_bound."""
    t = job.t
    with_comm = [s for s in job.ranks if job.part(s, "comm_exposed") + job.part(s, "comm_overlapped") > 0]
    if not with_comm:
        return
    exposed = {s.rank: max(0.0, job.part(s, "comm_exposed") - job.wait_ms.get(s.rank, 0.0)) for s in with_comm}
    # share of the step as it would be without the wait (the wait goes when the late rank is fixed)
    exposed_pct = {s.rank: job.share(s, exposed[s.rank], minus_ms=job.wait_ms.get(s.rank, 0.0)) for s in with_comm}
    med_pct = median(exposed_pct.values())
    med_ms = median(exposed.values())
    sched = [s.grad_sync for s in with_comm if s.grad_sync]
    launched = sum(g.collectives for g in sched)
    after = sum(g.launched_after_backward for g in sched)
    after_pct = 100.0 * after / launched if launched else None
    hta_overlap = [s.hta.overlap.overlap_pct for s in with_comm
                   if s.hta and s.hta.overlap.overlap_pct is not None]
    med_overlap = median(hta_overlap) if hta_overlap else None
    waits_note = (" (of the step without its waits for late ranks, which the straggler / load imbalance findings "
                  "explain)"
                  if any(job.wait_ms.get(s.rank, 0.0) > 0 for s in with_comm) else "")

    severity = _tier(med_pct, t, "exposed_comm_low_pct", "exposed_comm_medium_pct", "exposed_comm_high_pct")
    if severity is not None:
        yield Finding(
            id="exposed_communication", severity=severity,
            ranks=sorted(r for r, v in exposed_pct.items() if v >= t["exposed_comm_low_pct"]), steps=job.steps(),
            summary=f"communication that no computation hides takes {med_pct:.1f}% of each step "
                    f"(median rank, {med_ms:.1f} ms){waits_note}",
            evidence={"exposed_comm_pct_of_step": {r: rounded(v, 1) for r, v in sorted(exposed_pct.items())},
                      "exposed_comm_ms_per_step": {r: rounded(v, 3) for r, v in sorted(exposed.items())},
                      "wait_for_late_ranks_ms_per_step": {r: rounded(job.wait_ms.get(r, 0.0), 3)
                                                          for r in sorted(exposed)},
                      "gradient_collectives_after_backward_pct": rounded(after_pct, 1),
                      "comm_comp_overlap_pct": rounded(med_overlap, 1)},
            explanation=("While a collective runs with no compute beside it, the step only waits for the network. "
                         "Either it starts too late to overlap (after backward), or there is more of it than "
                         "compute to hide it behind."),
            fix=("overlap it: let DDP/FSDP launch bucketed collectives during backward (no manual all_reduce after "
                 "backward); smaller bucket_cap_mb so the first buckets start earlier; then shrink it: gradients in "
                 "bf16 (DDP comm hook bf16_compress_hook), gradient accumulation (no_sync()) or a larger batch per "
                 "rank so each byte moved buys more compute"),
            threshold={k: t[k] for k in ("exposed_comm_low_pct", "exposed_comm_medium_pct", "exposed_comm_high_pct")},
            cost_ms_per_step=med_ms)

    evidence = {"gradient_collectives": launched, "launched_after_backward": after,
                "after_backward_pct": rounded(after_pct, 1), "comm_comp_overlap_pct": rounded(med_overlap, 1),
                "exposed_comm_pct_of_step": rounded(med_pct, 1)}
    low = None
    if after_pct is not None and after_pct >= t["after_backward_pct"]:
        # the schedule itself is the evidence; what it costs now sets the severity
        severity = _tier(med_pct, t, None, "exposed_comm_low_pct", "comm_significant_pct") or "low"
        low = (severity, f"{after} of {launched} gradient collectives are launched after backward has ended "
                         f"({after_pct:.0f}%): they cannot overlap with it, and expose {med_pct:.1f}% of the step")
    elif med_overlap is not None and med_overlap < t["low_overlap_pct"] and med_pct >= t["comm_significant_pct"]:
        low = ("medium", f"only {med_overlap:.1f}% of communication time overlaps with compute (median rank); "
                         f"{med_pct:.1f}% of the step is exposed communication")
    if low:
        yield Finding(
            id="low_overlap", severity=low[0], ranks=sorted(exposed_pct), steps=job.steps(), summary=low[1],
            evidence=evidence,
            explanation=("DDP hides gradient all-reduce behind backward by launching each bucket as soon as its "
                         "gradients are ready. Collectives launched after backward, or a single large bucket, "
                         "leave the device idle while the network works (seed: 'GPU idle after backward')."),
            fix=("use DDP/FSDP's bucketed overlap instead of all-reducing gradients after backward; lower "
                 "bucket_cap_mb (e.g. 25 -> 5-10) so buckets start earlier; remove find_unused_parameters=True "
                 "(it delays every bucket to the end of backward) or set static_graph=True"),
            threshold={k: t[k] for k in ("after_backward_pct", "low_overlap_pct", "exposed_comm_low_pct",
                                         "comm_significant_pct")},
            cost_ms_per_step=med_ms)

    comm_ms = median(exposed[s.rank] + job.part(s, "comm_overlapped") for s in with_comm)   # waits excluded
    compute_ms = median(job.part(s, "compute") + job.part(s, "comm_overlapped") for s in with_comm)
    if compute_ms >= 0 and comm_ms > t["comm_bound_ratio"] * compute_ms:
        ratio = comm_ms / compute_ms if compute_ms > 0 else None
        yield Finding(
            id="comm_bound", severity="medium", ranks=sorted(exposed), steps=job.steps(),
            summary=(f"communication-bound: {comm_ms:.1f} ms of communication per step against {compute_ms:.1f} ms "
                     f"of compute" + (f" ({ratio:.1f}x)" if ratio else "")),
            evidence={"comm_ms_per_step": rounded(comm_ms, 3), "compute_ms_per_step": rounded(compute_ms, 3),
                      "comm_to_compute_ratio": rounded(ratio, 2), "classification": "comm-bound"},
            explanation=("With more communication than compute per step, no overlap can hide it all: the job scales "
                         "with the network, not the GPUs (seed 003: comm > 1.2x compute = comm-bound)."),
            fix=("move fewer bytes per unit of compute: larger batch per rank or gradient accumulation, bf16 "
                 "gradient compression, hybrid sharding (FSDP HYBRID_SHARD) to keep traffic inside a node, fewer "
                 "ranks for this model size"),
            threshold={"comm_bound_ratio": t["comm_bound_ratio"]}, cost_ms_per_step=None)


def _device_category(job: _Job, category: str, finding_id: str, medium: str, high: str, summary: str,
                     explanation: str, fix: str) -> Iterable[Finding]:
    """A breakdown category in which the device idles (host, sync) tiered on its median share of
    the step; `summary` is formatted with pct (median share) and ms (median per step)."""
    t = job.t
    shares = _shares(job, lambda s: job.share(s, job.part(s, category))
                     if s.has_device and s.breakdown_mode == "device" else None)
    if not shares:
        return
    pct = median(shares.values())
    severity = _tier(pct, t, None, medium, high)
    if severity is None:
        return
    ranks = sorted(r for r, v in shares.items() if v >= t[medium])
    ms = median(job.part(s, category) for s in job.ranks if s.rank in shares)
    yield Finding(
        id=finding_id, severity=severity, ranks=ranks, steps=job.steps(), summary=summary.format(pct=pct, ms=ms),
        evidence={f"{category}_pct_of_step": {r: rounded(v, 1) for r, v in sorted(shares.items())},
                  f"{category}_ms_per_step": rounded(ms, 3)},
        explanation=explanation, fix=fix, threshold={k: t[k] for k in (medium, high)}, cost_ms_per_step=ms)


def _host_bound(job: _Job) -> Iterable[Finding]:
    yield from _device_category(
        job, "host", "gpu_idle_host_bound", "host_bound_medium_pct", "host_bound_high_pct",
        "the GPU idles {pct:.1f}% of each step ({ms:.1f} ms) while the host runs CPU ops and launches: the job is "
        "host-bound",
        "The device has nothing queued while the CPU is still busy with Python, operator dispatch and kernel "
        "launches: the GPU runs faster than the host can feed it.",
        "cut host work per step: torch.compile (fuses ops, fewer launches), CUDA graphs "
        "(torch.compile(mode='reduce-overhead')), a larger batch per step, and move Python-side work "
        "(metrics, logging, tensor.tolist()) out of the step")


def _sync(job: _Job) -> Iterable[Finding]:
    yield from _device_category(
        job, "sync", "sync_stall", "sync_medium_pct", "sync_high_pct",
        "the host blocks on device synchronization {pct:.1f}% of each step ({ms:.1f} ms) while the GPU idles",
        "cudaDeviceSynchronize / cudaStreamSynchronize / event waits (from .item(), .cpu(), print(tensor), "
        "torch.cuda.synchronize) stop the host until the device drains, so nothing is queued behind.",
        "remove host syncs from the step: keep losses/metrics on the GPU and read them every N steps, use "
        "non_blocking=True copies, avoid .item()/.tolist()/print of tensors and data-dependent Python control "
        "flow; torch.cuda.set_sync_debug_mode('warn') finds them")


def _launch_overhead(job: _Job) -> Iterable[Finding]:
    t = job.t
    ranks, short_pcts, kernel_p50_us = [], [], []
    for s in job.ranks:
        launch = s.hta.launch if s.hta else None
        n = launch.launches if launch else 0
        if not n or s.breakdown_mode != "device":
            continue
        short_pct = 100.0 * launch.short_kernels / n
        idle_pct = job.share(s, job.part(s, "host") + job.part(s, "idle_other"))
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
                  "median_kernel_us": rounded(median(kernel_p50_us), 1) if kernel_p50_us else None},
        explanation=("Each kernel costs several microseconds of CPU launch time; when kernels run for less than "
                     "that, the GPU waits for launches instead of computing."),
        fix=("fuse and batch: torch.compile, CUDA graphs (torch.compile(mode='reduce-overhead') or "
             "torch.cuda.graphs), foreach/fused optimizers (fused=True), a larger batch"),
        threshold={k: t[k] for k in ("short_kernel_share_pct", "launch_idle_pct")}, cost_ms_per_step=None)


def _memcpy(job: _Job) -> Iterable[Finding]:
    t = job.t
    rows = {s.rank: s.memcpy.pageable for s in job.ranks if s.memcpy and s.memcpy.pageable.count}
    if not rows:
        return
    shares = {r: p.step_share_pct or 0.0 for r, p in rows.items()}
    severity, ranks = _job_or_rank_tier(shares, t, ("pageable_memcpy_low_pct", "pageable_memcpy_medium_pct", None))
    if severity is None:
        return
    bw = [rows[r].mean_bandwidth_gbps for r in ranks if rows[r].mean_bandwidth_gbps is not None]
    by_rank = {s.rank: s for s in job.ranks}
    ratio = [by_rank[r].memcpy.pinned_vs_pageable_bandwidth_ratio for r in ranks]
    yield Finding(
        id="unpinned_memcpy", severity=severity, ranks=ranks, steps=job.steps(),
        summary=(f"copies from pageable host memory take {median(shares.values()):.1f}% of each step"
                 + (f" at {median(bw):.1f} GB/s" if bw else "")),
        evidence={"pageable_pct_of_step": {r: rounded(v, 2) for r, v in sorted(shares.items())},
                  "pageable_copies": {r: rows[r].count for r in ranks},
                  "pageable_ms": {r: rounded(rows[r].total_ms, 3) for r in ranks},
                  "mean_bandwidth_gbps": rounded(median(bw), 2) if bw else None,
                  "pinned_vs_pageable_bandwidth_ratio": [rounded(x, 2) for x in ratio]},
        explanation=("A copy from pageable memory is staged through a pinned bounce buffer by the driver: it runs "
                     "at a fraction of PCIe bandwidth and cannot overlap with compute."),
        fix="DataLoader(pin_memory=True) and tensor.to(device, non_blocking=True); pin long-lived host buffers "
            "(tensor.pin_memory())",
        threshold={k: t[k] for k in ("pageable_memcpy_low_pct", "pageable_memcpy_medium_pct")},
        cost_ms_per_step=median(rows[r].total_ms or 0.0 for r in ranks) / max(len(job.steps()), 1))


#: Devices with fp16 Tensor Cores but no bf16 / TF32 (Volta, Turing).
PRE_AMPERE = ("V100", "T4", "TITAN V", "RTX 20", "Quadro RTX")


def _tensor_cores(job: _Job, devices: list[str]) -> Iterable[Finding]:
    t = job.t
    hits = {}
    for s in job.ranks:
        if s.kernels is None:
            continue
        st = s.kernels.stats
        kernel_ms, gemm_ms, fp32 = st.kernel_ms, st.gemm_ms, st.fp32_gemm_share_pct
        if kernel_ms > 0 and fp32 is not None and 100.0 * gemm_ms / kernel_ms >= t["gemm_share_pct"] \
                and fp32 >= t["fp32_gemm_pct"]:
            hits[s.rank] = (100.0 * gemm_ms / kernel_ms, fp32, st.gemm_fp32_ms)
    if not hits:
        return
    gemm_pct = median(v[0] for v in hits.values())
    yield Finding(
        id="tensor_cores_unused", severity="high" if gemm_pct >= 3 * t["gemm_share_pct"] else "medium",
        ranks=sorted(hits), steps=job.steps(),
        summary=(f"{median(v[1] for v in hits.values()):.0f}% of GEMM time runs in FP32 without Tensor Cores; "
                 f"GEMMs are {gemm_pct:.0f}% of kernel time"),
        evidence={"gemm_pct_of_kernel_time": {r: rounded(v[0], 1) for r, v in hits.items()},
                  "fp32_gemm_pct": {r: rounded(v[1], 1) for r, v in hits.items()},
                  "fp32_gemm_ms": {r: rounded(v[2], 3) for r, v in hits.items()}},
        explanation=("FP32 matrix multiplies run on the CUDA cores at a fraction (1/8-1/16) of the Tensor Core "
                     "throughput of bf16/fp16 or TF32 on Ampere and later."),
        fix=("run the model under torch.autocast(device_type='cuda', dtype=torch.float16) with "
             "torch.amp.GradScaler ({} has fp16 Tensor Cores, no bf16/TF32)".format(
                 next(d for d in devices if any(k in d for k in PRE_AMPERE)))
             if any(k in d for d in devices for k in PRE_AMPERE) else
             "run the model under torch.autocast(device_type='cuda', dtype=torch.bfloat16); at least allow TF32: "
             "torch.set_float32_matmul_precision('high')"),
        threshold={k: t[k] for k in ("gemm_share_pct", "fp32_gemm_pct")}, cost_ms_per_step=None)


def _memory(job: _Job) -> Iterable[Finding]:
    t = job.t
    frag, pressure = {}, {}
    for s in job.ranks:
        for d in (s.memory.devices if s.memory else []):
            if d.device_type == 0:          # host memory: no allocator cache, no capacity
                continue
            if (d.fragmentation_pct or 0) >= t["fragmentation_pct"] and \
                    (d.fragmentation_mb or 0) >= t["fragmentation_min_mb"]:
                frag[s.rank] = d
            used = d.peak_reserved_pct_of_capacity or d.peak_allocated_pct_of_capacity
            if used is not None and used >= t["memory_pressure_medium_pct"]:
                pressure[s.rank] = (used, d)
    if frag:
        worst = max(frag.values(), key=lambda d: d.fragmentation_mb)
        yield Finding(
            id="memory_fragmentation", severity="medium", ranks=sorted(frag), steps=job.steps(),
            summary=(f"at peak, {worst.fragmentation_mb:.0f} MB ({worst.fragmentation_pct:.0f}%) of reserved "
                     f"GPU memory is cached but not allocated (fragmentation)"),
            evidence={r: {"device": d.device, "peak_reserved_mb": rounded(d.peak_reserved_mb, 1),
                          "peak_allocated_mb": rounded(d.peak_allocated_mb, 1),
                          "fragmentation_mb": rounded(d.fragmentation_mb, 1)} for r, d in frag.items()},
            explanation=("The caching allocator keeps freed blocks reserved; with varying tensor sizes they split "
                         "into pieces too small to reuse, so reserved memory grows far past what is allocated."),
            fix=("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; keep shapes static (pad or bucket sequence "
                 "lengths); avoid torch.cuda.empty_cache() in the loop"),
            threshold={k: t[k] for k in ("fragmentation_pct", "fragmentation_min_mb")}, cost_ms_per_step=None)
    if pressure:
        top = max(v[0] for v in pressure.values())
        yield Finding(
            id="memory_pressure",
            severity="high" if top >= t["memory_pressure_high_pct"] else "medium", ranks=sorted(pressure),
            steps=job.steps(),
            summary=f"peak GPU memory reaches {top:.0f}% of device capacity",
            evidence={r: {"device": d.device, "peak_pct_of_capacity": rounded(u, 1),
                          "capacity_mb": rounded(d.capacity_mb, 0)} for r, (u, d) in pressure.items()},
            explanation=("Close to capacity the allocator retries (synchronizing cudaFree) and the next larger batch "
                         "or sequence runs out of memory."),
            fix=("activation checkpointing (torch.utils.checkpoint), shard parameters/gradients/optimizer states "
                 "(FSDP / ZeRO), bf16 autocast, a smaller micro-batch with gradient accumulation"),
            threshold={k: t[k] for k in ("memory_pressure_medium_pct", "memory_pressure_high_pct")},
            cost_ms_per_step=None)


def _bus_bandwidth(job: _Job, devices: list[str], hosts: list[str]) -> Iterable[Finding]:
    t = job.t
    if not job.cross or len(hosts) > 1 or not devices:
        return                       # across hosts the ceiling is the network, which traces do not name
    peak = devices_link_peak_gbps(devices)
    if peak is None:
        return
    slow = []
    for row in job.cross["collectives"]["by_type"]:
        busbw, count = row.get("busbw_mean_gbps"), row.get("count") or 0
        if busbw is None or not count or (row.get("group_size") or 0) < 2:
            continue
        if row.get("total_bytes", 0) / count >= t["busbw_min_bytes"] and 100.0 * busbw / peak < t["busbw_low_pct_of_peak"]:
            slow.append(row)
    if slow:
        yield Finding(
            id="low_bus_bandwidth", severity="medium", ranks=sorted(s.rank for s in job.ranks), steps=job.steps(),
            summary="; ".join(f"{r['type']} reaches {r['busbw_mean_gbps']:.1f} GB/s bus bandwidth, "
                              f"{100 * r['busbw_mean_gbps'] / peak:.0f}% of the {peak:.0f} GB/s link peak" for r in slow),
            evidence={"link_peak_gbps": peak, "device": devices[0],
                      "collectives": [{k: r.get(k) for k in ("type", "group_size", "count", "total_bytes",
                                                              "busbw_mean_gbps")} for r in slow]},
            explanation=("Bus bandwidth (nccl-tests definition) normalizes a collective's speed to the link; far "
                         "below the link peak for large messages means a slow transport or too few channels."),
            fix=("run with NCCL_DEBUG=INFO and check the transport per peer (P2P/NVLink expected, not SHM or NET) "
                 "and the channel count; nvidia-smi topo -m; rankscope nccl LOG compares against a healthy run"),
            threshold={k: t[k] for k in ("busbw_low_pct_of_peak", "busbw_min_bytes")}, cost_ms_per_step=None)


def _load_imbalance(job: _Job) -> Iterable[Finding]:
    if not job.cross:
        return
    lb = job.cross.get("load_balance") or {}
    verdict = lb.get("verdict")
    if verdict not in ("all_ranks_idle", "rotating_lateness"):
        return
    all_idle = verdict == "all_ranks_idle"
    yield Finding(
        id="load_imbalance", severity="medium" if all_idle else "low", ranks=sorted(s.rank for s in job.ranks),
        steps=[s["step"] for s in lb.get("steps", [])], summary=lb.get("summary", verdict),
        evidence={"verdict": verdict, "common_idle_pct": rounded(lb.get("common_idle_pct"), 1),
                  "wait_spread_pct": rounded(lb.get("wait_spread_pct"), 1)},
        explanation=("All ranks idle at the same moments: the whole job waits on something shared (input pipeline, "
                     "host-bound forward, checkpointing)." if all_idle else
                     "Ranks wait for each other, but a different rank is late each time: work per rank varies "
                     "from step to step."),
        fix=("look at what every rank does while the device idles (dataloader / host findings above): faster input "
             "pipeline, torch.compile for a host-bound forward" if all_idle else
             "even out work per rank: drop_last=True, equal batch sizes, bucket samples by sequence length, "
             "balance pipeline stages / MoE experts"),
        threshold={"all_idle_pct": job.cross.get("thresholds", {}).get("all_idle_pct")},
        cost_ms_per_step=None)


# ---------------------------------------------------------------------------------------------
def evaluate(analysis: "Analysis", thresholds: dict[str, float] | None = None) -> list[Finding]:
    """All findings of a job, ordered by severity then cost per step. `thresholds`: the values in
    force (`resolve_thresholds`), by default the defaults."""
    t = thresholds or resolve_thresholds()
    ranks = [s for s in analysis.ranks if s.steps]
    cross = to_plain(analysis.cross.as_dict()) if analysis.cross is not None else None
    job = _Job(ranks=ranks, cross=cross, t=t,
               step_ms={s.rank: sum(s.breakdown_mean_ms.values()) for s in ranks},
               wait_ms={r["rank"]: r.get("own_wait_ms_per_step") or 0.0 for r in (cross or {}).get("ranks", [])})
    found: list[Finding] = []
    for rule in (_straggler, _dataloader, _comm, _host_bound, _launch_overhead, _sync, _memcpy, _memory,
                 _load_imbalance):
        found.extend(rule(job))
    found.extend(_tensor_cores(job, analysis.job.devices))
    found.extend(_bus_bandwidth(job, analysis.job.devices, analysis.job.hosts))
    return ordered(found)


def ordered(findings: list[Finding]) -> list[Finding]:
    """Most urgent first: by severity, then by what the finding costs per step."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), -(f.cost_ms_per_step or 0.0)))


# ---------------------------------------------------------------------------------------------
# NCCL debug logs (`rankscope nccl LOG...`, `analyze --nccl-log LOG`): the comparisons of
# analyses/inputs/nccl.py (each log one run) -> `low_bus_bandwidth` and `degraded_nccl_link`.


def nccl_findings(report: NcclReport, thresholds: dict[str, float] | None = None) -> list[Finding]:
    """Findings of NCCL logs compared as runs (analyses/inputs/nccl.py), ordered by severity;
    `thresholds` as in `evaluate`."""
    t = thresholds or resolve_thresholds()
    found = [f for run in report.runs for f in (_nccl_busbw(report, run, t), _nccl_degraded(report, run, t)) if f]
    return ordered(found)


def _log_name(file: str) -> str:
    from pathlib import PurePath
    return PurePath(file).name


def _nccl_channels_and_transports(run: NcclRun) -> dict[str, Any]:
    return {"channels": {c.comm_id: c.coll_channels for c in run.comms},
            "transport": {f"{p.src}->{p.dst}": f"{p.via} ({p.channels} channels)" for p in run.peers},
            "nccl_env": run.log.env}


def _nccl_busbw(report: NcclReport, run: NcclRun, t: dict[str, float]) -> Finding | None:
    vs_best = next((c for c in report.of("busbw") if c.file == run.file), None)
    peak = devices_link_peak_gbps(run.devices)
    of_peak = (100.0 * run.peak_busbw_gbps / peak if peak and run.peak_busbw_gbps is not None and len(run.hosts) <= 1
               else None)
    low_vs_best = vs_best is not None and vs_best.pct < t["nccl_busbw_pct_of_best"]
    low_vs_peak = of_peak is not None and of_peak < t["busbw_low_pct_of_peak"]
    if not (low_vs_best or low_vs_peak):
        return None
    best = next((r for r in report.runs if r.file == report.best_run), None)
    parts = []
    if low_vs_best:
        parts.append(f"{vs_best.pct:.0f}% of {_log_name(best.file)} ({vs_best.reference:.1f} GB/s) at the same sizes")
    if low_vs_peak:
        parts.append(f"best row {run.peak_busbw_gbps:.1f} GB/s = {of_peak:.0f}% of the {peak:.0f} GB/s link peak")
    return Finding(
        id="low_bus_bandwidth", severity="high" if low_vs_best and vs_best.pct < 50.0 else "medium",
        ranks=vs_best.ranks if vs_best else [], steps=[],
        summary=f"{_log_name(run.file)}: bus bandwidth {run.avg_busbw_gbps:.1f} GB/s, " + "; ".join(parts),
        evidence={"file": run.file, "busbw_gbps": rounded(run.avg_busbw_gbps, 2),
                  "peak_busbw_gbps": rounded(run.peak_busbw_gbps, 2),
                  "best_run": report.best_run, "best_busbw_gbps": rounded(best.avg_busbw_gbps, 2) if best else None,
                  "pct_of_best": rounded(vs_best.pct, 1) if vs_best else None,
                  "device": run.devices[0] if run.devices else None,
                  "link_peak_gbps": peak, "pct_of_link_peak": rounded(of_peak, 1),
                  **_nccl_channels_and_transports(run),
                  "best_run_channels": _nccl_channels_and_transports(best)["channels"] if best else None},
        explanation=("Bus bandwidth (nccl-tests) normalizes a collective's speed to the links; a run far below "
                     "another on the same machines, or far below the link peak, has lost links, channels or "
                     "its transport."),
        fix=("compare the transports and channel counts of the two logs (`rankscope nccl HEALTHY.log SLOW.log`); "
             "check `nvidia-smi nvlink --status` / `nvidia-smi topo -m` for down NVLinks, a NCCL_TOPO_FILE or "
             "NCCL_P2P_DISABLE / NCCL_MAX_NCHANNELS left in the environment"),
        threshold={k: t[k] for k in ("nccl_busbw_pct_of_best", "busbw_low_pct_of_peak")})


def _nccl_degraded(report: NcclReport, run: NcclRun, t: dict[str, float]) -> Finding | None:
    limit = t["nccl_degraded_pct_of_peers"]
    mine = [c for c in report.comparisons if c.file == run.file]
    issues = ([c for c in mine if c.kind in ("channels", "link") and c.pct < limit]
              + [c for c in mine if c.kind == "transport" and c.value < c.reference])
    if not issues:
        return None
    texts = []
    for c in issues:
        if c.kind == "channels":
            texts.append(f"{c.subject} has {c.value:.0f} collective channels, {c.pct:.0f}% of the "
                         f"{c.reference:.0f} in {_log_name(c.reference_from)}")
        elif c.kind == "link":
            where = ("its reverse direction" if c.reference_from == "this run"
                     else f"the same pair in {_log_name(c.reference_from)}")
            texts.append(f"NCCL sees {c.subject} ({c.detail['type']}) at {c.value:g} GB/s, {c.pct:.0f}% of "
                         f"the {c.reference:g} GB/s of {where}")
        else:
            texts.append(f"{c.subject} ({c.detail['kind']}) where peers in {_log_name(c.reference_from)} use "
                         f"{c.detail['best_kind']}")
    ranks = sorted({r for c in issues for r in c.ranks})
    comm_ranks = sorted({r for comm in run.log.comms.values() for r in comm.ranks})
    return Finding(
        id="degraded_nccl_link", severity="high" if min(c.pct for c in issues) < 50.0 else "medium",
        ranks=ranks or comm_ranks, steps=[],
        summary=f"{_log_name(run.file)}: " + "; ".join(texts),
        evidence={"file": run.file, **_nccl_channels_and_transports(run),
                  "issues": [{"kind": c.kind, "subject": c.subject, "value": rounded(c.value, 2),
                              "reference": rounded(c.reference, 2), "reference_from": c.reference_from,
                              "pct": rounded(c.pct, 1), **c.detail} for c in issues]},
        explanation=("NCCL sizes its channels to the link bandwidth it detects: a link it sees slower (a down "
                     "NVLink, a PCIe fallback) or a slower transport (SHM or the network instead of P2P) than its "
                     "peers caps every collective that crosses it."),
        fix=("`nvidia-smi nvlink --status` and `nvidia-smi topo -m` on that host (reseat / replace the bridge, "
             "reset the GPU); unset NCCL_TOPO_FILE, NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, NCCL_MIN/MAX_NCHANNELS "
             "unless meant; check ACS / IOMMU settings that block P2P"),
        threshold={"nccl_degraded_pct_of_peers": limit})
