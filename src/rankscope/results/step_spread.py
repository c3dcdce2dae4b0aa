"""Step-time spread across ranks (docs/concepts.md "Step-time spread"): per step common to two ranks
or more, the fastest and the slowest rank's step, and their mean difference. Made by
analyses/job/step_spread.py."""
from __future__ import annotations

import msgspec


class StepSpreadRow(msgspec.Struct):
    """One step: the shortest and the longest duration any rank took for it (ms), and that rank."""
    step: int
    fastest_ms: float
    slowest_ms: float
    slowest_rank: int


class StepSpread(msgspec.Struct):
    """`spread_ms`: the mean over the steps of slowest - fastest (ms); `spread_pct_of_median_step`: it
    as a share of the job's median step (None without one)."""
    steps: list[StepSpreadRow]
    spread_ms: float
    spread_pct_of_median_step: float | None
