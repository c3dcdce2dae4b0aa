"""`ddp_bucket_sweep`: the same training step under DDP with several `bucket_cap_mb` settings.

Every rank of an initialized process group calls it with the same arguments. For each setting: a
fresh model from `model_fn()`, wrapped in DDP with that bucket size; five steps under
`rank_profiler` (wait 1, warmup 1, active 3: they also warm the setting up), whose traces go to
`out_dir/bucket_cap_{cap}mb/`; then `steps` timed steps without the profiler. Compare the
settings' traces with `rankscope diff out_dir/bucket_cap_25mb out_dir/bucket_cap_5mb`.

Smaller buckets start the gradient all-reduce earlier in backward (more overlap) but pay each
collective's latency more often; the best size depends on the model and the fabric.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from rankscope.capture._torch import (
    all_gather_float,
    comm_device,
    import_torch,
    require_process_group,
    timed_calls_ns,
)
from rankscope.capture.profiler import rank_profiler

PROFILED_STEPS = 5       # rank_profiler's default schedule: wait 1 + warmup 1 + active 3


@dataclass
class BucketSetting:
    bucket_cap_mb: float
    step_time_ms_mean: float               # mean over ranks of each rank's mean over the timed steps
    step_time_ms_per_rank: list[float]     # index = rank
    trace_dir: Path                        # one rank_profiler trace per rank


def ddp_bucket_sweep(model_fn, batch_fn, bucket_caps_mb=(1, 5, 25, 100), steps: int = 10,
                     out_dir: str | Path = "bucket_sweep", loss_fn=None, optimizer_fn=None) -> list[BucketSetting]:
    """`model_fn()` -> a fresh torch.nn.Module; `batch_fn()` -> (inputs, target) for one step;
    `loss_fn(output, target)` (default mean squared error); `optimizer_fn(params)` (default SGD,
    lr 1e-3). Model and batches are moved to the collectives' device (the current CUDA device
    under NCCL, else CPU). Returns one `BucketSetting` per bucket size, on every rank."""
    torch = import_torch()
    require_process_group(torch, "ddp_bucket_sweep")
    from torch.nn.parallel import DistributedDataParallel

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    device = comm_device(torch)
    loss_fn = loss_fn or torch.nn.functional.mse_loss
    optimizer_fn = optimizer_fn or (lambda params: torch.optim.SGD(params, lr=1e-3))
    results = []
    for cap in bucket_caps_mb:
        model = DistributedDataParallel(model_fn().to(device), bucket_cap_mb=cap,
                                        device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = optimizer_fn(model.parameters())
        train_step = functools.partial(_train_step, model, optimizer, batch_fn, loss_fn, device)

        trace_dir = Path(out_dir) / f"bucket_cap_{cap:g}mb"
        with rank_profiler(trace_dir) as prof:
            for _ in range(PROFILED_STEPS):
                train_step()
                prof.step()
        times_ns = timed_calls_ns(torch, device, train_step, steps)
        per_rank_ms = all_gather_float(torch, sum(times_ns) / len(times_ns) / 1e6)
        results.append(BucketSetting(cap, sum(per_rank_ms) / len(per_rank_ms), per_rank_ms, trace_dir))
    return results


def _train_step(model, optimizer, batch_fn, loss_fn, device) -> None:
    inputs, target = (t.to(device) for t in batch_fn())
    optimizer.zero_grad(set_to_none=True)
    loss_fn(model(inputs), target).backward()
    optimizer.step()
