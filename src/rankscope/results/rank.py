"""The per-rank summary: what the map step keeps of one rank's trace (no event frames), typed.

`RankSummary` is the per-rank cache format (msgpack), the worker -> driver payload (with its
collectives packed, results/collectives.py) and, with the cross-rank result, the findings' input.
Its parts, one Struct each: the step windows and their exact breakdown (`StepSummary`), HTA's
figures (`HtaParity`: temporal breakdown, comm-comp overlap, idle time, kernel launches, queue
length, memory bandwidth), kernel classes and top kernels, operators, device idle gaps, DataLoader
share, memory timeline, memcpy, FLOPs, gradient sync. Built by `analyses/rank/` (`summarize_rank`).
Pure data: times are int64 ns inside (`_ns`), outputs milliseconds (`_ms`) or percent (`_pct`).
"""
from __future__ import annotations

from typing import Any, Literal

import msgspec

from rankscope.model import RankMeta
from rankscope.results.collectives import Collectives, RankCollectives

#: The step breakdown's categories (docs/concepts.md "Step breakdown"), in priority order: each
#: instant of a step goes to exactly one.
BREAKDOWN_CATEGORIES = ("compute", "comm_overlapped", "comm_exposed", "memcpy", "dataloader", "sync", "host",
                        "idle_other")
BreakdownCategory = Literal["compute", "comm_overlapped", "comm_exposed", "memcpy", "dataloader", "sync", "host",
                            "idle_other"]
#: HTA's idle-time categories per stream (docs/hta-parity.md).
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")


class TemporalBreakdown(msgspec.Struct):
    """One rank. All None when the rank has no device activity (CPU-only trace)."""
    span_ms: float | None             # first device event start .. last device event end
    idle_ms: float | None
    compute_ms: float | None
    non_compute_ms: float | None
    idle_pct: float | None
    compute_pct: float | None
    non_compute_pct: float | None
    device_events: int                # device events in the scope
    include_last_step: bool


class StepOverlap(msgspec.Struct):
    """One step window; `overlap_pct` is None without communication in the window."""
    step: int
    comm_ms: float
    overlapped_ms: float
    overlap_pct: float | None


class CommCompOverlap(msgspec.Struct):
    """`overlap_pct` is None when the rank runs no communication kernel. `steps`: one per step window."""
    overlap_pct: float | None
    comm_ms: float                  # |∪COMM|
    overlapped_ms: float            # |∪COMM ∩ ∪COMP|
    compute_ms: float               # |∪COMP|
    include_last_step: bool
    steps: list[StepOverlap] = []
    steps_source: str | None = None  # "profiler_step" | "whole_trace"


class IdleIntervals(msgspec.Struct):
    """Statistics of one category's idle intervals on a stream (µs; None without intervals)."""
    count: int
    mean_us: float | None
    p50_us: float | None
    p95_us: float | None
    max_us: float | None


class StreamIdle(msgspec.Struct):
    """One (device, stream): idle ms per category, their total, each category's share of it (None when
    the stream has no idle time) and interval statistics per category."""
    device: int
    stream: int
    idle_ms: dict[str, float]
    idle_total_ms: float
    ratio: dict[str, float | None]
    intervals: dict[str, IdleIntervals]


class IdleTimeBreakdown(msgspec.Struct):
    """`streams`: one per (device, stream). `idle_ms` / `ratio`: the rank's totals over all streams."""
    consecutive_kernel_delay_us: float
    include_last_step: bool
    idle_ms: dict[str, float] = msgspec.field(default_factory=lambda: {c: 0.0 for c in IDLE_CATEGORIES})
    ratio: dict[str, float | None] = msgspec.field(default_factory=lambda: {c: None for c in IDLE_CATEGORIES})
    streams: list[StreamIdle] = []


# ------------------------------------------------------------------------------------------------
# helpers
class DurationStats(msgspec.Struct):
    """count, mean, p50, p95, max (µs; None without values) and sum (ms) of durations."""
    count: int
    mean_us: float | None
    p50_us: float | None
    p95_us: float | None
    max_us: float | None
    sum_ms: float


class PointStats(msgspec.Struct):
    """HTA's `describe()` of a counter's values at its change points (+ p95; None without values)."""
    count: int
    mean: float | None
    min: float | None
    p25: float | None
    p50: float | None
    p75: float | None
    p95: float | None
    max: float | None


