"""torch.distributed Flight Recorder dumps -> FrDump (one per rank).

With `TORCH_FR_BUFFER_SIZE` (older: `TORCH_NCCL_TRACE_BUFFER_SIZE`) set, every process group of a
rank records its last collectives in a ring buffer, which is dumped per rank on a watchdog timeout
(`TORCH_NCCL_DUMP_ON_TIMEOUT`, files `nccl_trace_rank_<r>` by default) or on demand
(`torch._C._distributed_c10d._dump_fr_trace()`: a pickle; `_dump_fr_trace_json()`: JSON). Format
2.x (torch 2.5-2.13): a dict of `version`, `pg_config` (per process group: name, desc, ranks as
text "[0, 1]"), `pg_status` (per local group id: last enqueued / started / completed sequence
number; not read: on gloo it counts failed collectives as completed), `entries` (one per
collective or point-to-point op: record_id, pg_id, process_group (name, desc),
collective_seq_id, p2p_seq_id, op_id, profiling_name "nccl:all_reduce" /
"gloo:send 0->1", input/output sizes and dtypes, state scheduled | started | completed, retired,
time_created_ns, time_discovered_started_ns / _completed_ns, duration_ms (NCCL with timing),
timeout_ms, is_p2p, frames [name, filename, line] (pickle only)), and `comm_lib_version` or
`nccl_version`. The dump names no rank: it comes from the file name (the digits it ends with:
`rank_3`, `nccl_trace_rank_3`, `fr_trace_3.json`; discovery tells dumps from other files:
ingest/discover.py `is_fr_dump`).

The entries come out as columns (`FrDump`: one numpy array per field the verdict reads, the texts
interned), each entry whole (`FrEntry`) only on demand, and Python frames only for the entries
asked for (`frames_last`). Pickles are read by the C reader of ingest/_frpickle.c where it is built
(it walks the opcodes itself and builds only those columns: no dict of the dump is ever made), else,
and for whatever that reader leaves to it (an opcode or a shape no torch dump has), by the restricted
unpickler of ingest/safe_pickle.py (plain data only: nothing is imported or called; hashing bounded
before unpickling); JSON by msgspec. Both give the same columns (tests/test_frpickle.py). Bounded: a
dump larger than `MAX_DUMP_BYTES` is not read, and the walk over entries, frames and sizes (shared
references count at each appearance) stops past `MAX_WALK_PER_BYTE` per byte of the file.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import msgspec
import numpy as np

from rankscope.ingest.discover import fr_dump_rank, open_regular
from rankscope.ingest.errors import TraceError
from rankscope.ingest.safe_pickle import read_plain_pickle

try:
    from rankscope.ingest import _frpickle
except ImportError:  # pragma: no cover  (no C compiler at install: the restricted unpickler)
    _frpickle = None  # type: ignore[assignment]  # no C module: None (its stub types the built one)

#: A frame as (function name, file name, line).
Frame = tuple[str, str, int]
#: Largest dump read: torch's default buffer (2,000 entries) dumps well under 10 MB; the C reader holds up
#: to ~28 bytes per byte of a hostile file, so this bounds its memory to ~7 GB at worst.
MAX_DUMP_BYTES = 256 << 20
#: Entries, frames and size values walked (shared ones at each appearance), per byte of the file.
MAX_WALK_PER_BYTE = 64
MIN_WALK_LIMIT = 1 << 20
_STATES: tuple[Literal["scheduled", "started", "completed"], ...] = ("scheduled", "started", "completed")
STATE_CODE: dict[str, int] = {name: code for code, name in enumerate(_STATES)}
_INT64 = (-(1 << 63), 1 << 63)


class FrEntry(msgspec.Struct, gc=False):
    """One recorded collective or point-to-point op of one rank, whole (`FrDump.entry`)."""
    record_id: int
    pg_name: str                    # the process group's name (the same on every member)
    pg_desc: str
    seq: int                        # collective_seq_id; p2p_seq_id for a point-to-point op
    is_p2p: bool
    op: str                         # all_reduce, broadcast, send, recv, coalesced, ...
    detail: str                     # what follows the op in profiling_name ("0->1" for a send)
    input_sizes: str                # as the dump gives them, e.g. "[[4096]]"
    input_dtypes: str
    output_sizes: str
    output_dtypes: str
    state: Literal["scheduled", "started", "completed"]
    created_ns: int
    started_ns: int | None
    completed_ns: int | None
    duration_ms: float | None
    timeout_ms: int | None
    frames: list[Frame]


class FrGroupConfig(msgspec.Struct, gc=False):
    name: str
    desc: str
    ranks: list[int] | None         # None: the dump gives none


@dataclass(eq=False)
class FrDump:
    """One rank's dump: its entries as columns, one row per entry, in record id order. Texts are
    interned: `pg` indexes `pgs` ((name, desc) of the process group), `call` indexes `calls` ((op,
    detail) of the profiling name), `sizes` (n x 4: input sizes, input dtypes, output sizes, output
    dtypes) indexes `texts`. Times are ns since the epoch, 0 where not recorded; durations and
    timeouts NaN where not recorded. `frames`: per row asked for, its Python frames."""
    file: str
    rank: int                       # from the file name
    format: Literal["pickle", "json"]
    version: str
    backend: str                    # from the ops' names: nccl, gloo, ...
    groups: list[FrGroupConfig]
    comm_lib_version: str
    pgs: list[tuple[str, str]]
    calls: list[tuple[str, str]]
    texts: list[str]
    record_id: np.ndarray           # int64
    pg: np.ndarray                  # int32
    seq: np.ndarray                 # int64: collective_seq_id; p2p_seq_id for a point-to-point op
    is_p2p: np.ndarray              # bool
    call: np.ndarray                # int32
    sizes: np.ndarray               # int32 (n, 4)
    state: np.ndarray               # int8: STATE_CODE
    created_ns: np.ndarray          # int64
    started_ns: np.ndarray          # int64, 0: not recorded
    completed_ns: np.ndarray        # int64, 0: not recorded
    duration_ms: np.ndarray         # float64, NaN: not recorded
    timeout_ms: np.ndarray          # float64, NaN: not recorded
    frames: dict[int, list[Frame]] = field(default_factory=dict)
    skipped_entries: int = 0        # entries without the fields an entry needs

    def __len__(self) -> int:
        return len(self.record_id)

    def entry(self, i: int) -> FrEntry:
        """Row `i` as one FrEntry (for the few entries a verdict shows)."""
        name, desc = self.pgs[self.pg[i]]
        op, detail = self.calls[self.call[i]]
        sizes = [self.texts[j] for j in self.sizes[i]]
        started, completed = int(self.started_ns[i]), int(self.completed_ns[i])
        duration, timeout = float(self.duration_ms[i]), float(self.timeout_ms[i])
        return FrEntry(int(self.record_id[i]), name, desc, int(self.seq[i]), bool(self.is_p2p[i]), op, detail,
                       sizes[0], sizes[1], sizes[2], sizes[3], _STATES[self.state[i]], int(self.created_ns[i]),
                       started or None, completed or None,
                       None if math.isnan(duration) else duration, None if math.isnan(timeout) else int(timeout),
                       self.frames.get(i, []))


def read_fr_dump(path: str | Path, frames_last: int | None = None) -> FrDump:
    """Read one dump (pickle or JSON) safely. `frames_last`: keep the Python frames of each group's
    last `frames_last` entries only (collectives and p2p ops apart); None: of every entry. Raises
    TraceError (one line, without the file name)."""
    rank = fr_dump_rank(path)
    if rank is None:
        raise TraceError("no rank in the file name (a Flight Recorder dump is named like rank_3 or "
                         "nccl_trace_rank_3)")
    try:
        with open_regular(path) as f:
            size = f.seek(0, 2)
            if size > MAX_DUMP_BYTES:
                raise TraceError(f"{size:,} bytes: larger than a Flight Recorder dump can be "
                                 f"({MAX_DUMP_BYTES:,} at most): not read")
            f.seek(0)
            data = f.read()
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    if not data:
        raise TraceError("empty file")
    limit = max(MIN_WALK_LIMIT, MAX_WALK_PER_BYTE * len(data))
    try:
        fmt: Literal["pickle", "json"]
        if data[:1] == b"\x80":
            raw = _c_entries(data, limit) if _frpickle is not None else None
            if raw is None:            # not built, or left to the restricted unpickler
                raw = _plain_entries(read_plain_pickle(data, "Flight Recorder dump"), limit)
            fmt = "pickle"
        elif data.lstrip()[:1] == b"{":
            try:
                raw, fmt = _plain_entries(msgspec.json.decode(data), limit), "json"
            except msgspec.DecodeError as exc:
                raise TraceError(f"truncated or damaged JSON ({exc})") from None
        else:
            raise TraceError("not a Flight Recorder dump (neither a pickle nor a JSON object)")
        return _dump(str(path), rank, fmt, raw, frames_last)
    except _TOO_SHARED:
        raise TraceError(f"Flight Recorder dump: its shared references repeat entries, frames and sizes beyond "
                         f"{limit:,} values ({MAX_WALK_PER_BYTE} per byte of the file): refused, not expanded"
                         ) from None


class _TooShared(Exception):
    """The walk over entries, frames and sizes passed its limit."""


_TOO_SHARED = (_TooShared,) if _frpickle is None else (_TooShared, _frpickle.WalkLimit)
#: Pickles are read by the C reader (else all by the restricted unpickler: ~10x slower).
C_READER = _frpickle is not None


def _text(v, default: str = "") -> str:
    return v if isinstance(v, str) else default


def _int(v) -> int | None:
    """An int in int64's range (a bool is no int here)."""
    return v if type(v) is int and _INT64[0] <= v < _INT64[1] else None


