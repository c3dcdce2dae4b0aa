"""Which files are traces, and which rank each one is.

Rank, in order of trust: `distributedInfo.rank` in the trace, then the file name (`rank-3`,
`rank3`, `worker3`, `_rank_3`), else the position in the sorted file list (with a warning).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".sqlite3")    # Kineto JSON; nsys SQLite export
#: JSON files that sit beside traces and are known not to be traces (not reported).
NOT_TRACES = {"ground_truth.json"}
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.IGNORECASE)


@dataclass(frozen=True)
class Discovered:
    traces: list[Path]
    ignored: list[tuple[Path, str]]     # (file, why) for files in the folder that are not traces


def is_trace_name(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(TRACE_SUFFIXES) and name not in NOT_TRACES


def discover(inputs: list[str | Path]) -> Discovered:
    """Expand files and folders into trace files. A folder is searched at its top level first;
    if it holds no trace there, recursively (tensorboard_trace_handler writes one folder)."""
    traces: list[Path] = []
    ignored: list[tuple[Path, str]] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file())
            found = [f for f in files if is_trace_name(f)]
            if not found:
                files = sorted(f for f in p.rglob("*") if f.is_file())
                found = [f for f in files if is_trace_name(f)]
            traces.extend(found)
            ignored.extend((f, "not a trace file (expected *.json, *.json.gz or *.sqlite)") for f in files
                           if not is_trace_name(f) and not f.name.startswith(".") and f.name not in NOT_TRACES)
        elif p.is_file():
            traces.append(p)
        else:
            ignored.append((p, "no such file or folder"))
    unique = list(dict.fromkeys(t.resolve() for t in traces))
    return Discovered(traces=unique, ignored=ignored)


def rank_from_filename(path: str | Path) -> int | None:
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class RankAssignment:
    file: str
    rank: int
    source: str          # "distributedInfo" | "filename" | "order"


def assign_ranks(files: list[str], header_ranks: list[int | None], complete: list[bool] | None = None
                 ) -> tuple[list[RankAssignment], list[str], list[tuple[str, str]]]:
    """Decide each file's rank. Returns (assignments for the files kept, warnings, (file, why)
    for files skipped because another file already claims their rank). `header_ranks[i]` is
    distributedInfo.rank of files[i] or None; `complete[i]` False for a salvaged (cut) file:
    between two files claiming one rank, a complete one is kept over a salvaged one, else the
    first by name."""
    warnings: list[str] = []
    proposed: list[tuple[str, int | None, str]] = []
    for f, hr in zip(files, header_ranks):
        if hr is not None:
            proposed.append((f, hr, "distributedInfo"))
        else:
            fr = rank_from_filename(f)
            proposed.append((f, fr, "filename") if fr is not None else (f, None, "order"))
    taken = {r for _, r, _ in proposed if r is not None}
    next_free = 0
    result: list[RankAssignment] = []
    by_order = [f for f, r, _ in proposed if r is None]
    for f, r, src in proposed:
        if r is None:
            while next_free in taken:
                next_free += 1
            r = next_free
            taken.add(r)
        result.append(RankAssignment(f, r, src))
    if by_order and len(files) > 1:
        warnings.append(f"rank unknown for {len(by_order)} file(s) (no distributedInfo, no rank in the "
                        f"name); numbered by file order: "
                        + ", ".join(f"{Path(a.file).name} -> {a.rank}" for a in result if a.source == "order"))
    is_complete = dict(zip(files, complete if complete is not None else [True] * len(files)))
    order = sorted(result, key=lambda a: (a.rank, not is_complete[a.file], a.file))
    seen: dict[int, RankAssignment] = {}
    kept: list[RankAssignment] = []
    skipped: list[tuple[str, str]] = []
    for a in order:
        if a.rank in seen:
            why = "keeping the complete one" if is_complete[seen[a.rank].file] and not is_complete[a.file] \
                else "keeping the first by name"
            skipped.append((a.file, f"claims rank {a.rank} ({a.source}) like {Path(seen[a.rank].file).name}; "
                                    f"skipped, {why}"))
            continue
        seen[a.rank] = a
        kept.append(a)
    return kept, warnings, skipped
