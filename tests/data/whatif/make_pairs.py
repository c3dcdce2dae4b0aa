#!/usr/bin/env python
"""Generate the before/after job pairs under tests/data/whatif/ (issue 32): real torch CPU (gloo)
training jobs, each made twice: with a fault (`<pair>/before`) and without it (`<pair>/after`).
The what-if that undoes the fault, computed on `before`, is checked against the step time
measured on `after` (benchmarks/bench_what_if.py --real).

Pairs (what changes between before and after; everything else is the same code and data):

  sleep        DDP, 2 ranks: rank 1 sleeps SLEEP_MS outside any op between forward and backward | no sleep
  dataloader   DDP, 2 ranks: every rank's Dataset takes DECODE_MS_PER_SAMPLE per sample (num_workers=0) | free
  slow-stage   pipeline, 2 stages, 1F1B, 4 microbatches: blocks per stage 6 + 2 | 4 + 4 (same total)
  bucketed     2 ranks: each gradient all-reduced one by one after backward | DDP buckets during backward
  microbatches pipeline, 2 stages, GPipe: 4 microbatches | 8 microbatches (the same batch)

The layers are a registered torch op (`whatif::work`, with its autograd backward) that takes a fixed
time per row of its input (US_PER_ROW us forward, twice that backward): like a GPU kernel, its
duration does not depend on how busy the host is. On this project's shared 2-core machines, real
matmuls made the same job 30% slower or faster from one run to the next (other processes' load),
more than the effects measured here; the rest of each step (DDP, gloo's all-reduces, the pipeline
schedule, the optimizer) is real CPU work and still varies with load.

Each job: `torch.profiler` (CPU activity, record_shapes, schedule wait=1 warmup=1 active=ACTIVE),
`tensorboard_trace_handler` with gzip, one intra-op thread per rank, fixed seeds. Per rank the script
also times every step with `time.perf_counter` (its own clock, not the profiler's): `ground_truth.json`
of each job holds what was injected and those step times (`step_wall_ms[rank][k]`, profiled steps).

Usage::

    python tests/data/whatif/make_pairs.py --out tests/data/whatif
    python tests/data/whatif/make_pairs.py --out /tmp/x --only sleep

Needs torch (the CPU build is enough). Runs one job at a time (~10-20 s each on 2 cores).
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("make_traces", os.path.join(_HERE, "..", "parallel", "make_traces.py"))
base = importlib.util.module_from_spec(_spec)   # its launching helpers: spawn_ranks, gloo_rank, pipeline_step
_spec.loader.exec_module(base)

WAIT, WARMUP, ACTIVE = 1, 1, 4
SEED = 1234
DIM = 64
#: Per layer: the forward's time per row of the batch (us; backward twice that), its parameters.
US_PER_ROW, GRAD_FLOATS = 200.0, 1 << 14
#: The bucketed pair's layers: larger gradients, so that their all-reduce takes a share of the step.
GRAD_FLOATS_BUCKETED = 1 << 20
SLEEP_MS = 40.0
DECODE_MS_PER_SAMPLE = 1.0


@torch.library.custom_op("whatif::work", mutates_args=())
def work(x: torch.Tensor, w: torch.Tensor, us_per_row: float) -> torch.Tensor:
    """A layer whose forward takes `us_per_row` microseconds per row of x (a sleep: like a GPU kernel,
    its duration does not depend on how busy the host's cores are), and returns x + w[:x.shape[1]]."""
    time.sleep(x.shape[0] * us_per_row / 1e6)
    return x + w[: x.shape[1]]


@work.register_fake
def _(x, w, us_per_row):
    return torch.empty_like(x)


def _work_setup(ctx, inputs, output):
    ctx.rows, ctx.us, ctx.n = inputs[0].shape[0], inputs[2], inputs[1].shape[0]


def _work_backward(ctx, grad):
    time.sleep(2 * ctx.rows * ctx.us / 1e6)         # backward: twice the forward
    gw = grad.new_zeros(ctx.n)
    gw[: grad.shape[1]] = grad.sum(0)
    return grad, gw, None


work.register_autograd(_work_backward, setup_context=_work_setup)


class Block(nn.Module):
    """One layer: US_PER_ROW us per row forward, twice that backward; GRAD_FLOATS parameters (their
    gradient is what data parallelism all-reduces)."""

    def __init__(self, grad_floats: int = GRAD_FLOATS) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(grad_floats))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return work(x, self.w, US_PER_ROW)
