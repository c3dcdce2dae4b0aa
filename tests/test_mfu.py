"""MFU / HFU and communication efficiency (issue 8 item 4; seed 003).

Independent sources: the closed-form FLOPs of Narayanan et al. 2021 (eq. 3) and Korthikanti et al.
2022 for GPT-3 175B, computed here with exact fractions; datasheet peak FLOPs typed here; device
names read from the corpus files with plain json / sqlite3; FLOPs of the traced GEMMs and of
injected `flops` args summed by hand from the JSON. Step times are rankscope's step windows
(DESIGN.md "Step", tested in test_breakdown / test_api) and are taken from the analysis.
"""
from __future__ import annotations

import json
import sqlite3
from fractions import Fraction
from pathlib import Path

import pytest

from conftest import DLRM, assert_no_traceback, corpus_files, fresh_json, load_json, run_cli, write_trace
from rankscope.analyses.job.mfu import from_summary, given_flops, mfu_report, recompute_factor, transformer_flops
from rankscope.analyses.rank.flops import rank_flops
from rankscope.pipelines.job import analyze_job
from rankscope.hardware import device_model, peak_tflops
from rankscope.ingest import read_trace

GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


# ---- model FLOPs ----------------------------------------------------------------------------
GPT3 = dict(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048, batch=1536)   # Narayanan et al. Table 1


def test_transformer_flops_gpt3_175b_against_megatron_closed_form():
    l, h, V, s, B = (Fraction(GPT3[k]) for k in ("layers", "hidden", "vocab", "seq", "batch"))
    model = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))          # eq. 3, no recompute
    full = 96 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (16 * l * h))           # full recompute
    selective = model + 4 * B * s ** 2 * h * l                                      # attention core again
    for recompute, expected in (("none", model), ("full", full), ("selective", selective)):
        got = transformer_flops(**GPT3, recompute=recompute)
        assert got.model_flops_per_step == pytest.approx(float(model), rel=1e-12)
        assert got.hardware_flops_per_step == pytest.approx(float(expected), rel=1e-12), recompute
    got = transformer_flops(**GPT3)
    assert got.params == pytest.approx(175e9, rel=0.01)          # "GPT-3 175B"
    assert got.tokens == 1536 * 2048
    # PaLM appendix B per token: 6N + 12·L·H·Q·T (H·Q = hidden, T = seq)
    assert got.model_flops_per_step / got.tokens == pytest.approx(6 * got.params + 12 * 96 * 12288 * 2048, rel=1e-12)
    # the paper's eq. 4 estimate with full recompute: 8·P FLOPs per token (P = 175e9), a few % below eq. 3
    full_per_token = transformer_flops(**GPT3, recompute="full").hardware_flops_per_step / got.tokens
    assert full_per_token == pytest.approx(8 * 175e9, rel=0.05)


def test_given_flops_and_bad_dims():
    assert recompute_factor(given_flops(3e15, "full")) == pytest.approx(8 / 6)
    assert recompute_factor(given_flops(3e15)) == 1.0
    with pytest.raises(ValueError, match="selective"):
        given_flops(3e15, "selective")
    with pytest.raises(ValueError, match="multiple of heads"):
        transformer_flops(layers=2, hidden=100, heads=3, vocab=10, seq=8, batch=1)


# ---- peak table -----------------------------------------------------------------------------
def _device(corpus: Path, folder: str) -> dict:
    doc = load_json(sorted((corpus / folder).glob("*.json.gz"))[0])
    return doc["deviceProperties"][0]


@pytest.mark.parametrize("folder, name, dtype, tflops", [
    ("hta-negative-queue", "NVIDIA A100-SXM4-80GB", "bf16", 312.0),       # A100 datasheet
    ("hta-negative-queue", "NVIDIA A100-SXM4-80GB", "fp32", 19.5),
    ("tracelens-mi300-resnet-rank0", "AMD Instinct MI300X", "bf16", 1307.4),   # MI300X datasheet, dense
    ("kineto-resnet50-workers0", "Tesla V100-DGXS-32GB", "fp16", 125.0),  # V100 SXM2 / DGX Station
    (DLRM, "Tesla V100-SXM2-32GB", "fp32", 15.7),
    ("tracelens-b200-rank0", "NVIDIA B200", "bf16", 2250.0),              # 4.5 PF sparse / 2
    ("hta-amd-mi250", "AMD Radeon Graphics", "bf16", 181.05),             # one MI250 GCD (104 CUs): 362.1 / 2
])
def test_peak_from_corpus_device_names(corpus: Path, folder: str, name: str, dtype: str, tflops: float):
    props = _device(corpus, folder)
    assert props["name"] == name
    assert peak_tflops(device_model(props["name"], props), dtype) == tflops


