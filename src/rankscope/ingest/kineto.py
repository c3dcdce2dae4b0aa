"""Kineto / Chrome-trace JSON (.json, .json.gz) -> RankTrace.

Streaming: the file is read (and gunzipped, with ISA-L) in chunks; each chunk of whole events is
decoded by msgspec into Structs and turned into typed columns, then dropped. Peak memory is the
columns plus one chunk, not the whole text nor a Python object per event.

Robustness, in order of cost:
  1. fast path: a chunk decodes as `list[Event]` (typed Structs, unknown keys skipped in C);
  2. a chunk with a badly typed event (e.g. `"args": []`) is decoded event by event, bad fields
     dropped, and the count reported;
  3. a file cut mid-write (or with garbage inside) keeps every complete event before the cut and
     says how many were salvaged;
  4. no trace inside (empty, not JSON, JSON without events, corrupt gzip) -> TraceError, one line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import msgspec
import numpy as np
import polars as pl

from rankscope.ingest.columns import Col, columnize, scan_json
from rankscope.model import (CATEGORY_KINDS, DEVICE_KINDS, Kind, RankMeta, RankTrace,
                             classify_names)

CHUNK_BYTES = 8 << 20          # decompressed bytes decoded at once
HEADER_LIMIT = 64 << 20        # give up looking for "traceEvents" after this many bytes
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class TraceError(Exception):
    """The file holds no usable trace. The message is one line, without the file name."""


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


# ----------------------------------------------------------------------------------------------
# Reading bytes
def _chunks(path: Path) -> Iterator[bytes]:
    """Decompressed text of the file, in blocks. A gzip stream that breaks (cut or corrupt) still
    yields everything decompressed before the break, then raises _ReadError."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                f.seek(0)
                yield from iter(lambda: f.read(CHUNK_BYTES), b"")
                return
            f.seek(0)
            yield from _gunzip(f)
    except (OSError, EOFError) as exc:
        raise _ReadError(str(exc) or type(exc).__name__) from exc


