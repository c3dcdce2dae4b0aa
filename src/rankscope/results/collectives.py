"""A rank's collectives as the map hands them to the cross-rank reduce, and what the reduce makes
of the job's collectives (docs/concepts.md "Collective").

`RankCollectives`: one rank's collective instances, columns of plain lists (part of the per-rank
summary, so of its cache format). `PackedCollectives`: the same columns as the worker sends them to
the driver (numpy int64 arrays, the two per-instance breakdown matrices zlib-compressed,
`PackedMatrix`, the unread `dtype` dropped): its own type, made once by
`analyses.rank.collectives.pack_collectives`. The reduce reads either (`Collectives`).

`CollectivesSummary`: the job's matched collectives by type and by process group, and the
alpha-beta fits (the `collectives` object of `rankscope.analysis/1`).
"""
from __future__ import annotations

from typing import Any, Union

import msgspec
import numpy as np


class RankCollectives(msgspec.Struct):
    """One rank's collective instances, sorted by arrival; parallel lists (one entry per instance).
    Times are int64 ns on this rank's own clock. `last_work_ns`: see analyses/rank/collectives.py.
    `pre_ns` / `since_step_ns`: len(BREAKDOWN_CATEGORIES) ns per instance, in that order, one
    instance after the other (`pre_matrix` / `since_step_matrix`: one row each). Unknown numbers are -1.
    Steps: the rank's step windows (step ids, start/end ns) and their exact breakdown, for
    step-time statistics and load balance across ranks. `orphan`: a kernel launched before the
    profiled window (no launch event in the trace): ranks differ in how many they have, so
    orphans without a seq are left out of order-based matching."""
    rank: int
    source: str = "none"                 # "device" (COMM kernels) | "host" (gloo spans) | "none"
    hostname: str | None = None
    world_size: int | None = None
    pg: list[str] = []
    seq: list[int] = []
    type: list[str] = []
    start_ns: list[int] = []
    end_ns: list[int] = []
    last_work_ns: list[int] = []
    in_bytes: list[int] = []
    out_bytes: list[int] = []
    group_size: list[int] = []
    dtype: list[str] = []
    step: list[int] = []            # step id, -1 outside every step
    window_start_ns: list[int] = []
    pre_ns: list[int] = []           # instance after instance
    since_step_ns: list[int] = []    # instance after instance
    steps: list[int] = []
    step_start_ns: list[int] = []
    step_end_ns: list[int] = []
    step_breakdown_ns: list[list[int]] = []   # per step, ns per BREAKDOWN_CATEGORIES
    orphan: list[bool] = []   # device kernel whose launch is not in the trace
    steps_source: str = "profiler_step"   # "profiler_step" | "whole_trace"
    # parallel layout (analyses/rank/groups.py): per instance its dimension ("" when none) and the
    # step-breakdown time it owns (`_owned_comm_ns`); per rank its groups as [dim, source, ranks...]
    dim: list[str] = []
    # critical path (analyses/job/critical_path.py): per step, the breakdown of its tail [the end of
    # its last collective, step end) (the whole step without collectives), ns per BREAKDOWN_CATEGORIES
    step_tail_ns: list[list[int]] = []
    # pipeline schedule marks (`PIPELINE_MARKS`): distinct model stages and microbatches this rank
    # ran forward, -1 without marks
    pipeline_stages: int = -1
    pipeline_microbatches: int = -1
    owned_overlapped_ns: list[int] = []
    owned_exposed_ns: list[int] = []
    groups: list[list[Any]] = []


class PackedMatrix(msgspec.Struct, frozen=True):
    """An (rows, len(BREAKDOWN_CATEGORIES)) int64 matrix, row after row, zlib-compressed (10x on
    synth ranks): read for a few straggler candidates and by the critical path only."""
    rows: int
    zlib_int64: bytes


#: The per-instance integer columns that travel as int64 arrays (a Python int costs 28 bytes and a
#: list slot, an array item 8).
PACKED_INT_COLUMNS = ("seq", "start_ns", "end_ns", "last_work_ns", "in_bytes", "out_bytes", "group_size", "step",
                      "owned_overlapped_ns", "owned_exposed_ns", "window_start_ns")


