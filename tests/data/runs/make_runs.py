#!/usr/bin/env python
"""Generate the whole-run trace sets under tests/data/runs/ (issue 31).

Each job is a small multi-process CPU (gloo) training job launched with
``torch.multiprocessing.spawn`` and profiled the way long runs are: ``torch.profiler``
with ``schedule(skip_first=5, wait=1, warmup=1, active=3, repeat=CYCLES)`` (the
first steps' warm-up skipped, as the profiler's docs advise) and ``tensorboard_trace_handler``
(gzip), so every rank writes one file per profiler cycle:
``DIR/<job>/rank<R>.<ts>.pt.trace.json.gz``. A fault is injected from a known step on
(or none, the healthy run), and ``DIR/<job>/ground_truth.json`` records what was injected:
which ranks, from which step, which profiled step and cycle first show it, and the step
breakdown category its extra time must land in.

Usage::

    python tests/data/runs/make_runs.py --out tests/data/runs
    python tests/data/runs/make_runs.py --out /tmp/x --only ddp3-healthy

Needs torch (the CPU build is enough). Every rank runs with one intra-op thread.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import importlib.util
import json
import os
import re
import sys
import time

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("make_traces", os.path.join(_HERE, "..", "parallel", "make_traces.py"))
base = importlib.util.module_from_spec(_spec)   # its launching helpers: spawn_ranks, gloo_rank, pipeline_step
_spec.loader.exec_module(base)

SKIP_FIRST, WAIT, WARMUP, ACTIVE, CYCLES = 5, 1, 1, 3, 6
PERIOD = WAIT + WARMUP + ACTIVE
TOTAL_STEPS = SKIP_FIRST + PERIOD * CYCLES
SEED = 31
DIM, HIDDEN, BATCH = 128, 512, 16


def profiled_steps() -> list[list[int]]:
    """The ProfilerStep numbers of each cycle (torch numbers steps from 0 over the whole run)."""
    return [[SKIP_FIRST + c * PERIOD + WAIT + WARMUP + a for a in range(ACTIVE)] for c in range(CYCLES)]


def first_profiled(from_step: int) -> tuple[int, int]:
    """The first profiled step at or after `from_step`, and its cycle (1-based)."""
    for c, steps in enumerate(profiled_steps(), start=1):
        for s in steps:
            if s >= from_step:
                return s, c
    raise ValueError(f"no profiled step from {from_step}")


class Samples(torch.utils.data.Dataset):
    """Random samples; from sample `slow_from` on each one takes `slow_s` to "decode" (a DataLoader that
    degrades: a slower storage tier, larger records)."""

    def __init__(self, n: int, slow_from: int | None = None, slow_s: float = 0.0):
        g = torch.Generator().manual_seed(SEED)
        self.x = torch.randn(n, DIM, generator=g)
        self.y = torch.randn(n, DIM, generator=g)
        self.slow_from, self.slow_s = slow_from, slow_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.slow_from is not None and i >= self.slow_from:
            time.sleep(self.slow_s)
        return self.x[i], self.y[i]


def _mlp() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, DIM))


def _run(rank: int, outdir: str, model: nn.Module, dataset: Samples, between=None, extra=None) -> None:
    """TOTAL_STEPS training steps under the cycle schedule. `between(step)` runs between forward and
    backward (outside any op unless it records one); `extra(step)` inside the forward."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=False, num_workers=0)
    it = iter(loader)
    handler = tensorboard_trace_handler(outdir, worker_name=f"rank{rank}", use_gzip=True)
    sched = schedule(skip_first=SKIP_FIRST, wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=CYCLES)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=handler) as prof:
        for step in range(TOTAL_STEPS):
            x, y = next(it)              # batch `step`: samples step*BATCH .. step*BATCH + BATCH-1
            opt.zero_grad()
            out = model(x)
            if extra is not None:
                out = out + extra(step)
            loss = nn.functional.mse_loss(out, y)
            if between is not None:
                between(step)
            loss.backward()
            opt.step()
            prof.step()


