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

Modules, in dependency order:
- `constants`: the generator's name and version, model size, hardware, timeline origin, NCCL, noise;
- `faults`: injections: their kinds and parameters, parsing and checking, the per-rank fault plan;
- `program`: the op-tree dataclasses (`Op`, `Kernel`, `Memcpy`, `AllReduce`) and a step's `Program`;
- `kernels`: the CUDA kernel names of H100 bf16 traces and the GEMM / elementwise launch shapes;
- `model`: the model builder, `build_program`: the op trees of one training step;
- `program_changes`: the injections that rewrite a rank's program (`_PROGRAM_CHANGES`);
- `kineto`: event sinks, the trace file's event order, header and JSON/gzip encoding;
- `simulation`: one rank's simulation, the network, the timing pass and the per-rank event pass;
- `job`: `generate_job`, the ground truth, `expected_findings`, `demo_job_dir`.

Parallel layouts (`rankscope synth OUT --layout SPEC`): `layouts.generate_layout_job` writes an NCCL
job of a pipeline x data (DDP or FSDP) x expert x tensor parallel layout, with process groups named
as a DeviceMesh, Megatron or nothing names them, a 1F1B / GPipe / interleaved schedule, and the
faults slow_stage, no_prefetch, exposed_tp, expert_skew; its ground truth gives the dimensions and
groups, the pipeline and the findings each fault must raise (`layouts_spec`: the SPEC grammar, the
mesh, the process groups and the schedules; `layouts`: the simulation and the files).
"""
from rankscope.synth.constants import (
    AUTOGRAD_GAP_US,
    BASE_TIME_NS,
    BF16,
    BUCKETS_PER_BLOCK,
    BUS_BANDWIDTH_GBPS,
    COLLECTIVE_END_JITTER_NS,
    COMM_STREAM,
    COMPUTE_STREAM,
    CPU_OP_SIGMA,
    DATALOADER_US,
    DEFAULT_LAYERS,
    DEVICE_MEM_BASE_ADDR,
    FIRST_STEP,
    GENERATOR,
    GENERATOR_VERSION,
    GPUS_PER_NODE,
    GROUND_TRUTH_FILE,
    GROUND_TRUTH_SCHEMA,
    KERNEL_LAUNCH_LATENCY_NS,
    LAUNCH_CALL_US,
    LAUNCH_LOOP_US,
    NCCL_BASE_LATENCY_US,
    NCCL_HOP_LATENCY_US,
    NONE,
    NUM_SMS,
    OPTIMIZER_GAP_US,
    PARAM_TENSORS_PER_BLOCK,
    PYTHON_GAP_US,
    RANK_CPU_SPEED_SIGMA,
    RANK_GPU_SPEED_SIGMA,
    RESERVE_GRANULE_BYTES,
    SCALAR,
    STEP_START_JITTER_US,
    TENSORS,
    TRACE_ORIGIN_NS,
    TRANSFER_SIGMA,
)
from rankscope.synth.faults import (
    KIND_PARAMS,
    STRAGGLER_CAUSES,
    Injection,
    RankOrAll,
    injection_help,
    parse_injection,
)
from rankscope.synth.job import DEMO_INJECTIONS, demo_job_dir, expected_findings, generate_job
from rankscope.synth.kineto import GZIP_LEVEL, TRUNCATE_AT
from rankscope.synth.model import build_program
from rankscope.synth.program import SEQ_BWD, SEQ_BWD_INNER, SEQ_FWD, AllReduce, Kernel, Memcpy, Op, Program

__all__ = [
    # the job and its ground truth
    "generate_job", "demo_job_dir", "expected_findings", "DEMO_INJECTIONS",
    "GROUND_TRUTH_SCHEMA", "GROUND_TRUTH_FILE", "GENERATOR", "GENERATOR_VERSION",
    # injections
    "Injection", "RankOrAll", "KIND_PARAMS", "STRAGGLER_CAUSES", "injection_help", "parse_injection",
    # the training program
    "Program", "Op", "Kernel", "Memcpy", "AllReduce", "SEQ_FWD", "SEQ_BWD", "SEQ_BWD_INNER", "build_program",
    # the trace files
    "GZIP_LEVEL", "TRUNCATE_AT",
    # constants of the simulated job
    "FIRST_STEP", "DEFAULT_LAYERS", "BUCKETS_PER_BLOCK", "PARAM_TENSORS_PER_BLOCK", "GPUS_PER_NODE", "NUM_SMS",
    "COMPUTE_STREAM", "COMM_STREAM", "BF16", "SCALAR", "NONE", "TENSORS",
    "BASE_TIME_NS", "TRACE_ORIGIN_NS", "DEVICE_MEM_BASE_ADDR",
    "BUS_BANDWIDTH_GBPS", "NCCL_BASE_LATENCY_US", "NCCL_HOP_LATENCY_US", "COLLECTIVE_END_JITTER_NS",
    "KERNEL_LAUNCH_LATENCY_NS", "LAUNCH_CALL_US", "LAUNCH_LOOP_US", "RESERVE_GRANULE_BYTES",
    "RANK_CPU_SPEED_SIGMA", "RANK_GPU_SPEED_SIGMA", "CPU_OP_SIGMA", "TRANSFER_SIGMA", "PYTHON_GAP_US",
    "AUTOGRAD_GAP_US", "OPTIMIZER_GAP_US", "DATALOADER_US", "STEP_START_JITTER_US",
]
