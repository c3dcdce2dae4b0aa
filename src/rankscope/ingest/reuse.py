"""Memory a process keeps from one rank for the next while it reads a job's ranks.

A process that reads ranks one after another allocates about the same memory for each: the parse's
columns (one anonymous memory map per column, see `kineto.columns._Column`) and the analyses' numpy
arrays. Given back to the OS after each rank, every page of it is faulted in again, zeroed, for
the next (~1.4 us a page here): on 208 MB ranks ~17,000 faults in the parse and ~7,000 in the
analyses, each rank. Inside `between_ranks()`:

* a column's memory map, once its frame is dropped, serves the same column of the next rank;
* in rankscope's own processes (the command line and its worker process: `own_process`), glibc's
  malloc keeps freed heap memory (no trim) and takes blocks up to 32 MB from the heap instead of
  a memory map of their own. Not in a user's process that calls `rankscope.analyze`: once a
  program sets these, glibc never again adapts its mmap threshold to the blocks freed (numpy
  work on 8 MB arrays after an analysis ran 1.55x slower: `benchmarks/bench_library_heap.py`).

Used where ranks are analysed (`analyze`, and its worker process). A parse alone (`validate`,
`load`) does without: its peak memory, which has a budget of 1.5x the largest file, grew by ~4%
(a reused map is resident from the rank's start, where a new one grows page by page as the
parse writes it).

Leaving the outermost `between_ranks()` drops the spare maps and restores glibc's defaults (the
caller hands the heap's free pages back after its map: `trim_heap`). Outside it nothing is kept.
Maps are reused on Linux only (an mmap that cannot be resized, as on macOS, cannot tell whether
an array still views it); the heap settings are glibc's (other C libraries have no `mallopt`, or
ignore these).
"""
from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys
import threading
from collections.abc import Hashable, Iterator

# glibc's mallopt parameters and the defaults they are set back to
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_DEFAULT = {_M_TRIM_THRESHOLD: 128 << 10, _M_TOP_PAD: 128 << 10, _M_MMAP_THRESHOLD: 128 << 10}
#: Between ranks: blocks up to 32 MB (glibc's largest allowed value on 64-bit) come from the heap,
#: up to 1 GB of free memory at its top is kept, and it grows by at least 64 MB at a time.
_KEEP = {_M_TRIM_THRESHOLD: 1 << 30, _M_TOP_PAD: 64 << 20, _M_MMAP_THRESHOLD: 32 << 20}

_REUSE_MAPS = sys.platform.startswith("linux")

_lock = threading.Lock()
_depth = 0             # between_ranks() entered and not left
_heap_is_ours = False  # glibc's heap settings may be changed (`own_process`)
#: Spare column maps by column key: maps whose column was taken; reused once no array views them.
_spare: dict[Hashable, list[mmap.mmap]] = {}


@contextlib.contextmanager
def between_ranks() -> Iterator[None]:
    """Keep memory from one rank for the next while inside (nestable, any thread)."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1 and _heap_is_ours:
            _mallopt(_KEEP)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _spare.clear()
                if _heap_is_ours:
                    _mallopt(_DEFAULT)


def own_process() -> None:
    """This process is rankscope's own (the command line, its worker process): `between_ranks()`
    also keeps heap memory. Set before the first `between_ranks()`."""
    global _heap_is_ours
    _heap_is_ours = True


def spare_map(key: Hashable, nbytes: int) -> mmap.mmap | None:
    """A spare map of at least `nbytes` that column `key` used before and no array views any
    more (None: none); it is no longer spare."""
    with _lock:
        maps = _spare.get(key, [])
        for i, m in enumerate(maps):
            if len(m) >= nbytes and not _viewed(m):
                return maps.pop(i)
    return None


def offer_map(key: Hashable, m: mmap.mmap) -> None:
    """Column `key` hands out its map's values (as array views): the map serves the same column of
    a later rank once those views are gone. Outside `between_ranks()`: nothing is kept."""
    with _lock:
        if _depth and _REUSE_MAPS:
            _spare.setdefault(key, []).append(m)


def _viewed(m: mmap.mmap) -> bool:
    """Whether an array (or any buffer) still views `m`: an mmap cannot be resized then."""
    try:
        m.resize(len(m))
    except BufferError:
        return True
    return False


def trim_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc's malloc_trim)."""
    _libc("malloc_trim", 0)


def trim_heap_unless_kept() -> None:
    """`trim_heap`, except inside `between_ranks()` (where the heap is kept for the next rank)."""
    if not _depth:
        trim_heap()


def _mallopt(values: dict[int, int]) -> None:
    for param, value in values.items():
        _libc("mallopt", param, value)


def _libc(function: str, *args: int) -> None:
    """Call a C library function; nothing where the C library has none by that name."""
    try:
        getattr(ctypes.CDLL(None), function)(*args)
    except (AttributeError, OSError, TypeError):
        pass
