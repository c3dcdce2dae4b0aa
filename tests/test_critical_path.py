"""Cross-rank critical path and what-if (issue 19).

Expected answers from outside the analysis: the corpus MANIFEST (rank 2 of cpu-gloo-4rank-straggler
sleeps 40 ms per step between forward and backward; stage 2 of cpu-gloo-pp4-slowstage2 holds 3x the
layers), the synthetic generator's fault-free twin (the same random draws without the fault: its
measured step is what a perfect what-if predicts), and the measured steps themselves (a re-timing
with no change must give them back).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from conftest import corpus_root
from rankscope.analyses.job.critical_path import _Rank, _links, _retime
from rankscope.api import analyze
from rankscope.synth import generate_job, parse_injection

STRAGGLER, HEALTHY, SLOW_STAGE = "cpu-gloo-4rank-straggler", "cpu-gloo-4rank-healthy", "cpu-gloo-pp4-slowstage2"
INJECTED_SLEEP_MS = 40.0


@lru_cache(maxsize=8)
def _analysis(folder: str):
    return analyze(corpus_root() / folder, use_cache=False, engine="inprocess")


def test_straggler_path_is_its_host_idle_and_the_what_if_recovers_it(corpus):
    cp = _analysis(STRAGGLER).critical_path
    top = cp.by_rank_category[0]
    assert (top.rank, top.category) == (2, "host_idle")
    assert top.ms_per_step >= 0.9 * INJECTED_SLEEP_MS
    assert cp.owner == 2
    w = next(w for w in cp.what_if if w.rank == 2 and "host_idle" in w.change)
    assert w.step_ms_saved >= 0.5 * top.ms_per_step


def test_healthy_job_has_no_single_rank_owner(corpus):
    assert _analysis(HEALTHY).critical_path.owner is None


def test_slow_pipeline_stage_dominates_the_path(corpus):
    cp = _analysis(SLOW_STAGE).critical_path
    per_rank = {}
    for x in cp.by_rank_category:
        per_rank[x.rank] = per_rank.get(x.rank, 0.0) + x.ms_per_step
    assert max(per_rank, key=per_rank.get) == 2
    work = [x for x in cp.by_rank_category if not x.category.startswith("comm")]
    assert (work[0].rank, work[0].category) == (2, "compute")


MULTI_RANK = ["cpu-gloo-4rank-straggler", "cpu-gloo-4rank-healthy", "cpu-gloo-4rank-loader0", "cpu-gloo-fsdp4",
              "cpu-gloo-tp2dp2", "cpu-gloo-pp4-1f1b", "cpu-gloo-pp4-slowstage2", "cpu-gloo-3d-pp2dp2tp2",
              "param-dlrm-8rank", "hta-sampled-2rank"]


@pytest.mark.parametrize("folder", MULTI_RANK)
def test_segments_cover_every_step(corpus, folder):
    cp = _analysis(folder).critical_path
    assert cp is not None and cp.steps
    for p in cp.steps:
        covered = sum(s.dur_ms for s in p.segments)
        assert covered == pytest.approx(p.duration_ms, rel=0.02)
        ends = [s.start_ms + s.dur_ms for s in p.segments]
        assert all(b >= a - 1e-6 for a, b in zip(ends, ends[1:]))


@pytest.mark.parametrize("folder", ["cpu-gloo-4rank-straggler", "cpu-gloo-tp2dp2", "param-dlrm-8rank"])
def test_retiming_without_change_gives_the_measured_steps(corpus, folder):
    """The re-timed graph with nothing changed reproduces each step as measured (the longest rank's
    step, end - start) within 1%: the model of dependencies holds the data."""
    from rankscope.analyses.rank.collectives import rank_collectives
    from rankscope.ingest.kineto import read_kineto
    from rankscope.analyses.job.reduce import reduce_job
    ranks = [rank_collectives(read_kineto(f)[0]) for f in sorted((corpus_root() / folder).glob("*.json.gz"))]
    table = reduce_job(ranks).table
    rk = {rc.rank: _Rank(rc, int(table.offsets_ns.get(rc.rank, 0))) for rc in ranks}
    links = _links(table, rk)
    steps = sorted(set.intersection(*(set(r.steps) for r in rk.values())))
    for s in steps:
        measured = max(r.steps[s][1] - r.steps[s][0] for r in rk.values())
        assert _retime(s, rk, links, {}) == pytest.approx(measured, rel=0.01)


@pytest.mark.parametrize("folder", ["cpu-gloo-4rank-straggler", "cpu-gloo-pp4-1f1b", "cpu-gloo-3d-pp2dp2tp2",
                                    "param-dlrm-8rank"])
def test_c_retiming_is_the_python_retiming(corpus, folder):
    """The C pass (built at install) re-times every step exactly as the Python loop, the reference:
    with nothing changed, with random scales per rank and category, and with each dimension's
    communication free (pipeline sends and recvs, tensor- and data-parallel collectives)."""
    import numpy as np
    from rankscope.analyses.job import critical_path
    from rankscope.analyses.job.critical_path import _StepPlan
    from rankscope.analyses.rank.collectives import rank_collectives
    from rankscope.analyses.job.reduce import reduce_job
    from rankscope.ingest.kineto import read_kineto
    if critical_path._c_retime is None:
        pytest.skip("built without a C compiler: only the Python re-timing exists")
    ranks = [rank_collectives(read_kineto(f)[0]) for f in sorted((corpus_root() / folder).glob("*.json.gz"))]
    table = reduce_job(ranks).table
    rk = {rc.rank: _Rank(rc, int(table.offsets_ns.get(rc.rank, 0))) for rc in ranks}
    links = _links(table, rk)
    dims = [frozenset()] + [frozenset({d}) for r in rk.values() for d in set(r.dim) if d]
    rng = np.random.default_rng(0)
    checked = 0
    for s in sorted(set.intersection(*(set(r.steps) for r in rk.values()))):
        plan = _StepPlan(s, rk, links)
        for mult in (plan.scales({}), rng.uniform(0.0, 2.0, size=plan.scales({}).shape)):
            for free in dims:
                assert plan.retime(mult, free) == plan.retime(mult, free, use_c=False)
                checked += 1
    assert checked >= 4


@pytest.mark.parametrize("cause", ["host_idle", "dataloader", "gpu_compute"])
def test_what_if_predicts_the_fault_free_twin(tmp_path, cause):
    """synthetic job, rank 3 slowed by 30 ms per step; the twin is the same job without the fault: the
    what-if of the straggler's cause at the median rank's level predicts the twin's step."""
    generate_job(tmp_path / "f", ranks=8, steps=4, seed=3,
                 injections=[parse_injection(f"straggler:rank=3,cause={cause},delay_ms=30")])
    generate_job(tmp_path / "t", ranks=8, steps=4, seed=3, injections=[])
    faulty = analyze(tmp_path / "f", use_cache=False, engine="inprocess").critical_path
    twin = analyze(tmp_path / "t", use_cache=False, engine="inprocess").critical_path
    w = next(w for w in faulty.what_if if w.key == f"rank:3:{cause}")
    assert faulty.measured_step_ms - w.step_ms_saved == pytest.approx(twin.measured_step_ms, rel=0.10)


