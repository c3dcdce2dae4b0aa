"""DataLoader share of step time, and what the trace says about the DataLoader's workers.

`dataloader_share(trace, windows=None) -> DataLoaderShare`
  - DataLoader time of a step: the length of the union of the host spans named
    `enumerate(DataLoader)#<Iterator>.__next__` (`model.DATALOADER_PATTERN`; CPU op or user
    annotation, any thread), clipped to the step window (docs/concepts.md "Step"). This is the
    host waiting for the next batch: the `dataloader` category of the step breakdown when
    the device is idle meanwhile, and tb-profiler's "DataLoader" slice of the Overview step-time
    breakdown (which also takes these spans).
  - share_pct of a step = DataLoader time / step duration. Per rank: `share_pct` weighted by time
    (sum of DataLoader time / sum of step durations) and `mean_step_share_pct` (mean of the
    per-step shares). The first profiled step of a multi-process DataLoader can include the
    workers' warm-up (prefetch of the first batches): it is reported like any other step.
  - workers: the iterator class in the span name says whether the DataLoader runs in-process
    (`_SingleProcessDataLoaderIter`: num_workers == 0, exact) or in worker processes
    (`_MultiProcessingDataLoaderIter`: num_workers > 0). Worker processes are separate processes
    that the profiler does not trace, so their count is not in a Kineto trace: `num_workers` is
    None then (`multiprocessing=True`). `pin_memory_ops` counts `aten::pin_memory` /
    `aten::_pin_memory` ops (the pin-memory thread of `pin_memory=True`).
  Anchors: docs/concepts.md step breakdown (`dataloader`); tb-profiler Overview "DataLoader" and its
  recommendation "DataLoader time is high -> num_workers > 0".
"""
from __future__ import annotations

import re

import numpy as np
import polars as pl

from rankscope.analyses.intervals import covered_between, union
from rankscope.analyses.rank.steps import StepWindows, step_windows
from rankscope.analyses.rank.views import event_end_ns, kind_mask, name_mask
from rankscope.model import DATALOADER_PATTERN, HOST_OP_KINDS, RankTrace
from rankscope.units import NS_PER_MS
from rankscope.results.rank import DataLoaderSteps, DataLoaderShare

SINGLE_PROCESS_ITER = "_SingleProcessDataLoaderIter"
MULTI_PROCESS_ITER = "_MultiProcessingDataLoaderIter"
_ITERATOR = re.compile(r"^enumerate\(DataLoader\)#([^.]+)\.__next__")
PIN_MEMORY_OPS = ("aten::pin_memory", "aten::_pin_memory")


def dataloader_span_rows(trace: RankTrace) -> np.ndarray:
    """The rows of the host `enumerate(DataLoader)#...__next__` spans (not their gpu_user_annotation
    mirrors), ascending."""
    return np.flatnonzero(kind_mask(trace, HOST_OP_KINDS) & name_mask(trace, DATALOADER_PATTERN))


def dataloader_share(trace: RankTrace, windows: StepWindows | None = None) -> DataLoaderShare:
    if windows is None:
        windows = step_windows(trace)
    wf = windows.frame
    spans = dataloader_span_rows(trace)
    ts = trace.events["ts_ns"].to_numpy()[spans]
    u_s, u_e = union(ts, event_end_ns(trace)[spans])

    starts, ends = wf["start_ns"].to_numpy(), wf["end_ns"].to_numpy()
    dur = wf["duration_ns"].to_numpy()
    inside = covered_between(u_s, u_e, starts, ends) if len(starts) else np.zeros(0, np.int64)
    # spans per step: by start time (a span starting before a window but reaching into it is counted
    # in the window it starts in)
    k = np.searchsorted(starts, ts, side="right") - 1
    ok = (k >= 0) & (ts < ends[np.maximum(k, 0)]) if len(starts) else np.zeros(len(ts), bool)
    counts = np.bincount(k[ok], minlength=len(starts)) if len(starts) else np.zeros(0, np.int64)
    share = np.where(dur > 0, 100.0 * inside / np.maximum(dur, 1), 0.0)
    steps = DataLoaderSteps(step=wf["step"].to_list(), duration_ms=(dur / NS_PER_MS).tolist(),
                            dataloader_ms=(inside / NS_PER_MS).tolist(), share_pct=share.tolist(),
                            spans=counts.tolist())

    total_dl = int(inside.sum())
    total_steps = int(dur.sum())
    total_union = int((u_e - u_s).sum())
    dl_names = trace.events["name"].gather(spans).unique().cast(pl.String).to_list()
    iterators = sorted({m.group(1) for n in dl_names if n and (m := _ITERATOR.match(n))})
    if not len(spans):
        mp, workers, source = None, None, "none"
    elif any(MULTI_PROCESS_ITER in it for it in iterators):
        mp, workers, source = True, None, "unknown"
    elif iterators and all(it == SINGLE_PROCESS_ITER for it in iterators):
        mp, workers, source = False, 0, "iterator_class"
    else:
        mp, workers, source = None, None, "unknown"
    pin_pattern = "^(" + "|".join(re.escape(n) for n in PIN_MEMORY_OPS) + ")$"
    pin_ops = int(name_mask(trace, pin_pattern).sum())
    return DataLoaderShare(
        steps=steps, steps_source=windows.source, spans=len(spans),
        dataloader_ms=total_dl / NS_PER_MS, step_time_ms=total_steps / NS_PER_MS,
        share_pct=100.0 * total_dl / total_steps if total_steps > 0 else None,
        mean_step_share_pct=float(share.mean()) if len(share) else None,
        max_step_share_pct=float(share.max()) if len(share) else None,
        outside_steps_ms=max(total_union - total_dl, 0) / NS_PER_MS,
        iterators=iterators, multiprocessing=mp, num_workers=workers, num_workers_source=source,
        pin_memory_ops=pin_ops)
