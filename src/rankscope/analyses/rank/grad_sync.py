"""When a rank launches its gradient collectives, relative to its backward pass.

DDP (and FSDP's reduce-scatter) hide communication by launching each bucket's collective from an
autograd hook while the backward pass still runs (PyTorch DDP design notes: "overlap
computation with communication"). A collective launched after the backward pass has ended
cannot overlap with it: the step pays for it in full. That is the cause behind
"GPU idle after backward / AllReduce not overlapping".

Definition: a gradient collective is a host op `c10d::allreduce_` / `c10d::reduce_scatter*` /
`c10d::_reduce_scatter_base_` (or, in traces without c10d ops, the `nccl:all_reduce` /
`nccl:reduce_scatter*` annotation); it is *launched during backward* when its start lies inside
the union of the rank's `autograd::engine::evaluate_function` spans (any thread: the autograd
engine runs backward on its own threads for CUDA). Works the same on GPU and CPU-only (gloo)
traces. A rank without a backward pass or without gradient collectives has no schedule (None).
"""
from __future__ import annotations

import msgspec
import numpy as np
import polars as pl

from rankscope.analyses.intervals import union
from rankscope.model import Kind, RankTrace, names_matching

BACKWARD_PATTERN = r"^autograd::engine::evaluate_function"
C10D_GRAD_COLLECTIVE_PATTERN = r"^c10d::(allreduce_|reduce_scatter|_reduce_scatter_base)"
NCCL_GRAD_COLLECTIVE_PATTERN = r"^nccl:(all_reduce|reduce_scatter|_reduce_scatter_base)"
HOST_KINDS = (int(Kind.CPU_OP), int(Kind.USER_ANNOTATION))


class GradSyncSchedule(msgspec.Struct):
    collectives: int                    # gradient collectives launched by the host
    launched_during_backward: int
    launched_after_backward: int        # launched with no backward op running (after it ended)
    after_backward_pct: float
    source: str                         # "c10d" | "nccl_annotation": which host ops were counted


def gradient_sync_schedule(trace: RankTrace) -> GradSyncSchedule | None:
    ev = trace.events.filter(pl.col("kind").is_in(HOST_KINDS))
    backward = ev.filter(pl.col("name").is_in(names_matching(ev, BACKWARD_PATTERN)))
    if backward.is_empty():
        return None
    starts, source = None, ""
    for pattern, label in ((C10D_GRAD_COLLECTIVE_PATTERN, "c10d"), (NCCL_GRAD_COLLECTIVE_PATTERN, "nccl_annotation")):
        launched = ev.filter(pl.col("name").is_in(names_matching(ev, pattern)))
        if not launched.is_empty():
            starts, source = launched["ts_ns"].to_numpy(), label
            break
    if starts is None:
        return None
    bw_start = backward["ts_ns"].to_numpy()
    lo, hi = union(bw_start, bw_start + backward["dur_ns"].to_numpy())
    i = np.searchsorted(lo, starts, side="right") - 1
    during = int(((i >= 0) & (starts <= hi[np.maximum(i, 0)])).sum())
    n = len(starts)
    return GradSyncSchedule(collectives=n, launched_during_backward=during, launched_after_backward=n - during,
                            after_backward_pct=100.0 * (n - during) / n, source=source)
