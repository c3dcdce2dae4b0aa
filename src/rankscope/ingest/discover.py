"""Which files are traces, and which rank each one is.

Rank, in order of trust: `distributedInfo.rank` in the trace, then the file name (`rank-3`,
`rank3`, `worker3`, `_rank_3`), else the position in the sorted file list (with a warning).
A rank or world size out of range is ignored with a line (`checked_rank`).
Flight Recorder dumps found on the way are set aside for the hang analysis (`Discovered.fr_dumps`).
"""
from __future__ import annotations

import dataclasses
import errno
import math
import os
import re
import stat
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path

from rankscope.files import TEMP_PREFIX

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".sqlite3")    # Kineto JSON; nsys SQLite export
#: JSON files that sit beside traces and are known not to be traces (not reported).
NOT_TRACES = {"ground_truth.json"}
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.IGNORECASE)
#: Largest rank and world size taken from a trace or a file name.
MAX_RANK = 2**31 - 1
MAX_WORLD_SIZE = 2**20


@dataclass(frozen=True)
class Discovered:
    traces: list[Path]
    ignored: list[tuple[Path, str]]     # (file, why) for files in the folder that are not traces
    skipped: list[tuple[Path, str]]     # (path, why) named like a trace or given, but not readable as one
    fr_dumps: list[Path] = dataclasses.field(default_factory=list)    # Flight Recorder dumps (not traces)


def is_trace_name(path: Path) -> bool:
    """Named like a trace, and not the temporary copy of a file rankscope is writing (an export to
    `job/all.json.gz` writes `job/.tmp-...-all.json.gz` first)."""
    name = path.name.lower()
    return name.endswith(TRACE_SUFFIXES) and name not in NOT_TRACES and not path.name.startswith(TEMP_PREFIX)


def discover(inputs: list[str | Path]) -> Discovered:
    """Expand files and folders into trace files. A folder is searched at its top level first;
    if it holds no trace there, recursively (tensorboard_trace_handler writes one folder).
    What is named like a trace but is no regular file (a folder, a FIFO, a symlink loop), and a
    folder that cannot be listed, is skipped with why; nothing but a regular file is ever opened."""
    traces: list[Path] = []
    ignored: list[tuple[Path, str]] = []
    skipped: list[tuple[Path, str]] = []
    for item in inputs:
        p = Path(item)
        mode, why = _mode(p)
        if mode is not None and stat.S_ISDIR(mode):
            files, others = _listing(p, skipped)
            found = [f for f in files if is_trace_name(f)]
            if found:
                skipped.extend((f, why) for f, why in others if is_trace_name(f))
            else:
                files = _walk(p, skipped, {_identity(p)})
                found = [f for f in files if is_trace_name(f)]
            traces.extend(found)
            ignored.extend((f, "not a trace file (expected *.json, *.json.gz or *.sqlite)") for f in files
                           if not is_trace_name(f) and not f.name.startswith(".") and f.name not in NOT_TRACES)
        elif mode is not None and stat.S_ISREG(mode):
            traces.append(p)
        elif mode is None and why == _MISSING:
            ignored.append((p, _MISSING))
        else:
            skipped.append((p, _not_regular(mode, why)))
    traces, ignored, dumps = _set_aside_fr_dumps(traces, ignored)
    unique = list(dict.fromkeys(t.resolve() for t in traces))
    return Discovered(traces=unique, ignored=ignored, skipped=skipped, fr_dumps=list(dict.fromkeys(dumps)))


def _set_aside_fr_dumps(traces: list[Path], ignored: list[tuple[Path, str]]
                        ) -> tuple[list[Path], list[tuple[Path, str]], list[Path]]:
    """Flight Recorder dumps (`rank_3`, `nccl_trace_rank_3`, `fr_3.json`: by name and content) out of
    the traces and the files ignored as not traces."""
    dumps = [f for f in traces if is_fr_dump(f)] + [f for f, why in ignored if why != _MISSING and is_fr_dump(f)]
    if not dumps:
        return traces, ignored, []
    aside = set(dumps)
    return [f for f in traces if f not in aside], [(f, why) for f, why in ignored if f not in aside], dumps


_MISSING = "no such file or folder"


def _mode(p: Path) -> tuple[int | None, str | None]:
    """The file type bits of `p` (symlinks followed), or None and why it has none."""
    try:
        return p.stat().st_mode, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "symlink loop: skipped"
        if exc.errno == errno.ENOENT:
            return None, "broken symlink: skipped" if p.is_symlink() else _MISSING
        return None, f"cannot read: {exc.strerror or exc}"


def _not_regular(mode: int | None, why: str | None) -> str:
    """Why a path that is no regular file is skipped: `why` it has no file type (`_mode`), else what
    its file type makes it."""
    if mode is None:
        return why or _MISSING
    return f"not a trace file but {_what(mode)}: skipped"


def _what(mode: int) -> str:
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")


