"""Kernel launches: launch cost and delay, launch queue length per stream, memcpy/memset bandwidth
(docs/hta-parity.md).

Anchors (HTA 0.5):
  kernel_launch_stats  `TraceAnalysis.get_cuda_kernel_launch_stats` (hta/trace_analysis.py), implemented in
                       `CudaKernelAnalysis.cuda_kernel_launch_stats` and `visualize_cuda_launch_kernel_info`
                       (hta/analyzers/cuda_kernel_analysis.py).
  queue_length         `get_queue_length_time_series` / `get_queue_length_summary` / `get_time_spent_blocked_on_full_queue`
                       (`TraceCounters`, hta/analyzers/trace_counters.py).
  memory_bandwidth     `get_memory_bw_time_series` / `get_memory_bw_summary` (`TraceCounters`, same file).
All three read the events of the HTA scope (`temporal.hta_scope_mask`: like HTA, the last profiler step and device
events without a launch are left out unless `include_last_step`).

Definitions:
  launch        a host runtime/driver call named in `LAUNCH_NAMES` (with `include_memory_events`, also
                `MEMORY_LAUNCH_NAMES`) and the device event (kernel, memcpy, memset) with its correlation id.
                cpu_duration = the call's duration; gpu_duration = the device event's;
                launch_delay = device start - call end, clipped at 0.
                short kernel: cpu_duration <= runtime_cutoff and gpu_duration < cpu_duration (the launch costs
                more than the work); runtime outlier: cpu_duration > runtime_cutoff (50 µs);
                launch-delay outlier: launch_delay > launch_delay_cutoff (100 µs). Cutoffs are HTA's defaults.
  queue length  per stream, the number of operations launched and not yet started on the device: +1 at each
                launch call's start, -1 at the start of its device event (HTA's counter: it decrements when
                the operation begins executing, not when it ends). Summary statistics are taken, like HTA's,
                over the values at the change points; we add the time-weighted mean and the time spent at or
                above `CUDA_MAX_LAUNCH_QUEUE_PER_STREAM` (1024, HTA's constant: the launch call then blocks).
                At equal timestamps a device start is counted before a launch.
  memory bw     per copy kind ("Memcpy HtoD", "Memcpy DtoH", "Memcpy DtoD", ..., "Memset"), the summed
                `memory bandwidth (GB/s)` of the memcpy/memset operations running at each instant (HTA's
                counter; a zero-duration operation lasts 1 µs, as in HTA). Summary statistics over the change
                points where the counter is > 0 (HTA's); we add bytes, busy time and bytes / busy time.
Time series are downsampled to at most `SERIES_POINTS` bins per rank (all streams or kinds together):
per bin its start, the maximum and the time-weighted mean of the counter.

Differs from HTA on purpose (docs/hta-parity.md): one table of launch names for both analyses, which adds
the driver calls `cuLaunchKernel`/`cuLaunchKernelEx` and the HIP launches (HTA's launch stats know neither,
its queue length knows `cuLaunchKernel` and HIP but not `cuLaunchKernelEx`); series are per (device,
stream) where HTA keys by the stream number alone; times are exact ns.
"""
from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np
import polars as pl

from rankscope.analyses.intervals import find_sorted, sorted_unique, union
from rankscope.analyses.rank.temporal import (event_columns, first_per_id, run_bounds, scope_device_rows,
                                             scope_launch_calls)
from rankscope.analyses.rank.views import gpu_args_at, is_kind, memo, named_mask
from rankscope.model import Kind, KernelClass, RankTrace, name_codes
from rankscope.units import NS_PER_US, NS_PER_MS
from rankscope.results.rank import (DurationStats, PointStats, StreamLaunches, ShortKernel, KernelLaunchStats,
                                    StreamQueue, QueueLengthStats, CopyKindBandwidth, MemoryBandwidthStats)

