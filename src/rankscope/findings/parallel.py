"""Parallel-layout findings: pipeline stage imbalance and bubble, exposed FSDP / ZeRO-3 parameter
gathers, exposed tensor-parallel communication, expert-parallel load imbalance
(analyses/job/parallel.py)."""
from __future__ import annotations

from dataclasses import dataclass
from statistics import mean, median
from typing import Iterable

from rankscope.findings.registry import NOT_RETIMED, JobView, rule, saving, tier
from rankscope.numbers import ranges, rounded
from rankscope.results import Finding


@rule("pipeline_stage_imbalance", reads=("pipeline_stage_imbalance_pct", "pipeline_stage_imbalance_high_pct"))
def pipeline_stage_imbalance(job: JobView) -> Iterable[Finding]:
    """The bottleneck stage computes >= `pipeline_stage_imbalance_pct` more per step than the
    stages' mean: every other stage waits for it. Severity from what balancing saves (the what-if
    `pp:balanced`), else high from `pipeline_stage_imbalance_high_pct`."""
    p = job.pipeline
    if p is None or p.bottleneck_stage is None or len(p.stages) < 2:
        return
    t = job.thresholds
    severity = tier(p.imbalance_pct_over_mean, t, "pipeline_stage_imbalance_pct", None,
                    "pipeline_stage_imbalance_high_pct")
    if severity is None:
        return
    sv = saving(job, "pp:balanced")
    by_stage = {st.stage: st for st in p.stages}
    slow = by_stage[p.bottleneck_stage]
    avg = mean(st.compute_ms_per_step for st in p.stages)
    move_ms = slow.compute_ms_per_step - avg
    neighbours = [by_stage[s] for s in (slow.stage - 1, slow.stage + 1) if s in by_stage]
    target = min(neighbours, key=lambda st: st.compute_ms_per_step)
    share = 100.0 * move_ms / slow.compute_ms_per_step if slow.compute_ms_per_step > 0 else 0.0
    yield Finding(
        id="pipeline_stage_imbalance", severity=sv.severity if sv else severity, ranks=slow.ranks, steps=job.steps(),
        summary=(f"pipeline stage {slow.stage} (rank{'s' if len(slow.ranks) > 1 else ''} {ranges(slow.ranks)}) "
                 f"computes {slow.compute_ms_per_step:.1f} ms per step, {p.imbalance_pct_over_mean:.0f}% more than "
                 f"the stages' mean ({avg:.1f} ms): every other stage waits for it"
                 + (f"; balancing the stages would shorten the step by {sv.ms:,.1f} ms ({sv.pct:.1f}% of the "
                    f"median step; what-if)" if sv else "")),
        evidence={"compute_ms_per_step_by_stage": {st.stage: st.compute_ms_per_step for st in p.stages},
                  "bubble_pct_by_stage": {st.stage: st.bubble_pct for st in p.stages},
                  "bottleneck_stage": slow.stage, "imbalance_pct_over_mean": p.imbalance_pct_over_mean,
                  "schedule": p.schedule, "microbatches": p.microbatches, **(sv.evidence() if sv else {})},
        explanation=("A pipeline runs at the pace of its slowest stage: each microbatch waits for it, and the "
                     "lighter stages sit idle in the difference (compute per stage: compute running, alone or "
                     "beside communication, per step)."),
        fix=(f"move about {share:.0f}% of stage {slow.stage}'s work (~{move_ms:.1f} ms of compute per step, e.g. "
             f"that share of its layers) to stage {target.stage} ({target.compute_ms_per_step:.1f} ms per step); "
             f"in torch.distributed.pipelining split the model at other layer boundaries (pipeline(split_spec=...)), "
             f"in Megatron set the layers per stage (--decoder-first/last-pipeline-num-layers) or put the "
             f"embedding / loss layers on lighter stages; an interleaved schedule (virtual stages) also evens out "
             f"the load per rank"),
        threshold=dict(t), cost_ms_per_step=sv.ms if sv else None)


@rule("pipeline_bubble", reads=("pipeline_bubble_excess_pct", "pipeline_bubble_high_excess_pct",
                                "pipeline_bubble_large_pct", "pipeline_stage_imbalance_pct"))
