"""Time, peak memory and output size of `rankscope export perfetto` (render/perfetto.py). Prints a table.

    python benchmarks/bench_export.py [--sets param-dlrm-8rank 8x50MB 8x200MB] [--repeat 2]

Per set: a cold run (parse every rank into a fresh cache, analyse, export), then cached runs that
convert 1 and 2 ranks at a time (`pipeline_ranks`), best of --repeat, side by side in one run (the
machine is shared and noisy: compare the ratio). Each run is a separate process, so its peak RSS is
its own. Sets: a corpus folder name, or a scale set of benchmarks/data (make_scale_set.py).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
CORPUS = Path(os.environ.get("RANKSCOPE_CORPUS", ROOT.parent / "shared" / "corpus"))
RUN = ("import sys; from rankscope.api import export_perfetto as e; "
       "r = e([sys.argv[1]], sys.argv[2], cache_dir=sys.argv[3], pipeline_ranks=int(sys.argv[4])); "
       "print(len(r.ranks), r.events, r.size_bytes)")


def run(folder: Path, out: Path, cache: Path, pipeline: int) -> tuple[float, float, list[int]]:
    """(wall s, peak RSS MB, [ranks, events, bytes]) of one export in a child process."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", RUN, str(folder), str(out), str(cache), str(pipeline)],
                            stdout=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if status:
        raise SystemExit(f"export of {folder} failed (status {status})")
    return wall, usage.ru_maxrss / 1024, [int(x) for x in proc.stdout.read().split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=["param-dlrm-8rank", "8x50MB", "8x200MB"])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    print(f"{'set':<18} {'ranks':>5} {'input MB':>8} {'run':<12} {'wall s':>7} {'MB/s':>6} {'RSS MB':>7} "
          f"{'events':>9} {'out MB':>7}")
    for name in args.sets:
        folder = DATA / name if (DATA / name).is_dir() else CORPUS / name
        if not folder.is_dir():
            print(f"{name}: not found (corpus folder or benchmarks/make_scale_set.py output)")
            continue
        mb = sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 1e6
        with tempfile.TemporaryDirectory() as tmp:
            out, cache = Path(tmp) / "job.json.gz", Path(tmp) / "cache"
            rows = [("cold", *run(folder, out, cache, 2))]
            for pipeline in (1, 2):
                best = min((run(folder, out, cache, pipeline) for _ in range(args.repeat)), key=lambda r: r[0])
                rows.append((f"cached x{pipeline}", *best))
        for label, wall, rss, (ranks, events, size) in rows:
            print(f"{name:<18} {ranks:>5} {mb:>8.1f} {label:<12} {wall:>7.2f} {mb / wall:>6.1f} {rss:>7.0f} "
                  f"{events:>9,} {size / 1e6:>7.1f}")


if __name__ == "__main__":
    main()