#: HTA 0.5 defaults of get_cuda_kernel_launch_stats (µs).
RUNTIME_CUTOFF_US = 50.0
LAUNCH_DELAY_CUTOFF_US = 100.0
#: hta/common/constants.py: launches block when a stream has this many operations queued.
CUDA_MAX_LAUNCH_QUEUE_PER_STREAM = 1024
#: Time series budget per rank (points, all streams / kinds together).
SERIES_POINTS = 2000
#: Kernel launch calls (HTA's cuda_kernel_launch_stats names + its queue-length names + the missing ones).
LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipExtLaunchKernel",
                "runFunction - job_prep_and_submit_for_execution")
#: Asynchronous copy / set calls (HTA: include_memory_events=True; hipMemcpyWithStream from its queue length).
MEMORY_LAUNCH_NAMES = ("cudaMemcpyAsync", "cudaMemsetAsync", "hipMemcpyAsync", "hipMemsetAsync",
                       "hipMemcpyWithStream")
#: HTA 0.5's own tables, for parity checks: `cuda_kernel_launch_stats` (+ its memory calls) and
#: `TraceSymbolTable.get_runtime_launch_events_query` (queue length).
HTA_LAUNCH_STATS_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "runFunction - job_prep_and_submit_for_execution",
                          "cudaMemcpyAsync", "cudaMemsetAsync")
HTA_QUEUE_LENGTH_NAMES = ("cudaMemsetAsync", "cudaMemcpyAsync", "cudaLaunchKernel", "cudaLaunchKernelExC",
                          "cuLaunchKernel", "runFunction - job_prep_and_submit_for_execution", "hipLaunchKernel",
                          "hipExtModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpyWithStream")
TOP_N = 10


def quantiles(x: np.ndarray, fractions: Sequence[float]) -> list[float]:
    """Quantiles of `x` (not empty, float64) at these fractions: np.percentile's default linear interpolation
    between order statistics, the same numbers, from one partition and without its per-call overhead."""
    last = len(x) - 1
    at = [(int(lo), t) for lo, t in (divmod(q * last, 1.0) for q in fractions)]
    s = np.partition(x, sorted({i for lo, _ in at for i in (lo, min(lo + 1, last))}))
    out = []
    for lo, t in at:
        a, b = float(s[lo]), float(s[min(lo + 1, last)])
        out.append(b - (b - a) * (1.0 - t) if t >= 0.5 else a + (b - a) * t)
    return out


def _stats_us(x_ns: np.ndarray) -> DurationStats:
    """Statistics of int64 ns values."""
    if len(x_ns) == 0:
        return DurationStats(0, None, None, None, None, 0.0)
    x = x_ns.astype(np.float64) / NS_PER_US
    p50, p95 = quantiles(x, [0.50, 0.95])
    return DurationStats(count=int(len(x)), mean_us=float(x.mean()), p50_us=p50, p95_us=p95,
                         max_us=float(x.max()), sum_ms=float(x_ns.sum()) / NS_PER_MS)


def _point_stats(v: np.ndarray) -> PointStats:
    if len(v) == 0:
        return PointStats(0, None, None, None, None, None, None, None)
    v = v.astype(np.float64)
    p25, p50, p75, p95 = quantiles(v, [0.25, 0.50, 0.75, 0.95])
    return PointStats(count=int(len(v)), mean=float(v.mean()), min=float(v.min()), p25=p25,
                      p50=p50, p75=p75, p95=p95, max=float(v.max()))


