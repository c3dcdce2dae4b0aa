"""Collectives: per-rank extraction (map) and matching across ranks (reduce), issue 4.

Expected values come from the trace files read with the standard library only (conftest.load_json),
from the synthetic generator's constants and ground truth, or from nccl-tests doc/PERFORMANCE.md
(bus bandwidth factors); each test says which.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import msgspec
import numpy as np
import polars as pl
import pytest

from conftest import DLRM, GLOO_HEALTHY, corpus_files, corpus_root, load_json, x_events
from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.analyses.rank.collectives import (busbw_factor, dtype_bytes, instances, nccl_tests_bytes,
                                                normalize_collective, pack_collectives, pre_matrix, rank_collectives,
                                                since_step_matrix)
from rankscope.results.collectives import PackedCollectives, RankCollectives
from rankscope.analyses.job.matching import collectives_summary, match_collectives, member_frame, summarize_collectives
from rankscope.analyses.job.reduce import reduce_job
from rankscope.ingest.kineto import read_kineto
from rankscope.synth import BUS_BANDWIDTH_GBPS, generate_job

GLOO_STRAGGLER = "cpu-gloo-4rank-straggler"


@lru_cache(maxsize=8)
def corpus_collectives(folder: str) -> tuple[RankCollectives, ...]:
    """RankCollectives of every rank of a corpus set (cached: several test modules use them)."""
    files = sorted((corpus_root() / folder).glob("*.json.gz"))
    assert files, f"no traces in {corpus_root() / folder}"
    return tuple(rank_collectives(read_kineto(f)[0]) for f in files)


# ----------------------------------------------------------------------------------------------
# Vocabulary
@pytest.mark.parametrize("name, expected", [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL128(ncclDevKernelArgsStorage<4096ul>)", "all_reduce"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "broadcast"),
    ("ncclDevKernel_Reduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "send_recv"),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "unknown"),          # RCCL: says nothing
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long)",
     "all_reduce"),
    ("cross_device_reduce_1stage<half, 8>", "all_reduce"),
    ("nccl:all_reduce", "all_reduce"), ("nccl:_all_gather_base", "all_gather"), ("nccl:all_to_all", "all_to_all"),
    ("nccl:send", "send"), ("nccl:recv", "recv"), ("gloo:all_reduce", "all_reduce"), ("gloo:barrier", "barrier"),
    ("allreduce", "all_reduce"), ("allreduce_coalesced", "all_reduce"), ("_allgather_base", "all_gather"),
    ("allgather_into_tensor_coalesced", "all_gather"), ("_reduce_scatter_base", "reduce_scatter"),
    ("reduce_scatter_tensor_coalesced", "reduce_scatter"), ("alltoall_base", "all_to_all"),
    ("broadcast", "broadcast"), ("barrier", "barrier"), ("symm_mem::multimem_all_reduce_", "all_reduce"),
    ("wait", "unknown"), ("", "unknown"), (None, "unknown"),
])
def test_normalize_collective(name, expected):
    assert normalize_collective(name) == expected


def test_sizes_and_nccl_tests_factors():
    # element sizes as PyTorch writes them in comm_args.dtype and in Input type
    assert [dtype_bytes(d) for d in ("Float", "float", "BFloat16", "c10::BFloat16", "Half", "Long", "long int",
                                     "int", "Byte", "Double", "bogus", None)] == [4, 4, 2, 2, 2, 8, 8, 4, 1, 8, 0, 0]
    # nccl-tests doc/PERFORMANCE.md, "Summary"
    assert busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for t in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw_factor(t, 8) == pytest.approx(7 / 8)
    assert busbw_factor("broadcast", 8) == busbw_factor("reduce", 8) == 1.0
    # S: all_gather = the total output (sendcount x n), reduce_scatter = the total input (recvcount x n)
    assert nccl_tests_bytes("all_gather", 100, 800, 8) == 800
    assert nccl_tests_bytes("all_gather", 100, -1, 8) == 800
    assert nccl_tests_bytes("reduce_scatter", 800, 100, 8) == 800
    assert nccl_tests_bytes("reduce_scatter", -1, 100, 8) == 800
    assert nccl_tests_bytes("all_reduce", 400, 400, 8) == 400
    assert nccl_tests_bytes("all_reduce", -1, -1, 8) == -1


# ----------------------------------------------------------------------------------------------
# Map side on real traces
_DLRM_ANNOTATION_TYPES = {"nccl:all_reduce": "all_reduce", "nccl:all_to_all": "all_to_all"}
_ELEMENT_BYTES = {"float": 4, "int": 4, "long int": 8}       # C++ type names in Input type


def _dlrm_expected(path: Path) -> tuple[list[str], list[int], list[float]]:
    """From the plain JSON: the nccl:* annotations in time order (each launches one NCCL kernel on
    the rank's single NCCL stream, so kernel order = launch order), their Input Dims x Input type,
    and the NCCL kernels' start times (µs)."""
    ev = x_events(load_json(path))
    ann = sorted((e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")),
                 key=lambda e: e["ts"])
    kernels = sorted(e["ts"] for e in ev if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_"))
    types = [_DLRM_ANNOTATION_TYPES[e["name"]] for e in ann]
    nbytes = [math.prod(e["args"]["Input Dims"][0]) * _ELEMENT_BYTES[e["args"]["Input type"][0]] for e in ann]
    return types, nbytes, kernels


def test_dlrm_rank_collectives_match_the_annotations(corpus):
    files = corpus_files(corpus, DLRM)
    for path, rc in zip(files, corpus_collectives(DLRM)):
        types, nbytes, kernel_ts = _dlrm_expected(path)
        assert instances(rc) == len(types) == 8, path.name            # 5 all_to_all (SendRecv kernels) + 3 all_reduce
        assert rc.source == "device"
        assert rc.type == types, path.name                      # SendRecv kernels are all_to_all by their op
        assert rc.in_bytes == nbytes, path.name
        assert rc.start_ns == [round(t * 1000) for t in kernel_ts]
        assert set(rc.pg) == {"default"} and set(rc.seq) == {-1}   # 2023 format: no pg / seq metadata
        assert set(rc.group_size) == {8}                        # distributedInfo world_size
        assert set(rc.step) == {10}                             # ProfilerStep#10


def test_windows_add_up(corpus):
    """Every pre-arrival window's categories sum to its length, exactly (integer ns)."""
    for rc in corpus_collectives(DLRM) + corpus_collectives(GLOO_HEALTHY):
        pre = np.asarray(rc.pre_ns).reshape(instances(rc), len(CATEGORIES))
        since = np.asarray(rc.since_step_ns).reshape(instances(rc), len(CATEGORIES))
        start, win = np.asarray(rc.start_ns), np.asarray(rc.window_start_ns)
        assert (pre.sum(axis=1) == start - win).all()
        step_start = dict(zip(rc.steps, rc.step_start_ns))
        expected = np.array([s - step_start[k] for s, k in zip(rc.start_ns, rc.step)])
        assert (since.sum(axis=1) == expected).all()
        assert (win <= start).all()
        bd = np.asarray(rc.step_breakdown_ns)
        assert (bd.sum(axis=1) == np.asarray(rc.step_end_ns) - np.asarray(rc.step_start_ns)).all()


def test_gloo_spans_are_the_collectives(corpus):
    """CPU-only gloo job: the gloo:all_reduce spans (worker threads) are the collectives; bytes from
    their Input Dims x Input type, read here from the plain JSON."""
    files = corpus_files(corpus, GLOO_HEALTHY)
    for path, rc in zip(files, corpus_collectives(GLOO_HEALTHY)):
        ev = sorted((e for e in x_events(load_json(path)) if e["name"] == "gloo:all_reduce"), key=lambda e: e["ts"])
        assert rc.source == "host"
        assert instances(rc) == len(ev) == 8                          # 4 steps x 2 DDP buckets
        assert rc.type == ["all_reduce"] * 8
        assert rc.in_bytes == [math.prod(e["args"]["Input Dims"][0]) * 4 for e in ev]   # float
        assert set(rc.group_size) == {4}
        assert sorted(set(rc.step)) == [2, 3, 4, 5]


def test_metadata_from_comm_args_and_vendor_kernels(corpus):
    """Kernels that carry comm_args (hta-nccl-metadata, RCCL ncclDevKernel_Generic on MI300) and
    symmetric-memory multimem kernels (B200): types and bytes from the plain JSON's args."""
    for folder, expected in (("hta-nccl-metadata", {"all_reduce": 15, "broadcast": 6}),
                             # + 5 RCCL kernels launched before the profiled window: no launch event, no
                             # args, a name that says nothing -> "unknown" (read from the plain JSON)
                             ("tracelens-mi300-resnet-rank0", {"all_reduce": 6, "broadcast": 6, "unknown": 5}),
                             ("tracelens-b200-rank0", {"all_reduce": 73, "all_gather": 1})):
        (rc,) = corpus_collectives(folder)
        got = {t: rc.type.count(t) for t in set(rc.type)}
        assert got == expected, folder
    path = corpus_files(corpus, "hta-nccl-metadata")[0]
    kernels = sorted((e for e in x_events(load_json(path)) if e.get("cat") == "kernel" and "nccl" in e["name"]),
                     key=lambda e: e["ts"])
    size = {"Float": 4, "Long": 8}
    (rc,) = corpus_collectives("hta-nccl-metadata")
    assert rc.in_bytes == [e["args"]["In msg nelems"] * size[e["args"]["dtype"]] for e in kernels]
    assert set(rc.pg) == {"0"} and set(rc.group_size) == {2}


def test_no_collectives_still_has_steps(corpus):
    (rc,) = corpus_collectives("hta-ns-resolution")
    assert instances(rc) == 0 and rc.source == "none"
    assert len(rc.steps) == 5 and len(rc.step_breakdown_ns) == 5
    table = match_collectives([rc])
    assert table.count == 0 and table.unmatched == 0


def test_rank_collectives_is_small_and_msgpack_serializable():
    rc = corpus_collectives(GLOO_STRAGGLER)[2]
    blob = msgspec.msgpack.encode(rc)
    assert msgspec.msgpack.decode(blob, type=RankCollectives) == rc
    assert len(blob) < 4_000                 # 8 collectives and 4 steps: a few hundred bytes per instance


@pytest.mark.parametrize("folder", [DLRM, GLOO_STRAGGLER, "hta-sampled-2rank"])
def test_compacted_collectives_reduce_the_same(corpus, folder):
    """What a worker sends the driver (`PackedCollectives`: arrays, since_step_ns and pre_ns compressed,
    fields the reduce does not read dropped) gives the same cross-rank result as the full lists, and
    is smaller."""
    fresh = corpus_collectives(folder)
    packed = [pack_collectives(rc) for rc in fresh]
    for rc, pc in zip(fresh, packed):
        assert isinstance(pc, PackedCollectives) and not hasattr(pc, "dtype")
        assert np.array_equal(since_step_matrix(pc),
                              np.asarray(rc.since_step_ns).reshape(instances(rc), len(CATEGORIES)))
        assert np.array_equal(pre_matrix(pc), np.asarray(rc.pre_ns).reshape(instances(rc), len(CATEGORIES)))
        assert len(pc.since_step_ns.zlib_int64) < np.asarray(rc.since_step_ns, dtype=np.int64).nbytes
    assert reduce_job(packed).result == reduce_job(fresh).result


# ----------------------------------------------------------------------------------------------
# Reduce side
def test_member_frame_occurrence_by_hand_and_against_polars(corpus):
    """`occ` (the n-th instance of a key on its rank, numpy) by hand on a made-up pair of ranks,
    and equal to polars' `int_range().over(key)` on corpus jobs (orphans: hta-negative-queue;
    host spans matched per size: gloo; seq: dlrm)."""
    a = _hand(0, ["all_reduce", "send", "all_reduce", "recv", "all_reduce"], [0, 10, 20, 30, 40],
              orphan=[False, True, False, False, False])
    b = _hand(1, ["all_reduce"], [5], seq=[3])
    m = member_frame([b, a])                       # any order in: rows come out by (rank, idx)
    assert m["rank"].to_list() == [0] * 5 + [1] and m["idx"].to_list() == [0, 1, 2, 3, 4, 0]
    assert m["occ"].to_list() == [0, 0, 1, 0, 2, 0]           # the orphan send is not a p2p occurrence
    assert m["mtype"].to_list() == ["all_reduce", "orphan:0", "all_reduce", "p2p", "all_reduce", "*"]
    for folder in (DLRM, GLOO_HEALTHY, "hta-negative-queue", "hta-sampled-2rank"):
        m = member_frame(corpus_collectives(folder))
        ref = m.with_columns(pl.int_range(pl.len()).over(["rank", "pg", "seq", "mtype", "orphan"]).alias("ref"))
        matchable = ref.filter(~pl.col("orphan") | (pl.col("seq") >= 0))
        assert matchable["occ"].to_list() == matchable["ref"].to_list(), folder


def test_dlrm_matched_across_all_8_ranks_and_skew_by_hand(corpus):
    table = match_collectives(corpus_collectives(DLRM))
    c = table.collectives
    assert c.height == 8 and table.unmatched == 0
    assert c["n_ranks"].to_list() == [8] * 8 and c["complete"].all()
    assert sorted(c["type"].to_list()) == ["all_reduce"] * 3 + ["all_to_all"] * 5
    # hand check, from the plain JSON of the 8 files: the first all-reduce (394241 floats)
    starts, durs = {}, {}
    for path in corpus_files(corpus, DLRM):
        doc = load_json(path)
        k = min((e for e in x_events(doc) if e["name"].startswith("ncclKernel_AllReduce")), key=lambda e: e["ts"])
        starts[doc["distributedInfo"]["rank"]] = k["ts"]
        durs[doc["distributedInfo"]["rank"]] = k["dur"]
    row = c.filter((c["type"] == "all_reduce") & (c["occ"] == 0)).row(0, named=True)
    skew_us = max(starts.values()) - min(starts.values())
    assert row["skew_ns"] == round(skew_us * 1000)               # 223 µs
    assert row["last_rank"] == max(starts, key=starts.get)
    assert row["first_rank"] == min(starts, key=starts.get)
    assert row["transfer_ns"] == round(min(durs.values()) * 1000)
    assert row["bytes"] == 394241 * 4
    algbw = 394241 * 4 / (min(durs.values()) * 1e3)              # bytes / ns = GB/s
    assert row["algbw_gbps"] == pytest.approx(algbw)
    assert row["busbw_gbps"] == pytest.approx(algbw * 2 * 7 / 8)
    # each member's wait: its own start -> the last arriver's start
    mem = table.members.filter(table.members["cid"] == row["cid"])
    for r, w in zip(mem["rank"], mem["wait_ns"]):
        assert w == round((max(starts.values()) - starts[r]) * 1000)
    summary = collectives_summary(table, [])
    assert summary.count == 8 and {r.type for r in summary.by_type} == {"all_reduce", "all_to_all"}
    assert summary.by_pg[0].pg == "default" and summary.by_pg[0].count == 8


def test_gloo_straggler_is_last_everywhere(corpus):
    """Rank 2 sleeps 40 ms before backward each step (MANIFEST): it arrives last at every all-reduce."""
    table = match_collectives(corpus_collectives(GLOO_STRAGGLER))
    assert table.count == 8
    assert set(table.collectives["last_rank"]) == {2}
    assert (table.collectives["skew_ns"] > 30_000_000).all()
    by_type = summarize_collectives(table)
    assert by_type.row(0, named=True)["most_often_last"] == 2


def test_synthetic_job_matches_by_seq_and_recovers_bus_bandwidth(tmp_path):
    """Generator: DDP bucket all-reduces with Seq and pg "0"; transfer = latency + S x 2(n-1)/n /
    BUS_BANDWIDTH_GBPS (synth.simulation._Network). So busbw of the large buckets is close to that constant."""
    truth = generate_job(tmp_path / "job", ranks=4, steps=2, seed=3, gzip=False)
    ranks = [rank_collectives(read_kineto(p)[0]) for p in sorted((tmp_path / "job").glob("rank*.json"))]
    per_step = truth["expected"]["collectives_per_step"]
    for rc in ranks:
        assert instances(rc) == per_step * 2
        assert all(s >= 0 for s in rc.seq) and len(set(rc.seq)) == instances(rc)
        assert set(rc.pg) == {"0"} and set(rc.type) == {"all_reduce"}
        assert rc.in_bytes == [n * 2 for n in truth["model"]["allreduce_nelems"]] * 2    # bf16
    table = match_collectives(ranks)
    c = table.collectives
    assert c.height == per_step * 2 and c["complete"].all()
    big = c.filter(c["bytes"] >= 16 << 20)
    assert big.height > 0
    assert big["busbw_gbps"].median() == pytest.approx(BUS_BANDWIDTH_GBPS, rel=0.1)


def test_order_fallback_when_seq_is_missing():
    """Without seq, the n-th instance of (pg, type) on each rank is one collective; p2p types share one key."""
    a = _hand(0, ["all_reduce", "send", "all_reduce"], [0, 1000, 2000])
    b = _hand(1, ["all_reduce", "recv", "all_reduce"], [50, 1100, 2500])
    t = match_collectives([a, b])
    assert t.count == 3 and t.unmatched == 0
    assert t.collectives.sort("start_min_ns")["skew_ns"].to_list() == [50, 100, 500]
    assert t.collectives.sort("start_min_ns")["last_rank"].to_list() == [1, 1, 1]


def _hand(rank, types, starts, sizes=None, orphan=None, seq=None):
    n = len(types)
    return RankCollectives(rank=rank, source="device", pg=["default"] * n, seq=seq or [-1] * n, type=types,
                           start_ns=starts, end_ns=[s + 100 for s in starts], in_bytes=sizes or [8] * n,
                           out_bytes=[-1] * n, group_size=[2] * n, dtype=["float"] * n, step=[0] * n,
                           window_start_ns=starts, pre_ns=[[0] * 8] * n, since_step_ns=[[0] * 8] * n,
                           orphan=orphan or [False] * n)


def test_orphan_kernels_are_not_matched_by_order():
    """A kernel launched before the profiled window (no launch event: hta-negative-queue has 5,
    tracelens-mi300 5) exists on some ranks only; counting it would shift every later match."""
    a = _hand(0, ["send_recv", "all_reduce", "all_reduce"], [0, 1000, 2000], orphan=[True, False, False])
    b = _hand(1, ["all_reduce", "all_reduce"], [1010, 2020])
    t = match_collectives([a, b])
    assert t.count == 2 and t.unmatched == 1
    assert t.collectives.sort("start_min_ns")["skew_ns"].to_list() == [10, 20]
    # an orphan that carries a seq is matched by it
    c = _hand(0, ["all_reduce"], [0], orphan=[True], seq=[7])
    d = _hand(1, ["all_reduce"], [5], seq=[7])
    assert match_collectives([c, d]).count == 1
    (rc,) = corpus_collectives("hta-negative-queue")
    assert sum(rc.orphan) == 5


def test_size_mismatch_is_flagged():
    """Order matching without seq pairs the n-th all-reduce of each rank: members that disagree on
    the size mean the ranks' traces do not start at the same collective."""
    a = _hand(0, ["all_reduce", "all_reduce"], [0, 1000], sizes=[8, 16])
    b = _hand(1, ["all_reduce", "all_reduce"], [5, 1005], sizes=[16, 32])
    t = match_collectives([a, b])
    assert t.collectives["size_mismatch"].to_list() == [True, True]
    assert t.warnings and "different sizes" in t.warnings[0]
    ok = match_collectives(corpus_collectives(DLRM))
    assert not ok.collectives["size_mismatch"].any() and ok.warnings == []


def test_host_collectives_in_flight_at_once_match_by_size():
    """gloo runs DDP buckets on several threads: two all-reduces in flight at once can start in
    another order on each rank (seen in a real 2-rank capture: rank 1 began its 2 MB bucket before
    its 1 MB one). Without seq, host instances match per size; device ones keep issue order."""
    a = _hand(0, ["all_reduce", "all_reduce"], [0, 10], sizes=[1 << 20, 2 << 20])
    b = _hand(1, ["all_reduce", "all_reduce"], [3, 8], sizes=[2 << 20, 1 << 20])
    a.source = b.source = "host"
    t = match_collectives([a, b])
    assert sorted(t.collectives["bytes"].to_list()) == [1 << 20, 2 << 20]      # hand count: one of each
    assert not t.collectives["size_mismatch"].any() and t.warnings == []
    a.source = b.source = "device"                     # a device stream runs them in issue order
    assert match_collectives([a, b]).collectives["size_mismatch"].all()
