#!/usr/bin/env python3
"""Findings accuracy over random synthetic scenarios (issue 7): a table, not a unit test.

Each scenario is a job from the project's generator (`rankscope.synth.generate_job`) whose
ground_truth.json says what was injected and which findings a correct analysis must emit
(`expected.findings`), may add downstream (`expected.possible_findings`) and which rank is a
straggler with which cause (`expected.stragglers`). The job is analysed exactly as a user would:
`rankscope.analyze(folder)` (parse every rank, per-rank analyses, cross-rank reduce, findings).

Scenarios (seeded): ranks log-uniform in [--min-ranks, --max-ranks]; --clean-share of them clean
(no performance fault; some with a clock offset, which must not matter). The others get at most one
straggler-making fault (straggler dataloader | host_idle | gpu_compute, uneven_shards, or one rank
with pageable_memcpy / fp32_gemm), each job-wide fault with probability --jobwide-share
(no_overlap, launch_bound, pageable_memcpy:rank=all, fp32_gemm:rank=all), at least one fault in
all, and benign extras: a clock offset on another rank, a truncated file on another rank. Sizes are
relative to the step time of the same job without the straggler (measured on 8 ranks first): a
straggler's delay, a pageable copy's duration and uneven_shards' extra work are 15-100% of it.
Left out on purpose: launch_bound with fp32_gemm or uneven_shards or a gpu_compute straggler (tiny
kernels leave nothing for the FP32 / extra GPU work to slow down; each hides the other's signal).

Reported (stdout table; JSON with every scenario in benchmarks/results/findings-<stamp>.json):
  per injection      scenarios whose findings include all that this injection is expected to cause
                     (straggler_rank must name its rank); "detectable" leaves out straggler-making
                     injections whose true cost (ground truth: the other ranks' step-time increase vs
                     the job without it) is < straggler_min_cost_pct_of_step % of the median step,
                     and no_overlap whose cost (step-time increase vs the same job generated with
                     overlap) is < findings exposed_comm_medium_pct % of the median step
  localization       a straggler_rank finding names the injected rank / and its cause
  clean high         clean jobs with any high-severity finding
  extra high         high findings not in expected + possible findings, or straggler_rank on a
                     rank that is not an injected straggler

Run from the repository root with the project venv:
    .venv/bin/python benchmarks/bench_findings.py                         # 100 scenarios, 8-256 ranks
    .venv/bin/python benchmarks/bench_findings.py --scenarios 30 --max-ranks 32 --seed 3   # quick
Options: --scenarios 100, --clean-share 0.2, --min-ranks 8, --max-ranks 256, --steps 3,
--scale 0.1667 (one transformer block: ~8 ms steps), --jobwide-share 0.25, --straggler-share 0.7,
--seed 0, --jobs 1 (scenarios in parallel processes, for machines with cores to spare), --keep.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

import rankscope  # noqa: E402
from rankscope.synth import Injection, expected_findings, generate_job  # noqa: E402
from rankscope.thresholds import THRESHOLDS  # noqa: E402

RESULTS_DIR = HERE / "results"
STRAGGLER_MAKERS = ("straggler:dataloader", "straggler:host_idle", "straggler:gpu_compute", "uneven_shards",
                    "pageable_memcpy:one", "fp32_gemm:one")
JOB_WIDE = ("no_overlap", "launch_bound", "pageable_memcpy:all", "fp32_gemm:all")
#: Pairs left out (see the module docstring).
EXCLUDED = {("launch_bound", "fp32_gemm:one"), ("launch_bound", "fp32_gemm:all"), ("launch_bound", "uneven_shards"),
            ("launch_bound", "straggler:gpu_compute")}
MIB_PER_MB = 1.048576


def label(inj: dict) -> str:
    """The injection's variant: straggler:<cause>, <kind>:one / :all, or the kind."""
    kind, p = inj["kind"], inj["params"]
    if kind == "straggler":
        return f"straggler:{p['cause']}"
    if kind in ("pageable_memcpy", "fp32_gemm"):
        return f"{kind}:{'all' if p['rank'] == 'all' else 'one'}"
    return kind


def short(inj: dict) -> str:
    params = ",".join(f"{k}={round(v, 2) if isinstance(v, float) else v}" for k, v in inj["params"].items())
    return inj["kind"] + (":" + params if params else "")


