#!/usr/bin/env python
"""Flight Recorder dumps of a large job: how long `rankscope analyze` takes to name the rank that
stopped it, before and after a change (side by side, one run), and torch's own `fr_trace` on the
same dumps.

The bench writes synthetic NCCL-style dumps (format 2.10, as torch's pickler writes them: pg_config
with each group's ranks, entries with state / times / sizes / 4 Python frames, each entry its own
list of frame dicts, the strings shared as the pickler memoizes them) of a dp x tp job:
each step a tp all_reduce then a dp all_reduce; every rank's ring buffer holds its last `--entries`
entries (2,000: torch's default buffer; 200: a job dumped 100 steps after its start, or a smaller
buffer). At the last step one rank (`CULPRIT`) never enters its tp
all_reduce: its tp peers wait in it, and every dp group, which holds one of them, waits in its dp
all_reduce (9 stalled groups at 1,024 ranks: 8 of them victims). Then, per job:

  before       `rankscope analyze DIR --json` of the code at `--base` (a commit: its tree exported
               with `git archive` to a temporary folder, its C parts built there, run with that
               folder's src/ first on PYTHONPATH), a subprocess, verdict checked;
  after        the same command of this checkout, right after, so both see the same machine load;
  phases       in one process, this checkout: read + per-rank summary of every dump, and the
               cross-rank verdict, each timed;
  fr_trace     `python -m torch.distributed.flight_recorder.fr_trace DIR` (when torch is installed;
               on the first job only, since it matches entries pairwise), with what it prints last.

    python benchmarks/bench_hang.py                     # 64 x 200, 1,024 x 200, 1,024 x 2,000 entries
    python benchmarks/bench_hang.py --jobs 256x500 --base HEAD~3
    python benchmarks/bench_hang.py --no-before         # this checkout only
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The commit issue 30 left (before the Flight Recorder reading was made fast).
BASE = "a264949"
TP = 8
CULPRIT = 5
T0 = 1_790_000_000_000_000_000
FRAMES = [{"name": "all_reduce", "filename": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
           "line": 2696},
          {"name": "wrapper", "filename": "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py",
           "line": 83},
          {"name": "train_step", "filename": "/job/train.py", "line": 42},
          {"name": "main", "filename": "/job/train.py", "line": 97}]


def write_job(folder: Path, ranks: int, entries: int) -> dict:
    """Dumps of `ranks` ranks (dp = ranks / TP), each with its last `entries` entries; the truth."""
    folder.mkdir(parents=True, exist_ok=True)
    dp = ranks // TP
    tp_groups = {r: r // TP for r in range(ranks)}                    # tp group g: ranks g*TP .. g*TP+TP-1
    dp_groups = {r: r % TP for r in range(ranks)}                     # dp group k: ranks k, k+TP, ...
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(ranks)))}}
    for g in range(dp):
        config[f"tp{g}"] = {"name": f"tp{g}", "desc": "mesh_tp", "ranks": str(list(range(g * TP, g * TP + TP)))}
    for k in range(TP):
        config[f"dp{k}"] = {"name": f"dp{k}", "desc": "mesh_dp", "ranks": str(list(range(k, ranks, TP)))}
    steps = entries // 2 + 1
    culprit_tp = tp_groups[CULPRIT]
    for r in range(ranks):
        es = []
        for step in range(1, steps + 1):
            last = step == steps
            for kind, name in (("tp", f"tp{tp_groups[r]}"), ("dp", f"dp{dp_groups[r]}")):
                if last and r == CULPRIT:
                    break                                   # the culprit never enters its last tp all_reduce
                if last and kind == "dp" and tp_groups[r] == culprit_tp:
                    break                                   # its tp peers wait in that tp all_reduce
                stuck = last           # every group at the last step has a member that never came
                rid = 2 * (step - 1) + (kind == "dp")
                created = T0 + rid * 1_000_000 + r * 1000
                es.append({"record_id": rid, "pg_id": 1 if kind == "tp" else 2, "process_group": (name, f"mesh_{kind}"),
                           "collective_seq_id": step, "p2p_seq_id": 0, "op_id": step,
                           "profiling_name": "nccl:all_reduce", "time_created_ns": created,
                           "input_sizes": [[4096, 1024]], "input_dtypes": ["BFloat16"],
                           "output_sizes": [[4096, 1024]], "output_dtypes": ["BFloat16"],
                           "state": "started" if stuck else "completed",
                           "time_discovered_started_ns": created + 10_000,
                           "time_discovered_completed_ns": None if stuck else created + 500_000,
                           "duration_ms": None if stuck else 0.49, "retired": not stuck, "timeout_ms": 600_000,
                           "is_p2p": False, "frames": [dict(f) for f in FRAMES]})
        dump = {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": es[-entries:],
                "comm_lib_version": "2.21.5"}
        (folder / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(dump, protocol=2))
    return {"culprit": CULPRIT, "group": f"tp{culprit_tp}", "seq": steps,
            "group_ranks": list(range(culprit_tp * TP, culprit_tp * TP + TP))}


def run_rankscope(folder: Path, truth: dict, src: Path | None = None) -> tuple[float, float]:
    """`rankscope analyze DIR --json` in a subprocess (with `src` first on PYTHONPATH: another
    checkout's code): (seconds, its peak RSS MB); checks the verdict."""
    env = dict(os.environ, RANKSCOPE_CACHE_DIR=str(folder.parent / "cache"))
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "rankscope", "analyze", str(folder), "--json", "-q"],
                                stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    code = os.waitstatus_to_exitcode(status)
    try:
        h = json.loads(stdout)["hang"]
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"rankscope gave no verdict (exit {code}): {stderr[-300:]}") from None
    ok = (code == 1 and h["culprits"] == [truth["culprit"]] and h["first"]["group"] == truth["group"]
          and h["first"]["seq"] == truth["seq"] and h["first"]["group_ranks"] == truth["group_ranks"])
    if not ok:
        raise SystemExit(f"rankscope's verdict is wrong: {h['verdict']} (exit {code}; {stderr[-300:]})")
    return seconds, usage.ru_maxrss / 1024


