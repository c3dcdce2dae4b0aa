#!/usr/bin/env python
"""Generate the parallel-layout trace sets under tests/data/parallel/ (issue 15, item 9).

Each job is a small multi-process CPU (gloo) training job launched with
``torch.multiprocessing.spawn``, profiled with ``torch.profiler`` (CPU activity,
record_shapes, schedule wait=1 warmup=1 active=3, ``tensorboard_trace_handler``
with gzip). Per-rank traces land in ``DIR/<name>/rank<R>.<id>.pt.trace.json.gz``
and the ground truth the job was *built with* in ``DIR/<name>/ground_truth.json``.

Truth is derived from the objects the job built (``DeviceMesh.mesh``, the
pipeline schedule object, the computed all_to_all split sizes, the process
groups), then cross-checked against the ``distributedInfo.pg_config`` that
torch wrote into every rank's trace.

Usage::

    python tests/data/parallel/make_traces.py --out tests/data/parallel
    python tests/data/parallel/make_traces.py --out /tmp/x --only pp4-interleaved

Needs torch (CPU build is enough). Keep one generation at a time: every rank
runs with one intra-op thread.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import gzip
import json
import os
import shutil
import socket
import sys
import time
from typing import Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

# Profiler schedule shared by every job: 1 wait + 1 warmup + ACTIVE profiled steps.
WAIT, WARMUP, ACTIVE = 1, 1, 3
TOTAL_STEPS = WAIT + WARMUP + ACTIVE
SEED = 1234

SCHEDULE_NAMES = {
    "ScheduleInterleaved1F1B": "interleaved",
    "ScheduleGPipe": "gpipe",
    "Schedule1F1B": "1f1b",
}


# --------------------------------------------------------------------------- helpers


class Block(nn.Module):
    """Residual two-layer MLP block: x + w2(relu(w1(x)))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.relu(self.w1(x)))


def _profiled_steps(outdir: str, rank: int, step_fn) -> None:
    """Run TOTAL_STEPS steps of ``step_fn(i)`` under the shared profiler schedule."""
    sched = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    handler = tensorboard_trace_handler(outdir, worker_name=f"rank{rank}", use_gzip=True)
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=sched,
        on_trace_ready=handler,
    ) as prof:
        for i in range(TOTAL_STEPS):
            step_fn(i)
            prof.step()


def _groups_from_mesh(mesh) -> list[dict]:
    """One dims entry per mesh dim, groups read from the ``mesh.mesh`` rank tensor."""
    t = mesh.mesh
    dims = []
    for i, name in enumerate(mesh.mesh_dim_names):
        size = int(t.shape[i])
        groups = sorted(t.movedim(i, -1).reshape(-1, size).tolist())
        dims.append({"name": name, "size": size, "groups": groups})
    return dims


def _group_ranks(group=None) -> list[int]:
    return sorted(dist.get_process_group_ranks(group or dist.group.WORLD))


def _pipeline_truth(sched, stages) -> dict:
    """Pipeline facts read off the schedule and stage objects."""
    name = type(sched).__name__
    stage_to_rank = {}
    for st in stages:
        for s_idx, g_rank in st.stage_index_to_group_rank.items():
            stage_to_rank[int(s_idx)] = dist.get_global_rank(st.group or dist.group.WORLD, g_rank)
    return {
        "schedule": SCHEDULE_NAMES.get(name, name),
        "schedule_class": name,
        "microbatches": int(sched._n_microbatches),
        "num_stages": int(stages[0].num_stages),
        "stages_per_rank": len(stages),
        "stage_to_rank": [stage_to_rank[i] for i in sorted(stage_to_rank)],
        "stages_of_rank": [
            sorted(s for s, r in stage_to_rank.items() if r == rank) for rank in range(dist.get_world_size())
        ],
    }


def _write_partial_truth(outdir: str, rank: int, truth: dict) -> None:
    with open(os.path.join(outdir, f"_truth.rank{rank}.json"), "w") as f:
        json.dump(truth, f)


# --------------------------------------------------------------------------- jobs
# Every job function runs inside one spawned rank, after init_process_group.
# It profiles its steps and leaves a partial truth dict (rank 0 at least).


