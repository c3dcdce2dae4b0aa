"""Parallel layouts (issue 15): dimensions and exact groups, collectives matched within their group,
communication per dimension, the pipeline, the layout findings.

Expected answers come from outside the analysis: each trace's own `distributedInfo.pg_config` read
with plain json (the groups torch created), the corpus MANIFEST (how each job was built: FSDP2 over
4 ranks, a 4-stage 1F1B pipeline with 8 microbatches, stage 2 with 3x the layers, a 2 x 2 x 2 mesh
with GPipe and 4 microbatches), and hand-built process-group tables for the name rules.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from conftest import corpus_root, load_json
from rankscope.analyses.job.layout import comm_by_dim, parallel_layout
from rankscope.analyses.job.reduce import reduce_job
from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.analyses.rank.collectives import rank_collectives
from rankscope.analyses.rank.groups import Group, assign_unnamed, dim_of_desc, rank_groups, role_dim
from rankscope.api import analyze
from rankscope.pipelines.job import analyze_job
from rankscope.ingest.kineto import read_kineto

FSDP4, TP2DP2, PP4, PP4_SLOW, THREE_D = ("cpu-gloo-fsdp4", "cpu-gloo-tp2dp2", "cpu-gloo-pp4-1f1b",
                                         "cpu-gloo-pp4-slowstage2", "cpu-gloo-3d-pp2dp2tp2")
PARALLEL_SETS = (FSDP4, TP2DP2, PP4, PP4_SLOW, THREE_D)


@lru_cache(maxsize=8)
def _collectives(folder: str) -> tuple:
    return tuple(rank_collectives(read_kineto(f)[0]) for f in sorted((corpus_root() / folder).glob("*.json.gz")))


@lru_cache(maxsize=8)
def _analysis(folder: str):
    return analyze(corpus_root() / folder, use_cache=False, engine="inprocess")


def _mesh_groups(folder: str) -> dict[str, set[tuple[int, ...]]]:
    """dim -> groups, from every rank's pg_config read with plain json (`mesh_<dim>` descriptions)."""
    out: dict[str, set[tuple[int, ...]]] = {}
    for f in sorted((corpus_root() / folder).glob("*.json.gz")):
        for pg in load_json(f)["distributedInfo"]["pg_config"]:
            if pg["pg_desc"].startswith("mesh_"):
                out.setdefault(pg["pg_desc"][len("mesh_"):], set()).add(tuple(sorted(pg["ranks"])))
    return out


# ---------------------------------------------------------------------------------------- layout
@pytest.mark.parametrize("folder", [TP2DP2, THREE_D])
def test_named_layout_has_the_exact_groups_of_pg_config(corpus, folder):
    truth = _mesh_groups(folder)
    assert truth, "the trace names its mesh groups"
    layout = parallel_layout(_collectives(folder))
    got = {d.name: {tuple(g) for g in d.groups} for d in layout.dims}
    assert got == truth
    assert all(d.source == "pg_desc" for d in layout.dims)
    # outer to inner, as the mesh was built (MANIFEST: ("pp", "dp", "tp") and ("dp", "tp"))
    assert [d.name for d in layout.dims] == (["pp", "dp", "tp"] if folder == THREE_D else ["dp", "tp"])


@pytest.mark.parametrize("folder, text", [(FSDP4, "dp_shard 4"), (PP4, "pp 4"), (PP4_SLOW, "pp 4")])
def test_unnamed_layout_is_inferred_from_the_collectives(corpus, folder, text):
    """MANIFEST: fully_shard over all 4 ranks (all_gather / reduce_scatter), and a 4-stage pipeline
    (send/recv between neighbours); their traces name only the default group."""
    layout = parallel_layout(_collectives(folder))
    assert layout.layout == text
    assert [d.groups for d in layout.dims] == [[[0, 1, 2, 3]]]
    assert [d.source for d in layout.dims] == ["inferred"]


