"""Communication findings from the traces: exposed communication, low overlap, comm-bound, low bus
bandwidth. Waits at a collective for a late rank are left out of communication time: the
straggler / load-imbalance findings name their cause."""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Iterable

from rankscope.results.rank import RankSummary
from rankscope.findings.registry import NOT_RETIMED, JobView, rule, saving, tier
from rankscope.hardware import devices_link_peak_gbps
from rankscope.numbers import rounded
from rankscope.results import Finding


@dataclass
class _Comm:
    """The communication figures of the ranks that communicate (ms per step, % of step, medians over
    those ranks)."""
    ranks: list[RankSummary]
    exposed_ms: dict[int, float]           # exposed communication less the waits for late ranks
    exposed_pct: dict[int, float]          # of the job's median step
    median_pct: float
    median_ms: float
    gradient_collectives: int
    after_backward: int
    after_backward_pct: float | None
    overlap_pct: float | None              # HTA comm-comp overlap, median rank

    @classmethod
    def of(cls, job: JobView) -> _Comm | None:
        ranks = [s for s in job.ranks if job.part(s, "comm_exposed") + job.part(s, "comm_overlapped") > 0]
        if not ranks:
            return None
        # pipeline waits (the pp dimension's exposed communication) are the pipeline findings' to explain
        waits = {s.rank: job.wait_ms.get(s.rank, 0.0) + job.pipeline_wait_ms.get(s.rank, 0.0) for s in ranks}
        exposed = {s.rank: max(0.0, job.part(s, "comm_exposed") - waits[s.rank]) for s in ranks}
        exposed_pct = {s.rank: job.pct_of_step(exposed[s.rank]) for s in ranks}
        sched = [s.grad_sync for s in ranks if s.grad_sync]
        launched = sum(g.collectives for g in sched)
        after = sum(g.launched_after_backward for g in sched)
        hta_overlap = [s.hta.overlap.overlap_pct for s in ranks if s.hta and s.hta.overlap.overlap_pct is not None]
        return cls(ranks=ranks, exposed_ms=exposed, exposed_pct=exposed_pct, median_pct=median(exposed_pct.values()),
                   median_ms=median(exposed.values()), gradient_collectives=launched, after_backward=after,
                   after_backward_pct=100.0 * after / launched if launched else None,
                   overlap_pct=median(hta_overlap) if hta_overlap else None)


@rule("exposed_communication", reads=("exposed_comm_low_pct", "exposed_comm_medium_pct", "exposed_comm_high_pct"))
def exposed_communication(job: JobView) -> Iterable[Finding]:
    """Communication that no computation hides, as a share of the job's median step (median rank),
    raised from `exposed_comm_low_pct`; severity from what overlapping it saves (the what-if), else
    tiered low / medium / high by `exposed_comm_low_pct` / `exposed_comm_medium_pct` /
    `exposed_comm_high_pct`."""
    c = _Comm.of(job)
    if c is None:
        return
    t = job.thresholds
    severity = tier(c.median_pct, t, "exposed_comm_low_pct", "exposed_comm_medium_pct", "exposed_comm_high_pct")
    if severity is None:
        return
    waits_note = ("; waits for late ranks left out (the straggler / load imbalance findings explain them)"
                  if any(job.wait_ms.get(s.rank, 0.0) > 0 for s in c.ranks) else "")
    sv = saving(job, *_overlap_keys(job))
    yield Finding(
        id="exposed_communication", severity=sv.severity if sv else severity,
        ranks=sorted(r for r, v in c.exposed_pct.items() if v >= t["exposed_comm_low_pct"]), steps=job.steps(),
        summary=f"communication that no computation hides takes {c.median_pct:.1f}% of the median step "
                f"(median rank, {c.median_ms:.1f} ms{waits_note})" + (f"; {sv.text()}" if sv else ""),
        evidence={"exposed_comm_pct_of_step": {r: rounded(v, 1) for r, v in sorted(c.exposed_pct.items())},
                  "exposed_comm_ms_per_step": {r: rounded(v, 3) for r, v in sorted(c.exposed_ms.items())},
                  "wait_for_late_ranks_ms_per_step": {r: rounded(job.wait_ms.get(r, 0.0), 3)
                                                      for r in sorted(c.exposed_ms)},
                  "gradient_collectives_after_backward_pct": rounded(c.after_backward_pct, 1),
                  "comm_comp_overlap_pct": rounded(c.overlap_pct, 1), **(sv.evidence() if sv else {})},
        explanation=("While a collective runs with no compute beside it, the step only waits for the network. "
                     "Either it starts too late to overlap (after backward), or there is more of it than "
                     "compute to hide it behind."),
        fix=("overlap it: let DDP/FSDP launch bucketed collectives during backward (no manual all_reduce after "
             "backward); smaller bucket_cap_mb so the first buckets start earlier; then shrink it: gradients in "
             "bf16 (DDP comm hook bf16_compress_hook), gradient accumulation (no_sync()) or a larger batch per "
             "rank so each byte moved buys more compute"),
        threshold=dict(t), cost_ms_per_step=sv.ms if sv else c.median_ms)


