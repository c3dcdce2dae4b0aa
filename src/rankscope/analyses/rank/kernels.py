"""Device kernels: time by kernel class, top kernels, occupancy and Tensor Core use (one rank).

Anchors: docs/concepts.md "Kernel classes" for COMP / COMM / MEM (the `kclass` column set at
ingest from `model.KERNEL_CLASS_PATTERNS`), docs/hta-parity.md for `kernel_breakdown`.

`kernel_breakdown(trace, top_k)` follows HTA 0.5 `get_gpu_kernel_breakdown`
(hta/analyzers/breakdown_analysis.py), with our kernel classes:
  * device activity = every kernel, memcpy and memset event (HTA: every event with a stream);
  * `overlap`: the device timeline split by which classes are running at each instant (the union
    of each class's intervals, then a sweep): "COMP", "COMM", "MEM", "COMP+COMM", ... with the
    share of the busy time. This is HTA's first frame (`kernel_type`, `sum`, `percentage`), whose
    names read "COMPUTATION", "COMPUTATION overlapping COMMUNICATION", ...
  * `classes`: per class the plain sum of event durations and its share of the sum over classes,
    plus the busy time (union) of the class;
  * `top_kernels`: per class the `top_k` names by summed duration with count, sum, mean, min,
    max and sample standard deviation (ddof=1, 0 for a single call, as HTA's pandas `std` +
    `fillna(0)`) in microseconds, then one `others` row per class for the remaining names (its
    stats are over the individual events of those names). HTA also folds names past the 80%
    cumulative-time quantile into "others", and when a class has more than `num_kernels` names
    it re-aggregates by name over the per-name sums, so that its min/max/mean/std of every row
    of such a class describe per-name sums, not kernels. We report per-kernel statistics; the
    per-name sums agree with HTA, and so do all statistics of classes HTA did not fold.
  `hta_filter=True` reproduces the event selection HTA 0.5 applies at load time
  (hta/common/trace.py `_filter_irrelevant_gpu_kernels`): with two or more `ProfilerStep#N`
  spans, only device events whose launch (runtime/driver call with the same correlation id)
  starts before the start of the last ProfilerStep are kept (the last, possibly cut, step is
  dropped, as are device events without a launch on the CPU). Default: every device event.
  HTA classifies with `^nccl.*Kernel` (COMM) and `^Memcpy|^Memset|^dma` (MEM). `ncclDevKernel_*`
  matches that too (HTA 0.5 calls it COMMUNICATION on the B200 trace), but the symmetric-memory
  `multimem_*` / `cross_device_reduce` kernels are COMPUTATION for HTA and COMM here (B200: 73
  multimem all-reduce kernels, 2.1 ms); HTA 0.5 fails to load the MI300 RCCL trace at all.
  Compare with HTA only where the two classifications agree (tests/fixtures/kernels/README.md).

`kernel_stats(trace, top_n)` per kernel name (kernel events only, not memcpy/memset): count,
total, mean; estimated achieved occupancy; Tensor Core use inferred from the name; and the
job-level FP32 GEMM share and Tensor Core share.

Occupancy (per launch; per name the duration-weighted mean):
  * preferred: the trace's own `est. achieved occupancy %` (Kineto/CUPTI), source "trace" --
    except where it reads 0 for a kernel with more than 48 KiB of shared memory per block:
    Kineto's occupancy-calculator call fails for opt-in shared memory and writes 0 (every such
    kernel in the A100 and B200 corpus traces reads 0, e.g. cutlass s1688gemm 256x128 with
    144 KiB, nvjet on B200), so those launches use the computed value;
  * else computed here from the launch config and `deviceProperties` (source "computed"), with
    the formula Kineto uses (libkineto DeviceProperties.cpp `kernelOccupancy` over the CUDA
    occupancy calculator):
        warps_per_block = ceil(block_threads / warpSize)
        by_threads = floor(maxThreadsPerMultiprocessor / warpSize / warps_per_block)
        by_regs    = 4 * floor(regsPerMultiprocessor / 4 / regs_per_warp) // warps_per_block,
                     regs_per_warp = ceil(registers_per_thread * warpSize / 256) * 256
                     (4 register sub-partitions per SM)
        by_smem    = floor(sharedMemPerMultiprocessor / smem_per_block),
                     smem_per_block = ceil((shared_memory + reserved) / 128) * 128,
                     reserved = 1 KiB per block on compute capability >= 8.0
                     (no limit when the kernel uses no shared memory)
        by_arch    = max resident blocks per SM (`MAX_BLOCKS_PER_SM`, 32 unless listed)
        active     = min(by_threads, by_regs, by_smem, by_arch)        (theoretical)
        theoretical_occupancy = active * block_threads / maxThreadsPerMultiprocessor
        achieved_estimate     = min(active, grid_blocks / numSms) * block_threads
                                / maxThreadsPerMultiprocessor
    i.e. the theoretical occupancy capped by the blocks the grid actually gives each SM.
    Checked against Kineto: within 0.5 point (its rounding) of the trace's value on every launch
    of every NVIDIA corpus trace (V100, A100, B200) where that value is valid.
    Launches without registers or launch config, and devices without `regsPerMultiprocessor` /
    `sharedMemPerMultiprocessor` (ROCm traces: AMD occupancy follows other rules, VGPRs per
    SIMD) get null.

Tensor Core inference: `TENSOR_CORE_RULES`, a table of (regex, uses_tensor_cores, rule name),
first match wins, case-insensitive, on the kernel name. A kernel is GEMM-like when it matches
`GEMM_LIKE_PATTERN` (GEMM, GEMV, convolution and fused-attention kernels, with the helper
kernels of those libraries that carry the same names, e.g. cuDNN winograd transforms; not
`fbgemm_gpu::` kernels, not Triton pointwise/reduction kernels whose names mention addmm).
A GEMM-like kernel that matches no rule has unknown Tensor Core use (null); a kernel that is not
GEMM-like and matches no rule uses none.
  fp32_gemm_share_pct = GEMM-like time without Tensor Cores / GEMM-like time with a known answer
  tensor_core_pct     = time of kernels using Tensor Cores / all kernel time (tb-profiler's
                        "Tensor Cores utilization" definition)
AMD matrix cores (MFMA: Tensile `_MI16x16x..`, Composable Kernel `xdl`, MIOpen `gtcx`) count as
Tensor Cores, also for FP32 MFMA (MI200/MI300 run FP32 on matrix cores); Tensile `Cijk_` kernels
without an `_MI` tile do not.

Compiler-generated kernels: kernels whose names say a compiler generated them from the model's
ops (`GENERATED_KERNEL_PATTERN`): TorchInductor's Triton kernels (`torch.compile`:
`triton_poi_fused_*` pointwise, `triton_red_*` reductions, `triton_per_*` persistent reductions,
`triton_tem_*` templates) and nvFuser's (`nvfuser_*`).
  generated_kernel_pct       = their time / all kernel time
  generated_kernel_count_pct = their launches / all kernel launches
The findings read these to leave torch.compile out of a fix for a model that is compiled already.

Pure functions: no printing, no file I/O. Results are small (top-N) tables.
"""
from __future__ import annotations