def _time_weighted(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step function given by change points (t sorted, value v[i] from t[i] to t[i+1]):
    prefix integrals at each point, for integrals up to any time."""
    seg = np.diff(t).astype(np.float64) * v[:-1]
    return np.concatenate(([0.0], np.cumsum(seg))), v


def _integral_to(t: np.ndarray, prefix: np.ndarray, v: np.ndarray, x: np.ndarray) -> np.ndarray:
    k = np.searchsorted(t, x, side="right") - 1
    out = np.zeros(len(x), dtype=np.float64)
    ok = k >= 0
    kk = k[ok]
    out[ok] = prefix[kk] + v[kk] * (x[ok] - t[kk]).astype(np.float64)
    return out


def _downsample(t: np.ndarray, v: np.ndarray, bins: int) -> dict[str, np.ndarray]:
    """Bins over [t[0], t[-1]] of a step function: bin start, max and time-weighted mean."""
    if len(t) == 0:
        return {"start": np.zeros(0, np.int64), "max": np.zeros(0), "mean": np.zeros(0)}
    t0, t1 = int(t[0]), int(t[-1])
    bins = max(1, min(bins, len(t)))
    if t1 <= t0:
        return {"start": np.array([t0]), "max": np.array([float(v.max())]), "mean": np.array([float(v[-1])])}
    # relative to t0: epoch-ns timestamps (~1.7e18) lose their low digits in float64
    edges = t0 + np.linspace(0, t1 - t0, bins + 1).round().astype(np.int64)
    edges = sorted_unique(np.concatenate((edges, [t0, t1])))
    nb = len(edges) - 1
    prefix, vv = _time_weighted(t, v.astype(np.float64))
    integ = _integral_to(t, prefix, vv, edges)
    width = np.diff(edges).astype(np.float64)
    mean = np.diff(integ) / width
    k = np.searchsorted(t, edges[:-1], side="right") - 1          # value in force at each bin start
    mx = np.where(k >= 0, vv[np.maximum(k, 0)], 0.0)
    b = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, nb - 1)
    np.maximum.at(mx, b, vv)
    return {"start": edges[:-1], "max": mx, "mean": mean}


class _Launches(msgspec.Struct):
    """Host launch calls joined with their device events, one entry per device event (row order):
    the device event's row, device and stream, the call's start and duration, the device event's."""
    row: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    cpu_ts_ns: np.ndarray
    cpu_dur_ns: np.ndarray
    gpu_ts_ns: np.ndarray
    gpu_dur_ns: np.ndarray


def _linked_launches(trace: RankTrace, include_last_step: bool, names: tuple[str, ...]) -> _Launches:
    """The launch calls named in `names` in the HTA scope, each with its device events. Once per trace."""
    return memo(trace, ("launch", "linked", include_last_step, names),
                lambda: _link_launches(trace, include_last_step, names))


def _link_launches(trace: RankTrace, include_last_step: bool, names: tuple[str, ...]) -> _Launches:
    col = event_columns(trace)
    corr = col["correlation"]
    named = named_mask(trace, names)
    calls = scope_launch_calls(trace, include_last_step)
    calls = calls[named[calls]]
    calls = calls[first_per_id(corr[calls])]             # the first call (row order) of each correlation id
    dev = scope_device_rows(trace, include_last_step)
    call = find_sorted(corr[calls], corr[dev])
    dev, call = dev[call >= 0], calls[call[call >= 0]]
    return _Launches(row=dev, device=col["device"][dev], stream=col["stream"][dev],
                     cpu_ts_ns=col["ts_ns"][call], cpu_dur_ns=col["dur_ns"][call],
                     gpu_ts_ns=col["ts_ns"][dev], gpu_dur_ns=col["dur_ns"][dev])


def _t_ms(start_ns: np.ndarray, origin_ns: int) -> list[float]:
    """Bin starts as ms since the trace origin, to the µs (keeps shipped series small)."""
    return np.round((start_ns - origin_ns) / NS_PER_MS, 3).tolist()


def _origin(trace: RankTrace) -> int | None:
    ts = event_columns(trace)["ts_ns"]
    return int(ts.min()) if len(ts) else None


def kernel_launch_stats(trace: RankTrace, runtime_cutoff_us: float = RUNTIME_CUTOFF_US,
                        launch_delay_cutoff_us: float = LAUNCH_DELAY_CUTOFF_US,
                        include_memory_events: bool = True, include_last_step: bool = False,
                        launch_names: Sequence[str] | None = None) -> KernelLaunchStats:
    """`launch_names` replaces the launch-call table (e.g. `HTA_LAUNCH_STATS_NAMES` to reproduce HTA)."""
    result = KernelLaunchStats(runtime_cutoff_us, launch_delay_cutoff_us, include_last_step)
    if launch_names is not None:
        names = tuple(launch_names)
    else:
        names = LAUNCH_NAMES + (MEMORY_LAUNCH_NAMES if include_memory_events else ())
    j = _linked_launches(trace, include_last_step, names)
    if len(j.row) == 0:
        return result
    rc, lc = runtime_cutoff_us * NS_PER_US, launch_delay_cutoff_us * NS_PER_US
    cpu, gpu = j.cpu_dur_ns, j.gpu_dur_ns
    delay = np.maximum(j.gpu_ts_ns - j.cpu_ts_ns - cpu, 0)
    short = (cpu <= rc) & (gpu < cpu)
    runtime_outlier = cpu > rc
    delay_outlier = delay > lc
    result.launches = len(j.row)
    result.cpu_duration = _stats_us(cpu)
    result.gpu_duration = _stats_us(gpu)
    result.launch_delay = _stats_us(delay)
    result.short_kernels = int(short.sum())
    result.runtime_outliers = int(runtime_outlier.sum())
    result.launch_delay_outliers = int(delay_outlier.sum())
    order = np.lexsort((j.stream, j.device))
    bounds = run_bounds(j.device[order], j.stream[order])
    for a, b in zip(bounds[:-1], bounds[1:]):
        on = order[a:b]
        result.streams.append(StreamLaunches(
            device=int(j.device[on[0]]), stream=int(j.stream[on[0]]), launches=len(on),
            cpu_duration_mean_us=float(cpu[on].mean()) / NS_PER_US,
            gpu_duration_sum_ms=int(gpu[on].sum()) / NS_PER_MS,
            launch_delay_mean_us=float(delay[on].mean()) / NS_PER_US,
            launch_delay_p95_us=quantiles(delay[on].astype(np.float64), [0.95])[0] / NS_PER_US,
            short_kernels=int(short[on].sum()), runtime_outliers=int(runtime_outlier[on].sum()),
            launch_delay_outliers=int(delay_outlier[on].sum())))
    # per name (unnamed left out): calls and summed times, exact (sums of ns stay below 2**53)
    short_names, at = name_codes(trace.events).distinct_at(j.row[short])
    count = np.bincount(at, minlength=len(short_names))
    gpu_ns = np.bincount(at, weights=gpu[short], minlength=len(short_names))
    cpu_ns = np.bincount(at, weights=cpu[short], minlength=len(short_names))
    named = [(k, name) for k, name in enumerate(short_names) if name is not None]
    top = sorted(named, key=lambda kn: (-count[kn[0]], kn[1]))[:TOP_N]
    result.short_kernel_names = [ShortKernel(name=name, count=int(count[k]),
                                             gpu_us_total=float(gpu_ns[k]) / NS_PER_US,
                                             cpu_us_total=float(cpu_ns[k]) / NS_PER_US) for k, name in top]
    return result


class QueueSeries(msgspec.Struct):
    """Columns, one entry per bin: device, stream, t_ms (bin start since `origin_ns`), max, mean."""
    device: list[int] = []
    stream: list[int] = []
    t_ms: list[float] = []
    max: list[int] = []
    mean: list[float] = []


class QueueLength(QueueLengthStats):
    """Queue length per (device, stream) and its time series."""
    series: QueueSeries = msgspec.field(default_factory=QueueSeries)


class _QueueChanges(msgspec.Struct):
    """The per-stream queue length at each change point, sorted by device, stream, time (a device start
    before a launch at one instant)."""
    device: np.ndarray
    stream: np.ndarray
    ts_ns: np.ndarray
    queue_length: np.ndarray


def _queue_changes(trace: RankTrace, include_last_step: bool, launch_names: Sequence[str] | None) -> _QueueChanges:
    names = tuple(launch_names) if launch_names is not None else LAUNCH_NAMES + MEMORY_LAUNCH_NAMES
    j = _linked_launches(trace, include_last_step, names)
    device = np.concatenate([j.device, j.device])
    stream = np.concatenate([j.stream, j.stream])
    ts = np.concatenate([j.cpu_ts_ns, j.gpu_ts_ns])
    delta = np.repeat(np.array([1, -1], np.int64), len(j.row))      # +1 at the launch, -1 at the device start
    order = np.lexsort((delta, ts, stream, device))
    device, stream, ts, delta = device[order], stream[order], ts[order], delta[order]
    running = np.cumsum(delta)
    first = run_bounds(device, stream)[:-1]
    before_stream = np.repeat(running[first] - delta[first], np.diff(np.r_[first, len(delta)]))
    return _QueueChanges(device, stream, ts, running - before_stream)


def queue_length_changes(trace: RankTrace, include_last_step: bool = False,
                         launch_names: Sequence[str] | None = None) -> pl.DataFrame:
    """The per-stream counter at each change point: device, stream, ts_ns, queue_length (can be large)."""
    ch = _queue_changes(trace, include_last_step, launch_names)
    return pl.DataFrame({"device": ch.device, "stream": ch.stream, "ts_ns": ch.ts_ns, "queue_length": ch.queue_length},
                        schema={"device": pl.Int32, "stream": pl.Int64, "ts_ns": pl.Int64, "queue_length": pl.Int64})


def queue_length(trace: RankTrace, include_last_step: bool = False,
                 launch_names: Sequence[str] | None = None, series: bool = True) -> QueueLength:
    """`launch_names` replaces the launch-call table (e.g. `HTA_QUEUE_LENGTH_NAMES` to reproduce HTA).
    Without `series`, the time series is left empty (not computed)."""
    result = QueueLength(include_last_step, _origin(trace))
    ch = _queue_changes(trace, include_last_step, launch_names)
    if len(ch.ts_ns) == 0:
        return result
    origin = result.origin_ns
    assert origin is not None                 # the trace has events
    bounds = run_bounds(ch.device, ch.stream)
    budget = max(1, SERIES_POINTS // (len(bounds) - 1))
    for a, b in zip(bounds[:-1], bounds[1:]):
        device, stream = int(ch.device[a]), int(ch.stream[a])
        t, v = ch.ts_ns[a:b], ch.queue_length[a:b]
        # the value in force after the last change at each distinct timestamp
        last = np.append(t[1:] != t[:-1], True)
        tu, vu = t[last], v[last].astype(np.float64)
        prefix, _ = _time_weighted(tu, vu)
        span = int(tu[-1] - tu[0])
        full = vu >= CUDA_MAX_LAUNCH_QUEUE_PER_STREAM
        at_max = float(np.diff(tu)[full[:-1]].sum()) if len(tu) > 1 else 0.0
        result.streams.append(StreamQueue(
            device=device, stream=stream, points=_point_stats(v),
            time_weighted_mean=float(prefix[-1] / span) if span > 0 else None,
            time_at_max_queue_ms=at_max / NS_PER_MS))
        if not series:
            continue
        ds = _downsample(tu, vu, budget)
        n = len(ds["start"])
        result.series.device += [device] * n
        result.series.stream += [stream] * n
        result.series.t_ms += _t_ms(ds["start"], origin)
        result.series.max += ds["max"].astype(np.int64).tolist()
        result.series.mean += np.round(ds["mean"], 3).tolist()
    return result


class BandwidthSeries(msgspec.Struct):
    """Columns, one entry per bin: kind, t_ms (bin start since `origin_ns`), max, mean (GB/s)."""
    kind: list[str] = []
    t_ms: list[float] = []
    max: list[float] = []
    mean: list[float] = []


class MemoryBandwidth(MemoryBandwidthStats):
    """Memory bandwidth per copy kind and its time series."""
    series: BandwidthSeries = msgspec.field(default_factory=BandwidthSeries)


def copy_kind(name: pl.Expr) -> pl.Expr:
    """HTA's `get_memory_kernel_type`: "Memset", the first 11 characters of a Memcpy name
    ("Memcpy HtoD"), else "Memcpy Unknown"."""
    return (pl.when(name.str.starts_with("Memset")).then(pl.lit("Memset"))
            .when(name.str.starts_with("Memcpy")).then(name.str.slice(0, 11))
            .otherwise(pl.lit("Memcpy Unknown")))


def memory_bandwidth(trace: RankTrace, include_last_step: bool = False, series: bool = True) -> MemoryBandwidth:
    """Without `series`, the time series is left empty (not computed)."""
    result = MemoryBandwidth(include_last_step, _origin(trace))
    col = event_columns(trace)
    dev = scope_device_rows(trace, include_last_step)
    mem = dev[is_kind(col["kind"][dev], (Kind.MEMCPY, Kind.MEMSET))
              | (col["kclass"][dev] == int(KernelClass.MEM))]
    if len(mem) == 0:
        return result
    origin = result.origin_ns
    assert origin is not None                 # the trace has events
    args = gpu_args_at(trace, mem, ["bytes", "bandwidth_gbps"])
    bytes_, bandwidth_gbps = args["bytes"], args["bandwidth_gbps"]
    bandwidth_gbps[np.isnan(bandwidth_gbps)] = 0.0                          # unknown: -1 bytes, 0 GB/s
    # each distinct name classified once (unnamed: null), then read at each operation
    names, at = name_codes(trace.events).distinct_at(mem)
    kind_of = (pl.DataFrame({"name": pl.Series(names, dtype=pl.String)})
               .select(copy_kind(pl.col("name")))).to_series().to_numpy()[at]
    kinds = sorted(set(kind_of.tolist()))
    budget = max(1, SERIES_POINTS // len(kinds))
    for kind in kinds:
        on = kind_of == kind
        ts, dur, bw, b = col["ts_ns"][mem[on]], col["dur_ns"][mem[on]], bandwidth_gbps[on], bytes_[on]
        counter_dur = np.where(dur == 0, int(NS_PER_US), dur)    # HTA: a zero-duration operation lasts 1 µs
        t = np.concatenate([ts + counter_dur, ts])
        d = np.concatenate([-bw, bw])
        order = np.lexsort((np.concatenate([np.zeros(len(ts)), np.ones(len(ts))]), t))  # ends first at a tie
        t, d = t[order], d[order]
        v = np.cumsum(d)
        v[np.abs(v) < 1e-9] = 0.0            # float residue of + and - of the same numbers
        s, e = union(ts, ts + dur)
        busy = int((e - s).sum())
        total_bytes = int(b[b > 0].sum())
        result.kinds.append(CopyKindBandwidth(
            kind=kind, ops=int(on.sum()), bytes=total_bytes, busy_ms=busy / NS_PER_MS,
            effective_gbps=(total_bytes / busy) if busy > 0 and total_bytes > 0 else None,   # bytes/ns = GB/s
            points=_point_stats(v[v > 0])))
        if not series:
            continue
        last = np.append(t[1:] != t[:-1], True)
        ds = _downsample(t[last], v[last], budget)
        n = len(ds["start"])
        result.series.kind += [kind] * n
        result.series.t_ms += _t_ms(ds["start"], origin)
        result.series.max += np.round(ds["max"], 3).tolist()
        result.series.mean += np.round(ds["mean"], 3).tolist()
    return result