def _ranks(v) -> list[int] | None:
    """A group's ranks from pg_config ("[0, 1]" or a list), sorted; None where it gives none. Every
    dump of a job repeats its pg_config (at 1,024 ranks: ~3,000 numbers a dump), so a text is parsed
    once per process (`_RANKS_OF_TEXT`; the lists are shared: read them, never change them)."""
    if isinstance(v, str):
        if v in _RANKS_OF_TEXT:
            return _RANKS_OF_TEXT[v]
        if len(_RANKS_OF_TEXT) > 4096:
            _RANKS_OF_TEXT.clear()
        ranks = _RANKS_OF_TEXT[v] = _ranks([int(x) for x in re.findall(r"\d{1,10}", v[:1 << 20])])
        return ranks
    if not isinstance(v, list) or not v or not all(isinstance(r, int) and not isinstance(r, bool) for r in v):
        return None
    return sorted(set(v))


_RANKS_OF_TEXT: dict[str, list[int] | None] = {}


#: A text column: (int32 codes, the texts they index).
Texts = tuple[np.ndarray, list[str]]


@dataclass
class RawEntries:
    """A dump's usable entries in file order, the fields the verdict reads as they are there (what
    both readers give, `_dump` finishes). Texts as (codes, table): per entry the index of its text in
    the table, which lists them in order of first use. Sizes and dtypes as compact text ("[[4096]]",
    "[Float]"; "?" for anything but lists of ints or strings); ints outside int64 count as none."""
    top: dict                      # version, pg_config, comm_lib_version, nccl_version: as in the dump
    total: int                     # entries in the dump, usable or not
    where: np.ndarray              # int64: each usable entry's place in the dump's entries
    record_id: np.ndarray          # int64 (0: none)
    coll_seq: np.ndarray           # int64
    p2p_seq: np.ndarray            # int64
    has_p2p_seq: np.ndarray        # bool
    is_p2p: np.ndarray             # bool: the entry's is_p2p is True
    state: np.ndarray              # int8
    created_ns: np.ndarray         # int64
    started_ns: np.ndarray         # int64 (0: none)
    completed_ns: np.ndarray       # int64 (0: none)
    duration_ms: np.ndarray        # float64 (NaN: none)
    timeout_ms: np.ndarray         # float64 (NaN: none)
    pg_name: Texts
    pg_desc: Texts
    profiling_name: Texts
    sizes: list[Texts]             # input sizes, input dtypes, output sizes, output dtypes
    frames: Callable[[list[int]], list[list[Frame]]]     # places in the dump's entries -> their frames