def job_wide_injections(rng: np.random.Generator, share: float, straggler: str | None) -> list[dict]:
    out = []
    for variant in rng.permutation(JOB_WIDE):
        chosen = [label(i) for i in out] + ([straggler] if straggler else [])
        if rng.random() >= share or any((variant, c) in EXCLUDED or (c, variant) in EXCLUDED for c in chosen) \
                or variant.split(":")[0] in {c.split(":")[0] for c in chosen}:
            continue
        if variant == "no_overlap":
            out.append({"kind": "no_overlap", "params": {}})
        elif variant == "launch_bound":
            out.append({"kind": "launch_bound", "params": {"rank": "all", "kernels_per_op": int(rng.integers(6, 17)),
                                                           "kernel_us": round(float(rng.uniform(2, 4)), 2)}})
        elif variant == "fp32_gemm:all":
            out.append({"kind": "fp32_gemm", "params": {"rank": "all", "slowdown": round(float(rng.uniform(4, 8)), 2)}})
        else:   # pageable_memcpy:all, its size set once the step time is known
            out.append({"kind": "pageable_memcpy", "params": {"rank": "all", "share": float(rng.uniform(0.03, 0.3)),
                                                              "gbps": round(float(rng.uniform(3, 10)), 2)}})
    return out


def make_scenarios(args, rng: np.random.Generator) -> list[dict]:
    """Scenario skeletons; sizes relative to the step time are filled in by `sized`."""
    out = []
    for i in range(args.scenarios):
        ranks = round(math.exp(rng.uniform(math.log(args.min_ranks), math.log(args.max_ranks + 0.5))))
        ranks = min(max(ranks, args.min_ranks), args.max_ranks)
        sc = {"id": i, "ranks": ranks, "seed": int(rng.integers(0, 2**31 - 1)), "clean": rng.random() < args.clean_share,
              "straggler": None, "job_wide": [], "benign": []}
        if not sc["clean"]:
            if rng.random() < args.straggler_share:
                sc["straggler"] = {"variant": str(rng.choice(STRAGGLER_MAKERS)), "rank": int(rng.integers(0, ranks)),
                                   "size": float(rng.uniform(0.15, 1.0)), "gbps": round(float(rng.uniform(3, 10)), 2),
                                   "slowdown": round(float(rng.uniform(4, 8)), 2)}
            variant = sc["straggler"]["variant"] if sc["straggler"] else None
            sc["job_wide"] = job_wide_injections(rng, args.jobwide_share, variant)
            if not sc["straggler"] and not sc["job_wide"]:
                sc["job_wide"] = job_wide_injections(rng, 1.0, None)[:1]
        taken = {sc["straggler"]["rank"]} if sc["straggler"] else set()
        for kind, share in (("clock_offset", 0.3), ("truncated", 0.1)):
            others = [r for r in range(ranks) if r not in taken]
            if rng.random() < share and others:
                rank = int(rng.choice(others))
                taken.add(rank)
                params = {"rank": rank, "offset_ms": round(float(rng.uniform(-20, 20)), 3)} if kind == "clock_offset" \
                    else {"rank": rank}
                sc["benign"].append({"kind": kind, "params": params})
        out.append(sc)
    return out


def sized(sc: dict, step_ms: float) -> list[dict]:
    """The scenario's injections with sizes from the step time of its job without the straggler."""
    injections = []
    for inj in sc["job_wide"]:
        p = dict(inj["params"])
        if inj["kind"] == "pageable_memcpy":
            p = {"rank": "all", "batch_mb": round(p.pop("share") * step_ms * p["gbps"] / MIB_PER_MB, 3), "gbps": p["gbps"]}
        injections.append({"kind": inj["kind"], "params": p})
    st = sc["straggler"]
    if st:
        extra_ms = st["size"] * step_ms
        kind, _, detail = st["variant"].partition(":")
        params = {"straggler": {"rank": st["rank"], "cause": detail, "delay_ms": round(extra_ms, 3)},
                  "uneven_shards": {"rank": st["rank"], "extra_pct": round(100 * st["size"], 1)},
                  "pageable_memcpy": {"rank": st["rank"], "batch_mb": round(extra_ms * st["gbps"] / MIB_PER_MB, 3),
                                      "gbps": st["gbps"]},
                  "fp32_gemm": {"rank": st["rank"], "slowdown": st["slowdown"]}}[kind]
        injections.append({"kind": kind, "params": params})
    return injections + sc["benign"]


