"""What the reading of other tools' captures (issue 33) costs, against the work around it, side by
side in one process (ratios are what to compare: the machine is shared and noisy). Prints a table.

    python benchmarks/bench_captures.py [--repeat 5]

- gaps: `idle_gaps` (now with the gaps before a step's first kernel and after its last, and the
  training thread's gaps on CPU-only ranks) vs the rank's parse, on the corpus's largest file
  (big-mi300-xdit, 62 MB) and on a CPU-only rank (cpu-gloo-3d-pp2dp2tp2);
- regroup: `regroup_unnamed` (scoring every assignment of unnamed groups) vs the rest of the
  cross-rank reduce, on tests/data/captures/mesh-dp-pp-tp-unnamed (8 ranks, 3 inferred dims);
- nsys check: `device_process_count` (the query every run makes to know whether an Nsight report
  holds several ranks) vs reading the report (corpus nsys-sqlite-h100).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rankscope.analyses.job.regroup import regroup_unnamed
from rankscope.analyses.job.reduce import reduce_job
from rankscope.analyses.rank import breakdown, gaps, steps
from rankscope.analyses.rank.summary import summarize_rank
from rankscope.ingest import read_trace
from rankscope.ingest.nsys_sqlite import device_process_count

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("RANKSCOPE_CORPUS", ROOT.parent.parent / "shared" / "corpus"))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _gaps_row(path: Path, repeat: int) -> tuple[str, float, float]:
    parse_s = best(lambda: read_trace(path), max(1, repeat // 2))
    trace = read_trace(path)[0]
    w = steps.step_windows(trace)
    timeline = breakdown.classify_timeline(trace, [w.frame["start_ns"].to_numpy(), w.frame["end_ns"].to_numpy()])
    return "idle_gaps vs parse", best(lambda: gaps.idle_gaps(trace, w, timeline), repeat), parse_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rows = []
    big = sorted((CORPUS / "big-mi300-xdit").glob("*.json*"))[0]
    rows.append(("big-mi300-xdit", *_gaps_row(big, args.repeat)))
    cpu = sorted((CORPUS / "cpu-gloo-3d-pp2dp2tp2").glob("*.json*"))[0]
    rows.append(("cpu-gloo-3d rank 0", *_gaps_row(cpu, args.repeat)))

    mesh = sorted((ROOT / "tests" / "data" / "captures" / "mesh-dp-pp-tp-unnamed").glob("*.gz"))
    summaries = [summarize_rank(read_trace(f)[0]) for f in mesh]

    def fresh():
        import copy
        return [copy.deepcopy(s.collectives) for s in summaries]

    regroup_s = best(lambda: regroup_unnamed(fresh()), args.repeat)
    copy_s = best(fresh, args.repeat)
    reduce_s = best(lambda: reduce_job(fresh()), args.repeat)
    rows.append(("mesh-dp-pp-tp 8 ranks", "regroup vs reduce_job", regroup_s - copy_s, reduce_s - copy_s))

    report = CORPUS / "nsys-sqlite-h100" / "report1.sqlite"
    rows.append(("nsys-sqlite-h100", "process count vs read", best(lambda: device_process_count(report), args.repeat),
                 best(lambda: read_trace(report), args.repeat)))

    print(f"{'input':<24} {'what':<24} {'new part s':>10} {'reference s':>11} {'ratio':>7}")
    for name, what, new, ref in rows:
        print(f"{name:<24} {what:<24} {new:>10.4f} {ref:>11.4f} {new / ref:>7.3f}")


if __name__ == "__main__":
    main()
