"""Whole runs (docs/runs.md): a folder that holds several profiler cycles per rank is analysed cycle by
cycle, each cycle as a job of its own, and the run view is built from what each cycle leaves
(`analyses/run/cycles.py`).

Bounded memory: the per-rank map runs once over every file (`_key_task`: the rank's summary is made, and
kept in the parse cache, or with `use_cache=False` in a spill folder removed at the end) and sends back
only what grouping needs (`CycleFile`: steps and span). Then each cycle in turn: its summaries are read
back (decoding a cached summary costs milliseconds), reduced across ranks, judged, and reduced to its
`CycleFacts`; only the last cycle's analysis is kept whole (the report details it). On a Ray cluster the
summaries are read back in the driver: with a cache folder that every node shares (`--cache-dir`) they
are found, else they are recomputed there.
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import msgspec

from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.analyses.run.cycles import CycleFacts, RankStep
from rankscope.results.run import CycleStraggler
from rankscope.ingest.cycles import CycleFile, cycles_in_names, run_cycles
from rankscope.ingest.discover import discover, rank_from_filename
from rankscope.ingest import TraceError
from rankscope.model import InputProblem
from rankscope.pipelines.job import (_import_reduce, _map_files, _summary, _Task, _trim_heap, decode_summary,
                                     job_analysis, map_summaries, mapped, one_line_errors, read_at,
                                     resolved_arguments, share_strings, with_nccl_logs)
from rankscope.pipelines.report import JobAnalysis, to_report
from rankscope.results import Analysis
from rankscope.results.run import Run, TrendStep

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results.rank import MappedRank, RankSummary
    from rankscope.ingest.discover import Discovered
    from rankscope.thresholds import Thresholds

__all__ = ["analyze", "analyze_cycles"]


def analyze(inputs: str | Path | list[str | Path], cache_dir: str | Path | None = None, use_cache: bool = True,
            engine: str = "auto", workers: int | None = None,
            on_progress: Callable[[int, int, str], None] | None = None, address: str | None = None,
            thresholds: dict[str, float] | None = None, nccl_logs: list[str | Path] | None = None,
            job: int | None = None, same_job: bool = False) -> Analysis:
    """`pipelines.job.analyze` (same arguments), over every profiler cycle: when the files hold several
    cycles per rank, each cycle is analysed as a job and the result is the run report (`Analysis.run`,
    the last cycle detailed, with the verdict of Flight Recorder dumps beside it); one cycle gives the
    job's analysis as it is. `same_job` holds for each cycle's files."""
    return to_report(analyze_cycles(inputs, cache_dir, use_cache, engine, workers, on_progress, address, thresholds,
                                    nccl_logs, job, same_job))


def analyze_cycles(inputs: str | Path | list[str | Path], cache_dir: str | Path | None = None, use_cache: bool = True,
                   engine: str = "auto", workers: int | None = None,
                   on_progress: Callable[[int, int, str], None] | None = None, address: str | None = None,
                   thresholds: dict[str, float] | None = None, nccl_logs: list[str | Path] | None = None,
                   job: int | None = None, same_job: bool = False) -> JobAnalysis:
    """`analyze`, before its report: what the other pipelines read (the per-rank summaries, the
    cross-rank result, the matched collectives)."""
    values = resolved_arguments(thresholds, job)
    found = discover(inputs if isinstance(inputs, list) else [inputs])
    if cycles_in_names(found.traces):
        result = analyze_run(found, cache_dir, use_cache, engine, workers, on_progress, address, values, job,
                             same_job)
    else:
        dumps: list[Path] = []
        ranks, problems, chosen = map_summaries(found, cache_dir, use_cache, engine, workers, on_progress,
                                                address, fr_dumps=dumps)
        result = (run_of_summaries(ranks, problems, chosen, values, dumps, workers, job, same_job)
                  if several_cycles(ranks)
                  else job_analysis(ranks, problems, chosen, values, job=job, fr_dumps=dumps, workers=workers,
                                    same_job=same_job))
    return with_nccl_logs(result, nccl_logs, values)


def cycle_file(s: RankSummary) -> CycleFile:
    steps = tuple(st.step for st in s.steps) if s.steps_source == "profiler_step" else ()
    rank = s.meta.dist_rank if s.meta.dist_rank is not None else rank_from_filename(s.meta.file)
    return CycleFile(s.meta.file, steps, s.meta.span_ns, rank, s.meta.world_size)


def several_cycles(ranks: list[MappedRank]) -> bool:
    return len(run_cycles([cycle_file(m.summary) for m in ranks])) > 1


@one_line_errors
def key_task(task: _Task) -> CycleFile:
    """The per-rank map of a run: the summary made and kept (cache or spill folder); back comes its key."""
    summary = one_summary(task)
    if task.spill_dir is not None:
        Path(_spilled(task.spill_dir, task.path)).write_bytes(msgspec.msgpack.encode(summary))
    return cycle_file(summary)


def one_summary(task: _Task) -> RankSummary:
    """The summary of a file of one rank (a run's cycles are kineto files, one rank each)."""
    summary = _summary(task)
    if isinstance(summary, list):
        raise TraceError(f"{task.path}: a file of several ranks cannot be one cycle of a run")
    return summary


@one_line_errors
def summary_again(task: _Task) -> RankSummary:
    """A file's summary read back (from the cache, the spill folder, or made again when neither has it)."""
    if task.spill_dir is not None:
        try:
            summary = decode_summary(Path(_spilled(task.spill_dir, task.path)).read_bytes())
        except OSError:
            summary = None
        if summary is not None:
            return read_at(summary, task.path)
    return one_summary(task)


def _spilled(spill_dir: str, path: str) -> str:
    return str(Path(spill_dir) / (hashlib.sha256(path.encode()).hexdigest()[:32] + ".msgpack"))


def cycle_facts(a: JobAnalysis) -> CycleFacts:
    """The facts a run keeps of one cycle's analysis."""
    rank_steps = tuple(RankStep(s.rank, st.step, st.duration_ms, tuple(st.breakdown_ms[c] for c in CATEGORIES))
                       for s in a.summaries for st in s.steps)
    starts = [st.start_ns for s in a.summaries for st in s.steps] or [s.meta.span_ns[0] for s in a.summaries
                                                                         if s.meta.span_ns] or [0]
    found = a.cross.stragglers if a.cross is not None else []
    worst = max(found, key=lambda st: st.cost_ms_per_step, default=None)
    return CycleFacts(
        order=(min(a.job.steps, default=0), min(starts)),
        files=tuple(s.meta.file for s in a.summaries), ranks=tuple(a.job.ranks),
        missing_ranks=tuple(a.job.missing_ranks), steps=tuple(a.job.steps), rank_steps=rank_steps,
        straggler=CycleStraggler(worst.rank, worst.cause, round(worst.cost_ms_per_step, 3)) if worst else None,
        finding_costs=tuple((f.id, f.cost_ms_per_step) for f in a.findings))


class RunAnalysis:
    """Analyses a run's cycles one by one (`add`), keeping each one's facts and the latest analysis;
    `result()` is the report: the last cycle's analysis with the run view and the run's findings."""

    def __init__(self, values: Thresholds, engine: str, job: int | None = None, same_job: bool = False):
        self.values, self.engine, self.job, self.same_job = values, engine, job, same_job
        self.facts: list[CycleFacts] = []
        self.problems: list[InputProblem] = []
        self.last: JobAnalysis | None = None

    def add(self, got: Sequence[RankSummary | InputProblem]) -> JobAnalysis:
        """Analyse one cycle: its files' summaries, or the problem each unreadable one met."""
        analysis = job_analysis([mapped(s) for s in got if not isinstance(s, InputProblem)],
                                [s for s in got if isinstance(s, InputProblem)], self.engine, self.values,
                                job=self.job, same_job=self.same_job)
        self.problems += analysis.problems
        if analysis.usable:
            self.facts.append(cycle_facts(analysis))
            if self.last is None or self.facts[-1].order >= max(f.order for f in self.facts):
                self.last = analysis
        return analysis

    def result(self, fr_dumps: Sequence[str | Path] = (), workers: int | None = None) -> JobAnalysis | None:
        """The report (None before a usable cycle): the latest cycle's analysis, the run, its findings, and
        the verdict of the Flight Recorder dumps `fr_dumps` (taken as the job stopped: beside its last cycle)."""
        if self.last is None:
            return None
        from rankscope.analyses.run.changes import find_changes
        from rankscope.analyses.run.cycles import run_rows
        from rankscope.findings import ordered
        from rankscope.findings.hang import hang_findings
        from rankscope.findings.run import run_findings
        a = self.last
        rows, trend = run_rows(self.facts)
        costs = [dict(c.finding_costs) for c in sorted(self.facts, key=lambda c: c.order)]
        found = find_changes(trend, rows, costs, self.values)
        run = Run(cycles=rows, trend=[TrendStep(p.rank, p.step, p.cycle, p.step_ms) for p in trend],
                  changes=found.changes, detailed_cycle=len(rows), noise_pct=found.noise_pct,
                  cycle_noise_pct=found.cycle_noise_pct, z_critical=round(found.z_critical, 2))
        hang, problems = None, _unique(self.problems)
        if fr_dumps:
            from rankscope.pipelines.hang import analyze_hang
            hang, hang_problems = analyze_hang(fr_dumps, a.summaries, a.cross, self.engine, workers)
            problems += hang_problems
        return JobAnalysis(job=a.job, summaries=a.summaries, cross=a.cross, table=a.table, problems=problems,
                           engine=a.engine, findings=ordered(run_findings(run, self.values)
                                                             + hang_findings(hang, self.values) + a.findings),
                           hang=hang, run=run)


def _unique(problems: list[InputProblem]) -> list[InputProblem]:
    return list({(p.file, p.problem, p.fatal): p for p in problems}.values())


def analyze_run(found: Discovered, cache_dir: str | Path | None, use_cache: bool, engine: str, workers: int | None,
                on_progress: Callable[[int, int, str], None] | None, address: str | None,
                values: Thresholds, job: int | None = None, same_job: bool = False) -> JobAnalysis:
    """Every cycle of the run in `found`: the map over all files, then the cycles one by one (`job`: the
    job picked in each, when its files hold several; `same_job`: see `different_jobs`)."""
    spill = None if use_cache else tempfile.mkdtemp(prefix="rankscope-run-")
    try:
        keys, problems, chosen = _map_files(found, key_task, cache_dir, use_cache, engine, workers, on_progress,
                                            address, lambda _: _import_reduce(), spill_dir=spill)
        _trim_heap(chosen)
        cache_root = str(cache_dir) if cache_dir is not None else None
        strings: dict[str, str] = {}

        def summary_of(file: str) -> RankSummary | InputProblem:
            summary = summary_again(_Task(file, cache_root, use_cache, spill))
            share_strings(summary, strings)
            return summary

        return _by_cycle(keys, problems, chosen, values, summary_of, found.fr_dumps, workers, job, same_job)
    finally:
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)