def reference_step_ms(job_wide: list[dict], tmp: Path, args, cache: dict) -> float:
    """Median step of an 8-rank job with the job-wide faults only (pageable copies left out: their
    size is set from this step)."""
    kinds = [i for i in job_wide if i["kind"] != "pageable_memcpy"]
    key = json.dumps(kinds, sort_keys=True)
    if key not in cache:
        folder = tmp / f"ref{len(cache)}"
        truth = generate_job(folder, ranks=8, steps=args.steps, seed=12345, gzip=False, scale=args.scale,
                             injections=[Injection(i["kind"], i["params"]) for i in kinds])
        shutil.rmtree(folder, ignore_errors=True)
        cache[key] = float(statistics.median(t for r in truth["expected"]["per_rank"].values() for t in r["step_time_ms"]))
    return cache[key]


def no_overlap_cost_ms(sc: dict, injections: list[dict], truth: dict, tmp: Path, args) -> float | None:
    """What no_overlap costs per step: the median step-time increase over the same job with overlap
    (generated, not analysed). The exposed communication it adds is this; the rule flags it from
    exposed_comm_medium_pct % of the step on."""
    if not any(i["kind"] == "no_overlap" for i in injections):
        return None
    twin = generate_job(tmp / f"twin{sc['id']}", ranks=sc["ranks"], steps=args.steps, seed=sc["seed"], gzip=False,
                        scale=args.scale, injections=[Injection(i["kind"], i["params"]) for i in injections
                                                      if i["kind"] != "no_overlap"])
    shutil.rmtree(tmp / f"twin{sc['id']}", ignore_errors=True)
    increase = [a - b for r, row in truth["expected"]["per_rank"].items()
                for a, b in zip(row["step_time_ms"], twin["expected"]["per_rank"][r]["step_time_ms"])]
    return round(float(np.median(increase)), 3)


def run_scenario(sc: dict, injections: list[dict], tmp: Path, args) -> dict:
    job = tmp / f"job{sc['id']}"
    t0 = time.perf_counter()
    truth = generate_job(job, ranks=sc["ranks"], steps=args.steps, seed=sc["seed"], gzip=False, scale=args.scale,
                         injections=[Injection(i["kind"], i["params"]) for i in injections])
    t1 = time.perf_counter()
    analysis = rankscope.analyze(job, use_cache=False, engine="inprocess" if args.jobs > 1 else "auto")
    t2 = time.perf_counter()
    if not args.keep:
        shutil.rmtree(job, ignore_errors=True)
    exp = truth["expected"]
    no_overlap_cost = no_overlap_cost_ms(sc, injections, truth, tmp, args)
    found = [{"id": f.id, "severity": f.severity, "ranks": f.ranks, "cause": f.evidence.get("cause")}
             for f in analysis.findings]
    ids = {f["id"] for f in found}
    strag = [f for f in found if f["id"] == "straggler_rank"]
    median_step = float(np.median([t for r in exp["per_rank"].values() for t in r["step_time_ms"]]))
    true_stragglers = {s["rank"]: s for s in exp["stragglers"]}

    def straggler_row(s: dict) -> dict:
        hit = next((f for f in strag if f["ranks"] == [s["rank"]]), None)
        cost = float(np.mean(s["cost_ms_per_step"]))
        return {"rank": s["rank"], "cause": s["cause"], "true_cost_ms": round(cost, 3),
                "detectable": cost >= THRESHOLDS["straggler_min_cost_pct_of_step"].value / 100 * median_step,
                "localized": hit is not None, "cause_ok": hit is not None and hit["cause"] == s["cause"],
                "found_cause": hit and hit["cause"]}

    per_injection = []
    for inj in truth["injections"]:
        want = set(expected_findings([Injection(inj["kind"], inj["params"])]))
        s = true_stragglers.get(inj["params"].get("rank")) if "straggler_rank" in want else None
        row = straggler_row(s) if s else None
        ok = (want - {"straggler_rank"}) <= ids and (row is None or row["localized"])
        detectable = row["detectable"] if row else True
        if inj["kind"] == "no_overlap":
            detectable = no_overlap_cost >= THRESHOLDS["exposed_comm_medium_pct"].value / 100 * median_step
        per_injection.append({"label": label(inj), "expected": sorted(want), "ok": ok, "detectable": detectable})
    explained = set(exp["findings"]) | set(exp["possible_findings"])
    extra_high = [f for f in found if f["severity"] == "high" and
                  (f["id"] not in explained or (f["id"] == "straggler_rank" and f["ranks"][0] not in true_stragglers))]
    return {**sc, "injections": truth["injections"], "median_step_ms": round(median_step, 3),
            "expected": exp["findings"], "possible": exp["possible_findings"], "found": found,
            "missing": sorted(set(exp["findings"]) - ids), "per_injection": per_injection,
            "stragglers": [straggler_row(s) for s in exp["stragglers"]], "extra_high": extra_high,
            "no_overlap_cost_ms": no_overlap_cost,
            "gen_s": round(t1 - t0, 3), "analyze_s": round(t2 - t1, 3)}


