"""Issue 33: layouts without group names, in any mesh order, and the all_to_all of sharded
embedding tables.

Real captures (tests/data/captures, torch 2.13 CPU, gloo; make_captures.py): two 8-rank
(pp, dp, tp) jobs whose mesh orders are (dp, pp, tp) and (pp, tp, dp), every pg_desc rewritten to
"undefined"; a 4-rank TorchRec-style sharded-embedding job. Expected values: the groups read off
the DeviceMesh the job built (ground_truth.json), and the corpus's real TorchRec DLRM traces' own
op names (read with json).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import corpus_files, fresh_json, shared_cache_dir, x_events
from rankscope import analyze

DATA = Path(__file__).parent / "data"
#: FSDP2 over dp: its all_gather / reduce_scatter make the data-parallel dimension dp_shard.
NAMES = {"pp": "pp", "dp": "dp_shard", "tp": "tp"}


@pytest.mark.parametrize("job", ["mesh-dp-pp-tp-unnamed", "mesh-pp-tp-dp-unnamed"])
def test_any_mesh_order_without_names(job: str):
    folder = DATA / "captures" / job
    truth = json.loads((folder / "ground_truth.json").read_text())
    assert set(truth["original_pg_config_groups"]) >= {"mesh_dp", "mesh_pp", "mesh_tp"}
    result = analyze(folder, cache_dir=shared_cache_dir())
    layout = result.parallelism
    got = {d.name: (sorted(d.groups), d.source) for d in layout.dims}
    assert got == {NAMES[d["name"]]: (sorted(d["groups"]), "inferred") for d in truth["dims"]}
    # the pipeline's stages are the mesh's pp coordinates: stage s = the ranks at pp index s
    mesh = truth["mesh"]
    pp_axis = truth["mesh_dim_names"].index("pp")
    stages = [sorted(np.take(np.array(mesh), s, axis=pp_axis).ravel().tolist()) for s in range(2)]
    assert [st.ranks for st in result.pipeline.stages] == stages


def test_sharded_embedding_all_to_all_is_emb():
    """emb-alltoall: 3 all_to_all per step under TorchRec's names, 3 profiled steps (ground truth):
    one `emb 4` dimension over the world group, 9 all_to_all matched on every rank, no `ep`."""
    folder = DATA / "captures" / "emb-alltoall"
    truth = json.loads((folder / "ground_truth.json").read_text())
    result = analyze(folder, cache_dir=shared_cache_dir())
    dims = result.parallelism.dims
    assert [(d.name, d.size, d.groups) for d in dims] == [("emb", 4, truth["dims"][0]["groups"])]
    a2a = next(t for t in result.collectives.by_type if t.type == "all_to_all")
    assert a2a.count == truth["all_to_all_per_step"] * len(truth["profiled_steps"]) and a2a.max_ranks == 4


def test_torchrec_dlrm_is_emb_not_expert_parallel(corpus: Path):
    """param-dlrm-8rank is TorchRec's DLRM: its traces hold TorchRec's embedding all_to_all ops
    (read with json). Its all_to_all is the sharded embedding dimension, not expert parallel."""
    names = {e["name"] for e in x_events(fresh_json(corpus_files(corpus, "param-dlrm-8rank")[0]))}
    assert {"All2All_Pooled_Req", "## alltoall_fwd_single ##"} <= names
    result = analyze(corpus / "param-dlrm-8rank", cache_dir=shared_cache_dir())
    assert [(d.name, d.size) for d in result.parallelism.dims] == [("emb", 8)]


def test_expert_all_to_all_stays_ep():
    """tests/data/parallel/ep4-alltoall-skewed (a toy MoE, plain all_to_all_single): still `ep 4`."""
    result = analyze(DATA / "parallel" / "ep4-alltoall-skewed", cache_dir=shared_cache_dir())
    assert [(d.name, d.size) for d in result.parallelism.dims] == [("ep", 4)]
