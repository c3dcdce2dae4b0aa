"""The report of `analyze`: one typed object whose JSON encoding is `rankscope.analysis/1`
(docs/json-schema.md) and from which the terminal and the HTML report are drawn, so that a saved
`--json` re-renders both (`Analysis.load`, `rankscope report`).

Its parts, in the JSON's order: the job (`JobInfo`, with its capture quality), the input problems
(`Inputs`), one row per rank (`RankReport`: the per-rank summary's figures as the outputs show
them, with the rank's communication per parallel dimension from the cross-rank result), one row
per rank and step (`StepRow`), the cross-rank result's parts (collectives, stragglers, load
balance, clock, per-rank statistics, layout, pipeline, experts, critical path, the median step),
the Flight Recorder verdict (results/hang.py), the findings, the run (results/run.py), and
(additions) the engine that mapped the ranks and the jobs the inputs hold when they hold several.
Built once, by pipelines/report.py; pure data.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from rankscope.model import InputProblem
from rankscope.results.capture import Capture
from rankscope.results.clock import ClockAlignment
from rankscope.results.collectives import CollectivesSummary
from rankscope.results.critical_path import CriticalPath
from rankscope.results.experts import ExpertLoad
from rankscope.results.findings import Finding
from rankscope.results.hang import HangReport
from rankscope.results.jobs import FoundJob
from rankscope.results.layout import DimComm, Layout
from rankscope.results.pipeline import Pipeline
from rankscope.results.rank import (CopySummary, DeviceMemory, GapSummary, HtaParity, MemorySamples, OperatorStats,
                                    RankKernels)
from rankscope.results.run import Run
from rankscope.results.step_spread import StepSpread
from rankscope.results.stragglers import LoadBalance, RankStats, Straggler, StragglerThresholds

SCHEMA: Literal["rankscope.analysis/1"] = "rankscope.analysis/1"
#: The straggler verdict of a job without a cross-rank result.
NO_CROSS_RANK_VERDICT = "no collectives in the trace: nothing to compare across ranks"


class JobInfo(msgspec.Struct, kw_only=True):
    """The job: world size, ranks read, backend, profiled steps and where they come from
    ("profiler_step" | "whole_trace" | "mixed" | "none"), devices, hosts, the time span (ms), the
    ranks missing, the warnings, the capture quality (None: not assessed)."""
    world_size: int | None
    ranks: list[int]
    backend: str | None
    steps: list[int]
    steps_source: Literal["profiler_step", "whole_trace", "mixed", "none"]
    devices: list[str]
    hosts: list[str]
    span_ms: float | None
    missing_ranks: list[int]
    warnings: list[str]
    capture: Capture | None = None


class InputNote(msgspec.Struct):
    """A file and what was wrong with it (one line)."""
    file: str
    problem: str


class Inputs(msgspec.Struct):
    """The files skipped, and those read with a warning (salvaged, ignored, the cache)."""
    skipped: list[InputNote] = []
    warnings: list[InputNote] = []


class BreakdownMs(msgspec.Struct):
    """Where a step's time went (docs/concepts.md "Step breakdown"), ms: each instant in one category,
    by priority; the parts sum to the step."""
    compute: float
    comm_overlapped: float
    comm_exposed: float
    memcpy: float
    dataloader: float
    sync: float
    host: float
    idle_other: float


class StepTime(msgspec.Struct):
    """A rank's step time over its profiled steps, ms."""
    mean: float | None
    median: float | None
    max: float | None


class TemporalPct(msgspec.Struct):
    """HTA's temporal breakdown, % of the span from the first to the last device activity."""
    compute: float | None
    non_compute: float | None
    idle: float | None


class RankDataLoader(msgspec.Struct):
    """The rank's DataLoader time: share of its steps (%), mean and worst step share, ms in all, the
    workers (0: in the training process; None: unknown), the iterator classes seen."""
    share_pct: float | None
    mean_step_share_pct: float | None
    max_step_share_pct: float | None
    dataloader_ms: float
    num_workers: int | None
    multiprocessing: bool | None
    iterators: list[str]


class RankMemory(msgspec.Struct):
    """The allocator per device (peaks, fragmentation, capacity) and its timeline (at most 200 samples
    per device, both peaks kept)."""
    devices: list[DeviceMemory]
    timeline: MemorySamples