def pipeline_bubble(job: JobView) -> Iterable[Finding]:
    """The stages wait on their neighbours (pp exposed communication) >= `pipeline_bubble_excess_pct`
    percentage points of the step more than the schedule's theory (p-1)/(m+p-1) (high from
    `pipeline_bubble_high_excess_pct`), or >= `pipeline_bubble_large_pct` of the step even at theory
    (more microbatches or an interleaved schedule shrink the theory itself). Severity from the best
    of those two what-ifs where re-timed. Not raised when the stages are unbalanced (>=
    `pipeline_stage_imbalance_pct`): then the slow stage causes the bubble."""
    p = job.pipeline
    if p is None or p.bubble_pct_theory is None or not p.stages:
        return
    t = job.thresholds
    if p.imbalance_pct_over_mean >= t["pipeline_stage_imbalance_pct"]:
        return
    excess = p.bubble_pct - p.bubble_pct_theory
    severity = tier(excess, t, "pipeline_bubble_excess_pct", None, "pipeline_bubble_high_excess_pct")
    if severity is None and p.bubble_pct >= t["pipeline_bubble_large_pct"]:
        severity = "low"
    if severity is None:
        return
    n_stages = len(p.stages)
    m = p.microbatches or 0
    options = [sv for sv in (saving(job, f"pp:microbatches:{2 * m}"), saving(job, "pp:interleaved:2")) if sv]
    sv = max(options, key=lambda x: x.ms) if options else None
    schedule_text = "; ".join(f"{x.change}: saves {x.ms:,.1f} ms per step" for x in options)
    yield Finding(
        id="pipeline_bubble", severity=sv.severity if sv else severity,
        ranks=sorted(r for st in p.stages for r in st.ranks), steps=job.steps(),
        summary=(f"the pipeline's stages wait on their neighbours {p.bubble_pct:.1f}% of each step (mean stage), "
                 + (f"{excess:.1f} points over" if excess >= t["pipeline_bubble_excess_pct"] else "against")
                 + f" the {p.bubble_pct_theory:.1f}% a {p.schedule} schedule of {n_stages} equal stages and {m} "
                   f"microbatches leaves" + (f"; {sv.text()}" if sv and sv.ms >= 0.05 else
                                             "; re-timed, neither more microbatches nor an interleaved schedule "
                                             "shortens this step: the host time each microbatch adds outweighs the "
                                             "smaller bubble" if sv else "")),
        evidence={"bubble_pct": p.bubble_pct, "bubble_pct_theory": p.bubble_pct_theory,
                  "bubble_pct_by_stage": {st.stage: st.bubble_pct for st in p.stages},
                  "bubble_ms_per_step_by_stage": {st.stage: st.bubble_ms_per_step for st in p.stages},
                  "schedule": p.schedule, "microbatches": m, "stages": n_stages,
                  **({"schedule_what_ifs": schedule_text} if options else {}), **(sv.evidence() if sv else {})},
        explanation=("The bubble is the time a stage has no microbatch to work on: at the start and end of each "
                     "step, and whenever a neighbour sends late. With p stages and m microbatches a 1F1B or GPipe "
                     "schedule idles (p-1)/(m+p-1) of the step; more than that means slow transfers between stages "
                     "or uneven microbatches. Bubble: time waiting in pipeline send/recv with nothing to compute."),
        fix=(f"raise the microbatch count (m >= 4 x stages: {4 * n_stages} here) so the fixed fill/drain is a "
             f"smaller share; use an interleaved schedule (ScheduleInterleaved1F1B, Megatron "
             f"--num-layers-per-virtual-pipeline-stage) or a zero-bubble one (ScheduleInterleavedZeroBubble / "
             f"ScheduleZBVZeroBubble); keep pipeline neighbours on fast links"
             + (f" (re-timed: {schedule_text})" if options else "")),
        threshold=dict(t), cost_ms_per_step=sv.ms if sv else None)


