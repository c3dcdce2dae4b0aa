"""A tiny Kineto trace writer for edge cases whose expected numbers are counted by hand.

Times are given in microseconds (as in the JSON); every event is written explicitly, so the
expected values in a test come from the events the test itself lists, not from rankscope.
"""
from __future__ import annotations

import json
from pathlib import Path


class TraceBuilder:
    def __init__(self, rank: int = 0, world_size: int = 1, pid: int = 100, tid: int = 100):
        self.rank, self.world_size, self.pid, self.tid = rank, world_size, pid, tid
        self.events: list[dict] = []
        self._corr = 1000

    def op(self, name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int | None = None) -> "TraceBuilder":
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid or self.tid,
                            "ts": ts, "dur": dur, "args": {"External id": len(self.events) + 1}})
        return self

    def step(self, n: int, ts: float, dur: float) -> "TraceBuilder":
        return self.op(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def kernel(self, name: str, launch_ts: float, ts: float, dur: float, stream: int = 7,
               cat: str = "kernel", launch_tid: int | None = None) -> "TraceBuilder":
        """A device activity and its cudaLaunchKernel (1 µs) at launch_ts, linked by correlation."""
        self._corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": self.pid,
                            "tid": launch_tid or self.tid, "ts": launch_ts, "dur": 1,
                            "args": {"correlation": self._corr}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                            "args": {"device": 0, "stream": stream, "correlation": self._corr}})
        return self

    def runtime(self, name: str, ts: float, dur: float) -> "TraceBuilder":
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": self.pid, "tid": self.tid,
                            "ts": ts, "dur": dur, "args": {"correlation": -1}})
        return self

    def write(self, path: str | Path) -> Path:
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Test GPU", "numSms": 100}],
               "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world_size},
               "traceEvents": self.events}
        path = Path(path)
        path.write_text(json.dumps(doc))
        return path
