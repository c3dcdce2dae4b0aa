"""Kineto / Chrome-trace JSON (.json, .json.gz) -> RankTrace.

Streaming: the file is read (and gunzipped, with ISA-L) in chunks; each chunk of whole events is
decoded by msgspec into Structs and turned into typed columns, then dropped. Peak memory is the
columns plus one chunk, not the whole text nor a Python object per event.

Robustness, in order of cost:
  1. fast path: a chunk decodes as `list[Event]` (typed Structs, unknown keys skipped in C);
  2. a chunk with a badly typed event (e.g. `"args": []`) is decoded event by event, bad fields
     dropped, and the count reported; NaN / Infinity literals (not JSON) are read as values that
     are not numbers;
  3. a file cut mid-write (or with garbage inside) keeps every complete event before the cut and
     says how many were salvaged;
  4. no trace inside (empty, not JSON, JSON without events, corrupt gzip) -> TraceError, one line.
An event whose ts or dur cannot be a time (not a number, out of range, negative or over a day, a
day away from the others) is dropped alone and counted per reason (`_drop_unusable_times`).
A run of whitespace between tokens is not kept in memory (`_Gaps`). A bare top-level array of
events ("chrome-array") says so in the problems; torch 1.x wrote one with no categories, its
kinds are taken from its process names (`LEGACY_PROCESS_KINDS`).
"""
from __future__ import annotations

import mmap
import os
import re
import stat
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import msgspec
import numpy as np
import polars as pl

from rankscope.ingest import reuse
from rankscope.ingest.columns import DTYPES, T_ABSENT, T_NOT_A_NUMBER, Col, columnize, scan_json, scan_state
from rankscope.ingest.discover import checked_rank, open_regular, rank_from_filename
from rankscope.ingest.errors import TraceError
from rankscope.model import (CATEGORY_KINDS, DEVICE_KINDS, PROFILER_STEP_PATTERN, Kind, RankMeta, RankTrace,
                             event_kernel_classes)

CHUNK_BYTES = 2 << 20          # decompressed bytes decoded at once (transient memory ~6x this)
HEADER_LIMIT = 64 << 20        # give up looking for "traceEvents" after this many bytes
#: The longest event read (its text, whitespace runs aside): no profiler writes one near it (the
#: corpus' longest string, a kernel name, has 5,160 characters); a longer one, e.g. a name of
#: 100 MB, cuts the file there.
MAX_EVENT_BYTES = 16 << 20
#: A gzip file stops being read once its text passes this many times its size (and 1 GiB): real
#: traces compress 10-30x (the corpus at most 30x), a gzip bomb up to ~1,000x.
MAX_GZIP_RATIO = 100
MIN_GZIP_LIMIT = 1 << 30
_JSON_WS = b" \t\n\r"
_NON_WS = re.compile(rb"[^ \t\n\r]")
_BOUNDARY = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")
#: Flow categories that link a launch to its device activity; resolved into `correlation`.
LAUNCH_FLOW_CATEGORIES = ("ac2g", "async", "async_cpu_to_gpu")
_EVENTS_KEY = b'"traceEvents"'


# ----------------------------------------------------------------------------------------------
# Structs: the keys we keep. Values are `Any` so that a badly typed value never fails a chunk;
# the column extractor checks types and substitutes defaults.
class Args(msgspec.Struct, frozen=True, gc=False):
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_2021: Any = msgspec.field(default=None, name="external id")
    correlation: Any = None
    device: Any = None
    stream: Any = None
    # collectives
    collective_name: Any = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    in_split_size: Any = msgspec.field(default=None, name="In split size")
    out_split_size: Any = msgspec.field(default=None, name="Out split size")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    # device activity
    registers_per_thread: Any = msgspec.field(default=None, name="registers per thread")
    shared_memory: Any = msgspec.field(default=None, name="shared memory")
    blocks_per_sm: Any = msgspec.field(default=None, name="blocks per SM")
    warps_per_sm: Any = msgspec.field(default=None, name="warps per SM")
    grid: Any = None
    block: Any = None
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    bytes: Any = None
    bandwidth: Any = msgspec.field(default=None, name="memory bandwidth (GB/s)")
    # operators
    input_dims: msgspec.Raw = msgspec.field(default=None, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=None, name="Input type")
    call_stack: Any = msgspec.field(default=None, name="Call stack")
    sequence_number: Any = msgspec.field(default=None, name="Sequence number")
    fwd_thread_id: Any = msgspec.field(default=None, name="Fwd thread id")
    flops: Any = None
    python_id: Any = msgspec.field(default=None, name="Python id")
    python_parent_id: Any = msgspec.field(default=None, name="Python parent id")
    # [memory] instants
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    mem_device_id: Any = msgspec.field(default=None, name="Device Id")
    mem_device_type: Any = msgspec.field(default=None, name="Device Type")
    addr: Any = msgspec.field(default=None, name="Addr")
    # metadata events
    name: Any = None


