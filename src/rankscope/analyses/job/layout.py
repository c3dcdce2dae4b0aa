"""The job's parallel layout and its communication per dimension (docs/concepts.md "Parallel layout").

Reduce over the ranks' `RankCollectives` (analyses/rank/collectives.py), which already carry each
collective's dimension and group (analyses/rank/groups.py) and the step-breakdown time it owns:
  - `parallel_layout`: the dimensions with their size and exact rank groups, and where each comes
    from ("pg_desc": the process groups' names; "inferred": the collectives' roles);
  - `comm_by_dim`: per rank, communication ms per step per dimension, overlapped and exposed, whose
    values sum to the rank's comm_overlapped + comm_exposed (time no collective of a dimension owns
    is "other"); and the same split by collective type, for the sharding and tensor-parallel rules.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.analyses.rank.collectives import breakdown_matrix, instances, owned_ns
from rankscope.results.collectives import Collectives
from rankscope.analyses.rank.groups import LOCALITY_ORDER
from rankscope.units import NS_PER_MS
from rankscope.results.layout import Dim, DimSource, Layout, DimComm, RankDimComm

#: Outer to inner: the order dimensions are listed in (`pp 2 x dp 2 x tp 2`).
DIM_ORDER = tuple(reversed(LOCALITY_ORDER))
_OVL, _EXP = CATEGORIES.index("comm_overlapped"), CATEGORIES.index("comm_exposed")


def parallel_layout(ranks: Sequence[Collectives]) -> Layout:
    """The union of the groups the ranks report, per dimension. A dimension named by a group's
    description wins over one inferred from roles; groups of one rank are left out."""
    groups: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    sources: dict[str, set[str]] = defaultdict(set)
    for rc in ranks:
        for entry in rc.groups or []:
            name, source, members = entry[0], entry[1], tuple(int(r) for r in entry[2:])
            if len(members) >= 2:
                groups[name].add(members)
                sources[name].add(source)
    dims = []
    for name in sorted(groups, key=lambda n: DIM_ORDER.index(n) if n in DIM_ORDER else len(DIM_ORDER)):
        gs = sorted(groups[name])
        sizes = sorted({len(g) for g in gs})
        dim_source: DimSource = "pg_desc" if "pg_desc" in sources[name] else "inferred"
        dims.append(Dim(name, sizes[-1], [list(g) for g in gs], dim_source))
    return Layout(layout=" x ".join(f"{d.name} {d.size}" for d in dims), dims=dims)


def dim_named(layout: Layout, name: str) -> Dim | None:
    """The layout's dimension `name`, None when the job has none."""
    return next((d for d in layout.dims if d.name == name), None)


def comm_by_dim(ranks: Sequence[Collectives]) -> list[RankDimComm]:
    """Per rank: its communication time per dimension (module docstring)."""
    out = []
    for rc in sorted(ranks, key=lambda r: r.rank):
        n_steps = max(len(rc.steps), 1)
        per: dict[str, list[int]] = defaultdict(lambda: [0, 0])          # overlapped, exposed ns
        per_type: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        dims = list(rc.dim) if len(rc.dim) == instances(rc) else [""] * instances(rc)
        ovl, exp = owned_ns(rc)
        for d, t, o, e in zip(dims, rc.type, ovl.tolist(), exp.tolist()):
            key = d or "other"
            for v in (per[key], per_type[(key, t)]):
                v[0] += o
                v[1] += e
        bd = breakdown_matrix(rc)
        rest = [int(bd[:, _OVL].sum()) - sum(v[0] for v in per.values()),
                int(bd[:, _EXP].sum()) - sum(v[1] for v in per.values())]
        if rest[0] > 0 or rest[1] > 0:
            other = per["other"]
            other[0] += max(rest[0], 0)
            other[1] += max(rest[1], 0)

        def to_ms(v: list[int]) -> DimComm:
            return DimComm(round(float(v[0]) / NS_PER_MS / n_steps, 6), round(float(v[1]) / NS_PER_MS / n_steps, 6))

        by_type: dict[str, dict[str, DimComm]] = defaultdict(dict)
        for (d, t), v in per_type.items():
            by_type[d][t] = to_ms(v)
        step_ms = float(bd.sum()) / NS_PER_MS / n_steps if len(bd) else 0.0
        out.append(RankDimComm(rc.rank, {d: to_ms(v) for d, v in sorted(per.items(), key=lambda kv: _dim_rank(kv[0]))},
                               dict(by_type), step_ms))
    return out


def _dim_rank(name: str) -> int:
    return DIM_ORDER.index(name) if name in DIM_ORDER else len(DIM_ORDER)
