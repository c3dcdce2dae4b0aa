"""Findings of a whole run (docs/runs.md): `slowdown_onset`, read from a `RunView` (the run's cycles and
changes, analyses/run/); `run_findings(run, thresholds)` runs it."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Iterable

from rankscope.findings.registry import ordered, rule, run as run_rules
from rankscope.numbers import rounded
from rankscope.results import Finding
from rankscope.results.run import Run
from rankscope.thresholds import Thresholds, resolve


@dataclass
class RunView:
    """What the run's rules read: the run and the thresholds in force."""
    run: Run
    thresholds: Thresholds


#: What to check when the step got slower from a step on, by the step breakdown category that moved.
SLOWDOWN_FIXES = {
    "dataloader": "the input pipeline got slower from that step: check what changed in the data it reads from "
                  "there (a slower storage tier or remote reads, larger samples, a shard with heavier "
                  "preprocessing) and give the DataLoader more workers (num_workers, persistent_workers=True, "
                  "prefetch_factor)",
    "idle_other": "the main thread started spending time outside any profiled op from that step: look for what "
                  "starts then (garbage collection as memory grows: gc.freeze() after setup; logging, metrics or "
                  "checkpoint I/O; a sleep or barrier); py-spy dump --pid on that rank shows it",
    "host": "the CPU work around the model grew from that step: check CPU contention on that host (other "
            "processes, CPU affinity, OMP_NUM_THREADS) and per-step Python work that grows with the run",
    "compute": "the same steps' compute got slower: check for thermal or power throttling (nvidia-smi -q -d "
               "PERFORMANCE), a change of input shapes (longer sequences, a larger batch) or a slower kernel "
               "path (a different dtype, a fallback after an out-of-memory retry)",
    "comm_exposed": "communication that nothing hides grew from that step: check the network path (NCCL_DEBUG=INFO: "
                    "transport and NIC per peer, link errors) and whether another job shares the links",
    "comm_overlapped": "communication under compute grew from that step: check the network path (NCCL_DEBUG=INFO) "
                       "and whether another job shares the links",
    "memcpy": "copies between host and device got slower from that step: check pinned memory (pin_memory=True) "
              "and the PCIe link (nvidia-smi topo -m, other traffic on it)",
    "sync": "the host waits for the device longer from that step: look for a new synchronisation (.item(), "
            "printing a tensor, torch.cuda.synchronize) in the training loop",
}
_UNKNOWN_FIX = ("compare a profiled step before and after it (rankscope diff on the two cycles' files) to see "
                "which ops and kernels grew")


@rule("slowdown_onset", reads=("slowdown_onset_high_pct",), view=RunView)
def slowdown_onset(view: RunView) -> Iterable[Finding]:
    """Each slowdown the run's change detection found (analyses/run/changes.py: the run_change_*
    thresholds decide it): a rank, or the job, slower from a step on; high when the step grew by
    `slowdown_onset_high_pct` % or more."""
    t = view.thresholds
    for c in view.run.changes:
        if c.kind != "slowdown" or c.before_ms is None or c.after_ms is None:
            continue
        grew = c.after_ms - c.before_ms
        pct = 100.0 * grew / c.before_ms if c.before_ms > 0 else 0.0
        who = f"rank {c.rank}" if c.rank is not None else "the job"
        where = f"from step {c.first_step} (cycle {c.first_cycle})"
        yield Finding(
            id="slowdown_onset", severity="high" if pct >= t["slowdown_onset_high_pct"] else "medium",
            ranks=list(c.ranks), steps=[c.first_step],
            summary=(f"{who} got slower {where}: median step {c.before_ms:.2f} -> {c.after_ms:.2f} ms "
                     f"(+{pct:.0f}%), mostly {c.cause}"),
            evidence={"rank": c.rank, "first_step": c.first_step, "first_cycle": c.first_cycle,
                      "before_ms": c.before_ms, "after_ms": c.after_ms, "grew_pct": rounded(pct, 1),
                      "cause": c.cause, "z": c.z, "noise_ms": c.noise_ms, "z_critical": view.run.z_critical},
            explanation=("The step time moved from that step on by more than the run's own step-to-step noise "
                         "allows (z is the move over that noise), and stayed there; the cause is the part of "
                         "the step (docs/concepts.md, Step breakdown) that grew most on the ranks whose own "
                         "work changed. The cost is the growth of the median step."),
            fix=SLOWDOWN_FIXES.get(c.cause or "", _UNKNOWN_FIX),
            threshold={"slowdown_onset_high_pct": t["slowdown_onset_high_pct"]},
            cost_ms_per_step=grew)


def run_findings(run: Run, thresholds: Mapping[str, float] | None = None) -> list[Finding]:
    """The run's findings, ordered by severity then cost per step."""
    return ordered(run_rules(RunView(run, resolve(thresholds))))