class PackedCollectives(msgspec.Struct):
    """`RankCollectives` as the worker -> driver payload carries it: the columns of `PACKED_INT_COLUMNS`
    as int64 arrays, `orphan` a bool array, the names interned (shared by every rank), `pre_ns` and
    `since_step_ns` packed, `dtype` (which the reduce does not read) left out."""
    rank: int
    source: str
    hostname: str | None
    world_size: int | None
    pg: list[str]
    seq: np.ndarray
    type: list[str]
    start_ns: np.ndarray
    end_ns: np.ndarray
    last_work_ns: np.ndarray
    in_bytes: np.ndarray
    out_bytes: np.ndarray
    group_size: np.ndarray
    step: np.ndarray
    window_start_ns: np.ndarray
    pre_ns: PackedMatrix
    since_step_ns: PackedMatrix
    steps: list[int]
    step_start_ns: list[int]
    step_end_ns: list[int]
    step_breakdown_ns: list[list[int]]
    orphan: np.ndarray
    steps_source: str
    dim: list[str]
    step_tail_ns: list[list[int]]
    pipeline_stages: int
    pipeline_microbatches: int
    owned_overlapped_ns: np.ndarray
    owned_exposed_ns: np.ndarray
    groups: list[list[Any]]


#: What the cross-rank reduce reads: a rank's collectives, packed (from a worker) or not.
Collectives = Union[RankCollectives, PackedCollectives]


class CollectiveGroupRow(msgspec.Struct, kw_only=True):
    """The matched collectives of one type and group size (`by_type`), or of one process group
    (`by_pg`): how many, their bytes, transfer and arrival skew, bandwidths, and the rank most often
    last. transfer = the shortest duration on any member (summed); skew = last start - first start;
    algbw = bytes / transfer over the collectives with known bytes; busbw: nccl-tests' factors.
    Non-finite values are None."""
    type: str | msgspec.UnsetType = msgspec.UNSET
    group_size: int | msgspec.UnsetType = msgspec.UNSET
    pg: str | msgspec.UnsetType = msgspec.UNSET
    count: int
    max_ranks: int
    total_bytes: int
    transfer_ms: float | None
    skew_mean_ms: float | None
    skew_max_ms: float | None
    algbw_gbps: float | None
    busbw_mean_gbps: float | None
    most_often_last: int | None


class AlphaBetaPoint(msgspec.Struct):
    """One distinct message size of a fit: the median measured time and the fit's prediction."""
    bytes: int
    actual_us: float
    predicted_us: float
    samples: int


class AlphaBetaFit(msgspec.Struct):
    """t = alpha + bytes / beta over the matched collectives of one type and group size."""
    type: str
    group_size: int
    samples: int
    distinct_sizes: int
    alpha_us: float                     # intercept (µs); may be < 0 when the fit is poor
    beta_gbps: float | None             # 1 / slope (GB/s = bytes/ns); None when the slope is <= 0
    busbw_gbps: float | None            # beta x nccl-tests factor
    r2: float | None
    points: list[AlphaBetaPoint] = []   # per distinct size


class CollectivesSummary(msgspec.Struct, kw_only=True):
    """The job's collectives matched across ranks (docs/concepts.md "Collective"): how many, how
    many on every member of their group, the instances no other rank has, the matching's warnings,
    the clock offsets applied (ms, by rank), per type and group size, per process group, and the
    alpha-beta fits. Without a cross-rank result: count 0 and empty lists only."""
    count: int = 0
    complete: int | msgspec.UnsetType = msgspec.UNSET
    unmatched_instances: int | msgspec.UnsetType = msgspec.UNSET
    warnings: list[str] | msgspec.UnsetType = msgspec.UNSET
    clock_offsets_ms: dict[str, float] | msgspec.UnsetType = msgspec.UNSET
    by_type: list[CollectiveGroupRow] = []
    by_pg: list[CollectiveGroupRow] | msgspec.UnsetType = msgspec.UNSET
    alpha_beta: list[AlphaBetaFit] = []
