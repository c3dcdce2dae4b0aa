"""What running two ranks' work at once costs: `summarize_rank` of one rank alone, of two ranks in
two threads of one process (the `local` engine's way), and of two ranks in two processes; then one
rank's summaries with another rank parsed over and over beside them (`read_trace`, what the other worker
thread of a cold `analyze` is mostly doing), in a thread and in a process, and, as a control, with a
numpy sort beside them in a thread (it holds no GIL while it runs, but uses the memory as hard). Prints a
table; run after `make_scale_set.py` built the set.

    python benchmarks/bench_threads.py [--set 8x200MB] [--repeat 6]

Each worker reads its rank once, runs `summarize_rank` once untimed (first-call costs: pattern tables,
regexes), then --repeat times with the rank's derived views cleared, and reports its mean wall time per
summary; a neighbour reports its mean time per parse (or sort). Threads share the GIL, processes do not:
the difference between a thread row and its process row is what the GIL costs when both cores run (the
machine is shared and noisy: compare rows of one run).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


def _put(out, value: float) -> None:
    """`value` onto `out`: a list (threads) or a multiprocessing queue (processes)."""
    out.append(value) if isinstance(out, list) else out.put(value)


def _mean_until(stop, least: int, work) -> float:
    """Mean seconds of `work()`, called until `stop` (an Event) is set and at least `least` times."""
    n, start = 0, time.perf_counter()
    while not stop.is_set() or n < least:
        work()
        n += 1
    return (time.perf_counter() - start) / n


def summarize_repeatedly(path: str, repeat: int, out) -> None:
    """Mean seconds of `summarize_rank` of the rank at `path`, put on `out` (a list or a queue)."""
    from rankscope.analyses.rank.summary import summarize_rank
    from rankscope.ingest import read_trace
    trace = read_trace(path)[0]
    summarize_rank(trace)
    start = time.perf_counter()
    for _ in range(repeat):
        trace.derived.clear()
        summarize_rank(trace)
    _put(out, (time.perf_counter() - start) / repeat)


def parse_until(path: str, stop, out, least: int = 1) -> None:
    """Parse the rank at `path` until `stop` is set, at least `least` times; the mean seconds per
    parse go on `out`."""
    from rankscope.ingest import read_trace
    _put(out, _mean_until(stop, least, lambda: read_trace(path)))


def sort_until(stop, out, least: int = 1) -> None:
    """Sort 4 M random int64 (numpy releases the GIL while it sorts) until `stop` is set, at least
    `least` times (the first sort is not timed: it faults in its output's pages)."""
    import numpy as np
    values = np.random.default_rng(0).integers(0, 1 << 40, 4_000_000)
    np.sort(values)
    _put(out, _mean_until(stop, least, lambda: np.sort(values)))


def beside_thread(path: str, repeat: int, neighbour) -> tuple[list[float], float]:
    """Summaries of `path` while `neighbour(stop, out)` runs in a thread: (summary times, its time)."""
    out: list[float] = []
    stop = threading.Event()
    t = threading.Thread(target=neighbour, args=(stop, out))
    t.start()
    summaries: list[float] = []
    summarize_repeatedly(path, repeat, summaries)
    stop.set()
    t.join()
    return summaries, out[0]


def beside_process(path: str, other: str, repeat: int) -> tuple[list[float], float]:
    ctx = mp.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=parse_until, args=(other, stop, queue))
    proc.start()
    summaries: list[float] = []
    summarize_repeatedly(path, repeat, summaries)
    stop.set()
    parse = queue.get()
    proc.join()
    return summaries, parse


def alone(path: str, repeat: int) -> list[float]:
    out: list[float] = []
    summarize_repeatedly(path, repeat, out)
    return out


def in_threads(paths: list[str], repeat: int) -> list[float]:
    out: list[float] = []
    threads = [threading.Thread(target=summarize_repeatedly, args=(p, repeat, out)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def in_processes(paths: list[str], repeat: int) -> list[float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=summarize_repeatedly, args=(p, repeat, queue)) for p in paths]
    for p in procs:
        p.start()
    out = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="8x200MB", help="scale set under benchmarks/data")
    ap.add_argument("--repeat", type=int, default=6)
    args = ap.parse_args()
    files = sorted(str(f) for f in (DATA / args.set).glob("rank*"))[:2]
    if len(files) < 2:
        raise SystemExit(f"need two rank files in {DATA / args.set}: build the set with make_scale_set.py")
    done = threading.Event()
    done.set()                      # one-shot runs, nothing beside them: the neighbours' own times
    parse_alone: list[float] = []
    parse_until(files[1], done, parse_alone, least=3)
    sort_alone: list[float] = []
    sort_until(done, sort_alone, least=10)

    def parse_beside(stop, out) -> None:
        parse_until(files[1], stop, out)

    rows = [("one rank alone", alone(files[0], args.repeat), None, None),
            ("two ranks, two threads", in_threads(files, args.repeat), None, None),
            ("two ranks, two processes", in_processes(files, args.repeat), None, None),
            ("one rank, a parse in a thread beside", *beside_thread(files[0], args.repeat, parse_beside),
             parse_alone[0]),
            ("one rank, a parse in a process beside", *beside_process(files[0], files[1], args.repeat),
             parse_alone[0]),
            ("one rank, a numpy sort in a thread beside", *beside_thread(files[0], args.repeat, sort_until),
             sort_alone[0])]
    base = rows[0][1][0]
    print(f"summarize_rank, {args.set}, mean of {args.repeat} per worker; a neighbour's mean per parse (sort), "
          f"and alone")
    print(f"{'how':<42} {'ms per summary':>16} {'vs alone':>9} {'neighbour ms (alone)':>22}")
    for name, seconds, neighbour, neighbour_alone in rows:
        per = ", ".join(f"{s * 1000:.0f}" for s in seconds)
        side = f"{neighbour * 1000:.0f} ({neighbour_alone * 1000:.0f})" if neighbour else ""
        print(f"{name:<42} {per:>16} {max(seconds) / base:>8.2f}x {side:>22}")


if __name__ == "__main__":
    main()
