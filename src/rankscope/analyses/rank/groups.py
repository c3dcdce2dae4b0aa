"""Process groups and parallel dimensions, as one rank sees them (docs/concepts.md "Parallel layout").

A job's dimensions (pp, dp, dp_shard, dp_replicate, tp, cp, ep, emb) come from the names its process
groups carry: `distributedInfo.pg_config[].pg_desc` (torch DeviceMesh: `mesh_tp`; torchtitan:
`mesh_dp_shard`; Megatron: `TENSOR_MODEL_PARALLEL_GROUP`; `dist.new_group(group_desc=...)`) and
the per-event `Process Group Description`. `DIM_PATTERNS` is that table; a user extends it with
`extend_dim_patterns`.

Where names are missing or say nothing (`undefined`, `default_pg`, a user's own names), each
collective's dimension comes from its role (`role_dim`):
  send / recv (not a bare NCCL SendRecv kernel)  -> pp
  all_to_all of sharded embedding tables        -> emb  (TorchRec / DLRM: issued inside EMBEDDING_OPS)
  any other all_to_all                          -> ep
  all_gather / reduce_scatter (parameters)      -> dp_shard
  all_reduce issued by a functional collective  -> tp   (DTensor / tensor parallel layers)
  any other all_reduce (gradients)              -> dp
  (a functional all_gather / reduce_scatter where a tp group is named: sequence parallel, tp)
and the rank's unnamed groups are given to those dimensions by locality: the group whose ranks
lie closest together (smallest rank stride) to the innermost dimension (tp, then cp, ep, emb,
dp_shard, dp, pp: the order of Megatron's and torchtitan's meshes). A dimension without a group
of its own runs on the world group.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: pg_desc pattern -> dimension, first match wins (searched case-insensitively in the description).
DIM_PATTERNS: list[tuple[str, str]] = [
    (r"dp_shard|fsdp|zero|sharded_data", "dp_shard"),
    (r"dp_replicate|hsdp_replicate|replicate", "dp_replicate"),
    (r"sharded_?emb|emb(edding)?_?shard|(^|[^a-z])emb($|[^a-z])", "emb"),    # not Megatron's EMBEDDING_GROUP
    (r"expert|(^|[^a-z])ep($|[^a-z])|moe", "ep"),
    (r"context|(^|[^a-z])cp($|[^a-z])", "cp"),
    (r"tensor|(^|[^a-z])tp($|[^a-z])", "tp"),
    (r"pipe|(^|[^a-z])pp($|[^a-z])", "pp"),
    (r"data|(^|[^a-z])dp($|[^a-z])|ddp", "dp"),
]
#: Inner to outer: the dimension given the closest-together group first (unnamed groups).
LOCALITY_ORDER = ("tp", "cp", "ep", "emb", "dp_shard", "dp_replicate", "dp", "pp")
#: Roles that share one unnamed group make one dimension: the first of these among them.
ROLE_PRECEDENCE = ("pp", "emb", "ep", "dp_shard", "tp", "cp", "dp_replicate", "dp")
#: Host ops around the all_to_all of sharded embedding tables (recommendation models): TorchRec's
#: record_function names (`## alltoall_fwd_single ##`, `## all2all_data:kjt values ##`), its autograd
#: functions (`All2All_Pooled_Req`, `All2All_Seq_Req`), KJT awaitables, embedding modules.
EMBEDDING_OPS = (r"All2All_(Pooled|Seq|Sequence)|alltoall_(fwd|bwd)_single|alltoall_(pooled|sequence)|all2all_data"
                 r"|KJTAllToAll|embedding")
#: Descriptions that name no dimension.
_MEANINGLESS = re.compile(r"^(|undefined|none|null|default|default_pg|world|global|\d+)$", re.IGNORECASE)

_compiled: list[tuple[re.Pattern, str]] = []


def extend_dim_patterns(pattern: str, dim: str) -> None:
    """Add a description pattern (regex, searched case-insensitively) for a dimension, ahead of the
    built-in ones."""
    if dim not in LOCALITY_ORDER:
        raise ValueError(f"unknown dimension {dim!r}: one of {', '.join(LOCALITY_ORDER)}")
    DIM_PATTERNS.insert(0, (pattern, dim))
    _compiled.clear()


#: Descriptions of flattened meshes (torchtitan's `dp_shard_cp`, `dp_cp`; Megatron's
#: `DATA_PARALLEL_GROUP_WITH_CP`): several dimensions in one group, none of them alone.
_SHORT_DIMS = re.compile(r"(?:^|_)(pp|dp|tp|cp|ep)(?=_|$)", re.IGNORECASE)
_FLATTENED = re.compile(r"with_cp|_and_", re.IGNORECASE)


def dim_of_desc(desc: str | None) -> str | None:
    """The dimension a process-group description names, or None (also for a flattened mesh)."""
    if desc is None or _MEANINGLESS.match(desc.strip()):
        return None
    short = {m.lower() for m in _SHORT_DIMS.findall(desc.strip().removeprefix("mesh_"))}
    if len(short) > 1 or _FLATTENED.search(desc):
        return None
    if not _compiled:
        _compiled.extend((re.compile(p, re.IGNORECASE), d) for p, d in DIM_PATTERNS)
    text = desc.strip()
    return next((d for rx, d in _compiled if rx.search(text)), None)


def role_dim(ctype: str, functional: bool, embedding: bool = False) -> str | None:
    """The dimension a collective's role implies (module docstring); None for other types
    (broadcast, barrier, ...). `embedding`: issued by sharded embedding tables (EMBEDDING_OPS)."""
    if ctype in ("send", "recv"):          # (a bare NCCL SendRecv kernel may be an all_to_all: no role)
        return "pp"
    if ctype == "all_to_all":
        return "emb" if embedding else "ep"
    if ctype in ("all_gather", "reduce_scatter"):
        return "dp_shard"
    if ctype == "all_reduce":
        return "tp" if functional else "dp"
    return None


@dataclass(frozen=True)
class Group:
    """One process group this rank belongs to: its global ranks (sorted), the name the trace gives
    it (`pg_name`), its description, and the dimension that description names (None: unnamed)."""
    ranks: tuple[int, ...]
    pg_name: str | None
    desc: str | None
    dim: str | None

    @property
    def stride(self) -> int:
        """Smallest gap between member ranks (1 for a contiguous group)."""
        return min((b - a for a, b in zip(self.ranks, self.ranks[1:])), default=0)

    @property
    def key(self) -> str:
        """The match key of the group's collectives: the same string on every member."""
        return f"{self.desc or 'group'}:{','.join(map(str, self.ranks))}"


