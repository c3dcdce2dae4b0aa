"""`analyze` a job into per-rank summaries and findings, `ingest` it (what `validate` shows), `load`
it for notebooks.

Per-rank work (parse or cache read, then `summarize_rank`) runs through `engine.map_ranks`;
the cross-rank part works on the small summaries only.
"""
from __future__ import annotations

import dataclasses
import errno
import functools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Protocol, Sequence, TypeVar

import msgspec

from rankscope import engine as engines
from rankscope.ingest import Cache, TraceError, load_rank, read_trace, read_traces, several_ranks
from rankscope.ingest.cache import claim_root, content_key
from rankscope.ingest.consistency import different_jobs
from rankscope.ingest.devices import NOT_A_CAPTURE, device_name
from rankscope.ingest.discover import Discovered, assign_ranks, discover
from rankscope.limits import exhausted
from rankscope.model import InputProblem, RankMeta, RankTrace
from rankscope.numbers import rounded
from rankscope.pipelines import checking_arguments
from rankscope.pipelines.driver_memory import _arrived as _arrived, _trim_heap as _trim_heap  # the driver's memory
from rankscope.pipelines.driver_memory import share_strings as share_strings
from rankscope.pipelines.report import JobAnalysis, to_report
from rankscope.results import Analysis, Finding, Ingest, JobInfo
from rankscope.results.jobs import FoundJob
from rankscope.results.rank import MappedRank, RankSummary

if TYPE_CHECKING:
    from rankscope.analyses.job.matching import CollectiveTable
    from rankscope.results.collectives import Collectives, RankCollectives
    from rankscope.results.job import JobResult
    from rankscope.thresholds import Thresholds

# The analyses are imported where they are used: `validate` and `load` only parse, and the
# analysis modules would add ~0.15 s to their start.


@dataclass(frozen=True)
class _Task:
    path: str
    cache_dir: str | None
    use_cache: bool
    spill_dir: str | None = None      # a run's summaries without a cache (pipelines/run.py)


class _OfAFile(Protocol):
    @property
    def path(self) -> str: ...


T = TypeVar("T")
TaskT = TypeVar("TaskT", bound=_OfAFile)


def one_line_errors(task_fn: Callable[[TaskT], T]) -> Callable[[TaskT], T | InputProblem]:
    """A per-rank task never raises: bad input, and even a bug, becomes one InputProblem line, so
    one rank never takes the others down."""
    @functools.wraps(task_fn)
    def run(task: TaskT) -> T | InputProblem:
        try:
            return task_fn(task)
        except TraceError as exc:
            return InputProblem(task.path, str(exc))
        except OSError as exc:
            if exc.errno == errno.ENOMEM:                 # a memory map refused
                return InputProblem(task.path, f"{exhausted()} while reading this file")
            return InputProblem(task.path, f"cannot read: {exc.strerror or exc}")
        except MemoryError:
            return InputProblem(task.path, f"{exhausted()} while reading this file")
        except Exception as exc:
            return InputProblem(task.path, f"internal error while reading: {type(exc).__name__}: {exc}")
    return run


@one_line_errors
def _rank_task(task: _Task) -> MappedRank | list[MappedRank]:
    """The per-rank map step (runs in a worker). With a cache, the summary itself is cached too
    (keyed by file content and analysis code). What travels to the driver: the summary, its
    collectives packed beside it."""
    from rankscope.analyses.rank.collectives import pack_collectives
    summary = _summary(task)
    return [mapped(one, pack_collectives) for one in summary] if isinstance(summary, list) else \
        mapped(summary, pack_collectives)


def mapped(summary: RankSummary, pack: Callable[[RankCollectives], Collectives] | None = None) -> MappedRank:
    """The summary with its collectives taken out beside it (`pack`ed, when given)."""
    rc = summary.collectives
    return MappedRank(msgspec.structs.replace(summary, collectives=None),
                      None if rc is None else pack(rc) if pack is not None else rc)


@functools.cache
def _import_reduce() -> None:
    """The code of the cross-rank reduce and of the findings, imported in the driver as the first
    rank arrives: while the others are still read (the parse runs without the GIL), not after."""
    import rankscope.analyses.job.reduce  # noqa: F401
    import rankscope.findings  # noqa: F401


_summary_decoder: msgspec.msgpack.Decoder[RankSummary] | None = None
_summary_decoder_lock = threading.Lock()