import re

import numpy as np
import polars as pl

from rankscope.analyses.intervals import union
from rankscope.analyses.rank.steps import device_class_union
from rankscope.analyses.rank.views import device_events, gpu_args_at, names_matching, rows_of_kinds
from rankscope.model import (HOST_OP_KINDS, MATCHED_NAME_CHARS, PROFILER_STEP_PATTERN, Kind, KernelClass, RankTrace,
                             name_codes, name_matches)
from rankscope.units import NS_PER_US, NS_PER_MS
from rankscope.results.rank import KernelClasses, KernelOverlap, TopKernels, KernelBreakdown, KernelNames, KernelStats

_HOST = [int(k) for k in HOST_OP_KINDS]
_LAUNCH = [int(Kind.RUNTIME), int(Kind.DRIVER)]
_CLASSES = (KernelClass.COMP, KernelClass.COMM, KernelClass.MEM)

# ----------------------------------------------------------------------------------------------
# Tensor Core inference (data: extend by inserting rows at the front). Every pattern runs in polars'
# regex engine (no look-around: linear time on any name, `model.name_matches`).
_LOW_PRECISION = (r"(bf16|bfloat16|(?:^|[^a-z])f16|fp16|half|tf32|tfloat32|fp8|e4m3|e5m2|e2m1|fp4|int8"
                  r"|(?:^|[^a-z])i8(?:$|[^0-9]))")
