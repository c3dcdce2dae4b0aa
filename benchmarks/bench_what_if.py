"""What-if accuracy of the cross-rank critical path: on synthetic jobs with one straggler, the
re-timed prediction of the step without the fault against the measured step of the job's
fault-free twin (`rankscope synth --twin`: the same random draws, no injection).

    python benchmarks/bench_what_if.py [--jobs 12] [--ranks 8] [--steps 5]

Per job: the straggler's cause and delay, the faulty job's mean critical-path step (ms), the
what-if for that rank's cause (its host_idle / DataLoader wait removed, or its compute at the
median rank's pace), the prediction (faulty step - saved), the twin's measured step, the error.
Prints one table, then the share of jobs within 10%.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from rankscope.api import analyze
from rankscope.synth import STRAGGLER_CAUSES, generate_job, parse_injection

#: The what-if that undoes each injected cause (the start of its `change` text).
CHANGE_OF_CAUSE = {"host_idle": "remove its host_idle", "dataloader": "shorten its DataLoader wait",
                   "gpu_compute": "compute at the median rank's pace"}


def one(tmp: Path, rank: int, cause: str, delay_ms: float, ranks: int, steps: int, seed: int) -> dict:
    faulty, twin = tmp / f"f{seed}", tmp / f"t{seed}"
    generate_job(faulty, ranks=ranks, steps=steps, seed=seed,
                 injections=[parse_injection(f"straggler:rank={rank},cause={cause},delay_ms={delay_ms}")])
    generate_job(twin, ranks=ranks, steps=steps, seed=seed, injections=[])
    cf = analyze(faulty, use_cache=False, engine="inprocess").cross.critical_path
    ct = analyze(twin, use_cache=False, engine="inprocess").cross.critical_path
    w = next((w for w in cf.what_if if w.rank == rank and CHANGE_OF_CAUSE[cause] in w.change), None)
    predicted = cf.step_ms - (w.step_ms_saved if w else 0.0)
    return {"rank": rank, "cause": cause, "delay_ms": delay_ms, "faulty_ms": cf.step_ms,
            "saved_ms": w.step_ms_saved if w else None, "predicted_ms": predicted, "twin_ms": ct.step_ms,
            "error_pct": 100.0 * (predicted - ct.step_ms) / ct.step_ms}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for seed in range(args.jobs):
            cause = STRAGGLER_CAUSES[seed % len(STRAGGLER_CAUSES)]
            rows.append(one(Path(d), int(rng.integers(args.ranks)), cause, float(rng.choice([10, 20, 40])),
                            args.ranks, args.steps, seed))
    print(f"what-if vs fault-free twin, {len(rows)} synthetic jobs ({args.ranks} ranks, {args.steps} steps)")
    print(f"{'rank':>4} {'cause':>12} {'delay ms':>9} {'faulty ms':>10} {'saved ms':>9} {'predicted':>10} "
          f"{'twin ms':>8} {'error %':>8}")
    for r in rows:
        saved = "-" if r["saved_ms"] is None else f"{r['saved_ms']:.2f}"
        print(f"{r['rank']:>4} {r['cause']:>12} {r['delay_ms']:>9.0f} {r['faulty_ms']:>10.2f} {saved:>9} "
              f"{r['predicted_ms']:>10.2f} {r['twin_ms']:>8.2f} {r['error_pct']:>+8.1f}")
    within = sum(abs(r["error_pct"]) <= 10.0 for r in rows)
    print(f"within 10% of the twin: {within}/{len(rows)} ({100.0 * within / len(rows):.0f}%); "
          f"median |error| {np.median([abs(r['error_pct']) for r in rows]):.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