def test_healthy_ddp_job_is_one_data_parallel_dimension(corpus):
    layout = parallel_layout(_collectives("cpu-gloo-4rank-healthy"))
    assert layout.layout == "dp 4"


@pytest.mark.parametrize("folder", [TP2DP2, THREE_D])
def test_collectives_match_only_inside_their_group(corpus, folder):
    """Every matched collective's members are all members of one group of its dimension, and
    complete (every member of that group present)."""
    ranks = _collectives(folder)
    cross, table = reduce_job(ranks)
    groups = {d.name: [set(g) for g in d.groups] for d in cross.layout.dims}
    dim_of = {(rc.rank, i): d for rc in ranks for i, d in enumerate(rc.dim)}
    members = table.members.group_by("cid").agg("rank", "idx")
    assert members.height > 0
    for cid, rs, idx in members.iter_rows():
        dims = {dim_of[(r, i)] for r, i in zip(rs, idx)}
        assert len(dims) == 1, (cid, dims)
        assert set(rs) in groups[dims.pop()], (cid, rs)
    assert table.collectives["complete"].all()


def test_gloo_reduce_scatter_is_typed_by_its_issuing_op(corpus):
    """gloo runs reduce_scatter as an all_reduce (its span is `gloo:all_reduce`); the c10d op that issued it
    says reduce_scatter. Hand count from the raw trace: c10d::_reduce_scatter_base_ ops on rank 0."""
    f = sorted((corpus_root() / FSDP4).glob("*.json.gz"))[0]
    n_rs = sum(1 for e in load_json(f)["traceEvents"] if e.get("name") == "c10d::_reduce_scatter_base_")
    rc = _collectives(FSDP4)[0]
    assert rc.type.count("reduce_scatter") == n_rs > 0
    assert "all_reduce" not in rc.type


# ------------------------------------------------------------------------- communication per dim
@pytest.mark.parametrize("folder", PARALLEL_SETS + ("cpu-gloo-4rank-straggler",))
def test_comm_by_dim_sums_to_the_breakdown(corpus, folder):
    ranks = _collectives(folder)
    for c, rc in zip(comm_by_dim(ranks), sorted(ranks, key=lambda r: r.rank)):
        bd = np.asarray(rc.step_breakdown_ns, dtype=np.int64).reshape(-1, len(CATEGORIES))
        n = max(len(bd), 1)
        want = (bd[:, CATEGORIES.index("comm_overlapped")].sum() + bd[:, CATEGORIES.index("comm_exposed")].sum()) / 1e6 / n
        got = sum(v.overlapped + v.exposed for v in c.by_dim.values())
        assert got == pytest.approx(want, rel=1e-6, abs=1e-5), c.rank


def test_json_comm_by_dim_sums_to_the_json_breakdown(corpus):
    from conftest import report_json
    d = report_json(_analysis(THREE_D))
    assert d["parallelism"]["layout"] == "pp 2 x dp 2 x tp 2"
    for r in d["ranks"]:
        total = sum(v["overlapped"] + v["exposed"] for v in r["comm_by_dim_ms"].values())
        assert total == pytest.approx(r["breakdown_ms"]["comm_overlapped"] + r["breakdown_ms"]["comm_exposed"],
                                      abs=2e-3)


# ------------------------------------------------------------------------------------- pipeline
@pytest.mark.parametrize("folder, schedule, microbatches, stages", [
    (PP4, "1f1b", 8, 4), (PP4_SLOW, "1f1b", 8, 4), (THREE_D, "gpipe", 4, 2)])
def test_pipeline_schedule_and_microbatches(corpus, folder, schedule, microbatches, stages):
    """MANIFEST: Schedule1F1B with 8 microbatches over 4 stages; ScheduleGPipe with 4 over mesh_pp (2)."""
    p = reduce_job(_collectives(folder)).result.pipeline
    assert (p.schedule, p.microbatches, len(p.stages)) == (schedule, microbatches, stages)
    assert p.bubble_pct_theory == pytest.approx(100.0 * (stages - 1) / (microbatches + stages - 1), abs=0.01)