#: `gemm` not after `fb` (fbgemm): at the start, after one character that is not `b`, after a `b`
#: that is the first character or follows no `f`.
_GEMM = r"(?:^|^b|[^b]|[^f]b)gemm"
_GEMM_FAMILY = rf"({_GEMM}|bmm|xmma|cutlass_|cutlass3x|fmha|flash_?(fwd|bwd|attn))"

#: (regex, or a tuple of regexes that must all match; uses Tensor Cores; rule name). First match
#: wins; case-insensitive.
TENSOR_CORE_RULES: list[tuple[str | tuple[str, ...], bool, str]] = [
    # CUDA-core FFMA / SIMT variants of otherwise Tensor Core kernel families
    (r"ffma|simt", False, "simt_ffma"),
    # MMA instruction shapes and Tensor Core op classes: CUTLASS `tensorop`/`MmaTensorOp`,
    # cuBLAS/cuDNN h884 / s1688 (TF32) / h1688 / h16816 / i8816, HMMA/IMMA/WGMMA/UMMA,
    # xmma's `tensor16x8x8` field
    (r"_tensorop_|mmatensorop|[a-z](884|1688|16816|8816|16832)[a-z]|hmma|imma|wgmma|gmma_|umma|tcgen05"
     r"|_tensor\d+x\d+x\d+", True, "mma_shape"),
    # cuBLASLt JIT kernels on Hopper/Blackwell are MMA kernels
    (r"nvjet", True, "cublaslt_nvjet"),
    # AMD matrix cores: Tensile MFMA tiles, Composable Kernel xdlops, MIOpen igemm gtcx
    (r"_MI\d+x\d+x\d+|mfma|xdlops|_xdl_|gtcx", True, "amd_matrix_core"),
    (r"^cijk_", False, "amd_tensile_simd"),
    # GEMM/attention family with a reduced-precision or TF32 data type in the name
    ((_GEMM_FAMILY, _LOW_PRECISION), True, "gemm_low_precision"),
    # FP32/FP64 CUDA-core GEMM, GEMV and convolution kernels (cuBLAS sgemm/gemv/dot, cuDNN
    # scudnn/winograd/implicit_convolve_sgemm/wgrad_alg/dgrad_engine, MAGMA sgemm)
    (r"sgemm|dgemm|cgemm|zgemm|gcgemm|scudnn|gemv|gemmsn|gemmk1|dot_kernel|winograd|wgrad_alg\d"
     r"|dgrad_engine|convolve_sgemm", False, "fp32_cuda_core"),
    # GEMM family whose only data type is FP32/FP64
    ((_GEMM_FAMILY, r"f32|float|f64|double"), False, "gemm_fp32_only"),
]

#: GEMM-like kernels: matrix multiply, matrix-vector, convolution and attention GEMM kernels, and
#: CUTLASS kernels (`cutlass_`, `cutlass3x`) where no `reduction` / `reducesplitk` follows the
#: name's last mention of CUTLASS (`_cutlass_gemm`).
GEMM_LIKE_PATTERN = (
    rf"{_GEMM}|gemv|bmm_|xmma|nvjet|_tensorop_|mmatensorop|hmma|wgmma|cijk_|scudnn|winograd|wgrad_alg"
    r"|dgrad_engine|dot_kernel|implicitgemm|implicit_gemm|conv_(fwd|bwd)|igemm_|fmha|flash_?(fwd|bwd|attn)"
    r"|triton_tem_")
