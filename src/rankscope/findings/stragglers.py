"""Findings of the cross-rank verdicts (analyses/job/stragglers.py): a straggler, load imbalance."""
from __future__ import annotations

from typing import Iterable

from rankscope.findings.registry import NOT_RETIMED, SEVERITY_BANDS, JobView, rule, saving
from rankscope.numbers import rounded
from rankscope.results import Finding

#: What to check on a straggler, by its cause.
STRAGGLER_FIXES = {
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
    "pipeline_stage": "its pipeline stage holds more work than the others: move layers from it to its lighter "
                      "neighbour (see pipeline_stage_imbalance for how much)",
    "unknown": "the delay lies outside the profiled ops: profile more steps, and check thermal throttling "
               "(nvidia-smi -q -d PERFORMANCE), uneven shards (drop_last=True) and host load on that rank",
}


@rule("straggler_rank", reads=("straggler_high_cost_pct",))
def straggler_rank(job: JobView) -> Iterable[Finding]:
    """Each straggler the cross-rank analysis names (its verdict: the `straggler_*` thresholds), with
    its cause, what it costs the other ranks per step, and what fixing it saves (the what-if of its
    cause at the median rank's level), whose share of the median step sets the severity; a cause
    the model cannot re-time (unknown, communication): high when the cost is >=
    `straggler_high_cost_pct` of the median step."""
    if job.cross is None:
        return
    t = job.thresholds
    for st in job.cross.stragglers:
        if st.cause == "pipeline_stage":       # pipeline_stage_imbalance names it, with how much to move
            continue
        cost = st.cost_ms_per_step
        cost_pct = job.pct_of_step(cost)
        sv = saving(job, f"rank:{st.rank}:{st.cause}")
        severity = sv.severity if sv else "high" if cost_pct >= t["straggler_high_cost_pct"] else "medium"
        yield Finding(
            id="straggler_rank", severity=severity, ranks=[st.rank], steps=list(st.steps),
            summary=(f"rank {st.rank} is a straggler ({st.cause}): the other ranks lose "
                     f"{cost:.2f} ms per step ({cost_pct:.1f}% of the median step) waiting for it"
                     + (f"; {sv.text()}" if sv else f"; {NOT_RETIMED.format(what=f'a {st.cause} cause')}")),
            evidence={"cause": st.cause, "cost_ms_per_step": rounded(cost, 3),
                      "cost_pct_of_step": rounded(cost_pct, 2), "last_arrival_pct": rounded(st.last_arrival_pct, 1),
                      "step_time_z": rounded(st.step_time_z, 2),
                      "wait_imposed_ms_per_step": rounded(st.wait_imposed_ms_per_step, 3),
                      "excess_ms_per_step": {k: rounded(v, 3) for k, v in st.excess_ms_per_step.items()},
                      "detail": st.evidence, **(sv.evidence() if sv else {})},
            explanation=("Every collective finishes only when its last member arrives, so one late rank makes "
                         "all others wait. This rank arrives last at most collectives; the cause is what it did "
                         "before arriving, compared with the median rank."),
            fix=STRAGGLER_FIXES.get(st.cause, STRAGGLER_FIXES["unknown"]),
            threshold={k: t[k] for k in ("straggler_high_cost_pct", *SEVERITY_BANDS)},
            cost_ms_per_step=sv.ms if sv else cost)


@rule("load_imbalance", reads=("load_all_idle_pct", "load_wait_imbalance_pct"))
def load_imbalance(job: JobView) -> Iterable[Finding]:
    """The load-balance verdict of the cross-rank analysis when it blames no single rank: every rank
    idle at once (`load_all_idle_pct` of a step: medium) or lateness that moves between ranks (wait
    spread `load_wait_imbalance_pct`: low). The analysis decides; the finding shows its bar."""
    if job.cross is None or job.pipeline is not None:   # a pipeline's waits: the pipeline findings
        return
    lb = job.cross.load_balance
    if lb.verdict not in ("all_ranks_idle", "rotating_lateness"):
        return
    all_idle = lb.verdict == "all_ranks_idle"
    yield Finding(
        id="load_imbalance", severity="medium" if all_idle else "low", ranks=sorted(s.rank for s in job.ranks),
        steps=[s.step for s in lb.steps], summary=lb.summary,
        evidence={"verdict": lb.verdict, "common_idle_pct": rounded(lb.common_idle_pct, 1),
                  "wait_spread_pct": rounded(lb.wait_spread_pct, 1)},
        explanation=("All ranks idle at the same moments: the whole job waits on something shared (input pipeline, "
                     "host-bound forward, checkpointing)." if all_idle else
                     "Ranks wait for each other, but a different rank is late each time: work per rank varies "
                     "from step to step."),
        fix=("look at what every rank does while the device idles (dataloader / host findings above): faster input "
             "pipeline, torch.compile for a host-bound forward" if all_idle else
             "even out work per rank: drop_last=True, equal batch sizes, bucket samples by sequence length, "
             "balance pipeline stages / MoE experts"),
        threshold={k: job.thresholds[k] for k in ("load_all_idle_pct", "load_wait_imbalance_pct")},
        cost_ms_per_step=None)
