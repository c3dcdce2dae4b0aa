"""What a training step runs: the op-tree dataclasses (`Op`, the device work it launches: `Kernel`,
`Memcpy`, and the DDP buckets' `AllReduce`) and the `Program` every rank runs each step."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from rankscope.synth.constants import NUM_SMS


@dataclass(frozen=True)
class Kernel:
    name: str
    dur_us: float
    grid: tuple[int, int, int] = (2048, 1, 1)
    block: tuple[int, int, int] = (128, 1, 1)
    registers: int = 32
    shared_mem: int = 0
    sigma: float = 0.03                       # run-to-run noise

    @cached_property
    def static_args(self) -> dict:
        blocks_per_sm = math.prod(self.grid) / NUM_SMS
        warps_per_sm = blocks_per_sm * math.prod(self.block) / 32
        return {"registers per thread": self.registers, "shared memory": self.shared_mem,
                "blocks per SM": round(blocks_per_sm, 6), "warps per SM": round(warps_per_sm, 6),
                "grid": list(self.grid), "block": list(self.block),
                "est. achieved occupancy %": min(100, int(100 * warps_per_sm / 64))}


@dataclass(frozen=True)
class Memcpy:
    name: str                                 # e.g. "Memcpy HtoD (Pinned -> Device)"
    nbytes: int
    bandwidth_gbps: float
    blocking: bool = False                    # the runtime call returns when the copy is done


@dataclass(frozen=True)
class AllReduce:
    """A DDP bucket's gradient all-reduce, launched where it appears in the backward pass."""
    bucket: int
    nelems: int

    @property
    def nbytes(self) -> int:
        return self.nelems * 2               # bf16

    @property
    def kernel_name(self) -> str:
        protocol = "LL" if self.nbytes <= 256 << 10 else "LL128" if self.nbytes <= 64 << 20 else "SIMPLE"
        return f"ncclDevKernel_AllReduce_Sum_bf16_RING_{protocol}(ncclDevKernelArgsStorage<4096ul>)"


SEQ_FWD, SEQ_BWD, SEQ_BWD_INNER = "fwd", "bwd", "bwd_inner"


@dataclass(frozen=True)
class Op:
    """A profiled CPU op (cat cpu_op) and what it does inside, in order."""
    name: str
    self_us: float                            # CPU time not spent in children or launches
    children: tuple[Op | AllReduce, ...] = ()
    launch: Kernel | Memcpy | None = None     # device work launched at the end of the op
    inputs: tuple[tuple[list, str], ...] = ()  # (dims, type) per input, for record_shapes args
    seq: str | None = None                    # autograd sequence number role: SEQ_*
    mem: tuple[int, int] | None = None        # [memory] event: (bytes, address offset)
    launches: int = 1                         # times `launch` runs back to back (a multi-kernel op)

    @cached_property
    def shape_args(self) -> dict:
        if not self.inputs:
            return {}
        dims = [d for d, _ in self.inputs]
        return {"Concrete Inputs": [""] * len(dims), "Input type": [t for _, t in self.inputs],
                "Input Strides": [_contiguous_strides(d) for d in dims], "Input Dims": dims}


def _contiguous_strides(dims: list) -> list:
    strides, acc = [], 1
    for size in reversed(dims):
        strides.append(acc)
        acc *= size
    return strides[::-1]


@dataclass(frozen=True)
class Program:
    """What one training step does on every rank."""
    layers: int
    inputs: tuple[Op, ...]                    # host-to-device copies of the batch
    forward: tuple[Op, ...]                   # top-level ops inside DistributedDataParallel.forward
    loss: tuple[Op, ...]
    backward_seed: Op                         # main thread: the ones_like that starts backward
    backward: tuple[Op, ...]                  # autograd-thread nodes, AllReduce inside AccumulateGrad
    buckets: tuple[AllReduce, ...]
    optimizer: tuple[Op, ...]
    sync: Op                                  # loss.item(): waits for the GPU
    static_bytes: int                         # parameters, gradients and optimizer state on the GPU

    @cached_property
    def compute_us_per_step(self) -> float:
        ops = (*self.inputs, *self.forward, *self.loss, self.backward_seed, *self.backward,
               *self.optimizer, self.sync)
        return sum(k.dur_us for op in ops for k in _kernels(op))


def _kernels(op: Op):
    if isinstance(op.launch, Kernel):
        yield op.launch
    for child in op.children:
        if isinstance(child, Op):
            yield from _kernels(child)