def base_checkout(commit: str, into: Path) -> Path:
    """The tree of `commit` exported to `into` (git archive: nothing in this repository changes),
    its C parts built in place (setuptools, from its setup.py's list); its src/ folder."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    build = (
        "import re, sys; from pathlib import Path; from setuptools import Extension, setup\n"
        "root = Path(sys.argv[1])\n"
        "mods = re.findall(r'_optional\\(\"([\\w.]+)\", \"([\\w/.]+)\"', (root / 'setup.py').read_text())\n"
        "setup(name='base', script_args=['-q', 'build_ext', '--build-lib', str(root / 'src'), '--build-temp',\n"
        "      str(root / 'build')], ext_modules=[Extension(m, [str(root / s)], extra_compile_args=['-O3'],\n"
        "      include_dirs=[str(root / 'src/rankscope/analyses')]) for m, s in mods])\n")
    subprocess.run([sys.executable, "-c", build, str(into)], cwd=into.parent, capture_output=True, check=True)
    return into / "src"


def phases(folder: Path) -> tuple[float, float]:
    """In-process, as `analyze` does them: (read + per-rank summary s, cross-rank verdict s)."""
    from rankscope.analyses.inputs.flight_recorder import LAST_ENTRIES, summarize_dump
    from rankscope.analyses.job.hang import hang_report
    from rankscope.ingest.flight_recorder import read_fr_dump
    t = time.perf_counter()
    summaries = [summarize_dump(read_fr_dump(p, frames_last=LAST_ENTRIES)) for p in sorted(folder.iterdir())]
    t1 = time.perf_counter()
    hang_report(summaries)
    return t1 - t, time.perf_counter() - t1


def run_fr_trace(folder: Path, timeout: int) -> tuple[float | None, str]:
    """torch's fr_trace on the dumps: (seconds or None when it failed / timed out, its last line)."""
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder),
                               "--prefix", "nccl_trace_rank_"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"still running after {timeout} s: stopped"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return (time.perf_counter() - t if proc.returncode == 0 else None), (lines[-1] if lines else "(no output)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="+", default=["64x200", "1024x200", "1024x2000"],
                    help="RANKSxENTRIES per job (ranks a multiple of 8); fr_trace runs on the first")
    ap.add_argument("--base", default=BASE, help="the commit whose code is `before` (default: %(default)s)")
    ap.add_argument("--no-before", action="store_true", help="run this checkout only")
    ap.add_argument("--fr-timeout", type=int, default=300)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        base = None if args.no_before else base_checkout(args.base, Path(tmp) / "base")
        for i, job in enumerate(args.jobs):
            ranks, entries = map(int, job.split("x"))
            folder = Path(tmp) / f"job{ranks}x{entries}"
            truth = write_job(folder, ranks, entries)
            mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
            before = run_rankscope(folder, truth, base) if base else (None, None)
            after = run_rankscope(folder, truth)
            read_s, reduce_s = phases(folder)
            torch_s, torch_said = run_fr_trace(folder, args.fr_timeout) if i == 0 else (None, "-")
            rows.append((ranks, entries, mb, *before, *after, read_s, reduce_s, torch_s, torch_said))
            shutil.rmtree(folder)
    print(f"{'ranks':>6} {'entries':>8} {'MB':>7} {'before s':>9} {'before MB':>10} {'after s':>8} {'after MB':>9} "
          f"{'speed-up':>9} {'read+map s':>11} {'reduce s':>9} {'fr_trace s':>11}")
    for ranks, entries, mb, b_s, b_mb, a_s, a_mb, read_s, reduce_s, torch_s, said in rows:
        fr_text = f"{torch_s:.2f}" if torch_s else "failed" if said != "-" else "-"
        print(f"{ranks:>6} {entries:>8} {mb:>7.1f} {_num(b_s, 9, 2)} {_num(b_mb, 10, 0)} {a_s:>8.2f} {a_mb:>9.0f} "
              f"{(f'{b_s / a_s:.1f}x' if b_s else '-'):>9} {read_s:>11.2f} {reduce_s:>9.2f} {fr_text:>11}")
    for ranks, entries, *_, torch_s, said in rows:
        if said != "-":
            print(f"fr_trace at {ranks} ranks x {entries} entries, its last line: {said[:200]}"
                  + (f" (it took {torch_s / rows[0][5]:.1f}x the time of `after`)" if torch_s else ""))
    print(f"before: `rankscope analyze DIR --json` of commit {args.base}; after: of this checkout (each a subprocess, "
          "one after the other on the same dumps, verdict checked: culprit, group, seq); MB: the dumps on disk, "
          "then the largest resident memory of the rankscope process (worker processes, where the code uses "
          "them, apart); speed-up: before s / after s; read+map s: reading and summarising every dump in one "
          "process (this checkout); reduce s: its cross-rank verdict; fr_trace: torch's analyser on the first "
          "job ('failed': it stopped with an error or at the timeout)")


def _num(v: float | None, width: int, digits: int) -> str:
    return f"{v:>{width}.{digits}f}" if v is not None else f"{'-':>{width}}"


if __name__ == "__main__":
    main()