_CUTLASS = ("cutlass_", "cutlass3x")
_CUTLASS_NOT_GEMM_AFTER = ("reduction", "reducesplitk")
#: Names never GEMM-like even if they match the pattern above.
GEMM_LIKE_EXCLUDE = r"^triton_(poi|red|per)_|fbgemm_gpu::"

#: Maximum resident blocks per SM by compute capability (CUDA occupancy calculator); others 32.
MAX_BLOCKS_PER_SM: dict[tuple[int, int], int] = {
    (7, 5): 16, (8, 6): 16, (8, 7): 16, (8, 9): 24, (12, 0): 24, (12, 1): 24,
}
REG_ALLOC_UNIT = 256          # registers, per warp
REG_SUB_PARTITIONS = 4
SMEM_ALLOC_UNIT = 128         # bytes
SMEM_RESERVED_SM80 = 1024     # bytes per block, compute capability >= 8.0
#: Kineto reports occupancy 0 for launches above the default (non opt-in) per-block shared memory
KINETO_SMEM_OPTIN_BYTES = 48 * 1024


def tensor_core_rules(names: list[str]) -> tuple[list[bool | None], list[str | None], np.ndarray]:
    """For each kernel name: uses Tensor Cores (None: unknown), the rule that decided it, and
    whether it is GEMM-like (see module docstring). Each pattern is matched once over all the names
    (`name_matches`), so the cost is linear in the names' length."""
    def matches(pattern: str) -> np.ndarray:
        return name_matches(re.compile(pattern, re.IGNORECASE), names)

    cutlass = matches("|".join(_CUTLASS))
    cutlass[cutlass] = [_cutlass_gemm(n) for n, hit in zip(names, cutlass) if hit]
    gemm = (matches(GEMM_LIKE_PATTERN) | cutlass) & ~matches(GEMM_LIKE_EXCLUDE)
    decided = np.full(len(names), -1)
    for i, (rx, _, _) in enumerate(TENSOR_CORE_RULES):
        hit = np.ones(len(names), dtype=bool)
        for part in (rx,) if isinstance(rx, str) else rx:
            hit &= matches(part)
        decided[(decided < 0) & hit] = i
    tc = [TENSOR_CORE_RULES[i][1] if i >= 0 else (None if g else False) for i, g in zip(decided.tolist(), gemm)]
    rule = [TENSOR_CORE_RULES[i][2] if i >= 0 else None for i in decided.tolist()]
    return tc, rule, gemm


def _cutlass_gemm(name: str) -> bool:
    """Whether no `reduction` / `reducesplitk` follows the last mention of CUTLASS in the name (its
    first MATCHED_NAME_CHARS characters)."""
    low = name[:MATCHED_NAME_CHARS].lower()
    last = max((low.rfind(c), len(c)) for c in _CUTLASS)
    return last[0] >= 0 and not any(r in low[sum(last):] for r in _CUTLASS_NOT_GEMM_AFTER)


def tensor_core_rule(name: str) -> tuple[bool | None, str | None, bool]:
    """(uses Tensor Cores, rule name, GEMM-like) for one kernel name (`tensor_core_rules`)."""
    tc, rule, gemm = tensor_core_rules([name])
    return tc[0], rule[0], bool(gemm[0])


_CLASS_FRAME = {"kernel_class": pl.String, "count": pl.Int64, "sum_ms": pl.Float64,
                "share_pct": pl.Float64, "busy_ms": pl.Float64}
_OVERLAP_FRAME = {"kernel_types": pl.String, "time_ms": pl.Float64, "share_pct": pl.Float64}


