"""Expert-parallel (MoE) load: how evenly the all_to_all dispatch spreads tokens over the ranks of
each expert-parallel group (docs/concepts.md "Expert parallel").

Per rank and per all_to_all of the step (its k-th: the dispatch, the combine, ...), the bytes it
receives in the ep dimension (`Out msg nelems` x dtype, else the first tensor of the issuing op,
which for `all_to_all_single` / `alltoall_base_` is the output), mean per step: with one expert
group per rank, what its experts are sent to compute. Per group: imbalance = the most-loaded rank's
bytes over the group's mean, % above it, in the most unequal all_to_all.
"""
from __future__ import annotations

from typing import Sequence

from rankscope.analyses.job.layout import dim_named
from rankscope.results.layout import Layout
from rankscope.results.collectives import Collectives
from rankscope.results.experts import ExpertGroup, ExpertLoad


def expert_load(ranks: Sequence[Collectives], layout: Layout) -> ExpertLoad | None:
    """The ep dimension's all_to_all load per rank and group (module docstring); None without ep
    all_to_all traffic. The k-th all_to_all of a step is one slot on every rank (dispatch, combine,
    their backward...): a group's imbalance is that of its most unequal slot, since a combine that
    hands every rank its own tokens back would hide a skewed dispatch in a total."""
    ep = dim_named(layout, "ep")
    if ep is None:
        return None
    slots: dict[int, dict[int, float]] = {}        # rank -> slot -> bytes per step
    counts = []
    for rc in ranks:
        n_steps = max(len(rc.steps), 1)
        per: dict[int, float] = {}
        seen: dict[int, int] = {}
        for d, t, st, ib, ob in zip(rc.dim, rc.type, rc.step, rc.in_bytes, rc.out_bytes):
            if d == "ep" and t == "all_to_all" and st >= 0:
                k = seen.get(int(st), 0)
                seen[int(st)] = k + 1
                per[k] = per.get(k, 0.0) + (ob if ob > 0 else max(ib, 0)) / n_steps
        if per:
            slots[rc.rank] = per
            counts.append(sum(seen.values()) / n_steps)
    if not slots:
        return None
    out = ExpertLoad(round(sum(counts) / len(counts), 2))
    for g in ep.groups:
        members = [r for r in g if r in slots]
        if len(members) < 2:
            continue
        worst = None
        for k in sorted(set.intersection(*(set(slots[r]) for r in members))):
            load = {r: slots[r][k] / 1e6 for r in members}
            mean = sum(load.values()) / len(load)
            if mean <= 0:
                continue
            hottest = max(load, key=lambda r: (load[r], -r))
            pct = 100.0 * (load[hottest] / mean - 1.0)
            if worst is None or pct > worst.imbalance_pct_over_mean:
                worst = ExpertGroup(sorted(load), {r: float(round(v, 4)) for r, v in sorted(load.items())},
                                    float(round(pct, 2)), hottest, k)
        if worst is not None:
            out.groups.append(worst)
    return out
