#!/usr/bin/env python
"""Generate the real capture sets under tests/data/captures/ (issue 33).

Each job is a small multi-process CPU (gloo) job launched with ``torch.multiprocessing.spawn`` and
profiled with ``torch.profiler`` (CPU activity, ``schedule(wait=1, warmup=1, active=3)``,
``tensorboard_trace_handler`` with gzip: ``DIR/<job>/rank<R>.<id>.pt.trace.json.gz``). The ground
truth each job was built with, and what it measured while it ran, goes to
``DIR/<job>/ground_truth.json``:

  withstack-preproc       2 ranks, DDP MLP, ``with_stack=True``. Each step starts with Python work
                          and no op: ``decode_batch`` (pure Python arithmetic, ~25 ms) then
                          ``wait_for_batch`` (``time.sleep``, 12 ms), then forward / backward /
                          optimizer. Truth: per rank and profiled step, the measured ms of both.
  mesh-dp-pp-tp-unnamed   8 ranks, ``init_device_mesh("cpu", (2, 2, 2), ("dp", "pp", "tp"))``:
                          GPipe over pp (2 microbatches), FSDP2 over dp, TP over tp; then every
                          ``pg_desc`` rewritten to "undefined" (traces without group names).
  mesh-pp-tp-dp-unnamed   the same model on the mesh order ("pp", "tp", "dp"), names stripped.
  emb-alltoall            4 ranks, TorchRec-style sharded embeddings: one EmbeddingBag table per
                          rank (table-wise sharding); per step the ids go to the table's owner
                          (``all_to_all_single`` under ``## all2all_data:kjt values ##``), the
                          pooled rows come back (``## alltoall_fwd_single ##``; backward
                          ``## alltoall_bwd_single ##``), the dense part is DDP (all_reduce).
                          Truth: all_to_all count per step, the rows each rank receives.

Usage (from the repository root, torch installed; made with torch 2.13.0+cpu)::

    python tests/data/captures/make_captures.py --out tests/data/captures
    python tests/data/captures/make_captures.py --out tests/data/captures --only emb-alltoall

Absolute times are not meaningful (ranks share 2 cores); the injected Python work and sleeps are
measured by the job itself, and the layouts are read off the mesh objects.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import importlib.util
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("make_traces", os.path.join(_HERE, "..", "parallel", "make_traces.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

WAIT, WARMUP, ACTIVE = 1, 1, 3
TOTAL_STEPS = WAIT + WARMUP + ACTIVE
SEED = 1234
DECODE_TARGET_S = 0.025
SLEEP_S = 0.012


def _profiled(outdir: str, rank: int, step_fn, with_stack: bool = False) -> list[int]:
    """Run TOTAL_STEPS steps of `step_fn(i)` under the profiler; returns the profiled step numbers
    (ProfilerStep#N: N = i for the active steps)."""
    sched = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    handler = tensorboard_trace_handler(outdir, worker_name=f"rank{rank}", use_gzip=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=with_stack, schedule=sched,
                 on_trace_ready=handler) as prof:
        for i in range(TOTAL_STEPS):
            step_fn(i)
            prof.step()
    return list(range(WAIT + WARMUP, TOTAL_STEPS))


def _write_partial(outdir: str, rank: int, truth: dict) -> None:
    with open(os.path.join(outdir, f"_truth.rank{rank}.json"), "w") as f:
        json.dump(truth, f)


# --------------------------------------------------------------------------- with_stack
def decode_batch(n: int) -> int:
    """Pure Python work and no torch op (no function call inside the loop, so with_stack records
    this frame alone): a checksum over n integers."""
    acc = 0
    for k in range(n):
        acc = (acc * 31 + k) % 1_000_003
    return acc


def wait_for_batch(seconds: float) -> None:
    time.sleep(seconds)


def job_withstack_preproc(rank: int, world: int, outdir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(SEED)
    model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256)
    # calibrate the decode loop to ~DECODE_TARGET_S on this machine (before profiling)
    t0 = time.perf_counter()
    decode_batch(200_000)
    n = max(20_000, int(200_000 * DECODE_TARGET_S / max(time.perf_counter() - t0, 1e-6)))
    measured: dict[int, dict] = {}

    def step(i):
        t0 = time.perf_counter()
        decode_batch(n)
        t1 = time.perf_counter()
        wait_for_batch(SLEEP_S)
        t2 = time.perf_counter()
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        measured[i] = {"decode_ms": round((t1 - t0) * 1e3, 3), "sleep_ms": round((t2 - t1) * 1e3, 3)}

    steps = _profiled(outdir, rank, step, with_stack=True)
    _write_partial(outdir, rank, {"rank": rank, "per_step": {str(s): measured[s] for s in steps},
                                  "decode_iterations": n})


# --------------------------------------------------------------------------- meshes
def _mesh_job(names: tuple[str, str, str]):
    def job(rank: int, world: int, outdir: str) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=names)
        pp_mesh = mesh["pp"]
        pp_rank, pp_size = pp_mesh.get_local_rank(), pp_mesh.size()
        dim, hidden, batch, n_mb = 64, 128, 8, 2
        model = base._tp_mlp(dim, hidden, 1, mesh["tp"], mesh["dp"], reshard=False)
        stage = PipelineStage(model, pp_rank, pp_size, torch.device("cpu"), group=pp_mesh.get_group())
        sched = ScheduleGPipe(stage, n_microbatches=n_mb, loss_fn=nn.functional.mse_loss)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(SEED + mesh["dp"].get_local_rank())
        x, y = torch.randn(batch, dim, generator=g), torch.randn(batch, dim, generator=g)

        _profiled(outdir, rank, lambda i: base.pipeline_step(sched, opt, pp_rank, pp_size, x, y))
        _write_partial(outdir, rank, {"dims": base._groups_from_mesh(mesh), "mesh_dim_names": list(names),
                                      "mesh": mesh.mesh.tolist(), "microbatches": n_mb,
                                      "model": f"residual MLP block {dim}->{hidden}->{dim} per stage; TP on tp, "
                                               f"FSDP2 on dp, GPipe on pp"})
    return job


