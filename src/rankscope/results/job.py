"""The cross-rank result: what the reduce over the ranks' collectives makes of the job
(analyses/job/reduce.py), one part per analysis, each computed once: the clock alignment, the
matched collectives (by type, by process group, alpha-beta fits), the stragglers and load balance,
the parallel layout with each rank's communication per dimension, the pipeline, the expert load,
the critical path. It is the findings' input (with the per-rank summaries) and the report takes
its parts as they are."""
from __future__ import annotations

import msgspec

from rankscope.results.clock import ClockAlignment
from rankscope.results.collectives import CollectivesSummary
from rankscope.results.critical_path import CriticalPath
from rankscope.results.experts import ExpertLoad
from rankscope.results.layout import Layout, RankDimComm
from rankscope.results.pipeline import Pipeline
from rankscope.results.step_spread import StepSpread
from rankscope.results.stragglers import LoadBalance, RankStats, Straggler, StragglerThresholds


class JobResult(msgspec.Struct, kw_only=True):
    """`median_step_ms`: the job's median step (over every rank's steps): every "% of step" is of it."""
    clock: ClockAlignment
    collectives: CollectivesSummary
    stragglers: list[Straggler]
    straggler_verdict: str
    load_balance: LoadBalance
    rank_stats: list[RankStats]
    straggler_thresholds: StragglerThresholds
    median_step_ms: float | None
    step_spread: StepSpread | None
    layout: Layout
    comm_by_dim: list[RankDimComm]
    pipeline: Pipeline | None
    experts: ExpertLoad | None
    critical_path: CriticalPath | None
