#!/usr/bin/env python3
"""Parallel-layout analysis accuracy over random synthetic layouts (not a unit test: a table).

Each job comes from `rankscope.synth.layouts.generate_layout_job` with a known answer (its
ground_truth.json): a random layout (pp 2-4, dp 1/2/4, tp 1/2/4, ep 1/2/4, world <= --max-world), a
random schedule (1f1b, gpipe, interleaved), microbatches, group names (mesh, megatron, none) and DDP
or FSDP, with one fault per scenario; each faulty job's healthy twin (same layout and --seed, no
fault) makes the "healthy" scenario. The analysis runs as in production: `rankscope.api.analyze`
on the folder (in-process, no cache).

Reported per scenario (stdout table + JSON in benchmarks/results/):
  detected     the fault's finding is there, naming the right ranks (pipeline_stage_imbalance: the
               slow stage's ranks; expert_imbalance: the hot rank; fsdp_exposed_gather and
               tp_comm_exposed: present)
  high FP      healthy twins with a high-severity layout finding (pipeline_stage_imbalance,
               pipeline_bubble, fsdp_exposed_gather, tp_comm_exposed, expert_imbalance); on faulty
               jobs, a high layout finding that is neither expected nor a possible side effect
  layout       the dimensions and their exact groups equal the ground truth's expected layout
  schedule     pipeline schedule and microbatches equal the ground truth's
  bottleneck   the pipeline's bottleneck stage is the ground truth's
Every miss is listed under the table with the job's SPEC, the truth and the output.

Run from the repository root with the project venv:
    .venv/bin/python benchmarks/bench_layouts.py --quick          # 2 jobs per fault (+ twins), world <= 16
    .venv/bin/python benchmarks/bench_layouts.py                  # 6 layouts per fault, 2 runs each, world <= 32
Options: --jobs N (layouts per fault scenario), --repeats K (jobs per layout, each with its own --seed),
--max-world 32, --steps 2, --seed 0 (the layouts' random draws), --keep DIR (keep the generated jobs there).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from rankscope.api import analyze  # noqa: E402
from rankscope.synth.layouts import generate_layout_job  # noqa: E402
from rankscope.synth.layouts_spec import LayoutSpec  # noqa: E402

RESULTS_DIR = HERE / "results"
FAULTS = ("slow_stage", "no_prefetch", "exposed_tp", "expert_skew")


def random_layout(rng: np.random.Generator, fault: str, max_world: int) -> LayoutSpec:
    """A random layout that can carry `fault`."""
    for _ in range(1000):
        pp = int(rng.choice([2, 3, 4]))
        dp = int(rng.choice([1, 2, 4]))
        tp = int(rng.choice([1, 2, 4]))
        ep = int(rng.choice([1, 2]))
        if fault == "no_prefetch":
            dp = max(dp, 2)
        if fault == "exposed_tp":
            tp = max(tp, 2)
        if fault == "expert_skew":
            ep = int(rng.choice([2, 4]))
        if pp * dp * tp * ep > max_world:
            continue
        schedule = str(rng.choice(["1f1b", "gpipe", "interleaved"]))
        microbatches = int(rng.choice([4, 8]))
        if schedule == "interleaved":
            microbatches = pp * int(rng.choice([1, 2])) if pp * 2 <= 8 else pp
        spec = LayoutSpec(pp=pp, dp=dp, tp=tp, ep=ep, schedule=schedule, microbatches=microbatches,
                          names=str(rng.choice(["mesh", "megatron", "none"])),
                          fsdp=bool(dp >= 2 and (fault == "no_prefetch" or rng.random() < 0.4)))
        world = spec.world
        if fault == "slow_stage":
            return replace(spec, slow_stage=int(rng.integers(0, pp)))
        if fault == "no_prefetch":
            return replace(spec, no_prefetch=True)
        if fault == "exposed_tp":
            return replace(spec, exposed_tp=True)
        return replace(spec, expert_skew=int(rng.integers(0, world)))
    raise RuntimeError("no layout fits")


def layout_of(result) -> dict[str, list[list[int]]]:
    par = result.cross.parallel
    return {d.name: sorted(sorted(g) for g in d.groups) for d in par.layout.dims} if par else {}


def check(truth: dict, result) -> dict:
    """What the analysis got right on one job, and the details of what it did not."""
    exp = truth["expected"]
    out: dict = {"spec": truth["spec"], "seed": truth["random_seed"], "world": truth["world_size"], "misses": []}
    want_layout = {k: sorted(sorted(g) for g in v) for k, v in exp["layout"].items()}
    got_layout = layout_of(result)
    out["layout_ok"] = got_layout == want_layout
    if not out["layout_ok"]:
        out["misses"].append(f"layout: truth {_short(want_layout)} / output {_short(got_layout)}")
    par = result.cross.parallel
    tp_, p = truth["pipeline"], (par.pipeline if par else None)
    if tp_:
        got = (p.schedule, p.microbatches) if p else (None, None)
        out["schedule_ok"] = got == (tp_["schedule"], tp_["microbatches"])
        if not out["schedule_ok"]:
            out["misses"].append(f"pipeline: truth {tp_['schedule']}/m={tp_['microbatches']} "
                                 f"(marks {'on' if tp_['marks'] else 'off'}) / output {got[0]}/m={got[1]}")
        out["bottleneck_ok"] = bool(p) and p.bottleneck_stage == tp_["bottleneck_stage"]
        if not out["bottleneck_ok"]:
            out["misses"].append(f"bottleneck stage: truth {tp_['bottleneck_stage']} "
                                 f"{tp_['compute_ms_per_step_by_stage']} / output "
                                 f"{p.bottleneck_stage if p else None} "
                                 f"{[s.compute_ms_per_step for s in p.stages] if p else None}")
    findings = {f.id: f for f in result.findings}
    detected = []
    for fid in exp["findings"]:
        f = findings.get(fid)
        ok = f is not None and (fid not in exp["finding_ranks"] or sorted(f.ranks) == sorted(exp["finding_ranks"][fid]))
        detected.append(ok)
        if not ok:
            out["misses"].append(f"{fid}: truth ranks {exp['finding_ranks'].get(fid, 'any')} / output "
                                 + (f"{f.severity} ranks {f.ranks}: {f.summary[:160]}" if f else "absent"))
    out["detected"] = all(detected) if detected else None
    high = sorted(fid for fid, f in findings.items()
                  if f.severity == "high" and fid in exp["absent_high_findings"])
    out["false_high"] = high
    for fid in high:
        out["misses"].append(f"unexpected high {fid}: {findings[fid].summary[:200]}")
    out["findings"] = sorted(f"{f.id}:{f.severity}" for f in result.findings)
    return out


def _short(layout: dict) -> str:
    return "; ".join(f"{k} {len(v)}x{len(v[0]) if v else 0} {v if len(v) <= 4 else str(v[:3])[:-1] + ', ...]'}"
                     for k, v in layout.items()) or "(none)"


def run(args) -> dict:
    rng = np.random.default_rng(args.seed)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-layouts-"))
    tmp.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {f: [] for f in (*FAULTS, "healthy")}
    n = 0
    t0 = time.perf_counter()
    try:
        for fault in FAULTS:
            for j in range(args.jobs):
                spec = random_layout(rng, fault, args.max_world)
                for k in range(args.repeats):
                    seed = int(rng.integers(0, 2 ** 31 - 1))
                    for scenario, s in ((fault, spec), ("healthy", spec.healthy())):
                        folder = tmp / f"{n:03d}-{scenario}"
                        n += 1
                        truth = generate_layout_job(folder, s, steps=args.steps, seed=seed)
                        result = analyze(folder, use_cache=False, engine="inprocess")
                        row = check(truth, result)
                        rows[scenario].append(row)
                        if not args.keep:
                            shutil.rmtree(folder, ignore_errors=True)
                        print(f"  [{n}] {scenario:12s} {s.text} --seed {seed}: "
                              f"{'ok' if not row['misses'] else str(len(row['misses'])) + ' miss(es)'}",
                              file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"rows": rows, "jobs": n, "seconds": round(time.perf_counter() - t0, 1)}


def rate(values) -> str:
    vals = [v for v in values if v is not None]
    return f"{sum(vals)}/{len(vals)} ({100.0 * sum(vals) / len(vals):.0f}%)" if vals else "-"


def table(res: dict) -> str:
    head = ("scenario", "jobs", "detected", "high FP", "layout exact", "schedule+mb", "bottleneck")
    lines = []
    for scenario, rows in res["rows"].items():
        if not rows:
            continue
        lines.append((scenario, str(len(rows)), rate(r["detected"] for r in rows) if scenario != "healthy" else "-",
                      rate(bool(r["false_high"]) for r in rows), rate(r["layout_ok"] for r in rows),
                      rate(r.get("schedule_ok") for r in rows), rate(r.get("bottleneck_ok") for r in rows)))
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*line) for line in lines]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 layouts per fault, 1 run each, world <= 16")
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-world", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", default=None)
    args = ap.parse_args()
    if args.quick:
        args.jobs, args.repeats, args.max_world = 2, 1, min(args.max_world, 16)
    res = run(args)
    print(f"\nParallel-layout analysis on synthetic NCCL jobs: {res['jobs']} jobs "
          f"({args.jobs} layouts x {args.repeats} run(s) per fault + their healthy twins), "
          f"{args.steps} steps, world <= {args.max_world}, {res['seconds']} s\n")
    print(table(res))
    misses = [(sc, r) for sc, rows in res["rows"].items() for r in rows if r["misses"]]
    if misses:
        print("\nMisses (truth / output):")
        for sc, r in misses:
            print(f"- {sc}: {r['spec']} --seed {r['seed']}")
            for m in r["misses"]:
                print(f"    {m}")
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    payload = json.dumps({"args": vars(args), **res}, indent=1, default=str)
    (RESULTS_DIR / f"layouts-{stamp}.json").write_text(payload)
    (RESULTS_DIR / "layouts-latest.json").write_text(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
