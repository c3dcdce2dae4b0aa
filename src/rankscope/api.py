"""The Python API: `load` a job's ranks, `analyze` a job into per-rank summaries and findings, and
the other commands' pipelines (`ingest`, `export_perfetto`, `diff_runs`, `analyze_nccl_logs`,
`analyze_memory_snapshots`, `mfu`).

    import rankscope
    result = rankscope.analyze("./log/profiler")          # Analysis (summaries, problems)
    trace = rankscope.load_rank("./log/profiler/rank0.pt.trace.json")   # one rank's frames
    job = rankscope.load("./log/profiler")                # Job: lazy per-rank access

The pipelines live in `rankscope.pipelines`, one module per command or group of commands; this
module is their public face. Each returns a typed result (`rankscope.results`) with the input
problems it met.
"""
from rankscope.ingest import load_rank
from rankscope.pipelines import ArgumentError
from rankscope.pipelines.diff import diff_runs
from rankscope.pipelines.export import export_perfetto
from rankscope.pipelines.inputs import analyze_memory_snapshots, analyze_nccl_logs
from rankscope.pipelines.job import Job, ingest, load
from rankscope.pipelines.mfu import mfu
from rankscope.pipelines.run import analyze
from rankscope.results import (
    Analysis,
    DiffResult,
    ExportResult,
    Ingest,
    JobInfo,
    MemoryResult,
    MfuResult,
    NcclResult,
)

__all__ = ["Analysis", "ArgumentError", "DiffResult", "ExportResult", "Ingest", "Job", "JobInfo", "MemoryResult",
           "MfuResult", "NcclResult", "analyze", "analyze_memory_snapshots", "analyze_nccl_logs", "diff_runs",
           "export_perfetto", "ingest", "load", "load_rank", "mfu"]