def test_peak_from_nsys_target_info(corpus: Path):
    con = sqlite3.connect(f"{(corpus / 'nsys-sqlite-h100' / 'report1.sqlite').resolve().as_uri()}?mode=ro&immutable=1",
                          uri=True)
    (name,), = con.execute("SELECT DISTINCT name FROM TARGET_INFO_GPU").fetchall()
    con.close()
    assert name == "NVIDIA H100 80GB HBM3"                                 # the SXM part
    assert peak_tflops(device_model(name), "bf16") == 989.5                # 1,979 sparse / 2
    assert peak_tflops(device_model(name), "fp8") == 1979.0


@pytest.mark.parametrize("name, dtype, tflops", [
    ("NVIDIA H100 PCIe", "bf16", 756.5), ("NVIDIA H100 NVL", "bf16", 835.5), ("NVIDIA H200", "bf16", 989.5),
    ("Tesla V100-PCIE-32GB", "fp32", 14.0), ("AMD Instinct MI250X", "bf16", 191.5),
    ("Tesla V100-SXM2-32GB", "bf16", None), ("NVIDIA GeForce RTX 4090", "bf16", None),
])
def test_peak_variants_and_unknowns(name: str, dtype: str, tflops: float | None):
    assert peak_tflops(device_model(name), dtype) == tflops


# ---- FLOPs from traces ----------------------------------------------------------------------
def _gemm_flops(e: dict) -> int:
    """torch with_flops formulas, by hand: mm/addmm 2·M·K·N, bmm/baddbmm 2·b·M·K·N."""
    dims = e["args"]["Input Dims"]
    a, b = (dims[0], dims[1]) if e["name"] in ("aten::mm", "aten::bmm") else (dims[1], dims[2])
    return 2 * a[0] * a[1] * b[1] if len(a) == 2 else 2 * a[0] * a[1] * a[2] * b[2]


