"""The results that the pipelines hand to findings and renderers: typed, below both.

`Analysis` (what `analyze` returns), `JobInfo`, `Ingest` (what `validate` / `load` find),
`ExportResult`, `Finding`. Renderers and findings import these types from here, never the API.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rankscope.analyses.rank.summary import as_plain
from rankscope.model import InputProblem, RankMeta

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.analyses.job.stragglers import CrossRank
    from rankscope.analyses.rank.summary import RankSummary


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
        return as_plain(dataclasses.asdict(self))


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


@dataclass
class Analysis:
    job: JobInfo
    ranks: list[RankSummary]                       # sorted by rank
    problems: list[InputProblem] = field(default_factory=list)   # files skipped or salvaged
    engine: str = "inprocess"
    cross: CrossRank | None = None                 # collectives, clock alignment, stragglers, alpha-beta
    findings: list[Finding] = field(default_factory=list)   # ordered: severity, then cost per step

    @property
    def skipped(self) -> list[InputProblem]:
        return [p for p in self.problems if p.fatal]


@dataclass
class Ingest:
    """What `load` / `validate` find: per kept file its metadata (rank assigned), the problems."""
    ranks: list[RankMeta]
    problems: list[InputProblem]
    warnings: list[str]
    engine: str

    @property
    def skipped(self) -> list[InputProblem]:
        return [p for p in self.problems if p.fatal]


@dataclass
class ExportResult:
    out: str
    ranks: list[int]                       # ranks written
    events: int
    size_bytes: int
    problems: list[InputProblem] = field(default_factory=list)

    @property
    def skipped(self) -> list[InputProblem]:
        return [p for p in self.problems if p.fatal]
