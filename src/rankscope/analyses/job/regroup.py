"""Unnamed process groups given to the dimensions the ranks' collectives show, in any mesh order
(docs/concepts.md "Parallel layout").

Each rank gives its unnamed groups to the roles of its collectives by locality (closest-together
group to the innermost dimension: `groups.assign_unnamed`). That holds for Megatron's and
torchtitan's mesh orders only: a (dp, pp, tp) mesh has its pipeline groups closer together than
its data-parallel ones. Across ranks the traces say which ranks work together: the members of a
group finish each of its collectives together (the last arrival releases them all), and a
pipeline send ends with its peer's receive. So, before collectives are matched, each
assignment of the inferred dimensions to the partitions of ranks they were given is scored by how
closely the instances of each dimension end on the other members of each rank's group (the
median distance, in ns, from an instance's end to the nearest end of a same-type instance on
them; a send's to a receive's), and the assignment with the least product of these distances
wins. Named dimensions (`pg_desc`) and world-sized groups are left as they are.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Sequence

import numpy as np

from rankscope.results.collectives import Collectives

_COUNTERPART = {"send": "recv", "recv": "send"}


def regroup_unnamed(ranks: Sequence[Collectives]) -> dict[str, list[tuple[int, ...]]]:
    """Give the inferred dimensions of unnamed groups the partitions their collectives' ends agree
    with, in place (instances' `pg` / `group_size`, the ranks' `groups`); returns the dimensions
    that changed groups (dimension -> its groups now), {} when none did."""
    world = next((rc.world_size for rc in ranks if rc.world_size), None)
    assigned: dict[str, dict[int, tuple[int, ...]]] = defaultdict(dict)
    for rc in ranks:
        for entry in rc.groups or []:
            members = tuple(int(r) for r in entry[2:])
            if entry[1] == "inferred" and 2 <= len(members) and len(members) != world:
                assigned[entry[0]][rc.rank] = members
    dims = sorted(d for d, by_rank in assigned.items() if len(by_rank) == len(ranks))
    if len(dims) < 2:
        return {}
    parts = [assigned[d] for d in dims]
    ends = _ends(ranks, dims)
    cost = [[_distance(ends, d, p) for p in parts] for d in dims]
    best = min(itertools.permutations(range(len(dims))),
               key=lambda perm: (sum(cost[i][k] for i, k in enumerate(perm)), perm != tuple(range(len(dims)))))
    if best == tuple(range(len(dims))) or math.isinf(sum(cost[i][k] for i, k in enumerate(best))):
        return {}
    new = {d: parts[k] for d, k in zip(dims, best)}
    for rc in ranks:
        _rewrite(rc, {d: (assigned[d][rc.rank], new[d][rc.rank]) for d in dims})
    return {d: sorted({g for g in new[d].values()}) for d in dims if new[d] is not assigned[d]}


def _ends(ranks: Sequence[Collectives], dims: list[str]) -> dict[tuple[str, int], dict[str, np.ndarray]]:
    """(dimension, rank) -> type -> the sorted ends of those instances."""
    out: dict[tuple[str, int], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for rc in ranks:
        if len(rc.dim) != len(rc.type):
            continue
        for d, t, e in zip(rc.dim, rc.type, rc.end_ns):
            if d in dims:
                out[(d, rc.rank)][t].append(int(e))
    return {k: {t: np.sort(np.asarray(v, dtype=np.int64)) for t, v in by_type.items()} for k, by_type in out.items()}


def _distance(ends: dict, dim: str, part: dict[int, tuple[int, ...]]) -> float:
    """The log of the mean over ranks of the median distance from the rank's `dim` instances' ends
    to the nearest end of a counterpart instance on the other members of its group in `part`."""
    per_rank = []
    for rank, members in part.items():
        gaps = []
        for t, mine in ends.get((dim, rank), {}).items():
            theirs = [ends.get((dim, b), {}).get(_COUNTERPART.get(t, t)) for b in members if b != rank]
            theirs = [x for x in theirs if x is not None]
            if not theirs:
                return math.inf
            other = np.sort(np.concatenate(theirs))
            j = np.clip(np.searchsorted(other, mine), 1, max(len(other) - 1, 1))
            near = np.minimum(np.abs(mine - other[j - 1]), np.abs(mine - other[np.minimum(j, len(other) - 1)]))
            gaps.append(near)
        if gaps:
            per_rank.append(float(np.median(np.concatenate(gaps))))
    return math.log1p(sum(per_rank) / len(per_rank)) if per_rank else math.inf


def _rewrite(rc: Collectives, moves: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
    """Move the rank's instances of each dimension from its old group to its new one."""
    def key(prefix: str, members: tuple[int, ...]) -> str:
        return f"{prefix}:{','.join(map(str, members))}"

    for i, d in enumerate(rc.dim):
        if d in moves:
            old, new = moves[d]
            prefix, _, ranks = rc.pg[i].rpartition(":")
            if ranks == ",".join(map(str, old)):
                rc.pg[i] = key(prefix, new)
                rc.group_size[i] = len(new)
    rc.groups = [[e[0], e[1], *moves[e[0]][1]] if e[0] in moves and e[1] == "inferred" else e for e in rc.groups or []]
