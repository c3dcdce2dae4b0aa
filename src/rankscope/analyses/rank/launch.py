"""Kernel launches: launch cost and delay, launch queue length per stream, memcpy/memset bandwidth
(docs/hta-parity.md).

Anchors (HTA 0.5):
  kernel_launch_stats  `TraceAnalysis.get_cuda_kernel_launch_stats` (hta/trace_analysis.py), implemented in
                       `CudaKernelAnalysis.cuda_kernel_launch_stats` and `visualize_cuda_launch_kernel_info`
                       (hta/analyzers/cuda_kernel_analysis.py).
  queue_length         `get_queue_length_time_series` / `get_queue_length_summary` / `get_time_spent_blocked_on_full_queue`
                       (`TraceCounters`, hta/analyzers/trace_counters.py).
  memory_bandwidth     `get_memory_bw_time_series` / `get_memory_bw_summary` (`TraceCounters`, same file).
All three read the events of the HTA scope (`temporal.hta_scope`: like HTA, the last profiler step and device
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

from rankscope.analyses.intervals import sorted_unique, union
from rankscope.analyses.rank import views
from rankscope.analyses.rank.temporal import hta_scope
from rankscope.model import DEVICE_KINDS, Kind, KernelClass, RankTrace
from rankscope.units import NS_PER_US, NS_PER_MS

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
_DEVICE = [int(k) for k in DEVICE_KINDS]
_HOST_CALLS = [int(Kind.RUNTIME), int(Kind.DRIVER)]


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


def _stats_us(x_ns: np.ndarray) -> DurationStats:
    """Statistics of int64 ns values."""
    if len(x_ns) == 0:
        return DurationStats(0, None, None, None, None, 0.0)
    x = x_ns.astype(np.float64) / NS_PER_US
    p50, p95 = np.percentile(x, [50, 95])
    return DurationStats(count=int(len(x)), mean_us=float(x.mean()), p50_us=float(p50), p95_us=float(p95),
                         max_us=float(x.max()), sum_ms=float(x_ns.sum()) / NS_PER_MS)


def _point_stats(v: np.ndarray) -> PointStats:
    if len(v) == 0:
        return PointStats(0, None, None, None, None, None, None, None)
    v = v.astype(np.float64)
    q = np.percentile(v, [25, 50, 75, 95])
    return PointStats(count=int(len(v)), mean=float(v.mean()), min=float(v.min()), p25=float(q[0]),
                      p50=float(q[1]), p75=float(q[2]), p95=float(q[3]), max=float(v.max()))


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


def _linked_launches(trace: RankTrace, include_last_step: bool, names: list[str]) -> pl.DataFrame:
    """Host launch calls named in `names` joined with their device events (one row per device
    event), in HTA's event scope; made once per trace for the launch statistics and the queue length."""
    def make() -> pl.DataFrame:
        ev = hta_scope(trace, include_last_step)
        calls = ev.filter(pl.col("kind").is_in(_HOST_CALLS) & (pl.col("correlation") >= 0)
                          & pl.col("name").is_in(names))
        dev = ev.filter(pl.col("kind").is_in(_DEVICE) & (pl.col("correlation") >= 0))
        return (calls.filter(pl.col("correlation").is_first_distinct())
                .select("correlation", pl.col("ts_ns").alias("cpu_ts_ns"), pl.col("dur_ns").alias("cpu_dur_ns"),
                        pl.col("name").cast(pl.String).alias("launch_name"))
                .join(dev.select("correlation", "row", "device", "stream", pl.col("ts_ns").alias("gpu_ts_ns"),
                                 pl.col("dur_ns").alias("gpu_dur_ns"), pl.col("name").cast(pl.String).alias("kernel")),
                      on="correlation", how="inner"))
    return views.memo(trace, ("launch.linked", include_last_step, tuple(names)), make)


def _t_ms(start_ns: np.ndarray, origin_ns: int) -> list[float]:
    """Bin starts as ms since the trace origin, to the µs (keeps shipped series small)."""
    return np.round((start_ns - origin_ns) / NS_PER_MS, 3).tolist()


