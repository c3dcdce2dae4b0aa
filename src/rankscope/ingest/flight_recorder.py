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

Pickles are read by the restricted reader of ingest/safe_pickle.py (plain data only: nothing is
imported or called; hashing bounded before unpickling). Bounded: a dump larger than
`MAX_DUMP_BYTES` is not read, and the walk over entries, frames and sizes (shared references count
at each appearance) stops past `MAX_WALK_PER_BYTE` per byte of the file.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable, Literal

import msgspec

from rankscope.ingest.discover import fr_dump_rank, open_regular
from rankscope.ingest.errors import TraceError
from rankscope.ingest.safe_pickle import read_plain_pickle

#: A frame as (function name, file name, line).
Frame = tuple[str, str, int]
#: Largest dump read: torch's default buffer (2,000 entries) dumps well under 10 MB.
MAX_DUMP_BYTES = 1 << 30
#: Entries, frames and size values walked (shared ones at each appearance), per byte of the file.
MAX_WALK_PER_BYTE = 64
MIN_WALK_LIMIT = 1 << 20
_STATES = ("scheduled", "started", "completed")


class FrEntry(msgspec.Struct, gc=False):
    """One recorded collective or point-to-point op of one rank."""
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


class FrDump(msgspec.Struct):
    file: str
    rank: int                       # from the file name
    format: Literal["pickle", "json"]
    version: str
    backend: str                    # from the ops' names: nccl, gloo, ...
    groups: list[FrGroupConfig]
    entries: list[FrEntry]                    # by record_id
    comm_lib_version: str
    skipped_entries: int = 0                  # entries without the fields an entry needs


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
    fmt: Literal["pickle", "json"]
    if data[:1] == b"\x80":
        raw, fmt = read_plain_pickle(data, "Flight Recorder dump"), "pickle"
    elif data.lstrip()[:1] == b"{":
        try:
            raw, fmt = msgspec.json.decode(data), "json"
        except msgspec.DecodeError as exc:
            raise TraceError(f"truncated or damaged JSON ({exc})") from None
    else:
        raise TraceError("not a Flight Recorder dump (neither a pickle nor a JSON object)")
    if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list):
        raise TraceError(f"a {type(raw).__name__} without 'entries': not a Flight Recorder dump")
    version = raw.get("version")
    if not isinstance(version, str) or not version.startswith("2."):
        raise TraceError(f"Flight Recorder format version {str(version)[:20]!r}: only 2.x is read")
    try:
        reader = _Reader(max(MIN_WALK_LIMIT, MAX_WALK_PER_BYTE * len(data)), frames_last)
        return reader.dump(str(path), rank, fmt, version, raw)
    except _TooShared as exc:
        raise TraceError(f"Flight Recorder dump: its shared references repeat entries, frames and sizes beyond "
                         f"{exc.limit:,} values ({MAX_WALK_PER_BYTE} per byte of the file): refused, not expanded"
                         ) from None


class _TooShared(Exception):
    def __init__(self, limit: int) -> None:
        self.limit = limit


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _time(v) -> int | None:
    """A time in ns; 0 (JSON's "not known") and non-numbers are None."""
    t = _int(v)
    return t if t else None


def _text(v, default: str = "") -> str:
    return v if isinstance(v, str) else default


def _ranks(v) -> list[int] | None:
    if isinstance(v, str):
        v = [int(x) for x in re.findall(r"\d{1,10}", v[:1 << 20])]
    if not isinstance(v, list) or not v or not all(isinstance(r, int) and not isinstance(r, bool) for r in v):
        return None
    return sorted(set(v))


