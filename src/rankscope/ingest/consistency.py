"""Files that cannot be one job: they disagree on the world size, the device models, a process
group's layout (pg_config), their trace formats are years apart (the 2021 Kineto format beside the
current one: two PyTorch versions), they were recorded over a day apart, or their time ranges do
not overlap on the epoch clock. The user may say that the files are one job all the same
(`same_job`): formats and dates then only note how they were recorded.

A pure function of the ranks' metadata; the job is still analysed, with these as warnings.
"""
from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from rankscope.model import RankMeta

#: Clock skew allowed between hosts before two time ranges count as not overlapping.
CLOCK_SKEW_NS = 5 * 10**9
#: Epoch times outside these years are no wall-clock time (traces timed from another zero).
_EPOCH_RANGE_NS = (946_684_800 * 10**9, 4_102_444_800 * 10**9)    # 2000-01-01 .. 2100-01-01 UTC
#: The ranks of one job are profiled together: recordings further apart than this are different jobs.
MAX_APART_NS = 86_400 * 10**9
#: Trace formats of different PyTorch eras (a job runs one version on every rank).
FORMAT_ERAS = {"kineto-2021": "the 2021 Kineto format (categories Operator, Kernel, Runtime)",
               "kineto": "the current Kineto format"}
_NAMES_SHOWN = 3
_PREFIX = "these files look like different jobs: "
RECORDED_APART = "recorded over a day apart"


def different_jobs(metas: list[RankMeta], same_job: bool = False) -> list[str]:
    """One warning per way in which `metas` cannot come from one job (none when they can). With
    `same_job` (the user says they are one job), formats and recording dates apart are no reason."""
    warnings = []
    eras = _split(metas, lambda m: FORMAT_ERAS.get(m.format))
    if len(eras) > 1 and not same_job:
        warnings.append(_PREFIX + "trace formats years apart: " + _listing(eras))
    world = _split(metas, lambda m: m.world_size)
    if len(world) > 1:
        warnings.append(_PREFIX + "world size " + _listing(world))
    models = _split(metas, lambda m: ", ".join(sorted({d["name"] for d in m.devices if isinstance(d.get("name"), str)}))
                    or None)
    if len(models) > 1:
        warnings.append(_PREFIX + "devices " + _listing(models))
    group = _pg_conflict(metas)
    if group:
        warnings.append(_PREFIX + group)
    times, spread_ns = _apart_in_time(metas)
    if len(times) > 1:
        days = f" ({spread_ns / 86_400e9:,.0f} days)" if spread_ns > MAX_APART_NS and not same_job else None
        warnings.append(_PREFIX + (f"{RECORDED_APART}{days}: " if days else "time ranges that do not overlap: ")
                        + _listing(times))
    return warnings


def _split(metas: list[RankMeta], key) -> dict[object, list[str]]:
    """Files by `key(meta)`, in order of first appearance; files whose key is None left out."""
    out: dict[object, list[str]] = {}
    for m in metas:
        k = key(m)
        if k is not None:
            out.setdefault(k, []).append(m.file)
    return out


def _listing(groups: Mapping[Any, list[str]]) -> str:
    return "; ".join(f"{key} in {_names(files)}" for key, files in groups.items())


def _names(files: list[str]) -> str:
    shown = ", ".join(Path(f).name for f in files[:_NAMES_SHOWN])
    return shown + (f" and {len(files) - _NAMES_SHOWN} more" if len(files) > _NAMES_SHOWN else "")


def _pg_conflict(metas: list[RankMeta]) -> str | None:
    """The first process group (by name) that two files describe differently (size or ranks)."""
    layouts: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for m in metas:
        for pg in m.pg_config:
            if isinstance(pg, dict) and "pg_name" in pg:
                layout = f"size {pg.get('pg_size')}, ranks {json.dumps(pg.get('ranks'))[:60]}"
                layouts[str(pg["pg_name"])].setdefault(layout, []).append(m.file)
    for name, seen in layouts.items():
        if len(seen) > 1:
            return f"process group {name!r} has " + _listing(seen)
    return None


def _apart_in_time(metas: list[RankMeta]) -> tuple[dict[str, list[str]], int]:
    """Files by run of overlapping epoch time ranges (`CLOCK_SKEW_NS` apart at most): one run
    when they overlap; and the time from the first run's end to the last run's start. Files without
    a wall-clock time range are left out."""
    ranges = []
    for m in metas:
        if m.span_ns is not None:
            start, end = (t + (m.base_time_ns or 0) for t in m.span_ns)
            if _EPOCH_RANGE_NS[0] <= start <= _EPOCH_RANGE_NS[1]:
                ranges.append((start, end, m.file))
    runs: list[list] = []
    for start, end, file in sorted(ranges):
        if runs and start <= runs[-1][1] + CLOCK_SKEW_NS:
            runs[-1][1] = max(runs[-1][1], end)
            runs[-1][2].append(file)
        else:
            runs.append([start, end, [file]])
    spread = runs[-1][0] - runs[0][1] if len(runs) > 1 else 0
    return {f"{_clock(a)} to {_clock(b)} UTC": sorted(files) for a, b, files in runs}, spread


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
