#!/usr/bin/env python3
"""Straggler localization accuracy over random synthetic scenarios (not a unit test: a table).

Each scenario is a job from the project's generator (`rankscope.synth.generate_job`) with a known
answer (its ground_truth.json): a random number of ranks (8-64 by default), one straggler injected
on a random rank with a random cause (dataloader | host_idle | gpu_compute) and a random delay,
and, in some scenarios, a clock offset on another rank (so clock alignment is exercised too) and/or
no overlap of communication with backward (the all-reduces queue after backward).
Some scenarios are clean (no injection): they must report no straggler.

The analysis runs exactly as in production: every rank's file is parsed (`read_kineto`), mapped to
its small `RankCollectives` (`rank_collectives`), and only those go to the reduce (`reduce_job`).

Reported (stdout table + JSON in benchmarks/results/):
  rank localized   the top reported straggler is the injected rank
  cause correct    ... and its cause is the injected cause
  false alarms     clean jobs with a straggler reported, and extra stragglers in faulty ones
  cost error       |reported cost - true cost| / true cost (true: the generator's counterfactual,
                   the median over the other ranks of their step-time increase vs the same job
                   without the fault, per step)
  detectable       scenarios whose true cost is >= the detection threshold (threshold
                   straggler_min_cost_pct_of_step of the step): a smaller real cost is, by definition, not a
                   straggler worth reporting, so misses there are listed apart.

Run from the repository root with the project venv:
    .venv/bin/python benchmarks/bench_stragglers.py                 # 120 scenarios (100 faulty, 20 clean)
    .venv/bin/python benchmarks/bench_stragglers.py --scenarios 30 --max-ranks 16 --seed 3
Options: --scenarios N, --clean-share 0.17, --min-ranks 8, --max-ranks 64, --steps 3, --scale 0.1667
(model layers x6; 1/6 = one transformer block, ~8 ms steps), --delay-min 0.15 --delay-max 1.0 (delay as a
fraction of the healthy step time), --clock-share 0.3, --no-overlap-share 0.2, --seed 0, --keep (keep the
generated jobs).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from rankscope.analyses.rank.collectives import rank_collectives  # noqa: E402
from rankscope.analyses.job.reduce import reduce_job  # noqa: E402
from rankscope.ingest.kineto import read_kineto  # noqa: E402
from rankscope.synth import STRAGGLER_CAUSES, Injection, generate_job  # noqa: E402
from rankscope.thresholds import THRESHOLDS  # noqa: E402

RESULTS_DIR = HERE / "results"


def healthy_step_ms(tmp: Path, scale: float, steps: int) -> float:
    """Median step time of a clean 8-rank job at this scale (the unit for delays)."""
    truth = generate_job(tmp / "ref", ranks=8, steps=steps, seed=12345, gzip=False, scale=scale)
    times = [t for r in truth["expected"]["per_rank"].values() for t in r["step_time_ms"]]
    shutil.rmtree(tmp / "ref", ignore_errors=True)
    return float(statistics.median(times))


def make_scenarios(n: int, clean_share: float, rng: np.random.Generator, args, step_ms: float) -> list[dict]:
    n_clean = int(round(n * clean_share))
    out = []
    for i in range(n):
        ranks = int(rng.integers(args.min_ranks, args.max_ranks + 1))
        sc = {"id": i, "ranks": ranks, "seed": int(rng.integers(0, 2**31 - 1)), "injections": []}
        if i >= n_clean:
            rank = int(rng.integers(0, ranks))
            delay = round(float(rng.uniform(args.delay_min, args.delay_max)) * step_ms, 3)
            cause = str(rng.choice(STRAGGLER_CAUSES))
            sc["injections"].append({"kind": "straggler", "params": {"rank": rank, "cause": cause, "delay_ms": delay}})
            if rng.random() < args.no_overlap_share:
                sc["injections"].append({"kind": "no_overlap", "params": {}})
            if rng.random() < args.clock_share:
                other = int((rank + 1 + rng.integers(0, ranks - 1)) % ranks)
                offset = round(float(rng.uniform(-20, 20)), 3)
                sc["injections"].append({"kind": "clock_offset", "params": {"rank": other, "offset_ms": offset}})
        elif rng.random() < args.clock_share:
            sc["injections"].append({"kind": "clock_offset", "params": {"rank": int(rng.integers(0, ranks)),
                                                                         "offset_ms": round(float(rng.uniform(-20, 20)), 3)}})
        out.append(sc)
    return out


def run_scenario(sc: dict, tmp: Path, args) -> dict:
    job = tmp / f"job{sc['id']}"
    t0 = time.perf_counter()
    truth = generate_job(job, ranks=sc["ranks"], steps=args.steps, seed=sc["seed"], gzip=False, scale=args.scale,
                         injections=[Injection(i["kind"], i["params"]) for i in sc["injections"]])
    t1 = time.perf_counter()
    ranks = [rank_collectives(read_kineto(p)[0]) for p in sorted(job.glob("rank*.pt.trace.json"))]
    t2 = time.perf_counter()
    cr = reduce_job(ranks).result
    t3 = time.perf_counter()
    if not args.keep:
        shutil.rmtree(job, ignore_errors=True)
    exp = truth["expected"]["stragglers"]
    found = cr.stragglers
    steps_ms = [t for r in truth["expected"]["per_rank"].values() for t in r["step_time_ms"]]
    row = {**sc, "true_rank": exp[0]["rank"] if exp else None, "true_cause": exp[0]["cause"] if exp else None,
           "true_cost_ms": float(np.mean(exp[0]["cost_ms_per_step"])) if exp else 0.0,
           "median_step_ms": float(np.median(steps_ms)),
           "found": [{"rank": s.rank, "cause": s.cause, "cost_ms": round(s.cost_ms_per_step, 4),
                      "last_pct": s.last_arrival_pct} for s in found],
           "verdict": cr.straggler_verdict,
           "clock_applied": {str(c.rank): round(c.offset_ms * 1e6) for c in cr.clock.ranks if c.applied},   # ns
           "true_offsets_ms": truth["expected"]["clock_offsets_ms"],
           "gen_s": t1 - t0, "map_s": t2 - t1, "reduce_s": t3 - t2}
    top = found[0] if found else None
    row["localized"] = bool(exp) and top is not None and top.rank == exp[0]["rank"]
    row["cause_ok"] = row["localized"] and top.cause == exp[0]["cause"]
    row["extra"] = max(0, len(found) - (1 if row["localized"] else 0))
    row["cost_rel_err"] = (abs(top.cost_ms_per_step - row["true_cost_ms"]) / row["true_cost_ms"]
                           if row["localized"] and row["true_cost_ms"] > 0 else None)
    min_cost_pct = THRESHOLDS["straggler_min_cost_pct_of_step"].value
    row["detectable"] = bool(exp) and row["true_cost_ms"] >= min_cost_pct / 100 * row["median_step_ms"]
    return row


def pct(a: int, b: int) -> str:
    return f"{a}/{b} = {100 * a / b:.1f}%" if b else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", type=int, default=120)
    ap.add_argument("--clean-share", type=float, default=1 / 6)
    ap.add_argument("--min-ranks", type=int, default=8)
    ap.add_argument("--max-ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1 / 6)
    ap.add_argument("--delay-min", type=float, default=0.15)
    ap.add_argument("--delay-max", type=float, default=1.0)
    ap.add_argument("--clock-share", type=float, default=0.3)
    ap.add_argument("--no-overlap-share", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--results", type=Path, default=RESULTS_DIR)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-stragglers-"))
    t_start = time.perf_counter()
    try:
        step_ms = healthy_step_ms(tmp, args.scale, args.steps)
        scenarios = make_scenarios(args.scenarios, args.clean_share, rng, args, step_ms)
        rows = []
        for sc in scenarios:
            row = run_scenario(sc, tmp, args)
            rows.append(row)
            mark = ("clean ok" if not row["found"] else "FALSE ALARM") if row["true_rank"] is None else \
                ("ok" if row["cause_ok"] else "rank ok, cause " + (row["found"][0]["cause"] if row["found"] else "?")
                 if row["localized"] else "MISSED" + ("" if row["detectable"] else " (not detectable)"))
            inj = ", ".join(i["kind"] + (":" if i["params"] else "") + ",".join(f"{k}={v}" for k, v in i["params"].items())
                            for i in sc["injections"])
            print(f"[{sc['id']:3d}] {sc['ranks']:2d} ranks  {inj or 'clean':70s} true cost {row['true_cost_ms']:6.2f} "
                  f"-> {row['found'][:1] or 'none'}  {mark}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - t_start

    faulty = [r for r in rows if r["true_rank"] is not None]
    clean = [r for r in rows if r["true_rank"] is None]
    det = [r for r in faulty if r["detectable"]]
    loc = [r for r in faulty if r["localized"]]
    errs = [r["cost_rel_err"] for r in loc if r["cost_rel_err"] is not None]
    print()
    print(f"straggler localization, {len(rows)} synthetic scenarios ({args.min_ranks}-{args.max_ranks} ranks, "
          f"{args.steps} steps, scale {args.scale:.3f}, healthy step {step_ms:.2f} ms, delays "
          f"{args.delay_min:.2f}-{args.delay_max:.2f} x step, seed {args.seed}), {wall:.0f} s")
    print(f"{'':28s}{'all faulty':>22s}{'detectable':>22s}")
    print(f"{'rank localized':28s}{pct(len(loc), len(faulty)):>22s}{pct(sum(r['localized'] for r in det), len(det)):>22s}")
    print(f"{'rank and cause correct':28s}{pct(sum(r['cause_ok'] for r in faulty), len(faulty)):>22s}"
          f"{pct(sum(r['cause_ok'] for r in det), len(det)):>22s}")
    for cause in STRAGGLER_CAUSES:
        sub = [r for r in faulty if r["true_cause"] == cause]
        print(f"{'  cause ' + cause:28s}{pct(sum(r['cause_ok'] for r in sub), len(sub)):>22s}"
              f"{pct(sum(r['cause_ok'] for r in sub if r['detectable']), sum(r['detectable'] for r in sub)):>22s}")
    print(f"{'extra stragglers reported':28s}{sum(r['extra'] for r in faulty):>22d}")
    print(f"{'clean jobs with a straggler':28s}{pct(sum(bool(r['found']) for r in clean), len(clean)):>22s}")
    if errs:
        print(f"{'cost error (localized)':28s}{'median ' + format(100 * statistics.median(errs), '.1f') + '%':>22s}"
              f"{'p90 ' + format(100 * float(np.percentile(errs, 90)), '.1f') + '%':>22s}")
    print(f"{'time per rank (map / gen)':28s}"
          f"{1e3 * sum(r['map_s'] for r in rows) / sum(r['ranks'] for r in rows):>19.1f} ms"
          f"{1e3 * sum(r['gen_s'] for r in rows) / sum(r['ranks'] for r in rows):>19.1f} ms")
    args.results.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.results / f"stragglers-{stamp}.json"
    out.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                               "healthy_step_ms": step_ms, "wall_s": wall, "rows": rows}, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