# --------------------------------------------------------------------------- sharded embeddings
class _AllToAll(torch.autograd.Function):
    """all_to_all_single of embedding rows; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, rows, out_splits, in_splits):
        ctx.splits = (out_splits, in_splits)
        out = rows.new_empty(sum(out_splits), rows.shape[1])
        with record_function("## alltoall_fwd_single ##"):
            dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty(sum(in_splits), grad.shape[1])
        with record_function("## alltoall_bwd_single ##"):
            dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None


def job_emb_alltoall(rank: int, world: int, outdir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    rows, emb_dim, batch = 1000, 32, 16
    torch.manual_seed(SEED + rank)
    table = nn.EmbeddingBag(rows, emb_dim, mode="sum")          # this rank owns table `rank`
    dense = DDP(nn.Sequential(nn.Linear(world * emb_dim, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(list(table.parameters()) + list(dense.parameters()), lr=1e-3)
    g = torch.Generator().manual_seed(SEED + rank)
    ids = torch.randint(0, rows, (world, batch), generator=g)    # ids[t]: this rank's batch for table t
    counts = {"all_to_all": 0}

    def step(i):
        opt.zero_grad()
        recv_ids = torch.empty(world * batch, dtype=torch.int64)
        with record_function("## all2all_data:kjt values ##"):
            dist.all_to_all_single(recv_ids, ids.reshape(-1).contiguous(), [batch] * world, [batch] * world)
        pooled = table(recv_ids.view(world, batch).reshape(-1, 1))  # one bag per (source rank, sample)
        got = _AllToAll.apply(pooled, [batch] * world, [batch] * world)    # (world * batch, emb_dim)
        feats = got.view(world, batch, emb_dim).permute(1, 0, 2).reshape(batch, world * emb_dim)
        dense(feats).pow(2).mean().backward()
        opt.step()
        counts["all_to_all"] += 3

    steps = _profiled(outdir, rank, step)
    _write_partial(outdir, rank, {
        "dims": [{"name": "emb", "size": world, "groups": [list(range(world))]}],
        "all_to_all_per_step": 3, "all_to_all_names": ["## all2all_data:kjt values ##", "## alltoall_fwd_single ##",
                                                       "## alltoall_bwd_single ##"],
        "rows_received_per_all_to_all": {"ids": world * batch, "pooled": world * batch},
        "profiled_steps": steps,
        "model": f"{world} EmbeddingBag tables ({rows} x {emb_dim}, sum), one per rank; dense MLP under DDP"})


JOBS = {
    "withstack-preproc": (2, job_withstack_preproc),
    "mesh-dp-pp-tp-unnamed": (8, _mesh_job(("dp", "pp", "tp"))),
    "mesh-pp-tp-dp-unnamed": (8, _mesh_job(("pp", "tp", "dp"))),
    "emb-alltoall": (4, job_emb_alltoall),
}


def _worker(rank: int, name: str, world: int, port: int, outdir: str) -> None:
    with base.gloo_rank(rank, world, port):
        JOBS[name][1](rank, world, outdir)


def _strip_names(traces: list[str]) -> dict:
    """Rewrite every pg_desc to "undefined"; return the original groups per description."""
    original: dict[str, set] = {}
    for p in traces:
        with gzip.open(p, "rt") as f:
            data = json.load(f)
        for cfg in data["distributedInfo"]["pg_config"]:
            original.setdefault(cfg["pg_desc"], set()).add(tuple(sorted(cfg["ranks"])))
            cfg["pg_desc"] = "undefined"
        with gzip.open(p, "wt") as f:
            json.dump(data, f)
    return {k: sorted(list(g) for g in v) for k, v in original.items()}


def run_job(name: str, out: str) -> None:
    world, _ = JOBS[name]
    jobdir = os.path.abspath(os.path.join(out, name))
    elapsed = base.spawn_ranks(_worker, (name,), world, jobdir)
    parts = sorted(glob.glob(os.path.join(jobdir, "_truth.rank*.json")), key=lambda p: int(p.split("rank")[-1][:-5]))
    per_rank = [json.load(open(p)) for p in parts]
    for p in parts:
        os.remove(p)
    traces = sorted(glob.glob(os.path.join(jobdir, "rank*.pt.trace.json.gz")))
    if len(traces) != world:
        raise RuntimeError(f"{name}: expected {world} traces, found {len(traces)}")
    truth = {"job": name, "world_size": world, "backend": "gloo", "torch": torch.__version__,
             "profiler_schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE}}
    if name == "withstack-preproc":
        truth["per_rank"] = {str(t["rank"]): t["per_step"] for t in per_rank}
        truth["injected"] = {"decode_batch": "pure Python before the step's first op",
                             "wait_for_batch": f"time.sleep({SLEEP_S}) after it, still before the first op"}
    else:
        truth.update(per_rank[0])
    if name.endswith("-unnamed"):
        truth["original_pg_config_groups"] = _strip_names(traces)
    truth["generation_seconds"] = round(elapsed, 1)
    with open(os.path.join(jobdir, "ground_truth.json"), "w") as f:
        f.write(base._dumps(truth) + "\n")
    sizes = [os.path.getsize(p) for p in traces]
    print(f"{name}: {world} ranks, {elapsed:.1f}s, max {max(sizes) / 1e3:.0f} kB, total {sum(sizes) / 1e3:.0f} kB",
          flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder; one sub-folder per job")
    ap.add_argument("--only", choices=sorted(JOBS), action="append", help="run only this job (repeatable)")
    args = ap.parse_args(argv)
    for name in args.only or list(JOBS):
        run_job(name, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
