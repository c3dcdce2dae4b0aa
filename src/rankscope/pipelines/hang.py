"""Flight Recorder dumps -> the hang / desync verdict (`analyze` runs it on the dumps it finds,
alone or beside the job's profiler traces). Each dump is read on its own: one that cannot be used,
a second dump of one rank, or one of another job is an InputProblem, and the others go on.
`flight_recorder_slices` / `write_flight_recorder`: the dumps' entries in the Perfetto export.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from rankscope import engine as engines
from rankscope.ingest import TraceError
from rankscope.model import InputProblem

if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

    from rankscope.analyses.inputs.flight_recorder import DumpSummary
    from rankscope.results.job import JobResult
    from rankscope.results.rank import RankSummary
    from rankscope.ingest.flight_recorder import FrDump
    from rankscope.pipelines.report import JobAnalysis
    from rankscope.render.perfetto import TraceWriter
    from rankscope.results.hang import HangReport


@dataclass(frozen=True)
class _DumpTask:
    path: str


def _dump_task(task: _DumpTask) -> DumpSummary | InputProblem:
    """The per-rank map of the dumps (runs in a worker): read one dump, summarise it. Never raises:
    bad input, and even a bug, is one line about that file."""
    from rankscope.analyses.inputs.flight_recorder import LAST_ENTRIES, summarize_dump
    from rankscope.ingest.flight_recorder import read_fr_dump
    try:
        return summarize_dump(read_fr_dump(task.path, frames_last=LAST_ENTRIES))
    except TraceError as exc:
        return InputProblem(task.path, str(exc))
    except MemoryError:
        return InputProblem(task.path, "out of memory while reading this file")
    except Exception as exc:
        return InputProblem(task.path, f"internal error while reading: {type(exc).__name__}: {exc}")


def _bytes(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def analyze_hang(dumps: Sequence[str | Path], traces: Sequence[RankSummary] = (), cross: JobResult | None = None,
                 engine: str = "auto", workers: int | None = None
                 ) -> tuple[HangReport | None, list[InputProblem]]:
    """The verdict over the dumps (None when none could be used), and the problems met. `traces`
    and `cross`: the job's profiler traces analysed beside them, whose world size and process groups
    fill in what the dumps do not say, and whose steps say how the culprits ran before. The dumps
    are read in this process: reading one is C work of 1-4 ms (ingest/_frpickle.c), and worker
    processes cost more to start and to send their summaries back than they save (bench_hang.py:
    1,024 dumps of 2,000 entries, 3.9 s here, 5.0 s in 2 workers); in worker processes only where
    there is much to read and the C reader is not built. `engine` "processes", "local" (threads:
    the C reader runs without the GIL) or "ray" (the user's choice) is kept."""
    from rankscope.analyses.job.hang import foreign_dumps, hang_report, trace_facts
    from rankscope.analyses.rank.groups import parse_ranks
    paths = sorted(map(str, dumps))
    workers = workers or engines.default_workers()
    if engine not in ("processes", "local", "ray"):
        from rankscope.ingest.flight_recorder import C_READER
        auto = "inprocess" if C_READER else engines.choose_engine("auto", sum(map(_bytes, paths)), len(paths), workers)
        engine = "processes" if auto == "local" else "inprocess"      # the C reader: in this process
    results = engines.map_ranks(_dump_task, [_DumpTask(p) for p in paths], engine=engine, workers=workers,
                                on_lost=lambda task, why: InputProblem(task.path, why))
    problems: list[InputProblem] = [r for r in results if isinstance(r, InputProblem)]
    summaries: dict[int, DumpSummary] = {}
    for s in (r for r in results if not isinstance(r, InputProblem)):
        if s.rank in summaries:
            problems.append(InputProblem(s.file, f"a second Flight Recorder dump of rank {s.rank} (like "
                                                 f"{Path(summaries[s.rank].file).name}): skipped, keeping the first "
                                                 "by name"))
            continue
        if s.skipped_entries:
            problems.append(InputProblem(s.file, f"{s.skipped_entries:,} entries without the fields of a Flight "
                                                 f"Recorder entry: left out", fatal=False))
        summaries[s.rank] = s
    for s, why in foreign_dumps(list(summaries.values())):
        problems.append(InputProblem(s.file, f"looks like another job's Flight Recorder dump: {why}; not analysed"))
        del summaries[s.rank]
    if not summaries:
        return None, problems
    worlds = [t.meta.world_size for t in traces if t.meta.world_size]
    groups = {str(pg["pg_name"]): list(ranks) for t in traces for pg in t.meta.pg_config
              if isinstance(pg, dict) and pg.get("pg_name") is not None and (ranks := parse_ranks(pg.get("ranks")))}
    traced = trace_facts(list(traces), cross.stragglers if cross is not None else [])
    return hang_report(list(summaries.values()), max(worlds) if worlds else None, groups, traced), problems


def flight_recorder_slices(analysis: JobAnalysis, offsets: dict[int, int]) -> list[tuple[FrDump, pl.DataFrame]]:
    """Each dump the verdict used, with its entries as timeline slices (`export perfetto`): times on
    the trace clock of its rank's profiler trace (its base time and clock offset), or of the first
    trace; with dumps alone, the dumps' own clock (ns since the epoch)."""
    from rankscope.analyses.inputs.flight_recorder import entry_slices
    from rankscope.ingest.flight_recorder import read_fr_dump
    dumps = []
    for path in analysis.hang.dumps if analysis.hang is not None else []:
        try:
            dumps.append(read_fr_dump(path))
        except TraceError:                     # changed since the analysis read it: left out
            continue
    horizon = max((int(max(d.created_ns.max(), d.completed_ns.max())) for d in dumps if len(d)), default=0)
    bases = {s.rank: s.meta.base_time_ns or 0 for s in analysis.summaries}
    common = next(iter(bases.values()), 0)
    return [(d, entry_slices(d, horizon, bases.get(d.rank, common) + offsets.get(d.rank, 0))) for d in dumps]


def write_flight_recorder(writer: TraceWriter, tracks: list[tuple[FrDump, pl.DataFrame]], origin_ns: int,
                          written: set[int]) -> list[dict[str, Any]]:
    """Write each rank's Flight Recorder track (`written`: the ranks whose process is in the file
    already); returns what the file's metadata says about each."""
    from rankscope.render.perfetto_hang import flight_recorder_json
    out = []
    for d, slices in tracks:
        chunks, events = flight_recorder_json(d.rank, slices, origin_ns, d.rank in written)
        writer.write(chunks, events)
        out.append({"rank": d.rank, "file": d.file, "entries": len(d), "events": events})
    return out
