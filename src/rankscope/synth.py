"""Synthetic Kineto job generator with injected faults and a ground-truth file.

Simulates a data-parallel (DDP) training job of a small bf16 transformer on 8-GPU H100 nodes
and writes what `torch.profiler` + `tensorboard_trace_handler` would write for every rank:
`rank{r}.{time_ns}.pt.trace.json[.gz]`, in the current Kineto format (shapes copied from real
traces in the corpus), plus `ground_truth.json` with the true values an analysis is checked against.

The model of time (all int nanoseconds on one shared job timeline):
- each rank has a main thread, an autograd thread, a compute stream (7) and an NCCL stream (20);
  CPU ops take their time, kernels start at max(launch + latency, stream free) and run their time;
- DDP buckets: after a bucket's last gradient is accumulated the autograd thread launches its
  all-reduce, which waits on the compute stream (event wait) and on the NCCL stream;
- an all-reduce ends on every rank at max over ranks of (ready time) + transfer time (+ a few µs):
  a rank that arrives early waits inside its NCCL kernel, so a straggler shows up as the other
  ranks' longer NCCL kernels;
- the optimizer waits for the all-reduces, and `loss.item()` at the end of each step syncs the
  host with the GPU, so every rank's step lasts as long as the slowest rank's.

Injections (`KIND_PARAMS`; `injection_help()` prints them) either change timing on the fly
(straggler, no_overlap, clock_offset) or what a rank runs (`_PROGRAM_CHANGES`: the step's op tree
rewritten for that rank: pageable_memcpy, uneven_shards, launch_bound, fp32_gemm), or the file
(truncated). A fault on one rank that makes it slower is a straggler in the ground truth, with the
cause its extra time goes to; rank="all" slows every rank alike (no straggler).

Noise comes from seeded numpy Generators (one per rank, one for the network); injections never
draw from them, so a job with a straggler is draw for draw the healthy job plus the fault
(no_overlap reorders work, so there the noise lands on other ops).
The job is simulated twice: a cheap timing pass over all ranks, step by step (collectives couple
the ranks), then one rank at a time with events, so memory stays flat in the number of ranks.
"""
from __future__ import annotations

import gc
import hashlib
import math
import os
import re
import shutil
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from operator import itemgetter
from pathlib import Path

import msgspec
import numpy as np

GROUND_TRUTH_SCHEMA = "rankscope.ground_truth/1"
GROUND_TRUTH_FILE = "ground_truth.json"
GENERATOR = "rankscope.synth"
GENERATOR_VERSION = 2

FIRST_STEP = 5                  # ProfilerStep#5 is the first profiled step
DEFAULT_LAYERS = 6              # transformer blocks at scale=1
BUCKETS_PER_BLOCK = 4           # DDP buckets (all-reduces) per transformer block
PARAM_TENSORS_PER_BLOCK = 8     # 4 bias-free linears, 2 layer norms (weight, bias)
GPUS_PER_NODE = 8
NUM_SMS = 132
COMPUTE_STREAM = 7
COMM_STREAM = 20
BF16 = "c10::BFloat16"
SCALAR, NONE, TENSORS = ([], "Scalar"), ([], ""), ([], "TensorList")   # record_shapes inputs without dims

BASE_TIME_NS = 1_790_857_026_000_000_000    # "baseTimeNanoseconds": an epoch in whole seconds
TRACE_ORIGIN_NS = 4_457_526_208_000_000     # job time 0 as a Kineto ts (µs since that base) × 1000
DEVICE_MEM_BASE_ADDR = 139_637_976_727_552  # 0x7F0000000000, where [memory] Addr values start

# Hardware and software constants of the simulated job.
BUS_BANDWIDTH_GBPS = 200.0       # effective busbw of 8-34 MB all-reduces on 8x H100 NVLink (peak ~400 at >=256 MB)
NCCL_BASE_LATENCY_US = 12.0
NCCL_HOP_LATENCY_US = 1.5
COLLECTIVE_END_JITTER_NS = 3_000  # NCCL kernels of one collective end within this on all ranks
KERNEL_LAUNCH_LATENCY_NS = 4_000  # runtime call start -> earliest kernel start
LAUNCH_CALL_US = 5.0              # cudaLaunchKernel CPU time
LAUNCH_LOOP_US = 2.0              # host time between the launches of a multi-kernel op
RESERVE_GRANULE_BYTES = 20 << 20  # caching allocator grows reserved memory in these steps

# Noise (lognormal sigmas) and pacing of the host threads.
RANK_CPU_SPEED_SIGMA = 0.02      # healthy ranks differ by ~1-3 %
RANK_GPU_SPEED_SIGMA = 0.01
CPU_OP_SIGMA = 0.10             # every host duration, DataLoader included
TRANSFER_SIGMA = 0.03
PYTHON_GAP_US = 35.0             # Python between top-level forward ops (outside any profiled op)
AUTOGRAD_GAP_US = 6.0            # engine overhead between backward nodes
OPTIMIZER_GAP_US = 12.0
DATALOADER_US = 1_300.0          # DataLoader __next__ of a healthy rank (workers keep up)
STEP_START_JITTER_US = 150.0     # ranks start profiling at slightly different times

STRAGGLER_CAUSES = ("dataloader", "host_idle", "gpu_compute")


# --------------------------------------------------------------------------------------------
# Injections
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Injection:
    """One fault to inject. `kind` names it; `params` configure it (see `KIND_PARAMS`)."""
    kind: str
    params: dict = field(default_factory=dict)


class RankOrAll:
    """Parameter type: one rank number, or "all" (every rank: a job-wide fault)."""


@dataclass(frozen=True)
class _KindSpec:
    params: dict[str, type]                     # parameter -> type (int, float, str, RankOrAll)
    defaults: dict[str, object]
    help: str = ""


KIND_PARAMS: dict[str, _KindSpec] = {
    "straggler": _KindSpec({"rank": int, "cause": str, "delay_ms": float},
                           {"cause": "host_idle", "delay_ms": 40.0},
                           "one rank late every step by delay_ms: cause dataloader (a longer DataLoader "
                           "__next__), host_idle (main thread busy outside any op between forward and "
                           "backward) or gpu_compute (its kernels slower by delay_ms in total)"),
    "no_overlap": _KindSpec({}, {}, "DDP all-reduces launched one by one after backward (no overlap)"),
    "clock_offset": _KindSpec({"rank": int, "offset_ms": float}, {}, "the rank's host clock off by offset_ms"),
    "truncated": _KindSpec({"rank": int}, {}, "the rank's file cut mid-event (writer killed)"),
    "launch_bound": _KindSpec({"rank": RankOrAll, "kernels_per_op": int, "kernel_us": float},
                              {"rank": "all", "kernels_per_op": 8, "kernel_us": 3.0},
                              "tiny tensors, eager mode: every forward/backward op launches kernels_per_op "
                              "kernels of ~kernel_us each (each launch ~5 us of CPU): the GPU idles between them "
                              "(one rank alone is not slower: the others' GPU-bound pace hides it)"),
    "pageable_memcpy": _KindSpec({"rank": RankOrAll, "batch_mb": float, "gbps": float},
                                 {"rank": "all", "batch_mb": 32.0, "gbps": 6.0},
                                 "the input batch (batch_mb MB per step, e.g. float32 features) copied HtoD "
                                 "from pageable memory at ~gbps GB/s, blocking the host (pin_memory=False)"),
    "uneven_shards": _KindSpec({"rank": int, "extra_pct": float}, {"extra_pct": 20.0},
                               "the rank gets extra_pct % more samples per step: its batch-sized kernels "
                               "(forward, loss, backward) run that much longer"),
    "fp32_gemm": _KindSpec({"rank": RankOrAll, "slowdown": float}, {"rank": "all", "slowdown": 8.0},
                           "the Linear layers' GEMMs run in FP32 on CUDA cores (cuBLAS SIMT sgemm kernels, "
                           "no TF32), slowdown x slower than the bf16 Tensor Core GEMMs"),
}


def injection_help() -> str:
    """One line per injection kind: its parameters with defaults, and what it simulates."""
    lines = []
    for kind, spec in KIND_PARAMS.items():
        params = ",".join(f"{name}={spec.defaults[name]}" if name in spec.defaults else f"{name}=..."
                          for name in spec.params)
        lines.append(f"{kind}{':' + params if params else ''}  {spec.help}")
    return "\n".join(lines)


def parse_injection(text: str) -> Injection:
    """Parse `kind[:key=value,...]`, e.g. "straggler:rank=19,cause=dataloader,delay_ms=40".

    Missing optional parameters get their defaults. Raises ValueError naming the problem."""
    kind, _, rest = text.strip().partition(":")
    params: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise ValueError(f"injection {text!r}: expected key=value, got {item!r}")
        if key in params:
            raise ValueError(f"injection {text!r}: parameter {key!r} given twice")
        params[key] = _parse_value(value)
    return _normalized(Injection(kind.strip(), params))


def _parse_value(value: str) -> int | float | str:
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def _normalized(inj: Injection, world_size: int | None = None) -> Injection:
    """Check kind, parameter names, types and ranges; fill defaults."""
    spec = KIND_PARAMS.get(inj.kind)
    if spec is None:
        raise ValueError(f"unknown injection kind {inj.kind!r}; known: {', '.join(KIND_PARAMS)}")
    unknown = sorted(set(inj.params) - set(spec.params))
    if unknown:
        raise ValueError(f"injection {inj.kind}: unknown parameter(s) {', '.join(unknown)}; "
                         f"expected: {', '.join(spec.params) or 'none'}")
    params = {**spec.defaults, **inj.params}
    missing = [name for name in spec.params if name not in params]
    if missing:
        raise ValueError(f"injection {inj.kind}: missing parameter(s) {', '.join(missing)}")
    for name, kind in spec.params.items():
        params[name] = _typed(inj.kind, name, params[name], kind)
    _check_ranges(inj.kind, params, world_size)
    return Injection(inj.kind, {name: params[name] for name in spec.params})


