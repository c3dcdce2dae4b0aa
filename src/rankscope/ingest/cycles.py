"""Profiler cycles: a schedule with `repeat` (`schedule(wait, warmup, active, repeat=N)` +
`tensorboard_trace_handler`) writes one file per rank per cycle, `<worker>.<timestamp>.pt.trace.json`.

`group_cycles` groups the files of a job into its cycles by the traces' own step numbers (steps keep the
profiler's numbers across the run: cycle 1 holds steps 2-3, cycle 2 steps 6-7, ...): files that share
a ProfilerStep number are one cycle; files without step marks are one cycle when their time spans
overlap (or overlap a cycle's marked files: a file cut before its first step mark). Within a cycle each
rank has one file; two files of one rank in one cycle claim the same rank
for the same steps (the rank assignment names them). `cycles_in_names` says, from the names alone,
whether a folder looks like several cycles (so that the per-rank work keeps summaries out of memory).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rankscope.ingest.discover import rank_from_filename

#: `<worker>.<timestamp>.pt.trace.json[.gz]`, the name tensorboard_trace_handler writes.
_HANDLER_NAME = re.compile(r"^(?P<worker>.+)\.(?P<ts>\d+)\.pt\.trace\.json(?:\.gz)?$", re.IGNORECASE)


@dataclass(frozen=True)
class CycleFile:
    """What grouping needs of one trace file."""
    file: str
    steps: tuple[int, ...]                  # its ProfilerStep numbers (empty: no step marks)
    span_ns: tuple[int, int] | None         # its first and last timestamp
    rank: int | None = None                 # the rank the trace (or else its name) gives
    world_size: int | None = None           # the world size the trace gives


def cycles_in_names(paths: list[Path]) -> bool:
    """Whether two file names give the same worker (tensorboard_trace_handler's `<worker>.<ts>` with one
    worker twice) or the same rank (`rank3` twice): the look of a run of several cycles."""
    workers: set[str] = set()
    ranks: set[int] = set()
    for p in paths:
        m = _HANDLER_NAME.match(p.name)
        worker = m.group("worker") if m else None
        rank = rank_from_filename(p)
        if (worker is not None and worker in workers) or (rank is not None and rank in ranks):
            return True
        if worker is not None:
            workers.add(worker)
        if rank is not None:
            ranks.add(rank)
    return False


def group_cycles(files: list[CycleFile]) -> list[list[str]]:
    """The files of each cycle, cycles in step order (then time order), files in name order."""
    parent = list(range(len(files)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_with_step: dict[int, int] = {}
    for i, f in enumerate(files):
        for s in f.steps:
            j = first_with_step.setdefault(s, i)
            parent[root(i)] = root(j)
    marked = [(i, f.span_ns) for i, f in enumerate(files) if f.steps and f.span_ns]
    unmarked = sorted((i for i, f in enumerate(files) if not f.steps), key=lambda i: _start(files[i]))
    end = None
    for prev, i in zip([None, *unmarked], unmarked):
        span = files[i].span_ns
        over = next((j for j, other in marked if span and _overlap(span, other)), None)
        if over is not None:                # a file whose step marks were lost (cut short) joins its time's cycle
            parent[root(i)] = root(over)
        elif prev is not None and span is not None and end is not None and span[0] <= end:
            parent[root(i)] = root(prev)    # files without steps whose spans overlap (swept in start order)
        end = max(end or 0, span[1]) if span is not None else end
    groups: dict[int, list[int]] = {}
    for i in range(len(files)):
        groups.setdefault(root(i), []).append(i)

    def order(members: list[int]) -> tuple[float, int]:
        steps = [s for i in members for s in files[i].steps]
        starts = [_start(files[i]) for i in members if files[i].span_ns]
        return (min(steps) if steps else float("inf"), min(starts, default=0))

    return [sorted(files[i].file for i in members) for members in sorted(groups.values(), key=order)]


def run_cycles(files: list[CycleFile]) -> list[list[str]]:
    """`group_cycles`, when they look like the cycles of one run: some rank has files in two of them, the
    traces give one world size, and the cycles in step order are in time order too. Else every file in
    one job (files of different jobs are then said as such, and a rank claimed twice is named)."""
    groups = group_cycles(files)
    by_file = {f.file: f for f in files}
    seen: dict[int, int] = {}
    repeated = False
    for g, members in enumerate(groups):
        for name in members:
            r = by_file[name].rank
            repeated |= r is not None and seen.setdefault(r, g) != g
    worlds = {f.world_size for f in files if f.world_size}
    starts = [min((_start(by_file[n]) for n in members if by_file[n].span_ns), default=0) for members in groups]
    if repeated and len(worlds) <= 1 and starts == sorted(starts):
        return groups
    return [sorted(by_file)] if files else []


def _start(f: CycleFile) -> int:
    return f.span_ns[0] if f.span_ns else 0


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]
