"""Figures that must not contradict each other (issue 16 A): the invariant checker (tests/invariants.py) over
every corpus trace set and generated jobs with injected faults, hand-counted cases for each figure the issue
found contradicting another, and the checker itself catching those contradictions.

Expected values: hand counts on traces written here (tests/tracebuilder.py), each stated beside the events
that give it; the definitions in docs/json-schema.md applied to the JSON's own numbers (tests/invariants.py).
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

import rankscope
from conftest import MEMORY_TIMELINE, corpus_root
from invariants import check, outputs, overlap, per_stream_sums, straggler_verdict, violations
from rankscope.render.figures import DETAILS
from rankscope.synth import demo_job_dir, generate_job, parse_injection
from tracebuilder import TraceBuilder

DLRM = "param-dlrm-8rank"


def _corpus_sets() -> list:
    """Every folder of the corpus that holds trace files (the HTA memory timeline is no trace)."""
    root = corpus_root()
    folders = sorted({p.parent for p in root.rglob("*.json.gz") if MEMORY_TIMELINE not in p.parts}) \
        if root.is_dir() else []
    if not folders:
        return [pytest.param("<corpus missing>", id="corpus-missing")]
    return [pytest.param(str(f.relative_to(root)), id=str(f.relative_to(root))) for f in folders]


def _analyze(path) -> rankscope.Analysis:
    return rankscope.analyze(path, use_cache=False, engine="inprocess")


@pytest.mark.parametrize("folder", _corpus_sets())
def test_invariants_hold_on_every_corpus_set(corpus, folder):
    assert violations(_analyze(corpus / folder)) == []


GENERATED = {
    "healthy": [],
    "straggler-host_idle": ["straggler:rank=2,cause=host_idle,delay_ms=20"],
    "straggler-dataloader": ["straggler:rank=1,cause=dataloader,delay_ms=10", "pageable_memcpy"],
    "straggler-gpu_compute": ["straggler:rank=3,cause=gpu_compute,delay_ms=5", "clock_offset:rank=1,offset_ms=3"],
    "no_overlap": ["no_overlap"],
    "launch_bound": ["launch_bound"],
    "uneven_shards-fp32": ["uneven_shards:rank=0", "fp32_gemm:rank=2"],
}


@pytest.mark.parametrize("name", list(GENERATED))
def test_invariants_hold_on_generated_jobs(tmp_path, name):
    generate_job(tmp_path, ranks=4, steps=3, seed=len(name), gzip=False, scale=0.25,
                 injections=[parse_injection(i) for i in GENERATED[name]])
    assert violations(_analyze(tmp_path)) == []


LAYOUTS = ["pp=4,schedule=1f1b,microbatches=8", "pp=4,schedule=gpipe,microbatches=4,slow_stage=2",
           "pp=2,dp=2,fsdp=1,no_prefetch=1", "pp=4,schedule=interleaved,microbatches=8,names=none",
           "dp=2,tp=2,exposed_tp=1"]


@pytest.mark.parametrize("spec", LAYOUTS)
def test_invariants_hold_on_generated_layouts(tmp_path, spec):
    """Generated parallel layouts (synth --layout): pipelines of every schedule, with pp groups of four ranks
    (send/recv paired by time), FSDP and tensor parallel."""
    from rankscope.synth.layouts import generate_layout_job
    generate_layout_job(tmp_path, spec, steps=3, seed=1, gzip=False)
    assert violations(_analyze(tmp_path)) == []


def _real_captures() -> list:
    here = Path(__file__).resolve().parent / "data"
    return [pytest.param(p, id=str(p.relative_to(here))) for p in sorted(here.glob("whatif/*/*")) +
            sorted(here.glob("parallel/*")) if (p / "ground_truth.json").is_file()]    # a job, not __pycache__


@pytest.mark.parametrize("folder", _real_captures())
def test_invariants_hold_on_real_captures(folder):
    """The committed torch captures: the before/after pairs (tests/data/whatif) and parallel layouts."""
    assert violations(_analyze(folder)) == []


# ------------------------------------------------------------------------------------------ hand counts

def _overlap_trace(tmp_path: Path, comm_start: float) -> Path:
    """One step 0..1000 µs; compute (a gemm) 100-500; a 200 µs all-reduce from `comm_start` on its own
    stream; nothing else runs on the device (the device idles 600 µs or more of the step)."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("sm80_xmma_gemm_bf16", 90, 100, 400)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", comm_start - 10, comm_start, 200, stream=20)
    return b.write(tmp_path / "rank0.json")


@pytest.mark.parametrize("comm_start, hidden_us", [(200, 200), (400, 100)])
def test_overlap_figures_agree_with_hand_count(tmp_path, comm_start, hidden_us):
    """comm 200 µs, compute 400 µs, `hidden_us` of the comm under compute (200-400: all of it; 400-600:
    400-500). Comm overlapped by compute = hidden / 200; overlap efficiency = hidden / min(400, 200): both
    1 when the comm is hidden, though the device idles most of the step (which made the old
    (compute + comm - step) / min formula 0)."""
    out = outputs(_analyze(_overlap_trace(tmp_path, comm_start)))
    rank = out.report["ranks"][0]
    assert rank["breakdown_ms"]["comm_overlapped"] == pytest.approx(hidden_us / 1000)
    assert rank["overlap_pct"] == pytest.approx(100 * hidden_us / 200)
    assert rank["overlap_efficiency"] == pytest.approx(hidden_us / 200)
    overlap_chart = {t["name"]: t["y"] for t in out.charts["chart-overlap"]["data"]}
    assert overlap_chart == {"comm overlapped by compute (HTA), %": [pytest.approx(100 * hidden_us / 200)],
                             "overlap efficiency, %": [pytest.approx(100 * hidden_us / 200)]}
    assert check(out) == []