def kernel_breakdown(trace: RankTrace, top_k: int = 10, hta_filter: bool = False) -> KernelBreakdown:
    dev = device_events(trace)
    if (dev["kclass"].to_numpy() == int(KernelClass.NONE)).any():
        dev = dev.filter(pl.col("kclass").is_in([int(c) for c in _CLASSES]))
    if hta_filter:
        dev = _hta_selection(trace, dev)
    dev = dev.select("kclass", "name", "ts_ns", "dur_ns")
    if dev.is_empty():
        return KernelBreakdown(KernelClasses([], [], [], [], []), KernelOverlap([], [], []),
                               TopKernels(**{c: [] for c in TopKernels.__struct_fields__}), 0.0, 0.0)
    ts = dev["ts_ns"].to_numpy()
    dur = dev["dur_ns"].to_numpy()
    end = ts + dur
    kc = dev["kclass"].to_numpy()

    # classes: plain sums and per-class union (the timeline's own, when every device event counts)
    unions = {c: union(ts[kc == int(c)], end[kc == int(c)]) if hta_filter else device_class_union(trace, c)
              for c in _CLASSES}
    total_sum = int(dur.sum())
    rows = []
    for c in _CLASSES:
        sel = kc == int(c)
        if not sel.any():
            continue
        s = int(dur[sel].sum())
        us, ue = unions[c]
        rows.append({"kernel_class": c.name, "count": int(sel.sum()), "sum_ms": s / NS_PER_MS,
                     "share_pct": 100.0 * s / total_sum if total_sum else 0.0,
                     "busy_ms": float((ue - us).sum()) / NS_PER_MS})
    classes = pl.DataFrame(rows, schema=_CLASS_FRAME).sort("sum_ms", descending=True)

    overlap = _overlap_sweep(unions)
    starts, ends = zip(*unions.values())
    all_s, all_e = union(np.concatenate(starts), np.concatenate(ends))
    busy = int((all_e - all_s).sum())
    top = _top_kernels(dev, top_k)
    return KernelBreakdown(KernelClasses(**classes.to_dict(as_series=False)),
                           KernelOverlap(**overlap.to_dict(as_series=False)),
                           top, total_sum / NS_PER_MS, busy / NS_PER_MS)


def _hta_selection(trace: RankTrace, dev: pl.DataFrame) -> pl.DataFrame:
    ev = trace.events
    step_names = names_matching(trace, PROFILER_STEP_PATTERN)
    if len(step_names) < 2:
        return dev
    last_start = ev.filter(pl.col("name").is_in(step_names) & pl.col("kind").is_in(_HOST))["ts_ns"].max()
    launched = (ev.filter(pl.col("kind").is_in(_LAUNCH) & (pl.col("correlation") >= 0)
                          & (pl.col("ts_ns") < last_start))
                .select("correlation").unique())
    return dev.join(launched, on="correlation", how="semi")


def _overlap_sweep(unions: dict) -> pl.DataFrame:
    """Split the device timeline by the set of classes running (bit i = class i of _CLASSES)."""
    times, deltas = [], []
    for i, c in enumerate(_CLASSES):
        s, e = unions[c]
        times += [s, e]
        deltas += [np.full(len(s), 1 << i, np.int64), np.full(len(e), -(1 << i), np.int64)]
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    if len(t) == 0:
        return pl.DataFrame(schema=_OVERLAP_FRAME)
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    running = np.cumsum(d)
    seg = np.diff(t)                       # segment after event i lasts t[i+1] - t[i]
    state = running[:-1]
    keep = (state > 0) & (seg > 0)
    sums = np.bincount(state[keep], weights=seg[keep], minlength=1 << len(_CLASSES))
    busy = sums.sum()
    rows = []
    for mask in range(1, len(sums)):
        if sums[mask] > 0:
            label = "+".join(c.name for i, c in enumerate(_CLASSES) if mask & (1 << i))
            rows.append({"kernel_types": label, "time_ms": sums[mask] / NS_PER_MS,
                         "share_pct": 100.0 * sums[mask] / busy})
    return pl.DataFrame(rows, schema=_OVERLAP_FRAME).sort("time_ms", descending=True)


#: The name code of an unnamed kernel in (class << 32 | name code) keys (codes are below 2**32).
_UNNAMED = 2**32 - 1


