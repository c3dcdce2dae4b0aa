"""`export_perfetto`: a job's ranks merged into one Chrome-trace timeline (render/perfetto.py), written
rank by rank so that memory holds a few ranks at a time."""
from __future__ import annotations

import contextlib
import tempfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

import msgspec
import polars as pl

from rankscope.ingest import Cache, load_rank
from rankscope.model import InputProblem
from rankscope.pipelines.job import analyze_job, one_line_errors
from rankscope.results import ExportResult, to_plain
from rankscope.results.timeline import RankTimeline

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.render.perfetto import TraceWriter
    from rankscope.results.rank import RankSummary


@dataclass
class _ExportTask:
    path: str
    rank: int
    cache_dir: str | None
    offset_ns: int
    origin_ns: int
    waits: pl.DataFrame | None
    critical_path: list[tuple[int, int, str, str, int]]   # the critical path's segments on this rank
    window_ns: tuple[int, int] | None = None   # only what overlaps [start, end) on the aligned clock


def parse_selection(text: str) -> list[int]:
    """"0-7,77" -> [0, 1, ..., 7, 77]; ValueError (saying what is wrong) when it is not such a list."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a number or a range such as 0-7") from None
        if a < 0 or b < a:
            raise ValueError(f"{part.strip()!r} is not a range from low to high")
        out.update(range(a, b + 1))
    return sorted(out)


def _within(tl: RankTimeline, lo: int, hi: int) -> RankTimeline:
    """The timeline with only the slices overlapping [lo, hi) and the counters in it (aligned clock)."""
    return msgspec.structs.replace(tl, slices=[f.filter((pl.col("ts_ns") < hi)
                                                        & (pl.col("ts_ns") + pl.col("dur_ns") > lo))
                                               for f in tl.slices],
                   counters=tl.counters.filter((pl.col("ts_ns") >= lo) & (pl.col("ts_ns") < hi)))


@one_line_errors
def _export_task(task: _ExportTask) -> tuple[dict[str, Any], list[bytes], int]:
    """Load one rank (from the cache when on), build its timeline and its JSON text: (what the
    file's metadata says about the rank, chunks, events). Bad input -> InputProblem."""
    from rankscope.analyses.rank.timeline import rank_timeline
    from rankscope.render.perfetto import rank_json
    trace, _ = load_rank(task.path, Cache(task.cache_dir))
    trace.meta.rank = task.rank
    tl = rank_timeline(trace, task.offset_ns, task.waits, task.critical_path)
    del trace
    if task.window_ns is not None:
        tl = _within(tl, *task.window_ns)
    chunks, events = rank_json(tl, task.origin_ns)
    return ({"rank": task.rank, "pid": task.rank, "file": task.path, "clock_offset_ns": task.offset_ns,
             "events": events, "tracks": tl.tracks.height, "moved_to_overlap_tracks": tl.moved,
             "clipped": tl.clipped, "notes": tl.notes}, chunks, events)


def export_perfetto(inputs: str | Path | list[str | Path], out: str | Path, cache_dir: str | Path | None = None,
                    use_cache: bool = True, on_progress: Callable[[int, int, str], None] | None = None,
                    pipeline_ranks: int = 2, ranks: list[int] | None = None, steps: list[int] | None = None,
                    on_estimate: Callable[[int, int], None] | None = None) -> ExportResult:
    """Analyse the job (for clock offsets and collective waits), then write its merged timeline to
    `out` (render/perfetto.py) rank by rank, converting up to `pipeline_ranks` ranks at once (in
    rank order). `ranks`: only these ranks (the analysis still reads every rank: clocks and waits
    are the job's); `steps`: only what overlaps those steps (each rank's windows of them).
    `on_progress(done, total, file)`: each file counts twice (analysis, export).
    `on_estimate(json_bytes, ranks)`: once the first rank is converted, the JSON the export will
    write (that rank's size x the ranks to write). Without the cache, a scratch cache lives for
    the export only: each file is parsed once."""
    from rankscope.render.perfetto import TraceWriter
    writer = TraceWriter(out)                      # a file that cannot be written fails before any work
    try:
        with contextlib.ExitStack() as stack:
            if not use_cache:
                cache_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="rankscope-export-"))
            result = _export(writer, inputs, cache_dir, on_progress, max(1, pipeline_ranks), ranks, steps,
                             on_estimate)
    except BaseException:
        writer.abort()
        raise
    if not result.ranks:
        writer.abort()
    return result