def _plain_entries(raw, limit: int) -> RawEntries:
    """RawEntries from the plain data of a dump (unpickled or JSON), counting what it walks."""
    if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list):
        raise TraceError(f"a {type(raw).__name__} without 'entries': not a Flight Recorder dump")
    walked = [0]

    def walk(n: int) -> None:
        walked[0] += n
        if walked[0] > limit:
            raise _TooShared

    def sizes(v) -> str:
        if type(v) is not list:
            return "?"
        walk(len(v))
        parts = []
        for item in v:
            kind = type(item)
            if kind is list:
                walk(len(item))
                for x in item:
                    if _int(x) is None:
                        return "?"
                parts.append(str(item))          # a list of ints only: "[4096, 1024]"
            elif kind is str:
                parts.append(item)
            elif _int(item) is not None:
                parts.append(str(item))
            else:
                return "?"
        return "[" + ", ".join(parts) + "]"

    entries = raw["entries"]
    config = raw.get("pg_config")
    walk(len(config) if isinstance(config, dict) else 0)
    cols: dict[str, list] = {k: [] for k in ("where", "record_id", "coll_seq", "p2p_seq", "has_p2p_seq", "is_p2p",
                                             "state", "created_ns", "started_ns", "completed_ns", "duration_ms",
                                             "timeout_ms")}
    tables: list[dict[str, int]] = [{} for _ in range(7)]
    codes: list[list[int]] = [[] for _ in range(7)]

    def code(k: int, text: str) -> None:
        table = tables[k]
        codes[k].append(table.setdefault(text, len(table)))

    for i, e in enumerate(entries):
        walk(1)
        if type(e) is not dict:
            continue
        get = e.get
        name, pg, created, coll_seq = get("profiling_name"), get("process_group"), _int(get("time_created_ns")), \
            _int(get("collective_seq_id"))
        if type(name) is not str or type(pg) not in (list, tuple) or not pg or created is None or coll_seq is None:
            continue
        pg0 = pg[0]
        if type(pg0) is not str and _int(pg0) is None:
            pg0 = "?"                              # neither a name nor a number
        p2p_seq, state, duration = _int(get("p2p_seq_id")), get("state"), get("duration_ms")
        started, completed, timeout = _int(get("time_discovered_started_ns")), \
            _int(get("time_discovered_completed_ns")), _int(get("timeout_ms"))
        c = cols
        c["where"].append(i)
        c["record_id"].append(_int(get("record_id")) or 0)
        c["coll_seq"].append(coll_seq)
        c["p2p_seq"].append(p2p_seq or 0)
        c["has_p2p_seq"].append(p2p_seq is not None)
        c["is_p2p"].append(get("is_p2p") is True)
        c["state"].append(STATE_CODE.get(state, 0) if isinstance(state, str) else 0)
        c["created_ns"].append(created)
        c["started_ns"].append(started or 0)
        c["completed_ns"].append(completed or 0)
        duration = (float(duration) if duration is not None and (type(duration) is float or _int(duration) is not None)
                    else math.nan)
        c["duration_ms"].append(duration if math.isfinite(duration) else math.nan)
        c["timeout_ms"].append(math.nan if timeout is None else float(timeout))
        code(0, pg0 if type(pg0) is str else str(pg0))
        code(1, _text(pg[1]) if len(pg) > 1 else "")
        code(2, name)
        for k, key in enumerate(("input_sizes", "input_dtypes", "output_sizes", "output_dtypes"), 3):
            code(k, sizes(get(key)))
    known: dict[int, list[Frame]] = {}        # id of a raw frames list -> its conversion

    def frames(places: list[int]) -> list[list[Frame]]:
        out: list[list[Frame]] = []
        for i in places:
            v = entries[i].get("frames")
            if type(v) is not list:
                out.append([])
                continue
            walk(len(v))
            got = known.get(id(v))
            if got is None:
                got = known[id(v)] = [(_text(f.get("name"), "?"), _text(f.get("filename"), "?"),
                                       _int(f.get("line")) or 0) for f in v if type(f) is dict]
            out.append(got)
        return out

    def arr(key: str, dtype) -> np.ndarray:
        return np.array(cols[key], dtype=dtype)

    texts = [(np.array(c, dtype=np.int32), list(t)) for c, t in zip(codes, tables)]
    i64 = np.int64
    return RawEntries(
        top={k: raw.get(k) for k in ("version", "pg_config", "comm_lib_version", "nccl_version")},
        total=len(entries), where=arr("where", i64), record_id=arr("record_id", i64), coll_seq=arr("coll_seq", i64),
        p2p_seq=arr("p2p_seq", i64), has_p2p_seq=arr("has_p2p_seq", bool), is_p2p=arr("is_p2p", bool),
        state=arr("state", np.int8), created_ns=arr("created_ns", i64), started_ns=arr("started_ns", i64),
        completed_ns=arr("completed_ns", i64), duration_ms=arr("duration_ms", np.float64),
        timeout_ms=arr("timeout_ms", np.float64), pg_name=texts[0], pg_desc=texts[1], profiling_name=texts[2],
        sizes=texts[3:], frames=frames)