def _top_kernels(dev: pl.DataFrame, top_k: int) -> TopKernels:
    """Per class its `top_k` names by summed duration (ties by name), then one "others" row for the
    remaining names; each row's stats are over its events, in microseconds."""
    kclass = dev["kclass"].to_numpy().astype(np.int64)
    dur = dev["dur_ns"].to_numpy()
    # per (class, name): summed duration, and the name's rank in its class
    key = (kclass << 32) | name_codes(dev).at(slice(None), _UNNAMED)
    per = np.unique(key)
    of_event = np.searchsorted(per, key)
    first = np.full(len(per), len(dev))
    np.minimum.at(first, of_event, np.arange(len(dev)))
    names = dev["name"].gather(first).cast(pl.String).to_list()
    sums = np.zeros(len(per), np.int64)
    np.add.at(sums, of_event, dur)
    rank = np.zeros(len(per), np.int64)
    ranked: dict[int, int] = {}
    label: dict[tuple[int, int], str] = {}
    for g in sorted(range(len(per)), key=lambda g: (per[g] >> 32, -sums[g], names[g] or "")):
        c = int(per[g] >> 32)
        if names[g] is None:                                 # an unnamed kernel: in "others"
            rank[g] = top_k + 1
            continue
        rank[g] = ranked[c] = ranked.get(c, 0) + 1
        label[(c, int(rank[g]))] = names[g]
    # the events of each (class, top name or others) row, in rank order
    row_key = kclass * (top_k + 2) + np.minimum(rank, top_k + 1)[of_event]
    order = np.argsort(row_key, kind="stable")
    row_key, us = row_key[order], dur[order].astype(np.float64) / NS_PER_US
    bounds = np.flatnonzero(np.r_[True, row_key[1:] != row_key[:-1]])
    out: dict[str, list] = {c: [] for c in TopKernels.__struct_fields__}
    class_us: dict[str, float] = {}
    for i, j in zip(bounds, np.r_[bounds[1:], len(us)]):
        c, r = divmod(int(row_key[i]), top_k + 2)
        x = us[i:j]
        out["kernel_class"].append(KernelClass(c).name)
        out["name"].append(label[(c, r)] if r <= top_k else "others")
        out["count"].append(len(x))
        out["sum_us"].append(float(x.sum()))
        out["mean_us"].append(float(x.mean()))
        out["min_us"].append(float(x.min()))
        out["max_us"].append(float(x.max()))
        out["std_us"].append(float(x.std(ddof=1)) if len(x) > 1 else 0.0)
        class_us[KernelClass(c).name] = class_us.get(KernelClass(c).name, 0.0) + float(x.sum())
    out["share_of_class_pct"] = [100.0 * s / class_us[c] if class_us[c] else 0.0
                                 for s, c in zip(out["sum_us"], out["kernel_class"])]
    return TopKernels(**out)


#: Kernels a compiler generated (module docstring): TorchInductor's Triton kernels, nvFuser's.
GENERATED_KERNEL_PATTERN = r"^triton_|(^|::)nvfuser_"