def _gunzip(f: BinaryIO) -> Iterator[bytes]:
    from isal import isal_zlib
    inflater = isal_zlib.decompressobj(wbits=31)
    while True:
        data = f.read(CHUNK_BYTES // 4)
        if not data:
            if not inflater.eof:
                raise _ReadError("gzip stream is cut short (file truncated?)")
            return
        while data:
            try:
                out = inflater.decompress(data)
            except isal_zlib.error as exc:
                raise _ReadError(f"corrupt gzip data: {exc}") from exc
            if out:
                yield out
            data = inflater.unused_data if inflater.eof else b""
            if inflater.eof and data.strip(b"\x00"):     # another gzip member follows
                inflater = isal_zlib.decompressobj(wbits=31)
            elif inflater.eof:
                data = b""


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
        Col(_E.ts, None, "t", 0),
        Col(_E.dur, None, "t", 0),
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


@dataclass
class _Accumulator:
    """Per-chunk columns, kept until the end of the file."""
    tables: _Tables
    core: list[list[np.ndarray]] = field(default_factory=list)
    side: dict[str, list] = field(default_factory=dict)   # frame -> list of (global rows, cols)
    offset: int = 0
    bad_events: int = 0
    use_scanner: bool = True

    def __post_init__(self) -> None:
        t = self.tables
        self.core_specs = _core_specs(t)
        self.side_specs = {frame: [c for _, c in cols] for frame, cols in _side_specs(t).items()}
        table_list = [t.ph, t.name, t.cat, t.tid, t.text]
        flat = self.core_specs + [c for cols in self.side_specs.values() for c in cols]
        self.scan_specs = [_scan_spec(c, table_list) for c in flat]
        self.table_list = table_list

    def scan(self, body) -> bool:
        """C fast path over raw JSON; False when the chunk must take the msgspec path."""
        out = scan_json(body, self.scan_specs, self.table_list) if self.use_scanner else None
        if out is None:
            return False
        cols, n, bad = out
        self.bad_events += bad
        core, rest = cols[:len(self.core_specs)], cols[len(self.core_specs):]
        dense, i = {}, 0
        for frame, specs in self.side_specs.items():
            dense[frame] = rest[i:i + len(specs)]
            i += len(specs)
        self._add(core, n, lambda frame, idx: [c[idx] for c in dense[frame]])
        return True

    def add(self, events: list) -> None:
        """Columns of decoded Structs (the msgspec path)."""
        if events:
            core = columnize(events, self.core_specs)
            self._add(core, len(events), lambda frame, idx: columnize(events, self.side_specs[frame], idx))

    def _add(self, core: list[np.ndarray], n: int, side_columns) -> None:
        if n == 0:
            return
        self.core.append(core)
        groups = self._side_groups(core[0], core[1], core[2])
        for frame, idx in groups.items():
            if len(idx):
                self.side.setdefault(frame, []).append((idx + self.offset, side_columns(frame, idx)))
        self.offset += n

    def _side_groups(self, ph, cat, name) -> dict[str, np.ndarray]:
        t = self.tables
        code = lambda table, key: table.get(key, -99)  # noqa: E731
        is_x = ph == code(t.ph, "X")
        cat_kind = _cat_kind_lut(t.cat)
        kind = cat_kind[np.maximum(cat, 0)] if len(cat_kind) else np.full(len(cat), -1)
        kind = np.where(cat >= 0, kind, -1)
        device = np.isin(kind, [int(k) for k in DEVICE_KINDS]) & is_x
        host_ops = np.isin(kind, [int(Kind.CPU_OP), int(Kind.USER_ANNOTATION),
                                  int(Kind.PYTHON_FUNCTION)]) & is_x
        memory = np.isin(ph, [code(t.ph, "i"), code(t.ph, "I")]) & (name == code(t.name, "[memory]"))
        return {
            "gpu_args": np.flatnonzero(device),
            "comm_args": np.flatnonzero((host_ops & (kind != int(Kind.PYTHON_FUNCTION))) | device),
            "op_args": np.flatnonzero(host_ops),
            "memory": np.flatnonzero(memory),
            "meta": np.flatnonzero(ph == code(t.ph, "M")),
        }


def _cat_kind_lut(cat_table: dict) -> np.ndarray:
    lut = np.full(len(cat_table), int(Kind.OTHER), dtype=np.int16)
    for text, i in cat_table.items():
        lut[i] = int(CATEGORY_KINDS.get(text.lower(), Kind.OTHER))
    return lut


# ----------------------------------------------------------------------------------------------
def _decode_chunk(body: bytes | memoryview, acc: _Accumulator) -> None:
    """Decode the JSON array `body` (whole events only): C scanner first; msgspec where the
    scanner declines (it is the reference); badly typed events repaired one by one."""
    if acc.scan(body):
        return
    try:
        events = _decode_events(body)
    except msgspec.ValidationError:
        events = _decode_leniently(bytes(body), acc)
    acc.add(events)


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
    events = []
    for raw in _decode_raw_list(data):
        try:
            events.append(_decode_events(b"[" + bytes(raw) + b"]")[0])
            continue
        except msgspec.ValidationError:
            pass
        obj = _decode_any(bytes(raw))
        if not isinstance(obj, dict):
            acc.bad_events += 1
            continue
        args = obj.get("args")
        if not isinstance(args, dict):
            obj.pop("args", None)
        else:
            obj["args"] = {k: v for k, v in args.items() if k not in ("Input Dims", "Input type")}
        try:
            events.append(msgspec.convert(obj, Event, strict=False))
        except msgspec.ValidationError:
            acc.bad_events += 1
    return events


def _last_boundary(buf: bytes | bytearray, before: int) -> int:
    """Position just after the last '}' of a `}, {` event boundary that starts before `before`;
    -1 if none."""
    window = 1 << 16
    while True:
        lo = max(0, before - window)
        last = -1
        for m in _BOUNDARY.finditer(buf, lo, before):
            last = m.start() + 1
        if last >= 0 or lo == 0:
            return last
        window *= 4


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

    # 1. header: everything up to `"traceEvents": [` (or a bare top-level array)
    start = None          # position of the '[' that opens the event list
    try:
        for block in chunks:
            buf += block
            first = re.search(rb"\S", buf)
            if first and buf[first.start()] == 0x5B:
                start = first.start()
                fmt = "chrome-array"
                break
            if first and buf[first.start()] != 0x7B:
                raise TraceError("not JSON (does not start with '{' or '[')")
            m = _EVENTS_KEY.search(buf)
            if m:
                header_bytes = bytes(buf[:m.start()])
                start = m.end() - 1
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
        raise TraceError("JSON without a 'traceEvents' array: not a profiler trace")
    header = _parse_header(header_bytes)
    del buf[:start]
    consumed = start      # bytes of decompressed text before buf[0]

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
            cut_at = consumed + _salvage(buf, acc)
            cut_reason = (str(read_error) if read_error
                          else "file ends mid-event (truncated)")
            break
        end = _last_boundary(buf, len(buf))
        if end < 0:
            continue
        try:
            _decode_span(buf, end, acc)
        except msgspec.DecodeError:
            cut_at = consumed + _salvage(buf, acc, end)
            cut_reason = "invalid JSON inside the event list"
            break
        comma = buf.index(b",", end)
        del buf[:comma]
        consumed += comma
    return _Parsed(header, trailer, acc, cut_at, cut_reason, fmt)


def _parse_header(header_bytes: bytes) -> dict:
    text = header_bytes.rstrip().rstrip(b",").rstrip()
    if not text.strip():
        return {}
    try:
        h = _decode_header(text + b"}")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}   # an unreadable header loses metadata (rank from the file name), not events
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
                _decode_span(buf, p, acc)
                return trailer if isinstance(trailer, dict) else {}
            except msgspec.DecodeError:
                pass
        pos = p
    return None