# ------------------------------------------------------------------------------------------------
# launch statistics
class StreamLaunches(msgspec.Struct):
    """One (device, stream): launches, mean / p95 figures and outlier counts."""
    device: int
    stream: int
    launches: int
    cpu_duration_mean_us: float
    gpu_duration_sum_ms: float
    launch_delay_mean_us: float
    launch_delay_p95_us: float
    short_kernels: int
    runtime_outliers: int
    launch_delay_outliers: int


class ShortKernel(msgspec.Struct):
    """A kernel name among the short kernels: calls and summed device / launch time (µs)."""
    name: str
    count: int
    gpu_us_total: float
    cpu_us_total: float


class KernelLaunchStats(msgspec.Struct):
    """Per rank. `streams`: per (device, stream). `short_kernel_names`: the top names among short kernels."""
    runtime_cutoff_us: float
    launch_delay_cutoff_us: float
    include_last_step: bool
    launches: int = 0
    cpu_duration: DurationStats = msgspec.field(default_factory=lambda: DurationStats(0, None, None, None, None, 0.0))
    gpu_duration: DurationStats = msgspec.field(default_factory=lambda: DurationStats(0, None, None, None, None, 0.0))
    launch_delay: DurationStats = msgspec.field(default_factory=lambda: DurationStats(0, None, None, None, None, 0.0))
    short_kernels: int = 0
    runtime_outliers: int = 0
    launch_delay_outliers: int = 0
    streams: list[StreamLaunches] = []
    short_kernel_names: list[ShortKernel] = []


# ------------------------------------------------------------------------------------------------
# queue length
class StreamQueue(msgspec.Struct):
    """One (device, stream): HTA's summary over the change points, time-weighted mean, time at the maximum."""
    device: int
    stream: int
    points: PointStats
    time_weighted_mean: float | None
    time_at_max_queue_ms: float


class QueueLengthStats(msgspec.Struct):
    """Queue length per (device, stream), without the time series."""
    include_last_step: bool
    origin_ns: int | None = None
    streams: list[StreamQueue] = []


# ------------------------------------------------------------------------------------------------
# memory bandwidth
class CopyKindBandwidth(msgspec.Struct):
    """One copy kind: ops, bytes, busy_ms (union of its operations), effective_gbps (bytes / busy time),
    points (HTA's summary of the bandwidth counter over its change points where it is > 0, GB/s)."""
    kind: str
    ops: int
    bytes: int
    busy_ms: float
    effective_gbps: float | None
    points: PointStats


class MemoryBandwidthStats(msgspec.Struct):
    """Memory bandwidth per copy kind, without the time series."""
    include_last_step: bool
    origin_ns: int | None = None
    kinds: list[CopyKindBandwidth] = []


# ----------------------------------------------------------------------------------------------
class KernelClasses(msgspec.Struct):
    """Columns, one entry per kernel class ("COMP"|"COMM"|"MEM"): count, sum_ms (sum of durations),
    share_pct (of the sum over classes), busy_ms (union of the class's intervals)."""
    kernel_class: list[str]
    count: list[int]
    sum_ms: list[float]
    share_pct: list[float]
    busy_ms: list[float]


class KernelOverlap(msgspec.Struct):
    """Columns, one entry per set of classes running together ("COMP", "COMM", "MEM", "COMP+COMM", ...):
    time_ms, share_pct of busy_ms (HTA's kernel-type frame)."""
    kernel_types: list[str]
    time_ms: list[float]
    share_pct: list[float]


class TopKernels(msgspec.Struct):
    """Columns: per class its `top_k` names, then one "others" row per class."""
    kernel_class: list[str]
    name: list[str]
    count: list[int]
    sum_us: list[float]
    mean_us: list[float]
    min_us: list[float]
    max_us: list[float]
    std_us: list[float]
    share_of_class_pct: list[float]


class KernelBreakdown(msgspec.Struct):
    """Time by kernel class (HTA `get_gpu_kernel_breakdown` semantics, our classes)."""
    classes: KernelClasses
    overlap: KernelOverlap
    top_kernels: TopKernels
    sum_ms: float                 # sum of device event durations
    busy_ms: float                # union of all device activity


