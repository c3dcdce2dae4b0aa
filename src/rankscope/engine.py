"""How per-rank work is mapped. Same function everywhere; results in item order.

  local      a pool of threads in this process (default). The parse runs in C without the GIL
             and polars/numpy release it too, so ranks parse in parallel while the job pays
             for one interpreter: measured on 8x200 MB, one process instead of 1 + N workers
             each holding their own polars/numpy, and no worker start-up on cached loads.
  processes  a pool of worker processes, for per-rank work that would hold the GIL.
  inprocess  one rank after the other (debugging, tiny inputs).

The mapped function takes one item (a file) and returns a small picklable result; the driver
never receives event frames. A later engine (Ray) plugs in behind the same `map_ranks`.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")

ENGINES = ("auto", "local", "processes", "inprocess")
#: Below this much input (bytes on disk), process start-up costs more than it saves.
AUTO_INPROCESS_BELOW_BYTES = 16 << 20


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return max(1, os.cpu_count() or 1)


def choose_engine(engine: str, total_bytes: int, n_items: int, workers: int) -> str:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine != "auto":
        return engine
    if n_items <= 1 or workers <= 1 or total_bytes < AUTO_INPROCESS_BELOW_BYTES:
        return "inprocess"
    return "local"


def map_ranks(fn: Callable[[T], R], items: Iterable[T], engine: str = "local", workers: int | None = None,
              on_done: Callable[[int, R], None] | None = None) -> list[R]:
    """Apply `fn` to every item; results in item order. `on_done(i, result)` runs in the driver
    as each finishes (progress bars)."""
    items = list(items)
    results: list = [None] * len(items)
    if engine == "inprocess" or len(items) <= 1:
        for i, item in enumerate(items):
            results[i] = fn(item)
            if on_done:
                on_done(i, results[i])
        return results
    n = min(workers or default_workers(), len(items))
    pool: Executor
    if engine == "processes":
        ctx = mp.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
        pool = ProcessPoolExecutor(max_workers=n, mp_context=ctx)
    else:
        pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="rankscope")
    with pool:
        futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
        for fut in as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            if on_done:
                on_done(i, results[i])
    return results