def _export(writer: TraceWriter, inputs: str | Path | list[str | Path], cache_dir: str | Path | None,
            on_progress: Callable[[int, int, str], None] | None, pipeline_ranks: int, ranks: list[int] | None = None,
            steps: list[int] | None = None, on_estimate: Callable[[int, int], None] | None = None) -> ExportResult:
    from rankscope.analyses.job.clock import applied_offsets
    from rankscope.analyses.job.critical_path import path_slices
    from rankscope.analyses.job.matching import collective_waits
    from rankscope.analyses.rank.timeline import job_origin_ns
    from rankscope.pipelines.hang import flight_recorder_slices, write_flight_recorder
    from rankscope.ingest.kineto import EXPORT_SCHEMA
    files = 0

    def analysing(done: int, total: int, file: str) -> None:
        nonlocal files
        files = total
        if on_progress:
            on_progress(done, 2 * total, file)

    analysis = analyze_job(inputs, cache_dir=cache_dir, on_progress=analysing)
    problems = list(analysis.problems)
    cross = analysis.cross
    offsets = applied_offsets(cross.clock) if cross is not None else {}
    offset_of = [offsets.get(s.rank, 0) for s in analysis.summaries]
    origin = job_origin_ns([s.meta.span_ns for s in analysis.summaries], offset_of)
    fr_tracks = flight_recorder_slices(analysis, offsets)           # Flight Recorder dumps: a track per rank
    fr_start = [int(cast(int, f["ts_ns"].min())) for _, f in fr_tracks if f.height]
    if fr_start:
        origin = min(fr_start + ([origin] if analysis.summaries else []))
    cache_root = str(cache_dir) if cache_dir is not None else None
    wanted = set(ranks) if ranks is not None else None
    tasks = [_ExportTask(s.meta.file, s.rank, cache_root, offset, origin,
                         collective_waits(analysis.table, s.rank) if analysis.table is not None else None,
                         path_slices(cross.critical_path if cross is not None else None, s.rank),
                         _window(s, steps, offset))
             for s, offset in zip(analysis.summaries, offset_of) if wanted is None or s.rank in wanted]
    if steps is not None and all(t.window_ns == (0, 0) for t in tasks):
        problems.append(InputProblem(str(writer.out), f"none of steps {steps} is in the ranks chosen", fatal=True))
        tasks = []
    written: list[dict[str, Any]] = []
    with ThreadPoolExecutor(pipeline_ranks) as pool:
        pending: deque[Future[tuple[dict[str, Any], list[bytes], int] | InputProblem]] = deque()
        for i in range(len(tasks)):
            while len(pending) < pipeline_ranks and i + len(pending) < len(tasks):
                pending.append(pool.submit(_export_task, tasks[i + len(pending)]))
            done = pending.popleft().result()
            if isinstance(done, InputProblem):
                problems.append(done)
            else:
                if on_estimate and not written:
                    on_estimate(sum(len(c) for c in done[1]) * len(tasks), len(tasks))
                written.append(done[0])
                writer.write(done[1], done[2])
            del done
            if on_progress:
                on_progress(files + i + 1, files + len(tasks), tasks[i].path)
    dumps = write_flight_recorder(writer, fr_tracks, origin, {w["rank"] for w in written})
    if not written and not dumps:
        return ExportResult(str(writer.out), [], 0, 0, problems)
    size = writer.close({
        "schema": EXPORT_SCHEMA, "origin_ns": origin,
        "time": ("ts/dur in µs since origin_ns on the aligned clock: "
                 "(own timestamp - clock_offset_ns - origin_ns) / 1000"),
        "clock": to_plain(cross.clock) if cross is not None else None,
        "ranks": written, "skipped": [str(p) for p in problems if p.fatal], "warnings": analysis.job.warnings,
        "flight_recorder": dumps,
    })
    return ExportResult(str(writer.out), sorted({w["rank"] for w in written + dumps}), writer.events, size, problems)


def _window(summary: RankSummary, steps: list[int] | None, offset_ns: int) -> tuple[int, int] | None:
    """The aligned time from the first to the end of the last of `steps` on this rank; None: all;
    (0, 0): the rank has none of them."""
    if steps is None:
        return None
    picked = [st for st in summary.steps if st.step in set(steps)]
    if not picked:
        return (0, 0)
    return min(st.start_ns for st in picked) - offset_ns, max(st.end_ns for st in picked) - offset_ns
