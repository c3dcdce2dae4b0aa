"""Injections: the faults a job can be given (`KIND_PARAMS`, `injection_help()`), parsing and checking
them (`parse_injection`), and the plan of what each one changes on which rank (`_plan_faults`)."""
from __future__ import annotations

from dataclasses import dataclass, field

STRAGGLER_CAUSES = ("dataloader", "host_idle", "gpu_compute")


@dataclass(frozen=True)
class Injection:
    """One fault to inject. `kind` names it; `params` configure it (see `KIND_PARAMS`)."""
    kind: str
    params: dict = field(default_factory=dict)


class RankOrAll:
    """Parameter type: one rank number, or "all" (every rank: a job-wide fault)."""


@dataclass(frozen=True)
class _KindSpec:
    params: dict[str, type]                     # parameter -> type (int, float, str, RankOrAll)
    defaults: dict[str, object]
    help: str = ""


KIND_PARAMS: dict[str, _KindSpec] = {
    "straggler": _KindSpec({"rank": int, "cause": str, "delay_ms": float},
                           {"cause": "host_idle", "delay_ms": 40.0},
                           "one rank late every step by delay_ms: cause dataloader (a longer DataLoader "
                           "__next__), host_idle (main thread busy outside any op between forward and "
                           "backward) or gpu_compute (its kernels slower by delay_ms in total)"),
    "no_overlap": _KindSpec({}, {}, "DDP all-reduces launched one by one after backward (no overlap)"),
    "clock_offset": _KindSpec({"rank": int, "offset_ms": float}, {}, "the rank's host clock off by offset_ms"),
    "truncated": _KindSpec({"rank": int}, {}, "the rank's file cut mid-event (writer killed)"),
    "launch_bound": _KindSpec({"rank": RankOrAll, "kernels_per_op": int, "kernel_us": float},
                              {"rank": "all", "kernels_per_op": 8, "kernel_us": 3.0},
                              "tiny tensors, eager mode: every forward/backward op launches kernels_per_op "
                              "kernels of ~kernel_us each (each launch ~5 us of CPU): the GPU idles between them "
                              "(one rank alone is not slower: the others' GPU-bound pace hides it)"),
    "pageable_memcpy": _KindSpec({"rank": RankOrAll, "batch_mb": float, "gbps": float},
                                 {"rank": "all", "batch_mb": 32.0, "gbps": 6.0},
                                 "the input batch (batch_mb MB per step, e.g. float32 features) copied HtoD "
                                 "from pageable memory at ~gbps GB/s, blocking the host (pin_memory=False)"),
    "uneven_shards": _KindSpec({"rank": int, "extra_pct": float}, {"extra_pct": 20.0},
                               "the rank gets extra_pct % more samples per step: its batch-sized kernels "
                               "(forward, loss, backward) run that much longer"),
    "fp32_gemm": _KindSpec({"rank": RankOrAll, "slowdown": float}, {"rank": "all", "slowdown": 8.0},
                           "the Linear layers' GEMMs run in FP32 on CUDA cores (cuBLAS SIMT sgemm kernels, "
                           "no TF32), slowdown x slower than the bf16 Tensor Core GEMMs"),
}


def injection_help() -> str:
    """One line per injection kind: its parameters with defaults, and what it simulates."""
    lines = []
    for kind, spec in KIND_PARAMS.items():
        params = ",".join(f"{name}={spec.defaults[name]}" if name in spec.defaults else f"{name}=..."
                          for name in spec.params)
        lines.append(f"{kind}{':' + params if params else ''}  {spec.help}")
    return "\n".join(lines)


def parse_injection(text: str) -> Injection:
    """Parse `kind[:key=value,...]`, e.g. "straggler:rank=19,cause=dataloader,delay_ms=40".

    Missing optional parameters get their defaults. Raises ValueError naming the problem."""
    kind, _, rest = text.strip().partition(":")
    params: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise ValueError(f"injection {text!r}: expected key=value, got {item!r}")
        if key in params:
            raise ValueError(f"injection {text!r}: parameter {key!r} given twice")
        params[key] = _parse_value(value)
    return _normalized(Injection(kind.strip(), params))


def _parse_value(value: str) -> int | float | str:
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def _normalized(inj: Injection, world_size: int | None = None) -> Injection:
    """Check kind, parameter names, types and ranges; fill defaults."""
    spec = KIND_PARAMS.get(inj.kind)
    if spec is None:
        raise ValueError(f"unknown injection kind {inj.kind!r}; known: {', '.join(KIND_PARAMS)}")
    unknown = sorted(set(inj.params) - set(spec.params))
    if unknown:
        raise ValueError(f"injection {inj.kind}: unknown parameter(s) {', '.join(unknown)}; "
                         f"expected: {', '.join(spec.params) or 'none'}")
    params = {**spec.defaults, **inj.params}
    missing = [name for name in spec.params if name not in params]
    if missing:
        raise ValueError(f"injection {inj.kind}: missing parameter(s) {', '.join(missing)}")
    for name, kind in spec.params.items():
        params[name] = _typed(inj.kind, name, params[name], kind)
    _check_ranges(inj.kind, params, world_size)
    return Injection(inj.kind, {name: params[name] for name in spec.params})