def _origin(trace: RankTrace) -> int | None:
    ev = trace.events
    return None if ev.is_empty() else int(ev["ts_ns"].min())


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
    cpu_duration: DurationStats = msgspec.field(default_factory=lambda: _stats_us(np.zeros(0, np.int64)))
    gpu_duration: DurationStats = msgspec.field(default_factory=lambda: _stats_us(np.zeros(0, np.int64)))
    launch_delay: DurationStats = msgspec.field(default_factory=lambda: _stats_us(np.zeros(0, np.int64)))
    short_kernels: int = 0
    runtime_outliers: int = 0
    launch_delay_outliers: int = 0
    streams: list[StreamLaunches] = []
    short_kernel_names: list[ShortKernel] = []


def kernel_launch_stats(trace: RankTrace, runtime_cutoff_us: float = RUNTIME_CUTOFF_US,
                        launch_delay_cutoff_us: float = LAUNCH_DELAY_CUTOFF_US,
                        include_memory_events: bool = True, include_last_step: bool = False,
                        launch_names: Sequence[str] | None = None) -> KernelLaunchStats:
    """`launch_names` replaces the launch-call table (e.g. `HTA_LAUNCH_STATS_NAMES` to reproduce HTA)."""
    result = KernelLaunchStats(runtime_cutoff_us, launch_delay_cutoff_us, include_last_step)
    if launch_names is not None:
        names = list(launch_names)
    else:
        names = list(LAUNCH_NAMES) + (list(MEMORY_LAUNCH_NAMES) if include_memory_events else [])
    j = _linked_launches(trace, include_last_step, names)
    if j.is_empty():
        return result
    rc, lc = runtime_cutoff_us * NS_PER_US, launch_delay_cutoff_us * NS_PER_US
    j = j.with_columns(
        (pl.col("gpu_ts_ns") - pl.col("cpu_ts_ns") - pl.col("cpu_dur_ns")).clip(lower_bound=0).alias("delay_ns"))
    j = j.with_columns(
        ((pl.col("cpu_dur_ns") <= rc) & (pl.col("gpu_dur_ns") < pl.col("cpu_dur_ns"))).alias("short"),
        (pl.col("cpu_dur_ns") > rc).alias("runtime_outlier"),
        (pl.col("delay_ns") > lc).alias("delay_outlier"))
    result.launches = j.height
    result.cpu_duration = _stats_us(j["cpu_dur_ns"].to_numpy())
    result.gpu_duration = _stats_us(j["gpu_dur_ns"].to_numpy())
    result.launch_delay = _stats_us(j["delay_ns"].to_numpy())
    result.short_kernels = int(j["short"].sum())
    result.runtime_outliers = int(j["runtime_outlier"].sum())
    result.launch_delay_outliers = int(j["delay_outlier"].sum())
    per = (j.group_by("device", "stream")
           .agg(pl.len().alias("launches"),
                (pl.col("cpu_dur_ns").mean() / NS_PER_US).alias("cpu_duration_mean_us"),
                (pl.col("gpu_dur_ns").sum() / NS_PER_MS).alias("gpu_duration_sum_ms"),
                (pl.col("delay_ns").mean() / NS_PER_US).alias("launch_delay_mean_us"),
                (pl.col("delay_ns").cast(pl.Float64).quantile(0.95, "linear") / NS_PER_US).alias("launch_delay_p95_us"),
                pl.col("short").sum().alias("short_kernels"),
                pl.col("runtime_outlier").sum().alias("runtime_outliers"),
                pl.col("delay_outlier").sum().alias("launch_delay_outliers"))
           .sort("device", "stream"))
    result.streams = [StreamLaunches(**r) for r in per.to_dicts()]
    short = (j.filter("short").group_by("kernel")
             .agg(pl.len().alias("count"), (pl.col("gpu_dur_ns").sum() / NS_PER_US).alias("gpu_us_total"),
                  (pl.col("cpu_dur_ns").sum() / NS_PER_US).alias("cpu_us_total"))
             .sort(["count", "kernel"], descending=[True, False]).head(TOP_N))
    result.short_kernel_names = [ShortKernel(**r) for r in short.rename({"kernel": "name"}).to_dicts()]
    return result


