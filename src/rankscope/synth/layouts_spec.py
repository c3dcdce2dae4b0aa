"""The `--layout SPEC` of a synthetic parallel job: its grammar (`parse_layout`), the rank mesh
(tp innermost, then ep, dp, pp outermost, like Megatron), the process groups every rank belongs to
with the names a DeviceMesh, Megatron or nothing gives them, and the pipeline schedules (the
order of forward and backward actions each pipeline rank runs)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

#: Keys of a SPEC, in the order `LayoutSpec.text` writes them, with their defaults.
SPEC_DEFAULTS: dict[str, object] = {
    "pp": 1, "dp": 1, "tp": 1, "ep": 1, "schedule": "1f1b", "virtual": 2, "microbatches": 8, "names": "mesh",
    "fsdp": 0, "marks": "auto",
    # faults
    "slow_stage": None, "no_prefetch": 0, "exposed_tp": 0, "expert_skew": None, "factor": 3.0,
}
SCHEDULES = ("1f1b", "gpipe", "interleaved")
NAMINGS = ("mesh", "megatron", "none")
#: The dimensions, outer to inner (the rank order: tp varies fastest).
DIMS = ("pp", "dp", "ep", "tp")
FAULT_KEYS = ("slow_stage", "no_prefetch", "exposed_tp", "expert_skew")

LAYOUT_HELP = """\
SPEC: comma-separated key=value, e.g. pp=4,dp=2,tp=2,schedule=1f1b,microbatches=8
  pp, dp, tp, ep      sizes (default 1); world = their product; rank order: tp innermost, then
                      ep, dp, pp outermost (Megatron's)
  schedule            1f1b | gpipe | interleaved (with pp >= 2; default 1f1b)
  virtual             model chunks per rank of the interleaved schedule (default 2; microbatches
                      must be a multiple of pp)
  microbatches        per step (default 8)
  names               mesh (pg_desc mesh_pp / mesh_dp / mesh_ep / mesh_tp) | megatron
                      (PIPELINE_MODEL_PARALLEL_GROUP, DATA_PARALLEL_GROUP, ...) | none (every
                      group's pg_desc "undefined")
  fsdp                1: dp is sharded (all_gather of each layer's parameters before its forward and
                      backward, reduce_scatter of its gradients); 0: DDP all_reduce of the gradients
  marks               auto | 1 | 0: torch.distributed.pipelining's schedule annotations ("Forward i",
                      "PP:<stage>F<mb>"); auto: with names=mesh only
faults:
  slow_stage=S        pipeline stage S computes `factor` x longer (default factor 3)
  no_prefetch=1       FSDP all_gathers issued only when their layer runs, and waited on (fsdp=1, dp>=2)
  exposed_tp=1        tensor-parallel all_reduces 4x larger and waited on at once (tp>=2)
  expert_skew=R       the all_to_all dispatch sends rank R `factor` x the tokens of each other rank
                      of its expert group (ep>=2)
  factor=F            the factor of slow_stage and expert_skew (default 3)"""


@dataclass(frozen=True)
class LayoutSpec:
    pp: int = 1
    dp: int = 1
    tp: int = 1
    ep: int = 1
    schedule: str = "1f1b"
    virtual: int = 2
    microbatches: int = 8
    names: str = "mesh"
    fsdp: bool = False
    marks: str = "auto"
    slow_stage: int | None = None
    no_prefetch: bool = False
    exposed_tp: bool = False
    expert_skew: int | None = None
    factor: float = 3.0

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.ep * self.tp

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline rank (virtual stages)."""
        return self.virtual if self.schedule == "interleaved" and self.pp >= 2 else 1

    @property
    def with_marks(self) -> bool:
        return self.marks == "1" or (self.marks == "auto" and self.names == "mesh")

    @property
    def faults(self) -> dict:
        out = {}
        if self.slow_stage is not None:
            out["slow_stage"] = {"stage": self.slow_stage, "factor": self.factor}
        if self.no_prefetch:
            out["no_prefetch"] = {}
        if self.exposed_tp:
            out["exposed_tp"] = {}
        if self.expert_skew is not None:
            out["expert_skew"] = {"rank": self.expert_skew, "factor": self.factor}
        return out

    def healthy(self) -> "LayoutSpec":
        """The same layout without its faults: the healthy twin."""
        return replace(self, slow_stage=None, no_prefetch=False, exposed_tp=False, expert_skew=None)

    @property
    def text(self) -> str:
        parts = [f"pp={self.pp}", f"dp={self.dp}", f"tp={self.tp}", f"ep={self.ep}"]
        if self.pp >= 2:
            parts.append(f"schedule={self.schedule}")
            if self.schedule == "interleaved":
                parts.append(f"virtual={self.virtual}")
        parts += [f"microbatches={self.microbatches}", f"names={self.names}", f"fsdp={int(self.fsdp)}"]
        if self.marks != "auto":
            parts.append(f"marks={self.marks}")
        if self.slow_stage is not None:
            parts.append(f"slow_stage={self.slow_stage}")
        if self.no_prefetch:
            parts.append("no_prefetch=1")
        if self.exposed_tp:
            parts.append("exposed_tp=1")
        if self.expert_skew is not None:
            parts.append(f"expert_skew={self.expert_skew}")
        if self.slow_stage is not None or self.expert_skew is not None:
            parts.append(f"factor={self.factor:g}")
        return ",".join(parts)

    # ---- the mesh

    def coords(self, rank: int) -> dict[str, int]:
        t = rank % self.tp
        e = (rank // self.tp) % self.ep
        d = (rank // (self.tp * self.ep)) % self.dp
        p = rank // (self.tp * self.ep * self.dp)
        return {"pp": p, "dp": d, "ep": e, "tp": t}

    def stride(self, dim: str) -> int:
        return {"tp": 1, "ep": self.tp, "dp": self.tp * self.ep, "pp": self.tp * self.ep * self.dp}[dim]

    def size(self, dim: str) -> int:
        return getattr(self, dim)

    def group(self, dim: str, rank: int) -> tuple[int, ...]:
        """The ranks of `dim`'s group that holds `rank` (sorted)."""
        stride, c = self.stride(dim), self.coords(rank)[dim]
        base = rank - c * stride
        return tuple(base + i * stride for i in range(self.size(dim)))

    def groups(self, dim: str) -> list[tuple[int, ...]]:
        return sorted({self.group(dim, r) for r in range(self.world)})

    def stage_ranks(self, stage: int) -> list[int]:
        return [r for r in range(self.world) if self.coords(r)["pp"] == stage]


def parse_layout(text: str) -> LayoutSpec:
    """`pp=4,dp=2,tp=2,schedule=1f1b,...` -> LayoutSpec (`LAYOUT_HELP`); ValueError when wrong."""
    values: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in SPEC_DEFAULTS:
            raise ValueError(f"layout: bad item {part!r}: expected key=value with a key among "
                             f"{', '.join(SPEC_DEFAULTS)}")
        if key in values:
            raise ValueError(f"layout: {key} given twice")
        values[key] = value
    kw: dict[str, Any] = {}                 # LayoutSpec's fields
    for key in ("pp", "dp", "tp", "ep", "virtual", "microbatches"):
        if key in values:
            kw[key] = _int(key, values[key], 1)
    for key in ("fsdp", "no_prefetch", "exposed_tp"):
        if key in values:
            if values[key] not in ("0", "1"):
                raise ValueError(f"layout: {key} must be 0 or 1, not {values[key]!r}")
            kw[key] = values[key] == "1"
    for key in ("slow_stage", "expert_skew"):
        if key in values:
            kw[key] = _int(key, values[key], 0)
    if "factor" in values:
        try:
            kw["factor"] = factor = float(values["factor"])
        except ValueError:
            raise ValueError(f"layout: factor must be a number, not {values['factor']!r}") from None
        if not factor > 1.0:
            raise ValueError("layout: factor must be > 1")
    for key, allowed in (("schedule", SCHEDULES), ("names", NAMINGS), ("marks", ("auto", "0", "1"))):
        if key in values:
            if values[key] not in allowed:
                raise ValueError(f"layout: {key} must be one of {' | '.join(allowed)}, not {values[key]!r}")
            kw[key] = values[key]
    spec = LayoutSpec(**kw)
    _check(spec)
    return spec


def _int(key: str, value, low: int) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"layout: {key} must be an integer, not {value!r}") from None
    if out < low:
        raise ValueError(f"layout: {key} must be >= {low}, not {out}")
    return out


def _check(s: LayoutSpec) -> None:
    if s.world > 1024:
        raise ValueError(f"layout: world size {s.world} is too large (at most 1024)")
    if s.schedule == "interleaved" and s.pp >= 2:
        if s.virtual < 2:
            raise ValueError("layout: interleaved needs virtual >= 2")
        if s.microbatches % s.pp:
            raise ValueError(f"layout: interleaved needs microbatches ({s.microbatches}) to be a multiple of "
                             f"pp ({s.pp})")
    if s.slow_stage is not None and not (s.pp >= 2 and s.slow_stage < s.pp):
        raise ValueError(f"layout: slow_stage={s.slow_stage} needs pp >= 2 and a stage below pp ({s.pp})")
    if s.no_prefetch and not (s.fsdp and s.dp >= 2):
        raise ValueError("layout: no_prefetch needs fsdp=1 and dp >= 2")
    if s.exposed_tp and s.tp < 2:
        raise ValueError("layout: exposed_tp needs tp >= 2")
    if s.expert_skew is not None and not (s.ep >= 2 and s.expert_skew < s.world):
        raise ValueError(f"layout: expert_skew={s.expert_skew} needs ep >= 2 and a rank below the world size "
                         f"({s.world})")


# ---- process groups and their names

@dataclass(frozen=True)
class ProcessGroup:
    pg_name: str                  # "0" the world, then "1", "2", ... in creation order (the same on every rank)
    desc: str
    ranks: tuple[int, ...]
    dim: str | None = None        # the dimension it is (None: an auxiliary group, or the world)


_MEGATRON_DESC = {"pp": "PIPELINE_MODEL_PARALLEL_GROUP", "dp": "DATA_PARALLEL_GROUP",
                  "tp": "TENSOR_MODEL_PARALLEL_GROUP", "ep": "EXPERT_MODEL_PARALLEL_GROUP"}


def process_groups(spec: LayoutSpec) -> list[ProcessGroup]:
    """Every process group the job creates, in creation order (which numbers `pg_name`): the world,
    then per dimension all its groups, size-1 groups included, as torch's DeviceMesh (dims pp, dp,
    ep, tp) or Megatron's parallel_state (data, model, tensor, pipeline, embedding, tensor-and-data,
    expert) create them."""
    out = [ProcessGroup("0", "default_pg", tuple(range(spec.world)))]

    def add(desc: str, ranks, dim: str | None) -> None:
        out.append(ProcessGroup(str(len(out)), desc, tuple(sorted(ranks)), dim))

    if spec.names == "megatron":
        for g in spec.groups("dp"):
            add(_MEGATRON_DESC["dp"], g, "dp")
        model = sorted({tuple(sorted(r for r in range(spec.world)
                                     if all(spec.coords(r)[k] == spec.coords(x)[k] for k in ("dp", "ep"))))
                        for x in range(spec.world)})
        for g in model:
            add("MODEL_PARALLEL_GROUP", g, None)
        for g in spec.groups("tp"):
            add(_MEGATRON_DESC["tp"], g, "tp")
        for g in spec.groups("pp"):
            add(_MEGATRON_DESC["pp"], g, "pp")
        for g in spec.groups("pp"):
            add("EMBEDDING_GROUP", {g[0], g[-1]}, None)
        tp_dp = sorted({tuple(sorted(r for r in range(spec.world)
                                     if all(spec.coords(r)[k] == spec.coords(x)[k] for k in ("pp", "ep"))))
                        for x in range(spec.world)})
        for g in tp_dp:
            add("TENSOR_AND_DATA_PARALLEL_GROUP", g, None)
        for g in spec.groups("ep"):
            add(_MEGATRON_DESC["ep"], g, "ep")
    else:
        for dim in DIMS:
            for g in spec.groups(dim):
                add(f"mesh_{dim}" if spec.names == "mesh" else "undefined", g, dim)
    return out


def rank_process_groups(groups: list[ProcessGroup], rank: int) -> list[ProcessGroup]:
    return [g for g in groups if rank in g.ranks]


# ---- pipeline schedules

@dataclass(frozen=True)
class Action:
    kind: str          # "F" | "B"
    chunk: int         # model chunk on this rank (0 .. virtual-1)
    mb: int            # microbatch


def schedule_actions(spec: LayoutSpec, stage: int) -> list[Action]:
    """The forward / backward actions of pipeline rank `stage`, in the order it runs them.
    pp = 1: gradient accumulation, F then B per microbatch. gpipe: every forward, then every
    backward; 1f1b: pp - stage - 1 warm-up forwards, then one forward one backward, then the
    remaining backwards (Megatron, torch Schedule1F1B); interleaved: Megatron's interleaved 1F1B
    (forward k runs chunk (k // pp) % v of microbatch (k // (pp v)) pp + k % pp)."""
    p, m, v = spec.pp, spec.microbatches, spec.chunks
    if p == 1:
        return [a for mb in range(m) for a in (Action("F", 0, mb), Action("B", 0, mb))]
    if spec.schedule == "gpipe":
        return [Action("F", 0, mb) for mb in range(m)] + [Action("B", 0, mb) for mb in range(m)]
    if spec.schedule == "1f1b":
        warm = min(p - stage - 1, m)
        out = [Action("F", 0, mb) for mb in range(warm)]
        for i in range(m - warm):
            out += [Action("F", 0, warm + i), Action("B", 0, i)]
        out += [Action("B", 0, mb) for mb in range(m - warm, m)]
        return out
    total = m * v

    def fwd(k: int) -> Action:
        return Action("F", (k // p) % v, (k // (p * v)) * p + k % p)

    def bwd(k: int) -> Action:
        return Action("B", v - 1 - (k // p) % v, (k // (p * v)) * p + k % p)

    warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    out = [fwd(k) for k in range(warm)]
    for i in range(total - warm):
        out += [fwd(warm + i), bwd(i)]
    out += [bwd(k) for k in range(total - warm, total)]
    return out


@dataclass
class StageInfo:
    """Where a rank sits in the pipeline: its stage, the global virtual stage of each of its chunks,
    and the global ranks of its pipeline group (by stage)."""
    stage: int
    chunks: int
    pp_group: tuple[int, ...]
    virtual_stages: list[int] = field(default_factory=list)

    def __post_init__(self):
        p = len(self.pp_group)
        self.virtual_stages = [c * p + self.stage for c in range(self.chunks)]
