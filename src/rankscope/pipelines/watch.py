"""`rankscope watch DIR`: follow a running job's profiler folder, analysing each cycle as its files land
(docs/runs.md "Watching a running job").

Each `poll()` lists the folder, reads the files that are complete (`ready`), groups every file read so
far into cycles (`ingest/cycles.py`), and analyses in step order each cycle whose files are all there:
a file for every rank of the world size the traces give, or, after `settle_s` seconds without a new file
of that cycle, the ranks that came (the missing ones named). A file is complete when its size and
modification time have not changed for `stable_s` seconds, or sooner when it is plain JSON whose text
closes (the events list and the document end) and it did not change since the previous poll: a file
still being written is not read. A file that vanishes or is cut short is an input problem of its cycle,
not a crash; a file of a cycle already analysed is named and left out.

The run's state is what `pipelines/run.RunAnalysis` keeps (per-cycle facts and the latest analysis);
`result()` is the run report at any time.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rankscope import engine as engines
from rankscope.ingest.cycles import CycleFile, group_cycles
from rankscope.ingest.discover import discover, open_regular
from rankscope.model import InputProblem
from rankscope.pipelines.job import _Task
from rankscope.pipelines.report import JobAnalysis, to_report
from rankscope.pipelines.run import RunAnalysis, key_task, summary_again
from rankscope.results.run import WatchStatus

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results import Analysis
    from rankscope.thresholds import Thresholds

#: How much of a file's end is read to see whether its JSON closes.
TAIL_BYTES = 4096
#: The end of a Kineto JSON document: the events list closed, then top-level "key": value pairs, then "}".
_CLOSED = re.compile(rb'\]\s*,\s*"[^"\\]*"\s*:[^\[\]{}]*\}\s*$')


def json_closes(path: str) -> bool:
    """Whether plain JSON text at `path` ends as a whole Kineto document ends (gzip: never judged)."""
    if path.lower().endswith(".gz"):
        return False
    try:
        with open_regular(path) as f:          # a FIFO is never waited on
            f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
            return _CLOSED.search(f.read()) is not None
    except OSError:
        return False


@dataclass
class _Seen:
    size: int
    mtime_ns: int
    changed_at: float              # when size or mtime last changed (monotonic seconds)


@dataclass
class CycleDone:
    """One analysed cycle: its analysis, and the run report after it."""
    analysis: JobAnalysis
    report: Analysis
    files: tuple[str, ...]


class RunWatch:
    """The state of `rankscope watch` over one folder."""

    def __init__(self, folder: str | Path, thresholds: Thresholds, cache_dir: str | None = None,
                 use_cache: bool = True, engine: str = "auto", workers: int | None = None,
                 settle_s: float = 30.0, stable_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.folder, self.cache_dir, self.use_cache = str(folder), cache_dir, use_cache
        self.engine, self.workers, self.settle_s, self.stable_s, self.clock = engine, workers, settle_s, stable_s, clock
        self.spill = None if use_cache else tempfile.mkdtemp(prefix="rankscope-watch-")
        self.run = RunAnalysis(thresholds, engine)
        self.seen: dict[str, _Seen] = {}
        self.keys: dict[str, CycleFile] = {}           # files read, by path
        self.read_at: dict[str, float] = {}           # when each file was read (unreadable ones too)
        self.done_files: set[str] = set()               # files of analysed cycles, and late ones
        self.last_new_file_at = clock()

    def close(self) -> None:
        if self.spill is not None:
            shutil.rmtree(self.spill, ignore_errors=True)

    def poll(self, flush: bool = False) -> list[CycleDone]:
        """Look at the folder once; analyse the cycles that are complete (`flush`: every cycle waiting)."""
        now = self.clock()
        self._read(self._ready(now), now)
        return self._analyse(now, flush)

    def _ready(self, now: float) -> list[str]:
        """The new files that are complete."""
        found = discover([self.folder])
        present = set()
        ready = []
        for p in map(str, found.traces):
            present.add(p)
            if p in self.read_at:
                continue
            try:
                st = os.stat(p)
            except OSError:
                continue                    # gone between the listing and now: as if never seen
            seen = self.seen.get(p)
            if seen is None or (st.st_size, st.st_mtime_ns) != (seen.size, seen.mtime_ns):
                self.seen[p] = _Seen(st.st_size, st.st_mtime_ns, now)
                self.last_new_file_at = now
                continue
            if now - seen.changed_at >= self.stable_s or json_closes(p):
                ready.append(p)
        for p in set(self.seen) - present:
            del self.seen[p]                # vanished before it was read
        return ready

    def _read(self, files: list[str], now: float) -> None:
        if not files:
            return
        workers = self.workers or engines.default_workers()
        chosen = engines.choose_engine(self.engine, sum(self.seen[f].size for f in files), len(files), workers)
        tasks = [_Task(f, self.cache_dir, self.use_cache, self.spill) for f in files]
        for f, r in zip(files, engines.map_ranks(key_task, tasks, engine=chosen, workers=workers)):
            self.read_at[f] = now
            if isinstance(r, CycleFile):
                self.keys[f] = r
            else:                           # unreadable: named once, in no cycle
                self.run.problems.append(r)

    def _cycles(self) -> list[list[str]]:
        """The cycles not analysed yet, in step order. A file that joins an analysed cycle is named and
        left out."""
        waiting = []
        for files in group_cycles(list(self.keys.values())):
            if any(f in self.done_files for f in files):
                for f in files:
                    if f not in self.done_files:
                        self.done_files.add(f)
                        self.run.problems.append(InputProblem(f, "arrived after its cycle was analysed: not used"))
            else:
                waiting.append(files)
        return waiting

    def _complete(self, files: list[str], now: float) -> bool:
        """All ranks of the world size there, or no new file for settle_s seconds."""
        keys = [self.keys[f] for f in files]
        world = max((k.world_size for k in keys if k.world_size), default=None)
        ranks = {k.rank for k in keys if k.rank is not None}
        return (world is not None and len(ranks) >= world) or now - max(self.read_at[f] for f in files) >= self.settle_s

    def _analyse(self, now: float, flush: bool) -> list[CycleDone]:
        done = []
        for files in self._cycles():
            if not (flush or self._complete(files, now)):
                continue
            analysis = self.run.add([summary_again(_Task(f, self.cache_dir, self.use_cache, self.spill))
                                     for f in files])
            self.done_files.update(files)
            after = self.run.result()
            if after is not None and analysis.usable:
                done.append(CycleDone(analysis, to_report(after), tuple(files)))
        return done

    def idle_s(self) -> float:
        """Seconds since a trace file last appeared or changed."""
        return self.clock() - self.last_new_file_at

    def result(self) -> Analysis | None:
        """The run report so far (None before a usable cycle)."""
        after = self.run.result()
        return to_report(after) if after is not None else None

    def status(self) -> WatchStatus:
        return WatchStatus(folder=self.folder, files_seen=len(set(self.seen) | set(self.keys)),
                           files_read=len(self.keys), cycles_analysed=len(self.run.facts),
                           cycles_waiting=[sorted({s for f in files for s in self.keys[f].steps})
                                           for files in self._cycles()],
                           idle_s=round(self.idle_s(), 1), settle_s=self.settle_s)