def _overlap_keys(job: JobView) -> list[str]:
    """The what-ifs of the job's communication overlapped: all of it, else its one dimension."""
    dims = [d.name for d in job.cross.layout.dims if d.name != "pp"] if job.cross else []
    return ["overlap:*"] + [f"overlap:{d}" for d in dims]


@rule("low_overlap", reads=("after_backward_pct", "low_overlap_pct", "exposed_comm_low_pct", "comm_significant_pct"))
def low_overlap(job: JobView) -> Iterable[Finding]:
    """Gradient collectives that cannot overlap backward: >= `after_backward_pct` of them launched
    after it ended (severity by the exposed share: `exposed_comm_low_pct` medium,
    `comm_significant_pct` high, else low), or HTA's comm-comp overlap < `low_overlap_pct` with
    exposed communication >= `comm_significant_pct` of the step (medium)."""
    c = _Comm.of(job)
    if c is None:
        return
    t = job.thresholds
    if c.after_backward_pct is not None and c.after_backward_pct >= t["after_backward_pct"]:
        # the schedule itself is the evidence; what it costs now sets the severity
        severity = tier(c.median_pct, t, None, "exposed_comm_low_pct", "comm_significant_pct") or "low"
        summary = (f"{c.after_backward} of {c.gradient_collectives} gradient collectives are launched after backward "
                   f"has ended ({c.after_backward_pct:.0f}%): they cannot overlap with it, and expose "
                   f"{c.median_pct:.1f}% of the step")
    elif c.overlap_pct is not None and c.overlap_pct < t["low_overlap_pct"] and \
            c.median_pct >= t["comm_significant_pct"]:
        severity = "medium"
        summary = (f"only {c.overlap_pct:.1f}% of communication time overlaps with compute (median rank); "
                   f"{c.median_pct:.1f}% of the step is exposed communication")
    else:
        return
    sv = saving(job, *_overlap_keys(job))
    yield Finding(
        id="low_overlap", severity=sv.severity if sv else severity, ranks=sorted(c.exposed_pct), steps=job.steps(),
        summary=summary + (f"; {sv.text()}" if sv else ""),
        evidence={"gradient_collectives": c.gradient_collectives, "launched_after_backward": c.after_backward,
                  "after_backward_pct": rounded(c.after_backward_pct, 1),
                  "comm_comp_overlap_pct": rounded(c.overlap_pct, 1),
                  "exposed_comm_pct_of_step": rounded(c.median_pct, 1), **(sv.evidence() if sv else {})},
        explanation=("DDP hides gradient all-reduce behind backward by launching each bucket as soon as its "
                     "gradients are ready. Collectives launched after backward, or a single large bucket, "
                     "leave the device idle while the network works (PyTorch DDP design notes: overlap "
                     "computation with communication)."),
        fix=("use DDP/FSDP's bucketed overlap instead of all-reducing gradients after backward; lower "
             "bucket_cap_mb (e.g. 25 -> 5-10) so buckets start earlier; remove find_unused_parameters=True "
             "(it delays every bucket to the end of backward) or set static_graph=True"),
        threshold=dict(t), cost_ms_per_step=sv.ms if sv else c.median_ms)


