"""The job's parallel layout (docs/concepts.md "Parallel layout"): its dimensions and their groups,
each rank's communication per dimension. Made by analyses/job/layout.py; the pipeline and the
expert load are results/pipeline.py and results/experts.py.
"""
from __future__ import annotations

from typing import Literal

import msgspec

DimName = str          # pp, dp, dp_shard, dp_replicate, tp, cp, ep, emb (or "other" in communication per dimension)


DimSource = Literal["pg_desc", "inferred"]


class Dim(msgspec.Struct):
    """One parallel dimension: its name (pp, dp, dp_shard, dp_replicate, tp, cp, ep), the size of its
    groups, the groups (global ranks), and where it comes from: the process groups' names (`pg_desc`)
    or the collectives (`inferred`)."""
    name: DimName
    size: int
    groups: list[list[int]]
    source: DimSource


class Layout(msgspec.Struct):
    """`layout`: the dimensions as text, `pp 2 x dp 2 x tp 2` ("" when the job has no dimension of
    two or more ranks)."""
    layout: str = ""
    dims: list[Dim] = []


class DimComm(msgspec.Struct):
    """One rank's communication in one dimension, ms per step (mean over its steps)."""
    overlapped: float
    exposed: float


class RankDimComm(msgspec.Struct):
    rank: int
    by_dim: dict[str, DimComm]                       # dimension (or "other") -> ms per step
    by_dim_type: dict[str, dict[str, DimComm]]       # dimension -> collective type -> ms per step
    step_ms: float                                   # mean step duration, ms