def _ddp(model: nn.Module) -> nn.Module:
    return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)


# --------------------------------------------------------------------------- jobs
# Each returns its ground truth's "injection" (None: healthy); it runs inside one spawned rank.

SLEEP_RANK, SLEEP_FROM, SLEEP_S = 2, 16, 0.040


def job_ddp3_rank2_sleeps(rank: int, world: int, outdir: str) -> dict:
    """DDP, 3 ranks: from step 16 on, rank 2 sleeps 40 ms per step between forward and backward,
    outside any profiled op (its main thread is busy elsewhere: a host-side stall)."""
    def between(step):
        if rank == SLEEP_RANK and step >= SLEEP_FROM:
            time.sleep(SLEEP_S)
    _run(rank, outdir, _ddp(_mlp()), Samples(TOTAL_STEPS * BATCH), between=between)
    first, cycle = first_profiled(SLEEP_FROM)
    return {"what": f"rank {SLEEP_RANK} sleeps {SLEEP_S * 1e3:.0f} ms per step outside any op from step {SLEEP_FROM}",
            "ranks": [SLEEP_RANK], "from_step": SLEEP_FROM, "first_profiled_step": first, "first_cycle": cycle,
            "delay_ms_per_step": SLEEP_S * 1e3, "category": "idle_other", "straggler_cause": "host_idle",
            "expected_change": {"kind": "slowdown", "rank": SLEEP_RANK, "cause": "idle_other"}}


LOADER_FROM, LOADER_SLOW_S = 23, 0.003


def job_ddp3_loader_degrades(rank: int, world: int, outdir: str) -> dict:
    """DDP, 3 ranks, DataLoader with num_workers=0: from the batch of step 23 on (the second profiled step
    of cycle 4) each sample takes 3 ms to decode: every rank's input pipeline degrades."""
    data = Samples(TOTAL_STEPS * BATCH, slow_from=LOADER_FROM * BATCH, slow_s=LOADER_SLOW_S)
    _run(rank, outdir, _ddp(_mlp()), data)
    first, cycle = first_profiled(LOADER_FROM)
    return {"what": f"every rank's DataLoader decodes each sample {LOADER_SLOW_S * 1e3:.1f} ms slower from the "
                    f"batch of step {LOADER_FROM} on ({BATCH} samples per batch)",
            "ranks": list(range(world)), "from_step": LOADER_FROM, "first_profiled_step": first, "first_cycle": cycle,
            "delay_ms_per_step": LOADER_SLOW_S * BATCH * 1e3, "category": "dataloader", "straggler_cause": None,
            "expected_change": {"kind": "slowdown", "rank": None, "cause": "dataloader"}}


def job_ddp3_healthy(rank: int, world: int, outdir: str) -> None:
    """DDP, 3 ranks, nothing injected."""
    _run(rank, outdir, _ddp(_mlp()), Samples(TOTAL_STEPS * BATCH))


COMPUTE_RANK, COMPUTE_FROM, COMPUTE_MATMULS, COMPUTE_DIM = 1, 16, 48, 512


def job_fsdp2_rank1_compute(rank: int, world: int, outdir: str) -> dict:
    """FSDP2 (`fully_shard` per layer + root), 2 ranks: from step 16 on (cycle 3 is the first to show it),
    rank 1's forward does 48 extra 512x512 matmuls (a rank whose compute got slower)."""
    from torch.distributed.fsdp import fully_shard
    model = _mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    g = torch.Generator().manual_seed(SEED)
    a = torch.randn(COMPUTE_DIM, COMPUTE_DIM, generator=g) / COMPUTE_DIM ** 0.5

    def extra(step):
        if rank != COMPUTE_RANK or step < COMPUTE_FROM:
            return 0.0
        m = a
        for _ in range(COMPUTE_MATMULS):
            m = torch.tanh(m @ a)
        return m.mean()

    _run(rank, outdir, model, Samples(TOTAL_STEPS * BATCH), extra=extra)
    first, cycle = first_profiled(COMPUTE_FROM)
    return {"what": f"rank {COMPUTE_RANK} runs {COMPUTE_MATMULS} extra {COMPUTE_DIM}x{COMPUTE_DIM} matmuls in its forward from step "
                    f"{COMPUTE_FROM}", "ranks": [COMPUTE_RANK], "from_step": COMPUTE_FROM,
            "first_profiled_step": first, "first_cycle": cycle, "delay_ms_per_step": None, "category": "compute",
            "straggler_cause": None, "expected_change": {"kind": "slowdown", "rank": COMPUTE_RANK, "cause": "compute"}}


