"""One rank's merged timeline: its events on named tracks plus overlay tracks and counter series,
on the job's common clock (for the Perfetto / Chrome-trace export, render/perfetto.py).

`rank_timeline(trace, offset_ns, waits) -> RankTimeline`. Every time is int64 ns on the aligned
clock: the rank's own timestamp minus `offset_ns` (clock.py: what to subtract from this rank).

Tracks (`RankTimeline.tracks`: track id, label, sort_index, original pid/tid):
  thread N (main)     host events (CPU ops, annotations, runtime calls, ...) per original
                      (pid, tid); "main" is the training thread (breakdown.training_thread)
  stream N            device activity (kernels, memcpy, memset) per (device, stream); GPU
                      annotations and device-side syncs on `stream N annotations` / `stream N sync`
  profiler            the profiler's own span and overhead events
  steps               step windows as the step breakdown defines them (steps.step_windows)
  idle gaps           device idle gaps >= gaps.GAP_MIN_US, labelled with what the host did meanwhile
                      (dataloader / sync / host / idle_other) and the CPU op that ended the gap
                      (gaps.idle_gaps, every gap, not only the longest)
  exposed comm        COMM running with no COMP: the `comm_exposed` category of
                      breakdown.classify_timeline, contiguous segments merged
  straggler waits     per collective this rank waited in: from its own arrival to the last
                      arriver's (collectives.match_collectives `wait_ns`), named after that rank
Proper nesting: the Chrome trace format wants the slices of one track either disjoint or nested.
Real traces break it (kernels on one stream overlapping by a few ns, concurrent collectives'
waits), so `nest_lanes` moves a slice that partially overlaps an open one to a lane of its own
(track `<label> (overlap)`, `(overlap 2)`, ...), and clips it to its parent in the last lane.

Counters (`RankTimeline.counters`: counter, series, ts_ns, value; the value holds until the next
point of the same counter):
  stream N queue / length        operations launched and not yet started (launch.queue_length_changes,
                                 the whole trace)
  <copy kind> / bandwidth GB/s   summed bandwidth of the running memcpy/memset operations of that
                                 kind (HTA's memory-bandwidth counter, exact change points)
  memory <device> / allocated MB allocator total (memory.memory_timeline, <= MEMORY_POINTS samples)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import polars as pl

from rankscope.analyses.rank.breakdown import CATEGORIES, classify_timeline, training_thread
from rankscope.analyses.rank.gaps import idle_gaps
from rankscope.analyses.intervals import union
from rankscope.analyses.rank.launch import copy_kind, queue_length_changes
from rankscope.analyses.rank.memory import memory_timeline
from rankscope.analyses.rank.steps import step_windows
from rankscope.model import DEVICE_KINDS, Kind, RankTrace
from rankscope.results.timeline import RankTimeline

#: Kineto's category name for each event kind (the `cat` a Chrome-trace reader shows).
KIND_CATEGORY: dict[int, str] = {
    Kind.CPU_OP: "cpu_op", Kind.USER_ANNOTATION: "user_annotation", Kind.PYTHON_FUNCTION: "python_function",
    Kind.RUNTIME: "cuda_runtime", Kind.DRIVER: "cuda_driver", Kind.KERNEL: "kernel", Kind.MEMCPY: "gpu_memcpy",
    Kind.MEMSET: "gpu_memset", Kind.GPU_ANNOTATION: "gpu_user_annotation", Kind.SYNC: "cuda_sync",
    Kind.OVERHEAD: "overhead", Kind.TRACE: "trace", Kind.OTHER: "other",
}
#: Kinds drawn on a device stream's tracks, and the companion track of those that are not activity;
#: the profiler's own spans and overhead go on `profiler` tracks; every other kind on its host thread.
_DEVICE_SIDE = {int(k): "" for k in DEVICE_KINDS} | {int(Kind.GPU_ANNOTATION): " annotations", int(Kind.SYNC): " sync"}
_HOST, _PROFILER = "host", "profiler"
_SIDE = _DEVICE_SIDE | {int(Kind.TRACE): _PROFILER, int(Kind.OVERHEAD): _PROFILER}
OVERLAY_CATEGORY = "rankscope"
#: Lanes per track before slices are clipped to fit (lane 0 is the track itself).
MAX_LANES = 4
#: Allocator samples per device for the memory counter (min/max decimation keeps the peaks).
MEMORY_POINTS = 20_000
#: Track order inside a rank's process: steps, threads, streams, overlays.
_ORDER = {"steps": 0, "critical path": 1, "thread": 2, "stream": 3, "idle gaps": 4, "exposed comm": 5,
          "straggler waits": 6, "profiler": 7}
_ORDER_STRIDE = 1_000_000


# ----------------------------------------------------------------------------------------------
# proper nesting
def is_laminar(start: np.ndarray, end: np.ndarray) -> bool:
    """Whether the intervals [start, end) are pairwise disjoint or nested (touching counts as
    disjoint). Vectorized: the boundaries in time order form a bracket sequence; at each depth the
    k-th opening must be closed by the k-th closing of the same interval."""
    n = len(start)
    if n < 2:
        return True
    order = np.lexsort((-end, start))           # parents before children
    s, e = start[order], end[order]
    idx = np.arange(n)
    zero = e == s
    # open: (time, 1, idx); close: (time, 0 or 2 for empty intervals, -idx): at one instant closes
    # come first (innermost first), then opens, then the empty intervals close
    t = np.concatenate([s, e])
    kind = np.concatenate([np.ones(n, np.int8), np.where(zero, 2, 0).astype(np.int8)])
    tie = np.concatenate([idx, -idx])
    tok = np.lexsort((tie, kind, t))
    is_open = tok < n
    step = np.where(is_open, 1, -1)
    depth = np.cumsum(step)
    level = np.where(is_open, depth, depth + 1)
    ident = np.where(is_open, tok, tok - n)
    pos = np.arange(2 * n)
    opens = np.lexsort((pos[is_open], level[is_open]))
    closes = np.lexsort((pos[~is_open], level[~is_open]))
    return bool(np.array_equal(ident[is_open][opens], ident[~is_open][closes]))


def nest_lanes(start: np.ndarray, end: np.ndarray, max_lanes: int = MAX_LANES) -> tuple[np.ndarray, np.ndarray]:
    """Lane per interval (0 = its own track) so that each lane is properly nested, and the end
    (clipped to the enclosing interval for those that fit no lane). Greedy in (start, -end) order:
    an interval goes to the first lane where it nests in the innermost open interval or opens
    alone."""
    start = np.asarray(start, np.int64)
    end = np.asarray(end, np.int64)
    lane = np.zeros(len(start), np.int64)
    if is_laminar(start, end):
        return lane, end
    end = end.copy()
    stacks: list[list[int]] = [[] for _ in range(max_lanes)]
    order = np.lexsort((-end, start))
    for i, s, e in zip(order.tolist(), start[order].tolist(), end[order].tolist()):
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                break
            if k == max_lanes - 1:              # no lane left: clip to the open interval
                e = stack[-1]
                end[i] = e
        lane[i] = k
        stacks[k].append(e)
    return lane, end


def _nested(frames: list[pl.DataFrame], tracks: pl.DataFrame) -> tuple[list[pl.DataFrame], pl.DataFrame, int, int]:
    """Apply `nest_lanes` per track: slices on lane k > 0 move to a new track `<label> (overlap k)`
    (same original ids) placed right after its base track. Returns (frames, tracks, moved, clipped)."""
    base = {row["track"]: row for row in tracks.iter_rows(named=True)}
    extra: dict[tuple[int, int], int] = {}          # (base track, lane) -> new track id
    moved = clipped = 0
    out = []
    for f in frames:
        start = f["ts_ns"].to_numpy()
        lanes, ends = np.zeros(f.height, np.int64), start + f["dur_ns"].to_numpy()
        for part in f.select(pl.int_range(pl.len()).alias("i"), "track").partition_by("track"):
            i = part["i"].to_numpy()
            lanes[i], ends[i] = nest_lanes(start[i], ends[i])
        pick = lanes > 0
        if not pick.any():
            out.append(f)
            continue
        clipped += int((ends != start + f["dur_ns"].to_numpy()).sum())
        moved += int(pick.sum())
        track = f["track"].to_numpy().copy()
        for key in zip(track[pick].tolist(), lanes[pick].tolist()):
            extra.setdefault(key, len(base) + len(extra))
        track[pick] = [extra[key] for key in zip(track[pick].tolist(), lanes[pick].tolist())]
        out.append(f.with_columns(pl.Series("track", track), pl.Series("dur_ns", ends - start)))
    rows = [{**base[t], "track": new, "label": base[t]["label"] + (" (overlap)" if k == 1 else f" (overlap {k})"),
             "sort_index": base[t]["sort_index"] + k} for (t, k), new in extra.items()]
    if rows:
        tracks = pl.concat([tracks, pl.DataFrame(rows, schema=tracks.schema)])
    return out, tracks, moved, clipped


# ----------------------------------------------------------------------------------------------
# the rank's own events
def _event_slices(trace: RankTrace, offset_ns: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    ev = trace.events
    side = pl.col("kind").replace_strict(_SIDE, default=_HOST, return_dtype=pl.String)
    host = side.is_in([_HOST, _PROFILER])
    dev = pl.col("device").cast(pl.Int64)
    keyed = ev.select(
        side.alias("side"),
        pl.when(host | (dev < 0)).then(pl.col("pid")).otherwise(dev).alias("k_pid"),
        pl.when(host | (pl.col("stream") < 0)).then(pl.col("tid")).otherwise(pl.col("stream")).alias("k_tid"))
    keys = keyed.unique().sort("side", "k_pid", "k_tid")
    main_tid = training_thread(ev)
    host_pids = keys.filter((pl.col("side") == _HOST) & (pl.col("k_pid") >= 0))["k_pid"].n_unique()
    devices = keys.filter(~pl.col("side").is_in([_HOST, _PROFILER]))["k_pid"].n_unique()
    profilers = int((keys["side"] == _PROFILER).sum())
    labels, sort_index, n_profiler = [], [], 0
    for n, (side_label, pid, tid) in enumerate(keys.iter_rows()):
        if side_label == _PROFILER:
            n_profiler += 1
            labels.append("profiler" if profilers == 1 else f"profiler {n_profiler}")
            sort_index.append(_ORDER["profiler"] * _ORDER_STRIDE + n * MAX_LANES)
        elif side_label == _HOST:
            name = trace.meta.thread_names.get(f"{pid}/{tid}", "")
            suffix = " (main)" if tid == main_tid else (f" ({name.split('(', 1)[1]}" if "(" in name else "")
            labels.append(f"thread {tid}{suffix}" + (f" [pid {pid}]" if host_pids > 1 else ""))
            sort_index.append(_ORDER["thread"] * _ORDER_STRIDE + (0 if tid == main_tid else 1 + n) * MAX_LANES)
        else:
            labels.append((f"gpu {pid} " if devices > 1 else "") + f"stream {tid}{side_label}")
            sort_index.append(_ORDER["stream"] * _ORDER_STRIDE + n * MAX_LANES)
    tracks = pl.DataFrame({"track": np.arange(keys.height, dtype=np.int64), "label": labels,
                           "sort_index": np.asarray(sort_index, np.int64),
                           "pid": keys["k_pid"], "tid": keys["k_tid"]})
    track_of = keys.with_row_index("track").with_columns(pl.col("track").cast(pl.Int64))
    slices = pl.concat([keyed, ev], how="horizontal").join(
        track_of, on=["side", "k_pid", "k_tid"], how="left", maintain_order="left").select(
        "track", (pl.col("ts_ns") - offset_ns).alias("ts_ns"), "dur_ns", "name",
        pl.col("kind").replace_strict(KIND_CATEGORY, return_dtype=pl.String).alias("cat"),
        pl.when(pl.col("correlation") >= 0).then(pl.col("correlation")).alias("correlation"),
        pl.when(pl.col("external_id") >= 0).then(pl.col("external_id")).alias("External id"))
    return tracks, slices


# ----------------------------------------------------------------------------------------------
# overlays
def _overlay(track: int, ts_ns, dur_ns, name, **args) -> pl.DataFrame:
    return pl.DataFrame({"track": pl.Series([track] * len(ts_ns), dtype=pl.Int64),
                         "ts_ns": pl.Series(ts_ns, dtype=pl.Int64), "dur_ns": pl.Series(dur_ns, dtype=pl.Int64),
                         "name": pl.Series(name, dtype=pl.String),
                         "cat": pl.Series([OVERLAY_CATEGORY] * len(ts_ns), dtype=pl.String), **args})


def _steps(trace: RankTrace, track: int, offset_ns: int) -> pl.DataFrame:
    w = step_windows(trace).frame
    return _overlay(track, w["start_ns"] - offset_ns, w["duration_ns"],
                    [f"step {s}" for s in w["step"].to_list()], step=w["step"],
                    duration_ms=w["duration_ns"] / 1e6)


def _gaps(trace: RankTrace, track: int, offset_ns: int, timeline) -> pl.DataFrame:
    windows = step_windows(trace)
    summary = idle_gaps(trace, windows, timeline, top=np.iinfo(np.int64).max)
    start_of = dict(zip(windows.frame["step"].to_list(), windows.frame["start_ns"].to_list()))
    g = summary.top
    start = np.array([start_of[x.step] + round(x.start_in_step_ms * 1e6) for x in g], np.int64)
    dur = np.array([round(x.duration_ms * 1e6) for x in g], np.int64)
    order = np.argsort(start, kind="stable")
    pick = [g[i] for i in order]
    return _overlay(track, start[order] - offset_ns, dur[order], [f"idle: {x.host_activity}" for x in pick],
                    host_activity=[x.host_activity for x in pick],
                    launched_by=pl.Series([x.launched_by for x in pick], dtype=pl.String),
                    busy_host_op=pl.Series([x.busy_host_op for x in pick], dtype=pl.String),
                    next_device_op=[x.next_device_op for x in pick], step=[x.step for x in pick],
                    **{f"{c}_ms": [x.host_ms[c] for x in pick] for c in ("dataloader", "sync", "host", "idle_other")})


def _exposed_comm(track: int, offset_ns: int, timeline) -> pl.DataFrame:
    sel = timeline.category == CATEGORIES.index("comm_exposed")
    s, e = union(timeline.start_ns[sel], timeline.start_ns[sel] + timeline.length_ns[sel])
    return _overlay(track, s - offset_ns, e - s, ["exposed comm"] * len(s))


def _path(track: int, path: list[tuple[int, int, str, str, int]] | None) -> pl.DataFrame:
    """The job's critical path where it runs on this rank (already on the aligned clock)."""
    if not path:
        return _overlay(track, [], [], [])
    ts, dur, category, name, step = zip(*path)
    return _overlay(track, list(ts), list(dur), [f"{c}: {n}" for c, n in zip(category, name)],
                    category=list(category), step=list(step))