def decode_summary(blob: bytes) -> RankSummary | None:
    """A cached summary; None when damaged or from an older layout. One decoder serves every
    thread, made under a lock: msgspec works out how to decode a type on its first use, and two
    worker threads doing that at once crashed the process (a segmentation fault in about one
    cached `analyze` in 40, msgspec 0.22)."""
    global _summary_decoder
    with _summary_decoder_lock:
        if _summary_decoder is None:
            from rankscope.results.rank import RankSummary
            _summary_decoder = msgspec.msgpack.Decoder(RankSummary)
    try:
        return _summary_decoder.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _summary(task: _Task) -> RankSummary | list[RankSummary]:
    from rankscope.analyses import code_fingerprint
    from rankscope.analyses.rank.summary import summarize_rank
    if several_ranks(task.path):          # an Nsight report of a whole job: one summary per process (not cached)
        return [summarize_rank(t) for t in read_traces(task.path)]
    if not task.use_cache:
        return summarize_rank(read_trace(task.path)[0])
    cache = Cache(task.cache_dir)
    key = content_key(task.path)
    blob_name = f"summary-{code_fingerprint()}.msgpack"
    blob = cache.get_blob(key, blob_name)
    summary = decode_summary(blob) if blob is not None else None
    if summary is not None:           # else: none, damaged or from an older layout: recompute and rewrite
        return read_at(summary, task.path, from_cache=True)
    trace, cached = load_rank(task.path, cache, key=key)
    summary = summarize_rank(trace)
    # stored without its file name (set on each read, `read_at`; and a file name need not be UTF-8)
    cache.put_blob(key, blob_name, msgspec.msgpack.encode(
        msgspec.structs.replace(summary, meta=dataclasses.replace(summary.meta, file=""))))
    return msgspec.structs.replace(summary, from_cache=cached,
                                   meta=dataclasses.replace(summary.meta, cache_error=cache.problem()))


def read_at(summary: RankSummary, path: str, from_cache: bool = False) -> RankSummary:
    """A stored summary (cache, spill folder) as this run read it: from `path` (the same content may
    have been summarised at another path)."""
    return msgspec.structs.replace(summary, meta=dataclasses.replace(summary.meta, file=path),
                                   from_cache=from_cache or summary.from_cache)


@one_line_errors
def _load_task(task: _Task) -> RankMeta | list[RankMeta]:
    """Ingest only (parse, or find in the cache): the rank's metadata (of each rank the file holds)."""
    if several_ranks(task.path):
        return [t.meta for t in read_traces(task.path)]
    if not task.use_cache:
        return read_trace(task.path)[0].meta
    cache = Cache(task.cache_dir)
    key = content_key(task.path)
    meta = cache.get_meta(key, task.path)
    if meta is None:
        meta = load_rank(task.path, cache, key=key)[0].meta
        meta.cache_error = cache.problem()
    return meta


def ingest(inputs: str | Path | list[str | Path], cache_dir: str | Path | None = None, use_cache: bool = True,
           engine: str = "auto", workers: int | None = None,
           on_progress: Callable[[int, int, str], None] | None = None, address: str | None = None) -> Ingest:
    """Read (or find in the cache) every rank of a job without analysing it."""
    metas, problems, chosen = _map_files(inputs, _load_task, cache_dir, use_cache, engine, workers, on_progress,
                                         address)
    kept, warnings, rank_problems = _assign(metas)
    return Ingest(kept, problems + rank_problems, warnings + _coverage(kept)[2], chosen)


def _assign(metas: list[RankMeta], same_job: bool = False) -> tuple[list[RankMeta], list[str], list[InputProblem]]:
    """Ranks for the files read: sets rank/rank_source on the kept ones (sorted by rank); returns
    them, warnings, and the problems (duplicates skipped, per-file warnings of the kept, one line
    when the cache could not be written). `same_job`: see `different_jobs`."""
    metas = sorted(metas, key=rank_input)
    assignments, warnings, duplicates = assign_ranks([rank_input(m) for m in metas], [m.dist_rank for m in metas],
                                                     [not m.salvaged for m in metas])
    warnings += different_jobs(metas, same_job)      # all files read: a rank two jobs claim keeps only one
    by_file = {rank_input(m): m for m in metas}
    kept = []
    for a in assignments:
        m = by_file[a.file]
        m.rank, m.rank_source = a.rank, a.source
        kept.append(m)
    problems = [InputProblem(f, why) for f, why in duplicates]
    problems += [InputProblem(rank_input(m), p, fatal=False) for m in kept for p in m.problems]
    for error in sorted({m.cache_error for m in metas if m.cache_error}):   # once per run, whatever the ranks
        problems.append(InputProblem("cache", f"{error}; the results are not affected", fatal=False))
    return kept, warnings, problems


