"""Decoded events -> typed columns: the column specs, the columns themselves (`_Column`: one growing
memory map each) and `_Accumulator`, which keeps, chunk by chunk, the rows each frame needs. (The
C scanner and the column extractor it shares with the msgspec path are `rankscope.ingest.columns`.)"""
from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from rankscope.ingest import reuse
from rankscope.ingest.columns import DTYPES, T_ABSENT, Col, columnize, scan_json, scan_state
from rankscope.ingest.kineto.events import Args, Event
from rankscope.model import DEVICE_KINDS, Kind, category_kind

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
        buffer = self.buffer
        assert buffer is not None             # grown once it exists
        try:
            buffer.resize(nbytes)
        except (OSError, SystemError, ValueError):        # no mremap here (macOS): copy
            grown = _anonymous_map(nbytes)
            grown[:self.n * self.dtype.itemsize] = buffer[:self.n * self.dtype.itemsize]
            buffer.close()
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
        self.routed_columns: dict[str, list[tuple[str, Any]]] = {
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
    lut = np.full(len(cat_table) + 1, int(Kind.OTHER), dtype=np.uint8)       # no category: unclassified
    for text, i in cat_table.items():
        lut[i] = int(category_kind(text))
    return lut