def _c_entries(data: bytes, limit: int) -> RawEntries | None:
    """RawEntries by the C reader, or None where it leaves the dump to the restricted unpickler."""
    got = _frpickle.read(data, limit)
    if got is None:
        return None
    top, total, numbers, texts, frames = got
    i64, f64 = np.int64, np.float64
    (where, record_id, coll_seq, p2p_seq, has_p2p_seq, is_p2p, state, created, started, completed, duration,
     timeout) = (np.frombuffer(b, dtype=t) for b, t in zip(numbers, (i64, i64, i64, i64, bool, bool, np.int8, i64,
                                                                    i64, i64, f64, f64)))
    pg_name, pg_desc, profiling_name, *sizes = ((np.frombuffer(c, dtype=np.int32), t) for c, t in texts)
    return RawEntries(top, total, where, record_id, coll_seq, p2p_seq, has_p2p_seq, is_p2p, state, created, started,
                      completed, duration, timeout, pg_name, pg_desc, profiling_name, sizes, frames)


def _merged(columns: list[Texts]) -> tuple[np.ndarray, list[str]]:
    """Several text columns over one table (the first column's texts first): (n x k codes, table)."""
    table: dict[str, int] = {}
    codes = [np.array([table.setdefault(t, len(table)) for t in texts], dtype=np.int32)[c] if len(c) else c
             for c, texts in columns]
    return np.stack(codes, axis=1), list(table)