def _typed(kind: str, name: str, value: object, expected: type) -> object:
    if expected is RankOrAll:
        if value == "all" or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise ValueError(f"injection {kind}: {name} must be a rank number or 'all', got {value!r}")
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or isinstance(value, bool):
        raise ValueError(f"injection {kind}: {name} must be {expected.__name__}, got {value!r}")
    return value


def _check_ranges(kind: str, params: dict, world_size: int | None) -> None:
    rank = params.get("rank")
    if isinstance(rank, int) and (rank < 0 or (world_size is not None and rank >= world_size)):
        bound = f" (job has {world_size} ranks)" if world_size is not None else ""
        raise ValueError(f"injection {kind}: rank {rank} out of range{bound}")
    if kind == "straggler":
        if params["cause"] not in STRAGGLER_CAUSES:
            raise ValueError(f"injection straggler: cause must be one of {', '.join(STRAGGLER_CAUSES)}, "
                             f"got {params['cause']!r}")
        if params["delay_ms"] <= 0:
            raise ValueError(f"injection straggler: delay_ms must be > 0, got {params['delay_ms']}")
    for name, low in _MINIMUM.get(kind, {}).items():
        if params[name] < low:
            raise ValueError(f"injection {kind}: {name} must be >= {low}, got {params[name]}")


_MINIMUM = {"launch_bound": {"kernels_per_op": 1, "kernel_us": 1.0}, "pageable_memcpy": {"batch_mb": 0.001, "gbps": 0.1},
            "uneven_shards": {"extra_pct": 0.0}, "fp32_gemm": {"slowdown": 1.0}}


@dataclass
class _RankFaults:
    dataloader_delay_ns: int = 0
    host_idle_ns: int = 0
    gpu_compute_delay_ns: int = 0
    clock_offset_ns: int = 0
    truncated: bool = False
    program_changes: dict[str, tuple] = field(default_factory=dict)   # kind -> parameters (see _PROGRAM_CHANGES)


@dataclass
class _JobFaults:
    ranks: list[_RankFaults]
    overlap_comm: bool = True


def _ms_to_ns(ms: float) -> int:
    return round(ms * 1_000_000)


def _apply_straggler(faults: _JobFaults, p: dict) -> None:
    rank, delay_ns = faults.ranks[p["rank"]], _ms_to_ns(p["delay_ms"])
    if p["cause"] == "dataloader":
        rank.dataloader_delay_ns += delay_ns
    elif p["cause"] == "host_idle":
        rank.host_idle_ns += delay_ns
    else:
        rank.gpu_compute_delay_ns += delay_ns


def _apply_no_overlap(faults: _JobFaults, p: dict) -> None:
    faults.overlap_comm = False


def _apply_clock_offset(faults: _JobFaults, p: dict) -> None:
    faults.ranks[p["rank"]].clock_offset_ns += _ms_to_ns(p["offset_ms"])


def _apply_truncated(faults: _JobFaults, p: dict) -> None:
    faults.ranks[p["rank"]].truncated = True


_APPLY = {
    "straggler": _apply_straggler,
    "no_overlap": _apply_no_overlap,
    "clock_offset": _apply_clock_offset,
    "truncated": _apply_truncated,
}


def _program_change(inj: Injection) -> tuple:
    """The parameters of an injection that changes what the rank runs (_PROGRAM_CHANGES)."""
    return tuple(value for name, value in inj.params.items() if name != "rank")


def _targets(inj: Injection, world_size: int) -> range | list[int]:
    rank = inj.params["rank"]
    return range(world_size) if rank == "all" else [rank]


def _plan_faults(injections: list[Injection], world_size: int) -> _JobFaults:
    faults = _JobFaults([_RankFaults() for _ in range(world_size)])
    for inj in injections:
        if inj.kind in _APPLY:
            _APPLY[inj.kind](faults, inj.params)
            continue
        for rank in _targets(inj, world_size):
            faults.ranks[rank].program_changes[inj.kind] = _program_change(inj)
    return faults


#: What the late rank of each straggler-making injection spends its extra time on (DESIGN.md causes).
_STRAGGLER_CAUSE_BY_KIND = {"uneven_shards": "gpu_compute", "fp32_gemm": "gpu_compute", "pageable_memcpy": "memcpy"}


def _makes_straggler(inj: Injection) -> bool:
    """One rank does more than the others: the straggler kind, and the per-rank program changes
    aimed at a single rank (rank="all" slows every rank alike: no straggler)."""
    return inj.kind == "straggler" or (inj.kind in _STRAGGLER_CAUSE_BY_KIND and inj.params["rank"] != "all")


# --------------------------------------------------------------------------------------------
# The training program: op trees, kernels, buckets
# --------------------------------------------------------------------------------------------

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


# Kernel names as they appear in H100 bf16 traces.
_GEMM_TN = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
            "kernel__5x_cublas")
_GEMM_NN = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_"
            "kernel__5x_cublas")
_GEMM_NT = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_"
            "kernel__5x_cublas")
_LN_FWD = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
           "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)")
_LN_BWD_INPUT = ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, "
                 "float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, "
                 "c10::BFloat16 const*, c10::BFloat16*, int)")
_LN_BWD_GAMMA = ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<c10::BFloat16, "
                 "float>(long, long, c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, "
                 "c10::BFloat16*, c10::BFloat16*)")
_FLASH_FWD = ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
              "false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, "
              "cutlass::bfloat16_t> >, false, true, false, false, true, true, false, "
              "false>(pytorch_flash::Flash_fwd_params)")
_FLASH_BWD_DOT = ("void pytorch_flash::flash_bwd_dot_do_o_kernel<true, pytorch_flash::Flash_bwd_kernel_traits<128, "
                  "64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, "
                  "64, 128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params)")
_FLASH_BWD = ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<pytorch_flash::Flash_bwd_kernel_"
              "traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, "
              "pytorch_flash::Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, true, false, false, "
              "false, false, false>(pytorch_flash::Flash_bwd_params)")
_FLASH_BWD_DQ = ("void pytorch_flash::flash_bwd_convert_dq_kernel<pytorch_flash::Flash_bwd_kernel_traits<128, 64, "
                 "128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, "
                 "128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params, int)")


def _elementwise(functor: str, arity: int) -> str:
    return (f"void at::native::vectorized_elementwise_kernel<4, {functor}, std::array<char*, {arity}ul> >"
            f"(int, {functor}, std::array<char*, {arity}ul>)")


_ADD = _elementwise("at::native::CUDAFunctor_add<c10::BFloat16>", 3)
_GELU = _elementwise("at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
                     "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
                     "operator()() const::{lambda(c10::BFloat16)#1}", 2)
_GELU_BWD = _elementwise("at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, "
                         "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
                         "operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}", 3)
_MUL_SCALAR = _elementwise("at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
                           "at::native::binary_internal::MulFunctor<float> >", 2)
_FILL = _elementwise("at::native::FillFunctor<c10::BFloat16>", 1)
_CAT = ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<at::native::"
        "(anonymous namespace)::OpaqueType<2u>, unsigned int, 3, 128, "
        "1>(at::native::(anonymous namespace)::OpaqueType<2u>*, "
        "at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::"
        "OpaqueType<2u>, unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, "
        "4u>, int, unsigned int)")
_LOG_SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, "
                "c10::BFloat16, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(c10::BFloat16*, "
                "c10::BFloat16 const*, int)")
_LOG_SOFTMAX_BWD = ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, c10::BFloat16, float, "
                    "c10::BFloat16, at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(c10::BFloat16*, "
                    "c10::BFloat16 const*, c10::BFloat16 const*, int)")
_NLL_FWD = ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<c10::BFloat16, float, "
            "long>(c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, long const*, c10::BFloat16 const*, bool, "
            "long, long, long, long)")
_NLL_BWD = ("void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<c10::BFloat16, "
            "long>(c10::BFloat16*, c10::BFloat16 const*, long const*, c10::BFloat16 const*, c10::BFloat16 const*, "
            "bool, int, int, long, long)")
_FOREACH_NORM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                 "(anonymous namespace)::TensorListMetadata<1>, "
                 "at::native::(anonymous namespace)::LpNormFunctor<c10::BFloat16, 2, float, float>, float*, "
                 "int>(at::native::(anonymous namespace)::TensorListMetadata<1>, "
                 "at::native::(anonymous namespace)::LpNormFunctor<c10::BFloat16, 2, float, float>, float*, int)")
_FOREACH_NORM_CLEANUP = ("void at::native::(anonymous namespace)::lpnorm_cleanup<float, 2, float, "
                         "float>(float const*, at::native::(anonymous namespace)::TensorListAddresses, int)")
_REDUCE_NORM = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, "
                "float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, "
                "at::native::NormTwoOps<float, float, float>, unsigned int, float, 4, 4>)")
_CLAMP = _elementwise("at::native::(anonymous namespace)::clamp_scalar_kernel_impl(at::TensorIteratorBase&, "
                      "c10::Scalar const&, "
                      "c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::"
                      "{lambda(float)#1}", 2)
_FOREACH_MUL = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::TensorListMetadata<1>, "
                "at::native::(anonymous namespace)::BinaryOpScalarTensorFunctor<c10::BFloat16, 1, 1, 0>, "
                "std::multiplies<float>, float const*>(at::native::(anonymous namespace)::TensorListMetadata<1>, "
                "at::native::(anonymous namespace)::BinaryOpScalarTensorFunctor<c10::BFloat16, 1, 1, 0>, "
                "std::multiplies<float>, float const*)")
_FUSED_ADAMW = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, "
                "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, "
                "false>, double*, double, double, double, double, double, bool, float*, "
                "float*>(at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, "
                "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, "
                "false>, double*, double, double, double, double, double, bool, float*, float*)")


@dataclass(frozen=True)
class _Shape:
    """Sizes of the simulated model: a GPT-style block, bias-free linears, bf16, batch 4 x 2048."""
    batch: int = 4
    seq: int = 2048
    hidden: int = 2048
    ffn: int = 8192
    heads: int = 16

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def act(self, width: int) -> list:
        return [self.batch, self.seq, width]