def _waits(track: int, waits: pl.DataFrame | None) -> pl.DataFrame:
    if waits is None or waits.is_empty():
        return _overlay(track, [], [], [])
    return _overlay(track, waits["ts_ns"], waits["dur_ns"],
                    [f"wait for rank {r}" for r in waits["last_rank"].to_list()],
                    collective=waits["type"], pg=waits["pg"], seq=waits["seq"], collective_id=waits["cid"],
                    last_rank=waits["last_rank"], step=waits["step"], wait_ms=waits["dur_ns"] / 1e6)


# ----------------------------------------------------------------------------------------------
# counters
_COUNTER_SCHEMA = {"counter": pl.String, "series": pl.String, "ts_ns": pl.Int64, "value": pl.Float64}


def _last_per_instant(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of several changes at one instant (t sorted), the value after the last."""
    last = np.append(t[1:] != t[:-1], True) if len(t) else np.zeros(0, bool)
    return t[last], v[last]


def _counter(name: str, series: str, t: np.ndarray, v: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame({"counter": [name] * len(t), "series": [series] * len(t), "ts_ns": t, "value": v},
                        schema=_COUNTER_SCHEMA)


def _queue_counters(trace: RankTrace, prefix) -> list[pl.DataFrame]:
    ch = queue_length_changes(trace, include_last_step=True)
    out = []
    for (device, stream), part in ch.group_by("device", "stream", maintain_order=True):
        t, v = _last_per_instant(part["ts_ns"].to_numpy(), part["queue_length"].to_numpy().astype(np.float64))
        out.append(_counter(f"{prefix(device)}stream {stream} queue", "length", t, v))
    return out


def running_sum(start: np.ndarray, end: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sum of `weight` over the intervals running at each instant, as change points (t, value
    from t on). An interval ending where another starts hands over without a spike."""
    t = np.concatenate([end, start])
    d = np.concatenate([-weight, weight]).astype(np.float64)
    order = np.lexsort((np.repeat([0, 1], len(start)), t))      # ends first at a tie
    t, v = t[order], np.cumsum(d[order])
    v[np.abs(v) < 1e-9] = 0.0
    return _last_per_instant(t, v)


def _bandwidth_counters(trace: RankTrace) -> list[pl.DataFrame]:
    ev = trace.events.with_row_index("row").filter(pl.col("kind").is_in([int(Kind.MEMCPY), int(Kind.MEMSET)]))
    if ev.is_empty():
        return []
    mem = ev.join(trace.gpu_args.select(pl.col("row").cast(pl.UInt32), "bandwidth_gbps"), on="row", how="left") \
        .select("ts_ns", "dur_ns", copy_kind(pl.col("name").cast(pl.String)).alias("copy"),
                pl.col("bandwidth_gbps").fill_nan(0.0).fill_null(0.0))
    out = []
    for (kind,), part in mem.group_by("copy", maintain_order=True):
        s = part["ts_ns"].to_numpy()
        t, v = running_sum(s, s + part["dur_ns"].to_numpy(), part["bandwidth_gbps"].to_numpy())
        out.append(_counter(kind, "bandwidth GB/s", t, v))
    return out


def _memory_counters(trace: RankTrace) -> list[pl.DataFrame]:
    tl = memory_timeline(trace, max_points=MEMORY_POINTS).timeline
    samples = pl.DataFrame({"device": tl.device, "ts_ns": tl.ts_ns, "allocated_mb": tl.allocated_mb},
                           schema={"device": pl.String, "ts_ns": pl.Int64, "allocated_mb": pl.Float64})
    return [_counter(f"memory {dev}", "allocated MB", part["ts_ns"].to_numpy(), part["allocated_mb"].to_numpy())
            for (dev,), part in samples.group_by("device", maintain_order=True)]


# ----------------------------------------------------------------------------------------------
def rank_timeline(trace: RankTrace, offset_ns: int = 0, waits: pl.DataFrame | None = None,
                  path: list | None = None) -> RankTimeline:
    """The rank's events and overlays on named tracks, and its counters (module docstring).
    `waits`: this rank's `collective_waits`; `path`: the job's critical path on this rank
    (`critical_path.path_slices`); both already on the aligned clock."""
    tracks, events = _event_slices(trace, offset_ns)
    windows = step_windows(trace)
    w = windows.frame
    timeline = classify_timeline(trace, [w["start_ns"].to_numpy(), w["end_ns"].to_numpy()])
    first = tracks.height
    overlay_names = ["steps", "critical path", "idle gaps", "exposed comm", "straggler waits"]
    ids = {name: first + i for i, name in enumerate(overlay_names)}
    overlays = [_steps(trace, ids["steps"], offset_ns), _path(ids["critical path"], path),
                _gaps(trace, ids["idle gaps"], offset_ns, timeline),
                _exposed_comm(ids["exposed comm"], offset_ns, timeline), _waits(ids["straggler waits"], waits)]
    tracks = pl.concat([tracks, pl.DataFrame({
        "track": [ids[n] for n in overlay_names], "label": overlay_names,
        "sort_index": [_ORDER[n] * _ORDER_STRIDE for n in overlay_names],
        "pid": [-1] * len(overlay_names), "tid": [-1] * len(overlay_names)}, schema=tracks.schema)])
    slices, tracks, moved, clipped = _nested([events] + overlays, tracks)
    used = set().union(*(set(f["track"].unique().to_list()) for f in slices))
    tracks = tracks.filter(pl.col("track").is_in(list(used)))

    devices = trace.events.filter(pl.col("kind").is_in([int(k) for k in DEVICE_KINDS]))["device"].n_unique()
    parts = (_queue_counters(trace, lambda d: f"gpu {d} " if devices > 1 else "")
             + _bandwidth_counters(trace) + _memory_counters(trace))
    counters = pl.concat(parts) if parts else pl.DataFrame(schema=_COUNTER_SCHEMA)
    counters = counters.with_columns(pl.col("ts_ns") - offset_ns)
    notes = []
    if moved:
        notes.append(f"{moved} slices overlapped others on their track partially: moved to '(overlap)' tracks"
                     + (f", {clipped} clipped" if clipped else ""))
    return RankTimeline(trace.rank, offset_ns, tracks, slices, counters, moved, clipped, notes)


def job_origin_ns(spans: Sequence[tuple[int, int] | None], offsets_ns: Sequence[int]) -> int:
    """The earliest aligned timestamp of the ranks (span start minus offset): the export's time 0."""
    starts = [s[0] - o for s, o in zip(spans, offsets_ns) if s]
    return min(starts) if starts else 0