# ----------------------------------------------------------------------------------------------
class KernelNames(msgspec.Struct):
    """Columns, one entry per kernel name: count, total_ms, mean_us, share_pct (of kernel_ms),
    occupancy_pct (duration-weighted mean estimated achieved occupancy), occupancy_source ("trace" |
    "computed" | "mixed" | None), theoretical_occupancy_pct (computed from launch config,
    duration-weighted; None when not computable), grid_blocks, block_threads, registers_per_thread,
    shared_memory_bytes (of the longest launch), gemm_like, tensor_core (None for a GEMM-like kernel
    the table cannot decide), tc_rule (rule that matched)."""
    name: list[str]
    kernel_class: list[str]
    count: list[int]
    total_ms: list[float]
    mean_us: list[float]
    share_pct: list[float]
    occupancy_pct: list[float | None]
    occupancy_source: list[str | None]
    theoretical_occupancy_pct: list[float | None]
    grid_blocks: list[int | None]
    block_threads: list[int | None]
    registers_per_thread: list[int | None]
    shared_memory_bytes: list[int | None]
    gemm_like: list[bool]
    tensor_core: list[bool | None]
    tc_rule: list[str | None]


class KernelStats(msgspec.Struct):
    """Per kernel name (top `top_n` by total time) and job-level Tensor Core figures."""
    kernels: KernelNames
    kernel_count: int
    kernel_ms: float                    # all kernel events (no memcpy/memset)
    gemm_ms: float                      # GEMM-like kernels
    gemm_tensor_core_ms: float
    gemm_fp32_ms: float                 # GEMM-like without Tensor Cores
    gemm_unknown_ms: float              # GEMM-like, Tensor Core use unknown
    fp32_gemm_share_pct: float | None   # gemm_fp32 / (gemm_tensor_core + gemm_fp32)
    tensor_core_ms: float               # every kernel inferred to use Tensor Cores
    tensor_core_pct: float | None       # of kernel_ms
    occupancy_pct: float | None         # duration-weighted over kernels with a value
    occupancy_source: str | None        # "trace" | "computed" | "mixed" | None
    occupancy_covered_pct: float | None  # share of kernel time with an occupancy value
    generated_kernel_pct: float | None = None        # compiler-generated kernels' time, % of kernel_ms
    generated_kernel_count_pct: float | None = None  # their launches, % of kernel_count