def run_of_summaries(ranks: list[MappedRank], problems: list[InputProblem], chosen: str,
                     values: Thresholds, fr_dumps: Sequence[str | Path] = (), workers: int | None = None,
                     job: int | None = None, same_job: bool = False) -> JobAnalysis:
    """A run whose summaries are all in memory already (its names did not look like cycles)."""
    by_file = {m.summary.meta.file: m for m in ranks}

    def summary_of(file: str) -> RankSummary:
        m = by_file.pop(file)
        return msgspec.structs.replace(m.summary, collectives=m.collectives)   # as the cycles take it

    return _by_cycle([cycle_file(m.summary) for m in ranks], problems, chosen, values, summary_of, fr_dumps, workers,
                     job, same_job)


def _by_cycle(keys: list[CycleFile], problems: list[InputProblem], chosen: str, values: Thresholds,
              summary_of: Callable[[str], RankSummary | InputProblem], fr_dumps: Sequence[str | Path] = (),
              workers: int | None = None, job: int | None = None, same_job: bool = False) -> JobAnalysis:
    cycles = run_cycles(keys)
    if len(cycles) == 1:                # names that looked like cycles, but one job: its analysis as it is
        got = [summary_of(f) for f in cycles[0]]
        return job_analysis([mapped(s) for s in got if not isinstance(s, InputProblem)],
                            problems + [s for s in got if isinstance(s, InputProblem)], chosen, values,
                            job=job, fr_dumps=[Path(f) for f in fr_dumps], workers=workers, same_job=same_job)
    run = RunAnalysis(values, chosen, job, same_job)
    run.problems += problems
    for files in cycles:
        run.add([summary_of(f) for f in files])
    return (run.result(fr_dumps, workers)
            or job_analysis([], _unique(run.problems), chosen, values, job=job, fr_dumps=[Path(f) for f in fr_dumps],
                            workers=workers, same_job=same_job))