def _gemm(name: str, dur_us: float) -> Kernel:
    return Kernel(name, dur_us, grid=(NUM_SMS, 1, 1), block=(384, 1, 1), registers=168, shared_mem=213_248, sigma=0.015)


def _ew(name: str, dur_us: float) -> Kernel:
    return Kernel(name, dur_us, grid=(8192, 1, 1), block=(128, 1, 1), registers=24)


def _as_strided(dims: list) -> Op:
    return Op("aten::as_strided", 1.0, inputs=((dims, BF16), ([], "ScalarList"), ([], "ScalarList"), NONE))


def _transpose(dims: list) -> Op:
    return Op("aten::transpose", 3.0, (_as_strided(dims),), inputs=((dims, BF16), SCALAR, SCALAR))


def _view(dims: list) -> Op:
    return Op("aten::view", 2.5, inputs=((dims, BF16), ([], "ScalarList")))


class _ModelBuilder:
    """Builds the op trees of one step; hands out activation addresses so frees match allocs."""

    def __init__(self, shape: _Shape):
        self.s = shape
        self._next_addr = 0

    def alloc(self, width: int) -> tuple[int, int]:
        """An activation of `width` bf16 values per token: (bytes, address offset)."""
        return self.alloc_bytes(self.s.tokens * width * 2)

    def alloc_bytes(self, nbytes: int) -> tuple[int, int]:
        addr, self._next_addr = self._next_addr, self._next_addr + _round_up(nbytes, 512)
        return nbytes, addr

    def linear(self, fin: int, fout: int, gemm_us: float) -> tuple[Op, tuple[int, int]]:
        s, mem = self.s, self.alloc(fout)
        x, w = s.act(fin), [fout, fin]
        mm = Op("aten::mm", 10.0, launch=_gemm(_GEMM_TN, gemm_us), mem=mem,
                inputs=(([s.tokens, fin], BF16), ([fin, fout], BF16)))
        matmul = Op("aten::matmul", 6.0, (_view(x), mm, Op("aten::_unsafe_view", 2.5)),
                    inputs=((x, BF16), ([fin, fout], BF16)))
        t = Op("aten::t", 2.5, (_transpose(w),), inputs=((w, BF16),))
        return Op("aten::linear", 7.0, (t, matmul), inputs=((x, BF16), (w, BF16)), seq=SEQ_FWD), mem

    def layer_norm(self) -> tuple[Op, tuple[int, int]]:
        h, mem = self.s.hidden, self.alloc(self.s.hidden)
        x = self.s.act(h)
        native = Op("aten::native_layer_norm", 12.0, (Op("aten::empty", 2.0), Op("aten::empty", 2.0)),
                    launch=_ew(_LN_FWD, 30.0), mem=mem, inputs=((x, BF16), ([h], ""), ([h], BF16), ([h], BF16), NONE))
        return Op("aten::layer_norm", 5.0, (native,), inputs=((x, BF16), ([h], ""), ([h], BF16), ([h], BF16),
                                                               SCALAR, SCALAR), seq=SEQ_FWD), mem

    def pointwise(self, name: str, kernel: Kernel, width: int, arity: int) -> tuple[Op, tuple[int, int]]:
        mem = self.alloc(width)
        x = self.s.act(width)
        return Op(name, 9.0, launch=kernel, mem=mem, inputs=((x, BF16),) * arity, seq=SEQ_FWD), mem

    def attention(self) -> tuple[list[Op], tuple[int, int]]:
        s = self.s
        qkv, head = s.act(3 * s.hidden), [s.batch, s.seq, s.heads, s.hidden // s.heads]
        bhsd = [s.batch, s.heads, s.seq, s.hidden // s.heads]
        split = Op("aten::split", 6.0, tuple(Op("aten::narrow", 2.5, (Op("aten::slice", 2.0, (_as_strided(qkv),)),))
                                             for _ in range(3)), inputs=((qkv, BF16), SCALAR, SCALAR),
                   seq=SEQ_FWD)
        mem = self.alloc(s.hidden)
        flash = Op("aten::_flash_attention_forward", 14.0, (Op("aten::empty", 2.0), Op("aten::empty", 2.0)),
                   launch=Kernel(_FLASH_FWD, 170.0, grid=(16, 64, 1), block=(128, 1, 1), registers=255,
                                 shared_mem=49_152, sigma=0.02), mem=mem, inputs=((bhsd, BF16),) * 3)
        sdpa_inner = Op("aten::_scaled_dot_product_flash_attention", 8.0,
                        (_transpose(head), _transpose(head), _transpose(head), flash, _transpose(bhsd)),
                        inputs=((bhsd, BF16),) * 3)
        sdpa = Op("aten::scaled_dot_product_attention", 6.0, (sdpa_inner,), inputs=((bhsd, BF16),) * 3, seq=SEQ_FWD)
        heads_view = [_view(head) for _ in range(3)] + [_transpose(head) for _ in range(3)]
        return [split, *heads_view, sdpa, _transpose(bhsd), _view(head)], mem

    def block(self, first_bucket: int) -> tuple[list[Op], list[Op | AllReduce], list[AllReduce], int]:
        """One transformer block: forward top-level ops, backward nodes, its buckets (numbered from
        `first_bucket` in the order DDP fires them), its parameter count."""
        s, h, f = self.s, self.s.hidden, self.s.ffn
        ln1, m_ln1 = self.layer_norm()
        qkv, m_qkv = self.linear(h, 3 * h, 345.0)
        attn_ops, m_attn = self.attention()
        out, m_out = self.linear(h, h, 120.0)
        add1, m_add1 = self.pointwise("aten::add", _ew(_ADD, 40.0), h, 2)
        ln2, m_ln2 = self.layer_norm()
        fc1, m_fc1 = self.linear(h, f, 460.0)
        gelu, m_gelu = self.pointwise("aten::gelu", _ew(_GELU, 95.0), f, 1)
        fc2, m_fc2 = self.linear(f, h, 460.0)
        add2, m_add2 = self.pointwise("aten::add", _ew(_ADD, 40.0), h, 2)
        forward = [ln1, qkv, *attn_ops, out, add1, ln2, fc1, gelu, fc2, add2]

        sizes = (f * h, h * f, h * h + 2 * h, 3 * h * h + 2 * h)      # fc2 | fc1 | ln2 + out | qkv + ln1
        buckets = [AllReduce(first_bucket + i, nelems) for i, nelems in enumerate(sizes)]
        b_fc2, b_fc1, b_attn, b_qkv = buckets
        backward: list[Op | AllReduce] = [
            _node("AddBackward0", (), m_add2),
            _mm_backward(s, f, h, 460.0, m_fc2), _accumulate_grad([f, h], b_fc2),
            _node("GeluBackward0", (Op("aten::gelu_backward", 10.0, launch=_ew(_GELU_BWD, 130.0),
                                       inputs=((s.act(f), BF16), (s.act(f), BF16), NONE)),), m_gelu),
            _mm_backward(s, h, f, 460.0, m_fc1), _accumulate_grad([h, f], b_fc1),
            _layer_norm_backward(s, m_ln2), _accumulate_grad([h]), _accumulate_grad([h]),
            _grad_add(s),
            _node("AddBackward0", (), m_add1),
            _mm_backward(s, h, h, 120.0, m_out), _accumulate_grad([h, h], b_attn),
            _flash_backward(s, m_attn),
            _node("SplitBackward0", (Op("aten::cat", 12.0, launch=_ew(_CAT, 60.0), inputs=(TENSORS, SCALAR)),),
                  None),
            _mm_backward(s, h, 3 * h, 345.0, m_qkv), _accumulate_grad([3 * h, h]),
            _layer_norm_backward(s, m_ln1), _accumulate_grad([h]), _accumulate_grad([h], b_qkv),
            _grad_add(s),
        ]
        params = sum(b.nelems for b in buckets)
        return forward, backward, buckets, params

    def loss(self) -> tuple[Op, list[Op]]:
        s, classes = self.s, self.s.hidden
        logits = [s.tokens, classes]
        m_lsm, m_nll = self.alloc(classes), self.alloc_bytes(4)
        labels = ([s.tokens], "long int")
        inner_log_softmax = Op("aten::_log_softmax", 9.0, launch=_ew(_LOG_SOFTMAX, 30.0), mem=m_lsm,
                               inputs=((logits, BF16), SCALAR, SCALAR))
        log_softmax = Op("aten::log_softmax", 5.0, (inner_log_softmax,), inputs=((logits, BF16), SCALAR, NONE),
                         seq=SEQ_FWD)
        nll_forward = Op("aten::nll_loss_forward", 10.0, launch=_ew(_NLL_FWD, 8.0), mem=m_nll)
        nll = Op("aten::nll_loss_nd", 5.0, (Op("aten::nll_loss", 4.0, (nll_forward,)),),
                 inputs=((logits, BF16), labels, NONE, SCALAR, SCALAR), seq=SEQ_FWD)
        loss = Op("aten::cross_entropy_loss", 6.0, (log_softmax, nll),
                  inputs=((logits, BF16), labels, NONE, SCALAR, SCALAR, SCALAR))
        nll_backward = Op("aten::nll_loss_backward", 8.0, (Op("aten::zero_", 4.0, launch=_ew(_FILL, 25.0)),),
                          launch=_ew(_NLL_BWD, 12.0))
        log_softmax_backward = Op("aten::_log_softmax_backward_data", 9.0, launch=_ew(_LOG_SOFTMAX_BWD, 45.0))
        backward = [_node("NllLossBackward0", (nll_backward,), m_nll),
                    _node("LogSoftmaxBackward0", (log_softmax_backward,), m_lsm)]
        return loss, backward


def _node(name: str, children: tuple, freed: tuple[int, int] | None) -> Op:
    """An autograd node as the engine records it; `freed` is the saved activation it releases."""
    inner = Op(name, 5.0, children, seq=SEQ_BWD_INNER)
    mem = (-freed[0], freed[1]) if freed else None
    return Op(f"autograd::engine::evaluate_function: {name}", 4.0, (inner,), seq=SEQ_BWD, mem=mem)


def _mm_backward(s: _Shape, fin: int, fout: int, gemm_us: float, freed: tuple[int, int]) -> Op:
    w, grad = [fout, fin], [s.tokens, fout]
    children = (Op("aten::t", 2.5, (_transpose(w),)),
                Op("aten::mm", 10.0, launch=_gemm(_GEMM_NN, gemm_us), inputs=((grad, BF16), (w, BF16))),
                Op("aten::t", 2.5, (_transpose(grad),)),
                Op("aten::mm", 10.0, launch=_gemm(_GEMM_NT, gemm_us),
                   inputs=(([fout, s.tokens], BF16), ([s.tokens, fin], BF16))),
                Op("aten::t", 2.5, (_transpose(w),)))
    return _node("MmBackward0", children, freed)


def _accumulate_grad(param_dims: list, bucket: AllReduce | None = None) -> Op:
    """AccumulateGrad + DDP's reducer hook: scale the gradient by 1/world, and launch the
    bucket's all-reduce when this was the bucket's last gradient."""
    scale_kernel_us = max(2.0, math.prod(param_dims) * 4 / 2.4e6)   # read+write bf16 at ~2.4 TB/s
    mul_out = Op("torch::distributed::reducer::mul_out", 6.0,
                 (Op("aten::mul", 9.0, launch=_ew(_MUL_SCALAR, scale_kernel_us), inputs=((param_dims, BF16), SCALAR)),))
    accumulate = Op("torch::autograd::AccumulateGrad", 5.0, (Op("aten::detach", 3.0, (Op("detach", 1.5),)),))
    children = (accumulate, mul_out) if bucket is None else (accumulate, mul_out, bucket)
    return Op(_ACCUMULATE_GRAD_NODE, 4.0, children)


_ACCUMULATE_GRAD_NODE = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


def _layer_norm_backward(s: _Shape, freed: tuple[int, int]) -> Op:
    h, x = s.hidden, s.act(s.hidden)
    native = Op("aten::native_layer_norm_backward", 14.0,
                (Op("aten::empty_like", 3.0, launch=_ew(_LN_BWD_INPUT, 45.0)),),
                launch=Kernel(_LN_BWD_GAMMA, 25.0, grid=(64, 1, 1), block=(32, 32, 1), registers=40, shared_mem=8_448),
                inputs=((x, BF16), (x, BF16), ([h], ""), ([s.batch, s.seq, 1], "float"), ([s.batch, s.seq, 1], "float"),
                        ([h], BF16), ([h], BF16), NONE))
    return _node("NativeLayerNormBackward0", (native,), freed)


def _grad_add(s: _Shape) -> Op:
    """The engine summing the two gradients that meet at a residual connection."""
    x = s.act(s.hidden)
    return Op("aten::add", 8.0, launch=_ew(_ADD, 40.0), inputs=((x, BF16), (x, BF16), SCALAR))


def _flash_backward(s: _Shape, freed: tuple[int, int]) -> Op:
    bhsd = [s.batch, s.heads, s.seq, s.hidden // s.heads]
    big = dict(grid=(16, 64, 1), block=(256, 1, 1), registers=255, shared_mem=98_304, sigma=0.02)
    flash = Op("aten::_flash_attention_backward", 16.0,
               (Op("aten::empty_like", 3.0), Op("aten::empty", 2.0),
                Op("aten::zero_", 3.0, launch=_ew(_FILL, 12.0)),
                Op("aten::_launch_dot_do_o", 0.5, launch=Kernel(_FLASH_BWD_DOT, 20.0, grid=(16, 64, 1))),
                Op("aten::_launch_dq_dk_dv", 0.5, launch=Kernel(_FLASH_BWD, 380.0, **big))),
               launch=Kernel(_FLASH_BWD_DQ, 25.0, grid=(16, 64, 1)), inputs=((bhsd, BF16),) * 6)
    inner = Op("aten::_scaled_dot_product_flash_attention_backward", 8.0, (flash,), inputs=((bhsd, BF16),) * 6)
    return _node("ScaledDotProductFlashAttentionBackward0", (inner,), freed)


def _inputs_copy(s: _Shape) -> Op:
    """Token ids (or labels) to the GPU from pinned memory: DataLoader(pin_memory=True), non_blocking."""
    return _host_to_device([s.batch, s.seq], "long int", Memcpy("Memcpy HtoD (Pinned -> Device)", s.tokens * 8, 22.0))


def _host_to_device(dims: list, dtype: str, copy: Memcpy) -> Op:
    """tensor.to("cuda") as the profiler records it: aten::to > aten::_to_copy > aten::copy_ > memcpy."""
    copy_op = Op("aten::copy_", 9.0, launch=copy, inputs=((dims, dtype), (dims, dtype), SCALAR))
    to_copy = Op("aten::_to_copy", 6.0, (Op("aten::empty_strided", 3.0), copy_op), inputs=((dims, dtype),) + (NONE,) * 6)
    return Op("aten::to", 4.0, (to_copy,), inputs=((dims, dtype),) + (NONE,) * 5)


def _optimizer_ops(params: int, tensors: int) -> tuple[Op, ...]:
    """clip_grad_norm_ (foreach) and a fused AdamW step over fp32 master weights."""
    adamw_us = params * 20 / 3.0e6          # ~20 bytes moved per parameter at ~3 TB/s
    adamw_launches = 3
    norm = Op("aten::_foreach_norm", 14.0, (Op("aten::empty", 2.0, launch=_ew(_FOREACH_NORM, 60.0)),),
              launch=_ew(_FOREACH_NORM_CLEANUP, 4.0), inputs=(TENSORS, SCALAR, NONE))
    total = Op("aten::linalg_vector_norm", 9.0, launch=_ew(_REDUCE_NORM, 5.0), inputs=(([tensors], "float"), SCALAR))
    clamp = Op("aten::clamp", 8.0, launch=_ew(_CLAMP, 2.5), inputs=(([], "float"), NONE, SCALAR))
    scale = Op("aten::_foreach_mul_", 12.0, launch=_ew(_FOREACH_MUL, 90.0), inputs=(TENSORS, ([], "float")))
    adamw = Op("aten::_fused_adamw_", 25.0,
               tuple(Op("aten::empty", 1.5, launch=_ew(_FUSED_ADAMW, adamw_us / adamw_launches))
                     for _ in range(adamw_launches)),
               inputs=(TENSORS,) * 6 + (SCALAR,) * 5)
    return (norm, Op("aten::stack", 10.0, (Op("aten::cat", 6.0, launch=_ew(_CAT, 3.0)),), inputs=(TENSORS, SCALAR)),
            total, clamp, scale, adamw)


def build_program(layers: int = DEFAULT_LAYERS) -> Program:
    """The step every rank runs: `layers` transformer blocks, DDP, clip + fused AdamW, loss.item()."""
    shape = _Shape()
    model = _ModelBuilder(shape)
    forward: list[Op] = []
    block_backward: list[list[Op]] = []
    buckets: list[AllReduce] = []
    params = 0
    for layer in range(layers):
        fwd, bwd, block_buckets, block_params = model.block(first_bucket=BUCKETS_PER_BLOCK * (layers - 1 - layer))
        forward += fwd
        block_backward.append(bwd)
        buckets += block_buckets
        params += block_params
    loss, loss_backward = model.loss()
    backward = loss_backward + [node for bwd in reversed(block_backward) for node in bwd]
    seed = Op("aten::ones_like", 4.0, (Op("aten::empty_like", 3.0), Op("aten::fill_", 6.0, launch=_ew(_FILL, 2.0))),
              inputs=(([], BF16), NONE, NONE, NONE, NONE, NONE))
    sync = Op("aten::item", 4.0, (Op("aten::_local_scalar_dense", 6.0,
                                     launch=Memcpy("Memcpy DtoH (Device -> Pageable)", 2, 5.0, blocking=True)),),
              inputs=(([], BF16),))
    return Program(layers=layers, inputs=(_inputs_copy(shape), _inputs_copy(shape)), forward=tuple(forward),
                   loss=(loss,), backward_seed=seed, backward=tuple(backward),
                   buckets=tuple(sorted(buckets, key=lambda b: b.bucket)),
                   optimizer=_optimizer_ops(params, tensors=layers * PARAM_TENSORS_PER_BLOCK), sync=sync,
                   static_bytes=params * (2 + 2 + 12))   # bf16 weights and grads; fp32 master, exp_avg, exp_avg_sq


# ---- Per-rank program changes (injections that change what a rank runs)

def _map_ops(op: Op | AllReduce, change, skip: str | None = None) -> Op | AllReduce:
    """The op tree with `change(op) -> Op` applied to every op, children first; subtrees of ops
    named `skip` are kept as they are."""
    if type(op) is AllReduce or op.name == skip:
        return op
    children = tuple(_map_ops(child, change, skip) for child in op.children)
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


#: FP32 cuBLAS kernels for the bf16 GEMMs: on H100 cuBLAS runs FP32 SGEMM (TF32 off, PyTorch's
#: default for matmul) with its sm80 SIMT kernels; names as they appear in real H100 profiles.
_FP32_GEMM_NAMES = {
    _GEMM_TN: "ampere_sgemm_128x64_tn",
    _GEMM_NN: "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
              "(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)",
    _GEMM_NT: "ampere_sgemm_128x64_nt",
}


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
_PROGRAM_CHANGES = {"pageable_memcpy": _pageable_memcpy, "uneven_shards": _uneven_shards,
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


def _round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule


# --------------------------------------------------------------------------------------------
# Event sinks: what a rank's simulation writes
# --------------------------------------------------------------------------------------------

class _NullSink:
    """Timing pass: the simulation runs, nothing is recorded."""

    def begin(self, op, tid, ts, ext, seq, extra=None):
        return None

    def end(self, handle, ts):
        pass

    def annotation(self, name, tid, ts, ext):
        return None

    def runtime(self, name, cbid, tid, ts, dur, ext, corr):
        pass

    def kernel(self, name, ts, dur, stream, ext, corr, static_args, extra=None):
        pass

    def memcpy(self, copy, ts, dur, ext, corr):
        pass

    def flow(self, corr, tid, runtime_ts, stream, device_ts):
        pass

    def fwdbwd(self, fwd_tid, fwd_ts, bwd_tid, bwd_ts):
        pass

    def memory(self, tid, ts, nbytes, allocated, reserved, addr):
        pass


class _EventSink:
    """Collects one rank's events as Kineto dicts. Takes job-timeline ns, writes ts/dur in µs on
    the rank's own clock (job time + origin_ns)."""

    def __init__(self, pid: int, device: int, origin_ns: int):
        self.pid, self.device, self.origin_ns = pid, device, origin_ns
        self.cpu: list[dict] = []        # cpu_op, user_annotation, fwdbwd flows
        self.mem: list[dict] = []        # [memory] instant events
        self.device_events: list[dict] = []   # cuda_runtime and GPU activities
        self.flows: list[dict] = []      # ac2g
        self._flow_id = 0

    def us(self, ns: int) -> float:
        return (ns + self.origin_ns) / 1000

    def begin(self, op: Op, tid: int, ts: int, ext: int, seq: int | None,
              extra: dict | None = None) -> tuple[dict, int]:
        args = {"External id": ext}
        if seq is not None:
            args["Sequence number"] = seq
            args["Fwd thread id"] = 0 if op.seq == SEQ_FWD else 1
        args["Record function id"] = 0
        if extra:
            args.update(extra)
        args.update(op.shape_args)
        event = {"ph": "X", "cat": "cpu_op", "name": op.name, "pid": self.pid, "tid": tid,
                 "ts": (ts + self.origin_ns) / 1000, "dur": 0.0, "args": args}
        self.cpu.append(event)
        return event, ts

    def end(self, handle: tuple[dict, int], ts: int) -> None:
        event, start = handle
        event["dur"] = (ts - start) / 1000

    def annotation(self, name: str, tid: int, ts: int, ext: int) -> tuple[dict, int]:
        event = {"ph": "X", "cat": "user_annotation", "name": name, "pid": self.pid, "tid": tid,
                 "ts": (ts + self.origin_ns) / 1000, "dur": 0.0, "args": {"External id": ext, "Record function id": 0}}
        self.cpu.append(event)
        return event, ts

    def runtime(self, name: str, cbid: int, tid: int, ts: int, dur: int, ext: int, corr: int) -> None:
        self.device_events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": self.pid, "tid": tid,
                                   "ts": (ts + self.origin_ns) / 1000, "dur": dur / 1000,
                                   "args": {"External id": ext, "cbid": cbid, "correlation": corr}})

    def kernel(self, name: str, ts: int, dur: int, stream: int, ext: int, corr: int, static_args: dict,
               extra: dict | None = None) -> None:
        args = {"External id": ext, "queued": 0, "device": self.device, "context": 1, "stream": stream,
                "correlation": corr, **static_args}
        if extra:
            args.update(extra)
        self.device_events.append({"ph": "X", "cat": "kernel", "name": name, "pid": self.device, "tid": stream,
                                   "ts": (ts + self.origin_ns) / 1000, "dur": dur / 1000, "args": args})

    def memcpy(self, copy: Memcpy, ts: int, dur: int, ext: int, corr: int) -> None:
        self.device_events.append({"ph": "X", "cat": "gpu_memcpy", "name": copy.name, "pid": self.device,
                                   "tid": COMPUTE_STREAM, "ts": (ts + self.origin_ns) / 1000, "dur": dur / 1000,
                                   "args": {"External id": ext, "device": self.device, "context": 1,
                                            "stream": COMPUTE_STREAM, "correlation": corr, "bytes": copy.nbytes,
                                            "memory bandwidth (GB/s)": copy.nbytes / dur}})

    def flow(self, corr: int, tid: int, runtime_ts: int, stream: int, device_ts: int) -> None:
        self.flows.append({"ph": "f", "id": corr, "pid": self.device, "tid": stream,
                           "ts": (device_ts + self.origin_ns) / 1000, "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self.flows.append({"ph": "s", "id": corr, "pid": self.pid, "tid": tid,
                           "ts": (runtime_ts + self.origin_ns) / 1000, "cat": "ac2g", "name": "ac2g"})

    def fwdbwd(self, fwd_tid: int, fwd_ts: int, bwd_tid: int, bwd_ts: int) -> None:
        self._flow_id += 1
        self.cpu.append({"ph": "s", "id": self._flow_id, "pid": self.pid, "tid": fwd_tid,
                         "ts": (fwd_ts + self.origin_ns) / 1000, "cat": "fwdbwd", "name": "fwdbwd"})
        self.cpu.append({"ph": "f", "id": self._flow_id, "pid": self.pid, "tid": bwd_tid,
                         "ts": (bwd_ts + self.origin_ns) / 1000, "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"})

    def memory(self, tid: int, ts: int, nbytes: int, allocated: int, reserved: int, addr: int) -> None:
        self.mem.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": self.pid,
                         "tid": tid, "ts": (ts + self.origin_ns) / 1000,
                         "args": {"Total Reserved": reserved, "Total Allocated": allocated, "Bytes": nbytes,
                                  "Device Id": self.device, "Device Type": 1, "Addr": addr, "finished": False}})


