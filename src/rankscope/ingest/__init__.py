"""bytes -> columnar events: readers per input format, rank discovery, the cache."""
from __future__ import annotations

from pathlib import Path

from rankscope.ingest.cache import Cache, content_key
from rankscope.ingest.errors import TraceError
from rankscope.model import RankTrace

__all__ = ["Cache", "TraceError", "load_rank", "read_trace", "read_traces", "several_ranks"]


def read_trace(path: str | Path) -> tuple[RankTrace, dict]:
    """Parse one trace file with the reader of its format: an SQLite file (by its signature, or
    named *.sqlite) is an Nsight Systems export, anything else Kineto JSON. Raises TraceError.
    (The readers are imported here: a run that finds every rank in the cache never needs them.)"""
    from rankscope.ingest.kineto import read_kineto
    from rankscope.ingest.nsys_sqlite import SQLITE_SUFFIXES, is_sqlite, read_nsys_sqlite
    if is_sqlite(path) or str(path).lower().endswith(SQLITE_SUFFIXES):
        return read_nsys_sqlite(path)
    return read_kineto(path)


def read_traces(path: str | Path) -> list[RankTrace]:
    """Every rank one file holds: one, except an Nsight Systems report of several processes with
    device activity (one per process). Raises TraceError."""
    from rankscope.ingest.nsys_sqlite import SQLITE_SUFFIXES, is_sqlite, read_nsys_processes
    if is_sqlite(path) or str(path).lower().endswith(SQLITE_SUFFIXES):
        return [t for t, _ in read_nsys_processes(path)]
    return [read_trace(path)[0]]


def several_ranks(path: str | Path) -> bool:
    """Whether the file holds several ranks (`read_traces`); False for any file that is no
    readable Nsight report of several processes."""
    from rankscope.ingest.nsys_sqlite import device_process_count, is_sqlite
    return is_sqlite(path) and device_process_count(path) > 1


def load_rank(path: str | Path, cache: Cache | None = None, key: str | None = None) -> tuple[RankTrace, bool]:
    """Parse one trace file, or take it from `cache` when its content is unchanged (`key`: its
    content key when the caller has it already). Returns (trace, served_from_cache). Raises
    TraceError for unusable files."""
    path = Path(path)
    if cache is not None:
        if key is None:
            try:
                key = content_key(path)
            except OSError as exc:
                raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
        hit = cache.get(key, str(path))
        if hit is not None:
            return hit, True
    trace, _ = read_trace(path)
    if cache is not None and key is not None:       # a cache: the key is known
        cache.put(key, trace)
    return trace, False
