#!/usr/bin/env python
"""Generate the Flight Recorder dump sets under tests/data/hangs/ (issue 30).

Each case is a small multi-process CPU job (gloo, torch's spawn start method, 4 ranks) run with
``TORCH_FR_BUFFER_SIZE=2000`` and a short collective timeout, with one injected fault. Every rank
writes its Flight Recorder dump (``torch._C._distributed_c10d._dump_fr_trace()``, or
``_dump_fr_trace_json()``) when one of its collectives fails, and in a SIGTERM handler, as the
watchdog's dump-on-timeout does; the launcher sends SIGTERM to the ranks still running once the
others have dumped (as torchrun does when a worker fails). ``ground_truth.json`` per case is
written from what the script injected: the culprit rank(s), the fault, the group (its ranks and
description), the sequence number of the faulted collective on that group (counted by the script
itself, one per call it made on the group), the culprit's call site (file:line, recorded where
each call is made: the mismatched call of a desync, else its last call), which ranks left no dump.

Usage::

    python tests/data/hangs/make_dumps.py --out tests/data/hangs
    python tests/data/hangs/make_dumps.py --out /tmp/x --only hang-late

Needs torch (the CPU build is enough). About a minute per case on a shared 2-core machine.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import sys
import time

WORLD = 4
STEPS = 5
FAULT_STEP = 3            # the step (0-based) where the fault is injected
TIMEOUT_S = 4             # the collectives' timeout: short, so a case ends in seconds
SIZE = 4096

CASES = {
    # rank 1 never enters the gradient all_reduce of step 3: it is stuck in its input pipeline
    "hang-late": {"fault": "never_enters", "culprit": 1, "names": "nccl_trace_rank_{rank}", "formats": ["pickle"],
                  "profile": True},
    # rank 3 calls broadcast where the others call all_reduce
    "desync-op": {"fault": "different_op", "culprit": 3, "names": "rank_{rank}", "formats": ["pickle"]},
    # rank 2 all_reduces a tensor of another size; the same dumps also written as JSON (desync-size-json)
    "desync-size": {"fault": "different_size", "culprit": 2, "names": "rank_{rank}", "formats": ["pickle", "json"]},
    # 2-D mesh (dp x tp): rank 3 skips the tp all_reduce of step 3, goes on to the dp all_reduce
    "mesh-tp-skip": {"fault": "tp_peer_skips", "culprit": 3, "names": "rank_{rank}", "formats": ["pickle"],
                     "mesh": True},
    # rank 3 dies (os._exit) before the gradient all_reduce of step 3: no dump from it
    "no-dump": {"fault": "dies_without_dump", "culprit": 3, "names": "rank_{rank}", "formats": ["pickle"]},
    # no fault: every rank dumps after a final barrier
    "clean-end": {"fault": None, "culprit": None, "names": "rank_{rank}", "formats": ["pickle"]},
}


# ------------------------------------------------------------------------------------ in a rank
class Calls:
    """What this rank entered, per group: the count of collective calls (the script's own sequence
    number) and the call site of the last one."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.last_site: tuple[str, int] | None = None
        self.fault: dict | None = None

    def made(self, group: str) -> None:
        """Called on the line of a collective call, just before it (same line): counts the call as
        entered and keeps its site."""
        caller = sys._getframe(1)
        self.count[group] = self.count.get(group, 0) + 1
        self.last_site = (os.path.basename(caller.f_code.co_filename), caller.f_lineno)


def _dump(rank: int, case: dict, out: str, why: str) -> None:
    import torch
    for fmt in case["formats"]:
        folder = out if fmt == "pickle" else out + "-json"
        os.makedirs(folder, exist_ok=True)
        name = case["names"].format(rank=rank) if fmt == "pickle" else f"fr_trace_{rank}.json"
        data = (torch._C._distributed_c10d._dump_fr_trace() if fmt == "pickle"
                else torch._C._distributed_c10d._dump_fr_trace_json())
        tmp = os.path.join(folder, f".{name}.tmp")
        with open(tmp, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        os.replace(tmp, os.path.join(folder, name))
    with open(os.path.join(out, f"_dumped.rank{rank}"), "w") as f:
        f.write(why)


def _write_calls(rank: int, out: str, calls: Calls) -> None:
    with open(os.path.join(out, f"_calls.rank{rank}.json"), "w") as f:
        json.dump({"count": calls.count, "last_site": calls.last_site, "fault": calls.fault}, f)


def _worker(rank: int, port: int, name: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="2000")
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    case = CASES[name]
    calls = Calls()

    def on_term(signum, frame):
        _write_calls(rank, out, calls)
        _dump(rank, case, out, "SIGTERM")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    tp = dp = None
    if case.get("mesh"):
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    w = torch.randn(SIZE, 64) * 0.01
    prof = None
    if case.get("profile"):
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
        prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                       on_trace_ready=tensorboard_trace_handler(out, worker_name=f"rank{rank}", use_gzip=True))
        prof.start()
    try:
        for step in range(STEPS):
            x = torch.randn(32, SIZE)
            h = x @ w                                       # forward
            faulty = case["fault"] is not None and rank == case["culprit"] and step == FAULT_STEP
            if tp is not None:
                if faulty:                                  # tp peer skips its activation all_reduce
                    calls.fault = {"group": "tp", "seq": calls.count.get("tp", 0) + 1}
                    time.sleep(1.0)                         # ... and does its own work before going on
                else:
                    calls.made("tp"); dist.all_reduce(h, group=tp)  # noqa: E702
            grad = (x.T @ h).sum(dim=1)                     # backward: one gradient vector
            if faulty and case["fault"] == "never_enters":
                calls.fault = {"group": "default", "seq": calls.count.get("default", 0) + 1}
                time.sleep(600)                             # stuck: never enters the all_reduce below
            if faulty and case["fault"] == "dies_without_dump":
                calls.fault = {"group": "default", "seq": calls.count.get("default", 0) + 1}
                _write_calls(rank, out, calls)
                os._exit(3)
            if faulty and case["fault"] == "different_op":
                calls.fault = {"group": "default", "seq": calls.count.get("default", 0) + 1}
                calls.made("default"); dist.broadcast(grad, src=0)  # noqa: E702
            elif faulty and case["fault"] == "different_size":
                calls.fault = {"group": "default", "seq": calls.count.get("default", 0) + 1}
                calls.made("default"); dist.all_reduce(torch.cat([grad, grad[:8]]))  # noqa: E702
            elif dp is not None:
                calls.made("dp"); dist.all_reduce(grad, group=dp)  # noqa: E702
            else:
                calls.made("default"); dist.all_reduce(grad)  # noqa: E702
            loss = h.square().mean().reshape(1)
            calls.made("default"); dist.all_reduce(loss)  # noqa: E702
            w -= 1e-6 * grad.reshape(-1, 1)
            if prof is not None:
                prof.step()
                if step == 2:
                    prof.stop()
                    prof = None
        calls.made("default"); dist.barrier()  # noqa: E702
        _write_calls(rank, out, calls)
        _dump(rank, case, out, "end")
    except Exception as exc:                                # a collective failed: dump, as on timeout
        _write_calls(rank, out, calls)
        _dump(rank, case, out, f"{type(exc).__name__}")
        os._exit(1)
    os._exit(0)


