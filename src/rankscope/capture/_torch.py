"""What every capture helper needs from torch: the import (with a one-line error), this process's
rank, and the device its collectives run on."""
from __future__ import annotations

import os
import time

INSTALL_HINT = "pip install 'rankscope[torch]'"


class CaptureError(RuntimeError):
    """A capture helper cannot run here (no torch, no process group); the message is one line."""


def import_torch():
    try:
        import torch
        import torch.distributed
    except ImportError as exc:
        raise CaptureError(f"rankscope.capture needs torch ({exc}): {INSTALL_HINT}") from None
    return torch


def dist_ready(torch) -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def current_rank(torch) -> int:
    """torch.distributed's rank when a process group is up, else env RANK (torchrun sets it), else 0."""
    if dist_ready(torch):
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def require_process_group(torch, what: str):
    if not dist_ready(torch):
        raise CaptureError(f"{what} needs an initialized process group (torch.distributed.init_process_group)")
    return torch.distributed


def comm_device(torch):
    """The device collectives of the default group run on: the current CUDA device for NCCL, else CPU."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def synchronize(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_calls_ns(torch, device, call, n: int) -> list[int]:
    """Wall ns of each of `n` calls of `call`, the device drained before and after each."""
    times = []
    for _ in range(n):
        synchronize(torch, device)
        start = time.perf_counter_ns()
        call()
        synchronize(torch, device)
        times.append(time.perf_counter_ns() - start)
    return times


def all_gather_float(torch, value: float) -> list[float]:
    """One float from every rank of the default group (index = rank); one float64 tensor on the wire."""
    dist = torch.distributed
    mine = torch.tensor([value], dtype=torch.float64, device=comm_device(torch))
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [float(t.item()) for t in out]


def finish_process_group(torch) -> None:
    """Tear the default group down once every rank is done with it. A barrier returns on one rank
    before its last message has reached the others, and gloo aborts a rank whose peer closes the
    connection under it (SIGABRT, seen 1 run in ~30 of 3-rank jobs); so each rank also says
    "done" through the rendezvous store and waits for all before destroying the group."""
    dist = torch.distributed
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"rankscope-done{dist.get_rank()}", "1")
    store.wait([f"rankscope-done{r}" for r in range(dist.get_world_size())])
    dist.destroy_process_group()

