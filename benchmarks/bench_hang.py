#!/usr/bin/env python
"""Flight Recorder dumps of a large job: how long `rankscope analyze` takes to name the rank that
stopped it, and torch's own `fr_trace` on the same dumps (side by side, one run).

The bench writes synthetic NCCL-style dumps (format 2.10, as torch's pickler writes them: pg_config
with each group's ranks, entries with state / times / sizes / 4 Python frames) of a dp x tp job:
each step a tp all_reduce then a dp all_reduce; every rank's ring buffer holds its last `--entries`
entries (2,000: torch's default buffer; 200: a job dumped 100 steps after its start, or a smaller
buffer). At the last step one rank (`CULPRIT`) never enters its tp
all_reduce: its tp peers wait in it, and every dp group, which holds one of them, waits in its dp
all_reduce (9 stalled groups at 1,024 ranks: 8 of them victims). Then:

  rankscope    `rankscope analyze DIR --json` (a subprocess: start, read, verdict, JSON), checked to
               name the culprit, its tp group and the sequence number;
  phases       in one process: read + per-rank summary, and the cross-rank verdict, each timed
               (`analyze` reads many dumps in worker processes);
  fr_trace     `python -m torch.distributed.flight_recorder.fr_trace DIR` (when torch is installed;
               at --fr-ranks ranks, since it matches entries pairwise), with what it prints last.

    python benchmarks/bench_hang.py                       # 1,024 ranks x 200 and x 2,000 entries
    python benchmarks/bench_hang.py --ranks 256 --entries 500 --fr-ranks 64
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
                           "is_p2p": False, "frames": FRAMES})
        dump = {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": es[-entries:],
                "comm_lib_version": "2.21.5"}
        (folder / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(dump, protocol=2))
    return {"culprit": CULPRIT, "group": f"tp{culprit_tp}", "seq": steps,
            "group_ranks": list(range(culprit_tp * TP, culprit_tp * TP + TP))}


def run_rankscope(folder: Path, truth: dict) -> tuple[float, float]:
    """`rankscope analyze DIR --json` in a subprocess: (seconds, its peak RSS MB); checks the verdict."""
    env = dict(os.environ, RANKSCOPE_CACHE_DIR=str(folder.parent / "cache"))
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
    h = json.loads(stdout)["hang"]
    ok = (code == 1 and h["culprits"] == [truth["culprit"]] and h["first"]["group"] == truth["group"]
          and h["first"]["seq"] == truth["seq"] and h["first"]["group_ranks"] == truth["group_ranks"])
    if not ok:
        raise SystemExit(f"rankscope's verdict is wrong: {h['verdict']} (exit {code}; {stderr[-300:]})")
    return seconds, usage.ru_maxrss / 1024


def phases(folder: Path) -> tuple[float, float]:
    """In-process: (read + per-rank summary s, cross-rank verdict s)."""
    from rankscope.analyses.inputs.flight_recorder import summarize_dump
    from rankscope.analyses.job.hang import hang_report
    from rankscope.ingest.flight_recorder import read_fr_dump
    t = time.perf_counter()
    summaries = [summarize_dump(read_fr_dump(p)) for p in sorted(folder.iterdir())]
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
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, nargs="+", default=[200, 2000],
                    help="entries per rank's ring buffer (several: one row each)")
    ap.add_argument("--fr-ranks", type=int, default=64,
                    help="ranks of the job both tools analyse (fr_trace), with the first --entries")
    ap.add_argument("--fr-timeout", type=int, default=300)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        jobs = [(args.fr_ranks, args.entries[0], True)] + [(args.ranks, e, False) for e in args.entries]
        for ranks, entries, compare in jobs:
            folder = Path(tmp) / f"job{ranks}x{entries}"
            t = time.perf_counter()
            truth = write_job(folder, ranks, entries)
            written = time.perf_counter() - t
            mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
            ours, rss = run_rankscope(folder, truth)
            read_s, reduce_s = phases(folder)
            torch_s, torch_said = run_fr_trace(folder, args.fr_timeout) if compare else (None, "-")
            rows.append((ranks, entries, mb, written, ours, read_s, reduce_s, rss, torch_s, torch_said))
            shutil.rmtree(folder)
    print(f"{'ranks':>6} {'entries':>8} {'MB':>7} {'write s':>8} {'rankscope s':>12} {'read+map s':>11} "
          f"{'reduce s':>9} {'peak MB':>8} {'fr_trace s':>11} {'ratio':>6}")
    for ranks, entries, mb, written, ours, read_s, reduce_s, rss, torch_s, said in rows:
        ratio = f"{torch_s / ours:.1f}x" if torch_s else "-"
        print(f"{ranks:>6} {entries:>8} {mb:>7.1f} {written:>8.1f} {ours:>12.2f} {read_s:>11.2f} {reduce_s:>9.2f} "
              f"{rss:>8.0f} {(f'{torch_s:.2f}' if torch_s else 'failed' if said != '-' else '-'):>11} {ratio:>6}")
    for ranks, entries, *_, torch_s, said in rows:
        if said != "-":
            print(f"fr_trace at {ranks} ranks x {entries} entries, its last line: {said[:200]}")
    print("rankscope s: `rankscope analyze DIR --json` end to end (a subprocess; verdict checked: culprit, "
          "group, seq); read+map s: reading and summarising every dump in one process; reduce s: the cross-rank "
          "verdict; peak MB: the largest resident memory of the rankscope process (its worker processes, one "
          "dump at a time each, apart); ratio: fr_trace s / "
          "rankscope s on the same dumps; fr_trace 'failed': it stopped with an error or at the "
          "timeout")


if __name__ == "__main__":
    main()
