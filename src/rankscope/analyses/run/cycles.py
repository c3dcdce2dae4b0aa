"""What a run keeps of one analysed profiler cycle (`CycleFacts`), and what the run shows of the cycles
kept (`run_rows`): a row per cycle, the step-time trend per rank and step.

A cycle is analysed as a job of its own (the per-rank map and the cross-rank reduce); the run keeps
only these facts of it, so the driver's memory grows with cycles x ranks x steps numbers, not with
summaries or events.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median

import msgspec

from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.results.run import CycleStraggler, RunCycle


class TrendPoint(msgspec.Struct, array_like=True):
    """One rank's step: its time and breakdown (ms, `CATEGORIES` order of the step breakdown)."""
    rank: int
    step: int
    cycle: int
    step_ms: float
    breakdown_ms: list[float]


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
    finding_costs: tuple[tuple[str, float | None], ...]   # (id, cost ms per step) of each finding

    @property
    def findings(self) -> tuple[str, ...]:
        """The cycle's finding ids, each once, in the findings' order."""
        return tuple(dict.fromkeys(fid for fid, _ in self.finding_costs))


def run_rows(cycles: list[CycleFacts]) -> tuple[list[RunCycle], list[TrendPoint]]:
    """The run's row per cycle and its trend, cycles numbered 1.. in step order (`cycles` in any order)."""
    rows, trend = [], []
    for number, c in enumerate(sorted(cycles, key=lambda c: c.order), start=1):
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
    return rows, trend