def test_json_and_terminal_carry_the_path(corpus):
    from conftest import report_json
    d = report_json(_analysis(STRAGGLER))["critical_path"]
    assert {"steps", "by_rank_category", "what_if", "swimlanes"} <= set(d)
    seg = d["steps"][0]["segments"][0]
    assert set(seg) == {"rank", "category", "name", "start_ms", "dur_ms"}
    assert [s["label"] for s in d["swimlanes"]] == ["slowest step", "median step"]


def test_perfetto_export_has_a_critical_path_track(corpus, tmp_path):
    """Every path segment on a rank is a slice of its `critical path` track, same duration."""
    import json
    from rankscope.analyses.job.critical_path import path_slices
    from rankscope.pipelines.export import export_perfetto
    out = tmp_path / "job.json"
    export_perfetto(corpus_root() / STRAGGLER, out, use_cache=False)
    doc = json.loads(out.read_text())
    tracks = {(e["pid"], e["tid"]) for e in doc["traceEvents"]
              if e.get("name") == "thread_name" and "critical path" in e["args"]["name"]}
    cp = _analysis(STRAGGLER).critical_path
    for rank in (0, 2):
        got = sorted(round(e["dur"]) for e in doc["traceEvents"] if e.get("ph") == "X" and (e["pid"], e["tid"]) in tracks
                     and e["pid"] == rank)
        want = sorted(round(d / 1000) for _, d, _, _, _ in path_slices(cp, rank))
        assert got == want and got


WHATIF = Path(__file__).resolve().parent / "data" / "whatif"


@pytest.mark.parametrize("pair, key", [("sleep", "rank:1:host_idle"), ("dataloader", "every:dataloader"),
                                       ("slow-stage", "pp:balanced"), ("bucketed", "overlap:dp")])
def test_what_if_predicts_the_measured_job_without_the_fault(pair, key):
    """Real torch CPU jobs made twice (tests/data/whatif/make_pairs.py: with the fault it injected and
    without): the what-if that undoes the fault, computed on `before`, is the step `after` measured
    (the longest rank's step, mean) within 15% of the saving; a finding names that what-if with its number."""
    before = analyze(WHATIF / pair / "before", use_cache=False, engine="inprocess")
    after = analyze(WHATIF / pair / "after", use_cache=False, engine="inprocess").critical_path
    cp = before.critical_path
    w = next(w for w in cp.what_if if w.key == key)
    measured = cp.measured_step_ms - after.measured_step_ms
    assert w.step_ms_saved == pytest.approx(measured, rel=0.15)
    assert any(f.evidence.get("what_if_key") == key and f.evidence["step_ms_saved"] == w.step_ms_saved
               for f in before.findings)


def test_more_microbatches_saves_between_nothing_and_the_theory():
    """GPipe, 2 stages, 4 microbatches (tests/data/whatif/microbatches): doubling them saves at most what
    (p-1)/(m+p-1) says, never a loss, and the job run with 8 did get faster."""
    before = analyze(WHATIF / "microbatches" / "before", use_cache=False, engine="inprocess").critical_path
    after = analyze(WHATIF / "microbatches" / "after", use_cache=False, engine="inprocess").critical_path
    w = next(w for w in before.what_if if w.key == "pp:microbatches:8")
    assert 0.0 < w.step_ms_saved <= w.theory_step_ms_saved
    assert after.measured_step_ms < before.measured_step_ms
