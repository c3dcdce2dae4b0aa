#!/usr/bin/env python3
"""Scale benchmark: the local engine (thread pool) vs the Ray engine (local Ray runtime) on generated jobs.

Sets (``--sets``, RANKSxMB per rank, default 8x10 64x10 256x10 64x50) are generated with the project's synth
(``rankscope.synth.generate_job``, one straggler injected, gzipped as Kineto writes them with ``use_gzip``)
into ``benchmarks/data/synth-RxMMB/`` (git-ignored; a stamp next to the folder lets a later run reuse them).
Then, per set and side by side, each in a fresh subprocess:

    rankscope analyze DIR --no-cache --json -q --engine local|ray      (stdout kept, checked, compared)

Measured per run: wall time, CPU seconds of the whole process tree, the driver's own peak RSS (its
``ru_maxrss`` at exit: the high-water mark of the ``rankscope`` process alone, exact) and the peak RSS of the
whole process tree (Ray's raylet, GCS and workers included; polled by ``bench_load.run_measured``).
The 8/64/256 x 10 MB rows give the driver-memory curve (same per-rank size, more ranks).

``--profile`` (default on) adds what the 4,096-rank projection in benchmarks/README.md needs, measured in this
process on one core: per-rank read, gunzip, parse and summarize seconds; the summary's size (msgpack, pickle,
Python heap in the driver); and the cross-rank reduce time at 8/64/256 ranks (``analyze`` on cached summaries:
time after the last rank is in).

Run with the project venv: ``.venv/bin/python benchmarks/bench_scale.py [--sets 8x10 64x10] [--engines local ray]``
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import bench_load  # noqa: E402  (measurement helpers: process-tree RSS sampler, page-cache warm-up)

MB = bench_load.MB
DATA_DIR = HERE / "data"
RESULTS_DIR = HERE / "results"
DEFAULT_SETS = ["8x10", "64x10", "256x10", "64x50"]
STEPS = 6
SEED = 0
INJECT = "straggler:rank=3,cause=dataloader,delay_ms=40"
SYNTH_MB_PER_SCALE = 50 / 12          # synth: --scale 12 gives ~50 MB (uncompressed) per rank at 6 steps

# The driver: the rankscope CLI, writing its own peak RSS (bytes) to a file at exit.
DRIVER = r"""
import atexit, os, resource, sys
def _peak():
    with open(os.environ["BENCH_DRIVER_PEAK_RSS"], "w") as f:
        f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
