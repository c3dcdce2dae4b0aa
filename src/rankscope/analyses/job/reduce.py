"""The cross-rank reduce, in one place: the ranks' collectives (`RankCollectives`, or as a worker
packed them) -> `JobResult` (results/job.py), each part computed once, in the order each needs the
others:

  1. unnamed process groups to the dimensions their collectives show (regroup.py; in place, before
     anything reads the groups)
  2. clock alignment from matched collective ends (clock.py)
  3. collective matching on the aligned clocks (matching.py)
  4. the parallel layout, each rank's communication per dimension, the pipeline, the expert load
     (layout.py, pipeline.py, experts.py)
  5. stragglers, step-time statistics and load balance (stragglers.py; a straggler on an unbalanced
     pipeline's bottleneck stage gets cause `pipeline_stage` as it is made); the step-time spread
     across ranks (step_spread.py)
  6. the critical path and its what-ifs (critical_path.py; the stragglers' causes re-timed)
  7. alpha-beta fits and the collectives' summary by type and process group (alphabeta.py, matching.py)

A new cross-rank analysis adds one step here and one part to `JobResult`. What the other pipelines
need besides the report (the matched collectives, `CollectiveTable`: the Perfetto export's waits,
the diff's per-collective comparison) comes back beside it (`Reduced`).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from rankscope.analyses.job.alphabeta import fit_alpha_beta
from rankscope.analyses.job.clock import applied_offsets, estimate_clock_offsets, raw_clocks
from rankscope.analyses.job.critical_path import critical_path
from rankscope.analyses.job.experts import expert_load
from rankscope.analyses.job.layout import comm_by_dim, parallel_layout
from rankscope.analyses.job.matching import CollectiveTable, collectives_summary, match_collectives, member_frame
from rankscope.analyses.job.pipeline import pipeline_analysis
from rankscope.analyses.job.regroup import regroup_unnamed
from rankscope.analyses.job.step_spread import step_spread
from rankscope.analyses.job.stragglers import CAUSE_GROUPS, find_stragglers
from rankscope.results.collectives import Collectives
from rankscope.results.job import JobResult
from rankscope.thresholds import Thresholds, resolve


class Reduced(NamedTuple):
    """The cross-rank result and the matched collectives it was made of."""
    result: JobResult
    table: CollectiveTable


def reduce_job(ranks: Sequence[Collectives], thresholds: Thresholds | None = None,
               align_clocks: bool = True) -> Reduced:
    """The job's cross-rank result (module docstring); `thresholds`: the values in force (default
    `resolve()`); `align_clocks=False` keeps every rank's timestamps as recorded."""
    t = resolve(thresholds)
    ranks = sorted(ranks, key=lambda r: r.rank)
    regroup_unnamed(ranks)
    members = member_frame(ranks)                  # built once, shared by the clock and the matching
    clock = (estimate_clock_offsets(ranks, members) if align_clocks else
             raw_clocks([r.rank for r in ranks], "clock alignment off: raw timestamps"))
    table = match_collectives(ranks, applied_offsets(clock), members)
    del members                                    # the straggler rounds derive theirs from `table`
    layout = parallel_layout(ranks)
    comm = comm_by_dim(ranks)
    pipeline = pipeline_analysis(ranks, layout, comm)
    stragglers = find_stragglers(ranks, table, clock, thresholds=t, pipeline=pipeline)
    path = critical_path(ranks, table, pipeline, t, [(s.rank, s.cause) for s in stragglers.stragglers], CAUSE_GROUPS)
    return Reduced(JobResult(
        clock=clock, collectives=collectives_summary(table, fit_alpha_beta(table)),
        stragglers=stragglers.stragglers, straggler_verdict=stragglers.verdict,
        load_balance=stragglers.load_balance, rank_stats=stragglers.ranks,
        straggler_thresholds=stragglers.thresholds, median_step_ms=stragglers.median_step_ms,
        step_spread=step_spread(ranks, stragglers.median_step_ms),
        layout=layout, comm_by_dim=comm, pipeline=pipeline, experts=expert_load(ranks, layout),
        critical_path=path), table)