def _typed(kind: str, name: str, value: object, expected: type) -> object:
    if expected is RankOrAll:
        if value == "all" or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise ValueError(f"injection {kind}: {name} must be a rank number or 'all', got {value!r}")
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or isinstance(value, bool):
        raise ValueError(f"injection {kind}: {name} must be {expected.__name__}, got {value!r}")
    return value


def _check_ranges(kind: str, params: dict, world_size: int | None) -> None:
    rank = params.get("rank")
    if isinstance(rank, int) and (rank < 0 or (world_size is not None and rank >= world_size)):
        bound = f" (job has {world_size} ranks)" if world_size is not None else ""
        raise ValueError(f"injection {kind}: rank {rank} out of range{bound}")
    if kind == "straggler":
        if params["cause"] not in STRAGGLER_CAUSES:
            raise ValueError(f"injection straggler: cause must be one of {', '.join(STRAGGLER_CAUSES)}, "
                             f"got {params['cause']!r}")
        if params["delay_ms"] <= 0:
            raise ValueError(f"injection straggler: delay_ms must be > 0, got {params['delay_ms']}")
    for name, low in _MINIMUM.get(kind, {}).items():
        if params[name] < low:
            raise ValueError(f"injection {kind}: {name} must be >= {low}, got {params[name]}")


_MINIMUM = {"launch_bound": {"kernels_per_op": 1, "kernel_us": 1.0},
            "pageable_memcpy": {"batch_mb": 0.001, "gbps": 0.1},
            "uneven_shards": {"extra_pct": 0.0}, "fp32_gemm": {"slowdown": 1.0}}


@dataclass
class _RankFaults:
    dataloader_delay_ns: int = 0
    host_idle_ns: int = 0
    gpu_compute_delay_ns: int = 0
    clock_offset_ns: int = 0
    truncated: bool = False
    program_changes: dict[str, tuple] = field(default_factory=dict)   # kind -> parameters (see _PROGRAM_CHANGES)


@dataclass
class _JobFaults:
    ranks: list[_RankFaults]
    overlap_comm: bool = True


def _ms_to_ns(ms: float) -> int:
    return round(ms * 1_000_000)


def _apply_straggler(faults: _JobFaults, p: dict) -> None:
    rank, delay_ns = faults.ranks[p["rank"]], _ms_to_ns(p["delay_ms"])
    if p["cause"] == "dataloader":
        rank.dataloader_delay_ns += delay_ns
    elif p["cause"] == "host_idle":
        rank.host_idle_ns += delay_ns
    else:
        rank.gpu_compute_delay_ns += delay_ns


def _apply_no_overlap(faults: _JobFaults, p: dict) -> None:
    faults.overlap_comm = False


def _apply_clock_offset(faults: _JobFaults, p: dict) -> None:
    faults.ranks[p["rank"]].clock_offset_ns += _ms_to_ns(p["offset_ms"])


def _apply_truncated(faults: _JobFaults, p: dict) -> None:
    faults.ranks[p["rank"]].truncated = True


_APPLY = {
    "straggler": _apply_straggler,
    "no_overlap": _apply_no_overlap,
    "clock_offset": _apply_clock_offset,
    "truncated": _apply_truncated,
}


def _program_change(inj: Injection) -> tuple:
    """The parameters of an injection that changes what the rank runs (_PROGRAM_CHANGES)."""
    return tuple(value for name, value in inj.params.items() if name != "rank")


def _targets(inj: Injection, world_size: int) -> range | list[int]:
    rank = inj.params["rank"]
    return range(world_size) if rank == "all" else [rank]


def _plan_faults(injections: list[Injection], world_size: int) -> _JobFaults:
    faults = _JobFaults([_RankFaults() for _ in range(world_size)])
    for inj in injections:
        if inj.kind in _APPLY:
            _APPLY[inj.kind](faults, inj.params)
            continue
        for rank in _targets(inj, world_size):
            faults.ranks[rank].program_changes[inj.kind] = _program_change(inj)
    return faults


#: What the late rank of each straggler-making injection spends its extra time on (straggler causes, docs/concepts.md).
_STRAGGLER_CAUSE_BY_KIND = {"uneven_shards": "gpu_compute", "fp32_gemm": "gpu_compute", "pageable_memcpy": "memcpy"}


def _makes_straggler(inj: Injection) -> bool:
    """One rank does more than the others: the straggler kind, and the per-rank program changes
    aimed at a single rank (rank="all" slows every rank alike: no straggler)."""
    return inj.kind == "straggler" or (inj.kind in _STRAGGLER_CAUSE_BY_KIND and inj.params["rank"] != "all")