class _Reader:
    """Plain dump -> FrDump, counting what it walks (`_TooShared` past `limit`)."""

    def __init__(self, limit: int, frames_last: int | None) -> None:
        self.limit = limit
        self.walked = 0
        self.frames_last = frames_last
        self.frames: dict[int, list[Frame]] = {}          # id of a raw frames list -> its conversion

    def _walk(self, n: int) -> None:
        self.walked += n
        if self.walked > self.limit:
            raise _TooShared(self.limit)

    def dump(self, file: str, rank: int, fmt: Literal["pickle", "json"], version: str, raw: dict) -> FrDump:
        groups = []
        config = raw.get("pg_config")
        for key, pg in (config.items() if isinstance(config, dict) else ()):
            self._walk(1)
            if isinstance(pg, dict):
                groups.append(FrGroupConfig(_text(pg.get("name"), _text(key)), _text(pg.get("desc")),
                                            _ranks(pg.get("ranks"))))
        entries, skipped = [], 0
        backends: set[str] = set()
        for e in raw["entries"]:
            self._walk(1)
            entry = self._entry(e) if isinstance(e, dict) else None
            if entry is None:
                skipped += 1
                continue
            entries.append(entry[0])
            backends.add(entry[1])
        if raw["entries"] and not entries:
            raise TraceError(f"none of its {len(raw['entries']):,} entries has the fields of a Flight Recorder "
                             "entry (profiling_name, process_group, collective_seq_id, time_created_ns)")
        entries.sort(key=lambda e: e.record_id)
        self._add_frames(entries)
        lib = raw.get("comm_lib_version") or raw.get("nccl_version")
        return FrDump(file=file, rank=rank, format=fmt, version=version,
                      backend=", ".join(sorted(b for b in backends if b)) or "unknown", groups=groups,
                      entries=entries, comm_lib_version=_text(lib), skipped_entries=skipped)

    def _entry(self, e: dict) -> tuple[FrEntry, str] | None:
        get: Callable[[str], Any] = e.get            # the dump's values, each checked as it is read
        name, pg, created, coll_seq = get("profiling_name"), get("process_group"), get("time_created_ns"), \
            get("collective_seq_id")
        if type(name) is not str or type(pg) not in (list, tuple) or not pg or type(created) is not int \
                or type(coll_seq) is not int:
            return None
        backend, _, op_text = name.partition(":") if ":" in name else ("", "", name)
        op, _, detail = op_text.strip().partition(" ")
        is_p2p = get("is_p2p") is True or op in ("send", "recv")
        p2p_seq, state, duration = get("p2p_seq_id"), get("state"), get("duration_ms")
        sizes = self._sizes
        record_id, name0 = get("record_id"), pg[0]
        entry = FrEntry(
            record_id if type(record_id) is int else 0, name0 if type(name0) is str else str(name0)[:64],
            _text(pg[1]) if len(pg) > 1 else "",
            p2p_seq if is_p2p and type(p2p_seq) is int else coll_seq, is_p2p, op or "?", detail,
            sizes(get("input_sizes")), sizes(get("input_dtypes")), sizes(get("output_sizes")),
            sizes(get("output_dtypes")), state if state in _STATES else "scheduled", created,
            _time(get("time_discovered_started_ns")), _time(get("time_discovered_completed_ns")),
            float(duration) if type(duration) in (int, float) and math.isfinite(duration) else None,
            _int(get("timeout_ms")), get("frames"))         # frames raw until `_add_frames`
        return entry, backend

    def _sizes(self, v) -> str:
        """Sizes or dtypes as compact text ("[[4096]]", "[Float]"): lists of ints or strings, one
        level of nesting; anything else is "?"."""
        if type(v) is not list:
            return "?"
        self._walk(len(v))
        parts = []
        for item in v:
            kind = type(item)
            if kind is list:
                self._walk(len(item))
                for x in item:
                    if type(x) is not int:
                        return "?"
                parts.append(str(item))          # a list of ints only: "[4096, 1024]"
            elif kind is str:
                parts.append(item)
            elif kind is int:
                parts.append(str(item))
            else:
                return "?"
        return "[" + ", ".join(parts) + "]"

    def _add_frames(self, entries: list[FrEntry]) -> None:
        """The entries' raw frames converted: every entry's, or each stream's last `frames_last`."""
        seen: dict[tuple[str, bool], int] = {}
        for e in reversed(entries):
            key = (e.pg_name, e.is_p2p)
            seen[key] = n = seen.get(key, 0) + 1
            e.frames = self._frames(e.frames) if self.frames_last is None or n <= self.frames_last else []

    def _frames(self, v) -> list[Frame]:
        if not isinstance(v, list):
            return []
        known = self.frames.get(id(v))
        self._walk(len(v))
        if known is not None:
            return known
        out = [(_text(f.get("name"), "?"), _text(f.get("filename"), "?"), _int(f.get("line")) or 0)
               for f in v if isinstance(f, dict)]
        self.frames[id(v)] = out
        return out