def _listing(folder: Path, skipped: list[tuple[Path, str]]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Regular files in `folder` (sorted), and (entry, why) for the others (folders included);
    a folder that cannot be listed goes to `skipped`."""
    try:
        with os.scandir(folder) as it:
            entries = sorted(Path(e.path) for e in it)
    except OSError as exc:
        skipped.append((folder, f"cannot read this folder: {exc.strerror or exc}; traces in it are not analysed"))
        return [], []
    files, others = [], []
    for e in entries:
        mode, why = _mode(e)
        if mode is not None and stat.S_ISREG(mode):
            files.append(e)
        else:
            others.append((e, _not_regular(mode, why)))
    return files, others


def _walk(folder: Path, skipped: list[tuple[Path, str]], seen: set) -> list[Path]:
    """Regular files under `folder`, depth first in name order. Subfolders are searched (also
    through symlinks, each once); what is named like a trace and is neither goes to `skipped`.
    The folders to search are a stack, not a recursion: any depth."""
    files: list[Path] = []
    stack = [folder]
    while stack:
        current = stack.pop()
        if current is not folder:
            if _identity(current) in seen:
                continue
            seen.add(_identity(current))
        found, others = _listing(current, skipped)
        files += found
        subfolders = []
        for e, why in others:
            mode = _mode(e)[0]
            if mode is not None and stat.S_ISDIR(mode):
                subfolders.append(e)
            elif is_trace_name(e):
                skipped.append((e, why))
        stack.extend(reversed(subfolders))
    return files


def _identity(folder: Path) -> tuple[int, int]:
    st = folder.stat()
    return st.st_dev, st.st_ino


def open_regular(path: str | Path) -> BufferedReader:
    """`path` opened for binary reading when it is a regular file, else OSError. The open does not
    block, so a FIFO is never waited on."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file but {_what(mode)}", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def checked_rank(rank: object, world_size: object, names: tuple[str, str] = ("distributedInfo.rank",
                  "distributedInfo.world_size")) -> tuple[int | None, int | None, list[str]]:
    """A trace's rank and world size (`names`: where it gives them) -> (rank, world size, lines):
    a value that is no integer or out of range (rank 0..MAX_RANK and below the world size, world
    size 1..MAX_WORLD_SIZE) is None, with a line; the rank then comes from the file name or order."""
    lines = []
    world = _integer(world_size)
    if world is not None and not 1 <= world <= MAX_WORLD_SIZE:
        lines.append(f"{names[1]} {_shown(world)} out of range (1 to {MAX_WORLD_SIZE}): ignored")
        world = None
    elif world is None and world_size is not None:
        lines.append(f"{names[1]} {_shown(world_size)} is not an integer: ignored")
    r = _integer(rank)
    why = None
    if r is None and rank is not None:
        why = "is not an integer"
    elif r is not None and not 0 <= r <= MAX_RANK:
        why = f"out of range (0 to {MAX_RANK})"
    elif r is not None and world is not None and r >= world:
        why = f"not below world_size {world}"
    if why:
        lines.append(f"{names[0]} {_shown(rank)} {why}: ignored, rank from the file name or order")
        r = None
    return r, world, lines


def _integer(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _shown(v: object) -> str:
    """A value for a message: short, one line (a huge int as its order of magnitude)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**18:
        return f"{'-' if v < 0 else ''}~1e{int(math.log10(abs(v)))}"
    try:
        return repr(v)[:40]
    except ValueError:        # an int too long to print, inside a list
        return f"a {type(v).__name__}"


def rank_from_filename(path: str | Path) -> int | None:
    """The rank a file name gives (`rank3`, `worker-3`); None without one or above MAX_RANK."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m and len(m.group(1)) <= 10 and int(m.group(1)) <= MAX_RANK else None


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


# ----------------------------------------------------------------------------------------------
# Flight Recorder dumps (ingest/flight_recorder.py reads them)
#: A dump's file name: anything ending in the rank's digits, optionally `.json`.
_FR_DUMP_NAME = re.compile(r"(\d{1,10})(\.json)?$", re.IGNORECASE)
_KINETO_NAME = re.compile(r"\.pt\.trace\.json$", re.IGNORECASE)
#: How much of a file is read to tell a dump from other files.
FR_SNIFF_BYTES = 1 << 16


def fr_dump_rank(path: str | Path) -> int | None:
    """The rank a Flight Recorder dump's name gives (the digits it ends with, before an optional
    `.json`: `rank_3`, `nccl_trace_rank_3`, `fr_3.json`); None for other names and for Kineto traces."""
    name = Path(path).name
    if _KINETO_NAME.search(name):
        return None
    m = _FR_DUMP_NAME.search(name)
    return int(m.group(1)) if m else None


def is_fr_dump(path: str | Path) -> bool:
    """Whether `path` is a Flight Recorder dump: named like one (`fr_dump_rank`) and a pickle or JSON
    object whose head names a dump's keys. Only a regular file is opened, without waiting on it;
    what cannot be read is not a dump."""
    if fr_dump_rank(path) is None:
        return False
    try:
        with open_regular(path) as f:
            head = f.read(FR_SNIFF_BYTES)
    except OSError:
        return False
    if head[:1] == b"\x80":                   # torch's pickler writes the dict's keys first: version, pg_config...
        return any(key in head for key in (b"version", b"pg_config", b"entries"))
    text = head.lstrip()
    return (text[:1] == b"{" and b'"traceEvents"' not in text
            and (b'"entries"' in text or b'"pg_config"' in text or b'"pg_status"' in text))
