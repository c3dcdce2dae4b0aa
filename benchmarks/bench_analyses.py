"""Per-rank cost of the analyses vs the parse (issue 3: "all analyses together add less than the
cold load time"). Prints a table; run after `make_scale_set.py` built the sets.

    python benchmarks/bench_analyses.py [--mb 50 200] [--repeat 3]

For one rank file of each scale set: parse (read_kineto), then every per-rank analysis that
`summarize_rank` runs, timed separately, best of --repeat, in this one process (ratios are what
to compare: the machine is shared and noisy).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from rankscope.analyses.rank import (breakdown, dataloader, gaps, idle, kernels, launch, memory, operators, overlap,
                                     steps, temporal)
from rankscope.analyses.rank.summary import summarize_rank
from rankscope.ingest.kineto import read_kineto

DATA = Path(__file__).resolve().parent / "data"


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", nargs="+", type=int, default=[50, 200])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'set':<9} {'MB':>6} {'parse s':>8} {'analyses s':>10} {'ratio':>6}   per analysis (s)")
    for mb in args.mb:
        files = sorted((DATA / f"8x{mb}MB").glob("rank0*"))
        if not files:
            print(f"8x{mb}MB: no data; run benchmarks/make_scale_set.py --mb {mb}")
            continue
        f = files[0]
        parse_s = best(lambda: read_kineto(f), args.repeat)
        trace = read_kineto(f)[0]
        w = steps.step_windows(trace)
        timeline = breakdown.classify_timeline(trace, [w.frame["start_ns"].to_numpy(), w.frame["end_ns"].to_numpy()])
        parts = {
            "steps": lambda: steps._step_windows(trace),
            "timeline": lambda: breakdown.classify_timeline(trace, [w.frame["start_ns"].to_numpy(),
                                                                    w.frame["end_ns"].to_numpy()]),
            "breakdown": lambda: breakdown.step_breakdown(trace, w, timeline),
            "gaps": lambda: gaps.idle_gaps(trace, w, timeline),
            "dataloader": lambda: dataloader.dataloader_share(trace, w),
            "memory": lambda: (memory.memory_timeline(trace, 200, w), memory.pageable_memcpy(trace, w)),
            "temporal": lambda: temporal.temporal_breakdown(trace),
            "overlap": lambda: overlap.comm_comp_overlap(trace),
            "idle": lambda: idle.idle_time_breakdown(trace),
            "launch": lambda: (launch.kernel_launch_stats(trace), launch.queue_length(trace),
                               launch.memory_bandwidth(trace)),
            "kernels": lambda: (kernels.kernel_breakdown(trace), kernels.kernel_stats(trace)),
            "operators": lambda: operators.operator_stats(trace),
        }
        each = {name: best(fn, args.repeat) for name, fn in parts.items()}
        total = best(lambda: summarize_rank(trace), args.repeat)
        detail = "  ".join(f"{k} {v:.3f}" for k, v in each.items())
        print(f"8x{mb}MB  {f.stat().st_size / 1e6:>6.0f} {parse_s:>8.2f} {total:>10.2f} {total / parse_s:>6.2f}   {detail}")
    print("ratio = all per-rank analyses (summarize_rank) / parse of the same rank; target < 1")


if __name__ == "__main__":
    main()