def job_pp4_interleaved(rank: int, world: int, outdir: str) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    dim, hidden, batch, n_mb, v_stages = 256, 1024, 64, 8, 2
    num_stages = world * v_stages
    # Looped (interleaved) placement: rank r holds stages r, r + world, ...
    my_stage_ids = [rank + k * world for k in range(v_stages)]
    stages, params = [], []
    for s in my_stage_ids:
        torch.manual_seed(SEED + s)
        mod = Block(dim, hidden)
        params += list(mod.parameters())
        stages.append(PipelineStage(mod, s, num_stages, torch.device("cpu")))
    sched = ScheduleInterleaved1F1B(stages, n_microbatches=n_mb, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(params, lr=1e-3)
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(batch, dim, generator=g)
    y = torch.randn(batch, dim, generator=g)
    has_first = 0 in my_stage_ids
    has_last = (num_stages - 1) in my_stage_ids

    def step(i):
        opt.zero_grad()
        args = (x,) if has_first else ()
        kwargs = {"target": y, "losses": []} if has_last else {}
        sched.step(*args, **kwargs)
        opt.step()

    _profiled_steps(outdir, rank, step)
    truth = {
        "dims": [{"name": "pp", "size": world, "groups": [_group_ranks()]}],
        "pipeline": _pipeline_truth(sched, stages),
        "blocks_per_stage": [1] * num_stages,
        "batch": batch,
        "model": f"{num_stages} residual MLP blocks {dim}->{hidden}->{dim}, one per stage",
    }
    _write_partial_truth(outdir, rank, truth)


def job_pp4_gpipe_slowstage1(rank: int, world: int, outdir: str) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    dim, hidden, batch, n_mb = 256, 1024, 64, 4
    slow = 1
    blocks_per_stage = [6 if s == slow else 2 for s in range(world)]
    torch.manual_seed(SEED + rank)
    mod = nn.Sequential(*[Block(dim, hidden) for _ in range(blocks_per_stage[rank])])
    stage = PipelineStage(mod, rank, world, torch.device("cpu"))
    sched = ScheduleGPipe(stage, n_microbatches=n_mb, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(mod.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(batch, dim, generator=g)
    y = torch.randn(batch, dim, generator=g)

    _profiled_steps(outdir, rank, lambda i: pipeline_step(sched, opt, rank, world, x, y))
    pipe = _pipeline_truth(sched, [stage])
    mx = max(blocks_per_stage)
    pipe["slow_stage"] = blocks_per_stage.index(mx)
    pipe["slow_rank"] = pipe["stage_to_rank"][pipe["slow_stage"]]
    truth = {
        "dims": [{"name": "pp", "size": world, "groups": [_group_ranks()]}],
        "pipeline": pipe,
        "blocks_per_stage": blocks_per_stage,
        "batch": batch,
        "model": f"residual MLP blocks {dim}->{hidden}->{dim}",
    }
    _write_partial_truth(outdir, rank, truth)


def _ep_routing(world: int, tokens: int, skew_expert: int, skew: float) -> list[list[int]]:
    """send[src][expert]: tokens rank ``src`` routes to ``expert``. Deterministic (fixed seed);
    every rank computes the whole matrix, so no count exchange is needed."""
    probs = torch.ones(world)
    probs[skew_expert] = skew
    send = []
    for src in range(world):
        g = torch.Generator().manual_seed(SEED + 100 + src)
        choice = torch.multinomial(probs, tokens, replacement=True, generator=g)
        send.append(torch.bincount(choice, minlength=world).tolist())
    return send


def job_ep4_alltoall_skewed(rank: int, world: int, outdir: str) -> None:
    dim, hidden, tokens, n_layers = 256, 1024, 128, 2
    skew_expert = world - 1
    send = _ep_routing(world, tokens, skew_expert, skew=3.0)
    in_splits = send[rank]  # what this rank sends to each expert
    out_splits = [send[src][rank] for src in range(world)]  # what this rank's expert receives

    torch.manual_seed(SEED)  # replicated (data-parallel) parameters: same init everywhere
    shared = nn.ModuleList([nn.Linear(dim, dim) for _ in range(n_layers)])
    torch.manual_seed(SEED + 10 + rank)  # this rank's experts (one per layer)
    experts = nn.ModuleList([Block(dim, hidden) for _ in range(n_layers)])
    opt = torch.optim.SGD(list(shared.parameters()) + list(experts.parameters()), lr=1e-3)
    perm = torch.randperm(tokens, generator=torch.Generator().manual_seed(SEED + rank))
    g = torch.Generator().manual_seed(SEED + 1000 + rank)
    x = torch.randn(tokens, dim, generator=g)

    class AllToAll(torch.autograd.Function):
        """dist.all_to_all_single with uneven splits; backward is the mirrored all_to_all."""

        @staticmethod
        def forward(ctx, inp, out_sizes, in_sizes):
            ctx.sizes = (out_sizes, in_sizes)
            out = inp.new_empty(sum(out_sizes), inp.shape[1])
            dist.all_to_all_single(out, inp.contiguous(), out_sizes, in_sizes)
            return out

        @staticmethod
        def backward(ctx, grad):
            out_sizes, in_sizes = ctx.sizes
            g_in = grad.new_empty(sum(in_sizes), grad.shape[1])
            dist.all_to_all_single(g_in, grad.contiguous(), in_sizes, out_sizes)
            return g_in, None, None

    def layer(h, li):
        h = shared[li](h)
        dispatched = h[perm]  # sorted by destination expert
        recv = AllToAll.apply(dispatched, out_splits, in_splits)  # dispatch
        out = experts[li](recv)
        back = AllToAll.apply(out, in_splits, out_splits)  # combine
        res = torch.empty_like(back)
        res[perm] = back
        return h + res

    def step(i):
        opt.zero_grad()
        h = x
        for li in range(n_layers):
            h = layer(h, li)
        loss = h.pow(2).mean()
        loss.backward()
        # DDP-style gradient all_reduce of the replicated (non-expert) parameters.
        for p in shared.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(world)
        opt.step()

    _profiled_steps(outdir, rank, step)
    received = [sum(send[src][e] for src in range(world)) for e in range(world)]
    seq = []
    for li in range(n_layers):
        seq.append({"layer": li, "phase": "dispatch", "recv_per_rank": received})
        seq.append({"layer": li, "phase": "combine", "recv_per_rank": [tokens] * world})
    for li in reversed(range(n_layers)):  # autograd: combine's backward first, then dispatch's
        seq.append({"layer": li, "phase": "combine_backward", "recv_per_rank": received})
        seq.append({"layer": li, "phase": "dispatch_backward", "recv_per_rank": [tokens] * world})
    truth = {
        "dims": [
            {"name": "ep", "size": world, "groups": [_group_ranks()]},
            {"name": "dp", "size": world, "groups": [_group_ranks()]},
        ],
        "expert_tokens_per_rank": received,
        "skewed_expert_rank": skew_expert,
        "tokens_per_rank": tokens,
        "send_matrix": send,
        "all_to_all_per_step": seq,
        "layers": n_layers,
        "grad_all_reduce_per_step": len(list(shared.parameters())),
    }
    _write_partial_truth(outdir, rank, truth)


def _tp_mlp(dim: int, hidden: int, n_blocks: int, tp_mesh, dp_mesh, reshard=True):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(SEED)
    model = nn.Sequential(*[Block(dim, hidden) for _ in range(n_blocks)])
    for blk in model:
        parallelize_module(blk, tp_mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(blk, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard)
    return model


def job_tp2dp2_unnamed(rank: int, world: int, outdir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dim, hidden, batch, n_blocks = 256, 1024, 32, 4
    model = _tp_mlp(dim, hidden, n_blocks, mesh["tp"], mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    dp_rank = mesh["dp"].get_local_rank()
    g = torch.Generator().manual_seed(SEED + dp_rank)  # same data across a TP group
    x = torch.randn(batch, dim, generator=g)

    def step(i):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    _profiled_steps(outdir, rank, step)
    truth = {
        "dims": _groups_from_mesh(mesh),
        "mesh_shape": list(mesh.mesh.shape),
        "mesh": mesh.mesh.tolist(),
        "model": f"{n_blocks} residual MLP blocks {dim}->{hidden}->{dim}; w1 ColwiseParallel, "
        "w2 RowwiseParallel on tp; fully_shard per block + root on dp",
        "strip_pg_desc": True,
    }
    _write_partial_truth(outdir, rank, truth)


def job_3d_16rank(rank: int, world: int, outdir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    shape, names = (2, 4, 2), ("pp", "dp", "tp")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    pp_mesh = mesh["pp"]
    pp_rank, pp_size = pp_mesh.get_local_rank(), pp_mesh.size()
    dim, hidden, batch, n_mb, blocks_per_stage = 128, 512, 8, 4, 1
    model = _tp_mlp(dim, hidden, blocks_per_stage, mesh["tp"], mesh["dp"], reshard=False)
    stage = PipelineStage(model, pp_rank, pp_size, torch.device("cpu"), group=pp_mesh.get_group())
    sched = ScheduleGPipe(stage, n_microbatches=n_mb, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    dp_rank = mesh["dp"].get_local_rank()
    g = torch.Generator().manual_seed(SEED + dp_rank)
    x = torch.randn(batch, dim, generator=g)
    y = torch.randn(batch, dim, generator=g)
    _profiled_steps(outdir, rank, lambda i: pipeline_step(sched, opt, pp_rank, pp_size, x, y))
    pipe = _pipeline_truth(sched, [stage])
    # _pipeline_truth sees only its own pp group: give the mapping for every pp group instead.
    pipe["stage_to_rank_per_pp_group"] = _groups_from_mesh(mesh)[0]["groups"]
    pipe["stages_of_rank"] = [
        [int((mesh.mesh == r).nonzero()[0][0])] for r in range(dist.get_world_size())
    ]
    del pipe["stage_to_rank"]
    truth = {
        "dims": _groups_from_mesh(mesh),
        "mesh_shape": list(mesh.mesh.shape),
        "mesh": mesh.mesh.tolist(),
        "pipeline": pipe,
        "blocks_per_stage": [blocks_per_stage] * pp_size,
        "batch_per_dp_rank": batch,
        "model": f"residual MLP blocks {dim}->{hidden}->{dim}; TP (colwise w1/rowwise w2) on tp, "
        "FSDP2 (reshard_after_forward=False) on dp, GPipe over pp",
    }
    _write_partial_truth(outdir, rank, truth)


def job_ddp_tp2_megatron_names(rank: int, world: int, outdir: str) -> None:
    tp_size = 2
    dp_size = world // tp_size
    # Megatron-style layout: TP groups are consecutive ranks, DP groups strided.
    tp_groups = [list(range(d * tp_size, (d + 1) * tp_size)) for d in range(dp_size)]
    dp_groups = [list(range(t, world, tp_size)) for t in range(tp_size)]
    my_tp = my_dp = None
    for ranks in tp_groups:  # every rank creates every group, in the same order
        pg = dist.new_group(ranks=ranks, group_desc="TENSOR_MODEL_PARALLEL_GROUP")
        if rank in ranks:
            my_tp = pg
    for ranks in dp_groups:
        pg = dist.new_group(ranks=ranks, group_desc="DATA_PARALLEL_GROUP")
        if rank in ranks:
            my_dp = pg
    tp_rank = dist.get_rank(my_tp)
    dim, hidden, batch, n_blocks = 256, 1024, 32, 3
    shard = hidden // tp_size
    calls = {"tp": 0, "dp": 0}  # all_reduce calls per group in the last step

    class _ReduceFwd(torch.autograd.Function):
        """Megatron 'g': all_reduce activations over TP in forward, identity in backward."""

        @staticmethod
        def forward(ctx, t):
            t = t.clone()
            calls["tp"] += 1
            dist.all_reduce(t, group=my_tp)
            return t

        @staticmethod
        def backward(ctx, grad):
            return grad

    class _CopyFwd(torch.autograd.Function):
        """Megatron 'f': identity in forward, all_reduce input grads over TP in backward."""

        @staticmethod
        def forward(ctx, t):
            return t

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            calls["tp"] += 1
            dist.all_reduce(grad, group=my_tp)
            return grad

    class TPBlock(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(SEED + 7 * tp_rank)
            self.w1 = nn.Linear(dim, shard)  # column shard
            self.w2 = nn.Linear(shard, dim, bias=False)  # row shard
            torch.manual_seed(SEED)
            self.b2 = nn.Parameter(torch.zeros(dim))  # replicated bias, added after the reduce

        def forward(self, x):
            h = self.w2(torch.relu(self.w1(_CopyFwd.apply(x))))
            return x + _ReduceFwd.apply(h) + self.b2

    model = nn.Sequential(*[TPBlock() for _ in range(n_blocks)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    dp_rank = dist.get_rank(my_dp)
    g = torch.Generator().manual_seed(SEED + dp_rank)
    x = torch.randn(batch, dim, generator=g)

    def step(i):
        opt.zero_grad()
        calls.update(tp=0, dp=0)
        model(x).pow(2).mean().backward()
        for p in model.parameters():  # DDP-style gradient all_reduce over DP
            calls["dp"] += 1
            dist.all_reduce(p.grad, group=my_dp)
            p.grad.div_(dp_size)
        opt.step()

    _profiled_steps(outdir, rank, step)
    truth = {
        "dims": [
            {"name": "tp", "size": tp_size, "groups": sorted(tp_groups), "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP"},
            {"name": "dp", "size": dp_size, "groups": sorted(dp_groups), "pg_desc": "DATA_PARALLEL_GROUP"},
        ],
        "model": f"{n_blocks} residual MLP blocks {dim}->{hidden}->{dim}, manual Megatron TP "
        "(activation all_reduce on TP in forward, input-grad all_reduce on TP in backward), "
        "gradient all_reduce per parameter on DP",
        "all_reduce_per_step": dict(calls),
    }
    _write_partial_truth(outdir, rank, truth)


NOTES = {
    "pp4-interleaved": [
        "torch.distributed.pipelining ScheduleInterleaved1F1B; rank r holds stages r and r+4 (looped placement).",
        "The runtime schedule annotates each action as a user_annotation 'PP:<stage><action><microbatch>' "
        "(e.g. 'PP:5F3', 'PP:4B0', 'PP:0SEND_F2', 'PP:1RECV_B7', plus per stage 'PP:<stage>UNSHARD' / "
        "'RESHARD' / 'REDUCE_GRAD'); send/recv are c10d::send / c10d::recv_ cpu_ops with gloo:send / "
        "gloo:recv spans.",
    ],
    "pp4-gpipe-slowstage1": [
        "ScheduleGPipe annotates 'Forward <mb>' / 'Backward <mb>' user_annotations.",
        "Stage 1 (rank 1) holds 3x the residual blocks of the other stages.",
    ],
    "ep4-alltoall-skewed": [
        "Expert parallel toy MoE: one expert per rank per layer, 2 layers; routing is fixed (seeded multinomial, "
        "expert 3 weighted 3x) and identical for every layer and step.",
        "all_to_all via dist.all_to_all_single(out, in, output_split_sizes, input_split_sizes) in an autograd "
        "Function whose backward is the mirrored all_to_all, so every step issues "
        "per layer a dispatch and a combine all_to_all in forward and their two mirrors in backward; "
        "'all_to_all_per_step' lists them in issue order with the rows each rank receives.",
        "expert_tokens_per_rank = rows each rank's expert receives in each dispatch all_to_all (and sends back "
        "in each combine).",
        "Then dist.all_reduce of every replicated (non-expert) parameter gradient over the world group (the 'dp' dim).",
        "Both ep and dp dims use the world group (pg_desc 'default_pg').",
    ],
    "tp2dp2-unnamed": [
        "Same layout as corpus cpu-gloo-tp2dp2 (init_device_mesh('cpu',(2,2),('dp','tp')), Colwise/Rowwise TP, "
        "fully_shard over dp). After tracing, every pg_desc in distributedInfo.pg_config (default_pg included) "
        "was rewritten to 'undefined' to imitate traces where group names are missing. dims were verified "
        "against the original pg_config (mesh_dp / mesh_tp) before stripping; 'original_pg_desc' records them.",
    ],
    "3d-16rank": [
        "16 ranks on a 3-D mesh ('pp','dp','tp') = (2,4,2); group names kept (mesh_pp/mesh_dp/mesh_tp).",
    ],
    "ddp-tp2-megatron-names": [
        "Groups created with dist.new_group(ranks=..., group_desc='TENSOR_MODEL_PARALLEL_GROUP' / "
        "'DATA_PARALLEL_GROUP'); no DeviceMesh.",
    ],
}

JOBS = {
    "pp4-interleaved": (4, job_pp4_interleaved),
    "pp4-gpipe-slowstage1": (4, job_pp4_gpipe_slowstage1),
    "ep4-alltoall-skewed": (4, job_ep4_alltoall_skewed),
    "tp2dp2-unnamed": (4, job_tp2dp2_unnamed),
    "3d-16rank": (16, job_3d_16rank),
    "ddp-tp2-megatron-names": (4, job_ddp_tp2_megatron_names),
}


# --------------------------------------------------------------------------- launching
# (the other generators under tests/data load this file for these: spawn_ranks, gloo_rank, pipeline_step)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gloo_rank(rank: int, world: int, port: int) -> Iterator[None]:
    """The body runs as `rank` of a gloo group on this machine (one CPU thread), then a barrier; the
    group is destroyed whatever happens."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def pipeline_step(sched, opt, stage: int, stages: int, x: torch.Tensor, y: torch.Tensor) -> None:
    """One training step through a pipeline schedule: the first stage feeds the inputs, the last
    takes the targets, the stages between pass activations on."""
    opt.zero_grad()
    if stage == 0:
        sched.step(x)
    elif stage == stages - 1:
        sched.step(target=y, losses=[])
    else:
        sched.step()
    opt.step()


def spawn_ranks(worker, head: tuple, world: int, jobdir: str) -> float:
    """`jobdir` emptied (made anew), then `worker(rank, *head, world, port, jobdir)` run in `world`
    spawned processes; the seconds it took."""
    if os.path.isdir(jobdir):
        shutil.rmtree(jobdir)
    os.makedirs(jobdir)
    t0 = time.time()
    mp.spawn(worker, args=(*head, world, free_port(), jobdir), nprocs=world, join=True)
    return time.time() - t0


def _worker(rank: int, name: str, world: int, port: int, outdir: str) -> None:
    with gloo_rank(rank, world, port):
        JOBS[name][1](rank, world, outdir)


def _read_trace(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _pg_groups_in_traces(paths: list[str]) -> dict[str, list[list[int]]]:
    """pg_desc -> sorted distinct rank lists, over every rank's distributedInfo.pg_config."""
    found: dict[str, set] = {}
    for p in paths:
        for pg in _read_trace(p)["distributedInfo"]["pg_config"]:
            found.setdefault(pg["pg_desc"], set()).add(tuple(sorted(pg["ranks"])))
    return {k: sorted(list(g) for g in v) for k, v in found.items()}


def _comm_args(paths: list[str], needle: str) -> dict:
    """Arg keys (and one example) of events whose name contains ``needle``."""
    out = {}
    d = _read_trace(paths[0])
    for e in d["traceEvents"]:
        n = e.get("name", "")
        if needle in n and n not in out:
            out[n] = {"cat": e.get("cat"), "args": e.get("args", {})}
    return out


def _check_a2a_splits(traces: list[str], truth: dict) -> str:
    """Compare the split sizes torch recorded on c10d::alltoall_base_ with the ones the job used."""
    send = truth["send_matrix"]
    world = len(send)
    seen = {}
    for r, p in enumerate(traces):  # traces are sorted rank0..rankN (world < 10)
        evs = sorted(
            (e for e in _read_trace(p)["traceEvents"] if e.get("name") == "c10d::alltoall_base_"),
            key=lambda e: e["ts"],
        )
        in_r = send[r]
        out_r = [send[s][r] for s in range(world)]
        # per step: (dispatch, combine) x layers in forward, then mirrored in backward
        per_step = []
        for a in truth["all_to_all_per_step"]:
            dispatch_like = a["phase"] in ("dispatch", "combine_backward")
            per_step.append((out_r, in_r) if dispatch_like else (in_r, out_r))
        expected = per_step * (len(evs) // max(1, len(per_step)))
        got = [
            (json.loads(e["args"]["Concrete Inputs"][3]), json.loads(e["args"]["Concrete Inputs"][4]))
            for e in evs
        ]
        if len(evs) != ACTIVE * len(per_step) or got != expected:
            raise RuntimeError(f"rank {r}: alltoall_base_ split sizes {got} != expected {expected}")
        seen[r] = len(evs)
    return (
        "Trace check (gloo, torch %s): every all_to_all is a cpu_op 'c10d::alltoall_base_' on the main "
        "thread (returns at once: async work) plus a user_annotation 'gloo:all_to_all' on a gloo worker "
        "thread (the transfer itself; not nested in the cpu_op). There is no record_param_comms event and no 'In split size'/"
        "'Out split size' args on gloo; the split sizes are in c10d::alltoall_base_ args['Concrete Inputs'][3] "
        "(output_split_sizes) and [4] (input_split_sizes) as strings like '[11, 9, 9, 11]', and "
        "args['Input Dims'][0]/[1] are the output/input shapes. Verified on every rank: %s events per rank, "
        "splits equal to send_matrix. gloo:all_to_all carries only the input shape (Input Dims)."
        % (torch.__version__, sorted(set(seen.values())))
    )


def _dumps(obj, level: int = 0) -> str:
    """JSON with one key per line, but lists of numbers (and lists of such lists) kept on one line."""

    def flat(o):  # a number, or a list of flat things
        return (isinstance(o, (int, float)) and not isinstance(o, bool)) or (
            isinstance(o, list) and all(flat(x) for x in o)
        )

    pad, pad1 = " " * level, " " * (level + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{pad1}{json.dumps(k)}: {_dumps(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and not flat(obj):
        items = [pad1 + _dumps(v, level + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj)


def _finalize(name: str, jobdir: str, world: int, elapsed_s: float) -> dict:
    partial = sorted(glob.glob(os.path.join(jobdir, "_truth.rank*.json")))
    truth = json.load(open(os.path.join(jobdir, "_truth.rank0.json")))
    for p in partial:
        os.remove(p)
    traces = sorted(glob.glob(os.path.join(jobdir, "rank*.pt.trace.json.gz")))
    if len(traces) != world:
        raise RuntimeError(f"{name}: expected {world} traces, found {len(traces)}")
    notes = list(NOTES.get(name, []))

    # Cross-check the dims against what torch recorded in pg_config.
    pg = _pg_groups_in_traces(traces)
    for d in truth["dims"]:
        desc = d.get("pg_desc")
        if desc is None:
            desc = f"mesh_{d['name']}" if f"mesh_{d['name']}" in pg else "default_pg"
            d["pg_desc"] = desc
        if pg.get(desc) != sorted(d["groups"]):
            raise RuntimeError(f"{name}: dim {d['name']} groups {d['groups']} != pg_config {desc}: {pg.get(desc)}")
    truth["pg_config_groups"] = pg

    if name == "ep4-alltoall-skewed":
        a2a = _comm_args(traces, "all_to_all") | _comm_args(traces, "alltoall")
        truth["all_to_all_trace_events"] = a2a
        notes.append(_check_a2a_splits(traces, truth))

    if truth.pop("strip_pg_desc", False):
        truth["original_pg_desc"] = {d["name"]: d["pg_desc"] for d in truth["dims"]}
        truth["original_pg_config_groups"] = truth["pg_config_groups"]
        for p in traces:
            data = _read_trace(p)
            for cfg in data["distributedInfo"]["pg_config"]:
                cfg["pg_desc"] = "undefined"
            with gzip.open(p, "wt") as f:
                json.dump(data, f)
        for d in truth["dims"]:
            d["pg_desc"] = "undefined"
        truth["pg_config_groups"] = _pg_groups_in_traces(traces)

    truth = {
        "job": name,
        "world_size": world,
        "backend": "gloo",
        "torch": torch.__version__,
        "profiled_steps": ACTIVE,
        "profiler_schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE},
        **truth,
        "notes": notes,
        "generation_seconds": round(elapsed_s, 1),
    }
    with open(os.path.join(jobdir, "ground_truth.json"), "w") as f:
        f.write(_dumps(truth) + "\n")
    return truth


def run_job(name: str, out: str) -> None:
    world = JOBS[name][0]
    jobdir = os.path.abspath(os.path.join(out, name))
    elapsed = spawn_ranks(_worker, (name,), world, jobdir)
    _finalize(name, jobdir, world, elapsed)
    sizes = [os.path.getsize(p) for p in glob.glob(os.path.join(jobdir, "*.gz"))]
    print(f"{name}: {world} ranks, {elapsed:.1f}s, max {max(sizes) / 1e3:.0f} kB, total {sum(sizes) / 1e3:.0f} kB",
          flush=True)


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
