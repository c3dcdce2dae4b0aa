"""What a run keeps of one analysed profiler cycle (`CycleFacts`), and the run view built from the
cycles kept (`run_view`): rows per cycle, the step-time trend, the changes (changes.py).

A cycle is analysed as a job of its own (the per-rank map and the cross-rank reduce); the run keeps
only these facts of it, so the driver's memory grows with cycles x ranks x steps numbers, not with
summaries or events.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING

from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.results.run import CycleStraggler, Run, RunCycle, TrendPoint

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results import Analysis
    from rankscope.thresholds import Thresholds


@dataclass(frozen=True)
class RankStep:
    rank: int
    step: int
    step_ms: float
    breakdown_ms: tuple[float, ...]         # CATEGORIES order


@dataclass(frozen=True)
class CycleFacts:
    """One cycle's facts: `order` sorts cycles (its first step, then its first timestamp)."""
    order: tuple[int, int]
    files: tuple[str, ...]
    ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    steps: tuple[int, ...]
    rank_steps: tuple[RankStep, ...]
    straggler: CycleStraggler | None
    findings: tuple[str, ...]
    finding_costs: tuple[tuple[str, float | None], ...]   # (id, cost ms per step) of each finding


def cycle_facts(a: Analysis) -> CycleFacts:
    """The facts a run keeps of one cycle's analysis."""
    rank_steps = tuple(RankStep(s.rank, st.step, st.duration_ms, tuple(st.breakdown_ms[c] for c in CATEGORIES))
                       for s in a.ranks for st in s.steps)
    starts = [st.start_ns for s in a.ranks for st in s.steps] or [s.meta.span_ns[0] for s in a.ranks
                                                                     if s.meta.span_ns] or [0]
    found = a.cross.stragglers.stragglers if a.cross is not None else []
    worst = max(found, key=lambda st: st.cost_ms_per_step, default=None)
    return CycleFacts(
        order=(min(a.job.steps, default=0), min(starts)),
        files=tuple(s.meta.file for s in a.ranks), ranks=tuple(a.job.ranks),
        missing_ranks=tuple(a.job.missing_ranks), steps=tuple(a.job.steps), rank_steps=rank_steps,
        straggler=CycleStraggler(worst.rank, worst.cause, round(worst.cost_ms_per_step, 3)) if worst else None,
        findings=tuple(dict.fromkeys(f.id for f in a.findings)),
        finding_costs=tuple((f.id, f.cost_ms_per_step) for f in a.findings))


def run_view(cycles: list[CycleFacts], thresholds: Thresholds) -> Run:
    """The run of these cycles (any order; numbered 1.. in step order): a row per cycle, the trend,
    the changes judged against `thresholds`. The last cycle is the one the report details."""
    from rankscope.analyses.run.changes import find_changes
    ordered = sorted(cycles, key=lambda c: c.order)
    rows, trend = [], []
    for number, c in enumerate(ordered, start=1):
        by_rank: dict[int, list[float]] = {}
        for p in c.rank_steps:
            by_rank.setdefault(p.rank, []).append(p.step_ms)
            trend.append(TrendPoint(p.rank, p.step, number, round(p.step_ms, 3), [round(v, 3) for v in p.breakdown_ms]))
        all_ms = [p.step_ms for p in c.rank_steps]
        rows.append(RunCycle(
            cycle=number, files=list(c.files), ranks=list(c.ranks),
            rank_step_ms=[round(median(by_rank[r]), 3) if r in by_rank else None for r in c.ranks],
            missing_ranks=list(c.missing_ranks),
            steps=list(c.steps), step_ms_median=round(median(all_ms), 3) if all_ms else None,
            step_ms_max=round(max(median(v) for v in by_rank.values()), 3) if by_rank else None,
            straggler=c.straggler, findings=list(c.findings)))
    found = find_changes(trend, rows, [dict(c.finding_costs) for c in ordered], thresholds)
    return Run(cycles=rows, trend=trend, changes=found.changes, detailed_cycle=len(rows),
               noise_pct=found.noise_pct, cycle_noise_pct=found.cycle_noise_pct, z_critical=round(found.z_critical, 2))
