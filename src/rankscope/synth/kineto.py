"""The Kineto trace format: the file's event order, metadata events and header, and its JSON text
(one event per line, gzip, truncation)."""
from __future__ import annotations

import hashlib
import zlib
from operator import itemgetter

import msgspec

from rankscope.synth.constants import BASE_TIME_NS, COMM_STREAM, COMPUTE_STREAM, GPUS_PER_NODE, NUM_SMS

from rankscope.synth.events import _EventSink
from rankscope.synth.simulation import _RankSim


def _trace_events(sim: _RankSim, sink: _EventSink) -> list[dict]:
    """The rank's events in Kineto's file order: metadata, host ops (by start), [memory] events,
    runtime calls and GPU activities, flows, the profiler's own span and instants."""
    by_ts = itemgetter("ts")
    cpu, mem, device = sorted(sink.cpu, key=by_ts), sorted(sink.mem, key=by_ts), sorted(sink.device_events, key=by_ts)
    index = 0
    for event in cpu:
        if event["ph"] == "X":
            event["args"]["Ev Idx"] = index
            index += 1
    for event in mem:
        event["args"]["Ev Idx"] = index
        index += 1
    start, end = sink.us(sim.profile_start), sink.us(sim.last_activity + 200_000)
    return [*_metadata_events(sim, start), *cpu, *mem, *device, *sink.flows, *_profiler_span_events(start, end)]


def _metadata_events(sim: _RankSim, ts: float) -> list[dict]:
    pid, device = sim.pid, sim.device
    rows = [("process_name", pid, 0, {"name": "python"}), ("process_labels", pid, 0, {"labels": "CPU"}),
            ("process_sort_index", pid, 0, {"sort_index": pid}),
            ("process_name", device, 0, {"name": "python"}), ("process_labels", device, 0, {"labels": f"GPU {device}"}),
            ("process_sort_index", device, 0, {"sort_index": 16_777_216 + device})]
    for stream in (COMPUTE_STREAM, COMM_STREAM):
        rows += [("thread_name", device, stream, {"name": f"stream {stream} "}),
                 ("thread_sort_index", device, stream, {"sort_index": stream})]
    for tid, name in ((sim.main_tid, "pt_main_thread"), (sim.autograd_tid, f"pt_autograd_{device}")):
        rows += [("thread_name", pid, tid, {"name": f"thread {tid} ({name})"}),
                 ("thread_sort_index", pid, tid, {"sort_index": tid})]
    return [{"ph": "M", "name": name, "ts": ts, "pid": p, "tid": tid, "args": args} for name, p, tid, args in rows]


def _profiler_span_events(start: float, end: float) -> list[dict]:
    return [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
             "ts": start, "dur": round(end - start, 3), "args": {"Op count": 0}},
            {"ph": "M", "name": "process_sort_index", "ts": start, "pid": "Spans", "tid": 0,
             "args": {"sort_index": 536_870_912}},
            {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces",
             "tid": "Trace PyTorch Profiler", "ts": start},
            {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": end}]


_DEVICE_PROPERTIES = [
    {"id": i, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 84_929_347_584, "computeMajor": 9, "computeMinor": 0,
     "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
     "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233_472,
     "numSms": NUM_SMS, "sharedMemPerBlockOptin": 232_448}
    for i in range(GPUS_PER_NODE)]


def _trace_id(rank: int, world: int, seed: int) -> str:
    return hashlib.blake2b(f"{seed}:{world}:{rank}".encode(), digest_size=16).hexdigest().upper()


def _trace_header(rank: int, world: int, seed: int) -> dict:
    return {"schemaVersion": 1, "deviceProperties": _DEVICE_PROPERTIES, "trace_id": _trace_id(rank, world, seed),
            "profile_memory": 1, "record_shapes": 1,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 1,
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                               "pg_size": world, "ranks": list(range(world))}],
                                "nccl_version": "2.21.5"},
            "host_name": f"node{rank // GPUS_PER_NODE:03d}", "displayTimeUnit": "ms",
            "baseTimeNanoseconds": BASE_TIME_NS}


GZIP_LEVEL = 1     # ~9x smaller than the JSON here, at a fraction of level 6's cost
TRUNCATE_AT = 0.6  # a truncated file keeps this share of its events, then half of the next one


def _encode_trace(header: dict, events: list[dict], trace_name: str, truncate: bool) -> tuple[bytes, int]:
    """The file's JSON text, one event per line like Kineto. Returns (text, complete events in it)."""
    encode = msgspec.json.Encoder().encode
    fields = b"".join(b'  "%s": %s,\n' % (key.encode(), encode(value)) for key, value in header.items())
    head = b"{\n" + fields + b'  "traceEvents": [\n'
    if not truncate:
        tail = b'\n  ],\n  "traceName": ' + encode(trace_name) + b"\n}\n"
        return head + _event_lines(encode(events)) + tail, len(events)
    kept = int(len(events) * TRUNCATE_AT)
    cut_event = encode(events[kept])
    return head + _event_lines(encode(events[:kept])) + b",\n" + cut_event[: len(cut_event) // 2], kept


def _event_lines(encoded_list: bytes) -> bytes:
    """[{..},{..}] -> one event per line, without the brackets (every event starts with "ph")."""
    return encoded_list[1:-1].replace(b'},{"ph":', b'},\n{"ph":')


def _gzip_bytes(data: bytes, complete: bool) -> bytes:
    """gzip with mtime 0 (deterministic). Incomplete: flushed but never finished, as when the
    writer is killed: every byte of `data` can be recovered, but the stream has no end."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush(zlib.Z_FINISH if complete else zlib.Z_FULL_FLUSH)