atexit.register(_peak)
sys.argv[0] = "rankscope"
from rankscope.cli import main
main()
"""


# ----------------------------------------------------------------------------------------------- data
def parse_set(text: str) -> tuple[int, float]:
    ranks, _, mb = text.lower().partition("x")
    return int(ranks), float(mb.removesuffix("mb"))


def gunzipped_size(path: Path) -> int:
    """Uncompressed size from the gzip trailer (ISIZE, mod 2**32: exact below 4 GiB)."""
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


def build_set(ranks: int, mb: float, root: Path) -> tuple[Path, dict]:
    """Generate (or reuse) a synth job; returns its folder and stamp (params, files, sizes, generation s)."""
    from rankscope.synth import generate_job, parse_injection
    out = root / f"synth-{ranks}x{mb:g}MB"
    stamp_path = out.with_name(out.name + ".stamp.json")
    params = {"ranks": ranks, "mb": mb, "scale": round(mb / SYNTH_MB_PER_SCALE, 4), "steps": STEPS, "seed": SEED,
              "inject": INJECT, "gzip": True}
    if stamp_path.exists():
        stamp = json.loads(stamp_path.read_text())
        if stamp["params"] == params and all((out / f).is_file() for f in stamp["files"]):
            return out, stamp
    print(f"generating {ranks} x {mb:g} MB into {out} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    generate_job(out, ranks=ranks, steps=STEPS, seed=SEED, injections=[parse_injection(INJECT)],
                 gzip=True, scale=params["scale"])
    gen_s = time.perf_counter() - t0
    files = sorted(p for p in out.iterdir() if p.name.endswith(".pt.trace.json.gz"))
    stamp = {"params": params, "generation_s": gen_s, "files": [p.name for p in files],
             "gz_bytes": sum(p.stat().st_size for p in files), "bytes": sum(gunzipped_size(p) for p in files),
             "largest_bytes": max(gunzipped_size(p) for p in files)}
    stamp_path.write_text(json.dumps(stamp, indent=1) + "\n")
    print(f"    {gen_s:.0f} s, {stamp['bytes'] / MB:.0f} MB ({stamp['gz_bytes'] / MB:.0f} MB gzipped)",
          file=sys.stderr, flush=True)
    return out, stamp


# ----------------------------------------------------------------------------------------------- runs
def python_exe() -> str:
    py = ROOT / ".venv" / "bin" / "python"
    return str(py if py.exists() else sys.executable)


def comparable(doc: dict) -> dict:
    """The analysis without what depends on how ranks were mapped; floats to 9 significant digits."""
    for r in doc.get("ranks", []):
        r.pop("from_cache", None)
    return json.loads(json.dumps(doc), parse_float=lambda s: float(f"{float(s):.9g}"))


def differences(a, b, path: str = ""):
    """Paths (and both values) where two JSON documents differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in dict.fromkeys([*a, *b]):
            yield from differences(a.get(k), b.get(k), f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield path, a, b


def run_engine(folder: Path, engine: str, ranks: int, args, logdir: Path) -> tuple[dict, dict | None]:
    tag = f"{folder.name}-{engine}"
    peak_file, out_file = logdir / f"{tag}.driver-rss", logdir / f"{tag}.json"
    env = dict(os.environ, BENCH_DRIVER_PEAK_RSS=str(peak_file))
    cmd = [python_exe(), "-c", DRIVER, "analyze", str(folder), "--no-cache", "--json", "-q", "--engine", engine]
    print(f"[{folder.name}] {engine}: rankscope analyze {folder} --no-cache --json -q --engine {engine}",
          file=sys.stderr, flush=True)
    with open(out_file, "wb") as out:
        r = bench_load.run_measured(cmd, env=env, stdout=out, timeout=args.timeout, interval=args.interval,
                                    stderr_path=logdir / f"{tag}.err", with_pss=False)
    r["cmd"] = ["rankscope", *cmd[3:]]
    r["driver_peak_rss_bytes"] = int(peak_file.read_text()) if peak_file.exists() else None
    r["json_out_bytes"] = out_file.stat().st_size
    doc = None
    try:
        doc = json.loads(out_file.read_bytes())
        if len(doc.get("ranks", [])) != ranks:
            r["error"] = f"output has {len(doc.get('ranks', []))} of {ranks} ranks"
    except ValueError:
        r["error"] = "no JSON on stdout"
    ok = bench_load.run_ok("rankscope", r)
    print(f"    -> {'ok' if ok else 'FAILED: ' + str(r.get('error') or r['rc'])}: wall {r['wall_s']:.2f} s, "
          f"driver {(r['driver_peak_rss_bytes'] or 0) / MB:.0f} MB, tree {r['peak_rss_bytes'] / MB:.0f} MB",
          file=sys.stderr, flush=True)
    if not ok:
        for line in r["stderr_tail"][-5:]:
            print(f"       | {line[:200]}", file=sys.stderr)
    return r, (comparable(doc) if ok and doc else None)


def bench_set(text: str, args, cores: int, logdir: Path) -> dict:
    ranks, mb = parse_set(text)
    folder, stamp = build_set(ranks, mb, args.data_dir)
    bench_load.warm_page_cache([folder / f for f in stamp["files"]])
    res = {"set": text, "ranks": ranks, "mb_per_rank": mb, "folder": str(folder), "stamp": stamp, "rows": []}
    docs = {}
    for rep in range(args.repeat):
        for engine in args.engines:
            r, docs[engine] = run_engine(folder, engine, ranks, args, logdir)
            r.update(engine=engine, repeat=rep)
            res["rows"].append(r)
    if "local" in docs and len(docs) > 1:
        res["same_as_local"] = {e: (d is not None and d == docs["local"]) for e, d in docs.items() if e != "local"}
        res["differences"] = {e: list(differences(docs["local"], d))[:8] for e, d in docs.items()
                              if e != "local" and d is not None and d != docs["local"]}
    res["summary"] = summarize(res, cores)
    return res


def summarize(res: dict, cores: int) -> list[dict]:
    rows = []
    for engine in dict.fromkeys(r["engine"] for r in res["rows"]):
        runs = [r for r in res["rows"] if r["engine"] == engine]
        good = [r for r in runs if bench_load.run_ok("rankscope", r)]
        row = {"set": res["set"], "ranks": res["ranks"], "mb_total": res["stamp"]["bytes"] / MB, "engine": engine,
               "n": len(runs), "same_as_local": res.get("same_as_local", {}).get(engine)}
        if good:
            row["wall_s"] = statistics.median(r["wall_s"] for r in good)
            row["cpu_s"] = statistics.median(r["cpu_s"] for r in good)
            row["mb_per_s_per_core"] = row["mb_total"] / row["wall_s"] / cores
            row["driver_peak_rss_mb"] = max(r["driver_peak_rss_bytes"] or 0 for r in good) / MB
            row["tree_peak_rss_mb"] = max(r["peak_rss_bytes"] for r in good) / MB
            row["json_out_mb"] = good[-1]["json_out_bytes"] / MB
        else:
            row["error"] = runs[-1].get("error") or f"rc={runs[-1]['rc']}"
        rows.append(row)
    local = next((r for r in rows if r["engine"] == "local" and "wall_s" in r), None)
    for row in rows:
        if local and "wall_s" in row:
            row["wall_vs_local"] = row["wall_s"] / local["wall_s"]
            row["driver_rss_vs_local"] = row["driver_peak_rss_mb"] / local["driver_peak_rss_mb"]
    return rows


# ----------------------------------------------------------------------------------------------- profile
def profile_rank(folder: Path, stamp: dict) -> dict:
    """One rank, in this process, one core: read, gunzip, parse (incl. gunzip), summarize; summary sizes."""
    import msgspec
    from isal import igzip
    from rankscope.analyses.rank.summary import summarize_rank
    from rankscope.results.rank import RankSummary
    from rankscope.ingest.kineto import read_kineto
    path = folder / stamp["files"][0]
    t0 = time.perf_counter()
    data = path.read_bytes()
    t1 = time.perf_counter()
    text_bytes = len(igzip.decompress(data))
    t2 = time.perf_counter()
    trace = read_kineto(path)[0]
    t3 = time.perf_counter()
    summary = summarize_rank(trace)
    t4 = time.perf_counter()
    packed = msgspec.msgpack.encode(summary)
    n = 20                                   # Python heap of summaries as the driver holds them
    tracemalloc.start()
    held = [msgspec.msgpack.decode(packed, type=RankSummary) for _ in range(n)]
    heap = tracemalloc.get_traced_memory()[0] / n
    tracemalloc.stop()
    del held, trace
    return {"set": folder.name, "file": path.name, "bytes": text_bytes, "gz_bytes": len(data),
            "read_s": t1 - t0, "gunzip_s": t2 - t1, "parse_s": t3 - t2, "parse_without_gunzip_s": t3 - t2 - (t2 - t1),
            "summarize_s": t4 - t3, "summary_msgpack_bytes": len(packed), "summary_pickle_bytes": len(pickle.dumps(summary)),
            "summary_heap_bytes": heap,
            "summary_sections_msgpack_bytes": {k: len(msgspec.msgpack.encode(getattr(summary, k)))
                                               for k in ("steps", "collectives", "name_totals", "kernels", "operators",
                                                         "hta", "gaps", "grad_sync", "memory", "meta")}}


def profile_reduce(folder: Path) -> dict:
    """analyze on cached summaries (filled first): wall of the whole call, and the part after the last
    rank came in (cross-rank reduce, job info, findings)."""
    from rankscope.api import analyze
    cache = Path(tempfile.mkdtemp(prefix="bench-scale-cache-"))
    try:
        analyze(folder, cache_dir=cache, engine="local")
        last = [0.0]
        t0 = time.perf_counter()
        a = analyze(folder, cache_dir=cache, engine="local",
                    on_progress=lambda done, total, f: last.__setitem__(0, time.perf_counter()))
        t1 = time.perf_counter()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    n_coll = a.cross.collectives.collectives.height if a.cross is not None else 0
    return {"set": folder.name, "ranks": len(a.ranks), "map_cached_s": last[0] - t0, "reduce_s": t1 - last[0],
            "matched_collectives": n_coll}


# ----------------------------------------------------------------------------------------------- output
def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(results: list[dict], cores: int) -> None:
    head = ["set", "ranks", "MB total", "engine", "wall s", "MB/s/core", "busy", "driver RSS MB", "tree RSS MB",
            "wall ray/local", "driver RSS ray/local", "same as local", "JSON out MB"]
    lines = []
    for res in results:
        for r in res["summary"]:
            if "wall_s" not in r:
                lines.append([r["set"], str(r["ranks"]), f"{r['mb_total']:.0f}", r["engine"], "FAILED", r["error"][:60]]
                             + [""] * 7)
                continue
            same = r["same_as_local"]
            lines.append([r["set"], str(r["ranks"]), f"{r['mb_total']:.0f}", r["engine"], f"{r['wall_s']:.2f}",
                          f"{r['mb_per_s_per_core']:.1f}",
                          f"{r['cpu_s'] / r['wall_s']:.2f}" if r["engine"] == "local" else "-",
                          f"{r['driver_peak_rss_mb']:.0f}", f"{r['tree_peak_rss_mb']:.0f}",
                          _f(r.get("wall_vs_local"), ".2f") if r["engine"] != "local" else "",
                          _f(r.get("driver_rss_vs_local"), ".2f") if r["engine"] != "local" else "",
                          "" if same is None else ("yes" if same else "NO"), f"{r['json_out_mb']:.1f}"])
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for l in lines:
        print("  ".join(c.rjust(w) for c, w in zip(l, widths)))
    print(f"MB = 1e6 bytes of uncompressed trace JSON; MB/s/core over {cores} cores; busy = tree CPU s / wall "
          f"(local only: Ray's workers are not reaped by this process, their CPU time is not seen); "
          f"driver RSS = peak of the rankscope process alone (ru_maxrss); tree RSS = peak summed RSS of it and "
          f"every descendant (Ray's raylet, GCS, workers)")
    for res in results:
        s = res["stamp"]
        print(f"{res['set']}: {res['ranks']} files, {s['bytes'] / MB:.0f} MB ({s['gz_bytes'] / MB:.0f} MB gzipped), "
              f"largest {s['largest_bytes'] / MB:.1f} MB; generated in {s['generation_s']:.0f} s")
        for engine, diffs in res.get("differences", {}).items():
            print(f"    {engine} differs from local at: " + "; ".join(f"{p} {x!r} vs {y!r}"[:90] for p, x, y in diffs[:3]))


def print_curve(results: list[dict]) -> None:
    """Driver peak RSS against ranks, for sets of one per-rank size with at least 3 rank counts."""
    by_mb: dict[float, list[dict]] = {}
    for res in results:
        by_mb.setdefault(res["mb_per_rank"], []).append(res)
    for mb, group in by_mb.items():
        if len(group) < 2:
            continue
        group.sort(key=lambda r: r["ranks"])
        print(f"driver peak RSS (MB) at {mb:g} MB per rank, ranks {' / '.join(str(r['ranks']) for r in group)}:")
        for engine in dict.fromkeys(row["engine"] for res in group for row in res["summary"]):
            pts = [(res["ranks"], row["driver_peak_rss_mb"]) for res in group for row in res["summary"]
                   if row["engine"] == engine and "driver_peak_rss_mb" in row]
            if len(pts) < 2:
                continue
            slope = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) * 1000
            print(f"    {engine:>6}: {' / '.join(f'{v:.0f}' for _, v in pts)}   "
                  f"(+{slope:.1f} MB per 1,000 ranks, from the end points)")