def _dump(file: str, rank: int, fmt: Literal["pickle", "json"], raw: RawEntries, frames_last: int | None) -> FrDump:
    top = raw.top
    version = top.get("version")
    if not isinstance(version, str) or not version.startswith("2."):
        raise TraceError(f"Flight Recorder format version {str(version)[:20]!r}: only 2.x is read")
    n = len(raw.where)
    if raw.total and not n:
        raise TraceError(f"none of its {raw.total:,} entries has the fields of a Flight Recorder "
                         "entry (profiling_name, process_group, collective_seq_id, time_created_ns)")
    groups = []
    config = top.get("pg_config")
    for key, pg in (config.items() if isinstance(config, dict) else ()):
        if type(pg) is dict:                   # at 1,024 ranks: ~140 groups in every dump
            name, desc = pg.get("name"), pg.get("desc")
            groups.append(FrGroupConfig(name if type(name) is str else key if type(key) is str else "",
                                        desc if type(desc) is str else "", _ranks(pg.get("ranks"))))
    order = np.argsort(raw.record_id, kind="stable")
    name_of, names = raw.profiling_name
    name_of = name_of[order]
    calls, backends, p2p_ops = [], set(), []
    for name in names:                         # "nccl:all_reduce", "gloo:send 0->1", "all_reduce"
        backend, _, op_text = name.partition(":") if ":" in name else ("", "", name)
        op, _, detail = op_text.strip().partition(" ")
        calls.append((op or "?", detail))
        backends.add(backend)
        p2p_ops.append(op in ("send", "recv"))
    is_p2p = raw.is_p2p[order] | np.array(p2p_ops, dtype=bool)[name_of]
    use_p2p = is_p2p & raw.has_p2p_seq[order]
    (pg_name, pg_names), (pg_desc, pg_descs) = raw.pg_name, raw.pg_desc
    width = max(len(pg_descs), 1)
    pairs, first, pg = np.unique(pg_name.astype(np.int64) * width + pg_desc, return_index=True, return_inverse=True)
    by_first = np.argsort(first)                       # the (name, desc) pairs in order of first use
    pgs = [(pg_names[p // width], pg_descs[p % width]) for p in pairs[by_first].tolist()]
    pg = np.argsort(by_first).astype(np.int32)[pg.reshape(-1)][order]
    sizes, texts = _merged(raw.sizes)
    dump = FrDump(
        file=file, rank=rank, format=fmt, version=version,
        backend=", ".join(sorted(b for b in backends if b)) or "unknown", groups=groups,
        comm_lib_version=_text(top.get("comm_lib_version") or top.get("nccl_version")),
        pgs=pgs, calls=calls, texts=texts, record_id=raw.record_id[order], pg=pg,
        seq=np.where(use_p2p, raw.p2p_seq[order], raw.coll_seq[order]), is_p2p=is_p2p, call=name_of,
        sizes=sizes[order], state=raw.state[order], created_ns=raw.created_ns[order],
        started_ns=raw.started_ns[order], completed_ns=raw.completed_ns[order], duration_ms=raw.duration_ms[order],
        timeout_ms=raw.timeout_ms[order], skipped_entries=raw.total - n)
    rows = np.arange(n) if frames_last is None else last_of_streams(dump, frames_last)
    places = raw.where[order][rows].tolist()
    dump.frames = dict(zip(rows.tolist(), raw.frames(places)))
    return dump


def last_of_streams(dump: FrDump, k: int) -> np.ndarray:
    """The rows of each stream's (a process group's collectives, or its p2p ops, by group name)
    last `k` entries, ascending."""
    if not len(dump):
        return np.zeros(0, np.int64)
    names: dict[str, int] = {}
    stream = np.array([names.setdefault(name, len(names)) for name, _ in dump.pgs], dtype=np.int64)
    key = stream[dump.pg] * 2 + dump.is_p2p
    order = np.argsort(key, kind="stable")
    ranked = key[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    ends = np.r_[starts[1:], len(ranked)]
    from_end = np.repeat(ends, ends - starts) - np.arange(len(ranked))
    return np.sort(order[from_end <= k])