def test_pipeline_stages_of_the_3d_job_are_the_pp_group_positions(corpus):
    truth = _mesh_groups(THREE_D)["pp"]
    p = reduce_job(_collectives(THREE_D)).result.pipeline
    assert [st.ranks for st in p.stages] == [sorted(g[s] for g in truth) for s in range(2)]


def test_slow_stage_is_named_pipeline_stage_imbalance(corpus):
    """MANIFEST: stage 2 (rank 2) holds 6 blocks instead of 2."""
    a = _analysis(PP4_SLOW)
    assert a.pipeline.bottleneck_stage == 2
    # the most urgent finding, with what balancing saves (severity by that cost)
    top = a.findings[0]
    assert top.id == "pipeline_stage_imbalance" and top.severity != "low" and top.evidence["step_ms_saved"] > 0
    assert top.ranks == [2]
    assert "stage 2" in top.summary and "to stage" in top.fix
    # never an unknown straggler, and the bubble is not called exposed communication
    assert not any(s.cause == "unknown" for s in a.stragglers)
    assert "exposed_communication" not in {f.id for f in a.findings}


def test_balanced_pipeline_gets_no_high_stage_finding(corpus):
    a = _analysis(PP4)
    assert not [f for f in a.findings if f.id == "pipeline_stage_imbalance" and f.severity == "high"]
    assert "exposed_communication" not in {f.id for f in a.findings}


def test_sharded_job_reports_exposed_gathers(corpus):
    """fsdp4: every rank's all_gathers are in the dp_shard dimension; the finding's evidence is that
    dimension's exposed all_gather time (cross-checked against comm_by_dim)."""
    a = analyze_job(corpus_root() / FSDP4, use_cache=False, engine="inprocess")
    f = next(f for f in a.findings if f.id == "fsdp_exposed_gather")
    comm = {c.rank: c for c in a.cross.comm_by_dim}
    for r, ms in f.evidence["exposed_all_gather_ms_per_step"].items():
        assert ms == pytest.approx(comm[int(r)].by_dim_type["dp_shard"]["all_gather"].exposed, abs=1e-3)


# ---------------------------------------------------------------------------------- name rules
@pytest.mark.parametrize("desc, dim", [
    ("mesh_tp", "tp"), ("mesh_dp_shard", "dp_shard"), ("mesh_dp_replicate", "dp_replicate"), ("mesh_pp", "pp"),
    ("mesh_cp", "cp"), ("mesh_ep", "ep"), ("TENSOR_MODEL_PARALLEL_GROUP", "tp"),
    ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"), ("DATA_PARALLEL_GROUP", "dp"), ("CONTEXT_PARALLEL_GROUP", "cp"),
    ("EXPERT_MODEL_PARALLEL_GROUP", "ep"), ("undefined", None), ("default_pg", None), ("my_group", None),
    # flattened meshes name several dimensions at once: none of them
    ("mesh_dp_shard_cp", None), ("mesh_dp_cp", None), ("DATA_PARALLEL_GROUP_WITH_CP", None)])
def test_dimension_names(desc, dim):
    assert dim_of_desc(desc) == dim


def test_roles():
    assert [role_dim(t, False) for t in ("send", "recv", "all_to_all", "all_gather", "reduce_scatter", "all_reduce",
                                         "send_recv", "broadcast")] == \
        ["pp", "pp", "ep", "dp_shard", "dp_shard", "dp", None, None]
    assert role_dim("all_reduce", True) == "tp"


