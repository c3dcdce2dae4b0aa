"""What-if accuracy against measured before/after runs.

    python benchmarks/bench_what_if.py                 # the real pairs of tests/data/whatif
    python benchmarks/bench_what_if.py --synth 12      # also synthetic jobs against their fault-free twins

Real pairs (tests/data/whatif, made by its make_pairs.py: torch 2.13 CPU gloo jobs, each run with a
fault (`before`) and without it (`after`)): per pair, the what-if that undoes the fault, computed on
`before` (its key: `WHAT_IF`), its predicted saving, the measured saving (the mean of the longest
rank's step, before minus after, as each job's traces give it), the error (predicted - measured, in
ms and in % of the measured saving), and the replay error of `before` (the re-timing with no change
against its measured steps). Then the median and worst |error|.

Synthetic (`--synth N`): jobs with one straggler against their fault-free twin (`rankscope synth
--twin`: the same random draws without the fault): the what-if of the straggler's cause at the
median rank's level.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from rankscope.api import analyze
from rankscope.synth import STRAGGLER_CAUSES, generate_job, parse_injection

PAIRS = Path(__file__).resolve().parent.parent / "tests" / "data" / "whatif"
#: The what-if that undoes each pair's fault (`WhatIf.key`).
WHAT_IF = {"sleep": "rank:1:host_idle", "dataloader": "every:dataloader", "slow-stage": "pp:balanced",
           "bucketed": "overlap:dp", "microbatches": "pp:microbatches:8"}


def _path(folder: Path):
    return analyze(folder, use_cache=False, engine="inprocess").critical_path


def real_pairs(root: Path) -> list[dict]:
    rows = []
    for pair, key in WHAT_IF.items():
        before, after = _path(root / pair / "before"), _path(root / pair / "after")
        truth = json.loads((root / pair / "before" / "ground_truth.json").read_text())
        w = next((w for w in before.what_if if w.key == key), None)
        measured = before.measured_step_ms - after.measured_step_ms
        predicted = w.step_ms_saved if w else 0.0
        rows.append({"pair": pair, "injected": truth["injected"], "what_if": key, "before_ms": before.measured_step_ms,
                     "after_ms": after.measured_step_ms, "measured_ms": measured, "predicted_ms": predicted,
                     "theory_ms": w.theory_step_ms_saved if w else None, "error_ms": predicted - measured,
                     "error_pct": 100.0 * (predicted - measured) / measured if measured else float("nan"),
                     "replay_error_pct": before.replay_error_pct})
    return rows


def synth_jobs(n: int, ranks: int, steps: int) -> list[dict]:
    rng = np.random.default_rng(7)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for seed in range(n):
            cause = STRAGGLER_CAUSES[seed % len(STRAGGLER_CAUSES)]
            rank, delay = int(rng.integers(ranks)), float(rng.choice([10, 20, 40]))
            faulty, twin = Path(d) / f"f{seed}", Path(d) / f"t{seed}"
            generate_job(faulty, ranks=ranks, steps=steps, seed=seed,
                         injections=[parse_injection(f"straggler:rank={rank},cause={cause},delay_ms={delay}")])
            generate_job(twin, ranks=ranks, steps=steps, seed=seed, injections=[])
            cf, ct = _path(faulty), _path(twin)
            w = next((w for w in cf.what_if if w.key == f"rank:{rank}:{cause}"), None)
            measured = cf.measured_step_ms - ct.measured_step_ms
            predicted = w.step_ms_saved if w else 0.0
            rows.append({"pair": f"synth {cause} r{rank} {delay:.0f}ms", "what_if": f"rank:{rank}:{cause}",
                         "before_ms": cf.measured_step_ms, "after_ms": ct.measured_step_ms, "measured_ms": measured,
                         "predicted_ms": predicted, "theory_ms": None, "error_ms": predicted - measured,
                         "error_pct": 100.0 * (predicted - measured) / measured if measured else float("nan"),
                         "replay_error_pct": cf.replay_error_pct})
    return rows


def table(title: str, rows: list[dict]) -> None:
    print(title)
    print(f"{'pair':<24} {'what-if':<20} {'before':>8} {'after':>8} {'measured':>9} {'predicted':>10} "
          f"{'error ms':>9} {'error %':>8} {'replay %':>9}")
    for r in rows:
        print(f"{r['pair']:<24} {r['what_if']:<20} {r['before_ms']:>8.1f} {r['after_ms']:>8.1f} "
              f"{r['measured_ms']:>9.1f} {r['predicted_ms']:>10.1f} {r['error_ms']:>+9.1f} {r['error_pct']:>+8.1f} "
              f"{r['replay_error_pct']:>9.2f}")
    errors = [abs(r["error_pct"]) for r in rows if np.isfinite(r["error_pct"])]
    if errors:
        worst = max(rows, key=lambda r: abs(r["error_pct"]) if np.isfinite(r["error_pct"]) else -1)
        print(f"|error| of the saving, % of the measured saving: median {np.median(errors):.1f}%, worst "
              f"{abs(worst['error_pct']):.1f}% ({worst['pair']})")
    theory = [r for r in rows if r["theory_ms"] is not None]
    for r in theory:
        print(f"  {r['pair']}: (p-1)/(m+p-1) theory says {r['theory_ms']:.1f} ms, the re-timed pipeline "
              f"{r['predicted_ms']:.1f} ms, measured {r['measured_ms']:.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=Path, default=PAIRS, help="folder of <pair>/before and <pair>/after jobs")
    ap.add_argument("--synth", type=int, default=0, help="also this many synthetic jobs against their twins")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    table(f"what-if vs measured before/after, real torch CPU gloo jobs ({args.pairs})", real_pairs(args.pairs))
    if args.synth:
        print()
        table(f"what-if vs fault-free twin, {args.synth} synthetic jobs ({args.ranks} ranks, {args.steps} steps)",
              synth_jobs(args.synth, args.ranks, args.steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
