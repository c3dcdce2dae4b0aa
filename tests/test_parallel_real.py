"""Parallel layouts on the real torch 2.13 CPU jobs of tests/data/parallel (made by its
make_traces.py): interleaved and GPipe pipelines, a slow stage, skewed expert routing, group names
stripped, Megatron-style names, a 16-rank 3-D mesh. Expected values: each job's ground_truth.json,
written by the script from the objects it built (mesh, schedule, split sizes)."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest

from rankscope.api import analyze
from rankscope.pipelines.job import analyze_job

DATA = Path(__file__).parent / "data" / "parallel"
JOBS = sorted(p.name for p in DATA.iterdir() if (p / "ground_truth.json").is_file())


def truth(job: str) -> dict:
    return json.loads((DATA / job / "ground_truth.json").read_text())


@lru_cache(maxsize=8)
def result(job: str):
    return analyze(DATA / job, use_cache=False, engine="inprocess")


def test_all_jobs_present():
    assert set(JOBS) == {"3d-16rank", "ddp-tp2-megatron-names", "ep4-alltoall-skewed", "pp4-gpipe-slowstage1",
                         "pp4-interleaved", "tp2dp2-unnamed"}


#: Names the analysis gives where the trace names nothing (the role's name): FSDP's dimension is
#: dp_shard; roles on one group make one dimension (ep4: the gradient all_reduce shares the all_to_all's
#: world group, and the expert-parallel role names it).
INFERRED_NAME = {("tp2dp2-unnamed", "dp"): "dp_shard"}
MERGED = {"ep4-alltoall-skewed": {"dp"}}


@pytest.mark.parametrize("job", JOBS)
def test_layout_has_the_built_dimensions_and_groups(job):
    want = {INFERRED_NAME.get((job, d["name"]), d["name"]): sorted(map(sorted, d["groups"]))
            for d in truth(job)["dims"] if d["name"] not in MERGED.get(job, set())}
    got = {d.name: sorted(map(sorted, d.groups)) for d in result(job).parallelism.dims}
    assert got == want


@pytest.mark.parametrize("job", ["pp4-interleaved", "pp4-gpipe-slowstage1", "3d-16rank"])
def test_pipeline_schedule_microbatches_chunks(job):
    t = truth(job)["pipeline"]
    p = result(job).pipeline
    assert (p.schedule, p.microbatches, p.stages_per_rank) == (t["schedule"], t["microbatches"], t["stages_per_rank"])
    ranks_per_stage = len(truth(job)["dims"][0]["groups"])
    assert len(p.stages) == t["num_stages"] // t["stages_per_rank"]
    assert all(len(st.ranks) == ranks_per_stage for st in p.stages)


def test_slow_stage_named():
    t = truth("pp4-gpipe-slowstage1")["pipeline"]
    a = result("pp4-gpipe-slowstage1")
    f = next(f for f in a.findings if f.id == "pipeline_stage_imbalance")
    assert f.severity != "low" and f.ranks == [t["slow_rank"]] and a.findings[0] is f
    assert a.pipeline.bottleneck_stage == t["slow_stage"]


def test_skewed_expert_named_with_its_load():
    """ground truth: the dispatch sends rank 3's expert 260 of 512 tokens (mean 128): +103%."""
    t = truth("ep4-alltoall-skewed")
    a = result("ep4-alltoall-skewed")
    f = next(f for f in a.findings if f.id == "expert_imbalance")
    tokens = t["expert_tokens_per_rank"]
    assert f.ranks == [t["skewed_expert_rank"]]
    want = 100.0 * (max(tokens) / (sum(tokens) / len(tokens)) - 1.0)
    assert f.evidence["imbalance_pct_over_mean"] == pytest.approx(want, abs=1.0)


def test_megatron_names_give_the_dimensions_from_pg_desc():
    dims = result("ddp-tp2-megatron-names").parallelism.dims
    assert {d.name: d.source for d in dims} == {"dp": "pg_desc", "tp": "pg_desc"}


def test_unnamed_groups_are_inferred():
    dims = result("tp2dp2-unnamed").parallelism.dims
    assert all(d.source == "inferred" for d in dims)


@pytest.mark.parametrize("job", JOBS)
def test_comm_by_dim_sums_to_the_breakdown(job):
    a = analyze_job(DATA / job, use_cache=False, engine="inprocess")
    comm = {c.rank: c for c in a.cross.comm_by_dim}
    for s in a.summaries:
        want = s.breakdown_mean_ms["comm_overlapped"] + s.breakdown_mean_ms["comm_exposed"]
        got = sum(v.overlapped + v.exposed for v in comm[s.rank].by_dim.values())
        assert got == pytest.approx(want, rel=1e-6, abs=1e-5)


@pytest.mark.parametrize("job", JOBS)
def test_invariants_hold(job):
    from invariants import violations
    assert violations(result(job)) == []
