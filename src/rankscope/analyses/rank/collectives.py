"""Collectives: one record per collective instance on each rank (map), matched across ranks (reduce).

Map side, `rank_collectives(trace)` -> `RankCollectives` (small, msgspec-serializable: lists of numbers):
  - which events are collectives: on GPU jobs the COMM device events (NCCL/RCCL/HCCL kernels,
    symmetric-memory `multimem_*`: the kernel classes of docs/concepts.md); arrival = kernel start, end = kernel end.
    On CPU-only (gloo) jobs, or GPU jobs without COMM device events, the host `gloo:*` spans
    (arrival = span start).
  - type, normalized (`COLLECTIVE_TYPES`): from the launching op's metadata first (the kernel's own
    `comm_args.collective`, then the enclosing `record_param_comms`, then the enclosing `nccl:*` /
    `gloo:*` annotation, then `c10d::*` / `symm_mem::*` op names), the kernel name last: a NCCL
    `SendRecv` kernel is an all_to_all or a send/recv depending on the op, RCCL
    `ncclDevKernel_Generic` says nothing at all.
    "The launching op" = the host op enclosing the kernel's launch call (runtime event with the
    kernel's correlation id) on the launch thread: works for the 2023 format, where the kernel's
    `External id` is its correlation id, and the current one.
  - process group (`pg_name`, else "default"), seq (`Seq`, else -1), bytes in / out
    (`In msg nelems` / `Out msg nelems` x dtype size, else the annotation's Input Dims x Input type),
    group size (`Group size`, else the pg's size from distributedInfo, else world size).
  - per instance, the step it belongs to and what the rank did before arriving, in the exact
    step breakdown categories (`Timeline.in_windows`):
      pre_ns         window [previous collective's end on this rank (the latest one ending at or
                     before this arrival), or the step start if later) -> arrival)
      since_step_ns  window [step start -> arrival): cumulative, clock-independent; the straggler
                     analysis compares it across ranks.
    and `last_work_ns`: the end of the rank's last own work (COMP) before the instance ended,
    clipped to [arrival, end]: from then on the rank only waited (the straggler analysis counts a
    late rank's cost only where every other member had run out of work).

The cross-rank matching of these records is `analyses/job/matching.py`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import cast
import re
import sys
import zlib

import numpy as np
import polars as pl

from rankscope.analyses.rank.breakdown import CATEGORIES, Timeline, classify_timeline
from rankscope.analyses.rank.groups import (EMBEDDING_OPS, ROLE_PRECEDENCE, Group, assign_unnamed, dim_of_desc,
                                          parse_ranks, rank_groups, role_dim)
from rankscope.analyses.rank.steps import step_windows
from rankscope.analyses.rank.temporal import event_columns
from rankscope.analyses.rank.views import distinct_names, first_launch_rows, is_kind, named_mask
from rankscope.model import DEVICE_KINDS, HOST_OP_KINDS, KernelClass, RankTrace
from rankscope.results.collectives import (PACKED_INT_COLUMNS, Collectives, PackedCollectives, PackedMatrix,
                                          RankCollectives)

DEFAULT_PG = "default"

#: Normalized collective types. The first nine are the stable vocabulary of issue 4; `send_recv`
#: (a NCCL SendRecv kernel with nothing saying which), `gather`, `scatter` and `unknown` complete it.
COLLECTIVE_TYPES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
                    "send", "recv", "barrier", "send_recv", "gather", "scatter", "unknown")
P2P_TYPES = ("send", "recv", "send_recv")
#: The process group name of a send or recv in a group of more than two ranks: "p2p@<rank>@<group>".
P2P_PG = "p2p@"
#: Types whose members all pass the same input size (all_to_all and p2p may differ by rank).
SAME_SIZE_TYPES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier")

#: Compacted (lower case, no '_' / ':') name fragment -> type; first match wins. Order matters:
#: reducescatter before reduce, allreduce before reduce, allgather before gather, sendrecv before send.
_TYPE_RULES: list[tuple[str, str]] = [
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("crossdevicereduce", "all_reduce"),       # vLLM/sglang custom all-reduce kernels
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("deepep", "all_to_all"),                  # DeepEP dispatch / combine (expert parallel)
    ("dpskep", "all_to_all"),
    ("barrier", "barrier"),
    ("broadcast", "broadcast"),
    ("sendrecv", "send_recv"),
    ("send", "send"),
    ("recv", "recv"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
]
#: Name prefixes stripped before the rules apply (they would otherwise match nothing useful).
_PREFIX = re.compile(r"^(nccl:|gloo:|c10d::|_?c10d_functional::|symm_mem::|"
                     r"nccldevkernel_|ncclkernel_|rcclkernel_)", re.IGNORECASE)
#: Values of `Collective name` that are not collectives (the work handle's wait).
_NOT_COLLECTIVE = {"wait", "", "none", "null"}

#: Host ops that carry collective metadata around a kernel launch (matched on the launch thread).
_RPC_NAME = "record_param_comms"
_ANNOTATION_RX = re.compile(r"^(nccl|gloo|rccl|hccl|xccl):")
_OP_RX = re.compile(r"^(c10d::|_?c10d_functional::|symm_mem::)")
_GLOO_RX = re.compile(r"^gloo:")
#: Forward actions of a pipeline schedule: torch.distributed.pipelining's `PP:<stage>F<microbatch>`
#: (interleaved / zero-bubble schedules) and `Forward <microbatch>` (GPipe, one stage per rank).
PIPELINE_MARKS = re.compile(r"^(?:PP:(\d+)F(\d+)|Forward (\d+))$")
#: Functional collectives (DTensor, tensor-parallel layers, torch.compile): the tp role.
_FUNCTIONAL_RX = re.compile(r"^_?c10d_functional::")
#: The c10d ops that issue a collective (not its wait).
_ISSUE_RX = re.compile(r"^c10d::(?!.*wait)")
#: Names the collectives of a rank are found by, by class: metadata around a kernel launch
#: (record_param_comms, nccl:* annotation, c10d::* op), functional collectives, the c10d ops that
#: issue one, gloo spans, pipeline schedule marks.
_NAME_CLASSES = {"rpc": re.compile(f"^{re.escape(_RPC_NAME)}$"), "ann": _ANNOTATION_RX, "op": _OP_RX,
                 "functional": _FUNCTIONAL_RX, "issue": _ISSUE_RX, "gloo": _GLOO_RX, "pipeline": PIPELINE_MARKS,
                 "embedding": re.compile(EMBEDDING_OPS, re.IGNORECASE)}
_ANY_CLASS = re.compile("|".join(f"(?:{rx.pattern})" for rx in _NAME_CLASSES.values()))
#: gloo span type -> types of the c10d ops that may have issued it (gloo runs reduce_scatter as an
#: all_reduce).
_GLOO_ISSUERS = {"all_reduce": ("all_reduce", "reduce_scatter")}

#: Bytes per element by dtype name, as written by `comm_args.dtype` (c10 ScalarType names) and by
#: `Input type` (C++ type names).
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "c10::half": 2,
    "bfloat16": 2, "c10::bfloat16": 2, "long": 8, "long int": 8, "int64": 8, "long long": 8,
    "int": 4, "int32": 4, "short": 2, "int16": 2, "short int": 2, "byte": 1, "uint8": 1,
    "unsigned char": 1, "char": 1, "int8": 1, "signed char": 1, "bool": 1, "complexfloat": 8,
    "c10::complex<float>": 8, "complexdouble": 16, "c10::complex<double>": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "uint16": 2, "uint32": 4, "uint64": 8,
}

#: nccl-tests bus bandwidth factor (doc/PERFORMANCE.md, "Summary"), by type, for n members.
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0, "recv": lambda n: 1.0, "send_recv": lambda n: 1.0,
}


def normalize_collective(name: str | None) -> str:
    """A kernel, annotation, op or `Collective name` -> one of COLLECTIVE_TYPES ("unknown" if none).

    >>> normalize_collective("ncclDevKernel_AllReduce_Sum_bf16_RING_LL128(ncclDevKernelArgsStorage<4096ul>)")
    'all_reduce'
    >>> normalize_collective("nccl:_all_gather_base"), normalize_collective("_reduce_scatter_base")
    ('all_gather', 'reduce_scatter')
    """
    if not name:
        return "unknown"
    head = re.sub(r"^\s*void\s+|\(anonymous namespace\)::", "", name)
    head = _PREFIX.sub("", head.split("(", 1)[0].strip())
    # templates: `multimem_all_reduce_kernel<c10::BFloat16, 16>` -> keep the name before '<'
    head = head.split("<", 1)[0]
    compact = head.lower().replace("_", "").replace(":", "")
    if compact in _NOT_COLLECTIVE or compact == "generic":
        return "unknown"
    for frag, kind in _TYPE_RULES:
        if frag in compact:
            return kind
    return "unknown"


def dtype_bytes(dtype: str | None) -> int:
    """Element size in bytes of a dtype name; 0 when unknown."""
    if not dtype:
        return 0
    d = dtype.strip().lower()
    if d.startswith("at::"):
        d = d[4:]
    return DTYPE_BYTES.get(d, DTYPE_BYTES.get(d.replace("c10::", ""), 0))


def nccl_tests_bytes(ctype: str, in_bytes: int, out_bytes: int, group_size: int) -> int:
    """The size S nccl-tests uses for algbw = S / t (doc/PERFORMANCE.md): the total array, i.e. the
    output for all_gather (sendcount x n), the input for reduce_scatter (recvcount x n) and for
    every other type. -1 when unknown."""
    if ctype == "all_gather":
        if out_bytes > 0:
            return out_bytes
        return in_bytes * group_size if in_bytes > 0 and group_size > 0 else -1
    if in_bytes > 0:
        return in_bytes
    if ctype == "reduce_scatter" and out_bytes > 0 and group_size > 0:
        return out_bytes * group_size
    return out_bytes if out_bytes > 0 else -1


def busbw_factor(ctype: str, n: int) -> float | None:
    f = BUSBW_FACTOR.get(ctype)
    return f(n) if f is not None and n >= 1 else None


# ----------------------------------------------------------------------------------------------
# Map side
def pack_collectives(rc: RankCollectives) -> PackedCollectives:
    """What travels from a worker to the cross-rank reduce, as small as the reduce allows
    (results/collectives.py `PackedCollectives`). A 10 MB synth rank: 66 KB of lists -> 24 KB."""
    ints = {name: np.asarray(getattr(rc, name), dtype=np.int64) for name in PACKED_INT_COLUMNS}
    return PackedCollectives(
        rank=rc.rank, source=rc.source, hostname=rc.hostname, world_size=rc.world_size,
        pg=[sys.intern(v) for v in rc.pg], type=[sys.intern(v) for v in rc.type], dim=[sys.intern(v) for v in rc.dim],
        orphan=np.asarray(rc.orphan, dtype=bool),
        since_step_ns=PackedMatrix(instances(rc), zlib.compress(since_step_matrix(rc).tobytes(), 1)),
        pre_ns=PackedMatrix(instances(rc), zlib.compress(pre_matrix(rc).tobytes(), 1)),
        steps=rc.steps, step_start_ns=rc.step_start_ns, step_end_ns=rc.step_end_ns,
        step_breakdown_ns=rc.step_breakdown_ns, steps_source=rc.steps_source, step_tail_ns=rc.step_tail_ns,
        pipeline_stages=rc.pipeline_stages, pipeline_microbatches=rc.pipeline_microbatches, groups=rc.groups, **ints)


def instances(rc: Collectives) -> int:
    """How many collective instances the rank has."""
    return len(rc.start_ns)


def since_step_matrix(rc: Collectives) -> np.ndarray:
    """`since_step_ns` as an (instances, len(CATEGORIES)) int64 array, packed or not."""
    return _matrix(rc.since_step_ns, instances(rc))


def breakdown_matrix(rc: Collectives) -> np.ndarray:
    """`step_breakdown_ns` as a (steps, len(CATEGORIES)) int64 array."""
    return np.asarray(rc.step_breakdown_ns, dtype=np.int64).reshape(-1, len(CATEGORIES))


def owned_ns(rc: Collectives) -> tuple[np.ndarray, np.ndarray]:
    """(`owned_overlapped_ns`, `owned_exposed_ns`) as int64 arrays; zeros for a summary without them."""
    n = instances(rc)
    return (np.asarray(rc.owned_overlapped_ns if len(rc.owned_overlapped_ns) == n else np.zeros(n), dtype=np.int64),
            np.asarray(rc.owned_exposed_ns if len(rc.owned_exposed_ns) == n else np.zeros(n), dtype=np.int64))


def pre_matrix(rc: Collectives) -> np.ndarray:
    """`pre_ns` as an (instances, len(CATEGORIES)) int64 array, packed or not."""
    return _matrix(rc.pre_ns, instances(rc))


def _matrix(v: list[int] | PackedMatrix, n: int) -> np.ndarray:
    flat = (np.frombuffer(zlib.decompress(v.zlib_int64), dtype=np.int64) if isinstance(v, PackedMatrix)
            else np.asarray(v, np.int64))
    return flat.reshape(n, len(CATEGORIES))


def _first_tensor_nelems(dims_json: str | None) -> int:
    """Elements of the first argument of `Input Dims`: a tensor ([d0, d1]) or a tensor list
    ([[d0], [d1]]): the product, or the sum of products. -1 when absent."""
    if not dims_json:
        return -1
    try:
        dims = json.loads(dims_json)
    except (ValueError, TypeError):
        return -1
    if not isinstance(dims, list) or not dims:
        return -1
    first = dims[0]
    if not isinstance(first, list) or not first:
        return -1
    if all(isinstance(d, int) for d in first):
        return int(np.prod(first)) if first else -1
    if all(isinstance(t, list) and all(isinstance(d, int) for d in t) for t in first):
        total = sum(int(np.prod(t)) for t in first if t)
        return total if total > 0 else -1
    return -1


def _first_type(types_json: str | None) -> str | None:
    if not types_json:
        return None
    try:
        types = json.loads(types_json)
    except (ValueError, TypeError):
        return None
    if isinstance(types, list) and types and isinstance(types[0], str) and types[0] not in ("", "TensorList"):
        return types[0]
    return None


def _latest_at_or_before(p_keys: list[tuple], p_t: np.ndarray, s_keys: list[tuple], s_t: np.ndarray) -> np.ndarray:
    """For each point (key, time): the index of the span (given in event order) with the same key
    that started last at or before it (the later event on a tie); -1 if none."""
    out = np.full(len(p_t), -1, dtype=np.int64)
    spans_of: dict[tuple, list[int]] = {}
    for j, k in enumerate(s_keys):
        spans_of.setdefault(k, []).append(j)
    points_of: dict[tuple, list[int]] = {}
    for i, k in enumerate(p_keys):
        points_of.setdefault(k, []).append(i)
    for k, pi in points_of.items():
        if k not in spans_of:
            continue
        sj = np.asarray(spans_of[k], dtype=np.int64)
        sj = sj[np.argsort(s_t[sj], kind="stable")]
        points = np.asarray(pi, dtype=np.int64)
        pos = np.searchsorted(s_t[sj], p_t[points], side="right") - 1
        out[points] = np.where(pos >= 0, sj[np.maximum(pos, 0)], -1)
    return out


@dataclass
class _Spans:
    """Events as parallel arrays: their rows in `trace.events`, names, threads, start and end ns,
    correlation and External ids."""
    row: np.ndarray
    name: list[str]
    pid: np.ndarray
    tid: np.ndarray
    ts_ns: np.ndarray
    end_ns: np.ndarray
    correlation: list[int | None]
    external_id: list[int | None]

    @classmethod
    def of(cls, frame: pl.DataFrame) -> "_Spans":
        ts = frame["ts_ns"].to_numpy().astype(np.int64)
        return cls(frame["row"].to_numpy().astype(np.int64), frame["name"].to_list(),
                   frame["pid"].to_numpy().astype(np.int64), frame["tid"].to_numpy().astype(np.int64), ts,
                   ts + frame["dur_ns"].to_numpy().astype(np.int64), frame["correlation"].to_list(),
                   frame["external_id"].to_list())

    def take(self, idx) -> "_Spans":
        idx = np.asarray(idx, dtype=np.int64)
        return _Spans(self.row[idx], [self.name[i] for i in idx], self.pid[idx], self.tid[idx], self.ts_ns[idx],
                      self.end_ns[idx], [self.correlation[i] for i in idx], [self.external_id[i] for i in idx])

    def named(self, names: list[str]) -> "_Spans":
        wanted = set(names)
        return self.take([i for i, n in enumerate(self.name) if n in wanted])


def _enclosing(points: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], spans: _Spans) -> dict[int, int]:
    """For each point (idx, pid, tid, t_ns) the span on the same thread that started last at or
    before it and still runs at it: {idx: row}. Spans of one class do not nest on a thread (they
    are issued one after the other)."""
    idx, pid, tid, t = points
    if not len(idx) or not len(spans.row):
        return {}
    j = _latest_at_or_before(list(zip(pid.tolist(), tid.tolist())), t,
                             list(zip(spans.pid.tolist(), spans.tid.tolist())), spans.ts_ns)
    hit = (j >= 0) & (spans.end_ns[np.maximum(j, 0)] > t)
    return dict(zip(idx[hit].tolist(), spans.row[j[hit]].tolist()))


def _gloo_issuers(inst: _Spans, ops: _Spans) -> list[int]:
    """Per gloo span (in `inst` order): the row of the c10d op (one of `ops`, the issuing c10d ops)
    that issued it, -1 if none. gloo runs the work on its own threads, so the issuer is the latest
    c10d op of a fitting type (`_GLOO_ISSUERS`) started in the same process at or before the span."""
    out = np.full(len(inst.row), -1, dtype=np.int64)
    if not len(ops.row):
        return out.tolist()
    type_of = {v: normalize_collective(v) for v in set(inst.name) | set(ops.name)}
    op_types = [type_of[v] for v in ops.name]
    span_types = [type_of[v] for v in inst.name]
    for t in dict.fromkeys(span_types):
        fitting = _GLOO_ISSUERS.get(t, (t,))
        cand = ops.take([j for j, u in enumerate(op_types) if u in fitting])
        pts = np.asarray([i for i, u in enumerate(span_types) if u == t], dtype=np.int64)
        if not len(cand.row):
            continue
        j = _latest_at_or_before([(p,) for p in inst.pid[pts].tolist()], inst.ts_ns[pts],
                                 [(p,) for p in cand.pid.tolist()], cand.ts_ns)
        out[pts[j >= 0]] = cand.row[j[j >= 0]]
    return out.tolist()


def _comm_args_by_row(trace: RankTrace) -> dict[int, dict]:
    ca = {}
    if not trace.comm_args.is_empty():
        for r in trace.comm_args.with_columns(pl.col(pl.Categorical).cast(pl.String)).iter_rows(named=True):
            ca[int(r["row"])] = r
    return ca


def _op_shape(trace: RankTrace, rows: list[int]) -> dict[int, tuple[int, str | None]]:
    """Per op row: (elements of its first input, its first input's type), from `Input Dims` /
    `Input type` (each distinct pair parsed once)."""
    if not rows or trace.op_args.is_empty():
        return {}
    oa = trace.op_args.lazy().filter(pl.col("row").is_in(rows)).select(
        "row", pl.col("input_dims").cast(pl.String), pl.col("input_types").cast(pl.String)).collect()
    parsed: dict[tuple, tuple[int, str | None]] = {}
    out = {}
    for r, d, t in oa.iter_rows():
        if (d, t) not in parsed:
            parsed[d, t] = (_first_tensor_nelems(d), _first_type(t))
        out[int(r)] = parsed[d, t]
    return out


def _pg_sizes(trace: RankTrace) -> dict[str, int]:
    out = {}
    for pg in trace.meta.pg_config or []:
        if isinstance(pg, dict) and pg.get("pg_name") is not None and isinstance(pg.get("pg_size"), int):
            out[str(pg["pg_name"])] = int(pg["pg_size"])
    return out


def _name_classes(trace: RankTrace) -> dict[str, list[str]]:
    """The rank's distinct names in each of `_NAME_CLASSES`, in one pass over the names."""
    out: dict[str, list[str]] = {cls: [] for cls in _NAME_CLASSES}
    for name in distinct_names(trace):
        if _ANY_CLASS.search(name):
            for cls, rx in _NAME_CLASSES.items():
                if rx.search(name):
                    out[cls].append(name)
    return out


def _candidates(trace: RankTrace, host_names: list[str]) -> tuple[_Spans, _Spans]:
    """(the COMM device events, the host ops named one of `host_names`), each in event order."""
    col = event_columns(trace)
    comm = is_kind(col["kind"], DEVICE_KINDS) & (col["kclass"] == int(KernelClass.COMM))
    rows = np.flatnonzero(comm | (is_kind(col["kind"], HOST_OP_KINDS) & named_mask(trace, host_names)))
    found = trace.events.select("name", "ts_ns", "dur_ns", "pid", "tid", "correlation", "external_id")[rows]
    found = found.with_columns(pl.col("name").cast(pl.String), row=pl.Series(rows, dtype=pl.Int64))
    is_comm = comm[rows]
    spans = _Spans.of(found)
    return spans.take(np.flatnonzero(is_comm)), spans.take(np.flatnonzero(~is_comm))


def rank_collectives(trace: RankTrace, timeline: Timeline | None = None, windows=None) -> RankCollectives:
    """The rank's collective instances (see module docstring). `timeline` / `windows`: pass the
    ones the caller already has (summarize_rank) to avoid recomputing them."""
    meta = trace.meta
    rank = meta.dist_rank if meta.dist_rank is not None else meta.rank
    out = RankCollectives(rank=int(rank), hostname=meta.hostname, world_size=meta.world_size)
    windows = windows or step_windows(trace)
    wf = windows.frame
    out.steps = [int(s) for s in wf["step"]]
    out.step_start_ns = [int(a) for a in wf["start_ns"]]
    out.step_end_ns = [int(b) for b in wf["end_ns"]]
    out.steps_source = windows.source
    s_start = wf["start_ns"].to_numpy().astype(np.int64)
    s_end = wf["end_ns"].to_numpy().astype(np.int64)
    s_ids = wf["step"].to_numpy().astype(np.int64)

    # the host ops that may carry a collective's metadata or be one (gloo), by class
    classes = _name_classes(trace)
    dev_comm, host = _candidates(trace, sorted({n for cls, names in classes.items() if cls != "pipeline"
                                                for n in names}))
    if len(dev_comm.row):
        out.source = "device"
        inst = dev_comm
    else:
        # one span per (thread, start, name): some traces record it as op and annotation
        gloo = set(classes["gloo"])
        first: dict[tuple, int] = {}
        for j, key in enumerate(zip(host.tid.tolist(), host.ts_ns.tolist(), host.name)):
            if key[2] in gloo:
                first.setdefault(key, j)
        inst = host.take(list(first.values()))
        if not len(inst.row):
            timeline = timeline or classify_timeline(trace, [s_start, s_end])
            out.step_breakdown_ns = _window_breakdowns(timeline, (s_start, s_end))[0].tolist()
            out.step_tail_ns = out.step_breakdown_ns
            return out
        out.source = "host"
    out.pipeline_stages, out.pipeline_microbatches = _pipeline_marks(classes["pipeline"])
    inst = inst.take(np.lexsort((inst.row, inst.ts_ns)))
    n = len(inst.row)
    rows = inst.row.tolist()
    names = inst.name
    comm_args = _comm_args_by_row(trace)

    # the host ops around each kernel's launch: record_param_comms, nccl:* annotation, c10d::* op
    rpc_row = [-1] * n
    ann_row = [-1] * n
    op_row = [-1] * n
    orphan = [False] * n
    if out.source == "device":
        pts = _launch_points(trace, inst.correlation)
        launched = set(pts[0].tolist())
        orphan = [i not in launched for i in range(n)]
        for cls, target in (("rpc", rpc_row), ("ann", ann_row), ("op", op_row)):
            if not classes[cls]:
                continue
            for i, r in _enclosing(pts, host.named(classes[cls])).items():
                target[i] = r
        # kernels without a launch event: the host op sharing the kernel's External id
        missing = [i for i in range(n) if rpc_row[i] < 0 and ann_row[i] < 0 and op_row[i] < 0]
        if missing:
            ext = inst.external_id
            by_ext: dict[tuple, int] = {}
            wanted = {e for e in (ext[i] for i in missing) if e is not None and e >= 0}
            for r, e, nm in zip(host.row.tolist(), host.external_id, host.name):
                if e not in wanted:
                    continue
                what = "rpc" if nm == _RPC_NAME else "ann" if _ANNOTATION_RX.search(nm) else \
                    "op" if _OP_RX.search(nm) else None
                if what:
                    by_ext.setdefault((e, what), r)
            for i in missing:
                rpc_row[i] = by_ext.get((ext[i], "rpc"), -1)
                ann_row[i] = by_ext.get((ext[i], "ann"), -1)
                op_row[i] = by_ext.get((ext[i], "op"), -1)
    else:
        ann_row = list(rows)          # the gloo span is its own annotation
        op_row = _gloo_issuers(inst, host.named(classes["issue"]))
        at = {r: j for j, r in enumerate(host.row.tolist())}
        issued = [(i, at[r]) for i, r in enumerate(op_row) if r >= 0]
        js = np.asarray([j for _, j in issued], dtype=np.int64)
        pts = (np.asarray([i for i, _ in issued], dtype=np.int64), host.pid[js], host.tid[js], host.ts_ns[js])
    functional, embedding = [False] * n, [False] * n
    for cls, flags in (("functional", functional), ("embedding", embedding)):
        if classes[cls]:
            for i in _enclosing(pts, host.named(classes[cls])):
                flags[i] = True
    shapes = _op_shape(trace, [r for r in ann_row + op_row if r >= 0])
    name_of = dict(zip(host.row.tolist(), host.name))
    pg_sizes = _pg_sizes(trace)
    event_groups: list[Group | None] = []
    type_of: dict[str | None, str] = {}

    def normalized(name: str | None) -> str:
        if name not in type_of:
            type_of[name] = normalize_collective(name)
        return type_of[name]

    for i in range(n):
        own = comm_args.get(rows[i])
        rpc = comm_args.get(rpc_row[i]) if rpc_row[i] >= 0 else None
        metas = [m for m in (own, rpc) if m]
        ctype = "unknown"
        for m in metas:
            ctype = normalized(m.get("collective"))
            if ctype != "unknown":
                break
        if ctype == "unknown" and out.source == "host" and op_row[i] >= 0:
            ctype = normalized(name_of.get(op_row[i]))
        if ctype == "unknown" and ann_row[i] >= 0:
            ctype = normalized(name_of.get(ann_row[i]))
        if ctype == "unknown" and op_row[i] >= 0:
            ctype = normalized(name_of.get(op_row[i]))
        if ctype == "unknown":
            ctype = normalized(names[i])
        pg = next((str(m["pg_name"]) for m in metas if m.get("pg_name") not in (None, "")), DEFAULT_PG)
        seq = next((int(m["seq"]) for m in metas if m.get("seq") is not None and m["seq"] >= 0), -1)
        dtype = next((str(m["dtype"]) for m in metas if m.get("dtype")), None)
        in_b = out_b = -1
        for m in metas:
            size = dtype_bytes(m.get("dtype"))
            if size and m.get("in_msg_nelems") is not None and m["in_msg_nelems"] >= 0 and in_b < 0:
                in_b = int(m["in_msg_nelems"]) * size
            if size and m.get("out_msg_nelems") is not None and m["out_msg_nelems"] >= 0 and out_b < 0:
                out_b = int(m["out_msg_nelems"]) * size
        if in_b < 0:
            for r in (ann_row[i], op_row[i]):
                nel, t = shapes.get(r, (-1, None))
                if nel > 0 and dtype_bytes(t):
                    in_b = nel * dtype_bytes(t)
                    dtype = dtype or t
                    break
        gsize = next((int(m["group_size"]) for m in metas if m.get("group_size") is not None and m["group_size"] > 0),
                     pg_sizes.get(pg, meta.world_size if pg in (DEFAULT_PG, "0") and meta.world_size else -1))
        out.pg.append(pg)
        out.seq.append(seq)
        out.type.append(ctype)
        out.in_bytes.append(in_b)
        out.out_bytes.append(out_b)
        out.group_size.append(int(gsize) if gsize is not None else -1)
        out.dtype.append(dtype or "")
        event_groups.append(_event_group(metas))
    _assign_dims(out, meta, rank, functional, event_groups, embedding)

    start = inst.ts_ns
    end = inst.end_ns
    out.start_ns = start.tolist()
    out.end_ns = end.tolist()
    out.orphan = orphan

    # step of each arrival, and the windows before it
    k = np.searchsorted(s_start, start, side="right") - 1
    in_step = (k >= 0) & (start < s_end[np.maximum(k, 0)]) if len(s_start) else np.zeros(n, bool)
    step = np.where(in_step, s_ids[np.maximum(k, 0)] if len(s_ids) else -1, -1)
    ends_sorted = np.sort(end)
    before = np.searchsorted(ends_sorted, start, side="right") - 1
    trace_start = int(cast(int, trace.events["ts_ns"].min()))
    prev_end = np.where(before >= 0, ends_sorted[np.maximum(before, 0)], trace_start)
    step_start = np.where(in_step, s_start[np.maximum(k, 0)] if len(s_start) else trace_start, trace_start)
    win_start = np.minimum(np.maximum(prev_end, step_start), start)
    if timeline is None:
        timeline = classify_timeline(trace, [s_start, s_end, win_start, start, step_start])
    owned_a, owned_b = _owned_windows(start, end, np.where(in_step, s_start[np.maximum(k, 0)] if len(s_start) else 0, 0),
                                      np.where(in_step, s_end[np.maximum(k, 0)] if len(s_end) else 0, 0))
    pre, since, per_step, tails, owned = _window_breakdowns(
        timeline, (win_start, start), (np.minimum(step_start, start), start), (s_start, s_end),
        (_tail_starts(step, end, s_ids, s_start, s_end), s_end), (owned_a, owned_b))
    out.step = step.astype(np.int64).tolist()
    out.window_start_ns = win_start.tolist()
    out.last_work_ns = _last_work(timeline, start, end).tolist()
    out.pre_ns = pre.ravel().tolist()
    out.since_step_ns = since.ravel().tolist()
    out.step_breakdown_ns = per_step.tolist()
    out.step_tail_ns = tails.tolist()
    out.owned_overlapped_ns = owned[:, CATEGORIES.index("comm_overlapped")].tolist()
    out.owned_exposed_ns = owned[:, CATEGORIES.index("comm_exposed")].tolist()
    return out


def _launch_points(trace: RankTrace, correlations: list[int | None]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where each kernel (in `correlations` order) was launched (`views.first_launch_rows`), as
    (idx, pid, tid, t_ns) of the kernels that have a launch call in the trace."""
    rows = first_launch_rows(trace, np.array([-1 if c is None else c for c in correlations], dtype=np.int64))
    idx = np.flatnonzero(rows >= 0)
    ev = trace.events
    pid, tid, ts = (ev[c].to_numpy()[rows[idx]].astype(np.int64) for c in ("pid", "tid", "ts_ns"))
    return idx, pid, tid, ts


def _pipeline_marks(marks: list[str]) -> tuple[int, int]:
    """(distinct stages, distinct microbatches) of the rank's forward pipeline actions (the names
    `marks` matching `PIPELINE_MARKS`); -1, -1 without."""
    stages, micro = set(), set()
    for name in marks:
        m = PIPELINE_MARKS.match(name)
        assert m is not None                  # `marks` match it
        if m.group(3) is not None:
            stages.add(-1)
            micro.add(int(m.group(3)))
        else:
            stages.add(int(m.group(1)))
            micro.add(int(m.group(2)))
    return (len(stages), len(micro)) if micro else (-1, -1)


def _tail_starts(step: np.ndarray, end: np.ndarray, s_ids: np.ndarray, s_start: np.ndarray,
                 s_end: np.ndarray) -> np.ndarray:
    """Per step window, where its tail starts: the latest end of its collectives (clipped to the
    window); the window start when it has none."""
    last = s_start.astype(np.int64).copy()
    for k, sid in enumerate(s_ids):
        mine = end[step == sid]
        if len(mine):
            last[k] = min(max(int(mine.max()), int(s_start[k])), int(s_end[k]))
    return last


def _event_group(metas: list[dict]) -> Group | None:
    """The process group a collective's own metadata names (`Process Group Ranks` / `Description`)."""
    for m in metas:
        ranks = parse_ranks(m.get("pg_ranks"))
        if ranks:
            desc = m.get("pg_desc") or None
            return Group(ranks, str(m["pg_name"]) if m.get("pg_name") not in (None, "") else None, desc,
                         dim_of_desc(desc))
    return None


#: Role (groups.role_dim) -> the named dimensions that may carry it, first choice first.
_ROLE_CANDIDATES = {"emb": ("emb",), "dp_shard": ("dp_shard", "dp"), "dp": ("dp_replicate", "dp", "dp_shard"),
                    "tp": ("tp",), "cp": ("cp",), "ep": ("ep",), "pp": ("pp",)}


def _assign_dims(out: RankCollectives, meta, rank: int, functional: list[bool],
                 event_groups: list[Group | None], embedding: list[bool] | None = None) -> None:
    """Each instance's dimension (`out.dim`) and, where its own metadata names no group, the group it
    runs in (`out.pg` becomes that group's key, the same on every member); the rank's groups
    (`out.groups`: [dim, source, ranks...]). Roles that land on one unnamed group make one
    dimension, named by `ROLE_PRECEDENCE` (a world group doing all_gather, reduce_scatter and a
    loss all_reduce is one dp_shard dimension, not two). Point-to-point instances in a group of
    more than two ranks are not matched across ranks (`out.pg` unique to the rank): the trace does
    not say which peer they talk to. See analyses/rank/groups.py."""
    world_size = meta.world_size if isinstance(meta.world_size, int) and 0 < meta.world_size <= 1 << 20 else None
    groups = rank_groups(meta.pg_config, rank, world_size)
    by_name = {g.pg_name: g for g in groups if g.pg_name}
    world = tuple(range(world_size)) if world_size else ()
    roles = [role_dim(t, f, e) for t, f, e in zip(out.type, functional, embedding or [False] * len(out.type))]
    named = {g.dim: g for g in groups if g.dim}
    if "tp" in named:          # sequence parallel: DTensor's all_gather / reduce_scatter run in the tp group
        roles = ["tp" if r == "dp_shard" and f else r for r, f in zip(roles, functional)]
    own = []                       # the group each instance's metadata names, None: the role decides
    for i, role in enumerate(roles):
        g = event_groups[i] or by_name.get(out.pg[i])
        own.append(None if g is not None and g.dim is None and g.ranks == world and role else g)
    unnamed = assign_unnamed({r for r, g in zip(roles, own) if r and g is None}, groups, world)
    # pass 1: each instance's group (None: the world) and whether that group names its dimension
    placed: list[tuple[Group | None, str | None]] = []
    for i, role in enumerate(roles):
        group = own[i]
        if group is None and role:
            group = next((named[d] for d in _ROLE_CANDIDATES[role] if d in named), None) or unnamed.get(role)
            if group is not None and group.ranks == world and group.dim is None:
                group = None
        placed.append((group, role))
    # pass 2: one dimension per unnamed group, the highest-precedence role on it
    roles_on: dict[tuple, set[str]] = {}
    for group, role in placed:
        if role and (group is None or group.dim is None):
            roles_on.setdefault(group.ranks if group is not None else world, set()).add(role)
    name_of = {ranks: next(d for d in ROLE_PRECEDENCE if d in rs) for ranks, rs in roles_on.items()}
    # plain all_reduce in two groups (Megatron calls all_reduce for tensor parallel too): the
    # closest-together group is tp, by locality
    stride = {r: (Group(r, None, None, None).stride, len(r)) for r in name_of}
    dp_groups = sorted((r for r, d in name_of.items() if d == "dp" and len(r) >= 2), key=stride.__getitem__)
    if len(dp_groups) >= 2 and "tp" not in name_of.values():
        name_of[dp_groups[0]] = "tp"
    # ... and plain all_reduce closer together than the sharded data-parallel group (FSDP beside
    # Megatron-style tensor parallel): tp, by locality too
    sharded = [r for r, d in name_of.items() if d == "dp_shard"]
    if len(dp_groups) == 1 and sharded and "tp" not in name_of.values() and \
            stride[dp_groups[0]] < min(stride[r] for r in sharded):
        name_of[dp_groups[0]] = "tp"
    seen: dict[tuple, list] = {(g.dim, g.ranks): [g.dim, "pg_desc", *g.ranks] for g in groups
                               if g.dim and len(g.ranks) >= 2}
    for i, (group, role) in enumerate(placed):
        ranks = group.ranks if group is not None else world
        if group is not None and group.dim:
            dim, source = group.dim, "pg_desc"
        elif role:
            dim, source = name_of[ranks], "inferred"
        else:
            dim, source = "", ""
        if group is not None and own[i] is None and ranks != world:
            out.pg[i] = group.key
            out.group_size[i] = len(ranks)
        out.dim.append(dim)
        if dim and len(ranks) >= 2:
            seen.setdefault((dim, ranks), [dim, source, *ranks])
        if out.type[i] in ("send", "recv") and out.seq[i] < 0 and len(ranks) > 2:
            # its own key on each rank: never matched by order (job/p2p.py pairs them by time)
            out.pg[i] = f"{P2P_PG}{rank}@{group.key if group is not None else 'world'}"
    out.groups = list(seen.values())


def _owned_windows(start: np.ndarray, end: np.ndarray, step_start: np.ndarray,
                   step_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per instance (sorted by start): the window whose step-breakdown time it owns (its
    comm_overlapped and comm_exposed ns are `owned_overlapped_ns` / `owned_exposed_ns`). An
    instant where several instances run belongs to the one that started first; only time inside
    the instance's own step window counts (step_end = 0: outside every step; an empty window
    then). Summed over instances: the rank's communication time in its steps, split by instance,
    so that per-dimension sums add up to the step breakdown."""
    prev_max = np.maximum.accumulate(np.concatenate(([np.iinfo(np.int64).min], end)))[:-1]
    a = np.maximum(np.maximum(start, prev_max), step_start)
    return a, np.maximum(np.minimum(end, step_end), a)


def _last_work(timeline: Timeline, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per window [a_i, b_i): the end of the rank's last own work in it (time COMP runs: compute
    kernels, or the training thread's ops on CPU-only jobs), clipped to the window; a_i when none."""
    comp_start = timeline.start_ns[timeline.comp]
    if not len(comp_start):
        return a
    comp_end = comp_start + timeline.length_ns[timeline.comp]
    i = np.searchsorted(comp_start, b, side="left") - 1
    return np.clip(np.where(i >= 0, comp_end[np.maximum(i, 0)], a), a, b)


def _window_breakdowns(timeline: Timeline, *windows: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """Per list of windows (a, b): ns per category in each [a_i, b_i); time no segment covers goes
    to idle_other (as in step_breakdown). All lists in one `in_windows` pass."""
    a = np.concatenate([np.asarray(w[0], dtype=np.int64) for w in windows])
    b = np.concatenate([np.asarray(w[1], dtype=np.int64) for w in windows])
    parts = timeline.in_windows(a, b)
    parts[:, CATEGORIES.index("idle_other")] += np.maximum((b - a) - parts.sum(axis=1), 0)
    return np.split(parts, np.cumsum([len(w[0]) for w in windows])[:-1])