class Event(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    cat: Any = None
    pid: Any = None
    tid: Any = None
    ts: Decimal | None = None      # exact: ns = round(µs * 1000), no float rounding
    dur: Decimal | None = None
    id: Any = None
    args: Args | None = None


class Header(msgspec.Struct, gc=False):
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None
    hostname: Any = None


_decode_events = msgspec.json.Decoder(list[Event]).decode
_decode_raw_list = msgspec.json.Decoder(list[msgspec.Raw]).decode
_decode_header = msgspec.json.Decoder(Header).decode
_decode_any = msgspec.json.Decoder(float_hook=Decimal).decode


class _RawTimes(Event):
    """An event whose ts or dur is not a number: both kept as JSON text, judged by `_time`."""
    ts: msgspec.Raw = None
    dur: msgspec.Raw = None


_decode_raw_times = msgspec.json.Decoder(list[_RawTimes]).decode
_decode_time = msgspec.json.Decoder(Decimal | None).decode
#: ts/dur of an event read leniently that is not a number: the column gets T_NOT_A_NUMBER
_NOT_A_NUMBER = Decimal("NaN")


# ----------------------------------------------------------------------------------------------
# Reading bytes
def _chunks(path: Path) -> Iterator[bytes | memoryview]:
    """Decompressed text of the file, in blocks (valid until the next one is asked for). A gzip
    stream that breaks (cut or corrupt) still yields everything decompressed before the break,
    then raises _ReadError."""
    try:
        with open_regular(path) as f:
            if f.read(2) != b"\x1f\x8b":
                f.seek(0)
                yield from _blocks(f)
                return
            f.seek(0)
            yield from _gunzip(f)
    except (OSError, EOFError) as exc:
        raise _ReadError(str(exc) or type(exc).__name__) from exc


def _blocks(f: BinaryIO) -> Iterator[memoryview]:
    """A plain file read into one buffer, over and over. (A new 2 MB `bytes` per read() was 4x
    slower: the C heap hands each one back to the OS and faults its pages in again.)"""
    block = bytearray(CHUNK_BYTES)
    with memoryview(block) as view:
        while n := f.readinto(block):
            yield view[:n]


def _gunzip(f: BinaryIO) -> Iterator[bytes]:
    """Inflate in small steps, so that a corrupt stream loses at most one step's output."""
    from isal import isal_zlib
    inflater = isal_zlib.decompressobj(wbits=31)
    limit = max(MIN_GZIP_LIMIT, MAX_GZIP_RATIO * os.fstat(f.fileno()).st_size)
    total = 0
    while True:
        if total > limit:
            raise _ReadError(f"decompressed past {limit:,} bytes, {MAX_GZIP_RATIO}x the file's size (real traces "
                             f"compress at most ~30x): read no further")
        data = f.read(_GZIP_STEP)
        if not data:
            if not inflater.eof:
                raise _ReadError("gzip stream is cut short (file truncated?)")
            return
        while data:
            try:
                out = inflater.decompress(data)
            except isal_zlib.error as exc:
                raise _ReadError(f"corrupt gzip data ({exc})") from exc
            if out:
                total += len(out)
                yield out
            data = inflater.unused_data if inflater.eof else b""
            if inflater.eof and data.strip(b"\x00"):     # another gzip member follows
                inflater = isal_zlib.decompressobj(wbits=31)
            elif inflater.eof:
                data = b""


_GZIP_STEP = 8 << 10       # compressed bytes per inflate call: a corrupt stream loses at most ~100 KB


class _ReadError(Exception):
    """Decompression/IO failed partway; events read before it are kept."""


# ----------------------------------------------------------------------------------------------
# Column specs (built once)
_E, _A = Event, Args


@dataclass
class _Tables:
    ph: dict = field(default_factory=dict)
    name: dict = field(default_factory=dict)
    cat: dict = field(default_factory=dict)
    tid: dict = field(default_factory=dict)
    text: dict = field(default_factory=dict)    # collective names, dtypes, pg names, stacks, shapes


def _core_specs(t: _Tables) -> list[Col]:
    return [
        Col(_E.ph, None, "s", 0, t.ph),
        Col(_E.cat, None, "s", 0, t.cat),
        Col(_E.name, None, "s", 0, t.name),
        Col(_E.ts, None, "t", T_ABSENT),
        Col(_E.dur, None, "t", T_ABSENT),
        Col(_E.pid, None, "k", -1, t.tid),
        Col(_E.tid, None, "k", -1, t.tid),
        Col(_E.args, _A.external_id, "i", -1),
        Col(_E.args, _A.external_id_2021, "i", -1),
        Col(_E.args, _A.correlation, "i", -1),
        Col(_E.args, _A.device, "i", -1),
        Col(_E.args, _A.stream, "i", -1),
        Col(_E.id, None, "k", -1, t.tid),
    ]


_CORE_NAMES = ["ph", "cat", "name", "ts_ns", "dur_ns", "pid", "tid", "ext", "ext21", "corr",
               "device", "stream", "id"]


def _side_specs(t: _Tables) -> dict[str, list[tuple[str, Col]]]:
    a, x = _A, t.text
    return {
        "gpu_args": [
            ("grid_blocks", Col(_E.args, a.grid, "p", -1)),
            ("block_threads", Col(_E.args, a.block, "p", -1)),
            ("registers_per_thread", Col(_E.args, a.registers_per_thread, "i", -1)),
            ("shared_memory_bytes", Col(_E.args, a.shared_memory, "i", -1)),
            ("blocks_per_sm", Col(_E.args, a.blocks_per_sm, "f", np.nan)),
            ("warps_per_sm", Col(_E.args, a.warps_per_sm, "f", np.nan)),
            ("est_occupancy_pct", Col(_E.args, a.occupancy, "f", np.nan)),
            ("bytes", Col(_E.args, a.bytes, "i", -1)),
            ("bandwidth_gbps", Col(_E.args, a.bandwidth, "f", np.nan)),
        ],
        "comm_args": [
            ("collective", Col(_E.args, a.collective_name, "s", 0, x)),
            ("in_msg_nelems", Col(_E.args, a.in_msg_nelems, "i", -1)),
            ("out_msg_nelems", Col(_E.args, a.out_msg_nelems, "i", -1)),
            ("in_split_size", Col(_E.args, a.in_split_size, "s", 0, x)),
            ("out_split_size", Col(_E.args, a.out_split_size, "s", 0, x)),
            ("group_size", Col(_E.args, a.group_size, "i", -1)),
            ("dtype", Col(_E.args, a.dtype, "s", 0, x)),
            ("pg_name", Col(_E.args, a.pg_name, "s", 0, x)),
            ("pg_desc", Col(_E.args, a.pg_desc, "s", 0, x)),
            ("pg_ranks", Col(_E.args, a.pg_ranks, "s", 0, x)),
            ("seq", Col(_E.args, a.seq, "i", -1)),
        ],
        "op_args": [
            ("input_dims", Col(_E.args, a.input_dims, "r", 0, x)),
            ("input_types", Col(_E.args, a.input_type, "r", 0, x)),
            ("call_stack", Col(_E.args, a.call_stack, "s", 0, x)),
            ("sequence_number", Col(_E.args, a.sequence_number, "i", -1)),
            ("fwd_thread_id", Col(_E.args, a.fwd_thread_id, "i", -1)),
            ("flops", Col(_E.args, a.flops, "f", np.nan)),
            ("python_id", Col(_E.args, a.python_id, "i", -1)),
            ("python_parent_id", Col(_E.args, a.python_parent_id, "i", -1)),
        ],
        "memory": [
            ("bytes", Col(_E.args, a.mem_bytes, "i", 0)),
            ("total_allocated", Col(_E.args, a.total_allocated, "i", -1)),
            ("total_reserved", Col(_E.args, a.total_reserved, "i", -1)),
            ("device_type", Col(_E.args, a.mem_device_type, "i", -1)),
            ("device_id", Col(_E.args, a.mem_device_id, "i", -1)),
            ("addr", Col(_E.args, a.addr, "i", -1)),
        ],
        "meta": [("meta_name", Col(_E.args, a.name, "s", 0, x))],
    }


# ----------------------------------------------------------------------------------------------
_ARGS_KEYS = {f.name: f.encode_name for f in msgspec.structs.fields(Args)}


def _scan_spec(col: Col, tables: list[dict]) -> tuple:
    """A Col (Struct member descriptors) as the C scanner's spec (JSON keys, table index)."""
    inner = None if col.inner is None else _ARGS_KEYS[col.inner.__name__]
    index = next((i for i, tb in enumerate(tables) if tb is col.table), -1)
    return (col.outer.__name__, inner, col.kind, col.default, index)


class _Column:
    """A column appended to chunk by chunk, in one anonymous memory map that grows in place
    (mremap: no copy) and that pages in only where it is written: no list of chunks to
    concatenate into a second copy at the end, and no holes left in the malloc heap (on 8 x 200 MB
    both together were a third of the parse's peak memory). While a job's ranks are read, the map
    of the same column (`key`) of an earlier rank is reused once its frame is gone
    (`reuse.between_ranks`)."""
    __slots__ = ("buffer", "dtype", "n", "key")

    def __init__(self, dtype: np.dtype, key: tuple[str, str]) -> None:
        self.dtype = np.dtype(dtype)
        self.buffer: mmap.mmap | None = None
        self.n = 0
        self.key = key

    def append(self, values: np.ndarray) -> None:
        size = self.dtype.itemsize
        need = (self.n + len(values)) * size
        if self.buffer is None:
            self.buffer = (reuse.spare_map(self.key, need)
                           or _anonymous_map(max(need, _COLUMN_START_BYTES)))
        elif need > len(self.buffer):
            self._grow(max(need, 2 * len(self.buffer)))
        np.frombuffer(self.buffer, self.dtype, len(values), self.n * size)[:] = values
        self.n += len(values)

    def _grow(self, nbytes: int) -> None:
        try:
            self.buffer.resize(nbytes)
        except (OSError, SystemError, ValueError):        # no mremap here (macOS): copy
            grown = _anonymous_map(nbytes)
            grown[:self.n * self.dtype.itemsize] = self.buffer[:self.n * self.dtype.itemsize]
            self.buffer.close()
            self.buffer = grown

    def values(self) -> np.ndarray:
        if self.buffer is None:
            return np.zeros(0, self.dtype)
        return np.frombuffer(self.buffer, self.dtype, self.n)

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the values where `mask` is true, in place."""
        values = self.values()
        kept = values[mask]
        values[:len(kept)] = kept
        self.n = len(kept)


_COLUMN_START_BYTES = 1 << 20


def _anonymous_map(nbytes: int) -> mmap.mmap:
    """Private (a shared anonymous map would be shmem, which mremap cannot grow)."""
    if hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mmap.mmap(-1, nbytes)


@dataclass
class _Accumulator:
    """Keeps, chunk by chunk, only what the frames need (complete events, flows, memory samples,
    metadata, side columns), so peak memory is the kept columns plus one chunk."""
    tables: _Tables
    use_scanner: bool = True
    bad_events: int = 0         # not objects, or unusable: skipped
    repaired_events: int = 0    # kept without their badly typed fields
    deep_values: int = 0        # values nested over MAX_NESTING levels, read as []
    invalid_utf8_chunks: int = 0     # chunks whose invalid UTF-8 bytes were replaced by U+FFFD
    repairing: set = field(default_factory=set)   # repairs of the chunk being re-read ("utf8", "surrogates")
    n_events: int = 0           # trace events of every phase
    n_x: int = 0                # complete events so far (= next `row`)
    phase_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    parts: dict[str, dict[str, _Column]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        t = self.tables
        self.core_specs = _core_specs(t)
        self.side_specs = {frame: [c for _, c in cols] for frame, cols in _side_specs(t).items()}
        self.side_names = {frame: [n for n, _ in cols] for frame, cols in _side_specs(t).items()}
        self.table_list = [t.ph, t.name, t.cat, t.tid, t.text]
        flat = self.core_specs + [c for cols in self.side_specs.values() for c in cols]
        self.scan_specs = [_scan_spec(c, self.table_list) for c in flat]
        self.scan_state = scan_state(self.table_list)
        first, at = {}, len(self.core_specs)       # where each side frame's specs start
        for frame, specs in self.side_specs.items():
            first[frame] = at
            at += len(specs)
        self.routing_sides = tuple(
            (first[frame], len(self.side_specs[frame]), _SIDE_KINDS[frame].tobytes(),
             tuple(self.side_names[frame].index(n) for n in _SIDE_PRESENCE[frame]))
            for frame in _SIDE_KINDS)
        self.routing_tail = (first["memory"], len(self.side_specs["memory"]), first["meta"])
        self._routing_codes: tuple | None = None      # (phases, categories) the tables below cover
        self._routing_luts: tuple = ()
        # the groups the C routing returns, in its order (G_X ... G_META), and their columns
        self.routed_columns = {
            "x": _X_COLUMNS, "flows": _FLOW_COLUMNS,
            **{frame: [("row", np.int64)] + self._spec_columns(frame) for frame in _SIDE_KINDS},
            "memory": [("ts_ns", np.int64)] + self._spec_columns("memory"), "meta": _META_COLUMNS,
        }

    def _spec_columns(self, frame: str) -> list[tuple[str, type]]:
        return [(n, DTYPES[c.kind]) for n, c in zip(self.side_names[frame], self.side_specs[frame])]

    def routing(self) -> tuple:
        """What the C scanner needs to split rows as `_add` does: phase classes and category kinds
        for the codes known so far, the name code of "[memory]", the side groups."""
        t = self.tables
        if self._routing_codes != (len(t.ph), len(t.cat)):
            self._routing_codes = (len(t.ph), len(t.cat))
            ph_class = np.zeros(len(t.ph), dtype=np.uint8)
            for texts, value in _PHASE_CLASSES.items():
                ph_class[_code_mask(t.ph, texts)[:-1]] = value
            kinds = _cat_kind_lut(t.cat)
            self._routing_luts = (ph_class.tobytes(), kinds[:-1].tobytes(), int(kinds[-1]))
        return (*self._routing_luts, len(t.name), t.name.get("[memory]", -1), self.n_x, self.routing_sides,
                *self.routing_tail)

    def scan(self, body) -> int | None:
        """C fast path over raw JSON. None: done. Else the chunk must take the msgspec path, and
        the result is where the scanner stopped (-1: not scanned)."""
        out = (scan_json(body, self.scan_specs, self.table_list, self.scan_state, self.routing())
               if self.use_scanner else None)
        if not isinstance(out, tuple):
            return -1 if out is None else out
        cols, n, bad = out
        self.bad_events += bad
        if isinstance(cols, tuple):
            self._add_routed(*cols, n)
            return None
        core, rest = cols[:len(self.core_specs)], cols[len(self.core_specs):]
        dense, i = {}, 0
        for frame, specs in self.side_specs.items():
            dense[frame] = rest[i:i + len(specs)]
            i += len(specs)
        self._add(core, n, lambda frame, idx: [c[idx] for c in dense[frame]])
        return None

    def add(self, events: list) -> None:
        """Columns of decoded Structs (the msgspec path)."""
        if events:
            core = columnize(events, self.core_specs)
            self._add(core, len(events), lambda frame, idx: columnize(events, self.side_specs[frame], idx))

    def _keep(self, group: str, columns: dict[str, np.ndarray]) -> None:
        g = self.parts.setdefault(group, {})
        for name, values in columns.items():
            column = g.get(name)
            if column is None:
                g[name] = column = _Column(values.dtype, (group, name))
            column.append(values)

    def take(self, group: str, name: str, dtype=np.int64) -> np.ndarray:
        """One kept column (released from the accumulator; its map, once unused, can serve the same
        column of the next rank)."""
        column = self.parts.get(group, {}).pop(name, None)
        if column is None:
            return np.zeros(0, dtype=dtype)
        values = column.values()
        if column.buffer is not None:
            reuse.offer_map(column.key, column.buffer)
        return values


    def _count_phases(self, counts: np.ndarray) -> None:
        if len(counts) > len(self.phase_counts):
            counts = counts.copy()
            counts[:len(self.phase_counts)] += self.phase_counts
            self.phase_counts = counts
        else:
            self.phase_counts[:len(counts)] += counts

    def _add_routed(self, groups: list[list[bytes]], phase_counts: bytes, n: int) -> None:
        """A chunk the C scanner split into the groups itself (see `routing`)."""
        self._count_phases(np.frombuffer(phase_counts, dtype=np.int64))
        self.n_events += n
        for (group, columns), buffers in zip(self.routed_columns.items(), groups):
            if group == "x" or buffers[0]:
                self._keep(group, {name: np.frombuffer(b, dtype) for (name, dtype), b in zip(columns, buffers)})
        self.n_x += len(groups[0][0])      # the kinds: one byte per complete event

    def _add(self, core: list[np.ndarray], n: int, side_columns) -> None:
        if n == 0:
            return
        c = dict(zip(_CORE_NAMES, core))
        t = self.tables
        ph = c["ph"]
        self._count_phases(np.bincount(ph[ph >= 0], minlength=len(t.ph)))
        self.n_events += n

        x_idx = np.flatnonzero(ph == t.ph.get("X", -99))
        kind = _cat_kind_lut(t.cat)[c["cat"][x_idx]]
        ext = c["ext"][x_idx]
        self._keep("x", {     # the columns of _X_COLUMNS
            "kind": kind, "name": c["name"][x_idx], "ts_ns": c["ts_ns"][x_idx],
            "dur_ns": c["dur_ns"][x_idx], "pid": c["pid"][x_idx], "tid": c["tid"][x_idx],
            "device": c["device"][x_idx].astype(np.int32), "stream": c["stream"][x_idx],
            "correlation": c["corr"][x_idx], "external_id": np.where(ext >= 0, ext, c["ext21"][x_idx]),
        })
        flow_idx = np.flatnonzero(_code_mask(t.ph, _FLOW_PHASES)[ph])
        if len(flow_idx):
            self._keep("flows", {k: c[k][flow_idx] for k, _ in _FLOW_COLUMNS})

        for frame, kinds in _SIDE_KINDS.items():
            at = np.flatnonzero(kinds[kind])               # positions among this chunk's complete events
            if len(at):
                cols = dict(zip(self.side_names[frame], side_columns(frame, x_idx[at])))
                keep = _has_value(cols, _SIDE_PRESENCE[frame])
                self._keep(frame, {"row": (at + self.n_x)[keep], **{k: v[keep] for k, v in cols.items()}})
        memory_idx = np.flatnonzero(_code_mask(t.ph, _INSTANT_PHASES)[ph] & (c["name"] == t.name.get("[memory]", -99)))
        if len(memory_idx):
            self._keep("memory", {"ts_ns": c["ts_ns"][memory_idx],
                                  **dict(zip(self.side_names["memory"], side_columns("memory", memory_idx)))})
        meta_idx = np.flatnonzero(ph == t.ph.get("M", -99))
        if len(meta_idx):
            self._keep("meta", {"name": c["name"][meta_idx], "pid": c["pid"][meta_idx], "tid": c["tid"][meta_idx],
                                "label": side_columns("meta", meta_idx)[0]})
        self.n_x += len(x_idx)


_IS_DEVICE = np.isin(np.arange(256), [int(k) for k in DEVICE_KINDS])
_IS_HOST_OP = np.isin(np.arange(256), [int(Kind.CPU_OP), int(Kind.USER_ANNOTATION), int(Kind.PYTHON_FUNCTION)])
#: Which complete events (by kind) get a row in each side frame ...
_SIDE_KINDS = {
    "gpu_args": _IS_DEVICE,
    "comm_args": (_IS_HOST_OP & (np.arange(256) != int(Kind.PYTHON_FUNCTION))) | _IS_DEVICE,
    "op_args": _IS_HOST_OP,
}
#: ... and keep it: when one of these columns holds a value (none listed: always).
_SIDE_PRESENCE = {
    "gpu_args": (),
    "comm_args": ("collective", "in_msg_nelems", "seq"),
    "op_args": ("input_dims", "call_stack", "flops", "sequence_number", "python_id"),
}
#: Kept columns of the complete events, of the flow events, of the metadata events (name, dtype).
_X_COLUMNS = [("kind", np.uint8), ("name", np.int32), ("ts_ns", np.int64), ("dur_ns", np.int64),
              ("pid", np.int64), ("tid", np.int64), ("device", np.int32), ("stream", np.int64),
              ("correlation", np.int64), ("external_id", np.int64)]
_FLOW_COLUMNS = [("ph", np.int32), ("cat", np.int32), ("id", np.int64), ("ts_ns", np.int64), ("pid", np.int64),
                 ("tid", np.int64)]
_META_COLUMNS = [("name", np.int32), ("pid", np.int64), ("tid", np.int64), ("label", np.int32)]
_FLOW_PHASES, _INSTANT_PHASES = ("s", "f", "t"), ("i", "I")
#: Phase texts -> the C routing's classes (PH_X, PH_FLOW, PH_INSTANT, PH_META in _fastcols.c).
_PHASE_CLASSES = {("X",): 1, _FLOW_PHASES: 2, _INSTANT_PHASES: 3, ("M",): 4}


def _has_value(cols: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    """Rows where one of `names` holds a value (>= 0; a float: not NaN); all rows when none."""
    rows = len(next(iter(cols.values())))
    keep = np.zeros(rows, dtype=bool) if names else np.ones(rows, dtype=bool)
    for name in names:
        v = cols[name]
        keep |= ~np.isnan(v) if v.dtype.kind == "f" else v >= 0
    return keep


def _code_mask(table: dict, texts: tuple[str, ...]) -> np.ndarray:
    """Lookup: code (and -1, for absent, as the last entry) -> is it one of `texts`."""
    mask = np.zeros(len(table) + 1, dtype=bool)
    mask[[table[x] for x in texts if x in table]] = True
    return mask


def _cat_kind_lut(cat_table: dict) -> np.ndarray:
    """Lookup: category code (and -1, for absent, as the last entry) -> Kind."""
    lut = np.full(len(cat_table) + 1, int(Kind.OTHER), dtype=np.uint8)
    for text, i in cat_table.items():
        lut[i] = int(CATEGORY_KINDS.get(text.lower(), Kind.OTHER))
    return lut


# ----------------------------------------------------------------------------------------------
class _JSONError(Exception):
    """The chunk is not valid JSON; `offset`: where it breaks, when known (bytes into the chunk)."""

    def __init__(self, offset: int | None):
        super().__init__(offset)
        self.offset = offset


_MSGSPEC_BYTE = re.compile(r"byte (\d+)")
#: A \uD800-\uDFFF escape that is not half of a surrogate pair (after an even run of backslashes).
_LONE_SURROGATE = re.compile(
    rb"(?<!\\)((?:\\\\)*)(?:\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})")


#: A non-JSON literal where msgspec stops (NaN, Infinity; in -Infinity, after the "-"); and a JSON
#: string, or NaN / Infinity / -Infinity outside strings (group 1).
_CONSTANT = re.compile(rb"Infinity|NaN")
_STRING_OR_CONSTANT = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|(-?Infinity|NaN)', re.DOTALL)


def _blank_constants(text: bytes) -> bytes:
    """Each NaN, Infinity, -Infinity outside strings as `[]` padded to its length (byte offsets
    hold): a ts or dur that is not a number, elsewhere a value of the wrong type (the default)."""
    return _STRING_OR_CONSTANT.sub(lambda m: m[0] if m[1] is None else b"[]".ljust(len(m[0])), text)


#: Levels of arrays and objects read in an event list; a value opened deeper is read as `[]`.
MAX_NESTING = 64
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def _flatten_deep(text: bytes) -> tuple[bytes, int]:
    """`text` with each array or object that opens deeper than MAX_NESTING levels written as `[]`
    padded to its length (byte offsets hold: a value of the wrong type, the default), and how many
    were. One pass of numpy over the bytes, outside strings: no recursion, whatever the depth."""
    b = np.frombuffer(text, np.uint8)
    edges = np.zeros(len(b) + 1, np.int32)
    for m in _JSON_STRING.finditer(text):
        edges[m.start()] += 1
        edges[m.end()] -= 1
    outside = np.cumsum(edges[:-1]) == 0
    opens = ((b == 0x5B) | (b == 0x7B)) & outside
    closes = ((b == 0x5D) | (b == 0x7D)) & outside
    depth = np.cumsum(opens.astype(np.int64) - closes)          # after each byte
    starts = np.flatnonzero(opens & (depth == MAX_NESTING + 1))
    ends = np.flatnonzero(closes & (depth == MAX_NESTING))
    at = np.searchsorted(ends, starts)
    starts, ends = starts[at < len(ends)], ends[at[at < len(ends)]]
    out = bytearray(text)
    for start, end in zip(starts.tolist(), ends.tolist()):
        out[start:end + 1] = b"[]".ljust(end + 1 - start)
    return bytes(out), len(starts)


def _decode_chunk(body: bytes | memoryview, acc: _Accumulator) -> None:
    """Decode the JSON array `body` (whole events only): C scanner first; msgspec where the
    scanner declines (it is the reference); badly typed events repaired one by one.
    Raises _JSONError for invalid JSON."""
    stopped = acc.scan(body)
    if stopped is None:
        return
    try:
        try:
            events = _decode_events(body)
        except msgspec.ValidationError:    # a badly typed event; the JSON may still break later
            events = _decode_leniently(bytes(body), acc)
    except msgspec.DecodeError as exc:
        if "surrogates" not in acc.repairing and _LONE_SURROGATE.search(body):
            # valid JSON that msgspec refuses: read it as the scanner does ("?" for each, as in
            # the frames' categories), same length, so byte offsets still hold
            return _decode_repaired(_LONE_SURROGATE.sub(rb"\1\\u003f", bytes(body)), "surrogates", acc)
        m = _MSGSPEC_BYTE.search(str(exc))
        at = int(m.group(1)) if m else None
        if "constants" not in acc.repairing and at is not None and _CONSTANT.match(body, at):
            # NaN / Infinity / -Infinity (Python's json writes them): each a value that is not a number
            return _decode_repaired(_blank_constants(bytes(body)), "constants", acc)
        raise _JSONError(at if at is not None else (stopped if stopped >= 0 else None)) from None
    except UnicodeDecodeError:             # invalid UTF-8 in a string: keep the events, mark the bytes
        if "utf8" in acc.repairing:
            raise _JSONError(None) from None
        acc.invalid_utf8_chunks += 1
        return _decode_repaired(bytes(body).decode("utf-8", "replace").encode("utf-8"), "utf8", acc)
    except RecursionError:                 # nested deeper than the decoder's stack: the deep values go
        if "nesting" in acc.repairing:
            raise _JSONError(None) from None
        text, n = _flatten_deep(bytes(body))
        acc.deep_values += n
        return _decode_repaired(text, "nesting", acc)
    acc.add(events)


def _decode_repaired(text: bytes, repair: str, acc: _Accumulator) -> None:
    """Decode a chunk again from its repaired text; a repair is tried at most once per chunk."""
    acc.repairing.add(repair)
    try:
        _decode_chunk(text, acc)
    finally:
        acc.repairing.discard(repair)


def _decode_span(buf: bytearray, end: int, acc: _Accumulator) -> None:
    """Decode the events in buf[1:end]. buf[0] is the '[' or ',' before the first event; it and
    buf[end] are set to '[' and ']' for the decode (no copy of the text) and restored after."""
    first = buf[0]
    last = buf[end] if end < len(buf) else None
    buf[0] = 0x5B
    if last is None:
        buf.append(0x5D)
    else:
        buf[end] = 0x5D
    try:
        with memoryview(buf) as view, view[:end + 1] as body:
            _decode_chunk(body, acc)
    finally:
        buf[0] = first
        if last is None:
            del buf[end:]
        else:
            buf[end] = last


def _decode_leniently(data: bytes, acc: _Accumulator) -> list:
    """Event by event. A ts or dur that is not a number is kept as NaN (the event is dropped, with
    its reason, when the frames are built); a badly typed `args` is dropped (a repaired event)."""
    events = []
    for raw in _decode_raw_list(data):
        text = b"[" + bytes(raw) + b"]"
        try:
            events.append(_decode_events(text)[0])
            continue
        except msgspec.ValidationError:
            pass
        try:
            loose = _decode_raw_times(text)[0]
            fields = {f: getattr(loose, f) for f in Event.__struct_fields__}
            events.append(Event(**{**fields, "ts": _time(loose.ts), "dur": _time(loose.dur)}))
            continue
        except msgspec.ValidationError:
            pass
        obj = _decode_any(bytes(raw))
        if not isinstance(obj, dict):
            acc.bad_events += 1
            continue
        for key in ("ts", "dur"):
            if obj.get(key) is not None:
                obj[key] = _time(msgspec.json.encode(obj[key]))
        args = obj.get("args")
        if not isinstance(args, dict):
            obj.pop("args", None)
        else:
            obj["args"] = {k: v for k, v in args.items() if k not in ("Input Dims", "Input type")}
        try:
            events.append(msgspec.convert(obj, Event, strict=False))
            acc.repaired_events += 1
        except msgspec.ValidationError:
            acc.bad_events += 1
    return events


def _time(raw: msgspec.Raw | bytes | None) -> Decimal | None:
    """A ts or dur read from its JSON text as the strict decoder would; NaN where it is not a number."""
    if raw is None:
        return None
    try:
        return _decode_time(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return _NOT_A_NUMBER


def _last_boundary(buf: bytes | bytearray, before: int, lo: int = 0) -> int:
    """Position just after the '}' of the last `}, {` event boundary whose '{' lies in
    buf[lo:before]; -1 if none. Reads buf[lo:before] in windows from its end (each 4x the last:
    about once in all), and the whitespace before `lo` only when a boundary may straddle it."""
    window = 1 << 12
    while True:
        start = max(lo, before - window)
        last = -1
        for m in _BOUNDARY.finditer(buf, start, before):
            last = m.start() + 1
        if last >= 0:
            return last
        if start == lo:
            return _boundary_at(buf, lo, before) if lo else -1
        window *= 4


def _boundary_at(buf: bytes | bytearray, lo: int, before: int) -> int:
    """The boundary whose '}' lies before `lo` and whose '{' is the first '{' in buf[lo:before]
    (only whitespace and the ',' between them); -1 if none."""
    brace = _first_non_ws(buf, lo, before)
    if brace < 0:
        return -1
    comma_seen = buf[brace] == 0x2C
    if comma_seen:
        brace = _first_non_ws(buf, brace + 1, before)
        if brace < 0:
            return -1
    if buf[brace] != 0x7B:
        return -1
    end = _ws_start(buf, lo)
    if not comma_seen:
        if end == 0 or buf[end - 1] != 0x2C:
            return -1
        end = _ws_start(buf, end - 1)
    return end if end > 0 and buf[end - 1] == 0x7D else -1


def _ws_start(buf: bytes | bytearray, end: int) -> int:
    """Where the run of JSON whitespace that ends at `end` starts."""
    step = 64
    while end > 0:
        lo = max(0, end - step)
        piece = buf[lo:end]
        if not _all_ws(piece):
            return lo + len(piece.rstrip(_JSON_WS))
        end, step = lo, min(step * 4, 1 << 20)
    return 0


def _first_non_ws(buf: bytes | bytearray, lo: int, before: int) -> int:
    """Position of the first byte in buf[lo:before] that is not JSON whitespace; -1 if none."""
    step = 64
    while lo < before:
        hi = min(before, lo + step)
        piece = buf[lo:hi]
        if not _all_ws(piece):
            return _NON_WS.search(buf, lo, hi).start()
        lo, step = hi, min(step * 4, 1 << 20)
    return -1


def _all_ws(piece: bytes | bytearray) -> bool:
    """All of `piece` (not empty) is JSON whitespace (isspace() also takes \\v and \\f: ruled out);
    several times faster than a regex or rstrip over long runs."""
    return piece.isspace() and b"\x0b" not in piece and b"\x0c" not in piece


def _decode_whole_events(buf: bytearray, acc: _Accumulator, lo: int) -> int | _JSONError | None:
    """Decode the events of buf up to its last event boundary (one whose '{' lies at or after `lo`:
    the ones before were tried by an earlier call); return where that is. A boundary can be a
    false one (`}, {` inside a string): the decode then fails at the cut, and the boundary before
    it is tried. A failure before the cut is a real error: returned, not raised.
    None: no usable boundary yet (the caller reads more)."""
    end = _last_boundary(buf, len(buf), lo)
    for _ in range(_MAX_BOUNDARY_TRIES):
        if end < 0:
            return None
        try:
            _decode_span(buf, end, acc)
            return end
        except _JSONError as exc:
            if exc.offset is not None and exc.offset < end - 1:
                return exc
        end = _last_boundary(buf, end - 1, lo)
    return None


_MAX_BOUNDARY_TRIES = 64


@dataclass
class _Parsed:
    header: dict
    trailer: dict
    acc: _Accumulator
    cut_at_byte: int | None = None
    cut_reason: str = ""
    fmt: str = "kineto"


def _parse_stream(path: Path, use_scanner: bool) -> _Parsed:
    acc = _Accumulator(_Tables(), use_scanner=use_scanner)
    chunks = _chunks(path)
    buf = bytearray()
    header_bytes = b""
    read_error = None
    fmt = "kineto"

    # 1. header: everything up to `"traceEvents": [` (or a bare top-level array); whitespace
    # before the document is dropped as it is read
    start = None          # position of the '[' that opens the event list
    skipped = 0           # bytes of leading whitespace dropped
    opened = False
    key = _KeySearch()
    try:
        for block in chunks:
            buf += block
            if not opened:
                first = _NON_WS.search(buf)
                lead = first.start() if first else len(buf)
                skipped += lead
                del buf[:lead]
                if not buf:
                    continue
                opened = True
                if buf[0] == 0x5B:
                    start = 0
                    fmt = "chrome-array"
                    break
                if buf[0] != 0x7B:
                    raise TraceError("not JSON (does not start with '{' or '[')")
            found = key.search(buf)
            if found:
                header_bytes = bytes(buf[:found[0]])
                start = found[1]
                break
            if len(buf) > HEADER_LIMIT:
                break
    except _ReadError as exc:
        read_error = exc
    if start is None:
        if read_error is not None:
            raise TraceError(f"cannot decompress: {read_error}")
        if not buf.strip():
            raise TraceError("empty file")
        try:
            _decode_any(bytes(buf))
        except msgspec.DecodeError:
            raise TraceError("file ends before its event list (truncated in the header?)") from None
        raise TraceError("JSON without a 'traceEvents' array: not a profiler trace")
    header = _parse_header(header_bytes)
    del buf[:start]
    consumed = skipped + start      # bytes of decompressed text before buf[0] (as in the file)
    searched = 0          # event boundaries whose '{' lies before this were looked for already
    gaps = _Gaps()        # long whitespace runs taken out of buf

    # 2. events, chunk by chunk; buf[0] is always the '[' or ',' before the next event
    eof = read_error is not None
    trailer: dict = {}
    cut_at = None
    cut_reason = ""
    while True:
        if not eof:
            try:
                buf += next(chunks)
                if len(buf) < CHUNK_BYTES:
                    continue
            except StopIteration:
                eof = True
            except _ReadError as exc:
                read_error, eof = exc, True
        if eof:
            done = _finish(buf, acc)
            if done is not None:
                trailer = done
                break
            kept = _salvage(buf, acc)
            cut_at = consumed + gaps.offset(kept)
            if read_error:
                cut_reason = str(read_error)
            elif _last_boundary(buf, len(buf)) > kept:     # whole events follow the break
                cut_reason = "invalid JSON inside the event list"
            else:
                cut_reason = "file ends mid-event (truncated)"
            break
        end = _decode_whole_events(buf, acc, searched)
        if end is None:
            gaps.collapse(buf)            # a run of whitespace at its end: kept as one space
            searched = len(buf)
            if len(buf) > MAX_EVENT_BYTES:        # one event that long: no profiler wrote it
                cut_at = consumed + gaps.offset(1)
                cut_reason = f"an event longer than {MAX_EVENT_BYTES >> 20} MiB (no profiler writes one)"
                break
            continue                      # no safe cut in what was read yet: read more
        if isinstance(end, _JSONError):
            cut_at = consumed + gaps.offset(_salvage(buf, acc, end.offset))
            cut_reason = "invalid JSON inside the event list"
            break
        comma = buf.index(b",", end)
        del buf[:comma]
        consumed += gaps.trimmed(comma)
        searched = len(buf)
    acc.scan_state = None             # the scanner's buffers and caches, before the frames are built
    return _Parsed(header, trailer, acc, cut_at, cut_reason, fmt)


#: The rest of a JSON string from inside it: up to its closing quote, or to a backslash whose
#: escaped byte is not read yet, or to the end of what was read.
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
#: Whitespace runs longer than this, at the end of the buffer and outside strings, are cut.
GAP_BYTES = 64 << 10


class _Gaps:
    """Keeps a run of whitespace between tokens (e.g. 512 MB of spaces between two events) out of
    the buffer: while no event ends in what was read, the buffer's end is followed in and out of
    strings (each byte read once: linear), and whitespace that ends it outside a string is cut to
    one space. Memory is then the events plus one chunk, whatever the gaps. Whitespace inside a
    string is its content and stays. `offset` gives a buffer position as a position in the file."""

    def __init__(self) -> None:
        self.pos = 1                 # buf[:pos] was followed; buf[0] (the '[' or ',') is outside strings
        self.in_string = False
        self.cuts: list[tuple[int, int]] = []    # (position in buf, bytes cut there)

    def collapse(self, buf: bytearray) -> None:
        pos, n = self.pos, len(buf)
        while pos < n:
            if not self.in_string:
                quote = buf.find(b'"', pos)
                if quote < 0:
                    pos = n
                    break
                pos, self.in_string = quote + 1, True
            else:
                end = _STRING_REST.match(buf, pos).end()
                if end >= n or buf[end] != 0x22:        # the string goes on past what was read
                    pos = end
                    break
                pos, self.in_string = end + 1, False
        self.pos = pos
        if self.in_string:
            return
        ws = _ws_start(buf, n)
        if n - ws > GAP_BYTES:
            self.cuts.append((ws + 1, n - ws - 1))
            del buf[ws + 1:]
            self.pos = len(buf)

    def offset(self, pos: int) -> int:
        """Bytes of the file's text before buf[pos]."""
        return pos + sum(cut for at, cut in self.cuts if at <= pos)

    def trimmed(self, n: int) -> int:
        """buf lost its first n bytes (buf[0] is again a ',' between events): how many bytes of the
        file's text they stood for."""
        done = self.offset(n)
        self.cuts = [(at - n, cut) for at, cut in self.cuts if at > n]
        self.pos, self.in_string = 1, False
        return done


class _KeySearch:
    """Finds `"traceEvents": [` in a buffer that grows between calls. Each call goes on where the
    last one stopped, also inside the whitespace after a key, so each byte is read about twice."""

    def __init__(self) -> None:
        self.pos = 0                    # where to look for the next key
        self.key: int | None = None     # a key whose ': [' is not all read yet
        self.after = 0                  # what follows that key was read up to here
        self.colon = False

    def search(self, buf: bytearray) -> tuple[int, int] | None:
        """(position of the key, position of its '['); None: not in `buf` yet."""
        while True:
            if self.key is None:
                k = buf.find(_EVENTS_KEY, self.pos)
                if k < 0:
                    self.pos = max(self.pos, len(buf) - len(_EVENTS_KEY) + 1)
                    return None
                self.key, self.after, self.colon = k, k + len(_EVENTS_KEY), False
            m = _NON_WS.search(buf, self.after)
            if m is None:
                self.after = len(buf)
                return None
            if buf[m.start()] == 0x3A and not self.colon:
                self.after, self.colon = m.start() + 1, True
            elif buf[m.start()] == 0x5B and self.colon:
                return self.key, m.start()
            else:
                self.pos, self.key = self.key + 1, None


def _parse_header(header_bytes: bytes) -> dict:
    text = header_bytes.rstrip().rstrip(b",").rstrip()
    if not text.strip():
        return {}
    text = text.decode("utf-8", "replace").encode("utf-8")
    try:
        try:
            h = _decode_header(text + b"}")
        except msgspec.DecodeError:       # NaN / Infinity (not JSON): read as the text "NaN", a wrong type
            h = _decode_header(_STRING_OR_CONSTANT.sub(lambda m: m[0] if m[1] is None else b'"%s"' % m[1], text)
                               + b"}")
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return {}   # an unreadable header (or one nested too deep) loses metadata, not events
    return {k: getattr(h, k) for k in h.__struct_fields__ if getattr(h, k) is not None}


def _finish(buf: bytearray, acc: _Accumulator) -> dict | None:
    """At EOF: decode the last events and the trailer after the closing ']' (keys such as
    traceName or distributedInfo may follow the events). None if the ending is broken."""
    pos = len(buf)
    for _ in range(64):
        p = buf.rfind(b"]", 0, pos)
        if p <= 0:
            return None
        rest = bytes(buf[p + 1:]).strip()
        if rest in (b"", b"}"):
            trailer_text = b"{}"
        elif rest.startswith(b","):
            trailer_text = b"{" + rest[1:]
        else:
            trailer_text = None
        if trailer_text is not None:
            try:
                trailer = _decode_any(trailer_text)
            except (msgspec.DecodeError, RecursionError):
                pos = p
                continue
            try:
                _decode_span(buf, p, acc)
            except _JSONError:          # that ']' was inside the trailer (e.g. "INFO": [...])
                pos = p
                continue
            return trailer if isinstance(trailer, dict) else {}
        pos = p
    return None


def _salvage(buf: bytearray, acc: _Accumulator, limit: int | None = None) -> int:
    """Decode the longest run of whole events at the start of `buf` that ends before `limit`
    (where the text breaks, when known); return how many bytes were kept. Tries the ends of
    events ('}') from the back; each failed try tells where the text breaks, which bounds the
    next one, so a few tries suffice."""
    limit = len(buf) if limit is None else min(limit, len(buf))
    for _ in range(_MAX_SALVAGE_TRIES):
        close = buf.rfind(b"}", 0, limit)
        if close <= 0:
            return 0
        try:
            _decode_span(buf, close + 1, acc)
            return close + 1
        except _JSONError as exc:
            limit = close if exc.offset is None else min(close, exc.offset)
    return 0


_MAX_SALVAGE_TRIES = 2000


# ----------------------------------------------------------------------------------------------
def read_kineto(path: str | Path, use_scanner: bool = True) -> tuple[RankTrace, dict]:
    """Parse one Kineto/Chrome trace file. Returns the RankTrace (rank not yet assigned: -1,
    `rank_source` "unknown") and the header dict (distributedInfo etc.). Raises TraceError.
    `use_scanner=False` forces the msgspec reference path (tests compare the two)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise TraceError("not a regular file (a folder, FIFO or device): not read")
    size = st.st_size
    if size == 0:
        raise TraceError("empty file")
    parsed = _parse_stream(path, use_scanner)
    if parsed.acc.n_events == 0:
        if parsed.acc.bad_events:
            raise TraceError(f"JSON array of {parsed.acc.bad_events} values that are not trace events: "
                             f"not a profiler trace")
        if parsed.cut_at_byte is not None:
            raise TraceError(f"{parsed.cut_reason} at byte {parsed.cut_at_byte}; no complete event before it")
        raise TraceError("no trace events")
    header = {**parsed.trailer, **parsed.header} if isinstance(parsed.trailer, dict) else parsed.header
    trace = _build(path, size, parsed, header)
    return trace, header


def _build(path: Path, size: int, parsed: _Parsed, header: dict) -> RankTrace:
    acc, t = parsed.acc, parsed.acc.tables
    _canonical_key_codes(acc)
    dropped = _drop_unusable_times(acc)
    kept = acc.parts.get("x", {}).get("ts_ns")
    if dropped and (kept is None or not len(kept.values())):
        raise TraceError(f"no event with a usable start and duration ({sum(dropped.values())} dropped: "
                         + ", ".join(f"{k} with {reason}" for reason, k in dropped.items()) + ")")
    ph_names = _inverse(t.ph)
    phase_counts = {ph_names[i]: int(n) for i, n in enumerate(acc.phase_counts) if n}

    kind = acc.take("x", "kind", np.uint8)
    pid = acc.take("x", "pid")
    tid = acc.take("x", "tid")
    legacy = _legacy_kinds(kind, pid, t.tid)          # torch 1.x: no categories, kinds from process names
    names = _inverse(t.name)
    name_codes = acc.take("x", "name", np.int32)
    is_dev = np.isin(kind, [int(k) for k in DEVICE_KINDS])
    kclass = event_kernel_classes(kind, name_codes, names)

    device = acc.take("x", "device", np.int32)
    device = np.where((device < 0) & is_dev & (pid >= 0), pid, device)
    device = np.where((device < 0) & is_dev & legacy & (tid >= 0), tid, device).astype(np.int32)   # tid: device index
    ts = acc.take("x", "ts_ns")
    dur = acc.take("x", "dur_ns")
    problems: list[str] = []
    if dropped:
        n = sum(dropped.values())
        problems.append(f"{n} event{'s' if n > 1 else ''} dropped: "
                        + ", ".join(f"{k} with {reason}" for reason, k in dropped.items()))
    flows = _flows_frame(acc)
    corr = _link_launches(acc.take("x", "correlation"), flows, kind, pid, tid, ts)
    flows = flows.filter(~pl.col("cat").is_in(list(LAUNCH_FLOW_CATEGORIES)))   # now in `correlation`

    events = pl.DataFrame({
        "kind": kind,
        "name": _text_column(name_codes, _categories(names)),
        "ts_ns": ts, "dur_ns": dur, "pid": pid, "tid": tid, "device": device,
        "stream": acc.take("x", "stream"), "correlation": corr,
        "external_id": acc.take("x", "external_id"), "kclass": kclass.astype(np.uint8),
    })
    n_profiler_steps = _profiler_steps(names, name_codes, kind)
    del name_codes, kclass

    text = _categories(_inverse(t.text))
    side = {frame: _side_frame(acc, frame, text) for frame in ("gpu_args", "comm_args", "op_args")}
    if (legacy & is_dev).any():      # device events known as such only now: their launch details are absent
        side["gpu_args"] = _with_default_rows(side["gpu_args"], np.flatnonzero(legacy & is_dev),
                                              acc.side_specs["gpu_args"])
    memory = pl.DataFrame({"ts_ns": acc.take("memory", "ts_ns"),
                           **{n: acc.take("memory", n) for n in acc.side_names["memory"]}})
    threads, processes = _meta_names(acc, t)

    span = (int(ts.min()), int((ts + dur).max())) if len(ts) else None
    if acc.bad_events:
        problems.append(f"{acc.bad_events} malformed events skipped")
    if acc.invalid_utf8_chunks:
        problems.append("invalid UTF-8 in event strings, replaced by U+FFFD")
    if acc.repaired_events:
        problems.append(f"{acc.repaired_events} events with badly typed fields kept without those fields")
    if acc.deep_values:
        problems.append(f"{acc.deep_values} values nested over {MAX_NESTING} levels deep read as empty")
    if parsed.cut_at_byte is not None:
        problems.append(f"{parsed.cut_reason} at byte {parsed.cut_at_byte}: "
                        f"salvaged {acc.n_events} complete events before the cut")
    begin_end = phase_counts.get("B", 0) + phase_counts.get("E", 0)
    if begin_end:
        problems.append(f"begin/end ('B'/'E') events ignored: {begin_end}")

    dist = header.get("distributedInfo") if isinstance(header.get("distributedInfo"), dict) else {}
    dist_rank, world_size, rank_problems = checked_rank(dist.get("rank"), dist.get("world_size"))
    problems += rank_problems
    devices = header.get("deviceProperties") if isinstance(header.get("deviceProperties"), list) else []
    if parsed.fmt == "chrome-array":
        problems.append(_array_format_note(path, bool(legacy.any())))
    meta = RankMeta(
        file=str(path), rank=-1, rank_source="unknown",
        format=parsed.fmt if parsed.fmt != "kineto" else _format_of(t.cat),
        dist_rank=dist_rank, world_size=world_size,
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        pg_config=dist.get("pg_config") if isinstance(dist.get("pg_config"), list) else [],
        devices=[d for d in devices if isinstance(d, dict)],
        hostname=next((h for h in (header.get("host_name"), header.get("hostname")) if isinstance(h, str)), None),
        base_time_ns=_int_or_none(header.get("baseTimeNanoseconds")),
        display_time_unit=header.get("displayTimeUnit") if isinstance(header.get("displayTimeUnit"), str) else None,
        events_total=acc.n_events, phase_counts=phase_counts,
        device_events=int(is_dev.sum()), profiler_steps=n_profiler_steps,
        thread_names=threads, process_names=processes,
        span_ns=span, salvaged=parsed.cut_at_byte is not None, problems=problems, size_bytes=size,
        cut_at_byte=parsed.cut_at_byte, cut_reason=parsed.cut_reason or None, dropped=dropped,
    )
    return RankTrace(meta=meta, events=events, memory=memory, flows=flows, **side)


#: The longest plausible duration of an event, and gap between a file's events; beyond: dropped.
MAX_DUR_NS = 86_400 * 10**9
#: |ts| from this on (146 years from the clock's zero) is no profiler time: dropped.
MAX_TS_NS = 2**62
#: Why an event's times are unusable (code i + 1 in `_drop_unusable_times`), in the order checked
#: (the span of the other events is known once their values are), a missing ts or dur first.
TIME_REASONS = ("ts not a number", "ts out of range", "dur not a number", "dur negative", "dur over 1 day",
                "ts over 1 day away from the other events", "no ts", "no dur")


def _drop_unusable_times(acc: _Accumulator) -> dict[str, int]:
    """Drop the kept events (complete, flow, memory sample) whose ts or dur is unusable (see
    TIME_REASONS), each under its first reason; return how many per reason. The side frames' rows
    follow the complete events they belong to."""
    groups = {g: acc.parts[g] for g in ("x", "flows", "memory") if "ts_ns" in acc.parts.get(g, {})}
    reasons: dict[str, np.ndarray] = {}
    for g, cols in groups.items():
        ts = cols["ts_ns"].values()
        r = np.zeros(len(ts), np.uint8)
        _mark(r, ts == T_ABSENT, 7)
        _mark(r, ts == T_NOT_A_NUMBER, 1)
        _mark(r, (ts >= MAX_TS_NS) | (ts <= -MAX_TS_NS), 2)
        if g == "x":
            dur = cols["dur_ns"].values()
            _mark(r, dur == T_ABSENT, 8)
            _mark(r, dur == T_NOT_A_NUMBER, 3)
            _mark(r, dur < 0, 4)
            _mark(r, dur > MAX_DUR_NS, 5)
        reasons[g] = r
    usable = {g: cols["ts_ns"].values() if not reasons[g].any() else cols["ts_ns"].values()[reasons[g] == 0]
              for g, cols in groups.items()}
    ends = [(int(u.min()), int(u.max())) for u in usable.values() if len(u)]
    if ends and max(b for _, b in ends) - min(a for a, _ in ends) > MAX_DUR_NS:
        lo, hi = _main_run(np.concatenate(list(usable.values())))
        for g, cols in groups.items():
            ts = cols["ts_ns"].values()
            _mark(reasons[g], (ts < lo) | (ts > hi), 6)
    counts = np.zeros(len(TIME_REASONS) + 1, np.int64)
    for g, cols in groups.items():
        keep = reasons[g] == 0
        if keep.all():
            continue
        counts += np.bincount(reasons[g], minlength=len(counts))
        for column in cols.values():
            column.keep(keep)
        if g == "x":
            _keep_side_rows(acc, keep)
    return {reason: int(n) for reason, n in zip(TIME_REASONS, counts[1:]) if n}


def _mark(reasons: np.ndarray, where: np.ndarray, code: int) -> None:
    """Give `code` to the rows where `where` holds that have no reason yet."""
    reasons[(reasons == 0) & where] = code


def _main_run(ts: np.ndarray) -> tuple[int, int]:
    """First and last time of the largest run of sorted `ts` without a gap over MAX_DUR_NS."""
    s = np.sort(ts)
    cuts = np.flatnonzero(np.diff(s) > MAX_DUR_NS) + 1
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(s)]
    i = int(np.argmax(ends - starts))
    return int(s[starts[i]]), int(s[ends[i] - 1])


def _keep_side_rows(acc: _Accumulator, keep: np.ndarray) -> None:
    """Side frames after complete events were dropped (`keep`): their rows go, the others' `row`
    numbers are renumbered."""
    new_row = np.cumsum(keep) - 1
    for frame in _SIDE_KINDS:
        cols = acc.parts.get(frame, {})
        if "row" not in cols:
            continue
        kept = keep[cols["row"].values()]
        for column in cols.values():
            column.keep(kept)
        rows = cols["row"].values()
        rows[:] = new_row[rows]


#: Kept columns that hold `k`-kind values: ints, or -2 - code of a string in the `tid` table.
_KEY_COLUMNS = {"x": ("pid", "tid"), "flows": ("id", "pid", "tid"), "meta": ("pid", "tid")}


def _canonical_key_codes(acc: _Accumulator) -> None:
    """String pids/tids/flow ids ("Traces", "stream 7") are coded in the order they are met, which
    differs between the scanner (event by event) and columnize (column by column): recode them in
    the order of their text, so both paths give identical frames."""
    table = acc.tables.tid
    if not table:
        return
    texts = sorted(table)
    remap = np.empty(len(texts), dtype=np.int64)
    remap[[table[x] for x in texts]] = np.arange(len(texts))
    table.clear()
    table.update((x, i) for i, x in enumerate(texts))
    for group, names in _KEY_COLUMNS.items():
        for name in names:
            column = acc.parts.get(group, {}).get(name)
            if column is None:
                continue
            values = column.values()
            coded = (values <= -2) & (values >= -1 - len(texts))     # below: a negative int as written
            values[coded] = -2 - remap[-2 - values[coded]]


def _profiler_steps(names: list[str], name_codes: np.ndarray, kind: np.ndarray) -> int:
    step = re.compile(PROFILER_STEP_PATTERN)
    is_step = np.array([bool(step.match(n)) for n in names] + [False], dtype=bool)
    host = np.isin(kind, [int(Kind.CPU_OP), int(Kind.USER_ANNOTATION)])
    return int(len(np.unique(name_codes[host & is_step[name_codes]])))


#: torch 1.x autograd profiler (`export_chrome_trace` before Kineto: a top-level event array): its
#: complete events have no `cat`; the process they are filed under says where they ran (the tid of
#: a "CUDA functions" event is the device index).
LEGACY_PROCESS_KINDS = {"cpu functions": Kind.CPU_OP, "cuda functions": Kind.KERNEL}


def _legacy_kinds(kind: np.ndarray, pid: np.ndarray, pid_table: dict) -> np.ndarray:
    """Give the complete events of unknown category (Kind.OTHER) filed under a torch 1.x process
    name (LEGACY_PROCESS_KINDS) their kind, in place; return where that happened."""
    changed = np.zeros(len(kind), dtype=bool)
    for text, code in pid_table.items():
        k = LEGACY_PROCESS_KINDS.get(text.strip().lower())
        if k is not None:
            at = (pid == -2 - code) & (kind == int(Kind.OTHER))
            kind[at] = int(k)
            changed |= at
    return changed


def _with_default_rows(frame: pl.DataFrame, rows: np.ndarray, specs: list[Col]) -> pl.DataFrame:
    """`frame` (a side frame keyed by `row`) plus one row of defaults for each of `rows`."""
    extra = pl.DataFrame({"row": rows.astype(np.int64),
                          **{name: np.full(len(rows), spec.default, dtype=DTYPES[spec.kind])
                             for name, spec in zip(frame.columns[1:], specs)}})
    return pl.concat([frame, extra.cast(frame.schema)]).sort("row")


def _array_format_note(path: Path, legacy: bool) -> str:
    """The warning for a trace that is a bare event array (no header: no distributedInfo, no
    deviceProperties): what it is, where its rank comes from."""
    what = ("torch 1.x trace format (top-level event array, events without categories: kinds from the "
            "'CPU functions' / 'CUDA functions' processes)" if legacy else "top-level event array (no Kineto header)")
    rank = "rank from the file name" if rank_from_filename(path) is not None else "rank from the file order"
    return f"{what}: no distributedInfo nor deviceProperties, {rank}"


def _format_of(cat_table: dict) -> str:
    return "kineto-2021" if any(c in cat_table for c in ("Operator", "Kernel", "Runtime")) else "kineto"


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _inverse(table: dict) -> list[str]:
    out = [""] * len(table)
    for k, i in table.items():
        out[i] = k
    return out


_SIDE_TEXT = {"collective", "in_split_size", "out_split_size", "dtype", "pg_name", "pg_desc",
              "pg_ranks", "input_dims", "input_types", "call_stack"}


def _side_frame(acc: _Accumulator, frame: str, text: pl.Series) -> pl.DataFrame:
    data = {"row": acc.take(frame, "row")}
    for name, spec in zip(acc.side_names[frame], acc.side_specs[frame]):
        values = acc.take(frame, name, DTYPES[spec.kind])
        data[name] = _text_column(values, text) if name in _SIDE_TEXT else values
    return pl.DataFrame(data)


def _text_column(codes: np.ndarray, categories: pl.Series) -> pl.Series:
    """Codes into a per-file text table -> Categorical (a gather of the categorical table, no
    string per row); negative codes -> null."""
    if len(categories) == 0:
        return pl.Series([None] * len(codes), dtype=pl.Categorical)
    c = pl.Series(codes, dtype=pl.Int64)
    index = pl.select(pl.when(c >= 0).then(c).cast(pl.UInt32)).to_series()
    return categories.gather(index)


def _categories(texts: list[str]) -> pl.Series:
    try:
        return pl.Series(texts, dtype=pl.String).cast(pl.Categorical)
    except UnicodeEncodeError:     # lone surrogates ("\ud800" escapes): valid JSON, not UTF-8
        fixed = [t.encode("utf-8", "replace").decode("utf-8") for t in texts]
        return pl.Series(fixed, dtype=pl.String).cast(pl.Categorical)


def _meta_names(acc: _Accumulator, t: _Tables) -> tuple[dict, dict]:
    """thread_name / process_name metadata events -> {"pid/tid": name}, {"pid": name}."""
    threads: dict[str, str] = {}
    procs: dict[str, str] = {}
    text, names, keys = _inverse(t.text), _inverse(t.name), _inverse(t.tid)
    rows = zip(acc.take("meta", "name").tolist(), acc.take("meta", "pid").tolist(),
               acc.take("meta", "tid").tolist(), acc.take("meta", "label").tolist())
    for name, pid, tid, label in rows:
        if label < 0 or name < 0:
            continue
        if names[name] == "thread_name":
            threads[f"{_key_text(pid, keys)}/{_key_text(tid, keys)}"] = text[label]
        elif names[name] == "process_name":
            procs[_key_text(pid, keys)] = text[label]
    return threads, procs


def _key_text(v: int, keys: list[str]) -> str:
    return keys[-2 - v] if v <= -2 else str(v)


def _flows_frame(acc: _Accumulator) -> pl.DataFrame:
    t = acc.tables
    return pl.DataFrame({
        "phase": _text_column(acc.take("flows", "ph", np.int32), _categories(_inverse(t.ph))),
        "cat": _text_column(acc.take("flows", "cat", np.int32), _categories(_inverse(t.cat))),
        "id": acc.take("flows", "id"), "ts_ns": acc.take("flows", "ts_ns"),
        "pid": acc.take("flows", "pid"), "tid": acc.take("flows", "tid"),
    })


def _link_launches(corr: np.ndarray, flows: pl.DataFrame, kind: np.ndarray, pid: np.ndarray,
                   tid: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Launch links (ac2g / 2021 'async' flows) fill `correlation` where the args lack it: a
    flow's start lies on the runtime call, its finish on the device event, same id."""
    missing = (corr < 0) & np.isin(kind, [int(Kind.RUNTIME), int(Kind.DRIVER)] + [int(k) for k in DEVICE_KINDS])
    if not missing.any() or flows.is_empty():
        return corr
    links = flows.filter(pl.col("cat").is_in(list(LAUNCH_FLOW_CATEGORIES)) & (pl.col("id") >= 0))
    if links.is_empty():
        return corr
    idx = np.flatnonzero(missing)
    ev = pl.DataFrame({"i": idx, "pid": pid[idx], "tid": tid[idx], "ts_ns": ts[idx]})
    joined = ev.join(links.select("pid", "tid", "ts_ns", "id").unique(["pid", "tid", "ts_ns"]),
                     on=["pid", "tid", "ts_ns"], how="inner")
    corr = corr.copy()
    corr[joined["i"].to_numpy()] = joined["id"].to_numpy()
    return corr
