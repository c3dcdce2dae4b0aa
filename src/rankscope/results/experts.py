"""Expert-parallel load (docs/concepts.md "Expert parallel"): the MB of tokens each rank receives per
step in the ep dimension's all_to_all, per group. Made by analyses/job/experts.py."""
from __future__ import annotations

import msgspec


class ExpertGroup(msgspec.Struct):
    ranks: list[int]
    received_mb_per_step: dict[int, float]
    imbalance_pct_over_mean: float              # max over mean, % above it
    hottest_rank: int
    slot: int = 0                     # which all_to_all of the step (0: the first)


class ExpertLoad(msgspec.Struct):
    all_to_all_per_step: float        # mean per rank
    groups: list[ExpertGroup] = []
