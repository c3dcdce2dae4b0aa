"""`rank_profiler`: torch.profiler set up for a torchrun job, writing what `rankscope analyze` reads.

    from rankscope.capture import rank_profiler
    with rank_profiler("./log/profiler") as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

Each rank writes `rank{R}.{pid}.pt.trace.json.gz` into `out_dir` (R: torch.distributed's rank when
the process group is up, else env RANK, else 0), so one folder holds the whole job with every file
named by its rank. With `repeat` other than 1 each profiling cycle k goes to `out_dir/cycle{k}/`:
one folder per cycle, each a complete job (a folder never holds two traces of one rank).

Synchronized start: `start()` (entered by `with`) waits at `torch.distributed.barrier()` when a
process group is initialized, so every rank begins its schedule together and, counting
`prof.step()` calls alike, records the same `ProfilerStep#N` numbers; collectives then match
across the ranks' traces. Activities: CPU always, CUDA only when `torch.cuda.is_available()`.

Defaults, and why:
  wait=1        skip the first step: lazy initialization, allocator growth, DDP's first-step setup.
  warmup=1      the profiler's own start-up cost lands in a step that is thrown away.
  active=3      enough steps for step-time statistics and a straggler z-score, small files.
  repeat=1      one trace per rank: the job `rankscope analyze` expects.
  record_shapes=True    input shapes: GEMM FLOPs for `rankscope mfu` and message sizes.
  profile_memory=True   the allocated-memory timeline (memory findings, Perfetto counter).
  with_stack=False      Python stacks make traces several times larger and slow the job.
  with_flops=False      per-op FLOP counting costs time; `rankscope mfu` falls back to GEMM shapes.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from rankscope.capture._torch import current_rank, dist_ready, import_torch


def rank_profiler(out_dir: str | Path, wait: int = 1, warmup: int = 1, active: int = 3, repeat: int = 1,
                  record_shapes: bool = True, profile_memory: bool = True, with_stack: bool = False,
                  with_flops: bool = False):
    """A `torch.profiler.profile` (use it as a context manager and call `.step()` once per step)
    with the schedule (wait, warmup, active, repeat), rank-named gzip traces in `out_dir` and a
    synchronized start (module docstring)."""
    torch = import_torch()
    from torch.profiler import ProfilerActivity, schedule

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return _synced_profile()(
        activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
        on_trace_ready=rank_trace_handler(out_dir, per_cycle_folders=repeat != 1), record_shapes=record_shapes,
        profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops)


def rank_trace_handler(out_dir: str | Path, per_cycle_folders: bool = False):
    """An `on_trace_ready` handler writing `rank{R}.{pid}.pt.trace.json.gz` (module docstring)."""
    torch = import_torch()
    cycles = 0

    def write(prof) -> None:
        nonlocal cycles
        cycles += 1
        folder = Path(out_dir) / f"cycle{cycles}" if per_cycle_folders else Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(folder / f"rank{current_rank(torch)}.{os.getpid()}.pt.trace.json.gz"))

    return write


@functools.cache
def _synced_profile():
    """torch.profiler.profile whose start() first waits for every rank (built on first use, so
    that importing this module needs no torch)."""
    torch = import_torch()

    class SyncedProfile(torch.profiler.profile):
        def start(self) -> None:
            if dist_ready(torch):
                torch.distributed.barrier()
            super().start()

    return SyncedProfile