def pct(a: int, b: int) -> str:
    return f"{a}/{b} = {100 * a / b:.1f}%" if b else "-"


def report(rows: list[dict], args, wall: float) -> None:
    print()
    print(f"findings accuracy, {len(rows)} synthetic scenarios ({args.min_ranks}-{args.max_ranks} ranks, "
          f"median {statistics.median(r['ranks'] for r in rows):.0f}; {args.steps} steps, scale {args.scale:.3f}, "
          f"seed {args.seed}), {wall:.0f} s")
    print(f"{'injection':24s}{'scenarios':>10s}{'expected findings found':>26s}{'(detectable)':>22s}")
    injections = [i for r in rows for i in r["per_injection"]]
    for name in (*STRAGGLER_MAKERS, *JOB_WIDE, "clock_offset", "truncated"):
        sub = [i for i in injections if i["label"] == name]
        det = [i for i in sub if i["detectable"]]
        print(f"{name:24s}{len(sub):>10d}{pct(sum(i['ok'] for i in sub), len(sub)):>26s}"
              f"{pct(sum(i['ok'] for i in det), len(det)):>22s}")
    faulty = [r for r in rows if not r["clean"]]
    strag = [s for r in rows for s in r["stragglers"]]
    det = [s for s in strag if s["detectable"]]
    print(f"{'all expected found':24s}{len(faulty):>10d}{pct(sum(not r['missing'] for r in faulty), len(faulty)):>26s}")
    print(f"{'straggler rank':24s}{len(strag):>10d}{pct(sum(s['localized'] for s in strag), len(strag)):>26s}"
          f"{pct(sum(s['localized'] for s in det), len(det)):>22s}")
    print(f"{'straggler rank + cause':24s}{len(strag):>10d}{pct(sum(s['cause_ok'] for s in strag), len(strag)):>26s}"
          f"{pct(sum(s['cause_ok'] for s in det), len(det)):>22s}")
    clean = [r for r in rows if r["clean"]]
    print(f"{'clean with a high':24s}{len(clean):>10d}{pct(sum(bool(r['extra_high']) for r in clean), len(clean)):>26s}")
    extra = Counter(f["id"] for r in rows for f in r["extra_high"])
    print(f"{'extra high findings':24s}{len(rows):>10d}{sum(extra.values()):>26d}   "
          + (", ".join(f"{k} x{v}" for k, v in extra.most_common()) or ""))
    ranks = sum(r["ranks"] for r in rows)
    print(f"time per rank: generate {1e3 * sum(r['gen_s'] for r in rows) / ranks:.0f} ms, "
          f"analyze {1e3 * sum(r['analyze_s'] for r in rows) / ranks:.0f} ms")


def _run(task: tuple) -> dict:
    sc, injections, tmp, args = task
    return run_scenario(sc, injections, tmp, args)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("scenarios", 100), ("clean-share", 0.2), ("min-ranks", 8), ("max-ranks", 256), ("steps", 3),
                          ("scale", 1 / 6), ("jobwide-share", 0.25), ("straggler-share", 0.7), ("seed", 0), ("jobs", 1)):
        ap.add_argument(f"--{name}", type=type(default), default=default)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--results", type=Path, default=RESULTS_DIR)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-findings-"))
    t_start = time.perf_counter()
    steps_cache: dict[str, float] = {}
    try:
        tasks = [(sc, sized(sc, reference_step_ms(sc["job_wide"], tmp, args, steps_cache)), tmp, args)
                 for sc in make_scenarios(args, rng)]
        rows = []
        with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else _Serial() as pool:
            for row in pool.map(_run, tasks):
                rows.append(row)
                mark = ("ok" if not row["missing"] else "MISSING " + ",".join(row["missing"])) + \
                    ("" if not row["extra_high"] else "  EXTRA HIGH " + ",".join(
                        f"{f['id']}{f['ranks'][:1]}" for f in row["extra_high"]))
                print(f"[{row['id']:3d}] {row['ranks']:3d} ranks  "
                      f"{'; '.join(short(i) for i in row['injections']) or 'clean':95.95s} {mark}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - t_start
    report(rows, args, wall)
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"findings-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                               "wall_s": wall, "reference_step_ms": steps_cache, "rows": rows}, indent=1))
    print(f"results: {out}")
    return 0


class _Serial:
    """The pool interface, in this process (the default on a shared 2-core machine)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, items):
        return map(fn, items)


if __name__ == "__main__":
    raise SystemExit(main())
