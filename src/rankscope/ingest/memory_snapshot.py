"""CUDA caching-allocator snapshots (`torch.cuda.memory._snapshot()` / `_dump_snapshot()` pickles)
-> MemorySnapshot.

Safety: a pickle can run any code it names, so the file is read with an unpickler that refuses
every global (`find_class`) and every persistent id. A snapshot needs none: it is dicts, lists,
tuples, strings, numbers, booleans and None (checked on the corpus with `pickletools`: no GLOBAL,
STACK_GLOBAL, REDUCE, BUILD, INST, OBJ or NEWOBJ opcode). Objects cannot be built without a
global, so nothing in the file is ever called; no torch is needed to read it.

Layout (torch/cuda/memory.py, `_Snapshot`): `segments` (one per cudaMalloc: device, address,
total_size, allocated_size, segment_type, `blocks` [address, size, requested_size, state
active_allocated | active_pending_free | inactive, `frames` of the allocation]); `device_traces`
(per device, the recorded events: action alloc | free_requested | free_completed | segment_alloc |
segment_free | segment_map | segment_unmap | snapshot | oom, addr, size, stream, time_us, frames;
oom also device_free). Older snapshots keep a block's frames in `history[-1].frames`.

Bounded: a pickle can make one object appear in many places by reference (its memo), so a few
hundred bytes can describe lists nested a billion times over. Each distinct list is converted
once (shared again where it reappears), values of the wrong type are not turned into text, and the
walk over segments, blocks, events and frames, which the analysis repeats, is counted at every
appearance: past `MAX_WALK_PER_BYTE` per byte of the file the snapshot is refused.
Unpickling itself only links shared objects, except where it hashes: a dict key, a set or
frozenset member. Hashing a tuple hashes its items each time (not cached), so 60 tuples of two
references to the one before make a key of 2**60 items. Before anything is unpickled, the opcode
stream is read (`pickletools.genops`, nothing built) and the hashing it would do is counted, each
shared tuple at its full expanded size: past `MAX_HASH_PER_BYTE` per byte of the file (or
`MAX_HASH_WORK` in all) the snapshot is refused (`_hash_work`).
"""
from __future__ import annotations

import io
import math
import pickle
import pickletools
from dataclasses import dataclass, field
from pathlib import Path

from rankscope.ingest.discover import open_regular
from rankscope.ingest.errors import TraceError

#: A frame as (function name, file name, line).
Frame = tuple[str, str, int]
#: Segments, blocks, trace events and frames walked (each appearance counted), per byte of the
#: file, at most; real snapshots walk about 1 (the corpus: 0.4), a deep shared stack per event a few.
MAX_WALK_PER_BYTE = 64
MIN_WALK_LIMIT = 1 << 20
#: Items hashed while unpickling (a tuple key: all the items it expands to, at each use), per byte
#: of the file, at most, and in all; real snapshots hash about one key per 10 bytes (the corpus: 0.03
#: per byte: string keys, whose hash is cached).
MAX_HASH_PER_BYTE = 64
MIN_HASH_LIMIT = 1 << 20
MAX_HASH_WORK = 1 << 31


@dataclass
class Block:
    address: int
    size: int
    requested_size: int
    state: str
    frames: list[Frame]


@dataclass
class Segment:
    device: int
    address: int
    total_size: int
    allocated_size: int
    segment_type: str
    stream: int
    blocks: list[Block]


@dataclass
class TraceEvent:
    action: str
    addr: int
    size: int
    stream: int
    time_us: int | None
    frames: list[Frame]
    device_free: int | None = None        # oom: what CUDA reported free


@dataclass
class MemorySnapshot:
    file: str
    segments: list[Segment]
    device_traces: dict[int, list[TraceEvent]] = field(default_factory=dict)
    allocator_settings: dict = field(default_factory=dict)


class UnsafePickle(pickle.UnpicklingError):
    """The pickle names a global (a class or function to call): refused, nothing was run."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds only pickle's plain types; any global (class, function) is refused."""

    def find_class(self, module: str, name: str):
        raise UnsafePickle(f"it names the global {module}.{name}; a memory snapshot holds only plain dicts, "
                           "lists, strings and numbers")

    def persistent_load(self, pid):
        raise UnsafePickle("it refers to an external object (persistent id); a memory snapshot holds none")


