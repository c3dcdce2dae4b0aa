"""The job's pipeline (docs/concepts.md "Pipeline parallel"): its schedule, microbatches, stages and
bubble against theory. Made by analyses/job/pipeline.py."""
from __future__ import annotations

from typing import Literal

import msgspec


class Stage(msgspec.Struct):
    """One pipeline stage: its ranks, compute and bubble (ms per step), bubble share of its step."""
    stage: int
    ranks: list[int]
    compute_ms_per_step: float
    bubble_ms_per_step: float
    bubble_pct: float
    step_ms: float


PipelineSchedule = Literal["1f1b", "gpipe", "interleaved", "unknown"]


class Pipeline(msgspec.Struct):
    schedule: PipelineSchedule
    microbatches: int | None
    stages: list[Stage] = []
    bubble_pct: float = 0.0            # mean over stages
    bubble_pct_theory: float | None = None
    bottleneck_stage: int | None = None
    imbalance_pct_over_mean: float = 0.0         # bottleneck compute over the stages' mean, % above it
    balanced_step_saving_ms: float = 0.0   # step x (1 - mean / max compute)
    step_ms: float = 0.0
    stages_per_rank: int = 1           # model chunks per rank (virtual stages), from the schedule's marks
