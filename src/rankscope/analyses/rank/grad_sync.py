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

import numpy as np

from rankscope.analyses.intervals import union
from rankscope.analyses.rank.views import column, name_mask, named_mask, names_matching, rows_of_kinds
from rankscope.model import HOST_OP_KINDS, RankTrace
from rankscope.results.rank import GradSyncSchedule

BACKWARD_PATTERN = r"^autograd::engine::evaluate_function"
C10D_GRAD_COLLECTIVE_PATTERN = r"^c10d::(allreduce_|reduce_scatter|_reduce_scatter_base)"
NCCL_GRAD_COLLECTIVE_PATTERN = r"^nccl:(all_reduce|reduce_scatter|_reduce_scatter_base)"


def gradient_sync_schedule(trace: RankTrace) -> GradSyncSchedule | None:
    backward_names = names_matching(trace, BACKWARD_PATTERN)
    if not backward_names:
        return None
    ops = rows_of_kinds(trace, HOST_OP_KINDS)          # the rows of host_ops(trace)
    patterns = {"c10d": C10D_GRAD_COLLECTIVE_PATTERN, "nccl_annotation": NCCL_GRAD_COLLECTIVE_PATTERN}
    masks = {label: name_mask(trace, pattern)[ops] for label, pattern in patterns.items()}
    backward = named_mask(trace, backward_names)[ops]
    source = next((label for label in patterns if masks[label].any()), None)
    if not backward.any() or source is None:
        return None
    ts = column(trace, HOST_OP_KINDS, "ts_ns")
    starts = ts[masks[source]]
    lo, hi = union(ts[backward], ts[backward] + column(trace, HOST_OP_KINDS, "dur_ns")[backward])
    i = np.searchsorted(lo, starts, side="right") - 1
    during = int(((i >= 0) & (starts <= hi[np.maximum(i, 0)])).sum())
    n = len(starts)
    return GradSyncSchedule(collectives=n, launched_during_backward=during, launched_after_backward=n - during,
                            after_backward_pct=100.0 * (n - during) / n, source=source)
