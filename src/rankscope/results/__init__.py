"""The typed results: every fact an analysis produces, as msgspec Structs with Literal enums and
units in the names, pure data. The rooms:

  rank.py           the per-rank summary (the map's output, the per-rank cache format)
  collectives.py    a rank's collectives (the worker -> driver payload, packed) and the job's matched ones
  clock.py, stragglers.py, layout.py, pipeline.py, experts.py, critical_path.py, step_spread.py
                    the parts of the cross-rank result, job.py (`JobResult`: the reduce's output)
  capture.py        capture quality          findings.py  a finding
  hang.py           Flight Recorder verdict  run.py       a whole run of profiler cycles
  jobs.py           the jobs inputs hold     analysis.py  the report of `analyze` (`Analysis`)

and here what the other commands show: `Ingest` (`validate` / `load`), `ExportResult`,
`DiffResult`, `NcclResult`, `MemoryResult`, `MfuResult`, `ThresholdList`. Every pipeline's result
is a `Result`: its input problems, and whether anything was usable. Renderers and findings import
these types from here, never from analyses/; nothing here imports analyses/.
`to_plain` is the one serialiser of results into plain JSON data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import numpy as np
import polars as pl

from rankscope.model import InputProblem, RankMeta
from rankscope.results.analysis import Analysis, JobInfo
from rankscope.results.findings import Finding

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results.memory import MemoryReport
    from rankscope.results.nccl import NcclReport
    from rankscope.results.diff import Diff
    from rankscope.results.mfu import MfuReport


__all__ = ["Analysis", "DiffResult", "ExportResult", "Finding", "Ingest", "JobInfo", "MemoryResult", "MfuResult",
           "NcclResult", "Result", "ThresholdList", "to_plain"]


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


class Result(Protocol):
    """What every pipeline's result has: the input problems met, of which `skipped` cost a file (the
    others are warnings), and `usable`: whether anything was read to report on."""

    @property
    def problems(self) -> list[InputProblem]: ...

    @property
    def usable(self) -> bool:
        """Something was read to report on."""

    @property
    def skipped(self) -> list[InputProblem]: ...


class _Problems:
    """`skipped`: the problems that cost a file."""
    problems: list[InputProblem]

    @property
    def skipped(self) -> list[InputProblem]:
        return [p for p in self.problems if p.fatal]


@dataclass
class Ingest(_Problems):
    """What `load` / `validate` find: per kept file its metadata (rank assigned), the problems."""
    ranks: list[RankMeta]
    problems: list[InputProblem]
    warnings: list[str]
    engine: str

    @property
    def usable(self) -> bool:
        return bool(self.ranks)


@dataclass
class ExportResult(_Problems):
    out: str
    ranks: list[int]                       # ranks written
    events: int
    size_bytes: int
    problems: list[InputProblem] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return bool(self.ranks)


@dataclass
class DiffResult(_Problems):
    """What `diff` finds: the comparison of the two runs, or the run (as given) without a usable trace."""
    diff: Diff | None
    problems: list[InputProblem] = field(default_factory=list)
    empty_run: str | None = None

    @property
    def usable(self) -> bool:
        return self.diff is not None


@dataclass
class NcclResult(_Problems):
    """What `nccl` finds in NCCL_DEBUG=INFO logs: the runs compared (None when no log could be read),
    their findings, the problems (`skipped`: the unusable logs)."""
    report: NcclReport | None
    findings: list[Finding]
    problems: list[InputProblem] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return self.report is not None


@dataclass
class MemoryResult(_Problems):
    """What `memory` finds in CUDA memory snapshots: one report per snapshot read, their findings,
    the problems (`skipped`: the unusable snapshots)."""
    reports: list[MemoryReport]
    problems: list[InputProblem] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return bool(self.reports)


@dataclass
class MfuResult(_Problems):
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
