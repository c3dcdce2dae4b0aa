"""Expert-parallel (MoE) load: how evenly the all_to_all dispatch spreads tokens over the ranks of
each expert-parallel group (docs/concepts.md "Expert parallel").

Per rank, the bytes it receives per step in the ep dimension's all_to_all (`Out msg nelems` x
dtype, else the first tensor of the issuing op, which for `all_to_all_single` / `alltoall_base_` is
the output): with one expert group per rank, what its experts are sent to compute. Per group:
imbalance = the most-loaded rank's bytes over the group's mean, % above it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from rankscope.analyses.job.layout import Layout
from rankscope.analyses.rank.collectives import RankCollectives


@dataclass
class ExpertGroup:
    ranks: list[int]
    received_mb_per_step: dict[int, float]
    imbalance_pct: float              # max over mean, % above it
    hottest_rank: int


@dataclass
class ExpertLoad:
    all_to_all_per_step: float        # mean per rank
    groups: list[ExpertGroup] = field(default_factory=list)

    @property
    def worst(self) -> ExpertGroup | None:
        return max(self.groups, key=lambda g: g.imbalance_pct, default=None)


def expert_load(ranks: Sequence[RankCollectives], layout: Layout) -> ExpertLoad | None:
    """The ep dimension's all_to_all load per rank and group (module docstring); None without ep
    all_to_all traffic."""
    ep = layout.dim("ep")
    if ep is None:
        return None
    received, counts = {}, []
    for rc in ranks:
        n_steps = max(len(rc.steps), 1)
        total, count = 0, 0
        for d, t, st, ib, ob in zip(rc.dim, rc.type, rc.step, rc.in_bytes, rc.out_bytes):
            if d == "ep" and t == "all_to_all" and st >= 0:
                total += ob if ob > 0 else max(ib, 0)
                count += 1
        if count:
            received[rc.rank] = total / n_steps / 1e6
            counts.append(count / n_steps)
    if not received:
        return None
    out = ExpertLoad(round(sum(counts) / len(counts), 2))
    for g in ep.groups:
        load = {r: received[r] for r in g if r in received}
        if len(load) < 2:
            continue
        mean = sum(load.values()) / len(load)
        hottest = max(load, key=lambda r: (load[r], -r))
        out.groups.append(ExpertGroup(sorted(load), {r: round(v, 4) for r, v in sorted(load.items())},
                                      round(100.0 * (load[hottest] / mean - 1.0), 2) if mean > 0 else 0.0, hottest))
    return out