class RankMemcpy(msgspec.Struct):
    """Host <-> device copies from pageable and pinned host memory."""
    pageable: CopySummary
    pageable_htod: CopySummary
    pageable_dtoh: CopySummary
    pinned: CopySummary
    pinned_vs_pageable_bandwidth_ratio: float | None
    pageable_pct_of_host_copy_time: float | None


class RankReport(msgspec.Struct, kw_only=True):
    """One rank as the outputs show it (docs/json-schema.md "ranks"): rounded like the JSON (ms to 3
    decimals, % to 2, overlap efficiency to 4), so that every output shows the same figures."""
    rank: int
    file: str
    rank_source: str
    format: str
    events: int
    device_events: int
    step_time_ms: StepTime
    gpu_busy_pct: float | None
    breakdown_ms: BreakdownMs | None      # mean per step
    breakdown_mode: Literal["device", "cpu_only"]
    comm_by_dim_ms: dict[str, DimComm] | None
    overlap_efficiency: float | None
    temporal_pct: TemporalPct | None
    overlap_pct: float | None
    idle_ms: dict[str, float] | None
    idle_ms_summed_over_streams: dict[str, float] | None
    idle_streams: int | None
    hta: HtaParity | None
    kernels: RankKernels | None
    operators: OperatorStats | None
    idle_gaps: GapSummary | None
    dataloader: RankDataLoader | None
    memory: RankMemory | None
    memcpy: RankMemcpy | None
    salvaged: bool
    from_cache: bool


class StepRow(msgspec.Struct):
    """One step of one rank: its duration, device-busy time (None without device activity), breakdown."""
    rank: int
    step: int
    duration_ms: float
    gpu_busy_ms: float | None
    breakdown_ms: BreakdownMs


class Analysis(msgspec.Struct, kw_only=True):
    """What `rankscope analyze` found: the job, the input problems, each rank and each of its steps, the
    collectives matched across ranks, the stragglers, load balance and clock alignment, the parallel
    layout, pipeline and expert load, the critical path, the Flight Recorder verdict, the findings, the
    run of profiler cycles; and where the per-rank work ran and the jobs the inputs hold."""
    schema: Literal["rankscope.analysis/1"] = SCHEMA
    job: JobInfo
    inputs: Inputs = msgspec.field(default_factory=Inputs)
    ranks: list[RankReport] = []                   # sorted by rank
    steps: list[StepRow] = []
    collectives: CollectivesSummary = msgspec.field(default_factory=CollectivesSummary)
    stragglers: list[Straggler] = []
    straggler_verdict: str = NO_CROSS_RANK_VERDICT
    load_balance: LoadBalance | None = None
    clock: ClockAlignment | None = None
    rank_stats: list[RankStats] = []
    straggler_thresholds: StragglerThresholds | msgspec.UnsetType = msgspec.UNSET
    parallelism: Layout = msgspec.field(default_factory=Layout)
    pipeline: Pipeline | None = None
    experts: ExpertLoad | None = None
    critical_path: CriticalPath | None = None
    median_step_ms: float | None = None
    hang: HangReport | None = None                 # the Flight Recorder dumps' verdict (None: no dump read)
    findings: list[Finding] = []                   # ordered: severity, then cost per step
    run: Run | None = None                         # every profiler cycle, when the files hold several
    engine: str = "inprocess"                      # addition: where the per-rank work ran
    step_spread: StepSpread | None = None          # addition: the step-time spread across ranks
    jobs: list[FoundJob] | msgspec.UnsetType = msgspec.UNSET   # addition: the jobs the inputs hold, when several

    @property
    def problems(self) -> list[InputProblem]:
        """The input problems: the files skipped, then those read with a warning."""
        return ([InputProblem(p.file, p.problem) for p in self.inputs.skipped]
                + [InputProblem(p.file, p.problem, fatal=False) for p in self.inputs.warnings])

    @property
    def skipped(self) -> list[InputProblem]:
        return [InputProblem(p.file, p.problem) for p in self.inputs.skipped]

    @property
    def usable(self) -> bool:
        return bool(self.ranks) or self.hang is not None

    @classmethod
    def load(cls, path: str | Path) -> Analysis:
        """A report saved with `analyze --json` (msgspec.DecodeError / ValidationError when the file
        is no such report)."""
        return msgspec.json.decode(Path(path).read_bytes(), type=cls)
