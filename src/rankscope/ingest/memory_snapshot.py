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
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path

from rankscope.ingest.errors import TraceError

#: A frame as (function name, file name, line).
Frame = tuple[str, str, int]


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
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    if not data:
        raise TraceError("empty file")
    if data[:1] != b"\x80":
        raise TraceError("not a pickle (torch.cuda.memory._dump_snapshot writes a binary pickle)")
    try:
        raw = load_plain_pickle(data)
    except UnsafePickle as exc:
        raise TraceError(f"unsafe pickle, not loaded: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError, TypeError, MemoryError, OverflowError) as exc:
        raise TraceError(f"truncated or damaged pickle ({type(exc).__name__}: {exc or 'ran out of input'})") from None
    if isinstance(raw, list) and raw and all(isinstance(s, dict) for s in raw):   # memory_snapshot(): segments
        raw = {"segments": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("segments"), list):
        raise TraceError(f"a {type(raw).__name__} without 'segments': not a torch.cuda.memory._snapshot()")
    try:
        return _snapshot(str(path), raw)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"unexpected snapshot layout ({type(exc).__name__}: {exc})") from None


def _frames(raw) -> list[Frame]:
    return [(str(f.get("name", "?")), str(f.get("filename", "?")), int(f.get("line") or 0))
            for f in raw or () if isinstance(f, dict)]


def _block_frames(b: dict) -> list[Frame]:
    if b.get("frames"):
        return _frames(b["frames"])
    history = b.get("history") or []
    return _frames(history[-1].get("frames")) if history else []


def _snapshot(file: str, raw: dict) -> MemorySnapshot:
    segments = [Segment(device=int(s.get("device", 0)), address=int(s.get("address", 0)),
                        total_size=int(s["total_size"]), allocated_size=int(s.get("allocated_size", 0)),
                        segment_type=str(s.get("segment_type", "")), stream=int(s.get("stream", 0)),
                        blocks=[Block(int(b.get("address", 0)), int(b["size"]), int(b.get("requested_size", b["size"])),
                                      str(b.get("state", "")), _block_frames(b)) for b in s.get("blocks", ())])
                for s in raw["segments"]]
    traces = {}
    for device, events in enumerate(raw.get("device_traces") or []):
        traces[device] = [TraceEvent(str(e["action"]), int(e.get("addr", 0)), int(e.get("size", 0)),
                                     int(e.get("stream", 0)), e.get("time_us"), _frames(e.get("frames")),
                                     e.get("device_free")) for e in events]
    settings = raw.get("allocator_settings")
    return MemorySnapshot(file=file, segments=segments, device_traces=traces,
                          allocator_settings=settings if isinstance(settings, dict) else {})