_NULL_SINK = _NullSink()


# --------------------------------------------------------------------------------------------
# One rank's simulation
# --------------------------------------------------------------------------------------------

class _Noise:
    """Draws from a seeded Generator, fetched in blocks (fast scalar access): standard normals,
    and ready-made lognormal factors for host durations (the hot path)."""
    BLOCK = 1024

    def __init__(self, rng: np.random.Generator):
        self._rng = rng
        self._normal: list[float] = []
        self._cpu: list[float] = []

    def z(self) -> float:
        if not self._normal:
            self._normal = self._rng.standard_normal(self.BLOCK).tolist()[::-1]
        return self._normal.pop()

    def factor(self, sigma: float) -> float:
        return math.exp(sigma * self.z())

    def cpu(self) -> float:
        if not self._cpu:
            self._cpu = np.exp(CPU_OP_SIGMA * self._rng.standard_normal(self.BLOCK)).tolist()
        return self._cpu.pop()


@dataclass
class _PendingComm:
    op: AllReduce
    seq: int
    ext: int
    corr: int
    launch_tid: int
    launch_ts: int
    ready_ns: int            # earliest start on this rank: launched and its gradients computed


def _rank_pid(rank: int) -> int:
    return 2_910_249 + 7_919 * rank


class _RankSim:
    """One rank's main thread, autograd thread and two GPU streams on the job timeline."""

    def __init__(self, rank: int, world: int, program: Program, faults: _RankFaults, overlap_comm: bool,
                 seed: int, sink: _NullSink | _EventSink):
        self.world, self.program, self.faults = world, program, faults
        self.overlap_comm = overlap_comm
        self._backward_nodes = program.backward if overlap_comm else tuple(map(_without_all_reduce, program.backward))
        self.sink = sink
        self.device = rank % GPUS_PER_NODE
        self.pid = _rank_pid(rank)
        self.main_tid, self.autograd_tid = self.pid, self.pid + 9_503
        self._noise = _Noise(np.random.default_rng([seed, rank]))
        self._cpu_ns_per_us = 1000 * self._noise.factor(RANK_CPU_SPEED_SIGMA)
        self._gpu_speed = self._noise.factor(RANK_GPU_SPEED_SIGMA)
        self._compute_scale = 1.0 + faults.gpu_compute_delay_ns / (program.compute_us_per_step * 1000)
        self._stream_free = {COMPUTE_STREAM: 0, COMM_STREAM: 0}
        self._ext = self._corr = 0
        self._seq_nr = 40_000 + 1_000 * FIRST_STEP
        self._collective_seq = len(program.buckets) * FIRST_STEP
        self._fwd_seqs: list[tuple[int, int, int]] = []     # (seq, tid, ts) of forward ops awaiting backward
        self._bwd_seq: tuple[int, int, int] = (0, 0, 0)
        self._allocated = program.static_bytes
        self._reserved = _round_up(self._allocated, RESERVE_GRANULE_BYTES)
        self._pending: list[_PendingComm] = []
        self._step_handle = None
        self._step_start = 0
        self.t_main = int(STEP_START_JITTER_US * 1000 * (0.5 + 0.5 * math.tanh(self._noise.z())))
        self.step_spans: list[tuple[int, int]] = []
        self.profile_start = self.t_main - 350_000
        self.last_activity = 0

    # ---- time helpers

    def _cpu_ns(self, us: float) -> int:
        return max(1, int(us * self._cpu_ns_per_us * self._noise.cpu()))

    def _kernel_ns(self, kernel: Kernel) -> int:
        speed = self._gpu_speed * self._compute_scale * self._noise.factor(kernel.sigma)
        return max(1_000, int(kernel.dur_us * 1000 * speed))

    def _next_ext(self) -> int:
        self._ext += 1
        return self._ext

    def _next_corr(self) -> int:
        self._corr += 1
        return self._corr

    # ---- ops

    def _run(self, item: Op | AllReduce, tid: int, t: int) -> int:
        """Run an op tree starting at t on thread tid; return when it ends."""
        if type(item) is AllReduce:
            return self._all_reduce(item, tid, t)
        op, ext = item, self._next_ext()
        handle = self.sink.begin(op, tid, t, ext, self._sequence_number(op, tid, t) if op.seq else None)
        half_self_ns = self._cpu_ns(op.self_us * 0.5)        # one draw: before and after the children
        t += half_self_ns
        if op.mem:
            self._memory(tid, t, *op.mem)
        for child in op.children:
            t = self._run(child, tid, t)
        launch = op.launch
        if launch is not None:
            run = self._launch if type(launch) is Kernel else self._memcpy
            t = run(launch, tid, t, ext)
            for _ in range(op.launches - 1):
                t = run(launch, tid, t + self._cpu_ns(LAUNCH_LOOP_US), ext)
        t += half_self_ns
        self.sink.end(handle, t)
        return t

    def _sequence_number(self, op: Op, tid: int, t: int) -> int | None:
        if op.seq == SEQ_FWD:
            self._seq_nr += 1
            self._fwd_seqs.append((self._seq_nr, tid, t))
            return self._seq_nr
        if op.seq == SEQ_BWD:
            self._bwd_seq = self._fwd_seqs.pop()
            return self._bwd_seq[0]
        if op.seq == SEQ_BWD_INNER:
            seq, fwd_tid, fwd_ts = self._bwd_seq
            self.sink.fwdbwd(fwd_tid, fwd_ts, tid, t)
            return seq
        return None

    def _launch(self, kernel: Kernel, tid: int, t: int, ext: int) -> int:
        corr, call_ns = self._next_corr(), self._cpu_ns(LAUNCH_CALL_US)
        start = max(t + KERNEL_LAUNCH_LATENCY_NS, self._stream_free[COMPUTE_STREAM])
        dur = self._kernel_ns(kernel)
        self._stream_free[COMPUTE_STREAM] = start + dur
        self.sink.runtime("cudaLaunchKernel", 211, tid, t, call_ns, ext, corr)
        self.sink.kernel(kernel.name, start, dur, COMPUTE_STREAM, ext, corr, kernel.static_args)
        self.sink.flow(corr, tid, t, COMPUTE_STREAM, start)
        return t + call_ns

    def _memcpy(self, copy: Memcpy, tid: int, t: int, ext: int) -> int:
        corr = self._next_corr()
        start = max(t + KERNEL_LAUNCH_LATENCY_NS, self._stream_free[COMPUTE_STREAM])
        dur = max(1_000, int((1_200 + copy.nbytes / copy.bandwidth_gbps) * self._noise.factor(0.05)))
        self._stream_free[COMPUTE_STREAM] = start + dur
        call_ns = start + dur + 3_000 - t if copy.blocking else self._cpu_ns(8.0)
        self.sink.runtime("cudaMemcpyAsync", 41, tid, t, call_ns, ext, corr)
        self.sink.memcpy(copy, start, dur, ext, corr)
        self.sink.flow(corr, tid, t, COMPUTE_STREAM, start)
        t += call_ns
        if copy.blocking:
            t = self._runtime_call("cudaStreamSynchronize", 131, tid, t, ext, 2.0)
        return t

    def _runtime_call(self, name: str, cbid: int, tid: int, t: int, ext: int, us: float) -> int:
        dur = self._cpu_ns(us)
        self.sink.runtime(name, cbid, tid, t, dur, ext, self._next_corr())
        return t + dur

    def _memory(self, tid: int, t: int, nbytes: int, addr_offset: int) -> None:
        self._allocated += nbytes
        self._reserved = max(self._reserved, _round_up(self._allocated, RESERVE_GRANULE_BYTES))
        self.sink.memory(tid, t, nbytes, self._allocated, self._reserved, DEVICE_MEM_BASE_ADDR + addr_offset)

    def _all_reduce(self, op: AllReduce, tid: int, t: int) -> int:
        """c10d::allreduce_ > record_param_comms > nccl:all_reduce > cudaLaunchKernelExC, as DDP records it.
        The NCCL kernel is written once the collective is resolved across ranks (finish_step)."""
        self._collective_seq += 1
        outer = self.sink.begin(_C10D_ALLREDUCE, tid, t, self._next_ext(), None)
        t += self._cpu_ns(_C10D_ALLREDUCE.self_us / 2)
        ext = self._next_ext()
        record = self.sink.begin(_RECORD_PARAM_COMMS, tid, t, ext, None,
                                 extra=self._collective_args(op, self._collective_seq))
        t += self._cpu_ns(_RECORD_PARAM_COMMS.self_us / 2)
        t = self._runtime_call("cudaEventRecord", 135, tid, t, ext, 2.0)
        t = self._runtime_call("cudaStreamWaitEvent", 147, tid, t, ext, 1.8)
        annotation = self.sink.annotation("nccl:all_reduce", tid, t, self._next_ext())
        t += self._cpu_ns(12.0)
        corr, call_ns = self._next_corr(), self._cpu_ns(12.0)
        ready = max(t + KERNEL_LAUNCH_LATENCY_NS, self._stream_free[COMPUTE_STREAM])
        self.sink.runtime("cudaLaunchKernelExC", 430, tid, t, call_ns, ext, corr)
        self._pending.append(_PendingComm(op, self._collective_seq, ext, corr, tid, t, ready))
        t += call_ns + self._cpu_ns(8.0)
        self.sink.end(annotation, t)
        t = self._runtime_call("cudaEventRecord", 135, tid, t, ext, 1.0)
        t += self._cpu_ns(_RECORD_PARAM_COMMS.self_us / 2)
        self.sink.end(record, t)
        t += self._cpu_ns(_C10D_ALLREDUCE.self_us / 2)
        self.sink.end(outer, t)
        return t

    def _collective_args(self, op: AllReduce, seq: int) -> dict:
        return {"Collective name": "allreduce", "In msg nelems": op.nelems, "Out msg nelems": op.nelems,
                "Group size": self.world, "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]",
                "Process Group Name": "0", "Process Group Description": "default_pg",
                "Process Group Ranks": _ranks_string(self.world), "Seq": seq}

    # ---- a step, in two halves around the cross-rank collectives

    def run_until_collectives(self, step_index: int) -> list[int]:
        """Host work of a step up to the end of backward; returns each all-reduce's ready time (ns)."""
        self._pending = []
        t = self._step_start = self.t_main
        step_name = f"ProfilerStep#{FIRST_STEP + step_index}"
        self._step_handle = self.sink.annotation(step_name, self.main_tid, t, self._next_ext())
        t += self._cpu_ns(20.0)
        t = self._timed_annotation("Optimizer.zero_grad#AdamW.zero_grad", t, self._cpu_ns(45.0))
        t += self._cpu_ns(15.0)
        loader_ns = self._cpu_ns(DATALOADER_US) + self.faults.dataloader_delay_ns
        t = self._timed_annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t, loader_ns)
        for op in self.program.inputs:
            t = self._run(op, self.main_tid, t + self._cpu_ns(PYTHON_GAP_US))
        t = self._forward(t)
        t += self.faults.host_idle_ns                      # busy outside any profiled op
        t = self._run(self.program.backward_seed, self.main_tid, t + self._cpu_ns(PYTHON_GAP_US))
        t = self._backward(t + self._cpu_ns(25.0)) + self._cpu_ns(20.0)
        if not self.overlap_comm:
            for bucket in self.program.buckets:
                t = self._all_reduce(bucket, self.main_tid, t + self._cpu_ns(PYTHON_GAP_US))
            t = self._wait_for_collectives(self.main_tid, t)
        self.t_main = t
        return [p.ready_ns for p in self._pending]

    def finish_step(self, spans_ns: list[tuple[int, int]]) -> None:
        """Write the step's NCCL kernels (start, end given by the network), then optimizer and sync."""
        for pending, (start, end) in zip(self._pending, spans_ns):
            self._write_nccl_kernel(pending, start, end)
            self._stream_free[COMPUTE_STREAM] = max(self._stream_free[COMPUTE_STREAM], end)
            self._stream_free[COMM_STREAM] = end
        t = self.t_main + self._cpu_ns(PYTHON_GAP_US)
        optimizer = self.sink.annotation("Optimizer.step#AdamW.step", self.main_tid, t, self._next_ext())
        t += self._cpu_ns(30.0)
        for op in self.program.optimizer:
            t = self._run(op, self.main_tid, t) + self._cpu_ns(OPTIMIZER_GAP_US)
        self.sink.end(optimizer, t)
        t = self._run(self.program.sync, self.main_tid, t + self._cpu_ns(PYTHON_GAP_US))
        t += self._cpu_ns(30.0)
        self.sink.end(self._step_handle, t)
        self.step_spans.append((self._step_start, t))
        self.last_activity = max(t, self._stream_free[COMPUTE_STREAM])
        self.t_main = t + self._cpu_ns(12.0)

    def _timed_annotation(self, name: str, t: int, dur: int) -> int:
        handle = self.sink.annotation(name, self.main_tid, t, self._next_ext())
        self.sink.end(handle, t + dur)
        return t + dur

    def _forward(self, t: int) -> int:
        t += self._cpu_ns(PYTHON_GAP_US)
        ddp = self.sink.annotation("DistributedDataParallel.forward", self.main_tid, t, self._next_ext())
        t += self._cpu_ns(40.0)
        for op in self.program.forward:
            t = self._run(op, self.main_tid, t) + self._cpu_ns(PYTHON_GAP_US)
        self.sink.end(ddp, t)
        for op in self.program.loss:
            t = self._run(op, self.main_tid, t + self._cpu_ns(PYTHON_GAP_US))
        return t

    def _backward(self, t: int) -> int:
        """The autograd thread runs the backward nodes; DDP's all-reduces launch from inside them
        (overlap) or are left for the main thread after backward (no_overlap). Returns its end."""
        tid = self.autograd_tid
        for node in self._backward_nodes:
            t = self._run(node, tid, t) + self._cpu_ns(AUTOGRAD_GAP_US)
        return self._wait_for_collectives(tid, t) if self.overlap_comm else t

    def _wait_for_collectives(self, tid: int, t: int) -> int:
        """work.wait() per bucket: the compute stream waits on the NCCL stream (no host block)."""
        for pending in self._pending:
            t = self._runtime_call("cudaStreamWaitEvent", 147, tid, t, pending.ext, 1.5)
        return t

    def _write_nccl_kernel(self, pending: _PendingComm, start: int, end: int) -> None:
        op = pending.op
        self.sink.kernel(op.kernel_name, start, end - start, COMM_STREAM, pending.ext, pending.corr, _NCCL_STATIC_ARGS,
                         extra=self._collective_args(op, pending.seq))
        self.sink.flow(pending.corr, pending.launch_tid, pending.launch_ts, COMM_STREAM, start)


