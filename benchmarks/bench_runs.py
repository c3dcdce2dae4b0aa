#!/usr/bin/env python3
"""Whole runs (issue 31): the change detection's false alarms and power, a run's memory and time at scale,
and `rankscope watch`'s latency. Three parts, each printing a table:

  false-alarms  Monte Carlo runs fed straight to the change detection (`analyses/run/changes.find_changes`):
                log step time = the rank's speed + the cycle's load (shared by the ranks, sd --cycle-sd)
                + the step's noise (Student t with 3 degrees of freedom, sd --step-sd: heavy tails). Healthy
                runs: the share with any slowdown or speedup (a false alarm), without a cycle load and
                with one; runs with one rank 20% / 50%
                slower from the middle cycle on (its extra time in `dataloader`): the share where that
                slowdown is found at its rank and cycle (power). Then end to end: healthy synthetic runs
                (`rankscope.synth.runs.generate_run`, different seeds) through `rankscope.analyze`.
  scale         synthetic runs RANKSxCYCLES (`generate_run`, --scale 0.1: 1 layer, 2 profiled steps per
                cycle, one straggler from the middle cycle on) analysed in a fresh process each,
                `rankscope analyze DIR --no-cache --json -q --engine E`: wall time, the driver's own peak RSS
                (its ru_maxrss at exit), the process tree's peak RSS (polled), whether the onset is found.
  watch         8 ranks x ~50 MB per cycle (synth --scale 12, plain JSON): `rankscope watch --json` runs while
                two cycles land in its folder one after the other (each file renamed in whole); latency =
                from the last file of a cycle landing to its JSON line; beside it, `rankscope analyze` of the
                same 8 files (--no-cache) in a fresh process.

    python benchmarks/bench_runs.py false-alarms [--runs 300]
    python benchmarks/bench_runs.py scale [--sets 64x5 64x50 1024x2 1024x10] [--engines local processes ray]
    python benchmarks/bench_runs.py watch [--ranks 8] [--synth-scale 12]

Generated data goes to benchmarks/data/ (git-ignored; reused while its stamp matches).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_load  # noqa: E402  (process-tree RSS sampler)
from bench_scale import DRIVER, python_exe  # noqa: E402  (the CLI writing its own peak RSS at exit)

MB = 1e6
DATA = HERE / "data"


# ------------------------------------------------------------------------------------- false alarms
def _trend(rng: random.Random, ranks: int, cycles: int, steps: int, step_sd: float, cycle_sd: float,
           slow_rank: int | None = None, slow_from: int = 0, factor: float = 1.0):
    from rankscope.analyses.run.cycles import TrendPoint
    from rankscope.results.run import RunCycle
    speed = [rng.gauss(0, 0.02) for _ in range(ranks)]
    t_scale = step_sd / math.sqrt(3.0)                     # a t(3) variable has variance 3
    points, rows, step = [], [], 5
    for c in range(1, cycles + 1):
        load = rng.gauss(0, cycle_sd)
        for s in range(steps):
            for r in range(ranks):
                z = rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)
                ms = 100.0 * math.exp(speed[r] + load + t_scale * z)
                extra = ms * (factor - 1.0) if r == slow_rank and c >= slow_from else 0.0
                points.append(TrendPoint(r, step + s, c, ms + extra, [ms, 0, 0, 0, extra, 0, 0, 0]))
        rows.append(RunCycle(c, [], list(range(ranks)), [], [], list(range(step, step + steps)), 100.0, 100.0,
                             None, []))
        step += steps + 2
    return points, rows


def false_alarms(args) -> None:
    from rankscope.analyses.run.changes import find_changes
    from rankscope.thresholds import resolve
    t = resolve()
    print(f"Change detection on Monte Carlo runs (2 profiled steps per cycle; nominal false-alarm rate "
          f"{t['run_change_false_alarm_pct']:g}% per run; found = a slowdown of the slowed rank in its first slow "
          f"cycle)")
    print(f"{'step sd':>7} {'cycle sd':>8} {'ranks':>5} {'cycles':>6} {'runs':>5} {'false alarms':>12} "
          f"{'found +20%':>10} {'found +50%':>10} {'s/run':>6}")
    for step_sd, cycle_sd in ((args.step_sd, 0.0), (args.step_sd, args.cycle_sd)):
        for ranks, cycles in ((4, 5), (4, 20), (64, 10), (64, 50)):
            rng = random.Random(ranks * 1000 + cycles)
            n = args.runs if ranks * cycles <= 100 else max(20, args.runs // (10 if ranks * cycles > 1000 else 3))
            alarms = found20 = found50 = 0
            t0 = time.perf_counter()
            for _ in range(n):
                pts, rows = _trend(rng, ranks, cycles, 2, step_sd, cycle_sd)
                alarms += any(c.kind in ("slowdown", "speedup")
                              for c in find_changes(pts, rows, [{}] * cycles, t).changes)
                mid = cycles // 2 + 1
                for factor in (1.2, 1.5):
                    pts, rows = _trend(rng, ranks, cycles, 2, step_sd, cycle_sd, 1, mid, factor)
                    hit = any(c.kind == "slowdown" and c.rank == 1 and c.first_cycle == mid
                              for c in find_changes(pts, rows, [{}] * cycles, t).changes)
                    found20 += hit and factor == 1.2
                    found50 += hit and factor == 1.5
            per = (time.perf_counter() - t0) / (3 * n)
            print(f"{step_sd:7.0%} {cycle_sd:8.0%} {ranks:>5} {cycles:>6} {n:>5} {100 * alarms / n:11.1f}% "
                  f"{100 * found20 / n:9.1f}% {100 * found50 / n:9.1f}% {per:6.2f}", flush=True)
    if args.synth_runs:
        _synth_false_alarms(args)


def _synth_false_alarms(args) -> None:
    import rankscope
    from rankscope.synth.runs import generate_run
    alarms = 0
    noise = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.synth_runs):
            generate_run(Path(tmp) / "run", ranks=8, cycles=10, steps=2, seed=seed, scale=0.1)
            run = rankscope.analyze(Path(tmp) / "run", use_cache=False).run
            alarms += bool(run.changes)
            noise.append(run.noise_pct)
    print(f"end to end, {args.synth_runs} healthy synthetic runs (8 ranks x 10 cycles, each its own random draws): "
          f"{alarms}/{args.synth_runs} with a change; the runs' step noise {min(noise):.2f}-{max(noise):.2f}%")


# -------------------------------------------------------------------------------------------- scale
def _run_set(ranks: int, cycles: int) -> tuple[Path, dict]:
    from rankscope.synth import parse_injection
    from rankscope.synth.runs import generate_run
    folder = DATA / f"run-{ranks}x{cycles}"
    stamp = folder.with_suffix(".stamp.json")
    want = {"ranks": ranks, "cycles": cycles, "steps": 2, "scale": 0.1, "from_cycle": cycles // 2 + 1,
            "inject": "straggler:rank=3,cause=dataloader,delay_ms=20"}
    if stamp.exists() and json.loads(stamp.read_text()).get("want") == want:
        return folder, json.loads((folder / "ground_truth.json").read_text())
    t0 = time.perf_counter()
    truth = generate_run(folder, ranks=ranks, cycles=cycles, steps=2, seed=0, scale=0.1,
                         injections=[parse_injection(want["inject"])], from_cycle=want["from_cycle"])
    stamp.write_text(json.dumps({"want": want, "generation_s": round(time.perf_counter() - t0, 1)}))
    return folder, truth


def scale(args) -> None:
    logdir = Path(tempfile.mkdtemp(prefix="bench-runs-"))
    rows = []
    for text in args.sets:
        ranks, cycles = map(int, text.lower().split("x"))
        folder, truth = _run_set(ranks, cycles)
        files = list(folder.glob("rank*.pt.trace.json*"))
        on_disk = sum(f.stat().st_size for f in files)
        want = next(c for c in truth["expected_changes"] if c["kind"] == "slowdown")
        for engine in args.engines:
            peak_file, out_file = logdir / f"{text}-{engine}.rss", logdir / f"{text}-{engine}.json"
            env = dict(os.environ, BENCH_DRIVER_PEAK_RSS=str(peak_file))
            cmd = [python_exe(), "-c", DRIVER, "analyze", str(folder), "--no-cache", "--json", "-q", "--engine", engine]
            print(f"[{text}] rankscope analyze {folder} --no-cache --json -q --engine {engine}", file=sys.stderr,
                  flush=True)
            with open(out_file, "wb") as out:
                r = bench_load.run_measured(cmd, env=env, stdout=out, timeout=args.timeout, interval=0.1,
                                            stderr_path=logdir / f"{text}-{engine}.err", with_pss=False)
            try:
                run = json.loads(out_file.read_bytes())["run"]
                found = any(c["kind"] == "slowdown" and c["rank"] == want["rank"]
                            and c["first_cycle"] == want["first_cycle"] for c in run["changes"])
                cycles_seen = len(run["cycles"])
            except (ValueError, KeyError, TypeError):
                found, cycles_seen = None, 0
            rows.append((text, ranks, cycles, len(files), on_disk / MB, engine, r["wall_s"],
                         int(peak_file.read_text()) / MB if peak_file.exists() else float("nan"),
                         r["peak_rss_bytes"] / MB, cycles_seen, found, r["rc"]))
    print(f"{'set':>8} {'files':>6} {'MB disk':>8} {'engine':>9} {'wall s':>7} {'s/file':>7} {'driver RSS MB':>13} "
          f"{'tree RSS MB':>11} {'cycles':>6} {'onset found':>11}")
    for text, ranks, cycles, n, mb, engine, wall, driver, tree, seen, found, rc in rows:
        print(f"{text:>8} {n:>6} {mb:8.0f} {engine:>9} {wall:7.1f} {wall / n:7.3f} {driver:13.0f} {tree:11.0f} "
              f"{seen:>6} {('yes' if found else 'NO') if rc in (0, 1) else 'rc ' + str(rc):>11}")
    by = {(r[0], r[5]): r for r in rows}
    for engine in args.engines:
        for a, b in (("64x5", "64x50"), ("1024x2", "1024x10")):
            if (a, engine) in by and (b, engine) in by:
                print(f"{engine}: driver peak RSS {b} / {a} = {by[(b, engine)][7] / by[(a, engine)][7]:.2f} "
                      f"({by[(b, engine)][2] / by[(a, engine)][2]:.0f}x the cycles)")
    shutil.rmtree(logdir, ignore_errors=True)


# -------------------------------------------------------------------------------------------- watch
def watch(args) -> None:
    from rankscope.synth.runs import generate_run
    src = DATA / f"run-watch-{args.ranks}x2-scale{args.synth_scale:g}"
    if not (src / "ground_truth.json").exists():
        generate_run(src, ranks=args.ranks, cycles=2, steps=2, seed=0, scale=args.synth_scale, gzip=False)
    truth = json.loads((src / "ground_truth.json").read_text())
    cycles = [[src / f for f in c["files"]] for c in truth["cycles"]]
    mb = sum(f.stat().st_size for f in cycles[0]) / len(cycles[0]) / MB
    with tempfile.TemporaryDirectory(dir=DATA) as tmp:
        folder, staging = Path(tmp) / "profiler", Path(tmp) / "staging"
        folder.mkdir()
        staging.mkdir()
        env = dict(os.environ, RANKSCOPE_CACHE_DIR=str(Path(tmp) / "cache"))
        proc = subprocess.Popen([python_exe(), "-m", "rankscope", "watch", str(folder), "--json", "--interval", "0.5",
                                 "--stop-after-idle", "20"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env=env, text=True)
        latencies = []
        for files in cycles:
            for f in files:
                shutil.copy(f, staging / f.name)
            for f in files:
                os.rename(staging / f.name, folder / f.name)          # each file lands whole
            landed = time.perf_counter()
            line = proc.stdout.readline()
            latencies.append(time.perf_counter() - landed)
            assert json.loads(line)["cycle"]["ranks"] == list(range(args.ranks)), line[:200]
        proc.stdout.readline()
        proc.wait(timeout=120)
        t0 = time.perf_counter()
        subprocess.run([python_exe(), "-m", "rankscope", "analyze", *map(str, cycles[1]), "--no-cache", "-q",
                        "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
        plain = time.perf_counter() - t0
    print(f"watch: {args.ranks} ranks x {mb:.0f} MB per cycle (plain JSON), polling every 0.5 s")
    print(f"{'cycle':>5} {'latency s':>10}  (from the cycle's last file landing to its JSON line)")
    for i, s in enumerate(latencies, start=1):
        print(f"{i:>5} {s:10.2f}")
    print(f"rankscope analyze of the same {args.ranks} files, fresh process, --no-cache: {plain:.2f} s "
          f"(cycle 2 latency / that = {latencies[-1] / plain:.2f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="part", required=True)
    fa = sub.add_parser("false-alarms")
    fa.add_argument("--runs", type=int, default=300)
    fa.add_argument("--step-sd", type=float, default=0.03)
    fa.add_argument("--cycle-sd", type=float, default=0.05)
    fa.add_argument("--synth-runs", type=int, default=20)
    sc = sub.add_parser("scale")
    sc.add_argument("--sets", nargs="+", default=["64x5", "64x50", "1024x2", "1024x10"])
    sc.add_argument("--engines", nargs="+", default=["local"])
    sc.add_argument("--timeout", type=float, default=3600)
    wa = sub.add_parser("watch")
    wa.add_argument("--ranks", type=int, default=8)
    wa.add_argument("--synth-scale", type=float, default=12)
    args = ap.parse_args(argv)
    DATA.mkdir(exist_ok=True)
    {"false-alarms": false_alarms, "scale": scale, "watch": watch}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
