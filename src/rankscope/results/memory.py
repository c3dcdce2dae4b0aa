"""What `rankscope memory` finds in CUDA memory snapshots (docs/inputs.md): per device the peak, its
breakdown, fragmentation and the stacks behind it, the OOMs, the theoretical breakdown. Made by
analyses/inputs/memory_snapshot.py."""
from __future__ import annotations

from typing import Any

import msgspec

from rankscope.ingest.memory_snapshot import Frame

#: What a block of memory holds, as the snapshot's stacks tell it.
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "unknown")


class LiveBlock(msgspec.Struct):
    device: int
    address: int
    size: int
    requested_size: int
    category: str
    frames: list[Frame]                 # innermost first, at most 6
    user_frame: Frame | None


class TraceReplay(msgspec.Struct):
    events: int
    window_start_us: int | None
    window_s: float | None
    allocated_before_window: int
    peak_allocated: int
    peak_time_us: int | None
    peak_by_category: dict[str, int]
    peak_reserved: int
    actions: dict[str, int]
    reserved_at_peak: int = 0           # reserved memory when allocated peaked


class Oom(msgspec.Struct):
    device: int
    time_us: int | None
    requested: int
    device_free: int | None
    allocated_at_oom: int
    events_before: list[dict[str, Any]]   # oldest first: action, size, addr, time_us, category, frame


class JudgedFragmentation(msgspec.Struct):
    """reserved - allocated at one moment: the peak allocated of the recorded window, else the snapshot."""
    at: str                             # "peak_allocated" | "snapshot"
    reserved: int
    allocated: int
    free_cached: int                    # reserved - allocated
    pct_of_reserved: float


class DeviceMemory(msgspec.Struct):
    device: int
    segments: int
    reserved: int
    allocated: int
    free_cached: int
    largest_free_block: int
    free_blocks: int
    fragmentation_pct: float
    live_blocks: int
    live_by_category: dict[str, int]
    replay: TraceReplay | None
    judged: JudgedFragmentation | None = None


class Theoretical(msgspec.Struct):
    params: int
    param_bytes: int
    by_category: dict[str, int]         # parameters, gradients, optimizer (+ master weights), activations (implied)
    static: int
    measured_peak: int


class MemoryReport(msgspec.Struct):
    file: str
    devices: list[DeviceMemory]
    largest_blocks: list[LiveBlock]
    #: all devices: bytes per category at each device's peak (the snapshot without a trace) / at the snapshot
    peak_by_category: dict[str, int] = {}
    live_by_category: dict[str, int] = {}
    ooms: list[Oom] = []
    theoretical: Theoretical | None = None
    allocator_settings: dict[str, Any] = {}