@rule("comm_bound", reads=("comm_bound_ratio",))
def comm_bound(job: JobView) -> Iterable[Finding]:
    """More communication than compute per step (medians over the ranks that communicate, waits for
    late ranks excluded): communication > `comm_bound_ratio` x compute."""
    c = _Comm.of(job)
    if c is None:
        return
    t = job.thresholds
    comm_ms = median(c.exposed_ms[s.rank] + job.part(s, "comm_overlapped") for s in c.ranks)
    compute_ms = median(job.part(s, "compute") + job.part(s, "comm_overlapped") for s in c.ranks)
    if not (compute_ms >= 0 and comm_ms > t["comm_bound_ratio"] * compute_ms):
        return
    ratio = comm_ms / compute_ms if compute_ms > 0 else None
    yield Finding(
        id="comm_bound", severity="medium", ranks=sorted(c.exposed_ms), steps=job.steps(),
        summary=(f"communication-bound: {comm_ms:.1f} ms of communication per step against {compute_ms:.1f} ms "
                 f"of compute" + (f" ({ratio:.1f}x)" if ratio else "")),
        evidence={"comm_ms_per_step": rounded(comm_ms, 3), "compute_ms_per_step": rounded(compute_ms, 3),
                  "comm_to_compute_ratio": rounded(ratio, 2), "classification": "comm-bound",
                  "what_if": NOT_RETIMED.format(what="fewer bytes or a larger batch")},
        explanation=("With more communication than compute per step, no overlap can hide it all: the job scales "
                     "with the network, not the GPUs (docs/concepts.md, Bottleneck: comm > 1.2x compute)."),
        fix=("move fewer bytes per unit of compute: larger batch per rank or gradient accumulation, bf16 "
             "gradient compression, hybrid sharding (FSDP HYBRID_SHARD) to keep traffic inside a node, fewer "
             "ranks for this model size"),
        threshold=dict(t), cost_ms_per_step=None)


@rule("low_bus_bandwidth", reads=("busbw_low_pct_of_peak", "busbw_min_bytes"))
def low_bus_bandwidth(job: JobView) -> Iterable[Finding]:
    """On one host, collective types whose mean bus bandwidth (nccl-tests definition) is <
    `busbw_low_pct_of_peak` of the device's link peak, for calls of >= `busbw_min_bytes` (smaller
    ones are latency bound). Across hosts the ceiling is the network, which traces do not name."""
    if job.cross is None or len(job.hosts) > 1 or not job.devices:
        return
    peak = devices_link_peak_gbps(job.devices)
    if peak is None:
        return
    t = job.thresholds
    slow = []
    for row in job.cross.collectives.by_type:
        busbw, count = row.busbw_mean_gbps, row.count
        if busbw is None or not count or not isinstance(row.group_size, int) or row.group_size < 2:
            continue
        if row.total_bytes / count >= t["busbw_min_bytes"] and 100.0 * busbw / peak < t["busbw_low_pct_of_peak"]:
            slow.append((row, busbw))
    if not slow:
        return
    yield Finding(
        id="low_bus_bandwidth", severity="medium", ranks=sorted(s.rank for s in job.ranks), steps=job.steps(),
        summary="; ".join(f"{r.type} reaches {busbw:.1f} GB/s bus bandwidth, "
                          f"{100 * busbw / peak:.0f}% of the {peak:.0f} GB/s link peak" for r, busbw in slow),
        evidence={"link_peak_gbps": peak, "device": job.devices[0],
                  "collectives": [{"type": r.type, "group_size": r.group_size, "count": r.count,
                                   "total_bytes": r.total_bytes, "busbw_mean_gbps": busbw} for r, busbw in slow]},
        explanation=("Bus bandwidth (nccl-tests definition) normalizes a collective's speed to the link; far "
                     "below the link peak for large messages means a slow transport or too few channels."),
        fix=("run with NCCL_DEBUG=INFO and check the transport per peer (P2P/NVLink expected, not SHM or NET) "
             "and the channel count; nvidia-smi topo -m; rankscope nccl LOG compares against a healthy run"),
        threshold=dict(t), cost_ms_per_step=None)
