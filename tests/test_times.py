"""Event times a reader cannot use are judged by one rule for every format (rankscope.ingest.times):
the same kernels with the same broken times, written here as a Kineto JSON trace and as an Nsight
Systems SQLite export, lose the same events for the same reasons.

Expected values: a hand count of the kernels written below, one per reason, plus the usable ones.
"""
from __future__ import annotations

from pathlib import Path

from conftest import write_trace
from rankscope.ingest import read_trace
from test_nsys import _tiny_export

EPOCH_NS = 1_700_000_000_000_000_000
DAY_NS = 86_400 * 10**9
#: (start ns after the epoch, duration ns or None for "not a number", name), and why each is dropped
KERNELS = [
    (1_000, 2_000, "gemm"),                  # usable
    (5_000, -1_000, "gemm"),                 # dur negative (its end lies before its start)
    (6_000, None, "relu"),                   # dur not a number
    (7_000, 2 * DAY_NS, "relu"),             # dur over 1 day
    (8_000, 1_000, "relu"),                  # usable
    (3 * DAY_NS, 1_000, "gemm"),             # ts over 1 day away from the other events
]
EXPECTED_DROPPED = {"dur not a number": 1, "dur negative": 1, "dur over 1 day": 1,
                    "ts over 1 day away from the other events": 1}


def _kineto(path: Path, kernels: list = KERNELS) -> Path:
    """The kernels as Kineto complete events (µs; a duration that is not a number as NaN, which
    Python's json writes and the reader reads as a value that is not a number)."""
    events = [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": (EPOCH_NS + start) / 1000,
               "dur": float("nan") if dur is None else dur / 1000, "args": {"device": 0, "stream": 7,
                                                                             "correlation": i}}
              for i, (start, dur, name) in enumerate(kernels)]
    return write_trace(path, {"traceEvents": events})


def _nsys(path: Path, kernels: list = KERNELS) -> Path:
    """The kernels as nsys rows (start, end in ns since the session start; no end: NULL)."""
    return _tiny_export(path, kernels=[(start, None if dur is None else start + dur, i, name)
                                       for i, (start, dur, name) in enumerate(kernels)],
                        runtime=[], epoch=EPOCH_NS)


def test_kineto_and_nsys_readers_drop_the_same_events(tmp_path: Path):
    kineto = read_trace(_kineto(tmp_path / "rank0.json"))[0]
    nsys = read_trace(_nsys(tmp_path / "rank1.sqlite"))[0]
    for trace in (kineto, nsys):
        assert trace.meta.dropped == EXPECTED_DROPPED, trace.meta.file
        assert "4 events dropped: 1 with dur not a number, 1 with dur negative, 1 with dur over 1 day, " \
               "1 with ts over 1 day away from the other events" in trace.meta.problems, trace.meta.problems
        kept = trace.events.sort("ts_ns")
        assert [(t - EPOCH_NS, d) for t, d in zip(kept["ts_ns"].to_list(), kept["dur_ns"].to_list())] \
            == [(1_000, 2_000), (8_000, 1_000)], trace.meta.file


def test_a_start_far_from_otherwise_usable_times_is_dropped(tmp_path: Path):
    """Every time usable but one start 3 days after the others (the groups then have no reason yet,
    and their span is read without a mask): that one kernel goes, under its reason; expected values:
    the hand count of the 3 kernels written."""
    kernels = [(1_000, 2_000, "gemm"), (8_000, 1_000, "relu"), (3 * DAY_NS, 1_000, "gemm")]
    kineto = read_trace(_kineto(tmp_path / "rank0.json", kernels))[0]
    nsys = read_trace(_nsys(tmp_path / "rank1.sqlite", kernels))[0]
    for trace in (kineto, nsys):
        assert trace.meta.dropped == {"ts over 1 day away from the other events": 1}, trace.meta.file
        kept = trace.events.sort("ts_ns")
        assert [(t - EPOCH_NS, d) for t, d in zip(kept["ts_ns"].to_list(), kept["dur_ns"].to_list())] \
            == [(1_000, 2_000), (8_000, 1_000)], trace.meta.file