def _map_files(inputs: str | Path | list[str | Path] | Discovered, task_fn: Callable[[_Task], Any],
               cache_dir: str | Path | None, use_cache: bool, engine: str, workers: int | None,
               on_progress: Callable[[int, int, str], None] | None, address: str | None = None,
               on_arrival: Callable[[Any], None] | None = None, keep_memory: bool = False,
               fr_dumps: list[Path] | None = None, spill_dir: str | None = None
               ) -> tuple[list[Any], list[InputProblem], str]:
    """Discover the files (or take those `inputs` found) and map `task_fn` over them: (results, problems,
    engine used). `on_arrival(result)` runs in the driver on each result as it comes in. `keep_memory`: see
    `engines.map_ranks`. `fr_dumps`: receives the Flight Recorder dumps found (else they are ignored)."""
    found = inputs if isinstance(inputs, Discovered) else discover(inputs if isinstance(inputs, list) else [inputs])
    if fr_dumps is not None:
        fr_dumps.extend(found.fr_dumps)
    problems = [InputProblem(str(f), why, fatal=False) for f, why in found.ignored]
    problems += [InputProblem(str(f), why) for f, why in found.skipped]
    files = sorted(found.traces, key=lambda p: -_size(p))     # largest first: better balance
    workers = workers or engines.default_workers()
    chosen = engines.choose_engine(engine, sum(_size(p) for p in files), len(files), workers, address)
    cache_root = str(cache_dir) if cache_dir is not None else None
    if use_cache:
        claim_root(Cache(cache_root).root)    # a folder that is no cache: refused before anything is read there
    tasks = [_Task(str(p), cache_root, use_cache, spill_dir) for p in files]
    done = 0

    def progress(i: int, result: Any) -> None:
        nonlocal done
        if on_arrival:
            on_arrival(result)
        done += 1
        if on_progress:
            on_progress(done, len(tasks), tasks[i].path)

    results = engines.map_ranks(task_fn, tasks, engine=chosen, workers=workers, on_done=progress, address=address,
                                on_lost=lambda task, why: InputProblem(task.path, why), keep_memory=keep_memory)
    problems += [r for r in results if isinstance(r, InputProblem)]
    return ([one for r in results if not isinstance(r, InputProblem) for one in (r if isinstance(r, list) else [r])],
            problems, chosen)


def analyze_job(inputs: str | Path | list[str | Path], cache_dir: str | Path | None = None, use_cache: bool = True,
                engine: str = "auto", workers: int | None = None,
                on_progress: Callable[[int, int, str], None] | None = None, address: str | None = None,
                thresholds: dict[str, float] | None = None, nccl_logs: list[str | Path] | None = None,
                job: int | None = None, same_job: bool = False) -> JobAnalysis:
    """Analyse a job: a folder of per-rank traces, one file, or a list of either.
    `on_progress(done, total, file)` is called as ranks finish. `engine="ray"` maps the ranks on
    Ray: the cluster at `address` (e.g. "auto", "ray://head:10001"), else a local runtime.
    `thresholds` overrides thresholds by name (`rankscope.thresholds.THRESHOLDS`): resolved once, the
    same values decide the cross-rank verdicts and the findings; unknown names raise ArgumentError
    (a ValueError) before any file is read. `nccl_logs`: NCCL_DEBUG=INFO
    logs of the job (several = runs to compare); their findings join the job's, an unusable log is a
    problem. Inputs that hold several jobs (ingest/jobs.py) are not merged: without `job` (1 = the
    earliest) the result lists them (`jobs`) and analyses none. `same_job`: the files are one job
    whatever their trace formats and recording dates say (else formats years apart, or recordings
    over a day apart, make them different jobs). Returns the analysis before its report
    (`analyze` gives the report): what the other pipelines read."""
    values = resolved_arguments(thresholds, job)
    dumps: list[Path] = []
    ranks, problems, chosen = map_summaries(inputs, cache_dir, use_cache, engine, workers, on_progress, address,
                                            fr_dumps=dumps)
    return with_nccl_logs(job_analysis(ranks, problems, chosen, values, job=job, fr_dumps=dumps,
                                       workers=workers, same_job=same_job), nccl_logs, values)