# ------------------------------------------------------------------------------------ launcher
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(name: str, root: str) -> None:
    import torch
    import torch.multiprocessing as mp
    case = CASES[name]
    out = os.path.join(root, name)
    for folder in (out, out + "-json"):
        shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(out)
    t0 = time.time()
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, name, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    # wait until every rank that will dump on its own has (or has exited), then SIGTERM the rest
    deadline = time.time() + 120
    while time.time() < deadline and any(p.is_alive() for p in procs):
        alive = [r for r, p in enumerate(procs) if p.is_alive()]
        if case["fault"] is not None and all(r == case["culprit"] for r in alive):
            break
        time.sleep(0.2)
    time.sleep(0.5)
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGTERM)
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()
    _write_truth(name, case, out, time.time() - t0, torch.__version__)


def _write_truth(name: str, case: dict, out: str, seconds: float, torch_version: str) -> None:
    calls = {}
    for r in range(WORLD):
        path = os.path.join(out, f"_calls.rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                calls[r] = json.load(f)
            os.remove(path)
    dumped = {}
    for r in range(WORLD):
        path = os.path.join(out, f"_dumped.rank{r}")
        if os.path.exists(path):
            with open(path) as f:
                dumped[r] = f.read()
            os.remove(path)
    culprit = case["culprit"]
    fault = calls.get(culprit, {}).get("fault") if culprit is not None else None
    if case["fault"] is not None and fault is None:
        raise SystemExit(f"{name}: the culprit rank {culprit} did not record its fault")
    mesh = {"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]} if case.get("mesh") else None
    group_ranks = None
    if fault is not None:
        group_ranks = (list(range(WORLD)) if fault["group"] == "default"
                       else next(g for g in mesh[fault["group"]] if culprit in g))
    truth = {
        "job": name, "world_size": WORLD, "backend": "gloo", "torch": torch_version,
        "timeout_s": TIMEOUT_S, "fault_step": FAULT_STEP,
        "status": {None: "none", "never_enters": "hang", "dies_without_dump": "hang", "tp_peer_skips": "hang",
                   "different_op": "desync", "different_size": "desync"}[case["fault"]],
        "fault": case["fault"], "culprits": [culprit] if culprit is not None else [],
        "group": fault["group"] if fault else None, "group_ranks": group_ranks,
        "dim": fault["group"] if fault and fault["group"] != "default" else None,
        "seq": fault["seq"] if fault else None,
        "mismatched_field": {"different_op": "op", "different_size": "input_sizes"}.get(case["fault"]),
        # the culprit's call site the report should show, when it left a dump: the last collective it
        # entered (a desync: the mismatched call itself, which failed)
        "culprit_site": _site(calls[culprit]["last_site"]) if fault and culprit in dumped else None,
        "missing_dumps": sorted(set(range(WORLD)) - set(dumped)),
        "dumped_because": {str(r): why for r, why in sorted(dumped.items())},
        "calls_per_group": {str(r): c["count"] for r, c in sorted(calls.items())},
        "mesh": mesh, "dump_names": case["names"], "formats": case["formats"],
        "generation_seconds": round(seconds, 1),
    }
    for folder in [out] + ([out + "-json"] if "json" in case["formats"] else []):
        with open(os.path.join(folder, "ground_truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
            f.write("\n")
    print(f"{name}: {truth['status']} culprits={truth['culprits']} seq={truth['seq']} "
          f"missing={truth['missing_dumps']} dumped={truth['dumped_because']} ({seconds:.0f} s)")


def _site(site) -> dict | None:
    return {"file": site[0], "line": site[1]} if site else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", action="append", choices=sorted(CASES))
    args = ap.parse_args()
    for name in args.only or list(CASES):
        run_case(name, args.out)


if __name__ == "__main__":
    main()