def load_plain_pickle(data: bytes):
    """Unpickle bytes with no global allowed (UnsafePickle on any)."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def read_memory_snapshot(path: str | Path) -> MemorySnapshot:
    """Read one snapshot pickle safely. Raises TraceError (one line, without the file name)."""
    try:
        with open_regular(path) as f:          # a FIFO or device is never waited on
            data = f.read()
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    if not data:
        raise TraceError("empty file")
    if data[:1] != b"\x80":
        raise TraceError("not a pickle (torch.cuda.memory._dump_snapshot writes a binary pickle)")
    limit = min(MAX_HASH_WORK, max(MIN_HASH_LIMIT, MAX_HASH_PER_BYTE * len(data)))
    work = _hash_work(data, limit)
    if work > limit:
        raise TraceError(f"memory snapshot: its dict keys or set members, built from shared references, would "
                         f"take over {limit:,} hashing steps to unpickle ({MAX_HASH_PER_BYTE} per byte of the "
                         f"file at most): refused, not unpickled")
    try:
        raw = load_plain_pickle(data)
    except UnsafePickle as exc:
        raise TraceError(f"unsafe pickle, not loaded: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError, TypeError, MemoryError,
            OverflowError) as exc:
        raise TraceError(f"truncated or damaged pickle ({type(exc).__name__}: {exc or 'ran out of input'})") from None
    if isinstance(raw, list) and raw and all(isinstance(s, dict) for s in raw):   # memory_snapshot(): segments
        raw = {"segments": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("segments"), list):
        raise TraceError(f"a {type(raw).__name__} without 'segments': not a torch.cuda.memory._snapshot()")
    try:
        return _Reader(max(MIN_WALK_LIMIT, MAX_WALK_PER_BYTE * len(data))).snapshot(str(path), raw)
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise TraceError(f"unexpected snapshot layout ({type(exc).__name__}: {exc})") from None


#: Opcode name -> (items popped below a mark, pops to a mark, items pushed), from pickletools.
_STACK_EFFECT = {op.name: (op.stack_before.index(pickletools.markobject)
                           if pickletools.markobject in op.stack_before else len(op.stack_before),
                           pickletools.markobject in op.stack_before, len(op.stack_after))
                 for op in pickletools.opcodes}
_GETS = {"BINGET", "LONG_BINGET", "GET"}
_PUTS = {"BINPUT", "LONG_BINPUT", "PUT"}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_INTS = {"LONG", "LONG1", "LONG4", "INT"}


def _hash_work(data: bytes, limit: int) -> int:
    """How many items unpickling `data` would hash (dict keys, set and frozenset members), counted
    from the opcode stream without building anything; stops once past `limit`. Each object on the
    simulated stack is its hashing cost: a tuple 1 + its items' costs (shared ones at every use),
    an int 1 + its size in 60-bit digits (an int's hash is not cached), anything else 1 (a str's
    hash is cached; a list or dict is not hashable: hashing it fails at once). A stream that breaks
    (bad opcode, cut, stack underflow) ends the count there: unpickling fails at the same opcode."""
    stack: list[int] = []
    marks: list[int] = []        # stack lengths at each MARK, as the unpickler keeps them
    memo: dict = {}
    work = 0
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in _GETS:
                stack.append(memo.get(arg, 1))
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in _PUTS:
                memo[arg] = stack[-1]
            elif name == "MARK":
                marks.append(len(stack))
            elif name in _TUPLES:
                n = _TUPLES[name]
                if len(stack) - (marks[-1] if marks else 0) < n:
                    break
                cost = 1 + sum(stack[-n:])
                del stack[-n:]
                stack.append(cost)
            elif name == "SETITEM":
                if len(stack) - (marks[-1] if marks else 0) < 3:
                    break
                work += stack[-2]
                del stack[-2:]
            elif name == "DUP":
                stack.append(stack[-1])
            elif name == "POP" and marks and marks[-1] == len(stack):
                marks.pop()                      # POP of a mark drops the mark
            else:
                below, to_mark, pushed = _STACK_EFFECT[name]
                items: list[int] = []
                if to_mark:
                    at = marks.pop()
                    items = stack[at:]
                    del stack[at:]
                if below:
                    if len(stack) - (marks[-1] if marks else 0) < below:
                        break
                    del stack[-below:]
                if name in ("SETITEMS", "DICT"):
                    work += sum(items[0::2])
                elif name in ("ADDITEMS", "FROZENSET"):
                    work += sum(items)
                cost = 1
                if name == "TUPLE":
                    cost += sum(items)
                elif name in _INTS and isinstance(arg, int):
                    cost += arg.bit_length() // 60
                stack.extend([cost] * pushed)
            if work > limit:
                break
    except (ValueError, IndexError):      # a broken stream: unpickling fails there too
        pass
    return work


class _TooShared(Exception):
    pass


_EMPTY: list = []


def _text(value, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _time(value) -> int | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return int(value) if ok else None


def _plain_settings(raw) -> dict:
    """allocator_settings as flat values (a dict of them one level down, as roundup_power2_divisions)."""
    def plain(v):
        return v is None or isinstance(v, (str, int, float))
    if not isinstance(raw, dict):
        return {}
    return {str(k): v if plain(v) else {str(k2): v2 for k2, v2 in v.items() if plain(v2)}
            for k, v in raw.items() if isinstance(k, str) and (plain(v) or isinstance(v, dict))}


class _Reader:
    """Plain snapshot -> MemorySnapshot. Each distinct list is converted once per use (segments,
    blocks, events, frames); `walked` counts what the conversion and the analysis go through: a
    list's whole content again at each place it appears."""

    def __init__(self, limit: int):
        self.limit = limit
        self.walked = 0
        self.converted: dict[tuple, tuple[list, int]] = {}    # (id of a raw list, use) -> (conversion, walk)

    def _walk(self, n: int) -> None:
        self.walked += n
        if self.walked > self.limit:
            raise _TooShared

    def _list(self, raw, convert) -> list:
        items = raw if isinstance(raw, list) else _EMPTY
        known = self.converted.get((id(items), convert))
        if known is not None:
            self._walk(known[1])
            return known[0]
        before = self.walked
        self._walk(len(items))
        done = convert(items)
        self.converted[(id(items), convert)] = (done, self.walked - before)
        return done

    def snapshot(self, file: str, raw: dict) -> MemorySnapshot:
        try:
            segments = self._list(raw["segments"], self._segments)
            traces = {device: self._list(events, self._events)
                      for device, events in enumerate(raw.get("device_traces") or [])}
        except _TooShared:
            raise TraceError(f"memory snapshot: its shared references repeat segments, blocks, events and frames "
                             f"beyond {self.limit:,} entries ({MAX_WALK_PER_BYTE} per byte of the file): refused, "
                             f"not expanded") from None
        return MemorySnapshot(file=file, segments=segments, device_traces=traces,
                              allocator_settings=_plain_settings(raw.get("allocator_settings")))

    def _segments(self, items: list) -> list[Segment]:
        return [Segment(device=int(s.get("device", 0)), address=int(s.get("address", 0)),
                        total_size=int(s["total_size"]), allocated_size=int(s.get("allocated_size", 0)),
                        segment_type=_text(s.get("segment_type")), stream=int(s.get("stream", 0)),
                        blocks=self._list(s.get("blocks"), self._blocks)) for s in items]

    def _blocks(self, items: list) -> list[Block]:
        return [Block(int(b.get("address", 0)), int(b["size"]), int(b.get("requested_size", b["size"])),
                      _text(b.get("state")), self._list(_block_frames(b), _frames)) for b in items]

    def _events(self, items: list) -> list[TraceEvent]:
        return [TraceEvent(_text(e["action"]), int(e.get("addr", 0)), int(e.get("size", 0)), int(e.get("stream", 0)),
                           _time(e.get("time_us")), self._list(e.get("frames"), _frames), _time(e.get("device_free")))
                for e in items]


def _block_frames(b: dict):
    if b.get("frames"):
        return b["frames"]
    history = b.get("history") or []
    return history[-1].get("frames") if history else []


def _frames(items: list) -> list[Frame]:
    return [(_text(f.get("name"), "?"), _text(f.get("filename"), "?"), _line(f.get("line")))
            for f in items if isinstance(f, dict)]


def _line(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