def parse_ranks(value) -> tuple[int, ...] | None:
    """`ranks` of a pg_config entry or a `Process Group Ranks` string ("[0, 1]") -> sorted tuple."""
    if isinstance(value, str):
        value = [int(x) for x in re.findall(r"-?\d+", value)]
    if not isinstance(value, (list, tuple)) or not value:
        return None
    try:
        out = tuple(sorted({int(v) for v in value}))
    except (TypeError, ValueError):
        return None
    return out if all(0 <= r < 1 << 31 for r in out) else None


def rank_groups(pg_config: list, rank: int, world_size: int | None) -> list[Group]:
    """The groups of `pg_config` that hold `rank` (the world group included), deduplicated."""
    out: dict[tuple, Group] = {}
    for pg in pg_config or []:
        if not isinstance(pg, dict):
            continue
        ranks = parse_ranks(pg.get("ranks"))
        if ranks is None and world_size is not None and isinstance(pg.get("pg_size"), int) \
                and pg.get("pg_size") == world_size:
            ranks = tuple(range(world_size))
        if ranks is None or rank not in ranks:
            continue
        desc = pg.get("pg_desc") if isinstance(pg.get("pg_desc"), str) else None
        g = Group(ranks, str(pg["pg_name"]) if pg.get("pg_name") is not None else None, desc, dim_of_desc(desc))
        out.setdefault((g.ranks, g.desc), g)
    return list(out.values())


def assign_unnamed(roles: set[str], groups: list[Group], world: tuple[int, ...]) -> dict[str, Group]:
    """Dimension -> group for the roles with no named group: the rank's unnamed groups of two or
    more members (other than the world), closest-together first, to the roles inner first
    (`LOCALITY_ORDER`); what is left runs on the world group."""
    named = {g.dim for g in groups if g.dim}
    todo = [d for d in LOCALITY_ORDER if d in roles and d not in named]
    free = sorted((g for g in groups if g.dim is None and len(g.ranks) >= 2 and g.ranks != world),
                  key=lambda g: (g.stride, len(g.ranks)))
    out = {}
    for d in todo:
        out[d] = free.pop(0) if free else Group(world, None, None, None)
    return out