def resolved_arguments(thresholds: dict[str, float] | None, job: int | None) -> Thresholds:
    """The thresholds in force, once `thresholds` and `job` are checked (ArgumentError before any
    file is read)."""
    from rankscope.thresholds import resolve
    with checking_arguments():
        values = resolve(thresholds)
        if job is not None and job < 1:
            raise ValueError(f"job {job}: jobs are numbered from 1")
    return values


def analyze(inputs: str | Path | list[str | Path], cache_dir: str | Path | None = None, use_cache: bool = True,
            engine: str = "auto", workers: int | None = None,
            on_progress: Callable[[int, int, str], None] | None = None, address: str | None = None,
            thresholds: dict[str, float] | None = None, nccl_logs: list[str | Path] | None = None,
            job: int | None = None, same_job: bool = False) -> Analysis:
    """The report of `analyze_job` (same arguments)."""
    return to_report(analyze_job(inputs, cache_dir, use_cache, engine, workers, on_progress, address, thresholds,
                                 nccl_logs, job, same_job))


def map_summaries(inputs: str | Path | list[str | Path] | Discovered, cache_dir: str | Path | None, use_cache: bool,
                  engine: str, workers: int | None, on_progress: Callable[[int, int, str], None] | None,
                  address: str | None, fr_dumps: list[Path] | None = None
                  ) -> tuple[list[MappedRank], list[InputProblem], str]:
    """The per-rank map of `analyze`: every file's summary (and collectives), the input problems, the
    engine used (`fr_dumps`: receives the Flight Recorder dumps found)."""
    strings: dict[str, str] = {}

    def arrived(result: MappedRank | InputProblem) -> None:
        _import_reduce()
        _arrived(result, strings)

    summaries, problems, chosen = _map_files(inputs, _rank_task, cache_dir, use_cache, engine, workers,
                                             on_progress, address, arrived, keep_memory=True, fr_dumps=fr_dumps)
    _trim_heap(chosen)
    return summaries, problems, chosen


def job_analysis(ranks: list[MappedRank], problems: list[InputProblem], chosen: str, values: Thresholds,
                 job: int | None = None, fr_dumps: list[Path] | None = None, workers: int | None = None,
                 same_job: bool = False) -> JobAnalysis:
    """The job of these mapped ranks: the job picked (`job`, when the files hold several), ranks
    assigned, the cross-rank reduce (which uses up their collectives), the Flight Recorder dumps'
    verdict, the findings. `same_job`: see `different_jobs`."""
    from rankscope.findings import evaluate as evaluate_findings
    ranks, found, picked = _one_job(ranks, job)
    if picked is None:
        return JobAnalysis(job=_job_info([], []), summaries=[], problems=problems, engine=chosen, jobs=found)
    kept_metas, rank_warnings, rank_problems = _assign([m.summary.meta for m in ranks], same_job)
    rank_warnings += picked
    by_file = {rank_input(m.summary.meta): m for m in ranks}
    kept_ranks = [by_file[rank_input(meta)] for meta in kept_metas]
    kept = [m.summary for m in kept_ranks]
    problems = problems + rank_problems
    cross, table = _cross_rank(kept_ranks, values)
    del kept_ranks, ranks, by_file              # their collectives: what the reduce made of them is `cross`
    refused = [str(p) for p in problems if p.fatal and p.problem.startswith(NOT_A_CAPTURE)]
    hang = None
    if fr_dumps:                     # Flight Recorder dumps, beside the traces or alone: the hang verdict
        from rankscope.pipelines.hang import analyze_hang
        hang, hang_problems = analyze_hang(fr_dumps, kept, cross, chosen, workers)
        problems += hang_problems
    info = _job_info(kept, rank_warnings, refused)
    return JobAnalysis(job=info, summaries=kept, cross=cross, table=table, problems=problems, engine=chosen,
                       findings=_noted_partial(evaluate_findings(kept, cross, info, hang, values), info),
                       hang=hang, jobs=found)


def with_nccl_logs(result: JobAnalysis, nccl_logs: list[str | Path] | None, values: Thresholds) -> JobAnalysis:
    """`result` with the findings and problems of the job's NCCL logs (none: as it is)."""
    if not nccl_logs:
        return result
    from rankscope.findings import ordered
    from rankscope.pipelines.inputs import analyze_nccl_logs
    logs = analyze_nccl_logs(nccl_logs, values)
    return dataclasses.replace(result, findings=ordered(result.findings + logs.findings),
                               problems=result.problems + logs.problems)


