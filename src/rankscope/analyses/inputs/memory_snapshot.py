"""What a CUDA memory snapshot says: peak, fragmentation, the largest live blocks and where they
were allocated, what led to an OOM, and memory per category next to the theoretical breakdown.

Contract: `analyze_snapshot(snapshot, params=None, param_bytes=4) -> MemoryReport`, pure (no I/O).
Sizes are bytes.

- At the snapshot (segments): reserved = sum of segment sizes; allocated = sum of `allocated_size`;
  free cached = reserved - allocated; scattered free memory (`fragmentation_pct`, the JSON's name)
  = 1 - largest free block / free cached in blocks (0%: one free hole; near 100%: free memory in
  crumbs no large tensor fits in).
- Fragmentation judged (`judged`, the `memory_fragmentation` finding; the definition of the trace
  figure, docs/concepts.md): reserved - allocated when allocated memory peaks, and its share of
  the memory reserved then. With an allocation history it is judged at the replayed peak
  (`at = "peak_allocated"`); without one only the segments at the snapshot are known, so it is
  judged there (`at = "snapshot"`).
- Over the recorded window (device_traces): replayed from the end, since the trace may start after
  the program did: allocated before the window = the blocks still live at the snapshot that the
  trace never allocated + the blocks the trace frees without having allocated them. Then alloc
  adds, free_completed removes (free_requested when a trace has no free_completed); segment_alloc /
  segment_map add to reserved, segment_free / segment_unmap remove. Peak = the highest point.
- Categories, from the allocation stack (`classify_frames`): optimizer (torch.optim, Adam's
  `_init_group` / state `zeros_like`), gradients (`backward`, autograd), parameters (module
  `__init__` outside forward, `_apply` / `.to()`, `reset_parameters`, state-dict loading),
  activations (`forward`), else unknown (no stack: allocated before `_record_memory_history`, or on
  autograd's C++ thread, which records no Python frames).
- Theoretical (docs/concepts.md "Memory snapshot"): parameters N x bytes per parameter, gradients the same, Adam 2 fp32
  states (8 bytes / parameter), an fp32 master copy when parameters are narrower than fp32;
  activations = measured peak - that static memory.
"""
from __future__ import annotations

from collections import Counter

from rankscope.ingest.memory_snapshot import Frame, MemorySnapshot, TraceEvent
from rankscope.results.memory import (CATEGORIES, DeviceMemory, JudgedFragmentation, LiveBlock, MemoryReport, Oom,
                                      Theoretical, TraceReplay)

LIVE_STATES = ("active_allocated", "active_pending_free")
TOP_BLOCKS = 10
EVENTS_BEFORE_OOM = 12
ADAM_STATE_BYTES = 8           # exp_avg + exp_avg_sq, fp32
FP32_BYTES = 4

_OPTIMIZER_FUNCS = {"_init_group", "_multi_tensor_adam", "_single_tensor_adam", "_fused_adam", "_multi_tensor_adamw",
                    "_single_tensor_adamw", "_fused_adamw", "_init_state", "zero_grad"}
_GRAD_FUNCS = {"backward", "_make_grads", "run_backward", "_engine_run_backward", "grad", "AccumulateGrad"}
_PARAM_FUNCS = {"_apply", "reset_parameters", "_load_from_state_dict", "load_state_dict", "_init_weights", "init_weights"}
_LIBRARY_PATHS = ("site-packages/", "dist-packages/", "/torch/", "<frozen", "/lib/python")


