"""Issue 33: idle time at the start (and end) of a step, before its first device activity.

- The real capture tests/data/captures/withstack-preproc (torch 2.13 CPU, gloo, `with_stack=True`;
  tests/data/captures/make_captures.py): every step starts with pure-Python work (`decode_batch`)
  and a `time.sleep` (`wait_for_batch`) before its first op. Expected values: the milliseconds the
  job measured around both (ground_truth.json), not rankscope.
- A hand-built GPU trace: the expected values are hand counts of the events it lists (µs).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_no_traceback, run_cli
from rankscope.pipelines.run import analyze_cycles
from rankscope.analyses.rank.breakdown import step_breakdown
from rankscope.analyses.rank.gaps import idle_gaps
from rankscope.ingest.kineto import read_kineto
from tracebuilder import TraceBuilder

CAPTURE = Path(__file__).parent / "data" / "captures" / "withstack-preproc"
#: Timer and profiler slack between what the job measured and what the trace holds (ms).
SLACK_MS = 1.0


@pytest.fixture(scope="module")
def preproc():
    return analyze_cycles(CAPTURE, use_cache=False), json.loads((CAPTURE / "ground_truth.json").read_text())


def test_python_before_the_first_op_is_host_and_the_sleep_idle(preproc):
    """Per rank and step: host (Python running) covers at least the measured decode time, idle_other
    at least the measured sleep (and at most it plus the slack: nothing else sleeps)."""
    result, truth = preproc
    for s in result.summaries:
        measured = truth["per_rank"][str(s.rank)]
        assert sorted(int(k) for k in measured) == [st.step for st in s.steps]
        for st in s.steps:
            m = measured[str(st.step)]
            assert st.breakdown_ms["host"] >= m["decode_ms"] - SLACK_MS
            assert m["sleep_ms"] - SLACK_MS <= st.breakdown_ms["idle_other"] <= m["sleep_ms"] + SLACK_MS


def test_gap_list_shows_the_step_leading_gap(preproc):
    """Each profiled step's longest gap is the one before its first op: at the step's start, as long
    as decode + sleep (measured), its idle part the sleep, its busiest Python function decode_batch."""
    result, truth = preproc
    for s in result.summaries:
        assert s.breakdown_mode == "cpu_only" and s.gaps is not None
        leading = {g.step: g for g in s.gaps.top if g.position == "before_first"}
        assert sorted(leading) == [st.step for st in s.steps]
        for step, g in leading.items():
            m = truth["per_rank"][str(s.rank)][str(step)]
            assert g.start_in_step_ms == 0.0
            assert g.duration_ms >= m["decode_ms"] + m["sleep_ms"] - SLACK_MS
            assert g.host_ms["idle_other"] == pytest.approx(m["sleep_ms"], abs=SLACK_MS)
            assert g.host_activity == ("host" if m["decode_ms"] > m["sleep_ms"] else "idle_other")
            assert g.busy_host_op.endswith("decode_batch")
            assert g.next_device_op.startswith("aten::")
        assert s.gaps.top[0].position == "before_first"


def test_terminal_says_before_the_first_kernel(tmp_path: Path):
    proc = run_cli(["analyze", CAPTURE, "--no-cache"], tmp_path)
    assert_no_traceback(proc)
    lines = [ln for ln in proc.stdout.splitlines() if "before the step's first kernel" in ln]
    assert lines and all("idle before the step's first kernel, host" in ln for ln in lines)
    assert "Training-thread idle gaps" in proc.stdout


def _gpu_trace(tmp_path: Path) -> Path:
    """Step 1 at 0..1000 µs on thread 100. Python `decode` 10-300 (host work), Python `time.sleep`
    300-400 (idle), DataLoader 400-500, aten::mm 500-560 launching gemm 600-700 (launch 550);
    gemm 720-800 (launch 710); nothing after 800. Step 2 at 1000..2000: the first kernel at 1300
    (launch 1290), nothing else on the host."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("train.py(40): decode", 10, 290, cat="python_function")
    b.op("<built-in function sleep>", 300, 100, cat="python_function")
    b.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 400, 100, cat="user_annotation")
    b.op("aten::mm", 500, 60)
    b.kernel("gemm", 550, 600, 100)
    b.kernel("gemm", 710, 720, 80)
    b.step(2, 1000, 1000)
    b.kernel("gemm", 1290, 1300, 100)
    return b.write(tmp_path / "rank0.json")


def test_leading_and_trailing_gaps_hand_counted(tmp_path: Path):
    trace = read_kineto(_gpu_trace(tmp_path))[0]
    g = idle_gaps(trace, gap_min_us=100)
    got = sorted((x.step, x.position, round(x.start_in_step_ms * 1000), round(x.duration_ms * 1000)) for x in g.top)
    # step 1: 0-600 before the first kernel; 700-720 is 20 µs (no gap); 800-1000 after the last.
    # step 2: 1000-1300 before its first kernel, 1400-2000 after its last (the step's CPU end).
    assert got == [(1, "after_last", 800, 200), (1, "before_first", 0, 600), (2, "after_last", 400, 600),
                   (2, "before_first", 0, 300)]
    lead = next(x for x in g.top if x.step == 1 and x.position == "before_first")
    # host in 0-600: python decode 10-300 (290), aten::mm 500-560 (60: the launch 550-551 inside it);
    # idle: 0-10, sleep 300-400, 560-600 (150); DataLoader 400-500 (100)
    assert {k: round(v * 1000) for k, v in lead.host_ms.items()} == \
        {"dataloader": 100, "sync": 0, "host": 350, "idle_other": 150}
    assert lead.busy_host_op == "aten::mm" and lead.launched_by == "aten::mm" and lead.next_device_op == "gemm"
    tail = next(x for x in g.top if x.position == "after_last")
    assert tail.next_device_op == "" and tail.host_activity == "idle_other"
    row = step_breakdown(trace).frame.row(0, named=True)
    # the step: the same, plus 700-720 (launch 710-711 host, the rest idle) and 800-1000 idle
    assert round(row["host"] * 1000) == 350 + 1 and round(row["idle_other"] * 1000) == 150 + 19 + 200