@dataclass
class _Exposed:
    """One dimension's communication with no compute beside it, per rank: ms per step and % of the step."""
    dim: str
    ms: dict[int, float]
    pct: dict[int, float]

    @property
    def median_pct(self) -> float:
        return median(self.pct.values())

    @property
    def median_ms(self) -> float:
        return median(self.ms.values())

    def evidence(self, what: str) -> dict[str, dict[int, float | None]]:
        return {f"exposed_{what}_ms_per_step": {r: rounded(v, 3) for r, v in sorted(self.ms.items())},
                f"exposed_{what}_pct_of_step": {r: rounded(v, 1) for r, v in sorted(self.pct.items())}}


def _exposed(job: JobView, dims: tuple[str, ...], types: tuple[str, ...] | None) -> _Exposed | None:
    """The first of `dims` the job has, over collectives of `types` (None: all); None when the job has
    none of them or nothing of theirs is exposed."""
    par = job.cross
    dim = next((d for d in dims if par is not None and any(x.name == d for x in par.layout.dims)), None)
    if par is None or dim is None:
        return None
    ms, pct = {}, {}
    for c in par.comm_by_dim:
        if c.step_ms <= 0 or c.rank not in job.step_ms:
            continue
        if types is None:
            v = c.by_dim.get(dim)
            ms[c.rank] = v.exposed if v else 0.0
        else:
            ms[c.rank] = sum(x.exposed for tp, x in c.by_dim_type.get(dim, {}).items() if tp in types)
        pct[c.rank] = job.pct_of_step(ms[c.rank])
    return _Exposed(dim, ms, pct) if any(ms.values()) else None


@rule("fsdp_exposed_gather", reads=("fsdp_exposed_gather_pct", "fsdp_exposed_gather_high_pct"))
def fsdp_exposed_gather(job: JobView) -> Iterable[Finding]:
    """Sharded data parallel (FSDP / ZeRO-3): parameter all-gathers that no compute hides take >=
    `fsdp_exposed_gather_pct` of the step (median rank; high from `fsdp_exposed_gather_high_pct`)."""
    gathers = _exposed(job, ("dp_shard", "dp"), ("all_gather",))
    if gathers is None:
        return
    scatters = _exposed(job, (gathers.dim,), ("reduce_scatter",))
    t = job.thresholds
    severity = tier(gathers.median_pct, t, "fsdp_exposed_gather_pct", None, "fsdp_exposed_gather_high_pct")
    if severity is None:
        return
    sv = saving(job, f"overlap:{gathers.dim}:all_gather", f"overlap:{gathers.dim}")
    yield Finding(
        id="fsdp_exposed_gather", severity=sv.severity if sv else severity,
        ranks=sorted(r for r, v in gathers.pct.items() if v >= t["fsdp_exposed_gather_pct"]), steps=job.steps(),
        summary=(f"parameter all-gathers of the sharded data-parallel dimension ({gathers.dim}) run with no compute "
                 f"beside them {gathers.median_pct:.1f}% of the median step (median rank, {gathers.median_ms:.1f} "
                 f"ms); gradient reduce-scatters add {scatters.median_pct if scatters else 0.0:.1f}%"
                 + (f"; {sv.text()}" if sv else "")),
        evidence={**gathers.evidence("all_gather"), **(scatters.evidence("reduce_scatter") if scatters else {}),
                  "dim": gathers.dim, **(sv.evidence() if sv else {})},
        explanation=("FSDP gathers each layer's parameters before using it; prefetching the next layer's gather "
                     "while the current one computes hides it. Exposed gathers mean prefetch is off or too "
                     "shallow, or a layer's compute is shorter than its gather."),
        fix=("prefetch: FSDP2 module.set_modules_to_forward_prefetch / set_modules_to_backward_prefetch (FSDP1: "
             "forward_prefetch=True, backward_prefetch=BACKWARD_PRE); reshard_after_forward=False on the last "
             "blocks (no re-gather in backward) or for small models; wrap at the block level, not per linear, so "
             "each gather has enough compute to hide behind; across nodes, HSDP (shard inside a node, replicate "
             "across) keeps the gathers on NVLink"),
        threshold=dict(t), cost_ms_per_step=sv.ms if sv else rounded(gathers.median_ms, 3))


