"""The results that the pipelines hand to findings and renderers: typed, below both.

`Analysis` (what `analyze` returns), `JobInfo`, `Ingest` (what `validate` / `load` find),
`ExportResult`, `Finding`, and what `diff`, `nccl`, `memory`, `mfu` and `thresholds` show
(`DiffResult`, `NcclResult`, `MemoryResult`, `MfuResult`, `ThresholdList`). Every pipeline's result is
a `Result`: its input problems, and whether anything was usable. Renderers and findings import
these types from here, never the API.
`to_plain` is the one serialiser of results into plain JSON data.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import polars as pl

from rankscope.model import InputProblem, RankMeta
from rankscope.results.jobs import FoundJob

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.analyses.inputs.memory_snapshot import MemoryReport
    from rankscope.analyses.inputs.nccl import NcclReport
    from rankscope.analyses.job.capture import Capture
    from rankscope.analyses.job.diff import Diff
    from rankscope.analyses.job.mfu import MfuReport
    from rankscope.analyses.job.stragglers import CrossRank
    from rankscope.results.rank import RankSummary
    from rankscope.results.hang import HangReport
    from rankscope.results.run import Run


def to_plain(obj: Any) -> Any:
    """A result as plain JSON data: msgspec Structs and dataclasses become objects, polars frames
    {column: list}, numpy numbers and arrays Python numbers and lists; dict keys become strings."""
    return msgspec.to_builtins(obj, str_keys=True, enc_hook=_plain_part)


def _plain_part(obj: Any) -> Any:
    if isinstance(obj, pl.DataFrame):
        return obj.to_dict(as_series=False)
    if isinstance(obj, (np.generic, np.ndarray)):
        return obj.tolist()
    raise TypeError(f"no plain form for {type(obj).__name__}")


@dataclass
class Finding:
    id: str
    severity: str                       # high | medium | low
    ranks: list[int]
    steps: list[int]
    summary: str
    evidence: dict[str, Any]
    explanation: str
    fix: str
    threshold: dict[str, float]         # the thresholds this rule compared against
    cost_ms_per_step: float | None = None   # what it costs each step (ordering; None when not a time)

    def as_dict(self) -> dict:
        """Plain JSON data: rank-keyed evidence gets string keys, as JSON objects have."""
        return to_plain(self)


@dataclass
class JobInfo:
    world_size: int | None
    ranks: list[int]
    backend: str | None
    steps: list[int]
    devices: list[str]
    warnings: list[str]
    missing_ranks: list[int]
    steps_source: str                   # "profiler_step" | "whole_trace" | "mixed"
    span_ms: float | None
    hosts: list[str]
    capture: Capture | None = None      # capture quality: complete, or what the traces miss (None: not assessed)


class Result(ABC):
    """What every pipeline's result has: the input problems met, of which `skipped` cost a file (the
    others are warnings), and `usable`: whether anything was read to report on."""
    problems: list[InputProblem]

    @property
    @abstractmethod
    def usable(self) -> bool:
        """Something was read to report on."""

    @property
    def skipped(self) -> list[InputProblem]:
        return [p for p in self.problems if p.fatal]


@dataclass
class Analysis(Result):
    job: JobInfo
    ranks: list[RankSummary]                       # sorted by rank
    problems: list[InputProblem] = field(default_factory=list)   # files skipped or salvaged
    engine: str = "inprocess"
    cross: CrossRank | None = None                 # collectives, clock alignment, stragglers, alpha-beta
    findings: list[Finding] = field(default_factory=list)   # ordered: severity, then cost per step
    jobs: list[FoundJob] = field(default_factory=list)      # the jobs the inputs hold, when several (results/jobs.py)
    hang: HangReport | None = None                 # the Flight Recorder dumps' verdict (None: no dump read)
    run: Run | None = None                         # every profiler cycle, when the files hold several (results/run.py)

    @property
    def usable(self) -> bool:
        return bool(self.ranks) or self.hang is not None


@dataclass
class Ingest(Result):
    """What `load` / `validate` find: per kept file its metadata (rank assigned), the problems."""
    ranks: list[RankMeta]
    problems: list[InputProblem]
    warnings: list[str]
    engine: str

    @property
    def usable(self) -> bool:
        return bool(self.ranks)


@dataclass
class ExportResult(Result):
    out: str
    ranks: list[int]                       # ranks written
    events: int
    size_bytes: int
    problems: list[InputProblem] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return bool(self.ranks)


@dataclass
class DiffResult(Result):
    """What `diff` finds: the comparison of the two runs, or the run (as given) without a usable trace."""
    diff: Diff | None
    problems: list[InputProblem] = field(default_factory=list)
    empty_run: str | None = None

    @property
    def usable(self) -> bool:
        return self.diff is not None


@dataclass
class NcclResult(Result):
    """What `nccl` finds in NCCL_DEBUG=INFO logs: the runs compared (None when no log could be read),
    their findings, the problems (`skipped`: the unusable logs)."""
    report: NcclReport | None
    findings: list[Finding]
    problems: list[InputProblem] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return self.report is not None


@dataclass
class MemoryResult(Result):
    """What `memory` finds in CUDA memory snapshots: one report per snapshot read, their findings,
    the problems (`skipped`: the unusable snapshots)."""
    reports: list[MemoryReport]
    problems: list[InputProblem] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return bool(self.reports)


@dataclass
class MfuResult(Result):
    """What `mfu` finds: the job's MFU report (None when no trace was usable), the problems."""
    report: MfuReport | None
    problems: list[InputProblem] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return self.report is not None


@dataclass
class ThresholdList:
    """The thresholds by name (rankscope.thresholds.THRESHOLDS: value, unit, source, decides of each)."""
    by_name: dict[str, Any]