_C10D_ALLREDUCE = Op("c10d::allreduce_", 50.0, inputs=(TENSORS, ([], "__torch__.torch.classes.c10d.ProcessGroup"),
                                                        ([], "__torch__.torch.classes.c10d.ReduceOp"), NONE, SCALAR))
_RECORD_PARAM_COMMS = Op("record_param_comms", 66.0)
_NCCL_STATIC_ARGS = Kernel("nccl", 0.0, grid=(24, 1, 1), block=(640, 1, 1), registers=96,
                           shared_mem=103_808).static_args


def _without_all_reduce(op: Op) -> Op:
    if not any(isinstance(c, AllReduce) for c in op.children):
        return op
    return replace(op, children=tuple(c for c in op.children if not isinstance(c, AllReduce)))


_RANKS_STRINGS: dict[int, str] = {}


def _ranks_string(world: int) -> str:
    if world not in _RANKS_STRINGS:
        _RANKS_STRINGS[world] = str(list(range(world)))
    return _RANKS_STRINGS[world]


# --------------------------------------------------------------------------------------------
# The job: collectives across ranks, the two passes, files and ground truth
# --------------------------------------------------------------------------------------------

class _Network:
    """Resolves each all-reduce across ranks: it ends everywhere at max(ready) + transfer time."""

    def __init__(self, world: int, seed: int, buckets: tuple[AllReduce, ...]):
        self._rng = np.random.default_rng([seed, 1 << 32])       # a stream no rank uses
        latency_us = NCCL_BASE_LATENCY_US + NCCL_HOP_LATENCY_US * math.log2(max(world, 2))
        bus_factor = 2 * (world - 1) / world                      # ring all-reduce: busbw = algbw * 2(n-1)/n
        self._transfer_ns = np.array([latency_us * 1000 + b.nbytes * bus_factor / BUS_BANDWIDTH_GBPS for b in buckets])

    def resolve(self, ready_ns: np.ndarray) -> np.ndarray:
        """ready_ns: (ranks, collectives) earliest starts. Returns (ranks, collectives, 2): start, end."""
        world, count = ready_ns.shape
        transfer = (self._transfer_ns * np.exp(TRANSFER_SIGMA * self._rng.standard_normal(count))).astype(np.int64)
        jitter = self._rng.integers(0, COLLECTIVE_END_JITTER_NS, size=(world, count))
        spans = np.empty((world, count, 2), dtype=np.int64)
        stream_free = np.zeros(world, dtype=np.int64)
        for c in range(count):
            start = np.maximum(ready_ns[:, c], stream_free)
            stream_free = start.max() + transfer[c] + jitter[:, c]
            spans[:, c, 0], spans[:, c, 1] = start, stream_free
        return spans