def kernel_stats(trace: RankTrace, top_n: int = 20) -> KernelStats:
    rows = rows_of_kinds(trace, [Kind.KERNEL])
    if len(rows) == 0:
        return KernelStats(KernelNames(**{c: [] for c in KernelNames.__struct_fields__}), 0, 0.0, 0.0, 0.0, 0.0, 0.0,
                           None, 0.0, None, None, None, None)
    launch = ("grid_blocks", "block_threads", "registers_per_thread", "shared_memory_bytes")
    args = gpu_args_at(trace, rows, [*launch, "est_occupancy_pct"])
    theo, achieved = launch_occupancy(trace.events["device"].to_numpy()[rows], args["grid_blocks"],
                                      args["block_threads"], args["registers_per_thread"], args["shared_memory_bytes"],
                                      trace.meta.devices)
    trace_occ = args["est_occupancy_pct"]
    kineto_failed = (trace_occ == 0) & (args["shared_memory_bytes"] > KINETO_SMEM_OPTIN_BYTES)
    from_trace = ~np.isnan(trace_occ) & ~(kineto_failed & ~np.isnan(achieved))
    occ = np.where(from_trace, trace_occ, achieved)
    src = np.where(from_trace, 1, np.where(np.isnan(achieved), 0, 2)).astype(np.int8)
    dur = trace.events["dur_ns"].to_numpy()[rows]

    # per kernel name: g, the name's index of each launch
    kclass = trace.events["kclass"].to_numpy()[rows].astype(np.int64)
    key = (kclass << 32) | name_codes(trace.events).at(rows, _UNNAMED)
    per = np.unique(key)
    g = np.searchsorted(per, key)
    n = len(per)
    first = np.full(n, len(rows))
    np.minimum.at(first, g, np.arange(len(rows)))
    names = trace.events["name"].gather(rows[first]).cast(pl.String).fill_null("").to_list()   # "": unnamed
    count = np.bincount(g, minlength=n)
    sum_ns = np.zeros(n, np.int64)
    np.add.at(sum_ns, g, dur)
    weight = dur.astype(np.float64)

    def weighted_mean(x: np.ndarray) -> np.ndarray:          # per name, duration-weighted, NaN where unknown
        known = ~np.isnan(x)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (np.bincount(g[known], weights=(x * weight)[known], minlength=n)
                    / np.bincount(g[known], weights=weight[known], minlength=n))

    src_min, src_max = np.full(n, 3, np.int8), np.zeros(n, np.int8)
    np.minimum.at(src_min, g[src > 0], src[src > 0])
    np.maximum.at(src_max, g[src > 0], src[src > 0])
    longest_ns = np.zeros(n, np.int64)
    np.maximum.at(longest_ns, g, dur)
    longest = np.full(n, len(rows))                          # each name's first launch of its longest duration
    is_longest = dur == longest_ns[g]
    np.minimum.at(longest, g[is_longest], np.flatnonzero(is_longest))
    tensor_core, tc_rule, gemm = tensor_core_rules(names)
    tc_yes = np.array([t is True for t in tensor_core])
    tc_no = np.array([t is False for t in tensor_core])
    generated = name_matches(GENERATED_KERNEL_PATTERN, names)
    kernel_ns = float(sum_ns.sum())

    def _ms(sel: np.ndarray) -> float:
        return float(sum_ns[sel].sum()) / NS_PER_MS

    gemm_tc, gemm_fp32 = _ms(gemm & tc_yes), _ms(gemm & tc_no)
    tc_ms = _ms(tc_yes)
    known = gemm_tc + gemm_fp32

    with_occ = ~np.isnan(occ)
    occ_dur_ns = int(dur[with_occ].sum())
    occ_all = float((occ[with_occ] * weight[with_occ]).sum() / occ_dur_ns) if occ_dur_ns > 0 else None
    srcs = set(np.unique(src[src > 0]).tolist())
    source = _source_label(min(srcs), max(srcs)) if srcs else None

    top = sorted(range(n), key=lambda i: (-sum_ns[i], names[i]))[:top_n]
    occupancy, theoretical = weighted_mean(occ), weighted_mean(theo)
    kernels = KernelNames(
        name=[names[i] for i in top], kernel_class=[KernelClass(int(per[i] >> 32)).name for i in top],
        count=[int(count[i]) for i in top], total_ms=[float(sum_ns[i]) / NS_PER_MS for i in top],
        mean_us=[float(sum_ns[i]) / float(count[i]) / NS_PER_US for i in top],
        share_pct=[100.0 * float(sum_ns[i]) / kernel_ns if kernel_ns else 0.0 for i in top],
        occupancy_pct=[_known(occupancy[i]) for i in top],
        occupancy_source=[_source_label(int(src_min[i]), int(src_max[i])) if src_max[i] else None for i in top],
        theoretical_occupancy_pct=[_known(theoretical[i]) for i in top],
        **{c: [int(args[c][longest[i]]) if args[c][longest[i]] != -1 else None for i in top] for c in launch},
        gemm_like=[bool(gemm[i]) for i in top], tensor_core=[tensor_core[i] for i in top],
        tc_rule=[tc_rule[i] for i in top])
    return KernelStats(
        generated_kernel_pct=100.0 * _ms(generated) * NS_PER_MS / kernel_ns if kernel_ns else None,
        generated_kernel_count_pct=100.0 * int(count[generated].sum()) / len(rows),
        kernels=kernels, kernel_count=len(rows), kernel_ms=kernel_ns / NS_PER_MS,
        gemm_ms=_ms(gemm), gemm_tensor_core_ms=gemm_tc, gemm_fp32_ms=gemm_fp32,
        gemm_unknown_ms=_ms(gemm & ~tc_yes & ~tc_no),
        fp32_gemm_share_pct=100.0 * gemm_fp32 / known if known > 0 else None,
        tensor_core_ms=tc_ms, tensor_core_pct=100.0 * tc_ms * NS_PER_MS / kernel_ns if kernel_ns else None,
        occupancy_pct=occ_all, occupancy_source=source,
        occupancy_covered_pct=100.0 * occ_dur_ns / kernel_ns if kernel_ns else None)


