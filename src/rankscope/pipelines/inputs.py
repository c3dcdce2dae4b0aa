"""The inputs beside the traces: NCCL_DEBUG=INFO logs and CUDA memory snapshots. Each file is read
on its own: one that cannot be used is an InputProblem, and the others go on."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Callable, TypeVar

from rankscope.ingest import TraceError
from rankscope.model import InputProblem
from rankscope.pipelines import checking_arguments
from rankscope.results import MemoryResult, NcclResult

T = TypeVar("T")

# The readers and analyses are imported where they are used, as in job.py.


def analyze_nccl_logs(logs: list[str | Path], thresholds: Mapping[str, float] | None = None) -> NcclResult:
    """NCCL_DEBUG=INFO logs, each one run (e.g. healthy vs slow; logs sharing a communicator are one
    run, `merge_runs`), compared and judged against
    `thresholds`: overrides by name or the resolved values in force (`rankscope.thresholds.resolve`),
    by default the defaults; unknown names raise ArgumentError before any file is read."""
    from rankscope.analyses.inputs.nccl import compare_nccl_logs
    from rankscope.findings import nccl_findings
    from rankscope.ingest.nccl_log import merge_runs, read_nccl_log
    from rankscope.thresholds import resolve
    with checking_arguments():
        values = resolve(thresholds)
    parsed, problems = _read(logs, read_nccl_log)
    if not parsed:
        return NcclResult(None, [], problems)
    report = compare_nccl_logs(merge_runs(parsed))       # per-rank logs of one communicator: one run
    return NcclResult(report, nccl_findings(report, values), problems)


def analyze_memory_snapshots(snapshots: list[str | Path], params: int | None = None,
                             param_bytes: int = 4, thresholds: Mapping[str, float] | None = None) -> MemoryResult:
    """CUDA memory snapshots (torch.cuda.memory._dump_snapshot pickles, read without running any
    code), each analysed and judged against `thresholds` (as `analyze_nccl_logs`); `params` (model
    parameters of `param_bytes` each) adds the theoretical breakdown."""
    from rankscope.analyses.inputs.memory_snapshot import analyze_snapshot
    from rankscope.findings.inputs import memory_snapshot_findings
    from rankscope.ingest.memory_snapshot import read_memory_snapshot
    from rankscope.thresholds import resolve
    with checking_arguments():
        values = resolve(thresholds)
    parsed, problems = _read(snapshots, read_memory_snapshot)
    reports = [analyze_snapshot(s, params=params, param_bytes=param_bytes) for s in parsed]
    return MemoryResult(reports, problems, memory_snapshot_findings(reports, values))


def _read(paths: list[str | Path], reader: Callable[[str | Path], T]) -> tuple[list[T], list[InputProblem]]:
    """Each path through `reader`: what it read, and a problem for each file it could not use."""
    parsed, problems = [], []
    for path in paths:
        try:
            parsed.append(reader(path))
        except TraceError as exc:
            problems.append(InputProblem(str(path), str(exc)))
    return parsed, problems
