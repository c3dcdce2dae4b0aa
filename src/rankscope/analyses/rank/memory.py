"""Memory: allocator timelines per device, and host<->device copies from pageable memory.

`memory_timeline(trace, max_points=2000, windows=None) -> MemoryTimeline`
  Source: the `[memory]` instant events (`trace.memory`), one series per (Device Type, Device Id):
  `cpu`, `cuda:0`, ... (c10 DeviceType numbers: 0 CPU, 1 CUDA — ROCm reports CUDA too).
  - allocated: the sample's `Total Allocated` (the allocator's total after the event), as in
    tb-profiler's Memory view curves (Total Allocated / Total Reserved per device). When the trace
    does not carry it (2021 Kineto format: only `Bytes`), allocated is REBUILT as the running sum
    of `Bytes` in time order, shifted up so it never goes below zero. Memory held before the
    profiling window is invisible there, so that curve is a lower bound (`allocated_source =
    "running_sum"`), and reserved is unknown.
  - reserved: the sample's `Total Reserved` (caching-allocator pool: allocated + cached free
    blocks). Known only for accelerators. The default CPU allocator reports Total Reserved = 0 (it
    keeps no pool): CPU reserved is reported unknown. CPU samples with Total Reserved > 0 come from
    another host allocator (shared-memory / pinned tensors, e.g. batches received from DataLoader
    workers) that reports its own totals; mixing them into one curve would draw false dips, so they
    are left out of the CPU curve and counted in `other_allocator_samples`.
  - peak allocated / peak reserved: maximum over the samples, at the FIRST sample that reaches it.
  - fragmentation: reserved - allocated at the peak-allocated moment (the first sample where
    allocated reaches its maximum): the cached free memory the pool held while the job needed the
    most, MB and % of the reserved memory at that moment. Judged there, not at peak reserved: after
    the peak the job frees its activations and reserved - allocated grows to most of the pool
    however well the pool served the peak.
  - capacity: `deviceProperties[id].totalGlobalMem` of the matching accelerator (None for the CPU);
    peaks as % of capacity.
  - timeline: per device at most `max_points` samples, chosen by min/max decimation in equal time
    bins (the lowest and highest allocated — and reserved — sample of every bin, plus the first and
    last sample): the envelope and both peaks are kept exactly.
  - per_step: peak allocated / reserved inside each step window (docs/concepts.md "Step").
  MB = 2**20 bytes (tb-profiler's Memory view). Times: `ts_ns` absolute (the trace's clock, to join
  with steps), `t_ms` since the trace's first event.
  Anchors: tb-profiler Memory view (pytorch/kineto tb_plugin: memory curve of Total Allocated /
  Total Reserved per device, peaks); HTA's memory timeline (`export_memory_timeline`) for the idea
  of a per-device allocated timeline; PyTorch CUDA memory notes for reserved vs allocated.

`pageable_memcpy(trace, windows=None) -> MemcpyReport`
  Device copies (`Kind.MEMCPY`) classified from their CUPTI/roctracer names: direction
  `HtoD | DtoH | DtoD | HtoH | PtoP | other` and host memory `pageable | pinned | host_unknown |
  device | other` ("Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)"; ROCm's
  "(Host -> Device)" does not say pageable or pinned: `host_unknown`). A copy from/to pageable
  memory is staged through a driver bounce buffer and is synchronous with the host: the fix
  is "Long Memcpy HtoD -> pin_memory=True" (finding `unpinned_memcpy`).
  Per (direction, host memory): count, total_ms (sum of durations), bytes (sum of the `bytes` arg;
  copies without it are counted in `bytes_missing`), mean_bandwidth_gbps = bytes / duration summed
  over the copies that have bytes (GB = 1e9, as Kineto's "memory bandwidth (GB/s)"), step_share_pct
  = time covered by these copies (union, clipped to the step windows) / total step time.
  bulk_bandwidth_gbps: the same over copies of >= 1 MiB only (small copies are latency-bound, their
  GB/s says nothing about pinning); `pinned_vs_pageable_bandwidth_ratio` compares those.
  `pageable` / `pinned` summarise the host<->device copies (HtoD + DtoH) of each kind;
  `per_step`: pageable copy time per step.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, cast

import numpy as np
import polars as pl

from rankscope.analyses.intervals import covered_between, sorted_unique, union
from rankscope.analyses.rank.steps import StepWindows, step_windows
from rankscope.analyses.rank.views import gpu_args_at, rows_of_kinds
from rankscope.model import Kind, RankTrace, name_codes
from rankscope.units import BYTES_PER_MB, NS_PER_MS
from rankscope.results.rank import (DeviceMemory, MemorySamples, StepMemoryPeaks, MemoryTimeline, CopySummary,
                                    CopyKinds, PageableSteps, MemcpyReport)

MIN_POINTS = 8

#: c10::DeviceType numbers seen in `[memory]` events -> short label.
DEVICE_TYPE_LABELS = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 20: "privateuse1"}
CPU_DEVICE_TYPE = 0


_TIMELINE_SCHEMA = {"device": pl.String, "ts_ns": pl.Int64, "t_ms": pl.Float64,
                    "allocated_mb": pl.Float64, "reserved_mb": pl.Float64}
_PER_STEP_SCHEMA = {"device": pl.String, "step": pl.Int64, "peak_allocated_mb": pl.Float64,
                    "peak_reserved_mb": pl.Float64}


def device_label(device_type: int, device_id: int) -> str:
    base = DEVICE_TYPE_LABELS.get(int(device_type), f"type{int(device_type)}")
    return base if device_type == CPU_DEVICE_TYPE or device_id < 0 else f"{base}:{int(device_id)}"


def memory_timeline(trace: RankTrace, max_points: int = 2000,
                    windows: StepWindows | None = None) -> MemoryTimeline:
    if max_points < MIN_POINTS:
        raise ValueError(f"max_points must be at least {MIN_POINTS}, got {max_points}")
    mem = trace.memory
    if mem.is_empty() or "ts_ns" not in mem.columns:
        return MemoryTimeline([], MemorySamples([], [], [], [], []), StepMemoryPeaks([], [], [], []), max_points)
    if windows is None:
        windows = step_windows(trace)
    origin = _trace_origin(trace, int(cast(int, mem["ts_ns"].min())))
    capacities = _capacities(trace)
    # time order, stable: samples at one timestamp keep the file's order (a state after each event)
    mem = mem.with_row_index("_order").sort(["ts_ns", "_order"])

    devices, timelines, per_steps = [], [], []
    for (dtype, did), part in mem.group_by(["device_type", "device_id"], maintain_order=True):
        dm, tl, ps = _one_device(part, int(dtype), int(did), origin, capacities, windows, max_points)
        if dm is not None:
            devices.append(dm)
            timelines.append(tl)
            per_steps.append(ps)
    order = sorted(range(len(devices)), key=lambda i: (devices[i].device_type != CPU_DEVICE_TYPE,
                                                       devices[i].device_type, devices[i].device_id))
    devices = [devices[i] for i in order]
    timeline = pl.concat([timelines[i] for i in order]) if devices else pl.DataFrame(schema=_TIMELINE_SCHEMA)
    per_step = pl.concat([per_steps[i] for i in order]) if devices else pl.DataFrame(schema=_PER_STEP_SCHEMA)
    return MemoryTimeline(devices, MemorySamples(**timeline.to_dict(as_series=False)),
                          StepMemoryPeaks(**per_step.to_dict(as_series=False)), max_points)


def _trace_origin(trace: RankTrace, fallback: int) -> int:
    candidates = [fallback]
    if not trace.events.is_empty():
        candidates.append(int(cast(int, trace.events["ts_ns"].min())))
    return min(candidates)


def _capacities(trace: RankTrace) -> dict[int, int]:
    out: dict[int, int] = {}
    for i, d in enumerate(trace.meta.devices or []):
        if not isinstance(d, dict):
            continue
        cap: Any = d.get("totalGlobalMem")      # as the trace wrote it
        try:
            dev_id = int(d.get("id", i))
            cap = int(cap)
        except (TypeError, ValueError):
            continue
        if cap > 0:
            out[dev_id] = cap
    return out


def _one_device(part: pl.DataFrame, dtype: int, did: int, origin: int, capacities: dict[int, int],
                windows: StepWindows, max_points: int):
    is_cpu = dtype == CPU_DEVICE_TYPE
    label = device_label(dtype, did)
    notes: list[str] = []
    other = 0
    has_totals = bool((part["total_allocated"] >= 0).all())
    if has_totals and is_cpu:
        foreign = part["total_reserved"] > 0
        other = int(foreign.sum())
        if other:
            part = part.filter(~foreign)
            notes.append(f"{other} CPU samples from another host allocator (Total Reserved > 0) left out")
    if part.is_empty():
        return None, None, None
    ts = part["ts_ns"].to_numpy()
    if has_totals:
        allocated = part["total_allocated"].to_numpy().astype(np.int64)
        source = "total_allocated"
    else:
        running = np.cumsum(part["bytes"].to_numpy().astype(np.int64))
        allocated = running - min(0, int(running.min()))
        source = "running_sum"
        notes.append("allocated rebuilt as the running sum of Bytes (trace has no Total Allocated): "
                     "memory held before the profiling window is not seen, a lower bound")
    reserved_known = has_totals and not is_cpu and bool((part["total_reserved"] >= 0).all())
    reserved = part["total_reserved"].to_numpy().astype(np.int64) if reserved_known else None
    if not reserved_known:
        notes.append("reserved unknown: " + ("the CPU allocator keeps no reserve pool" if is_cpu and has_totals
                                             else "the trace has no Total Reserved"))

    starts, ends, steps = (windows.frame[c].to_numpy() for c in ("start_ns", "end_ns", "step"))
    i_alloc = int(np.argmax(allocated))
    dm = DeviceMemory(
        device=label, device_type=dtype, device_id=did, samples=len(ts), allocated_source=source,
        reserved_known=reserved_known,
        peak_allocated_mb=float(allocated[i_alloc]) / BYTES_PER_MB, peak_allocated_ts_ns=int(ts[i_alloc]),
        peak_allocated_at_ms=(int(ts[i_alloc]) - origin) / NS_PER_MS,
        peak_allocated_step=_step_at(int(ts[i_alloc]), starts, ends, steps),
        other_allocator_samples=other, notes=notes,
    )
    capacity = capacities.get(did) if not is_cpu and did >= 0 else None
    if capacity:
        dm.capacity_mb = capacity / BYTES_PER_MB
        dm.peak_allocated_pct_of_capacity = 100.0 * float(allocated[i_alloc]) / capacity
    if reserved is not None:
        i_res = int(np.argmax(reserved))
        peak_res = int(reserved[i_res])
        dm.peak_reserved_mb = peak_res / BYTES_PER_MB
        dm.peak_reserved_ts_ns = int(ts[i_res])
        dm.peak_reserved_at_ms = (int(ts[i_res]) - origin) / NS_PER_MS
        dm.peak_reserved_step = _step_at(int(ts[i_res]), starts, ends, steps)
        res_at_peak = int(reserved[i_alloc])
        frag = max(res_at_peak - int(allocated[i_alloc]), 0)
        dm.reserved_at_peak_allocated_mb = res_at_peak / BYTES_PER_MB
        dm.fragmentation_mb = frag / BYTES_PER_MB
        dm.fragmentation_pct = 100.0 * frag / res_at_peak if res_at_peak > 0 else 0.0
        if capacity:
            dm.peak_reserved_pct_of_capacity = 100.0 * peak_res / capacity

    keep = _decimate(ts, [allocated] + ([reserved] if reserved is not None else []), max_points)
    timeline = pl.DataFrame({
        "device": pl.Series([label] * len(keep), dtype=pl.String),
        "ts_ns": ts[keep], "t_ms": (ts[keep] - origin) / NS_PER_MS,
        "allocated_mb": allocated[keep] / BYTES_PER_MB,
        "reserved_mb": (reserved[keep] / BYTES_PER_MB) if reserved is not None else np.full(len(keep), None),
    }, schema=_TIMELINE_SCHEMA)
    per_step = _per_step_peaks(label, ts, allocated, reserved, starts, ends, steps)
    return dm, timeline, per_step


def _step_at(t: int, starts: np.ndarray, ends: np.ndarray, steps: np.ndarray) -> int | None:
    if len(starts) == 0:
        return None
    i = int(np.searchsorted(starts, t, side="right")) - 1
    return int(steps[i]) if i >= 0 and t < ends[i] else None


def _per_step_peaks(label, ts, allocated, reserved, starts, ends, steps) -> pl.DataFrame:
    if len(starts) == 0:
        return pl.DataFrame(schema=_PER_STEP_SCHEMA)
    i = np.searchsorted(starts, ts, side="right") - 1
    inside = (i >= 0) & (ts < ends[np.maximum(i, 0)])
    peak_a = np.full(len(starts), -1, dtype=np.int64)
    np.maximum.at(peak_a, i[inside], allocated[inside])
    has = peak_a >= 0
    out = {"device": [label] * int(has.sum()), "step": steps[has],
           "peak_allocated_mb": peak_a[has] / BYTES_PER_MB}
    if reserved is not None:
        peak_r = np.full(len(starts), -1, dtype=np.int64)
        np.maximum.at(peak_r, i[inside], reserved[inside])
        out["peak_reserved_mb"] = peak_r[has] / BYTES_PER_MB
    else:
        out["peak_reserved_mb"] = np.full(int(has.sum()), None)
    return pl.DataFrame(out, schema=_PER_STEP_SCHEMA)


def _decimate(ts: np.ndarray, series: list[np.ndarray], max_points: int) -> np.ndarray:
    """Indices (sorted) of at most `max_points` samples: first, last, and in each of B equal time
    bins the lowest and highest sample of every series. Global extremes are bin extremes, so the
    peaks are always kept."""
    n = len(ts)
    if n <= max_points:
        return np.arange(n)
    bins_n = max(1, (max_points - 2) // (2 * len(series)))
    span = int(ts[-1] - ts[0]) + 1
    b = ((ts - ts[0]).astype(np.float64) * bins_n / span).astype(np.int64)   # float: no int64 overflow
    b = np.minimum(b, bins_n - 1)
    picks = [np.array([0, n - 1])]
    idx = np.arange(n)
    for v in series:
        order = np.lexsort((idx, v, b))             # by bin, then value, then position
        sb = b[order]
        first = np.flatnonzero(np.r_[True, sb[1:] != sb[:-1]])
        last = np.r_[first[1:] - 1, n - 1]
        picks += [order[first], order[last]]
    return sorted_unique(np.concatenate(picks))


# ----------------------------------------------------------------------------------------------
# Pageable memcpy
_DIRECTION = re.compile(r"\b(HtoD|DtoH|DtoD|HtoH|PtoP|HtoA|AtoH|AtoD|DtoA|AtoA)\b", re.IGNORECASE)
_ENDPOINTS = re.compile(r"\(\s*([A-Za-z]+)\s*->\s*([A-Za-z]+)\s*\)")
HOST_DEVICE = ("HtoD", "DtoH")
#: Copies this large are bandwidth-bound (small ones are latency-bound: their GB/s says nothing about
#: pinning), so pinned vs pageable bandwidth is compared on these only.
BULK_COPY_BYTES = 1 << 20


@lru_cache(maxsize=512)
def classify_memcpy(name: str) -> tuple[str, str]:
    """(direction, host_memory) of a device copy from its name (see module docstring)."""
    name = name or ""
    m = _DIRECTION.search(name)
    direction = next((c for c in ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP") if m and m.group(1).lower() == c.lower()),
                     m.group(1) if m else "other")
    if direction in ("DtoD", "PtoP"):
        return direction, "device"
    ends = _ENDPOINTS.search(name)
    host_side = ""
    if ends and direction in HOST_DEVICE:
        host_side = (ends.group(1) if direction == "HtoD" else ends.group(2)).lower()
    elif ends is None:
        host_side = "pageable" if "pageable" in name.lower() else "pinned" if "pinned" in name.lower() else ""
    if host_side in ("pageable", "pinned"):
        return direction, host_side
    if direction in HOST_DEVICE or direction == "HtoH":
        return direction, "host_unknown"
    return direction, "other"


_BY_KIND_SCHEMA = {"direction": pl.String, "host_memory": pl.String, "count": pl.Int64, "total_ms": pl.Float64,
                   "bytes": pl.Int64, "bytes_missing": pl.Int64, "mean_bandwidth_gbps": pl.Float64,
                   "step_share_pct": pl.Float64}


def pageable_memcpy(trace: RankTrace, windows: StepWindows | None = None) -> MemcpyReport:
    if windows is None:
        windows = step_windows(trace)
    wf = windows.frame
    w_start, w_end = wf["start_ns"].to_numpy(), wf["end_ns"].to_numpy()
    step_total_ns = int(wf["duration_ns"].sum()) if wf.height else 0

    rows = rows_of_kinds(trace, [Kind.MEMCPY])
    ts = trace.events["ts_ns"].to_numpy()[rows]
    dur = trace.events["dur_ns"].to_numpy()[rows]
    nbytes = gpu_args_at(trace, rows, ["bytes"])["bytes"]
    # each distinct name classified once (unnamed: as ""), then read at each copy
    codes = name_codes(trace.events)
    distinct, first, at = np.unique(codes.at(rows, -1), return_index=True, return_inverse=True)
    kind_of_name = [classify_memcpy(codes.name_of.get(c, "")) for c in distinct.tolist()]
    direction = np.array([d for d, _ in kind_of_name] or [""], dtype=object)[at]
    host_memory = np.array([h for _, h in kind_of_name] or [""], dtype=object)[at]

    def summarise(sel: np.ndarray) -> CopySummary:
        if not sel.any():
            return CopySummary(step_share_pct=0.0 if step_total_ns > 0 else None)
        d, b = dur[sel], nbytes[sel]
        has = b >= 0
        bw_ns = int(d[has].sum())
        s, e = union(ts[sel], ts[sel] + d)
        covered = int(covered_between(s, e, w_start, w_end).sum()) if len(w_start) else 0
        bulk = b >= BULK_COPY_BYTES
        bulk_ns = int(d[bulk].sum())
        return CopySummary(
            bulk_count=int(bulk.sum()),
            bulk_bandwidth_gbps=float(b[bulk].sum()) / bulk_ns if bulk_ns > 0 else None,
            count=int(sel.sum()), total_ms=float(d.sum()) / NS_PER_MS, bytes=int(b[has].sum()),
            bytes_missing=int((~has).sum()),
            mean_bandwidth_gbps=float(b[has].sum()) / bw_ns if bw_ns > 0 else None,
            step_share_pct=100.0 * covered / step_total_ns if step_total_ns > 0 else None)

    by_kind_rows = []
    for kind in dict.fromkeys(kind_of_name[i] for i in np.argsort(first)):   # in order of first appearance
        c = summarise((direction == kind[0]) & (host_memory == kind[1]))
        by_kind_rows.append({"direction": kind[0], "host_memory": kind[1], "count": c.count, "total_ms": c.total_ms,
                     "bytes": c.bytes, "bytes_missing": c.bytes_missing,
                     "mean_bandwidth_gbps": c.mean_bandwidth_gbps, "step_share_pct": c.step_share_pct})
    by_kind = (pl.DataFrame(by_kind_rows, schema=_BY_KIND_SCHEMA).sort("total_ms", descending=True)
               if by_kind_rows else pl.DataFrame(schema=_BY_KIND_SCHEMA))

    host_dev = np.isin(direction, list(HOST_DEVICE))
    pageable_sel = host_dev & (host_memory == "pageable")
    pageable = summarise(pageable_sel)
    pinned = summarise(host_dev & (host_memory == "pinned"))
    ratio = (pinned.bulk_bandwidth_gbps / pageable.bulk_bandwidth_gbps
             if pinned.bulk_bandwidth_gbps and pageable.bulk_bandwidth_gbps else None)
    host_total_ms = float(dur[host_dev].sum()) / NS_PER_MS if host_dev.any() else 0.0

    # per step: pageable copy time inside each window
    if len(w_start):
        s, e = union(ts[pageable_sel], ts[pageable_sel] + dur[pageable_sel])
        cov = covered_between(s, e, w_start, w_end)
        step_dur = wf["duration_ns"].to_numpy()
        per_step = pl.DataFrame({
            "step": wf["step"], "duration_ms": step_dur / NS_PER_MS, "pageable_ms": cov / NS_PER_MS,
            "pageable_share_pct": np.where(step_dur > 0, 100.0 * cov / np.maximum(step_dur, 1), 0.0)})
    else:
        per_step = pl.DataFrame(schema={"step": pl.Int64, "duration_ms": pl.Float64, "pageable_ms": pl.Float64,
                                        "pageable_share_pct": pl.Float64})
    return MemcpyReport(
        by_kind=CopyKinds(**by_kind.to_dict(as_series=False)), pageable=pageable,
        pageable_htod=summarise(pageable_sel & (direction == "HtoD")),
        pageable_dtoh=summarise(pageable_sel & (direction == "DtoH")),
        pinned=pinned, pinned_vs_pageable_bandwidth_ratio=ratio,
        pageable_pct_of_host_copy_time=100.0 * pageable.total_ms / host_total_ms if host_total_ms > 0 else None,
        step_time_ms=step_total_ns / NS_PER_MS, steps_source=windows.source,
        per_step=PageableSteps(**per_step.to_dict(as_series=False)))