def _salvage(buf: bytearray, acc: _Accumulator, before: int | None = None) -> int:
    """Decode the longest run of whole events at the start of `buf` (ending before `before`);
    return how many bytes of it were kept."""
    end = len(buf) if before is None else before
    for _ in range(200):
        end = _last_boundary(buf, end)
        if end < 0:
            break
        try:
            _decode_span(buf, end, acc)
            return end
        except msgspec.DecodeError:
            end -= 1
    # one whole event and nothing after it but the cut
    close = buf.rfind(b"}", 0, len(buf) if before is None else before)
    for _ in range(16):
        if close <= 0:
            break
        try:
            _decode_span(buf, close + 1, acc)
            return close + 1
        except msgspec.DecodeError:
            close = buf.rfind(b"}", 0, close)
    return 0


# ----------------------------------------------------------------------------------------------
def read_kineto(path: str | Path, use_scanner: bool = True) -> tuple[RankTrace, dict]:
    """Parse one Kineto/Chrome trace file. Returns the RankTrace (rank not yet assigned: -1,
    `rank_source` "unknown") and the header dict (distributedInfo etc.). Raises TraceError.
    `use_scanner=False` forces the msgspec reference path (tests compare the two)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    if size == 0:
        raise TraceError("empty file")
    parsed = _parse_stream(path, use_scanner)
    acc = parsed.acc
    if not acc.core:
        if parsed.cut_at_byte is not None:
            raise TraceError(f"{parsed.cut_reason} at byte {parsed.cut_at_byte}; no complete event before it")
        raise TraceError("no trace events")
    header = {**parsed.trailer, **parsed.header} if isinstance(parsed.trailer, dict) else parsed.header
    trace = _build(path, size, parsed, header)
    return trace, header


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _build(path: Path, size: int, parsed: _Parsed, header: dict) -> RankTrace:
    acc, t = parsed.acc, parsed.acc.tables
    cols = {name: _concat([c[i] for c in acc.core]) for i, name in enumerate(_CORE_NAMES)}
    acc.core.clear()
    n_all = len(cols["ph"])
    ph_names = _inverse(t.ph)
    phase_counts = {ph_names[i]: int(c) for i, c in enumerate(np.bincount(cols["ph"][cols["ph"] >= 0],
                                                                            minlength=len(ph_names)))}
    x_code = t.ph.get("X", -99)
    x_rows = np.flatnonzero(cols["ph"] == x_code)
    row_of = np.full(n_all, -1, dtype=np.int64)
    row_of[x_rows] = np.arange(len(x_rows))

    cat_kind = _cat_kind_lut(t.cat)
    cat = cols["cat"][x_rows]
    kind = np.where(cat >= 0, cat_kind[np.maximum(cat, 0)] if len(cat_kind) else int(Kind.OTHER),
                    int(Kind.OTHER)).astype(np.uint8)
    names = _inverse(t.name)
    name_codes = cols["name"][x_rows]
    # names used by device events -> kernel class per name
    is_dev = np.isin(kind, [int(k) for k in DEVICE_KINDS])
    used_by_dev = np.zeros(len(names) + 1, dtype=bool)
    used_by_dev[name_codes[is_dev & (name_codes >= 0)]] = True
    class_of_name = classify_names(names, used_by_dev[:len(names)])
    kclass = np.where(name_codes >= 0, class_of_name[np.maximum(name_codes, 0)] if len(names) else 0, 0)
    kclass = kclass.astype(np.uint8)

    ext = cols["ext"][x_rows]
    ext = np.where(ext >= 0, ext, cols["ext21"][x_rows])
    pid = cols["pid"][x_rows]
    tid = cols["tid"][x_rows]
    device = cols["device"][x_rows]
    device = np.where((device < 0) & is_dev & (pid >= 0), pid, device)
    stream = cols["stream"][x_rows]
    corr = cols["corr"][x_rows]
    ts = cols["ts_ns"][x_rows]
    dur = cols["dur_ns"][x_rows]

    problems: list[str] = []
    negative = int((dur < 0).sum())
    if negative:
        problems.append(f"{negative} events with negative duration (set to 0)")
        dur = np.maximum(dur, 0)

    flows, corr = _flows_and_links(cols, t, x_rows, kind, pid, tid, ts, corr)

    name_series = pl.Series("name", names, dtype=pl.String) if names else pl.Series("name", [""])
    events = pl.DataFrame({
        "kind": kind,
        "name": name_series.gather(np.maximum(name_codes, 0)).cast(pl.Categorical)
        if len(names) else pl.Series("name", [""] * len(x_rows)).cast(pl.Categorical),
        "ts_ns": ts,
        "dur_ns": dur,
        "pid": pid,
        "tid": tid,
        "device": device.astype(np.int32),
        "stream": stream,
        "correlation": corr,
        "external_id": ext,
        "kclass": kclass,
    })

    text = _inverse(t.text)
    side = _side_frames(acc, row_of, text)
    memory = _memory_frame(acc, cols)
    meta_names = _meta_names(acc, cols, t)

    span = (int(ts.min()), int((ts + dur).max())) if len(ts) else None
    if acc.bad_events:
        problems.append(f"{acc.bad_events} malformed events skipped")
    if parsed.cut_at_byte is not None:
        problems.append(f"{parsed.cut_reason} at byte {parsed.cut_at_byte}: "
                        f"salvaged {n_all} complete events before the cut")
    other_phases = {k: v for k, v in phase_counts.items() if k in ("B", "E")}
    if other_phases:
        problems.append(f"begin/end ('B'/'E') events ignored: {sum(other_phases.values())}")

    dist = header.get("distributedInfo") if isinstance(header.get("distributedInfo"), dict) else {}
    devices = header.get("deviceProperties") if isinstance(header.get("deviceProperties"), list) else []
    meta = RankMeta(
        file=str(path), rank=-1, rank_source="unknown",
        format=parsed.fmt if parsed.fmt != "kineto" else _format_of(t.cat),
        dist_rank=_int_or_none(dist.get("rank")),
        world_size=_int_or_none(dist.get("world_size")),
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        pg_config=dist.get("pg_config") if isinstance(dist.get("pg_config"), list) else [],
        devices=[d for d in devices if isinstance(d, dict)],
        hostname=next((h for h in (header.get("host_name"), header.get("hostname")) if isinstance(h, str)), None),
        base_time_ns=_int_or_none(header.get("baseTimeNanoseconds")),
        display_time_unit=header.get("displayTimeUnit") if isinstance(header.get("displayTimeUnit"), str) else None,
        events_total=n_all, phase_counts=phase_counts,
        thread_names=meta_names[0], process_names=meta_names[1],
        span_ns=span, salvaged=parsed.cut_at_byte is not None, problems=problems, size_bytes=size,
    )
    return RankTrace(meta=meta, events=events, memory=memory, flows=flows, **side)


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


def _side_frames(acc: _Accumulator, row_of: np.ndarray, text: list[str]) -> dict[str, pl.DataFrame]:
    specs = _side_specs(acc.tables)
    out = {}
    text_series = pl.Series("t", text, dtype=pl.String)
    for frame in ("gpu_args", "comm_args", "op_args"):
        names = [n for n, _ in specs[frame]]
        parts = acc.side.get(frame, [])
        rows = _concat([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        data = {"row": row_of[rows] if len(rows) else rows}
        for i, n in enumerate(names):
            data[n] = _concat([p[1][i] for p in parts]) if parts else np.zeros(0, np.int64)
        df = pl.DataFrame(data)
        # keep rows that carry at least one value
        if frame == "comm_args":
            df = df.filter((pl.col("collective") >= 0) | (pl.col("in_msg_nelems") >= 0) | (pl.col("seq") >= 0))
        elif frame == "op_args":
            df = df.filter((pl.col("input_dims") >= 0) | (pl.col("call_stack") >= 0) | (pl.col("flops").is_not_nan())
                           | (pl.col("sequence_number") >= 0) | (pl.col("python_id") >= 0))
        df = df.with_columns([_text_column(df[n].to_numpy(), text_series).alias(n)
                              for n in names if n in _SIDE_TEXT])
        out[frame] = df
    return out


def _text_column(codes: np.ndarray, text_series: pl.Series) -> pl.Series:
    """int32 codes into the per-file text table -> Categorical; negative codes -> null."""
    valid = codes >= 0
    if not len(text_series) or not valid.any():
        return pl.Series([None] * len(codes), dtype=pl.String).cast(pl.Categorical)
    values = text_series.gather(np.where(valid, codes, 0))
    return values.zip_with(pl.Series(valid), pl.Series([None] * len(codes), dtype=pl.String)).cast(pl.Categorical)


def _memory_frame(acc: _Accumulator, cols: dict) -> pl.DataFrame:
    names = [n for n, _ in _side_specs(acc.tables)["memory"]]
    parts = acc.side.get("memory", [])
    if not parts:
        return pl.DataFrame({"ts_ns": np.zeros(0, np.int64), **{n: np.zeros(0, np.int64) for n in names}})
    rows = _concat([p[0] for p in parts])
    data = {"ts_ns": cols["ts_ns"][rows]}
    for i, n in enumerate(names):
        data[n] = _concat([p[1][i] for p in parts])
    return pl.DataFrame(data)


def _meta_names(acc: _Accumulator, cols: dict, t: _Tables) -> tuple[dict, dict]:
    parts = acc.side.get("meta", [])
    threads: dict[str, str] = {}
    procs: dict[str, str] = {}
    if not parts:
        return threads, procs
    text = _inverse(t.text)
    names = _inverse(t.name)
    tids_text = _inverse(t.tid)
    rows = _concat([p[0] for p in parts])
    label = _concat([p[1][0] for p in parts])
    for r, lab in zip(rows.tolist(), label.tolist()):
        if lab < 0:
            continue
        ev = names[cols["name"][r]] if cols["name"][r] >= 0 else ""
        pid = _key_text(int(cols["pid"][r]), tids_text)
        tid = _key_text(int(cols["tid"][r]), tids_text)
        if ev == "thread_name":
            threads[f"{pid}/{tid}"] = text[lab]
        elif ev == "process_name":
            procs[pid] = text[lab]
    return threads, procs


def _key_text(v: int, tids_text: list[str]) -> str:
    return tids_text[-2 - v] if v <= -2 else str(v)


def _flows_and_links(cols: dict, t: _Tables, x_rows: np.ndarray, kind: np.ndarray, pid: np.ndarray,
                     tid: np.ndarray, ts: np.ndarray, corr: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    """Flow events as a frame; launch links (ac2g / 2021 'async') fill `correlation` where the
    args do not carry it: a flow start on a runtime call and its finish on a device event."""
    codes = [t.ph.get(p, -99) for p in ("s", "f", "t")]
    rows = np.flatnonzero(np.isin(cols["ph"], codes))
    flows = pl.DataFrame({
        "phase": _text_column(cols["ph"][rows], pl.Series(_inverse(t.ph), dtype=pl.String)),
        "cat": _text_column(cols["cat"][rows], pl.Series(_inverse(t.cat), dtype=pl.String)),
        "id": cols["id"][rows], "ts_ns": cols["ts_ns"][rows],
        "pid": cols["pid"][rows], "tid": cols["tid"][rows],
    })
    missing = (corr < 0) & np.isin(kind, [int(Kind.RUNTIME), int(Kind.DRIVER)] + [int(k) for k in DEVICE_KINDS])
    if not missing.any() or flows.is_empty():
        return flows, corr
    links = flows.filter(pl.col("cat").is_in(["ac2g", "async", "async_cpu_to_gpu"]) & (pl.col("id") >= 0))
    if links.is_empty():
        return flows, corr
    ev = pl.DataFrame({"i": np.arange(len(x_rows)), "pid": pid, "tid": tid, "ts_ns": ts,
                       "missing": missing}).filter(pl.col("missing"))
    joined = ev.join(links.select("pid", "tid", "ts_ns", "id").unique(["pid", "tid", "ts_ns"]),
                     on=["pid", "tid", "ts_ns"], how="inner")
    corr = corr.copy()
    corr[joined["i"].to_numpy()] = joined["id"].to_numpy()
    return flows, corr