JOBS = {
    "ddp3-rank2-sleeps": (3, job_ddp3_rank2_sleeps),
    "ddp3-loader-degrades": (3, job_ddp3_loader_degrades),
    "ddp3-healthy": (3, job_ddp3_healthy),
    "fsdp2-rank1-compute": (2, job_fsdp2_rank1_compute),
}


# --------------------------------------------------------------------------- launching

def _worker(rank: int, name: str, world: int, port: int, outdir: str) -> None:
    with base.gloo_rank(rank, world, port):
        injection = JOBS[name][1](rank, world, outdir)
        if rank == 0:
            with open(os.path.join(outdir, "_injection.json"), "w") as f:
                json.dump(injection, f)


def _steps_in(path: str) -> list[int]:
    with gzip.open(path, "rt") as f:
        return sorted({int(n) for n in re.findall(r'"ProfilerStep#(\d+)"', f.read())})


def run_job(name: str, out: str) -> dict:
    world = JOBS[name][0]
    jobdir = os.path.abspath(os.path.join(out, name))
    elapsed = base.spawn_ranks(_worker, (name,), world, jobdir)
    with open(os.path.join(jobdir, "_injection.json")) as f:
        injection = json.load(f)
    os.remove(os.path.join(jobdir, "_injection.json"))
    files = sorted(glob.glob(os.path.join(jobdir, "rank*.pt.trace.json.gz")))
    cycles = profiled_steps()
    files_of_cycle = [[] for _ in cycles]
    for p in files:                     # check: one file per rank per cycle, with that cycle's steps
        steps = _steps_in(p)
        files_of_cycle[cycles.index(steps)].append(os.path.basename(p))
    assert all(len(f) == world for f in files_of_cycle), files_of_cycle
    truth = {
        "job": name, "world_size": world, "backend": "gloo", "torch": torch.__version__,
        "profiler_schedule": {"skip_first": SKIP_FIRST, "wait": WAIT, "warmup": WARMUP, "active": ACTIVE, "repeat": CYCLES},
        "cycles": [{"cycle": c, "steps": s, "files": sorted(f)}
                   for c, (s, f) in enumerate(zip(cycles, files_of_cycle), start=1)],
        "injection": injection,
        "expected_changes": [] if injection is None else [{**injection["expected_change"],
                                                           "first_step": injection["first_profiled_step"],
                                                           "first_cycle": injection["first_cycle"]}],
        "notes": "CPU only, 1 thread per rank, on a shared 2-core machine: absolute times are not meaningful; "
                 "what is known is the injection (which ranks, from which step, where its time goes).",
        "generation_seconds": round(elapsed, 1),
    }
    with open(os.path.join(jobdir, "ground_truth.json"), "w") as f:
        f.write(json.dumps(truth, indent=1) + "\n")
    sizes = [os.path.getsize(p) for p in files]
    print(f"{name}: {world} ranks x {CYCLES} cycles, {elapsed:.1f}s, max {max(sizes) / 1e3:.0f} kB, "
          f"total {sum(sizes) / 1e3:.0f} kB", flush=True)
    return truth


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder; one sub-folder per job")
    ap.add_argument("--only", choices=sorted(JOBS), action="append", help="run only this job (repeatable)")
    args = ap.parse_args(argv)
    t0 = time.time()
    for name in args.only or list(JOBS):
        run_job(name, args.out)
    print(f"total {time.time() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
