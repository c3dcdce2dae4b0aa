"""Which job each file belongs to, when one folder holds several (docs/concepts.md "Capture
quality": several jobs in one folder).

Files are of different jobs when they disagree on the world size or on the sizes of their
process groups (the layout), or when their time ranges on the epoch clock are apart (over
`consistency.CLOCK_SKEW_NS`) and no rank's process (host pid) is the same in both: the cycles of a
profiler schedule with `repeat` are one job's files, apart in time but written by the same
processes. A pure function of the ranks' metadata; files that do not say (no world size, no
wall-clock time) join the one job they can, and when they could join several, nothing is split.
"""
from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timezone

from rankscope.ingest.consistency import CLOCK_SKEW_NS, _EPOCH_RANGE_NS
from rankscope.model import RankMeta

#: Process ids at or below this are device indices in Kineto traces (pid = device), not processes.
_MAX_DEVICE_PID = 64


def split_jobs(metas: list[RankMeta]) -> list[list[RankMeta]]:
    """The files' jobs, earliest first; one list (all of them) when they are one job."""
    if len(metas) < 2 or any(m.world_size is None for m in metas):
        return [list(metas)]
    by_shape: dict[tuple, list[RankMeta]] = defaultdict(list)
    for m in metas:
        by_shape[(m.world_size, layout_sizes(m))].append(m)
    jobs = [job for group in by_shape.values() for job in _apart_in_time(group)]
    return sorted(jobs, key=lambda ms: (min((_start(m) for m in ms), default=0), ms[0].file))


def span_utc(metas: list[RankMeta]) -> tuple[str, str] | None:
    """The files' wall-clock time range (UTC, to the second); None when no file gives one."""
    timed = [m for m in metas if _wall(m)]
    if not timed:
        return None
    return _clock(min(_start(m) for m in timed)), _clock(max(_end(m) for m in timed))


def layout_sizes(m: RankMeta) -> tuple[int, ...]:
    """The sizes of the rank's process groups other than the world (the shape of its layout)."""
    sizes = {pg.get("pg_size") for pg in m.pg_config if isinstance(pg, dict)}
    return tuple(sorted(s for s in sizes if isinstance(s, int) and 1 < s != m.world_size))


def _wall(m: RankMeta) -> bool:
    return m.span_ns is not None and _EPOCH_RANGE_NS[0] <= _start(m) <= _EPOCH_RANGE_NS[1]


def _start(m: RankMeta) -> int:
    return m.span_ns[0] + (m.base_time_ns or 0) if m.span_ns else 0


def _end(m: RankMeta) -> int:
    return m.span_ns[1] + (m.base_time_ns or 0) if m.span_ns else 0


def _pids(m: RankMeta) -> set[int]:
    """The host processes the trace names (thread and process name metadata)."""
    keys = list(m.process_names) + [k.split("/")[0] for k in m.thread_names]
    return {int(k) for k in keys if k.lstrip("-").isdigit() and int(k) > _MAX_DEVICE_PID}


def _apart_in_time(metas: list[RankMeta]) -> list[list[RankMeta]]:
    """Runs of overlapping wall-clock time ranges; runs that share a host process are one job (the
    cycles of a schedule). Files without wall-clock time join the only run, else nothing is split."""
    timed = sorted((m for m in metas if _wall(m)), key=_start)
    runs: list[list] = []                      # [end, [metas]]
    for m in timed:
        end = _end(m)
        if runs and _start(m) <= runs[-1][0] + CLOCK_SKEW_NS:
            runs[-1][0] = max(runs[-1][0], end)
            runs[-1][1].append(m)
        else:
            runs.append([end, [m]])
    jobs: list[list[RankMeta]] = []
    for _, ms in runs:
        pids = set().union(*(_pids(m) for m in ms))
        same = next((j for j in jobs if pids & set().union(*(_pids(m) for m in j))), None)
        if same is not None:
            same.extend(ms)
        else:
            jobs.append(list(ms))
    untimed = [m for m in metas if not _wall(m)]
    if untimed and len(jobs) > 1:
        return [list(metas)]
    if untimed:
        jobs = [(jobs[0] if jobs else []) + untimed]
    return jobs


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
