"""What a `rankscope.analyze` call leaves behind in the caller's process: the same numpy work timed in a
fresh Python process, after `rankscope.analyze` as shipped (glibc's heap left alone: only rankscope's own
processes set it), and after `rankscope.analyze` in a process that set it as the command line does
(`reuse.own_process()`). Once a program sets one of glibc's malloc thresholds, glibc never again adapts
its mmap threshold to the blocks freed, and every large numpy temporary is mapped and faulted in anew.

    python benchmarks/bench_library_heap.py [--job FOLDER] [--repeat 2]

The work: 200 rounds of `x * 2 + 1`, a sort of 200,000 values and a cumulative sum over 1,000,000 values
(8 MB arrays); min of 3 timings in each process, one warm-up round before the analysis. Each variant runs
--repeat times, alternating, each in a fresh interpreter. Prints a table; compare rows of one run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

CORPUS = Path(os.environ.get("RANKSCOPE_CORPUS", Path(__file__).resolve().parents[2] / "shared" / "corpus"))

PROBE = '''
import sys, time
import numpy as np

def work():
    x = np.random.default_rng(0).random(1_000_000)
    start = time.perf_counter()
    for _ in range(200):
        y = x * 2.0 + 1.0
        np.sort(y[:200_000])
        np.cumsum(y)
    return time.perf_counter() - start

work()
variant, job = sys.argv[1], sys.argv[2]
if variant != "fresh":
    import rankscope
    from rankscope.ingest import reuse
    if variant == "own":
        reuse.own_process()
    rankscope.analyze(job, use_cache=False)
print(min(work() for _ in range(3)))
'''

VARIANTS = {
    "fresh": "a fresh process",
    "library": "after rankscope.analyze (as shipped)",
    "own": "after rankscope.analyze, heap set as the command line sets it",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=Path, default=CORPUS / "cpu-gloo-3d-pp2dp2tp2")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    if not args.job.exists():
        sys.exit(f"bench_library_heap: {args.job}: no such job folder (--job, or RANKSCOPE_CORPUS)")
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeat):
        for variant in VARIANTS:
            out = subprocess.run([sys.executable, "-c", PROBE, variant, str(args.job)], capture_output=True,
                                 text=True, check=True)
            seconds[variant].append(float(out.stdout))
    fresh = statistics.median(seconds["fresh"])
    print(f"numpy work on 8 MB arrays in a process, {args.repeat} runs each (job: {args.job.name})")
    print(f"| {'process':<62} | median s | runs (s) | / fresh |")
    print(f"|{'-' * 64}|----------|----------|---------|")
    for variant, label in VARIANTS.items():
        runs = seconds[variant]
        print(f"| {label:<62} | {statistics.median(runs):8.3f} | {', '.join(f'{s:.2f}' for s in runs)} "
              f"| {statistics.median(runs) / fresh:6.2f}x |")


if __name__ == "__main__":
    main()