@dataclass(frozen=True)
class _Timeline:
    comm_spans: np.ndarray                    # (steps, ranks, collectives, 2) ns
    step_spans: list[list[tuple[int, int]]]   # per rank, per step: (start, end) ns


def _simulate_timing(program: Program, world: int, steps: int, seed: int, faults: _JobFaults) -> _Timeline:
    """All ranks in lock step, no events: where every collective starts and ends on every rank."""
    programs = _rank_programs(program, faults)
    sims = [_RankSim(r, world, programs[r], faults.ranks[r], faults.overlap_comm, seed, _NULL_SINK) for r in range(world)]
    network = _Network(world, seed, program.buckets)
    comm_spans = np.empty((steps, world, len(program.buckets), 2), dtype=np.int64)
    for step in range(steps):
        ready = np.array([sim.run_until_collectives(step) for sim in sims], dtype=np.int64)
        comm_spans[step] = network.resolve(ready)
        for sim, spans in zip(sims, comm_spans[step].tolist()):
            sim.finish_step(spans)
    return _Timeline(comm_spans, [sim.step_spans for sim in sims])


def _simulate_rank(rank: int, world: int, program: Program, faults: _JobFaults, seed: int,
                   timeline: _Timeline) -> tuple[_RankSim, _EventSink]:
    """Replay one rank with events; its collectives take their times from the timing pass."""
    sink = _EventSink(_rank_pid(rank), rank % GPUS_PER_NODE, TRACE_ORIGIN_NS + faults.ranks[rank].clock_offset_ns)
    sim = _RankSim(rank, world, program, faults.ranks[rank], faults.overlap_comm, seed, sink)
    for step in range(len(timeline.comm_spans)):
        sim.run_until_collectives(step)
        sim.finish_step(timeline.comm_spans[step, rank].tolist())
    return sim, sink