def _one_job(ranks: list[MappedRank], job: int | None
             ) -> tuple[list[MappedRank], list[FoundJob], list[str] | None]:
    """The ranks of the job to analyse, the jobs found (none when the inputs are one job), and the
    warning saying which was picked; None instead of it when the inputs hold several jobs and `job`
    picks none of them."""
    from rankscope.ingest.jobs import layout_sizes, span_utc, split_jobs
    jobs = split_jobs([m.summary.meta for m in ranks])
    if len(jobs) == 1 and job in (None, 1):
        return ranks, [], []
    found = []
    for i, ms in enumerate(jobs, start=1):
        start, end = span_utc(ms) or (None, None)
        found.append(FoundJob(job=i, world_size=ms[0].world_size,
                              ranks=sorted({m.dist_rank for m in ms if m.dist_rank is not None}),
                              files=sorted({m.file for m in ms}), group_sizes=list(layout_sizes(ms[0])),
                              start_utc=start, end_utc=end))
    if job is None or job > len(jobs):
        return [], found, None
    keep = {rank_input(m) for m in jobs[job - 1]}
    return ([m for m in ranks if rank_input(m.summary.meta) in keep], found,
            [f"the inputs hold {len(jobs)} jobs: job {job} analysed (--job {job}), the files of the others are not"])


def rank_input(m: RankMeta) -> str:
    """What a rank was read from: its file, and its process where the file holds several ranks."""
    return m.file if m.process is None else f"{m.file} (pid {m.process})"


def _noted_partial(findings: list[Finding], job: JobInfo) -> list[Finding]:
    """Findings drawn from partial data say so (docs/concepts.md "Capture quality"): with ranks missing,
    every finding (`evidence["ranks_present"]`, "2 of 128 ranks present" after its summary); those whose
    ranks include a partial rank (a finding of no rank is the whole job's), or every finding when the
    files look like different jobs, get `evidence["partial_input"]` (those ranks) and a note after their
    summary. Each finding is made again with its note, before anything reads it."""
    capture = job.capture
    if capture is None or not (capture.coverage or capture.partial):
        return findings
    from rankscope.analyses.job.capture import partial_input_ranks, ranks_text
    out = []
    for f in findings:
        evidence, summary = dict(f.evidence), f.summary
        if capture.coverage:                       # ranks missing: every verdict is of the ranks present
            evidence["ranks_present"] = capture.coverage
            summary += f" ({capture.coverage}: drawn from those)"
        partial = partial_input_ranks(capture, f.ranks) if capture.partial else []
        if partial:
            evidence["partial_input"] = partial
            summary += f" (from partial data: {ranks_text(partial)})"
        out.append(msgspec.structs.replace(f, evidence=evidence, summary=summary))
    return out


def _cross_rank(ranks: list[MappedRank], thresholds: Thresholds
                ) -> tuple[JobResult | None, CollectiveTable | None]:
    """The cross-rank reduce over the ranks' collectives (each under the rank its summary was
    assigned); `thresholds` decide its verdicts."""
    from rankscope.analyses.job.reduce import reduce_job
    collectives = [msgspec.structs.replace(m.collectives, rank=m.summary.rank) for m in ranks
                   if m.collectives is not None]
    return reduce_job(collectives, thresholds) if collectives else (None, None)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _coverage(metas: list[RankMeta]) -> tuple[int | None, list[int], list[str]]:
    """World size, missing ranks and the warnings about them."""
    warnings = []
    world_sizes = {m.world_size for m in metas if m.world_size}
    world = max(world_sizes) if world_sizes else (len(metas) or None)
    present = {m.rank for m in metas}
    inside = sorted(r for r in present if 0 <= r < (world or 0))     # from the gaps: no range(world) built
    missing = [r for a, b in zip([-1] + inside, inside + [world or 0]) for r in range(a + 1, b)]
    if missing and metas:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        warnings.append(f"{len(present)} of {world} ranks present; missing: {shown}")
    return world, missing, warnings