def _steps(doc: dict) -> list[tuple[int, float]]:
    marks = {e["name"]: e["ts"] for e in doc["traceEvents"]
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")}
    return sorted((int(n.split("#")[1]), ts) for n, ts in marks.items())


def _per_step(doc: dict, value) -> dict[int, float]:
    """Sum of value(e) over cpu ops, by the step whose start is the last at or before the op."""
    steps = _steps(doc)
    out = {n: 0.0 for n, _ in steps}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and value(e):
            inside = [n for n, ts in steps if ts <= e["ts"]]
            if inside:
                out[inside[-1]] += value(e)
    return out


def test_gemm_flops_per_step_from_shapes(corpus: Path):
    path = corpus / "hta-negative-queue" / "rank0.json.gz"
    doc = load_json(path)
    expected = _per_step(doc, lambda e: _gemm_flops(e) if e["name"] in GEMMS else 0)
    got = rank_flops(read_trace(path)[0])
    assert got.source == "gemm_shapes" and got.dtype == "fp32"       # Input type "float"
    assert dict(zip(got.steps, got.flops)) == expected
    assert got.ops == sum(1 for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e.get("name") in GEMMS)
    assert got.device == "NVIDIA A100-SXM4-80GB"
    # the per-rank map keeps the same figures in the summary (what `rankscope mfu` reads)
    (summary,) = analyze_job(path, use_cache=False).summaries
    kept = from_summary(summary, traced=True)
    assert (kept.source, dict(zip(kept.steps, kept.flops)), kept.ops) == ("gemm_shapes", expected, got.ops)


def test_mfu_from_flops_args_against_hand_sum(corpus: Path, tmp_path: Path):
    """No corpus trace was taken with with_flops=True: the DLRM rank-0 trace gets `flops` args on its
    CPU ops (distinct values), as with_flops would write them; MFU must use those, not the shapes."""
    source = corpus_files(corpus, DLRM)[0]
    doc = fresh_json(source)
    for i, e in enumerate(doc["traceEvents"]):
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            e.setdefault("args", {})["flops"] = 1_000_003 * (i % 97 + 1)
    path = write_trace(tmp_path / source.name, doc)
    expected = _per_step(doc, lambda e: e["args"].get("flops", 0))
    (hand,) = expected.values()
    ranks = [rank_flops(read_trace(path)[0])]
    assert ranks[0].source == "flops_args" and ranks[0].flops == [hand]
    step_ms = ranks[0].step_ms[0]
    assert step_ms == pytest.approx(doc_step_ms(doc))
    report = mfu_report(ranks, world_size=8)
    peak = 15.7e12                           # V100 SXM2 FP32 (inputs are "float")
    assert report.dtype == "fp32" and report.source == "flops_args"
    assert report.mfu_pct == pytest.approx(100 * hand / (peak * step_ms / 1e3), rel=1e-9)
    full = mfu_report(ranks, world_size=8, recompute="full")    # traced FLOPs include recomputation: HFU
    assert full.hfu_pct == pytest.approx(report.mfu_pct, rel=1e-9)
    assert full.mfu_pct == pytest.approx(report.mfu_pct * 6 / 8, rel=1e-9)


def doc_step_ms(doc: dict) -> float:
    """This trace's single step: its ProfilerStep span (no device activity outlives it), in ms."""
    (e,) = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name")).startswith("ProfilerStep#")]
    return e["dur"] / 1e3


def test_model_mfu_and_comm_efficiency_dlrm(corpus: Path, dlrm_dir: Path):
    result = analyze_job(dlrm_dir, use_cache=False, engine="inprocess")
    flops = 8 * 1e12                         # 1 TFLOP per GPU per step
    ranks = [from_summary(s) for s in result.summaries]
    by_type = result.cross.collectives.by_type
    report = mfu_report(ranks, result.job.world_size, given_flops(flops), dtype="fp32", collectives_by_type=by_type)
    for row, s in zip(report.ranks, result.summaries):
        step_s = s.steps[0].duration_ms / 1e3
        assert row.mfu_pct == pytest.approx(100 * 1e12 / (15.7e12 * step_s), rel=1e-9)
    assert report.mfu_pct == pytest.approx(sum(r.achieved_tflops for r in report.ranks) / (8 * 15.7) * 100, rel=1e-9)
    assert {c.type for c in report.comm} == {r.type for r in by_type if r.group_size >= 2}
    for c in report.comm:                    # V100 NVLink 2.0: 150 GB/s per direction per GPU
        assert c.link_peak_gbps == 150.0
        assert c.efficiency_pct == pytest.approx(100 * c.busbw_gbps / 150.0)


# ---- command line ---------------------------------------------------------------------------
def test_cli_mfu_json_on_traces(corpus: Path, tmp_path: Path):
    proc = run_cli(["mfu", corpus / DLRM, "--json", "--cache-dir", tmp_path / "cache"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["schema"] == "rankscope.mfu/1"
    assert out["source"] == "gemm_shapes" and out["dtype"] == "fp32" and out["world_size"] == 8
    hand = sum(_gemm_flops(e) for e in load_json(corpus_files(corpus, DLRM)[0])["traceEvents"]
               if e.get("cat") == "cpu_op" and e.get("name") in GEMMS)
    rank0 = out["ranks"][0]
    assert rank0["model_tflop_per_step"] == pytest.approx(hand / 1e12)
    assert rank0["mfu_pct"] == pytest.approx(100 * hand / (15.7e12 * rank0["step_ms"] / 1e3))
    assert [c["type"] for c in out["comm_efficiency"]] == ["all_reduce", "all_to_all"]


def test_cli_mfu_transformer_dims_on_nsys(corpus: Path, tmp_path: Path):
    report = corpus / "nsys-sqlite-h100" / "report1.sqlite"
    dims = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--vocab", "32000", "--seq", "4096", "--batch", "1"]
    proc = run_cli(["mfu", report, *dims, "--recompute", "full", "--json", "--cache-dir", tmp_path / "c"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    (rank,) = out["ranks"]
    model = transformer_flops(32, 4096, 32, 32000, 4096, 1)       # checked against eq. 3 above
    assert rank["device_model"] == "H100" and out["dtype_source"] == "default" and out["dtype"] == "bf16"
    assert out["mfu_pct"] == pytest.approx(100 * model.model_flops_per_step / (989.5e12 * rank["step_ms"] / 1e3))
    assert out["hfu_pct"] == pytest.approx(out["mfu_pct"] * recompute_factor(
        transformer_flops(32, 4096, 32, 32000, 4096, 1, "full")))


@pytest.mark.parametrize("args, words", [
    (["--layers", "2"], "give all of"),
    (["--recompute", "selective"], "selective recompute needs"),
    (["--model-flops-per-step", "1e15", "--layers", "2", "--hidden", "8", "--heads", "2", "--vocab", "4",
      "--seq", "4", "--batch", "1"], "give all of"),
])
def test_cli_mfu_bad_arguments(corpus: Path, tmp_path: Path, args: list, words: str):
    proc = run_cli(["mfu", corpus / "nsys-sqlite-h100", *args], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2 and words in proc.stderr