def print_profile(prof: dict) -> None:
    for p in prof.get("ranks", []):
        mb = p["bytes"] / MB
        print(f"one rank of {p['set']} ({mb:.1f} MB, {p['gz_bytes'] / MB:.1f} MB gz), one core: read {p['read_s']:.3f} s, "
              f"gunzip {p['gunzip_s']:.2f} s, parse incl. gunzip {p['parse_s']:.2f} s, summarize {p['summarize_s']:.2f} s "
              f"-> {(p['parse_s'] + p['summarize_s']) / mb * 1000:.1f} s per GB; summary {p['summary_msgpack_bytes'] / 1e3:.0f} KB "
              f"msgpack, {p['summary_pickle_bytes'] / 1e3:.0f} KB pickle, {p['summary_heap_bytes'] / 1e3:.0f} KB Python heap")
        big = sorted(p["summary_sections_msgpack_bytes"].items(), key=lambda kv: -kv[1])[:4]
        print("    largest parts (msgpack KB): " + ", ".join(f"{k} {v / 1e3:.0f}" for k, v in big))
    for r in prof.get("reduce", []):
        print(f"reduce at {r['ranks']} ranks ({r['set']}, {r['matched_collectives']} collectives): "
              f"{r['reduce_s']:.3f} s after the last rank (map from cached summaries {r['map_cached_s']:.2f} s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", nargs="+", default=DEFAULT_SETS, help="RANKSxMB per rank (default 8x10 64x10 256x10 64x50)")
    ap.add_argument("--engines", nargs="+", default=["local", "ray"])
    ap.add_argument("--repeat", type=int, default=1, help="runs per engine and set (median wall, max RSS)")
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="skip the per-rank stage timings, summary sizes and reduce timings")
    ap.add_argument("--data-dir", type=Path, default=DATA_DIR)
    ap.add_argument("--interval", type=float, default=0.05, help="tree RSS polling interval, s")
    ap.add_argument("--timeout", type=float, default=1800, help="per run, s")
    ap.add_argument("--results", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)
    free = shutil.disk_usage(a.data_dir if a.data_dir.exists() else a.data_dir.parent).free
    print(f"free disk at {a.data_dir}: {free / 1e9:.0f} GB", file=sys.stderr)

    from rankscope.engine import default_workers
    ncpu = default_workers()          # what both engines use: local threads, local Ray runtime CPUs
    logdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    results = []
    for text in a.sets:
        ranks = parse_set(text)[0]
        results.append(bench_set(text, a, min(ncpu, ranks), logdir))
    prof: dict = {}
    if a.profile:
        folders = {res["mb_per_rank"]: (Path(res["folder"]), res["stamp"]) for res in results}
        prof["ranks"] = [profile_rank(f, s) for _, (f, s) in sorted(folders.items())]
        smallest = min(folders)
        prof["reduce"] = [profile_reduce(Path(res["folder"])) for res in results if res["mb_per_rank"] == smallest]
    shutil.rmtree(logdir, ignore_errors=True)

    print_table(results, min(ncpu, max(r["ranks"] for r in results)))
    print_curve(results)
    print_profile(prof)

    a.results.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    git_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    doc = {"benchmark": "scale", "when": stamp, "git_rev": git_rev,
           "machine": {"cpu_count": ncpu, "platform": platform.platform(), "python": platform.python_version(),
                       "loadavg_1min_at_end": os.getloadavg()[0]},
           "results": results, "profile": prof}
    path = a.results / f"scale-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (a.results / "scale-latest.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
