"""Stragglers, step-time variance and load balance across ranks (docs/concepts.md "Straggler"):
per rank its step-time and collective figures (`RankStats`), the stragglers found with their cause
and cost, the load-balance verdict. Made by analyses/job/stragglers.py (which documents every figure).
"""
from __future__ import annotations

from typing import Literal

import msgspec

#: Why a rank is late (docs/concepts.md "Straggler"): the stable vocabulary.
StragglerCause = Literal["dataloader", "host_idle", "cpu_ops", "gpu_compute", "memcpy", "communication",
                         "pipeline_stage", "unknown"]
LoadVerdict = Literal["one_rank_late", "all_ranks_idle", "rotating_lateness", "balanced", "n/a"]

#: What the verdict compares: the cost of a rank (`cost_ms_per_step`), as every output names it.
COST_DEFINITION = ("cost = how much shorter the other ranks' steps would be if it ran like the median rank "
                   "(their waits for it on their critical path, concurrent waits counted once)")


class RankStats(msgspec.Struct):
    """One rank's step-time and collective figures (ms, percent)."""
    rank: int
    steps: int
    step_time_mean_ms: float | None
    step_time_std_ms: float | None
    step_time_cv: float | None
    step_time_z: float | None
    step_time_pct_over_mean: float | None
    slowest_step_share: float | None       # share of (common) steps where it is the slowest rank
    step_time_outlier: bool                # the outlier rule: z > 2 or > 10 % over the mean
    collectives: int
    last_arrivals: int
    last_arrival_pct: float | None
    lateness_share_pct: float | None       # its share of the summed last-arrival leads of all collectives
    wait_imposed_ms_per_step: float        # median over the other ranks of their wait for it
    own_wait_ms_per_step: float            # its own waits, concurrent waits counted once
    # the what-if, evaluated for candidate ranks only (last most often, or above the last-share bar); None otherwise
    lateness_ms_per_step: float | None     # L
    blocking_lateness_ms_per_step: float | None   # I: its lateness on the others' critical path
    work_excess_ms_per_step: float | None  # A
    others_wait_excess_ms_per_step: float | None  # B
    cost_ms_per_step: float | None         # min(A, B, I) per step, averaged over steps with collectives
    excess_ms_per_step: dict[str, float]   # cause group -> ms per step (vs the median other rank)
    cause: StragglerCause | None
    step_start_lag_ms_per_step: float | None = None   # how much later than the others it started those steps
    straggler: bool = False
    found_in_round: int = 1               # 2+: found once the stragglers of earlier rounds were taken out


class Straggler(msgspec.Struct):
    """A rank whose lateness makes the others wait: its cause, its cost (ms per step the others lose
    waiting for it), the evidence."""
    rank: int
    cause: StragglerCause
    cost_ms_per_step: float
    last_arrival_pct: float | None
    step_time_z: float | None
    step_time_pct_over_mean: float | None
    wait_imposed_ms_per_step: float
    excess_ms_per_step: dict[str, float]
    steps: list[int]                       # steps in which it arrived last
    evidence: str


class LoadBalanceStep(msgspec.Struct):
    """One step common to two ranks or more: common_idle_pct (min over ranks of device-idle / step),
    wait_spread_pct ((median - min over ranks of exposed communication) / median step) and
    least_waiting_rank (the rank the others wait for, when one is late)."""
    step: int
    common_idle_pct: float
    wait_spread_pct: float
    least_waiting_rank: int


class LoadBalance(msgspec.Struct):
    """All ranks idle at once vs one rank late: the means over the common steps and the verdict."""
    steps: list[LoadBalanceStep]
    common_idle_pct: float | None          # mean over steps
    wait_spread_pct: float | None          # mean over steps
    verdict: LoadVerdict
    summary: str


class StragglerThresholds(msgspec.Struct):
    """The values that decided the straggler and load-balance verdicts: the step-time outlier flags,
    the last-arrival share a straggler needs (0-1), the cost bar (`min_cost_ms_per_step`: the larger
    of `min_cost_ms` and `min_cost_pct_of_step` of the median step), the cause's share, the
    load-balance bars."""
    step_z_flag: float
    step_pct_flag: float
    last_share_min: float
    min_cost_pct_of_step: float
    min_cost_ms: float
    min_cost_ms_per_step: float
    cause_min_share: float
    all_idle_pct: float
    wait_imbalance_pct: float


class StragglerReport(msgspec.Struct):
    """The straggler search's result: the stragglers, the one-line verdict ("no straggler: ..." or
    "rank 2 is a straggler ..."), every rank's figures, the load balance, the job's median step (every
    "% of step" is of it), the thresholds in force."""
    stragglers: list[Straggler]
    verdict: str
    ranks: list[RankStats]
    load_balance: LoadBalance
    median_step_ms: float | None
    thresholds: StragglerThresholds