def _profiled(outdir: str, rank: int, step_fn) -> list[float]:
    """Run the profiled schedule; the wall time (ms) of each profiled step by perf_counter."""
    sched = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    handler = tensorboard_trace_handler(outdir, worker_name=f"rank{rank}", use_gzip=True)
    wall = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=sched,
                 on_trace_ready=handler) as prof:
        for i in range(WAIT + WARMUP + ACTIVE):
            t0 = time.perf_counter()
            step_fn(i)
            wall.append(1000.0 * (time.perf_counter() - t0))
            prof.step()
    return wall[WAIT + WARMUP:]


def _data(rank: int, batch: int):
    g = torch.Generator().manual_seed(SEED + rank)
    return torch.randn(batch, DIM, generator=g), torch.randn(batch, DIM, generator=g)


# ------------------------------------------------------------------------------- the jobs
def job_sleep(rank: int, world: int, fault: bool, outdir: str) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(SEED)
    model = DDP(nn.Sequential(*[Block() for _ in range(4)]), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = _data(rank, 32)

    def step(i):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        if fault and rank == 1:
            time.sleep(SLEEP_MS / 1000.0)          # outside any op: the main thread idles
        loss.backward()
        opt.step()

    return {"wall": _profiled(outdir, rank, step),
            "injected": {"sleep_ms_per_step": SLEEP_MS, "rank": 1} if fault else {}}


class _SlowDataset(torch.utils.data.Dataset):
    def __init__(self, n: int, decode_ms: float, rank: int):
        g = torch.Generator().manual_seed(SEED + rank)
        self.x, self.y = torch.randn(n, DIM, generator=g), torch.randn(n, DIM, generator=g)
        self.decode_ms = decode_ms

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if self.decode_ms:
            time.sleep(self.decode_ms / 1000.0)    # a slow decode (I/O-like: it holds no core)
        return self.x[i], self.y[i]


def job_dataloader(rank: int, world: int, fault: bool, outdir: str) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(SEED)
    model = DDP(nn.Sequential(*[Block() for _ in range(4)]), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = 16
    ds = _SlowDataset(batch * (WAIT + WARMUP + ACTIVE), DECODE_MS_PER_SAMPLE if fault else 0.0, rank)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=0))

    def step(i):
        x, y = next(it)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return {"wall": _profiled(outdir, rank, step),
            "injected": {"decode_ms_per_sample": DECODE_MS_PER_SAMPLE, "batch": batch, "ranks": "all"}
            if fault else {}}