# ------------------------------------------------------------------------------------------------
# queue length
class StreamQueue(msgspec.Struct):
    """One (device, stream): HTA's summary over the change points, time-weighted mean, time at the maximum."""
    device: int
    stream: int
    points: PointStats
    time_weighted_mean: float | None
    time_at_max_queue_ms: float


class QueueSeries(msgspec.Struct):
    """Columns, one entry per bin: device, stream, t_ms (bin start since `origin_ns`), max, mean."""
    device: list[int] = []
    stream: list[int] = []
    t_ms: list[float] = []
    max: list[int] = []
    mean: list[float] = []


class QueueLengthStats(msgspec.Struct):
    """Queue length per (device, stream), without the time series."""
    include_last_step: bool
    origin_ns: int | None = None
    streams: list[StreamQueue] = []


class QueueLength(QueueLengthStats):
    """Queue length per (device, stream) and its time series."""
    series: QueueSeries = msgspec.field(default_factory=QueueSeries)


def queue_length_changes(trace: RankTrace, include_last_step: bool = False,
                         launch_names: Sequence[str] | None = None) -> pl.DataFrame:
    """The per-stream counter at each change point: device, stream, ts_ns, queue_length (can be large)."""
    names = list(launch_names) if launch_names is not None else list(LAUNCH_NAMES) + list(MEMORY_LAUNCH_NAMES)
    j = _linked_launches(trace, include_last_step, names)
    if j.is_empty():
        return pl.DataFrame(schema={"device": pl.Int32, "stream": pl.Int64, "ts_ns": pl.Int64,
                                    "queue_length": pl.Int64})
    ups = j.select("device", "stream", pl.col("cpu_ts_ns").alias("ts_ns"), pl.lit(1, pl.Int64).alias("delta"))
    downs = j.select("device", "stream", pl.col("gpu_ts_ns").alias("ts_ns"), pl.lit(-1, pl.Int64).alias("delta"))
    return (pl.concat([ups, downs]).sort("device", "stream", "ts_ns", "delta", maintain_order=True)
            .with_columns(pl.col("delta").cum_sum().over("device", "stream").alias("queue_length"))
            .select("device", "stream", "ts_ns", "queue_length"))


