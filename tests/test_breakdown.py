"""Step windows and the exact step breakdown (DESIGN.md "Step", "Step breakdown").

Expected values: hand counts on small traces written by the test (tracebuilder), and the corpus
checks of issue 3, each stating its independent source.
"""
from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from conftest import corpus_trace_params
from rankscope.analyses.rank.breakdown import CATEGORIES, step_breakdown
from rankscope.analyses.rank.gaps import idle_gaps
from rankscope.analyses.rank.steps import step_windows
from rankscope.ingest.kineto import read_kineto
from tracebuilder import TraceBuilder


def _gpu_step(tmp_path):
    """One step, 0..1000 µs on the CPU. Hand layout of the device (µs):
    100-300 gemm (COMP); 250-400 nccl all-reduce (COMM) -> 250-300 overlapped, 300-400 exposed;
    450-500 memcpy; 600-650 gemm launched at 590 after a cudaStreamSynchronize 520-590;
    the last kernel 990-1100 was launched at 980, inside the step, so the window ends at 1100."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 80, cat="user_annotation")
    b.op("aten::mm", 90, 20)
    b.kernel("sm80_xmma_gemm_bf16", 95, 100, 200)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 240, 250, 150, stream=20)
    b.kernel("Memcpy HtoD (Pinned -> Device)", 440, 450, 50, cat="gpu_memcpy")
    b.runtime("cudaStreamSynchronize", 520, 70)
    b.kernel("sm80_xmma_gemm_bf16", 590, 600, 50)
    b.kernel("sm80_xmma_gemm_bf16", 980, 990, 110)
    return read_kineto(b.write(tmp_path / "rank0.json"))[0]


def test_step_window_extends_to_launched_device_work(tmp_path):
    w = step_windows(_gpu_step(tmp_path))
    assert w.source == "profiler_step"
    assert w.frame.select("step", "start_ns", "cpu_end_ns", "end_ns").row(0) == (1, 0, 1_000_000, 1_100_000)


def test_breakdown_hand_counted(tmp_path):
    trace = _gpu_step(tmp_path)
    b = step_breakdown(trace)
    row = b.frame.row(0, named=True)
    # hand count (µs) over 0..1100:
    expected_us = {
        "compute": 150 + 50 + 110,          # 100-250, 600-650, 990-1100
        "comm_overlapped": 50,              # 250-300
        "comm_exposed": 100,                # 300-400
        "memcpy": 50,                       # 450-500
        "dataloader": 80,                   # 0-80
        "sync": 70,                         # 520-590 (device idle, host in cudaStreamSynchronize)
        # host ops while the device idles: aten::mm 90-100 (10); launches 240-241 are under
        # nothing? no: 240-241 is device-idle? 100-400 is busy -> 0; 440-441 (1); 590-591 (1);
        # 980-981 (1)
        "host": 10 + 1 + 1 + 1,
    }
    expected_us["idle_other"] = 1100 - sum(expected_us.values())
    assert {c: round(row[c] * 1000, 6) for c in CATEGORIES} == expected_us
    assert sum(row[c] for c in CATEGORIES) == pytest.approx(row["duration_ms"], abs=1e-9)
    # overlap efficiency: |COMP ∩ COMM| / min(|COMP|, |COMM|)
    assert b.compute_ms == pytest.approx(0.36)      # 100-300, 600-650, 990-1100 = 200+50+110
    assert b.comm_ms == pytest.approx(0.15)         # 250-400
    assert b.overlapped_ms == pytest.approx(0.05)   # 250-300
    assert b.overlap_efficiency == pytest.approx(0.05 / 0.15)


def test_gap_attribution_hand_counted(tmp_path):
    g = idle_gaps(_gpu_step(tmp_path), gap_min_us=100)
    # device idle stretches >= 100 µs inside the step: 500-600 (100, host in sync 520-590), 650-990 (340)
    # and, before the step's first kernel, 0-100 (DataLoader 0-80, aten::mm 90-100, launch 95-96); the
    # window ends with the last kernel (1100): nothing after it
    assert g.gaps == 3 and g.gap_ms == pytest.approx(0.54)
    longest = g.top[0]
    assert longest.duration_ms == pytest.approx(0.34) and longest.host_activity == "idle_other"
    assert longest.position == "between"
    assert g.top[1].host_activity == "sync" and g.top[1].next_device_op == "sm80_xmma_gemm_bf16"
    lead = g.top[2]
    assert (lead.position, lead.start_in_step_ms, lead.duration_ms) == ("before_first", 0.0, pytest.approx(0.1))
    assert lead.host_activity == "dataloader" and lead.host_ms["dataloader"] == pytest.approx(0.08)
    assert lead.host_ms["host"] == pytest.approx(0.01) and lead.next_device_op == "sm80_xmma_gemm_bf16"


def test_trace_without_steps_is_one_whole_step(tmp_path):
    b = TraceBuilder()
    b.op("aten::mm", 10, 20).kernel("gemm", 15, 40, 30)
    trace = read_kineto(b.write(tmp_path / "t.json"))[0]
    w = step_windows(trace)
    assert w.source == "whole_trace" and w.frame["duration_ns"].to_list() == [60_000]   # 10..70 µs


@pytest.mark.parametrize("rel", corpus_trace_params())
def test_parts_sum_to_step_on_every_corpus_trace(corpus, rel):
    """Issue 3: the parts sum to the step within 0.1% on every corpus trace (here: exactly, to
    float rounding of the ms conversion)."""
    trace = read_kineto(corpus / rel)[0]
    f = step_breakdown(trace).frame
    assert len(f) >= 1
    total = f.select(sum(pl.col(c) for c in CATEGORIES)).to_series()
    assert ((total - f["duration_ms"]).abs() <= 1e-6 * f["duration_ms"].abs().max()).all()
    assert (f.select(CATEGORIES).min_horizontal() >= 0).all()


def _steps_by_hand(path) -> dict[int, float]:
    """ProfilerStep#N durations from a plain json load (µs), the CPU span only."""
    with gzip.open(path) as f:
        doc = json.load(f)
    return {int(e["name"].split("#")[1]): float(e["dur"]) for e in doc["traceEvents"]
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")}


def test_step_windows_start_at_profiler_steps(corpus):
    path = next((corpus / "cpu-gloo-4rank-healthy").glob("rank0*"))
    by_hand = _steps_by_hand(path)
    w = step_windows(read_kineto(path)[0]).frame
    assert sorted(w["step"].to_list()) == sorted(by_hand)
    # CPU-only: no device work extends a step, so each window is its ProfilerStep span (clipped
    # at the next step's start)
    for step, cpu_end, start in zip(w["step"], w["cpu_end_ns"], w["start_ns"]):
        assert (cpu_end - start) / 1e3 == pytest.approx(by_hand[step], abs=1e-3)


def _means(path) -> dict[str, float]:
    return step_breakdown(read_kineto(path)[0]).mean_ms()


def test_serial_comm_is_all_exposed(corpus):
    """Issue 3 check: in cpu-gloo-4rank-serial_comm (gradients all-reduced one by one after
    backward, no DDP) communication is exposed: nothing overlaps."""
    for path in sorted((corpus / "cpu-gloo-4rank-serial_comm").glob("*.json.gz")):
        m = _means(path)
        assert m["comm_overlapped"] == 0.0 and m["comm_exposed"] > 50


def test_healthy_ddp_overlaps_some_comm(corpus):
    """cpu-gloo-4rank-healthy (DDP, bucket_cap_mb=1): buckets are reduced while backward still
    runs on every rank, unlike serial_comm. The MLP's backward is short (~1 ms/step), so the
    overlapped part is small in absolute terms; it is > 0 on every rank."""
    for path in sorted((corpus / "cpu-gloo-4rank-healthy").glob("*.json.gz")):
        assert _means(path)["comm_overlapped"] > 0.2


def test_dataloader_share_workers0_vs_workers4(corpus):
    """Seed study: with num_workers=0 the step waits for the DataLoader; with 4 workers not."""
    w0 = _means(next((corpus / "kineto-resnet50-workers0").glob("*.json.gz")))
    w4 = _means(next((corpus / "kineto-resnet50-workers4").glob("*.json.gz")))
    step0, step4 = sum(w0.values()), sum(w4.values())
    assert w0["dataloader"] / step0 > 0.25 and w4["dataloader"] / step4 < 0.02
    idle = ("dataloader", "sync", "host", "idle_other")
    # GPU idle per step: 77.0 ms vs 38.7 ms on these traces (measured; the check is "much larger")
    assert sum(w0[c] for c in idle) > 1.5 * sum(w4[c] for c in idle)