def _trace_events(sim: _RankSim, sink: _EventSink) -> list[dict]:
    """The rank's events in Kineto's file order: metadata, host ops (by start), [memory] events,
    runtime calls and GPU activities, flows, the profiler's own span and instants."""
    by_ts = itemgetter("ts")
    cpu, mem, device = sorted(sink.cpu, key=by_ts), sorted(sink.mem, key=by_ts), sorted(sink.device_events, key=by_ts)
    index = 0
    for event in cpu:
        if event["ph"] == "X":
            event["args"]["Ev Idx"] = index
            index += 1
    for event in mem:
        event["args"]["Ev Idx"] = index
        index += 1
    start, end = sink.us(sim.profile_start), sink.us(sim.last_activity + 200_000)
    return [*_metadata_events(sim, start), *cpu, *mem, *device, *sink.flows, *_profiler_span_events(start, end)]


def _metadata_events(sim: _RankSim, ts: float) -> list[dict]:
    pid, device = sim.pid, sim.device
    rows = [("process_name", pid, 0, {"name": "python"}), ("process_labels", pid, 0, {"labels": "CPU"}),
            ("process_sort_index", pid, 0, {"sort_index": pid}),
            ("process_name", device, 0, {"name": "python"}), ("process_labels", device, 0, {"labels": f"GPU {device}"}),
            ("process_sort_index", device, 0, {"sort_index": 16_777_216 + device})]
    for stream in (COMPUTE_STREAM, COMM_STREAM):
        rows += [("thread_name", device, stream, {"name": f"stream {stream} "}),
                 ("thread_sort_index", device, stream, {"sort_index": stream})]
    for tid, name in ((sim.main_tid, "pt_main_thread"), (sim.autograd_tid, f"pt_autograd_{device}")):
        rows += [("thread_name", pid, tid, {"name": f"thread {tid} ({name})"}),
                 ("thread_sort_index", pid, tid, {"sort_index": tid})]
    return [{"ph": "M", "name": name, "ts": ts, "pid": p, "tid": tid, "args": args} for name, p, tid, args in rows]


def _profiler_span_events(start: float, end: float) -> list[dict]:
    return [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
             "ts": start, "dur": round(end - start, 3), "args": {"Op count": 0}},
            {"ph": "M", "name": "process_sort_index", "ts": start, "pid": "Spans", "tid": 0,
             "args": {"sort_index": 536_870_912}},
            {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces",
             "tid": "Trace PyTorch Profiler", "ts": start},
            {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": end}]


_DEVICE_PROPERTIES = [
    {"id": i, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 84_929_347_584, "computeMajor": 9, "computeMinor": 0,
     "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
     "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233_472,
     "numSms": NUM_SMS, "sharedMemPerBlockOptin": 232_448}
    for i in range(GPUS_PER_NODE)]


def _trace_id(rank: int, world: int, seed: int) -> str:
    return hashlib.blake2b(f"{seed}:{world}:{rank}".encode(), digest_size=16).hexdigest().upper()


def _trace_header(rank: int, world: int, seed: int) -> dict:
    return {"schemaVersion": 1, "deviceProperties": _DEVICE_PROPERTIES, "trace_id": _trace_id(rank, world, seed),
            "profile_memory": 1, "record_shapes": 1,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 1,
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                               "pg_size": world, "ranks": list(range(world))}],
                                "nccl_version": "2.21.5"},
            "host_name": f"node{rank // GPUS_PER_NODE:03d}", "displayTimeUnit": "ms",
            "baseTimeNanoseconds": BASE_TIME_NS}


GZIP_LEVEL = 1     # ~9x smaller than the JSON here, at a fraction of level 6's cost
TRUNCATE_AT = 0.6  # a truncated file keeps this share of its events, then half of the next one


