"""The jobs found in inputs that hold several: one line each (`analyze` without `--job`)."""
from __future__ import annotations

from pathlib import Path

from rankscope.numbers import ranges
from rankscope.results.jobs import FoundJob

_NAMES_SHOWN = 3


def job_line(j: FoundJob) -> str:
    """`job 2: world size 8, ranks 2-3 (2 files: a.json, b.json), process groups of 2 ranks, <time>`."""
    names = ", ".join(Path(f).name for f in j.files[:_NAMES_SHOWN]) + (
        f" and {len(j.files) - _NAMES_SHOWN} more" if len(j.files) > _NAMES_SHOWN else "")
    groups = f", process groups of {'/'.join(map(str, j.group_sizes))} ranks" if j.group_sizes else ""
    when = f", {j.start_utc} to {j.end_utc} UTC" if j.start_utc else ""
    ranks = f"{'rank' if len(j.ranks) == 1 else 'ranks'} {ranges(j.ranks)}" if j.ranks else "ranks unknown"
    return (f"job {j.job}: world size {j.world_size}, {ranks} ({len(j.files)} file{'s' if len(j.files) != 1 else ''}: "
            f"{names}){groups}{when}")