def queue_length(trace: RankTrace, include_last_step: bool = False,
                 launch_names: Sequence[str] | None = None) -> QueueLength:
    """`launch_names` replaces the launch-call table (e.g. `HTA_QUEUE_LENGTH_NAMES` to reproduce HTA)."""
    result = QueueLength(include_last_step, _origin(trace))
    ch = queue_length_changes(trace, include_last_step, launch_names)
    if ch.is_empty():
        return result
    keys = ch.select("device", "stream").unique().sort("device", "stream").rows()
    budget = max(1, SERIES_POINTS // len(keys))
    for device, stream in keys:
        s = ch.filter((pl.col("device") == device) & (pl.col("stream") == stream))
        t = s["ts_ns"].to_numpy()
        v = s["queue_length"].to_numpy()
        # the value in force after the last change at each distinct timestamp
        last = np.append(t[1:] != t[:-1], True)
        tu, vu = t[last], v[last].astype(np.float64)
        prefix, _ = _time_weighted(tu, vu)
        span = int(tu[-1] - tu[0])
        full = vu >= CUDA_MAX_LAUNCH_QUEUE_PER_STREAM
        at_max = float(np.diff(tu)[full[:-1]].sum()) if len(tu) > 1 else 0.0
        result.streams.append(StreamQueue(
            device=int(device), stream=int(stream), points=_point_stats(v),
            time_weighted_mean=float(prefix[-1] / span) if span > 0 else None,
            time_at_max_queue_ms=at_max / NS_PER_MS))
        ds = _downsample(tu, vu, budget)
        n = len(ds["start"])
        result.series.device += [int(device)] * n
        result.series.stream += [int(stream)] * n
        result.series.t_ms += _t_ms(ds["start"], result.origin_ns)
        result.series.max += ds["max"].astype(np.int64).tolist()
        result.series.mean += np.round(ds["mean"], 3).tolist()
    return result


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


class BandwidthSeries(msgspec.Struct):
    """Columns, one entry per bin: kind, t_ms (bin start since `origin_ns`), max, mean (GB/s)."""
    kind: list[str] = []
    t_ms: list[float] = []
    max: list[float] = []
    mean: list[float] = []


class MemoryBandwidthStats(msgspec.Struct):
    """Memory bandwidth per copy kind, without the time series."""
    include_last_step: bool
    origin_ns: int | None = None
    kinds: list[CopyKindBandwidth] = []


class MemoryBandwidth(MemoryBandwidthStats):
    """Memory bandwidth per copy kind and its time series."""
    series: BandwidthSeries = msgspec.field(default_factory=BandwidthSeries)


def copy_kind(name: pl.Expr) -> pl.Expr:
    """HTA's `get_memory_kernel_type`: "Memset", the first 11 characters of a Memcpy name
    ("Memcpy HtoD"), else "Memcpy Unknown"."""
    return (pl.when(name.str.starts_with("Memset")).then(pl.lit("Memset"))
            .when(name.str.starts_with("Memcpy")).then(name.str.slice(0, 11))
            .otherwise(pl.lit("Memcpy Unknown")))


def memory_bandwidth(trace: RankTrace, include_last_step: bool = False) -> MemoryBandwidth:
    result = MemoryBandwidth(include_last_step, _origin(trace))
    ev = hta_scope(trace, include_last_step)
    mem = ev.filter(pl.col("kind").is_in(_DEVICE)
                    & (pl.col("kind").is_in([int(Kind.MEMCPY), int(Kind.MEMSET)])
                       | (pl.col("kclass") == int(KernelClass.MEM))))
    if mem.is_empty():
        return result
    args = trace.gpu_args.select(pl.col("row").cast(pl.UInt32), "bytes", "bandwidth_gbps")
    mem = (mem.select("row", "ts_ns", "dur_ns", copy_kind(pl.col("name").cast(pl.String)).alias("kind"))
           .join(args, on="row", how="left")
           .with_columns(pl.col("bandwidth_gbps").fill_nan(0.0).fill_null(0.0),
                         pl.col("bytes").fill_null(-1),
                         # HTA: a zero-duration operation lasts 1 µs in the counter
                         pl.when(pl.col("dur_ns") == 0).then(pl.lit(int(NS_PER_US), pl.Int64))
                         .otherwise(pl.col("dur_ns")).alias("counter_dur_ns")))
    kinds = sorted(mem["kind"].unique().to_list())
    budget = max(1, SERIES_POINTS // len(kinds))
    for kind in kinds:
        m = mem.filter(pl.col("kind") == kind)
        ts = m["ts_ns"].to_numpy()
        bw = m["bandwidth_gbps"].to_numpy()
        t = np.concatenate([ts + m["counter_dur_ns"].to_numpy(), ts])
        d = np.concatenate([-bw, bw])
        order = np.lexsort((np.concatenate([np.zeros(len(ts)), np.ones(len(ts))]), t))  # ends first at a tie
        t, d = t[order], d[order]
        v = np.cumsum(d)
        v[np.abs(v) < 1e-9] = 0.0            # float residue of + and - of the same numbers
        s, e = union(ts, ts + m["dur_ns"].to_numpy())
        busy = int((e - s).sum())
        b = m["bytes"].to_numpy()
        total_bytes = int(b[b > 0].sum())
        last = np.append(t[1:] != t[:-1], True)
        ds = _downsample(t[last], v[last], budget)
        result.kinds.append(CopyKindBandwidth(
            kind=kind, ops=int(m.height), bytes=total_bytes, busy_ms=busy / NS_PER_MS,
            effective_gbps=(total_bytes / busy) if busy > 0 and total_bytes > 0 else None,   # bytes/ns = GB/s
            points=_point_stats(v[v > 0])))
        n = len(ds["start"])
        result.series.kind += [kind] * n
        result.series.t_ms += _t_ms(ds["start"], result.origin_ns)
        result.series.max += np.round(ds["max"], 3).tolist()
        result.series.mean += np.round(ds["mean"], 3).tolist()
    return result