def _encode_trace(header: dict, events: list[dict], trace_name: str, truncate: bool) -> tuple[bytes, int]:
    """The file's JSON text, one event per line like Kineto. Returns (text, complete events in it)."""
    encode = msgspec.json.Encoder().encode
    fields = b"".join(b'  "%s": %s,\n' % (key.encode(), encode(value)) for key, value in header.items())
    head = b"{\n" + fields + b'  "traceEvents": [\n'
    if not truncate:
        tail = b'\n  ],\n  "traceName": ' + encode(trace_name) + b"\n}\n"
        return head + _event_lines(encode(events)) + tail, len(events)
    kept = int(len(events) * TRUNCATE_AT)
    cut_event = encode(events[kept])
    return head + _event_lines(encode(events[:kept])) + b",\n" + cut_event[: len(cut_event) // 2], kept


def _event_lines(encoded_list: bytes) -> bytes:
    """[{..},{..}] -> one event per line, without the brackets (every event starts with "ph")."""
    return encoded_list[1:-1].replace(b'},{"ph":', b'},\n{"ph":')


def _gzip_bytes(data: bytes, complete: bool) -> bytes:
    """gzip with mtime 0 (deterministic). Incomplete: flushed but never finished, as when the
    writer is killed: every byte of `data` can be recovered, but the stream has no end."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush(zlib.Z_FINISH if complete else zlib.Z_FULL_FLUSH)


_TRACE_FILE = re.compile(r"^rank\d+\.\d+\.pt\.trace\.json(\.gz)?$")


def generate_job(out_dir: str | Path, ranks: int = 8, steps: int = 6, seed: int = 0,
                 injections: list[Injection] | None = None, gzip: bool = True, scale: float = 1.0) -> dict:
    """Write one trace file per rank + ground_truth.json into out_dir; return the ground-truth dict.

    `scale` multiplies the model's layers (events per step; 12 gives ~50 MB ranks) for benchmarks.
    Trace files of an earlier job in out_dir (rank*.pt.trace.json[.gz]) are replaced.

    Ground truth (schema rankscope.ground_truth/1): seed, world_size, steps, injections (with
    defaults filled), model (layers, parameters, allreduce_nelems, bus_bandwidth_gbps) and
    expected: stragglers [{rank, cause, injection (its kind), delay_ms_per_step (injected; null but
    for the straggler kind), cost_ms_per_step (what the other ranks lost, per step)}], findings
    (DESIGN.md ids a correct analysis must emit), possible_findings (ids the same faults may cause
    downstream), comm_overlap, collectives_per_step, clock_offsets_ms {rank: ms}, truncated_ranks,
    and per_rank {rank: file, device, pid, step_time_ms, kernel_count, nccl_kernel_count,
    collective_count, memcpy_count, pageable_memcpy_count, events, clock_offset_ms, truncated}.
    Counts are of the events complete in the file."""
    if ranks < 1 or steps < 1 or scale <= 0:
        raise ValueError(f"need ranks >= 1, steps >= 1, scale > 0; got ranks={ranks}, steps={steps}, scale={scale}")
    injections = [_normalized(inj, ranks) for inj in injections or []]
    faults = _plan_faults(injections, ranks)
    with _gc_paused():
        return _generate(Path(out_dir), ranks, steps, seed, injections, faults, gzip, scale)


@contextmanager
def _gc_paused():
    """The generator makes ~10^5 dicts per rank and no cycles: cyclic GC passes are pure cost."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _generate(out: Path, ranks: int, steps: int, seed: int, injections: list[Injection], faults: _JobFaults,
              gzip: bool, scale: float) -> dict:
    program = build_program(max(1, round(DEFAULT_LAYERS * scale)))
    timeline = _simulate_timing(program, ranks, steps, seed, faults)
    healthy = [inj for inj in injections if not _makes_straggler(inj)]   # the counterfactual for straggler cost
    baseline = (_simulate_timing(program, ranks, steps, seed, _plan_faults(healthy, ranks))
                if len(healthy) < len(injections) else timeline)

    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if _TRACE_FILE.match(old.name):
            old.unlink()
    per_rank = {}
    programs = _rank_programs(program, faults)
    for rank in range(ranks):
        per_rank[str(rank)] = _write_rank(out, rank, ranks, programs[rank], faults, seed, timeline, gzip)
    truth = _ground_truth(seed, ranks, steps, injections, faults, program, timeline, baseline, per_rank)
    (out / GROUND_TRUTH_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(truth), indent=1) + b"\n")
    return truth


def _write_rank(out: Path, rank: int, world: int, program: Program, faults: _JobFaults, seed: int,
                timeline: _Timeline, gzip: bool) -> dict:
    sim, sink = _simulate_rank(rank, world, program, faults, seed, timeline)
    events = _trace_events(sim, sink)
    written_ns = BASE_TIME_NS + TRACE_ORIGIN_NS + faults.ranks[rank].clock_offset_ns + sim.last_activity + 250_000_000
    path = out / f"rank{rank}.{written_ns + 1_009 * rank}.pt.trace.json{'.gz' if gzip else ''}"
    truncated = faults.ranks[rank].truncated
    # Kineto names the temporary file it first writes: "/tmp/tmpz2k7xkjt.json" in a real trace.
    trace_name = f"/tmp/tmp{_trace_id(rank, world, seed)[:8].lower()}.json"
    text, kept = _encode_trace(_trace_header(rank, world, seed), events, trace_name, truncated)
    path.write_bytes(_gzip_bytes(text, complete=not truncated) if gzip else text)
    return _rank_truth(path, sim, events[:kept], faults.ranks[rank])


def _rank_truth(path: Path, sim: _RankSim, events: list[dict], faults: _RankFaults) -> dict:
    """True values for one rank, counted from the events that are complete in its file."""
    kernels = nccl_kernels = collectives = memcpys = pageable = 0
    for event in events:
        cat = event.get("cat")
        if cat == "kernel":
            kernels += 1
            nccl_kernels += event["name"].startswith("ncclDevKernel_")
        elif cat == "gpu_memcpy":
            memcpys += 1
            pageable += "Pageable" in event["name"]
        elif cat == "cpu_op" and event["name"] == "record_param_comms":
            collectives += 1
    return {"file": path.name, "device": sim.device, "pid": sim.pid,
            "step_time_ms": [round((end - start) / 1e6, 6) for start, end in sim.step_spans],
            "kernel_count": kernels, "nccl_kernel_count": nccl_kernels, "collective_count": collectives,
            "memcpy_count": memcpys, "pageable_memcpy_count": pageable, "events": len(events),
            "clock_offset_ms": faults.clock_offset_ns / 1e6, "truncated": faults.truncated}


def _ground_truth(seed: int, world: int, steps: int, injections: list[Injection], faults: _JobFaults,
                  program: Program, timeline: _Timeline, baseline: _Timeline, per_rank: dict) -> dict:
    return {
        "schema": GROUND_TRUTH_SCHEMA, "generator": GENERATOR, "generator_version": GENERATOR_VERSION,
        "seed": seed, "world_size": world, "steps": [FIRST_STEP + i for i in range(steps)],
        "injections": [{"kind": inj.kind, "params": inj.params} for inj in injections],
        "model": {"layers": program.layers, "parameters": sum(b.nelems for b in program.buckets),
                  "dtype": "BFloat16", "allreduce_nelems": [b.nelems for b in program.buckets],
                  "bus_bandwidth_gbps": BUS_BANDWIDTH_GBPS},
        "expected": {
            "stragglers": [_straggler_truth(inj, timeline, baseline) for inj in injections if _makes_straggler(inj)],
            "findings": expected_findings(injections),
            "possible_findings": _possible_findings(injections),
            "comm_overlap": faults.overlap_comm,
            "collectives_per_step": len(program.buckets),
            "clock_offsets_ms": {str(r): f.clock_offset_ns / 1e6
                                 for r, f in enumerate(faults.ranks) if f.clock_offset_ns},
            "truncated_ranks": [r for r, f in enumerate(faults.ranks) if f.truncated],
            "per_rank": per_rank,
        },
    }


def _straggler_truth(inj: Injection, timeline: _Timeline, baseline: _Timeline) -> dict:
    """The late rank, its cause, the injected delay (straggler kind; null for the others) and what
    it really cost: per step, the median over the other ranks of their step-time increase against
    the same job without straggler-making injections (ms)."""
    rank = inj.params["rank"]
    others = [r for r in range(len(timeline.step_spans)) if r != rank] or [rank]
    cost_ms = []
    for step in range(len(timeline.comm_spans)):
        increases = [_span_ns(timeline.step_spans[r][step]) - _span_ns(baseline.step_spans[r][step]) for r in others]
        cost_ms.append(round(float(np.median(increases)) / 1e6, 3))
    cause = inj.params["cause"] if inj.kind == "straggler" else _STRAGGLER_CAUSE_BY_KIND[inj.kind]
    return {"rank": rank, "cause": cause, "injection": inj.kind, "delay_ms_per_step": inj.params.get("delay_ms"),
            "cost_ms_per_step": cost_ms}


def _span_ns(span: tuple[int, int]) -> int:
    return span[1] - span[0]


_FINDINGS_BY_KIND = {"no_overlap": ("exposed_communication", "low_overlap"), "fp32_gemm": ("tensor_cores_unused",)}
#: Findings the rules judge on the median rank: expected when every rank has the fault (rank="all").
_JOB_WIDE_FINDINGS = {"launch_bound": ("launch_overhead",), "pageable_memcpy": ("unpinned_memcpy",)}
_FINDINGS_BY_STRAGGLER_CAUSE = {"dataloader": ("dataloader_stall",)}
#: What the same fault causes downstream, so a correct analysis may add it. launch_bound: tiny
#: kernels can no longer hide the gradient all-reduces, and the GPU waits for the host.
_SIDE_FINDINGS = {"launch_bound": ("gpu_idle_host_bound", "exposed_communication", "low_overlap", "comm_bound",
                                   "load_imbalance")}


def expected_findings(injections: list[Injection]) -> list[str]:
    """Finding ids (DESIGN.md) a correct analysis must emit; it may add ones the same fault
    causes downstream (`_possible_findings`)."""
    found: set[str] = set()
    for inj in injections:
        found.update(_FINDINGS_BY_KIND.get(inj.kind, ()))
        if inj.params.get("rank") == "all":
            found.update(_JOB_WIDE_FINDINGS.get(inj.kind, ()))
        if _makes_straggler(inj):
            found.add("straggler_rank")
        if inj.kind == "straggler":
            found.update(_FINDINGS_BY_STRAGGLER_CAUSE.get(inj.params["cause"], ()))
    return sorted(found)


def _possible_findings(injections: list[Injection]) -> list[str]:
    """Finding ids the injected faults may cause downstream, beyond the expected ones."""
    expected = set(expected_findings(injections))
    return sorted({f for inj in injections for f in _SIDE_FINDINGS.get(inj.kind, ())} - expected)


DEMO_INJECTIONS = (Injection("straggler", {"rank": 5, "cause": "host_idle", "delay_ms": 40.0}),)


def demo_job_dir(cache_dir: Path) -> Path:
    """The demo job (8 ranks, rank 5 a host_idle straggler), generated once under cache_dir."""
    out = Path(cache_dir) / f"demo-job-v{GENERATOR_VERSION}"
    if (out / GROUND_TRUTH_FILE).exists():
        return out
    staging = out.with_name(f"{out.name}.tmp{os.getpid()}")
    generate_job(staging, ranks=8, steps=6, seed=0, injections=list(DEMO_INJECTIONS))
    try:
        staging.rename(out)
    except OSError:                 # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return out
