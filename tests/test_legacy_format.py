"""torch 1.x legacy traces: a top-level JSON array of events without categories (issue 16).

The autograd profiler of torch 1.x (`export_chrome_trace` without Kineto) writes a bare JSON array:
complete events with no `cat`, host ops under the process "CPU functions", device work (use_cuda)
under "CUDA functions" with the device index as tid, and `cpu_to_cuda` flow events between them
(torch/autograd/profiler.py of torch 1.4-1.7 dumps the events with json.dump; 1.8 writes them
by hand, `{"name": ..., "ph": "X", ...}, ` each, and only the flow starts). The files here are
written in those two shapes; every expected value is a hand count of the events the test lists.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rankscope.analyses.rank.breakdown import CATEGORIES, step_breakdown
from rankscope.ingest.kineto import read_kineto
from rankscope.model import Kind


def _torch17_array(path: Path) -> Path:
    """torch 1.7 `export_chrome_trace` with use_cuda=True (json.dump of the event list).
    Hand layout (µs): host ops conv2d 0-100, relu 100-130, add 300-310 (tid 1); their device
    work on device 0: 10-60, 120-200, 305-400."""
    events = []
    ops = [("conv2d", 0, 100, 10, 50), ("relu", 100, 30, 120, 80), ("add", 300, 10, 305, 95)]
    for i, (name, ts, dur, kts, kdur) in enumerate(ops):
        events.append(dict(name=name, ph="X", ts=ts, dur=dur, tid=1, pid="CPU functions", args={}))
        events.append(dict(name=name, ph="s", ts=ts, tid=1, pid="CPU functions", id=i, cat="cpu_to_cuda", args={}))
        events.append(dict(name=name, ph="f", ts=kts, tid=0, pid="CUDA functions", id=i, cat="cpu_to_cuda", args={}))
        events.append(dict(name=name, ph="X", ts=kts, dur=kdur, tid=0, pid="CUDA functions", args={}))
    path.write_text(json.dumps(events))
    return path


def _torch18_array(path: Path) -> Path:
    """torch 1.8 legacy `export_chrome_trace` (CPU only), written as it does: each event followed
    by ', ', the last ', ' replaced by ']'. Hand layout (µs): 200 ops of 199.0 µs every 200 µs
    from 1000.5 (1 µs between them), each with its flow start."""
    parts = []
    for i in range(200):
        ts = 1000.5 + 200 * i
        parts.append('{"name": "aten::linear", "ph": "X", "ts": %s, "dur": %s, "tid": 7, '
                     '"pid": "CPU functions", "args": {}}, ' % (ts, 199.0))
        parts.append('{"name": "aten::linear", "ph": "s", "ts": %s, "tid": 7, "pid": "CPU functions", '
                     '"id": %d, "cat": "cpu_to_cuda", "args": {}}, ' % (ts, i))
    path.write_text("[" + "".join(parts)[:-2] + "]")
    return path


@pytest.mark.parametrize("use_scanner", [True, False], ids=["c-scanner", "msgspec"])
def test_torch17_array_kinds_and_warning(tmp_path, use_scanner):
    trace, header = read_kineto(_torch17_array(tmp_path / "rank3.json"), use_scanner=use_scanner)
    meta = trace.meta
    assert header == {} and meta.format == "chrome-array"
    assert (meta.dist_rank, meta.devices) == (None, [])
    assert meta.problems == ["torch 1.x trace format (top-level event array, events without categories: kinds "
                             "from the 'CPU functions' / 'CUDA functions' processes): no distributedInfo nor "
                             "deviceProperties, rank from the file name"]
    ev = trace.events
    kinds = ev["kind"].to_list()
    # hand count: 3 ops under "CPU functions", 3 device ranges under "CUDA functions"
    assert kinds.count(int(Kind.CPU_OP)) == 3 and kinds.count(int(Kind.KERNEL)) == 3 and len(kinds) == 6
    assert meta.device_events == 3
    kernels = ev.filter(ev["kind"] == int(Kind.KERNEL))
    assert kernels["device"].to_list() == [0, 0, 0]            # the tid of "CUDA functions": the device index
    # every device event has its (empty) launch-details row, as Kineto's do
    rows = np.flatnonzero(ev["kind"].to_numpy() == int(Kind.KERNEL))
    assert trace.gpu_args["row"].to_list() == rows.tolist()


def test_torch17_array_breakdown_is_not_all_idle(tmp_path):
    trace, _ = read_kineto(_torch17_array(tmp_path / "rank0.json"))
    row = step_breakdown(trace).frame.row(0, named=True)
    # hand count over the whole trace, 0-400 µs: device busy 10-60, 120-200, 305-400 (225);
    # device idle with the host in an op: 0-10, 60-100 (conv2d), 100-120 (relu), 300-305 (add) = 75;
    # nothing at all 200-300 (100)
    expected_us = {c: 0 for c in CATEGORIES} | {"compute": 225, "host": 75, "idle_other": 100}
    assert {c: round(row[c] * 1000, 6) for c in CATEGORIES} == expected_us


def test_torch18_cpu_only_array_ops_cover_the_step(tmp_path):
    trace, _ = read_kineto(_torch18_array(tmp_path / "worker.json"))
    meta = trace.meta
    assert meta.format == "chrome-array" and meta.device_events == 0
    assert meta.problems[0].startswith("torch 1.x trace format") and meta.problems[0].endswith(
        "rank from the file order")
    assert trace.events["kind"].to_list() == [int(Kind.CPU_OP)] * 200
    row = step_breakdown(trace).frame.row(0, named=True)
    # CPU-only: the host ops play the device. Hand count: span 1000.5 .. 1000.5 + 199 * 200 + 199,
    # 39999 µs; ops cover 200 x 199 = 39800 µs (99.5%); the 199 gaps of 1 µs between them are idle
    busy = sum(row[c] for c in CATEGORIES if c not in ("idle_other", "host", "dataloader", "sync"))
    assert row["duration_ms"] == pytest.approx(39.999)
    assert busy == pytest.approx(39.8) and row["idle_other"] == pytest.approx(0.199)


def test_other_top_level_array_keeps_unknown_kinds(tmp_path):
    """A bare array from another tool (numeric pids, no categories): nothing is guessed, and the
    warning does not claim torch 1.x."""
    p = tmp_path / "t.json"
    p.write_text(json.dumps([{"name": "a", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]))
    trace, _ = read_kineto(p)
    assert trace.events["kind"].to_list() == [int(Kind.OTHER)]
    assert trace.meta.problems == ["top-level event array (no Kineto header): no distributedInfo nor "
                                   "deviceProperties, rank from the file order"]