def test_demo_straggler_hidden_comm_is_high_on_both_figures(tmp_path):
    """The demo's rank 5 (host_idle straggler) idles half its step and runs its communication under compute
    (issue 16: it showed comm overlapped 96.5% beside overlap efficiency 0.00): both figures high now."""
    out = outputs(_analyze(demo_job_dir(tmp_path)))
    rank5 = next(r for r in out.report["ranks"] if r["rank"] == 5)
    assert rank5["gpu_busy_pct"] < 60 and rank5["overlap_pct"] > 90
    assert rank5["overlap_efficiency"] > 0.9
    assert check(out) == []


def test_idle_summed_over_streams_is_labelled(tmp_path):
    """Two streams, each: a kernel that ends at 10 µs, then one at 90-100 µs launched at 80-85 µs (after the
    first ended: host wait 80 µs). Device span 1..100 µs = 0.099 ms; host wait 2 x 80 µs = 0.16 ms, a sum
    over 2 streams that exceeds the span, so it must say so everywhere."""
    b = TraceBuilder()
    b.step(1, 0, 200)
    b.kernel("gemm_a", 0, 1, 9)
    b.kernel("gemm_b", 80, 90, 10)
    b.kernel("gemm_c", 2, 3, 7, stream=20)
    b.kernel("gemm_d", 85, 90, 10, stream=20)
    out = outputs(_analyze(b.write(tmp_path / "rank0.json")))
    rank = out.report["ranks"][0]
    assert rank["hta"]["temporal"]["span_ms"] == pytest.approx(0.099)
    assert rank["idle_ms_summed_over_streams"]["host_wait"] == pytest.approx(0.16)
    assert rank["idle_streams"] == 2
    assert [s["idle_total_ms"] for s in rank["hta"]["idle"]["streams"]] == [pytest.approx(0.08)] * 2
    details = next(t for t in out.tables if any(c.header == DETAILS["host_wait"].terminal for c in t.columns))
    assert "host wait\nΣ streams" in [c.header for c in details.columns]
    assert "summed over the rank's streams" in str(details.caption)
    idle = out.charts["chart-idle-hta"]
    assert idle["layout"]["yaxis"]["title"]["text"] == "ms, summed over the rank's streams"
    assert idle["data"][0]["name"] == "host wait, summed over streams" and idle["data"][0]["customdata"] == [2]
    assert check(out) == []


def test_single_step_header_says_count_then_id(tmp_path):
    """One profiled step, ProfilerStep#6: the header says one step, number 6."""
    b = TraceBuilder()
    b.step(6, 0, 100)
    b.kernel("gemm", 10, 20, 30)
    out = outputs(_analyze(b.write(tmp_path / "rank0.json")))
    assert "steps profiled: 1 (#6)" in out.text
    assert "1 (#6; profiler_step)" in out.page


def test_dlrm_straggler_verdict_names_the_figure_it_compares(corpus):
    """param-dlrm-8rank: rank 7 arrives last most, the others wait ~6 ms/step for it, yet its cost is under
    the 5%-of-the-median-step bar. The verdict says which figure it compares, prints the bar and the other
    figures under their names, and the HTML wait chart draws the cost beside the wait."""
    out = outputs(_analyze(corpus / DLRM))
    stats = {s["rank"]: s for s in out.report["rank_stats"]}
    verdict = out.report["straggler_verdict"]
    bar = out.report["straggler_thresholds"]["min_cost_ms_per_step"]
    assert out.report["stragglers"] == [] and stats[7]["cost_ms_per_step"] < bar
    assert stats[7]["wait_imposed_ms_per_step"] > 5 * stats[7]["cost_ms_per_step"]
    assert f"costs >= {bar:.2f} ms/step; highest cost: rank 7, {stats[7]['cost_ms_per_step']:.2f} ms/step" in verdict
    assert f"the others waited {stats[7]['wait_imposed_ms_per_step']:.2f} ms/step for it, median over them" in verdict
    assert "cost = how much shorter the other ranks' steps would be" in verdict
    wait = {t["name"]: dict(zip(t["x"], t["y"])) for t in out.charts["chart-rank-wait"]["data"]}
    assert wait["cost ms/step"]["7"] == stats[7]["cost_ms_per_step"]
    assert wait["others' wait ms/step"]["7"] == stats[7]["wait_imposed_ms_per_step"]
    assert check(out) == []


# ------------------------------------------------------------------------------------ the checker catches

@pytest.fixture(scope="module")
def dlrm_outputs():
    return outputs(_analyze(corpus_root() / DLRM))


def test_checker_catches_a_zero_efficiency_beside_overlap(dlrm_outputs):
    report = copy.deepcopy(dlrm_outputs.report)
    report["ranks"][1]["overlap_efficiency"] = 0.0
    assert any("rank 1: overlap efficiency 0.0 with" in v for v in overlap(report))


def test_checker_catches_an_unlabelled_per_stream_sum(dlrm_outputs):
    out = copy.deepcopy(dlrm_outputs)
    del out.report["ranks"][0]["idle_ms_summed_over_streams"]
    out.charts["chart-idle-hta"]["layout"]["yaxis"]["title"]["text"] = "ms"
    found = per_stream_sums(out)
    assert any("rank 0: idle_ms_summed_over_streams" in v for v in found)
    assert any("chart-idle-hta" in v for v in found)


def test_checker_catches_a_verdict_that_hides_its_bar(dlrm_outputs):
    out = copy.deepcopy(dlrm_outputs)
    out.report["straggler_thresholds"]["min_cost_ms_per_step"] = 0.5      # rank 7 (0.80) now passes the bar
    found = straggler_verdict(out)
    assert any("rank 7 passes both bars but no straggler is reported" in v for v in found)