@rule("tp_comm_exposed", reads=("tp_comm_exposed_pct", "tp_comm_exposed_high_pct"))
def tp_comm_exposed(job: JobView) -> Iterable[Finding]:
    """Tensor-parallel communication with no compute beside it >= `tp_comm_exposed_pct` of the step
    (median rank; high from `tp_comm_exposed_high_pct`)."""
    tp = _exposed(job, ("tp",), None)
    if tp is None:
        return
    t = job.thresholds
    severity = tier(tp.median_pct, t, "tp_comm_exposed_pct", None, "tp_comm_exposed_high_pct")
    if severity is None:
        return
    size = next(d.size for d in job.cross.layout.dims if d.name == "tp") if job.cross else 0
    sv = saving(job, "overlap:tp")
    yield Finding(
        id="tp_comm_exposed", severity=sv.severity if sv else severity,
        ranks=sorted(r for r, v in tp.pct.items() if v >= t["tp_comm_exposed_pct"]), steps=job.steps(),
        summary=(f"tensor-parallel communication (tp {size}) runs with no compute beside it {tp.median_pct:.1f}% of "
                 f"the median step (median rank, {tp.median_ms:.1f} ms)" + (f"; {sv.text()}" if sv else "")),
        evidence={**tp.evidence("tp"), "tp_size": size, **(sv.evidence() if sv else {})},
        explanation=("Tensor parallelism all-reduces (or all-gathers / reduce-scatters) activations inside every "
                     "layer, on the critical path of forward and backward: it needs the fastest links and "
                     "overlaps only with special scheduling."),
        fix=("keep each tp group inside one node (NVLink); turn on async tensor parallel / sequence parallel "
             "(torch._inductor.config._micro_pipeline_tp = True with torch.compile, Megatron "
             "--tp-comm-overlap --sequence-parallel) so the collectives overlap the GEMMs; or a smaller tp degree "
             "with more data or pipeline parallel"),
        threshold=dict(t), cost_ms_per_step=sv.ms if sv else rounded(tp.median_ms, 3))


@rule("expert_imbalance", reads=("expert_imbalance_pct", "expert_imbalance_high_pct"))
def expert_imbalance(job: JobView) -> Iterable[Finding]:
    """The most-loaded rank of an expert-parallel group receives >= `expert_imbalance_pct` more
    all_to_all bytes per step than the group's mean (high from `expert_imbalance_high_pct`)."""
    e = job.cross.experts if job.cross else None
    if e is None:
        return
    worst = max(e.groups, key=lambda g: g.imbalance_pct_over_mean, default=None)
    if worst is None:
        return
    t = job.thresholds
    severity = tier(worst.imbalance_pct_over_mean, t, "expert_imbalance_pct", None, "expert_imbalance_high_pct")
    if severity is None:
        return
    group_mean = mean(worst.received_mb_per_step.values())
    yield Finding(
        id="expert_imbalance", severity=severity, ranks=[worst.hottest_rank], steps=job.steps(),
        summary=(f"rank {worst.hottest_rank} receives {worst.received_mb_per_step[worst.hottest_rank]:.2f} MB of "
                 f"tokens per step in the expert-parallel all_to_all, {worst.imbalance_pct_over_mean:.0f}% more "
                 f"than its "
                 f"group's mean ({group_mean:.2f} MB): its experts are the hot ones and the others wait for them"),
        evidence={"received_mb_per_step": {r: v for r, v in worst.received_mb_per_step.items()},
                  "group": worst.ranks, "imbalance_pct_over_mean": worst.imbalance_pct_over_mean,
                  "all_to_all_per_step": e.all_to_all_per_step,
                  "what_if": NOT_RETIMED.format(what="tokens moved between experts")},
        explanation=("In expert parallelism the router sends each token to its experts with an all_to_all; a rank "
                     "whose experts get more tokens computes longer, and the combine all_to_all waits for it. "
                     "Received bytes per rank measure its experts' load."),
        fix=("balance the router: an auxiliary load-balancing loss (or a larger coefficient), an expert capacity "
             "factor that drops or reroutes overflow tokens, auxiliary-loss-free bias balancing (DeepSeek-V3); "
             "place hot experts on separate ranks or replicate them"),
        threshold=dict(t), cost_ms_per_step=None)