class OperatorGroups(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Columns, one entry per group of host ops: the key columns of the grouping (name | name,
    input_dims | location, top_op; the others are None and left out of the output), calls,
    total_cpu_ms, self_cpu_ms, self_device_ms, total_device_ms, device_events (device events
    attributed to the group's ops directly). `top_op` (stack grouping): the op name with the most
    self CPU + self device time at that location; location None = ops without any stack."""
    name: list[str] | None = None
    input_dims: list[str | None] | None = None
    location: list[str | None] | None = None
    top_op: list[str | None] | None = None
    calls: list[int]
    total_cpu_ms: list[float]
    self_cpu_ms: list[float]
    self_device_ms: list[float]
    total_device_ms: list[float]
    device_events: list[int]


class OperatorStats(msgspec.Struct):
    """Top groups of host ops: the top `top_n` groups by self_device_ms and by self_cpu_ms."""
    group_by: str
    by_self_device: OperatorGroups
    by_self_cpu: OperatorGroups
    ops: int                        # host op events (ProfilerStep spans excluded)
    groups: int
    self_cpu_ms: float              # self CPU time of all ops, ProfilerStep spans included (no double count)
    device_ms: float                # all device events of the trace
    device_attributed_ms: float     # device events given to an op
    stack_source: str | None        # "call_stack" | "python_function" | None (group_by="stack")
    nesting_conflicts: int          # partly overlapping op pairs left unnested


class Gap(msgspec.Struct):
    step: int
    start_in_step_ms: float
    duration_ms: float
    host_activity: str                     # dominant of dataloader / sync / host / idle_other
    host_ms: dict[str, float]              # the gap's time per idle category
    next_device_op: str                    # kernel / memcpy that ended the gap
    launched_by: str | None                # innermost CPU op around its launch
    busy_host_op: str | None               # CPU op most present during the gap (launching thread)
    position: Literal["between", "before_first", "after_last"] = "between"   # where in the step (module docstring)


class GapSummary(msgspec.Struct):
    gap_min_us: float
    gaps: int
    gap_ms: float
    gap_ms_by_host_activity: dict[str, float]
    top: list[Gap] = []


class DataLoaderSteps(msgspec.Struct):
    """Columns, one entry per step window; `spans`: DataLoader spans starting in the step."""
    step: list[int]
    duration_ms: list[float]
    dataloader_ms: list[float]
    share_pct: list[float]
    spans: list[int]


class DataLoaderShare(msgspec.Struct):
    steps: DataLoaderSteps
    steps_source: str                      # "profiler_step" | "whole_trace"
    spans: int                             # DataLoader __next__ spans in the trace
    dataloader_ms: float                   # DataLoader time inside the step windows
    step_time_ms: float
    share_pct: float | None                # dataloader_ms / step_time_ms
    mean_step_share_pct: float | None      # mean of the per-step shares
    max_step_share_pct: float | None
    outside_steps_ms: float                # DataLoader time outside every step window
    iterators: list[str] = []              # iterator classes seen in the span names
    multiprocessing: bool | None = None    # None: no DataLoader span
    num_workers: int | None = None         # 0 when single-process; None when unknown
    num_workers_source: str = "none"       # "iterator_class" | "unknown" | "none"
    pin_memory_ops: int = 0


# ----------------------------------------------------------------------------------------------
# Memory timeline
class DeviceMemory(msgspec.Struct):
    """One device's allocator summary (see module docstring for the definitions)."""
    device: str                          # "cpu", "cuda:0", ...
    device_type: int
    device_id: int
    samples: int                         # [memory] samples used for the curve
    allocated_source: str                # "total_allocated" | "running_sum" (lower bound)
    reserved_known: bool
    peak_allocated_mb: float
    peak_allocated_ts_ns: int
    peak_allocated_at_ms: float          # since the trace's first event
    peak_allocated_step: int | None
    peak_reserved_mb: float | None = None
    peak_reserved_ts_ns: int | None = None
    peak_reserved_at_ms: float | None = None
    peak_reserved_step: int | None = None
    fragmentation_mb: float | None = None        # reserved - allocated at the peak-allocated moment
    fragmentation_pct: float | None = None       # of the reserved memory at that moment
    reserved_at_peak_allocated_mb: float | None = None   # reserved memory at the peak-allocated moment
    capacity_mb: float | None = None             # deviceProperties totalGlobalMem
    peak_allocated_pct_of_capacity: float | None = None
    peak_reserved_pct_of_capacity: float | None = None
    other_allocator_samples: int = 0             # CPU samples of another host allocator, left out
    notes: list[str] = []


class MemorySamples(msgspec.Struct):
    """Columns, one entry per kept sample (<= max_points per device); reserved_mb None where unknown."""
    device: list[str]
    ts_ns: list[int]
    t_ms: list[float]
    allocated_mb: list[float]
    reserved_mb: list[float | None]


class StepMemoryPeaks(msgspec.Struct):
    """Columns, one entry per (device, step); peak_reserved_mb None where unknown."""
    device: list[str]
    step: list[int]
    peak_allocated_mb: list[float]
    peak_reserved_mb: list[float | None]


class MemoryTimeline(msgspec.Struct):
    devices: list[DeviceMemory]
    timeline: MemorySamples
    per_step: StepMemoryPeaks
    max_points: int


class CopySummary(msgspec.Struct):
    count: int = 0
    total_ms: float = 0.0
    bytes: int = 0
    bytes_missing: int = 0                 # copies without a bytes arg
    mean_bandwidth_gbps: float | None = None
    step_share_pct: float | None = None
    bulk_count: int = 0                    # copies of at least BULK_COPY_BYTES
    bulk_bandwidth_gbps: float | None = None   # bytes / duration over those copies


class CopyKinds(msgspec.Struct):
    """Columns, one entry per (direction, host_memory), longest total time first."""
    direction: list[str]
    host_memory: list[str]
    count: list[int]
    total_ms: list[float]
    bytes: list[int]
    bytes_missing: list[int]
    mean_bandwidth_gbps: list[float | None]
    step_share_pct: list[float | None]


class PageableSteps(msgspec.Struct):
    """Columns, one entry per step window: pageable copy time and its share of the step."""
    step: list[int]
    duration_ms: list[float]
    pageable_ms: list[float]
    pageable_share_pct: list[float]


class MemcpyReport(msgspec.Struct):
    by_kind: CopyKinds
    pageable: CopySummary                  # HtoD + DtoH from/to pageable host memory
    pageable_htod: CopySummary
    pageable_dtoh: CopySummary
    pinned: CopySummary                    # HtoD + DtoH from/to pinned host memory
    #: bulk bandwidth pinned / pageable (host<->device copies >= BULK_COPY_BYTES), when both exist
    pinned_vs_pageable_bandwidth_ratio: float | None
    pageable_pct_of_host_copy_time: float | None   # pageable / (pageable + pinned + host_unknown) time
    step_time_ms: float
    steps_source: str
    per_step: PageableSteps


class RankFlops(msgspec.Struct):
    """One rank's steps, device and traced FLOPs (the per-rank map step; small)."""
    rank: int
    device: str | None                  # name of the device that ran the rank's kernels
    device_props: dict[str, Any] | None
    steps: list[int]
    step_ms: list[float]
    flops: list[float] = []             # traced FLOPs per step ([] when none)
    source: str = "none"                # "flops_args" | "gemm_shapes" | "none"
    dtype: str | None = None            # the GEMMs' dtype, FLOPs-weighted (None: not recorded)
    ops: int = 0                        # ops whose FLOPs were counted
    uncounted_ops: int = 0              # convolutions without flops args (gemm_shapes only)


class GradSyncSchedule(msgspec.Struct):
    collectives: int                    # gradient collectives launched by the host
    launched_during_backward: int
    launched_after_backward: int        # launched with no backward op running (after it ended)
    after_backward_pct: float
    source: str                         # "c10d" | "nccl_annotation": which host ops were counted


class StepSummary(msgspec.Struct):
    """One step window: its bounds (ns, the rank's clock), duration, device-busy time and breakdown."""
    step: int
    start_ns: int
    end_ns: int
    duration_ms: float
    device_busy_ms: float
    breakdown_ms: dict[str, float]    # per breakdown category; the parts sum to duration_ms


class HtaParity(msgspec.Struct):
    """HTA's per-rank figures (docs/hta-parity.md), queue length and memory bandwidth without their series."""
    temporal: TemporalBreakdown
    overlap: CommCompOverlap
    idle: IdleTimeBreakdown
    launch: KernelLaunchStats
    queue: QueueLengthStats
    memory_bw: MemoryBandwidthStats


class RankKernels(msgspec.Struct):
    """Kernel classes and top kernels (`breakdown`); occupancy, Tensor Core / FP32 GEMM share (`stats`)."""
    breakdown: KernelBreakdown
    stats: KernelStats


class NameTotals(msgspec.Struct):
    """Columns, one entry per event name, sorted by name: count, total_ns (summed duration) and sumsq_ns2
    (summed squared duration: the per-call variance for the diff's Welch test)."""
    name: list[str]
    count: list[int]
    total_ns: list[int]
    sumsq_ns2: list[float]


class RankNameTotals(msgspec.Struct):
    """Every kernel (device events) and every host op name of the rank, whole trace (for the diff)."""
    kernels: NameTotals
    ops: NameTotals


class StepTimeStats(msgspec.Struct):
    """A rank's step times over its profiled steps."""
    mean_ms: float | None
    median_ms: float | None
    max_ms: float | None
    device_busy_pct: float | None     # device busy / step time; None for ranks without device activity


class RankSummary(msgspec.Struct):
    meta: RankMeta
    steps: list[StepSummary]
    steps_source: str                 # "profiler_step" | "whole_trace"
    kind_counts: dict[str, int]       # complete events per kind name
    device_events: int                # kernels + memcpy + memset
    comm_kernels: int                 # device events of class COMM
    streams: int                      # distinct (device, stream) with device activity
    step_time: StepTimeStats
    breakdown_mode: str = "device"    # "device" | "cpu_only" (the training thread plays the device)
    breakdown_mean_ms: dict[str, float] = {}   # per category, mean per step
    overlap_efficiency: float | None = None
    gaps: GapSummary | None = None    # device idle gaps and what the host did meanwhile
    dataloader: DataLoaderShare | None = None
    memory: MemoryTimeline | None = None          # <= MEMORY_POINTS samples per device
    memcpy: MemcpyReport | None = None
    hta: HtaParity | None = None
    kernels: RankKernels | None = None
    operators: OperatorStats | None = None        # top ops by self device / CPU time, grouped by name
    collectives: RankCollectives | None = None   # this rank's collectives, for the cross-rank reduce
    name_totals: RankNameTotals | None = None
    grad_sync: GradSyncSchedule | None = None     # gradient collectives vs backward
    flops: RankFlops | None = None                # traced FLOPs per step (for MFU)
    kernel_launches: int = 0          # host kernel-launch calls (launch.LAUNCH_NAMES), with or without their kernel
    from_cache: bool = False

    @property
    def rank(self) -> int:
        return self.meta.rank

    @property
    def has_device(self) -> bool:
        return self.device_events > 0


class MappedRank(msgspec.Struct):
    """What the per-rank map hands the driver: the rank's summary, and its collectives taken out of it
    for the cross-rank reduce (packed when a worker sends them: `PackedCollectives`); the reduce uses
    them up, the summary stays."""
    summary: RankSummary                  # its `collectives`: None
    collectives: Collectives | None