def _known(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def _source_label(lo: int, hi: int) -> str:
    if lo == hi:
        return "trace" if lo == 1 else "computed"
    return "mixed"


def launch_occupancy(device: np.ndarray, grid_blocks: np.ndarray, block_threads: np.ndarray,
                     registers: np.ndarray, shared_memory: np.ndarray,
                     devices: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per launch: (theoretical occupancy %, estimated achieved occupancy %), NaN where the launch
    config or the device properties are missing. Formula in the module docstring."""
    n = len(device)
    theo = np.full(n, np.nan)
    achieved = np.full(n, np.nan)
    props = {int(d.get("id", i)): d for i, d in enumerate(devices or []) if isinstance(d, dict)}
    if not props:
        return theo, achieved
    only = next(iter(props.values())) if len({d.get("name") for d in props.values()}) == 1 else None
    for dev_id in np.unique(device):
        p = props.get(int(dev_id), only)
        if p is None:
            continue
        try:
            sms = int(p["numSms"])
            max_threads = int(p["maxThreadsPerMultiprocessor"])
            warp = int(p["warpSize"])
        except (KeyError, TypeError, ValueError):
            continue
        if sms <= 0 or max_threads <= 0 or warp <= 0:
            continue
        regs_sm = int(p.get("regsPerMultiprocessor") or 0)
        smem_sm = int(p.get("sharedMemPerMultiprocessor") or 0)
        if regs_sm <= 0 or smem_sm <= 0:
            continue            # e.g. ROCm: no register file size, and different occupancy rules
        sel = ((device == dev_id) & (block_threads > 0) & (grid_blocks > 0) & (registers > 0)
               & (shared_memory >= 0))
        if not sel.any():
            continue
        bt, gb = block_threads[sel], grid_blocks[sel]
        regs, smem = registers[sel], shared_memory[sel]
        major, minor = int(p.get("computeMajor", 0) or 0), int(p.get("computeMinor", 0) or 0)
        warps_per_block = -(-bt // warp)
        by_threads = max_threads // warp // warps_per_block
        regs_per_warp = -(-(regs * warp) // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
        warps_by_regs = REG_SUB_PARTITIONS * ((regs_sm // REG_SUB_PARTITIONS) // regs_per_warp)
        by_regs = warps_by_regs // warps_per_block
        reserved = SMEM_RESERVED_SM80 if major >= 8 else 0
        per_block = -(-(smem + reserved) // SMEM_ALLOC_UNIT) * SMEM_ALLOC_UNIT
        by_smem = np.where(smem > 0, smem_sm // np.maximum(per_block, 1), np.iinfo(np.int64).max)
        active = np.minimum(np.minimum(by_threads, by_regs),
                            np.minimum(by_smem, MAX_BLOCKS_PER_SM.get((major, minor), 32)))
        theo[sel] = 100.0 * active * bt / max_threads
        achieved[sel] = 100.0 * np.minimum(active, gb / sms) * bt / max_threads
    return theo, achieved