def test_unnamed_groups_go_to_roles_by_locality():
    """A 2 x 2 mesh with its names stripped, seen from rank 0: [0, 1] is contiguous (tp, innermost),
    [0, 2] strided (the sharded dimension)."""
    cfg = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
           {"pg_name": "1", "pg_desc": "undefined", "ranks": [0, 2]},
           {"pg_name": "3", "pg_desc": "undefined", "ranks": [0, 1]}]
    groups = rank_groups(cfg, 0, 4)
    got = assign_unnamed({"tp", "dp_shard"}, groups, (0, 1, 2, 3))
    assert got["tp"].ranks == (0, 1) and got["dp_shard"].ranks == (0, 2)
    # a role without a group of its own runs on the world group
    assert assign_unnamed({"pp"}, [Group((0, 1, 2, 3), "0", "default_pg", None)], (0, 1, 2, 3))["pp"].ranks == \
        (0, 1, 2, 3)


@pytest.mark.parametrize("name, cls", [
    ("void deep_ep::intranode::dispatch<8, 768>(int4*, float*)", "COMM"), ("dpsk::ep::combine_kernel", "COMM"),
    ("nvshmemi_transfer_rma_kernel", "COMM"), ("c10d::symmetric_memory::one_shot_all_reduce_kernel<float>", "COMM"),
    ("void vllm::cross_device_reduce_1stage<__half, 8>", "COMM"), ("sglang::custom_allreduce_kernel", "COMM"),
    ("tensorrt_llm::kernels::allreduce_fusion_kernel_oneshot_lamport", "COMM"), ("mscclpp::allreduce6", "COMM"),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "COMM"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn", "COMP"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "COMP"), ("triton_red_fused_sum_0", "COMP")])
def test_custom_communication_kernels_are_comm(name, cls):
    """Issue 15 item 7: communication kernels outside NCCL count as communication (names from the
    projects' sources: DeepEP, NVSHMEM, PyTorch symmetric memory, vLLM / SGLang / TensorRT-LLM)."""
    from rankscope.model import KernelClass, classify_names
    assert KernelClass(int(classify_names([name], np.ones(1, bool))[0])).name == cls


def test_a_registered_pattern_classifies_names_already_seen():
    """Names are classified once per process and pattern table: a pattern registered later applies
    to a name seen before it, and removing it gives the name its class back (hand check)."""
    from rankscope.model import KERNEL_CLASS_PATTERNS, KernelClass, classify_names, register_kernel_pattern
    name, on_device = ["my_vendor_allreduce_kernel"], np.ones(1, bool)
    assert classify_names(name, on_device)[0] == KernelClass.COMP
    register_kernel_pattern(r"^my_vendor_allreduce", KernelClass.COMM)
    try:
        assert classify_names(name, on_device)[0] == KernelClass.COMM
        assert classify_names(name, ~on_device)[0] == KernelClass.NONE      # a host event of that name
    finally:
        KERNEL_CLASS_PATTERNS.pop(0)
    assert classify_names(name, on_device)[0] == KernelClass.COMP


def test_deepep_kernels_are_all_to_all():
    from rankscope.analyses.rank.collectives import normalize_collective
    assert normalize_collective("void deep_ep::intranode::dispatch<8, 768>(int4*)") == "all_to_all"
    assert normalize_collective("dpsk::ep::combine_kernel") == "all_to_all"


def test_a_new_kernel_pattern_makes_a_new_cache_key(tmp_path, corpus):
    """The cache keys parsed traces by the kernel-class table: a registered pattern is never served
    a parse made without it."""
    from rankscope.ingest.cache import content_key
    from rankscope.model import KERNEL_CLASS_PATTERNS, KernelClass, register_kernel_pattern
    f = sorted((corpus_root() / FSDP4).glob("*.json.gz"))[0]
    before = content_key(f)
    register_kernel_pattern(r"^my_vendor_allreduce", KernelClass.COMM)
    try:
        assert content_key(f) != before
    finally:
        KERNEL_CLASS_PATTERNS.pop(0)
    assert content_key(f) == before


def test_megatron_style_unnamed_groups_with_plain_all_reduce():
    """NCCL traces name each collective's group (`Process Group Ranks`) but not its role
    ("undefined"): tensor-parallel all_reduce is a plain all_reduce, as Megatron issues it. A 2 x 2
    job seen from rank 0: all_reduce in [0, 1] (contiguous: tp) and in [0, 2] (dp)."""
    from types import SimpleNamespace
    from rankscope.analyses.rank.collectives import RankCollectives, _assign_dims
    meta = SimpleNamespace(world_size=4, pg_config=[])
    out = RankCollectives(rank=0, pg=["1", "2", "1"], type=["all_reduce"] * 3, seq=[0, 0, 1], group_size=[2, 2, 2])
    groups = [Group((0, 1), "1", "undefined", None), Group((0, 2), "2", "undefined", None), Group((0, 1), "1", "undefined", None)]
    _assign_dims(out, meta, 0, [False] * 3, groups)
    assert out.dim == ["tp", "dp", "tp"]
    assert sorted(out.groups) == sorted([["tp", "inferred", 0, 1], ["dp", "inferred", 0, 2]])


def test_straggler_evidence_says_in_which_dimension_it_is_late(corpus):
    """With the bars lowered (any rank last at half of its collectives is named), each straggler's
    evidence splits its last arrivals by dimension; the counts add up to its collectives (hand sum)."""
    import re
    a = analyze(corpus_root() / TP2DP2, use_cache=False, engine="inprocess",
                thresholds={"straggler_last_share_min": 0.3, "straggler_last_share_chance_factor": 0.5,
                            "straggler_min_cost_pct_of_step": 0.1, "straggler_min_cost_ms": 0.01})
    assert a.stragglers
    stats = {s.rank: s for s in a.rank_stats}
    for st in a.stragglers:
        parts = re.findall(r"last at (\d+) of (\d+) (\w+) collectives", st.evidence)
        assert {d for _, _, d in parts} == {"dp", "tp"}
        assert sum(int(n) for _, n, _ in parts) == stats[st.rank].collectives
        assert sum(int(k) for k, _, _ in parts) == stats[st.rank].last_arrivals


def test_sequence_parallel_gathers_go_to_the_tp_group():
    """A functional (DTensor) all_gather / reduce_scatter where the job names a tp group is sequence
    parallel, in the tp group; a c10d one (FSDP's) stays in the sharded data-parallel group."""
    from types import SimpleNamespace
    from rankscope.analyses.rank.collectives import RankCollectives, _assign_dims
    meta = SimpleNamespace(world_size=4, pg_config=[
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "pg_desc": "mesh_dp", "ranks": [0, 2]},
        {"pg_name": "2", "pg_desc": "mesh_tp", "ranks": [0, 1]}])
    out = RankCollectives(rank=0, pg=["default"] * 3, type=["all_gather", "reduce_scatter", "all_gather"],
                          seq=[-1] * 3, group_size=[4] * 3)
    _assign_dims(out, meta, 0, [True, True, False], [None] * 3)
    assert out.dim == ["tp", "tp", "dp"]
    assert out.pg == ["mesh_tp:0,1", "mesh_tp:0,1", "mesh_dp:0,2"]


def test_a_user_can_name_their_own_groups():
    """`extend_dim_patterns`: a team's own group names read as dimensions (ahead of the built-in table)."""
    from rankscope.analyses.rank import groups
    saved = list(groups.DIM_PATTERNS)
    try:
        assert dim_of_desc("my_team_shards") is None
        groups.extend_dim_patterns(r"team_shards", "dp_shard")
        assert dim_of_desc("my_team_shards") == "dp_shard"
        with pytest.raises(ValueError, match="unknown dimension"):
            groups.extend_dim_patterns("x", "zz")
    finally:
        groups.DIM_PATTERNS[:] = saved
        groups._compiled.clear()