def classify_frames(frames: list[Frame]) -> str:
    """A category from an allocation's Python stack (innermost frame first)."""
    if not frames:
        return "unknown"
    names = {name for name, _file, _line in frames}
    files = [file.replace("\\", "/") for _name, file, _line in frames]
    if names & _OPTIMIZER_FUNCS or any("/optim/" in f or "optimizer" in f.rsplit("/", 1)[-1] for f in files):
        return "optimizer"
    if names & _GRAD_FUNCS or any("/autograd/" in f for f in files):
        return "gradients"
    if names & _PARAM_FUNCS or ("__init__" in names and "forward" not in names):
        return "parameters"
    if "forward" in names or "_call_impl" in names:
        return "activations"
    return "unknown"


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame outside torch and installed libraries (the user's own code)."""
    for frame in frames:
        path = frame[1].replace("\\", "/").lower()
        if not any(part in path for part in _LIBRARY_PATHS):
            return frame
    return frames[0] if frames else None


def judged_fragmentation(reserved: int, allocated: int, replay: TraceReplay | None) -> JudgedFragmentation:
    """Fragmentation (module docstring) at the replayed peak when there is one, else at the snapshot."""
    at = "snapshot"
    if replay is not None and replay.peak_allocated > allocated:
        at, reserved, allocated = "peak_allocated", max(replay.reserved_at_peak, replay.peak_allocated), \
            replay.peak_allocated
    free = max(reserved - allocated, 0)
    return JudgedFragmentation(at, reserved, allocated, free, 100.0 * free / reserved if reserved > 0 else 0.0)


def analyze_snapshot(snap: MemorySnapshot, params: int | None = None, param_bytes: int = FP32_BYTES) -> MemoryReport:
    devices = sorted({s.device for s in snap.segments} | set(snap.device_traces))
    per_device, ooms = [], []
    for device in devices:
        mem, device_ooms = _device(snap, device)
        per_device.append(mem)
        ooms.extend(device_ooms)
    live = [LiveBlock(s.device, b.address, b.size, b.requested_size, classify_frames(b.frames), b.frames[:6],
                      user_frame(b.frames))
            for s in snap.segments for b in s.blocks if b.state in LIVE_STATES]
    live.sort(key=lambda b: -b.size)
    report = MemoryReport(
        file=snap.file, devices=per_device, largest_blocks=live[:TOP_BLOCKS], ooms=ooms,
        peak_by_category={c: sum((d.replay.peak_by_category if d.replay else d.live_by_category)[c] for d in per_device)
                          for c in CATEGORIES},
        live_by_category={c: sum(d.live_by_category[c] for d in per_device) for c in CATEGORIES},
        allocator_settings=snap.allocator_settings)
    if params:
        peak = max((_peak(d) for d in per_device), default=0)
        report.theoretical = theoretical_breakdown(params, param_bytes, peak)
    return report


def theoretical_breakdown(params: int, param_bytes: int, measured_peak: int) -> Theoretical:
    """The usual estimate (ZeRO, Rajbhandari et al. 2020): parameters + gradients + Adam states (+ fp32
    master copy) + activations."""
    parts = {"parameters": params * param_bytes, "gradients": params * param_bytes,
             "optimizer": params * ADAM_STATE_BYTES + (params * FP32_BYTES if param_bytes < FP32_BYTES else 0)}
    static = sum(parts.values())
    parts["activations"] = max(measured_peak - static, 0)
    return Theoretical(params, param_bytes, parts, static, measured_peak)


def _peak(d: DeviceMemory) -> int:
    return max(d.allocated, d.replay.peak_allocated if d.replay else 0)


def _device(snap: MemorySnapshot, device: int) -> tuple[DeviceMemory, list[Oom]]:
    segments = [s for s in snap.segments if s.device == device]
    reserved = sum(s.total_size for s in segments)
    allocated = sum(s.allocated_size for s in segments)
    free = [b.size for s in segments for b in s.blocks if b.state == "inactive"]
    live = [b for s in segments for b in s.blocks if b.state in LIVE_STATES]
    by_category = Counter({c: 0 for c in CATEGORIES})
    for b in live:
        by_category[classify_frames(b.frames)] += b.size
    largest = max(free, default=0)
    fragmentation = 100.0 * (1.0 - largest / sum(free)) if sum(free) else 0.0
    events = snap.device_traces.get(device) or []
    replay, ooms = _replay(events, live, reserved, device) if events else (None, [])
    return DeviceMemory(device, len(segments), reserved, allocated, reserved - allocated, largest, len(free),
                        fragmentation, len(live), dict(by_category), replay,
                        judged_fragmentation(reserved, allocated, replay)), ooms


def _replay(events: list[TraceEvent], live_at_end: list, reserved_end: int, device: int) -> tuple[TraceReplay, list[Oom]]:
    free_action = "free_completed" if any(e.action == "free_completed" for e in events) else "free_requested"
    allocated_in_trace = {e.addr for e in events if e.action == "alloc"}
    # allocated before the window, by category: live at the end and never allocated in the trace,
    # plus what the trace frees without having allocated it
    before = Counter({c: 0 for c in CATEGORIES})
    for b in live_at_end:
        if b.address not in allocated_in_trace:
            before[classify_frames(b.frames)] += b.size
    seen: set[int] = set()
    for e in events:
        if e.action == "alloc":
            seen.add(e.addr)
        elif e.action == free_action:
            if e.addr in seen:
                seen.discard(e.addr)
            else:
                before["unknown"] += e.size
    by_category = Counter(before)
    allocated = sum(before.values())
    reserved_delta = sum(_segment_delta(e) for e in events)
    reserved = reserved_end - reserved_delta
    peak, peak_time, peak_cats, peak_reserved = allocated, events[0].time_us, dict(by_category), reserved
    reserved_at_peak = reserved
    live: dict[int, tuple[int, str]] = {}
    recent: list[TraceEvent] = []
    ooms = []
    for e in events:
        new_peak = False
        if e.action == "alloc":
            category = classify_frames(e.frames)
            live[e.addr] = (e.size, category)
            allocated += e.size
            by_category[category] += e.size
            if allocated > peak:
                peak, peak_time, peak_cats, new_peak = allocated, e.time_us, dict(by_category), True
        elif e.action == free_action:
            size, category = live.pop(e.addr, (e.size, "unknown"))
            allocated -= size
            by_category[category] -= size
        elif e.action == "oom":
            ooms.append(Oom(device, e.time_us, e.size, e.device_free, allocated,
                            [_event_row(x) for x in recent[-EVENTS_BEFORE_OOM:]]))
        reserved += _segment_delta(e)
        peak_reserved = max(peak_reserved, reserved)
        if new_peak:
            reserved_at_peak = reserved
        recent.append(e)
        if len(recent) > 4 * EVENTS_BEFORE_OOM:
            del recent[:-EVENTS_BEFORE_OOM]
    times = [e.time_us for e in events if e.time_us is not None]
    replay = TraceReplay(events=len(events), window_start_us=min(times) if times else None, window_s=(max(times) - min(times)) / 1e6 if times else None,
                         allocated_before_window=sum(before.values()), peak_allocated=peak, peak_time_us=peak_time,
                         peak_by_category=peak_cats, peak_reserved=max(peak_reserved, reserved_end),
                         actions=dict(Counter(e.action for e in events)), reserved_at_peak=reserved_at_peak)
    return replay, ooms


def _segment_delta(e: TraceEvent) -> int:
    if e.action in ("segment_alloc", "segment_map"):
        return e.size
    if e.action in ("segment_free", "segment_unmap"):
        return -e.size
    return 0


def _event_row(e: TraceEvent) -> dict:
    frame = user_frame(e.frames)
    return {"action": e.action, "size": e.size, "addr": e.addr, "time_us": e.time_us,
            "category": classify_frames(e.frames) if e.action == "alloc" else None,
            "frame": f"{frame[0]} {frame[1]}:{frame[2]}" if frame else None}