def _pipeline_job(rank: int, world: int, outdir: str, blocks: list[int], n_mb: int, schedule_cls) -> list[float]:
    from torch.distributed.pipelining import PipelineStage
    torch.manual_seed(SEED + rank)
    mod = nn.Sequential(*[Block() for _ in range(blocks[rank])])
    stage = PipelineStage(mod, rank, world, torch.device("cpu"))
    sched = schedule_cls(stage, n_microbatches=n_mb, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(mod.parameters(), lr=1e-3)
    x, y = _data(0, 64)

    return _profiled(outdir, rank, lambda i: base.pipeline_step(sched, opt, rank, world, x, y))


def job_slow_stage(rank: int, world: int, fault: bool, outdir: str) -> dict:
    from torch.distributed.pipelining import Schedule1F1B
    blocks = [6, 2] if fault else [4, 4]
    return {"wall": _pipeline_job(rank, world, outdir, blocks, 4, Schedule1F1B),
            "injected": {"blocks_per_stage": blocks, "schedule": "1f1b", "microbatches": 4}}


def job_bucketed(rank: int, world: int, fault: bool, outdir: str) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(SEED)
    net = nn.Sequential(*[Block(GRAD_FLOATS_BUCKETED) for _ in range(6)])
    model = net if fault else DDP(net, bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = _data(rank, 32)

    def step(i):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if fault:                                   # serial: one all_reduce per gradient, after backward
            for p in net.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        opt.step()

    return {"wall": _profiled(outdir, rank, step),
            "injected": {"gradient_sync": "serial all_reduce after backward" if fault else "DDP bucket_cap_mb=1"}}


def job_microbatches(rank: int, world: int, fault: bool, outdir: str) -> dict:
    from torch.distributed.pipelining import ScheduleGPipe
    n_mb = 4 if fault else 8
    return {"wall": _pipeline_job(rank, world, outdir, [4, 4], n_mb, ScheduleGPipe),
            "injected": {"blocks_per_stage": [4, 4], "schedule": "gpipe", "microbatches": n_mb}}


#: pair -> (ranks, job, what the what-if to check says, the what-if's kind)
PAIRS = {
    "sleep": (2, job_sleep, "rank 1's host_idle at the median rank's level"),
    "dataloader": (2, job_dataloader, "DataLoader wait removed on every rank"),
    "slow-stage": (2, job_slow_stage, "pipeline stages balanced"),
    "bucketed": (2, job_bucketed, "dp communication overlapped"),
    "microbatches": (2, job_microbatches, "8 microbatches instead of 4"),
}


# ------------------------------------------------------------------------------- launching
def _worker(rank: int, pair: str, fault: bool, world: int, port: int, outdir: str) -> None:
    with base.gloo_rank(rank, world, port):
        out = PAIRS[pair][1](rank, world, fault, outdir)
        with open(os.path.join(outdir, f"_wall.rank{rank}.json"), "w") as f:
            json.dump(out, f)


def run(pair: str, fault: bool, out: str) -> dict:
    world = PAIRS[pair][0]
    jobdir = os.path.abspath(os.path.join(out, pair, "before" if fault else "after"))
    elapsed = base.spawn_ranks(_worker, (pair, fault), world, jobdir)
    parts = []
    for r in range(world):
        path = os.path.join(jobdir, f"_wall.rank{r}.json")
        parts.append(json.load(open(path)))
        os.remove(path)
    wall = [[round(v, 3) for v in p["wall"]] for p in parts]
    per_step = [max(w[k] for w in wall) for k in range(ACTIVE)]
    truth = {"pair": pair, "job": "before" if fault else "after", "fault": fault, "world_size": world,
             "torch": torch.__version__, "profiled_steps": ACTIVE,
             "profiler_schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE},
             "injected": parts[0]["injected"], "what_if": PAIRS[pair][2],
             "step_wall_ms": wall, "step_wall_ms_mean_of_slowest_rank": round(sum(per_step) / len(per_step), 3),
             "generation_seconds": round(elapsed, 1)}
    with open(os.path.join(jobdir, "ground_truth.json"), "w") as f:
        json.dump(truth, f, indent=1)
        f.write("\n")
    sizes = [os.path.getsize(p) for p in glob.glob(os.path.join(jobdir, "*.gz"))]
    print(f"{pair}/{truth['job']}: {world} ranks, {truth['generation_seconds']} s, step {truth['step_wall_ms_mean_of_slowest_rank']} "
          f"ms, max file {max(sizes) / 1e3:.0f} kB", flush=True)
    return truth


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder: <pair>/before and <pair>/after")
    ap.add_argument("--only", choices=sorted(PAIRS), action="append", help="only this pair (repeatable)")
    args = ap.parse_args(argv)
    for pair in args.only or list(PAIRS):
        run(pair, True, args.out)
        run(pair, False, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