def _devices(ranks: list[RankSummary]) -> list[str]:
    """The job's device models from the traces' deviceProperties; ranks with device events but no
    deviceProperties add one entry named from the events themselves (the device ids their
    kernels, copies and sets ran on). Empty only for a job without device events."""
    names = {d.get("name") for r in ranks for d in r.meta.devices if isinstance(d.get("name"), str)}
    kinds = sorted({device_name(r.meta.device_kind) for r in ranks if r.has_device})
    unnamed = [r for r in ranks if r.has_device
               and not any(isinstance(d.get("name"), str) for d in r.meta.devices)]
    out = sorted(n for n in names if n)
    if unnamed:
        ids = sorted({st.device for r in unnamed if r.hta is not None for st in r.hta.idle.streams})
        if not ids:
            which = ""
        elif len(ids) == 1:
            which = f"device {ids[0]}, "
        elif ids == list(range(ids[0], ids[-1] + 1)):
            which = f"devices {ids[0]}..{ids[-1]}, "
        else:
            which = f"devices {', '.join(map(str, ids))}, "
        out.append(f"{'/'.join(kinds) or 'GPU'} ({which}no deviceProperties in the trace)")
    return out


def _job_info(ranks: list[RankSummary], warnings: list[str], refused: Sequence[str] = ()) -> JobInfo:
    world, missing, coverage = _coverage([r.meta for r in ranks])
    warnings = list(warnings) + coverage
    rank_ids = [r.rank for r in ranks]
    backends = sorted({r.meta.backend for r in ranks if r.meta.backend})
    steps = sorted({s.step for r in ranks for s in r.steps if r.steps_source == "profiler_step"})
    sources = {r.steps_source for r in ranks}
    if "whole_trace" in sources:
        n = sum(r.steps_source == "whole_trace" for r in ranks)
        warnings.append(f"{n} rank(s) have no ProfilerStep marks: each is analysed as one step spanning its trace")
    devices = _devices(ranks)
    spans = [r.meta.span_ns for r in ranks if r.meta.span_ns]
    span_ms = max((b - a) for a, b in spans) / 1e6 if spans else None
    from rankscope.analyses.job.capture import job_capture, launches_not_captured
    launched = [r for r in ranks if not r.has_device and r.kernel_launches]      # CUPTI activity lost: no CPU job
    if launched:
        warnings.append(launches_not_captured(sum(r.kernel_launches for r in launched),
                                              None if len(launched) == len(ranks) else [r.rank for r in launched]))
    no_device = [r.rank for r in ranks if not r.has_device and not r.kernel_launches
                 and not r.meta.device_other_events]
    if no_device and len(no_device) < len(ranks):
        warnings.append(f"no GPU events on rank(s) {', '.join(map(str, no_device))}")
    elif ranks and len(no_device) == len(ranks):
        warnings.append("no GPU events in any rank: CPU-only job (host ops play the device's role)")
    return JobInfo(
        world_size=world, ranks=rank_ids, backend=backends[0] if len(backends) == 1 else (", ".join(backends) or None),
        steps=steps, devices=devices, warnings=warnings, missing_ranks=missing,
        steps_source=_steps_source(sources),
        span_ms=rounded(span_ms, 3), hosts=sorted({r.meta.hostname for r in ranks if r.meta.hostname}),
        capture=job_capture(ranks, warnings, refused, (len(ranks), world) if missing and world else None),
    )


def _steps_source(sources: set[str]) -> Literal["profiler_step", "whole_trace", "mixed", "none"]:
    """Where the ranks' steps come from: all from ProfilerStep marks, all one step per trace, mixed, none."""
    if not sources:
        return "none"
    if len(sources) > 1:
        return "mixed"
    return "whole_trace" if sources == {"whole_trace"} else "profiler_step"


# ----------------------------------------------------------------------------------------------
@dataclass
class Job:
    """Lazy access to a job's ranks for notebooks: frames are parsed (or read from the cache)
    one rank at a time, on demand."""
    files: dict[int, str]
    cache: Cache | None
    warnings: list[str]

    def rank(self, rank: int) -> RankTrace:
        trace, _ = load_rank(self.files[rank], self.cache)
        trace.meta.rank = rank
        return trace

    def __iter__(self) -> Iterator[RankTrace]:
        return (self.rank(r) for r in sorted(self.files))

    def __len__(self) -> int:
        return len(self.files)


def load(inputs: str | Path | list[str | Path], cache_dir: str | Path | None = None, use_cache: bool = True,
         engine: str = "auto") -> Job:
    """Read a job's trace files (in parallel, into the cache) and assign ranks, without analysing
    them; `job.rank(r)` then returns a rank's frames (from the cache when it is on)."""
    found = ingest(inputs, cache_dir=cache_dir, use_cache=use_cache, engine=engine)
    cache = Cache(cache_dir) if use_cache else None
    return Job(files={m.rank: m.file for m in found.ranks}, cache=cache,
               warnings=found.warnings + [str(p) for p in found.problems])
