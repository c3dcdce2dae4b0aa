"""Event sinks: what a rank's simulation records, as Kineto event dicts (`_EventSink`), or nothing
in the timing pass (`_NullSink`)."""
from __future__ import annotations

from rankscope.synth.constants import COMPUTE_STREAM
from rankscope.synth.program import SEQ_FWD, Memcpy, Op


class _NullSink:
    """Timing pass: the simulation runs, nothing is recorded."""

    def begin(self, op, tid, ts, ext, seq, extra=None):
        return None

    def end(self, handle, ts):
        pass

    def annotation(self, name, tid, ts, ext):
        return None

    def runtime(self, name, cbid, tid, ts, dur, ext, corr):
        pass

    def kernel(self, name, ts, dur, stream, ext, corr, static_args, extra=None):
        pass

    def memcpy(self, copy, ts, dur, ext, corr):
        pass

    def flow(self, corr, tid, runtime_ts, stream, device_ts):
        pass

    def fwdbwd(self, fwd_tid, fwd_ts, bwd_tid, bwd_ts):
        pass

    def memory(self, tid, ts, nbytes, allocated, reserved, addr):
        pass


class _EventSink:
    """Collects one rank's events as Kineto dicts. Takes job-timeline ns, writes ts/dur in µs on
    the rank's own clock (job time + origin_ns)."""

    def __init__(self, pid: int, device: int, origin_ns: int):
        self.pid, self.device, self.origin_ns = pid, device, origin_ns
        self.cpu: list[dict] = []        # cpu_op, user_annotation, fwdbwd flows
        self.mem: list[dict] = []        # [memory] instant events
        self.device_events: list[dict] = []   # cuda_runtime and GPU activities
        self.flows: list[dict] = []      # ac2g
        self._flow_id = 0

    def us(self, ns: int) -> float:
        return (ns + self.origin_ns) / 1000

    def begin(self, op: Op, tid: int, ts: int, ext: int, seq: int | None,
              extra: dict | None = None) -> tuple[dict, int]:
        args = {"External id": ext}
        if seq is not None:
            args["Sequence number"] = seq
            args["Fwd thread id"] = 0 if op.seq == SEQ_FWD else 1
        args["Record function id"] = 0
        if extra:
            args.update(extra)
        args.update(op.shape_args)
        event = {"ph": "X", "cat": "cpu_op", "name": op.name, "pid": self.pid, "tid": tid,
                 "ts": (ts + self.origin_ns) / 1000, "dur": 0.0, "args": args}
        self.cpu.append(event)
        return event, ts

    def end(self, handle: tuple[dict, int], ts: int) -> None:
        event, start = handle
        event["dur"] = (ts - start) / 1000

    def annotation(self, name: str, tid: int, ts: int, ext: int) -> tuple[dict, int]:
        event = {"ph": "X", "cat": "user_annotation", "name": name, "pid": self.pid, "tid": tid,
                 "ts": (ts + self.origin_ns) / 1000, "dur": 0.0, "args": {"External id": ext, "Record function id": 0}}
        self.cpu.append(event)
        return event, ts

    def runtime(self, name: str, cbid: int, tid: int, ts: int, dur: int, ext: int, corr: int) -> None:
        self.device_events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": self.pid, "tid": tid,
                                   "ts": (ts + self.origin_ns) / 1000, "dur": dur / 1000,
                                   "args": {"External id": ext, "cbid": cbid, "correlation": corr}})

    def kernel(self, name: str, ts: int, dur: int, stream: int, ext: int, corr: int, static_args: dict,
               extra: dict | None = None) -> None:
        args = {"External id": ext, "queued": 0, "device": self.device, "context": 1, "stream": stream,
                "correlation": corr, **static_args}
        if extra:
            args.update(extra)
        self.device_events.append({"ph": "X", "cat": "kernel", "name": name, "pid": self.device, "tid": stream,
                                   "ts": (ts + self.origin_ns) / 1000, "dur": dur / 1000, "args": args})

    def memcpy(self, copy: Memcpy, ts: int, dur: int, ext: int, corr: int) -> None:
        self.device_events.append({"ph": "X", "cat": "gpu_memcpy", "name": copy.name, "pid": self.device,
                                   "tid": COMPUTE_STREAM, "ts": (ts + self.origin_ns) / 1000, "dur": dur / 1000,
                                   "args": {"External id": ext, "device": self.device, "context": 1,
                                            "stream": COMPUTE_STREAM, "correlation": corr, "bytes": copy.nbytes,
                                            "memory bandwidth (GB/s)": copy.nbytes / dur}})

    def flow(self, corr: int, tid: int, runtime_ts: int, stream: int, device_ts: int) -> None:
        self.flows.append({"ph": "f", "id": corr, "pid": self.device, "tid": stream,
                           "ts": (device_ts + self.origin_ns) / 1000, "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self.flows.append({"ph": "s", "id": corr, "pid": self.pid, "tid": tid,
                           "ts": (runtime_ts + self.origin_ns) / 1000, "cat": "ac2g", "name": "ac2g"})

    def fwdbwd(self, fwd_tid: int, fwd_ts: int, bwd_tid: int, bwd_ts: int) -> None:
        self._flow_id += 1
        self.cpu.append({"ph": "s", "id": self._flow_id, "pid": self.pid, "tid": fwd_tid,
                         "ts": (fwd_ts + self.origin_ns) / 1000, "cat": "fwdbwd", "name": "fwdbwd"})
        self.cpu.append({"ph": "f", "id": self._flow_id, "pid": self.pid, "tid": bwd_tid,
                         "ts": (bwd_ts + self.origin_ns) / 1000, "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"})

    def memory(self, tid: int, ts: int, nbytes: int, allocated: int, reserved: int, addr: int) -> None:
        self.mem.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": self.pid,
                         "tid": tid, "ts": (ts + self.origin_ns) / 1000,
                         "args": {"Total Reserved": reserved, "Total Allocated": allocated, "Bytes": nbytes,
                                  "Device Id": self.device, "Device Type": 1, "Addr": addr, "finished": False}})


_NULL_SINK = _NullSink()
