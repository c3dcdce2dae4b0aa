"""Per-rank program changes: the injections that change what a rank runs (pageable_memcpy,
uneven_shards, launch_bound, fp32_gemm), as rewrites of the step's op tree (`_rank_programs`)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from rankscope.synth.constants import BF16
from rankscope.synth.faults import _JobFaults
from rankscope.synth.kernels import _FP32_GEMM_NAMES
from rankscope.synth.model import _ACCUMULATE_GRAD_NODE, _host_to_device, _Shape
from rankscope.synth.program import AllReduce, Kernel, Memcpy, Op, Program


def _map_ops(op: Op, change: Callable[[Op], Op], skip: str | None = None) -> Op:
    """The op tree with `change(op) -> Op` applied to every op, children first (an AllReduce is kept
    as it is); subtrees of ops named `skip` are kept as they are."""
    if op.name == skip:
        return op
    children = tuple(c if isinstance(c, AllReduce) else _map_ops(c, change, skip) for c in op.children)
    return change(replace(op, children=children) if children != op.children else op)


def _map_batch_ops(program: Program, change) -> Program:
    """`change` applied to the ops whose work grows with the batch: the input copies, forward, loss
    and backward (not the parameter-sized gradient accumulation, optimizer and loss.item())."""
    def tree(ops):
        return tuple(_map_ops(op, change, skip=_ACCUMULATE_GRAD_NODE) for op in ops)
    return replace(program, inputs=tree(program.inputs), forward=tree(program.forward), loss=tree(program.loss),
                   backward=tree(program.backward))


def _uneven_shards(program: Program, extra_pct: float) -> Program:
    """extra_pct % more samples: batch-sized kernels run longer, input copies move more bytes."""
    factor = 1.0 + extra_pct / 100.0

    def change(op: Op) -> Op:
        launch = op.launch
        if type(launch) is Kernel:
            return replace(op, launch=replace(launch, dur_us=launch.dur_us * factor))
        if type(launch) is Memcpy:
            return replace(op, launch=replace(launch, nbytes=round(launch.nbytes * factor)))
        return op
    return _map_batch_ops(program, change)


def _fp32_gemm(program: Program, slowdown: float) -> Program:
    def change(op: Op) -> Op:
        launch = op.launch
        if type(launch) is not Kernel or launch.name not in _FP32_GEMM_NAMES:
            return op
        kernel = Kernel(_FP32_GEMM_NAMES[launch.name], launch.dur_us * slowdown, grid=(64, 48, 1), block=(128, 1, 1),
                        registers=126, shared_mem=32_768, sigma=launch.sigma)
        return replace(op, launch=kernel, inputs=tuple((dims, "float" if t == BF16 else t) for dims, t in op.inputs))
    return replace(program, forward=tuple(_map_ops(op, change) for op in program.forward),
                   backward=tuple(_map_ops(op, change) for op in program.backward))


def _launch_bound(program: Program, kernels_per_op: int, kernel_us: float) -> Program:
    def change(op: Op) -> Op:
        if type(op.launch) is not Kernel:
            return op
        return replace(op, launch=replace(op.launch, dur_us=kernel_us, sigma=0.1), launches=kernels_per_op)
    return _map_batch_ops(program, change)


def _pageable_memcpy(program: Program, batch_mb: float, gbps: float) -> Program:
    """The batch (float32 features of batch_mb MB, then the labels) copied from pageable memory:
    cudaMemcpyAsync returns only when the driver has staged the copy, then aten::copy_ syncs."""
    s = _Shape()
    width = max(1, round(batch_mb * (1 << 20) / (s.tokens * 4)))
    features = _host_to_device(s.act(width), "float",
                               Memcpy("Memcpy HtoD (Pageable -> Device)", s.tokens * width * 4, gbps, blocking=True))
    labels = _host_to_device([s.batch, s.seq], "long int",
                             Memcpy("Memcpy HtoD (Pageable -> Device)", s.tokens * 8, gbps, blocking=True))
    return replace(program, inputs=(features, labels))


#: Applied in this order: launch_bound sets every batch-sized kernel's duration, so FP32 GEMMs
#: stay `slowdown` times slower than the other tiny kernels.
_PROGRAM_CHANGES: dict[str, Callable[..., Program]] = {"pageable_memcpy": _pageable_memcpy, "uneven_shards": _uneven_shards,
                    "launch_bound": _launch_bound, "fp32_gemm": _fp32_gemm}


def _rank_programs(program: Program, faults: _JobFaults) -> list[Program]:
    """Each rank's program; ranks with the same changes share one object."""
    built: dict[tuple, Program] = {}
    out = []
    for rank in faults.ranks:
        key = tuple((kind, rank.program_changes[kind]) for kind in _PROGRAM_CHANGES if kind in rank.program_changes)
        if key not in built:
            changed = program
            for kind, params in key:
                changed = _PROGRAM_CHANGES[kind](changed, *params)
            built[key] = changed
        out.append(built[key])
    return out
