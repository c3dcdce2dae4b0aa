"""CUDA caching-allocator snapshots (`torch.cuda.memory._snapshot()` / `_dump_snapshot()` pickles)
-> MemorySnapshot.

Safety: the file is read with the restricted reader of ingest/safe_pickle.py (no global, no
persistent id: nothing in it is ever imported or called; its hashing bounded before unpickling).

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
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rankscope.ingest.discover import open_regular
from rankscope.ingest.errors import TraceError
from rankscope.ingest.safe_pickle import read_plain_pickle

#: A frame as (function name, file name, line).
Frame = tuple[str, str, int]
#: Segments, blocks, trace events and frames walked (each appearance counted), per byte of the
#: file, at most; real snapshots walk about 1 (the corpus: 0.4), a deep shared stack per event a few.
MAX_WALK_PER_BYTE = 64
MIN_WALK_LIMIT = 1 << 20


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
    raw = read_plain_pickle(data, "memory snapshot")
    if isinstance(raw, list) and raw and all(isinstance(s, dict) for s in raw):   # memory_snapshot(): segments
        raw = {"segments": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("segments"), list):
        raise TraceError(f"a {type(raw).__name__} without 'segments': not a torch.cuda.memory._snapshot()")
    try:
        return _Reader(max(MIN_WALK_LIMIT, MAX_WALK_PER_BYTE * len(data))).snapshot(str(path), raw)
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise TraceError(f"unexpected snapshot layout ({type(exc).__name__}: {exc})") from None


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
