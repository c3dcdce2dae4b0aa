"""What running two ranks' analyses at once costs: `summarize_rank` of one rank alone, of two ranks in
two threads of one process (the `local` engine's way), and of two ranks in two processes. Prints a table;
run after `make_scale_set.py` built the set.

    python benchmarks/bench_threads.py [--set 8x200MB] [--repeat 6]

Each worker reads its rank once, runs `summarize_rank` once untimed (first-call costs: pattern tables,
regexes), then --repeat times with the rank's derived views cleared, and reports its mean wall time per
summary. Two threads share the GIL, two processes do not: the difference between those two rows is what
the GIL costs the analyses when both cores run them (the machine is shared and noisy: compare rows of
one run).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


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
    seconds = (time.perf_counter() - start) / repeat
    out.append(seconds) if isinstance(out, list) else out.put(seconds)


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
    rows = [("one rank alone", alone(files[0], args.repeat)),
            ("two ranks, two threads", in_threads(files, args.repeat)),
            ("two ranks, two processes", in_processes(files, args.repeat))]
    base = rows[0][1][0]
    print(f"summarize_rank, {args.set}, mean of {args.repeat} per worker")
    print(f"{'how':<26} {'ms per summary (each worker)':>30} {'vs alone':>9}")
    for name, seconds in rows:
        per = ", ".join(f"{s * 1000:.0f}" for s in seconds)
        print(f"{name:<26} {per:>30} {max(seconds) / base:>8.2f}x")


if __name__ == "__main__":
    main()
