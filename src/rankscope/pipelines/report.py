"""A job analysed (`JobAnalysis`: what the other pipelines read: the per-rank summaries, the cross-rank
result and the matched collectives) and its report (`to_report`: the typed `Analysis` that every
output draws, built once from it).

The report shows each rank's figures as the JSON has them (ms to 3 decimals, % to 2, the overlap
efficiency to 4): the terminal, the HTML and a saved `--json` then show the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from rankscope.model import InputProblem
from rankscope.numbers import rounded
from rankscope.results.analysis import (NO_CROSS_RANK_VERDICT, Analysis, BreakdownMs, InputNote, Inputs, JobInfo,
                                        RankDataLoader, RankMemcpy, RankMemory, RankReport, StepRow, StepTime,
                                        TemporalPct)
from rankscope.results.collectives import CollectivesSummary
from rankscope.results.layout import Layout
from rankscope.results.rank import BREAKDOWN_CATEGORIES

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.analyses.job.matching import CollectiveTable
    from rankscope.results.findings import Finding
    from rankscope.results.hang import HangReport
    from rankscope.results.job import JobResult
    from rankscope.results.jobs import FoundJob
    from rankscope.results.layout import DimComm
    from rankscope.results.rank import RankSummary
    from rankscope.results.run import Run


@dataclass
class JobAnalysis:
    """A job's analysis as the pipelines hand it on: the job, its per-rank summaries (sorted by rank,
    their collectives handed to the reduce), the cross-rank result and the collectives it matched
    (None without collectives), the input problems, the engine, the findings (ordered), the Flight
    Recorder verdict, the jobs the inputs hold when several, and the run when the files hold several
    profiler cycles."""
    job: JobInfo
    summaries: list[RankSummary]
    cross: JobResult | None = None
    table: CollectiveTable | None = None
    problems: list[InputProblem] = field(default_factory=list)
    engine: str = "inprocess"
    findings: list[Finding] = field(default_factory=list)
    hang: HangReport | None = None
    jobs: list[FoundJob] = field(default_factory=list)
    run: Run | None = None

    @property
    def usable(self) -> bool:
        return bool(self.summaries) or self.hang is not None

    @property
    def skipped(self) -> list[InputProblem]:
        return [p for p in self.problems if p.fatal]


def to_report(a: JobAnalysis) -> Analysis:
    """The report of a job's analysis."""
    c = a.cross
    comm = {x.rank: x.by_dim for x in c.comm_by_dim} if c is not None else {}
    ranks = [_rank(s, comm.get(s.rank)) for s in a.summaries]
    steps = [StepRow(rank=s.rank, step=st.step, duration_ms=round(st.duration_ms, 3),
                     gpu_busy_ms=round(st.device_busy_ms, 3) if s.has_device else None,
                     breakdown_ms=_rounded(st.breakdown_ms))
             for s in a.summaries for st in s.steps]
    inputs = Inputs(skipped=[InputNote(p.file, p.problem) for p in a.problems if p.fatal],
                    warnings=[InputNote(p.file, p.problem) for p in a.problems if not p.fatal])
    return Analysis(
        job=a.job, inputs=inputs, ranks=ranks, steps=steps,
        collectives=c.collectives if c else CollectivesSummary(), stragglers=c.stragglers if c else [],
        straggler_verdict=c.straggler_verdict if c else NO_CROSS_RANK_VERDICT,
        load_balance=c.load_balance if c else None, clock=c.clock if c else None,
        rank_stats=c.rank_stats if c else [],
        straggler_thresholds=c.straggler_thresholds if c else msgspec.UNSET,
        parallelism=c.layout if c else Layout(), pipeline=c.pipeline if c else None,
        experts=c.experts if c else None, critical_path=c.critical_path if c else None,
        median_step_ms=c.median_step_ms if c else None, step_spread=c.step_spread if c else None,
        hang=a.hang, findings=a.findings, run=a.run,
        engine=a.engine, jobs=a.jobs if a.jobs else msgspec.UNSET)


def _rounded(parts: dict[str, float]) -> BreakdownMs:
    """A step breakdown as the outputs show it: ms to 3 decimals."""
    return BreakdownMs(**{k: round(parts[k], 3) for k in BREAKDOWN_CATEGORIES})


def _rank(s: RankSummary, comm: dict[str, DimComm] | None) -> RankReport:
    st, hta, m = s.step_time, s.hta, s.memcpy
    d = s.dataloader
    return RankReport(
        rank=s.rank, file=s.meta.file, rank_source=s.meta.rank_source, format=s.meta.format,
        events=s.meta.events_total, device_events=s.device_events,
        step_time_ms=StepTime(rounded(st.mean_ms, 3), rounded(st.median_ms, 3), rounded(st.max_ms, 3)),
        gpu_busy_pct=rounded(st.device_busy_pct, 2), breakdown_ms=_rounded(s.breakdown_mean_ms) if s.steps else None,
        breakdown_mode="cpu_only" if s.breakdown_mode == "cpu_only" else "device", comm_by_dim_ms=comm,
        overlap_efficiency=rounded(s.overlap_efficiency, 4),
        temporal_pct=(TemporalPct(hta.temporal.compute_pct, hta.temporal.non_compute_pct, hta.temporal.idle_pct)
                      if hta else None),
        overlap_pct=hta.overlap.overlap_pct if hta else None,
        idle_ms=hta.idle.idle_ms if hta else None, idle_ms_summed_over_streams=hta.idle.idle_ms if hta else None,
        idle_streams=len(hta.idle.streams) if hta else None,
        hta=hta, kernels=s.kernels, operators=s.operators, idle_gaps=s.gaps,
        dataloader=(RankDataLoader(d.share_pct, d.mean_step_share_pct, d.max_step_share_pct, d.dataloader_ms,
                                   d.num_workers, d.multiprocessing, d.iterators) if d is not None else None),
        memory=RankMemory(s.memory.devices, s.memory.timeline) if s.memory else None,
        memcpy=(RankMemcpy(m.pageable, m.pageable_htod, m.pageable_dtoh, m.pinned, m.pinned_vs_pageable_bandwidth_ratio,
                           m.pageable_pct_of_host_copy_time) if m is not None else None),
        salvaged=s.meta.salvaged, from_cache=s.from_cache)
