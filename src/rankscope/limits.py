"""Running under an address-space limit (`ulimit -v`, `prlimit --as`, RLIMIT_AS, as batch schedulers
set one): the limit counts addresses reserved, not memory used, and the libraries reserve many
more than they use. At 1 GiB, two 200 MB ranks ended in a MemoryError (worker processes), or in
an abort of polars' allocator (threads, one process), before this.

`bound_memory()` runs first thing in the command line, before numpy and polars are imported, and
only where such a limit is set; it then reserves less: one glibc malloc arena instead of one per
thread (each reserves 64 MiB of addresses: a 200 MB rank peaked at 1.3 GB of addresses with
eight, 0.5 GB with one, for 0.26 GB used), polars' allocator (jemalloc) with one arena and no
background thread, one thread for polars and OpenBLAS, and 4 MiB stacks for Python's threads
(8 MiB by default). The ranks are then analysed one at a time
in this process (no forked worker process, one worker thread, unless --workers says otherwise):
what the limit allows is not shared between ranks. Processes the command line starts inherit the
settings. A file that still does not fit is said in one line naming the limit (`exhausted`).
"""
from __future__ import annotations

import ctypes
import os
import threading

#: glibc's mallopt parameter: the most malloc arenas (one per thread by default, up to 8 per core).
_M_ARENA_MAX = -8
#: Stack reserved for each thread Python starts (the default is `ulimit -s`, 8 MiB): a thread that
#: cannot reserve its stack does not start, and a process pool whose own thread fails that way waits
#: for ever.
THREAD_STACK_BYTES = 4 << 20


def address_space_limit() -> int | None:
    """The process's address-space limit in bytes (RLIMIT_AS, soft), or None where it has none."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, AttributeError, OSError, ValueError):      # not POSIX
        return None
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else soft


def bound_memory() -> bool:
    """Under an address-space limit, reserve fewer addresses (see the module docstring); whether
    there is one. Values the user set in the environment are kept."""
    if address_space_limit() is None:
        return False
    for name, value in (("MALLOC_ARENA_MAX", "1"), ("_RJEM_MALLOC_CONF", "background_thread:false,narenas:1"),
                        ("POLARS_MAX_THREADS", "1"), ("OPENBLAS_NUM_THREADS", "1"),
                        ("RANKSCOPE_NO_WORKER_PROCESS", "1")):
        os.environ.setdefault(name, value)
    threading.stack_size(THREAD_STACK_BYTES)
    try:                                   # this process's own malloc (the variable is read at start only)
        import ctypes.util                 # here: 13 ms of every command's start-up otherwise
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_ARENA_MAX, int(os.environ["MALLOC_ARENA_MAX"]))
    except (OSError, AttributeError, ValueError):                   # not glibc
        pass
    return True


def workers_within_limit(workers: int) -> int:
    """Worker threads for the ranks of one process: one under an address-space limit."""
    return 1 if address_space_limit() is not None else workers


def exhausted() -> str:
    """What running out of memory means here, for a one-line message."""
    limit = address_space_limit()
    return "out of memory" if limit is None else \
        f"out of memory under the address-space limit of {limit / (1 << 20):,.0f} MiB (ulimit -v, RLIMIT_AS)"
