"""rankscope.analyses.rank.kernels on real corpus traces.

Independent references, stated per test:
  * plain `json.loads` of the trace file (conftest.load_json) with the DESIGN.md class patterns
    re-written here, and hand computations in the test;
  * HTA 0.5 `get_gpu_kernel_breakdown`, run once in HTA's own virtualenv and stored in
    tests/fixtures/kernels/hta_kernel_breakdown.json (how: tests/fixtures/kernels/README.md);
  * Kineto's own `est. achieved occupancy %` written in the traces (for our occupancy formula).
"""
from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import MEMORY_TIMELINE, columns_frame, corpus_trace_params, load_json, raw_text, x_events
from rankscope.analyses.rank.kernels import kernel_breakdown, kernel_stats, launch_occupancy, tensor_core_rule
from rankscope.results.rank import KernelBreakdown, KernelStats
from rankscope.ingest.kineto import read_kineto

FIXTURE = Path(__file__).parent / "fixtures" / "kernels" / "hta_kernel_breakdown.json"
NQ = "hta-negative-queue/rank0.json.gz"
DLRM0 = "param-dlrm-8rank/worker0_step_12.1694128201545.pt.trace.json.gz"
B200 = "tracelens-b200-rank0/eager_trace.json.gz"
MI300 = "tracelens-mi300-resnet-rank0/resnet_act_checkpoint.json.gz"
RESNET = "kineto-resnet50-workers0/worker0.1623143089861.pt.trace.json.gz"

DEVICE_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "mem", "Memcpy": "mem",
               "gpu_memset": "mem", "Memset": "mem"}
DEVICE_CAT_RX = re.compile(rb'"cat"\s*:\s*"(kernel|Kernel|gpu_memcpy|Memcpy|gpu_memset|Memset)"')
# DESIGN.md "Kernel classes", written out again here (not imported from rankscope)
COMM_RX = re.compile(r"nccl|rccl|hccl|multimem_|cross_device_reduce", re.I)
MEM_NAME_RX = re.compile(r"^(gpu_)?mem(cpy|set)|^hipmem(cpy|set)", re.I)


def _ns(us) -> int:
    """JSON microseconds -> int nanoseconds. Exact for ints and Decimals (`_load(exact=True)`:
    epoch-microsecond timestamps times 1000 do not fit a float's 53 bits); for float durations
    (well below 2**53 ns) rounding the float is exact too."""
    if isinstance(us, int):
        return us * 1000
    if isinstance(us, float):
        return int(round(us * 1000))
    return int((Decimal(us) * 1000).to_integral_value(rounding=ROUND_HALF_EVEN))


def _device_events(doc: dict) -> list[tuple[str, str, int, int]]:
    """(class, name, ts_ns, dur_ns) of every kernel / memcpy / memset, classified by hand
    (ts_ns exact only for a document loaded with exact=True)."""
    out = []
    for e in x_events(doc):
        cat = DEVICE_CATS.get(e.get("cat"))
        if cat is None:
            continue
        name = e["name"]
        if cat == "mem" or MEM_NAME_RX.search(name):
            cls = "MEM"
        elif COMM_RX.search(name):
            cls = "COMM"
        else:
            cls = "COMP"
        out.append((cls, name, _ns(e["ts"]), _ns(e.get("dur", 0))))
    return out


def _load(path: Path, exact: bool = False) -> dict:
    """Plain json.loads of the trace (conftest, cached); `exact=True` keeps floats as Decimal,
    needed where timestamps are compared."""
    return load_json(path, exact=exact)


def _hta(rel: str) -> dict:
    sets = {s["file"]: s for s in json.loads(FIXTURE.read_text())["sets"]}
    return sets[rel]


# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rel", [RESNET, B200, MI300, NQ, DLRM0])
def test_class_counts_and_sums_match_plain_json(corpus: Path, rel: str):
    """Per class: event count and summed duration equal a plain json count with the DESIGN.md
    patterns; per-class top kernels' count/sum/min/max equal the hand aggregation."""
    ref = _device_events(_load(corpus / rel))
    trace, _ = read_kineto(corpus / rel)
    b = kernel_breakdown(trace, top_k=5)
    by_cls = defaultdict(list)
    for cls, name, _, dur in ref:
        by_cls[cls].append((name, dur))
    got = {r["kernel_class"]: r for r in columns_frame(b.classes).to_dicts()}
    assert set(got) == set(by_cls)
    total = sum(d for _, _, _, d in ref)
    for cls, items in by_cls.items():
        assert got[cls]["count"] == len(items), cls
        s = sum(d for _, d in items)
        assert got[cls]["sum_ms"] * 1e6 == pytest.approx(s, abs=len(items)), cls      # <= 1 ns per event
        assert got[cls]["share_pct"] == pytest.approx(100.0 * s / total, rel=1e-6)
        per_name = defaultdict(list)
        for name, d in items:
            per_name[name].append(d)
        top = sorted(per_name.items(), key=lambda kv: -sum(kv[1]))[:5]
        rows = columns_frame(b.top_kernels).filter(pl.col("kernel_class") == cls)
        assert rows["name"].to_list()[:len(top)] == [n for n, _ in top] or \
            sorted(sum(v) for _, v in top) == sorted(rows["sum_us"].to_list()[:len(top)])   # ties reorder
        for name, durs in top:
            r = rows.filter(pl.col("name") == name).to_dicts()[0]
            assert r["count"] == len(durs)
            assert r["sum_us"] == pytest.approx(sum(durs) / 1e3, abs=len(durs) * 1e-3)
            assert r["min_us"] == pytest.approx(min(durs) / 1e3, abs=1e-3)
            assert r["max_us"] == pytest.approx(max(durs) / 1e3, abs=1e-3)
            std = float(np.std(np.array(durs) / 1e3, ddof=1)) if len(durs) > 1 else 0.0
            assert r["std_us"] == pytest.approx(std, rel=1e-6, abs=1e-3)
        others = rows.filter(pl.col("name") == "others")
        rest = [d for n, v in per_name.items() if n not in dict(top) for d in v]
        assert others.height == (1 if rest else 0)
        if rest:
            assert others["count"][0] == len(rest)


def test_busy_time_and_overlap_by_hand(corpus: Path):
    """dlrm rank 0: the overlap categories sum to the union of all device intervals, and the
    COMP+COMM time equals a hand sweep over the plain-json intervals."""
    ref = _device_events(_load(corpus / DLRM0, exact=True))
    b = kernel_breakdown(read_kineto(corpus / DLRM0)[0])

    def union_len(iv):
        iv = sorted(iv)
        total, cur_s, cur_e = 0, None, None
        for s, e in iv:
            if cur_e is None or s > cur_e:
                total += (cur_e - cur_s) if cur_e is not None else 0
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        return total + ((cur_e - cur_s) if cur_e is not None else 0)

    all_iv = [(t, t + d) for _, _, t, d in ref]
    comp = [(t, t + d) for c, _, t, d in ref if c == "COMP"]
    comm = [(t, t + d) for c, _, t, d in ref if c == "COMM"]
    busy = union_len(all_iv)
    assert b.busy_ms * 1e6 == pytest.approx(busy, abs=2)
    assert sum(b.overlap.time_ms) * 1e6 == pytest.approx(busy, abs=2)
    # |COMP ∪| + |COMM ∪| - |COMP ∪ COMM ∪| = |COMP ∩ COMM|
    both = union_len(comp) + union_len(comm) - union_len(comp + comm)
    comp_comm = columns_frame(b.overlap).filter(pl.col("kernel_types").str.contains("COMP")
                                              & pl.col("kernel_types").str.contains("COMM"))
    assert comp_comm["time_ms"].sum() * 1e6 == pytest.approx(both, abs=2)
    assert both > 0


# ----------------------------------------------------------------------------------------------
HTA_TYPES = {"COMPUTATION": "COMP", "COMMUNICATION": "COMM", "MEMORY": "MEM"}


def _hta_label(kernel_type: str) -> str:
    return "+".join(HTA_TYPES[p] for p in kernel_type.split(" overlapping "))


@pytest.mark.parametrize("rel", [NQ, DLRM0])
def test_breakdown_matches_hta(corpus: Path, rel: str):
    """HTA 0.5 (fixture) on ranks where its kernel classes agree with ours, in HTA's event
    selection (`hta_filter=True`: the last ProfilerStep dropped): kernel-type times, per-class
    totals and per-kernel sums within 1%; HTA's per-kernel min/max/mean/std where HTA did not
    re-aggregate that class (no "others" row; see README)."""
    hta = _hta(rel)
    b = kernel_breakdown(read_kineto(corpus / rel)[0], top_k=10, hta_filter=True)
    ours = dict(zip(b.overlap.kernel_types, b.overlap.time_ms))
    theirs = {_hta_label(r["kernel_type"]): r["sum_us"] / 1e3 for r in hta["kernel_type"]}
    assert set(ours) == set(theirs)
    for k, v in theirs.items():
        assert ours[k] == pytest.approx(v, rel=0.01), k
    pct = dict(zip(b.overlap.kernel_types, b.overlap.share_pct))
    for r in hta["kernel_type"]:
        assert pct[_hta_label(r["kernel_type"])] == pytest.approx(r["percentage"], abs=0.1)   # HTA rounds to 0.1

    class_sum = defaultdict(float)
    for r in hta["kernels"]:
        class_sum[HTA_TYPES[r["kernel_type"]]] += r["sum_us"]
    got_sum = dict(zip(b.classes.kernel_class, b.classes.sum_ms))
    for cls, s in class_sum.items():
        assert got_sum[cls] * 1e3 == pytest.approx(s, rel=0.01), cls

    top = columns_frame(b.top_kernels)
    for cls in class_sum:
        rows = [r for r in hta["kernels"] if HTA_TYPES[r["kernel_type"]] == cls]
        aggregated = any(r["name"] == "others" for r in rows)
        for r in rows:
            if r["name"] == "others":
                continue
            mine = top.filter((pl.col("kernel_class") == cls) & (pl.col("name") == r["name"])).to_dicts()
            assert mine, f"{cls} {r['name'][:60]} not in our top 10"
            m = mine[0]
            assert m["sum_us"] == pytest.approx(r["sum_us"], rel=0.01)
            if not aggregated:
                for ours_k, hta_k in (("min_us", "min_us"), ("max_us", "max_us"), ("mean_us", "mean_us"),
                                      ("std_us", "std_us")):
                    assert m[ours_k] == pytest.approx(r[hta_k], rel=0.01, abs=1e-6), (r["name"][:40], ours_k)


def test_hta_filter_drops_last_step_only(corpus: Path):
    """The HTA selection keeps exactly the device events whose runtime launch starts before the
    last ProfilerStep (checked on the plain json of hta-negative-queue)."""
    doc = _load(corpus / NQ, exact=True)
    xs = x_events(doc)
    last = max(_ns(e["ts"]) for e in xs if e["name"].startswith("ProfilerStep#"))
    early = {e["args"]["correlation"] for e in xs
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
             and _ns(e["ts"]) < last}
    keep = [e for e in xs if DEVICE_CATS.get(e.get("cat")) and e["args"].get("correlation") in early]
    b = kernel_breakdown(read_kineto(corpus / NQ)[0], hta_filter=True)
    assert sum(b.classes.count) == len(keep)
    assert len(keep) < sum(1 for e in xs if DEVICE_CATS.get(e.get("cat")))


def test_hta_classification_differences_documented(corpus: Path):
    """B200: HTA counts `ncclDevKernel_*` as COMMUNICATION but the symmetric-memory
    `multimem_all_reduce_kernel` as COMPUTATION; DESIGN.md (and we) say COMM. MI300 (RCCL
    `ncclDevKernel_Generic`): HTA 0.5 cannot load the file; we classify the RCCL kernels COMM."""
    hta = _hta(B200)
    hta_type = {r["name"]: r["kernel_type"] for r in hta["kernels"]}
    multimem = [n for n in hta_type if "multimem_all_reduce_kernel" in n]
    nccl_dev = [n for n in hta_type if n.startswith("ncclDevKernel_")]
    assert multimem and all(hta_type[n] == "COMPUTATION" for n in multimem)
    assert nccl_dev and all(hta_type[n] == "COMMUNICATION" for n in nccl_dev)
    b = kernel_breakdown(read_kineto(corpus / B200)[0], top_k=10)
    comm_names = columns_frame(b.top_kernels).filter(pl.col("kernel_class") == "COMM")["name"].to_list()
    assert any("multimem_all_reduce_kernel" in n for n in comm_names)
    assert any(n.startswith("ncclDevKernel_") for n in comm_names)
    # HTA's COMMUNICATION time = only the ncclDevKernel (its ns durations rounded down to us)
    ref = _device_events(_load(corpus / B200))
    nccl_us = sum(d for _, n, _, d in ref if n.startswith("ncclDevKernel_")) / 1e3
    hta_comm = sum(r["sum_us"] for r in hta["kernel_type"] if r["kernel_type"] == "COMMUNICATION")
    assert hta_comm == pytest.approx(nccl_us, abs=1.0)
    comm_ms = columns_frame(b.classes).filter(pl.col("kernel_class") == "COMM")["sum_ms"][0]
    assert comm_ms * 1e3 > 50 * hta_comm          # the multimem kernels dominate our COMM

    assert "error" in _hta(MI300)
    bm = kernel_breakdown(read_kineto(corpus / MI300)[0], top_k=10)
    rccl = [n for n in columns_frame(bm.top_kernels).filter(pl.col("kernel_class") == "COMM")["name"].to_list()
            if n.startswith("ncclDevKernel_")]
    assert rccl


# ----------------------------------------------------------------------------------------------
def test_occupancy_of_one_kernel_by_hand(corpus: Path):
    """V100 (resnet50): `volta_scudnn_128x64_relu_medium_nn_v1`, block 128 threads, 128 registers
    per thread, 16384 B shared memory, grid 3136 blocks; deviceProperties: 80 SMs, 2048 threads,
    65536 registers, 98304 B shared memory per SM, warp 32, compute 7.0 (values read below from
    the plain json and checked). By hand:
        warps/block = 4;  by threads = 64/4 = 16;  registers/warp = 128*32 = 4096 (multiple of
        256), warps by registers = 4 * floor(16384/4096) = 16 -> 4 blocks;  by shared memory
        = 98304/16384 = 6;  arch limit 32  =>  4 active blocks
        theoretical = 4*128/2048 = 25 %;  blocks per SM from the grid = 3136/80 = 39.2 > 4
        => estimated achieved = 25 %  (the trace itself says 25)."""
    doc = _load(corpus / RESNET)
    ev = next(e for e in x_events(doc) if e["name"] == "volta_scudnn_128x64_relu_medium_nn_v1")
    a = ev["args"]
    assert (a["block"], a["registers per thread"], a["shared memory"], a["grid"]) == \
        ([128, 1, 1], 128, 16384, [3136, 1, 1])
    dev = doc["deviceProperties"][a["device"]]
    assert (dev["numSms"], dev["maxThreadsPerMultiprocessor"], dev["regsPerMultiprocessor"],
            dev["sharedMemPerMultiprocessor"], dev["warpSize"], dev["computeMajor"]) == (80, 2048, 65536, 98304, 32, 7)
    assert a["est. achieved occupancy %"] == 25
    theo, ach = launch_occupancy(np.array([a["device"]]), np.array([3136]), np.array([128]), np.array([128]),
                                 np.array([16384]), doc["deviceProperties"])
    assert theo[0] == pytest.approx(25.0) and ach[0] == pytest.approx(25.0)
    # a grid smaller than the SM count: 50 blocks of 256 threads, 38 registers, no shared memory:
    # active = min(2048/256=8, regs: 38*32=1216 -> 1280/warp, 4*floor(16384/1280)=48 warps -> 6) = 6,
    # grid gives 50/80 = 0.625 blocks per SM  =>  0.625*256/2048 = 7.8125 % (trace: 8)
    theo, ach = launch_occupancy(np.array([0]), np.array([50]), np.array([256]), np.array([38]), np.array([0]),
                                 doc["deviceProperties"])
    assert ach[0] == pytest.approx(7.8125) and theo[0] == pytest.approx(75.0)


def test_occupancy_when_kineto_reports_zero(corpus: Path):
    """A100: Kineto writes 0 for kernels with opt-in shared memory (> 48 KiB). cutlass
    s1688gemm 256x128_32x3_nt: 256 threads, ~241-248 registers, 147456 B shared memory. By hand
    (compute 8.0, 164 KiB = 167936 B shared memory per SM, 1 KiB reserved per block):
        shared memory: 167936 // (147456 + 1024) = 1 block;  registers: 248*32 = 7936 per warp,
        4 * floor(16384/7936) = 8 warps -> 1 block of 8 warps;  threads: 8
        => 1 * 256 / 2048 = 12.5 % (every launch has >= 108 blocks, so achieved = theoretical)."""
    doc = _load(corpus / NQ)
    name = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_32x3_nt_align1>(cutlass_80_tensorop_s1688gemm_256x128_32x3_nt_align1::Params)"
    evs = [e for e in x_events(doc) if e["name"] == name]
    assert evs and all(e["args"]["est. achieved occupancy %"] == 0 for e in evs)
    assert all(e["args"]["shared memory"] == 147456 and e["args"]["grid"][0] * e["args"]["grid"][1] * e["args"]["grid"][2] >= 108
               and 225 <= e["args"]["registers per thread"] <= 248 for e in evs)
    s = kernel_stats(read_kineto(corpus / NQ)[0], top_n=50)
    row = columns_frame(s.kernels).filter(pl.col("name") == name).to_dicts()[0]
    assert row["occupancy_source"] == "computed"
    assert row["occupancy_pct"] == pytest.approx(12.5)
    assert row["count"] == len(evs)
    # a kernel without shared memory keeps Kineto's value
    kernels = columns_frame(s.kernels)
    adam = kernels.filter(pl.col("name").str.starts_with("void multi_tensor_apply_kernel")).to_dicts()[0]
    assert adam["occupancy_source"] == "trace"


@pytest.mark.parametrize("rel", [RESNET, NQ, B200, "hta-ns-resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
                                 DLRM0, "hta-nccl-metadata/nccl_data.json.gz"])
def test_occupancy_formula_agrees_with_kineto(corpus: Path, rel: str):
    """For every launch whose trace carries a valid `est. achieved occupancy %` (not Kineto's 0
    for > 48 KiB shared memory), our formula from grid/block/registers/shared memory and the
    plain-json deviceProperties is within 0.5 point (Kineto rounds to an integer)."""
    doc = _load(corpus / rel)
    rows = []
    for e in x_events(doc):
        if e.get("cat") not in ("kernel", "Kernel"):
            continue
        a = e.get("args", {})
        if "est. achieved occupancy %" not in a or "grid" not in a:
            continue
        if a["est. achieved occupancy %"] == 0 and a.get("shared memory", 0) > 48 * 1024:
            continue
        rows.append((a.get("device", 0), math.prod(a["grid"]), math.prod(a["block"]), a["registers per thread"],
                     a["shared memory"], a["est. achieved occupancy %"]))
    assert len(rows) > 50
    d, g, b, r, sm, expected = (np.array(c) for c in zip(*rows))
    _, ach = launch_occupancy(d, g, b, r, sm, doc["deviceProperties"])
    assert not np.isnan(ach).any()
    assert np.abs(ach - expected).max() <= 0.5 + 1e-9


# ----------------------------------------------------------------------------------------------
#: Real kernel names from the corpus (set in the comment) -> (uses Tensor Cores, GEMM-like).
CORPUS_KERNELS = [
    ("volta_sgemm_128x32_nt", False, True),                                                   # dlrm V100
    ("volta_scudnn_128x64_relu_interior_nn_v1", False, True),                                 # resnet50 V100
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", False, True),                       # ns-resolution
    ("void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, float const*, float const*, bool, int, int)", False, True),
    ("void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float const*, int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)", False, True),
    ("ampere_sgemm_128x64_nn", False, True),                                                  # event-sync A100
    ("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 8, 9, false, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float> >(cublasGemmSmallNParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>)", False, True),
    ("void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32_8x5_nn_align1::Params)", False, True),   # nccl-metadata
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>(cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1::Params)", True, True),   # A100 TF32
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_alignc4_execute_kernel_cudnn", True, True),   # alexnet A100
    ("void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_64x128_32x3_nhwc_align4>(cutlass_tensorop_s1688dgrad_optimized_tf32_64x128_32x3_nhwc_align4::Params)", True, True),
    ("nvjet_tst_144x128_64x6_2x1_v_bz_bias_TNN", True, True),                                 # B200 cuBLASLt
    ("bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_schedP2x1x2x3_biasM_bN_tmaOpt_clmp_dynBatch_sm100f", True, True),
    ("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", True, True),
    ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_EPS0_GRVWA2_GRVWB2_GSUAMB_ISA90a_IU1_K1_LBSPPA128_LBSPPB128_LBSPPM0_LPA8_LPB8_LPM0_LRVW4_LWPMn1_MIAV0_MIWT1_1_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NTM0_NEPBS2_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO1_SRVW0_SSO0_SVW1_TLDS1_USFGROn1_VSn1_VWA1_VWB1_WSGRA1_WSGRB1_WS64_WG64_4_1", True, True),   # MI250 FP32 MFMA
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x64_tb1x8x2x1_1x4x1x64_gkgs", True, True),   # MI300 MIOpen
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)", False, False),
    ("triton_poi_fused_addmm_gelu_view_15", False, False),                                    # xdit: pointwise, not a GEMM
    ("void fbgemm_gpu::permute_2D_data_kernel<false, int, int, decltype(nullptr)>(int, int, int, int const*, decltype(nullptr) const*, int const*, int const*, int const*, int*, decltype(nullptr)*)", False, False),
    ("SubTensorOpWithScalar1d", False, False),                                                # MIOpen elementwise
    ("void moe::dev::finalize::finalizeKernelVecLoad<moe::dev::finalize::KernelParams<cutlass::bfloat16_t, cutlass::bfloat16_t, 4, true> >(moe::dev::finalize::KernelParams<cutlass::bfloat16_t, cutlass::bfloat16_t, 4, true>)", False, False),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", False, False),
]


@pytest.mark.parametrize("name,tc,gemm", CORPUS_KERNELS, ids=[n[:40] for n, _, _ in CORPUS_KERNELS])
def test_tensor_core_inference_on_corpus_names(name: str, tc: bool, gemm: bool):
    got_tc, rule, got_gemm = tensor_core_rule(name)
    assert (got_tc, got_gemm) == (tc, gemm), rule


def test_corpus_kernel_names_are_real(corpus: Path):
    """Every name of the table above occurs in some corpus trace (as a JSON string in the
    gunzipped file text)."""
    wanted = {n for n, _, _ in CORPUS_KERNELS}
    files = [RESNET, DLRM0, NQ, B200, MI300, "hta-ns-resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
             "hta-cuda-event-sync-multistream/event_sync_trace.json.gz", "hta-nccl-metadata/nccl_data.json.gz",
             "hta-amd-mi250/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "big-mi300-xdit/profile_trace_rank_0.json.gz",
             "hta-critical-path-alexnet/benchmark_result_2869224_1695835535_trace.json.gz"]
    seen = set()
    for rel in files:
        text = raw_text(corpus / rel)
        seen |= {n for n in wanted if f'"name": {json.dumps(n)}'.encode() in text
                 or f'"name":{json.dumps(n)}'.encode() in text}
    assert wanted - seen == set()


def test_tensor_core_share_resnet_is_fp32(corpus: Path):
    """ResNet50 on V100 in FP32 (2021 sample): every GEMM/conv kernel is an FP32 CUDA-core
    kernel (volta_sgemm / volta_scudnn / implicit_convolve_sgemm / cudnn engines), so the FP32
    GEMM share is 100 % and no kernel uses Tensor Cores; the GEMM time equals the hand sum of
    the kernels whose names carry those markers."""
    doc = _load(corpus / RESNET)
    markers = re.compile(r"sgemm|scudnn|wgrad_alg|dgrad_engine|winograd|gemv|gemmSN|dot_kernel|gemmk1")
    hand = sum(_ns(e["dur"]) for e in x_events(doc) if e.get("cat") == "Kernel" and markers.search(e["name"]))
    s = kernel_stats(read_kineto(corpus / RESNET)[0])
    assert s.fp32_gemm_share_pct == pytest.approx(100.0)
    assert s.tensor_core_pct == 0.0 and s.gemm_tensor_core_ms == 0.0
    assert s.gemm_ms * 1e6 == pytest.approx(hand, abs=1000)
    assert s.occupancy_source == "trace"


def test_tensor_core_share_a100_by_hand(corpus: Path):
    """hta-negative-queue (A100): Tensor Core time = kernels with `tensorop` (CUTLASS TF32
    s1688), FP32 GEMM time = cuBLAS `gemv` and `ampere_sgemm` kernels, both summed by hand from
    the plain json."""
    doc = _load(corpus / NQ)
    kern = [e for e in x_events(doc) if e.get("cat") == "kernel"]
    tc = sum(_ns(e["dur"]) for e in kern if "tensorop" in e["name"])
    fp32 = sum(_ns(e["dur"]) for e in kern if "gemv" in e["name"] or "sgemm" in e["name"])
    allk = sum(_ns(e["dur"]) for e in kern)
    s = kernel_stats(read_kineto(corpus / NQ)[0])
    assert s.kernel_count == len(kern)
    assert s.gemm_tensor_core_ms * 1e6 == pytest.approx(tc, abs=1000)
    assert s.gemm_fp32_ms * 1e6 == pytest.approx(fp32, abs=1000)
    assert s.fp32_gemm_share_pct == pytest.approx(100.0 * fp32 / (tc + fp32), rel=1e-6)
    assert s.tensor_core_pct == pytest.approx(100.0 * tc / allk, rel=1e-6)
    top = columns_frame(s.kernels).row(0, named=True)  # the NCCL kernel leads
    names = defaultdict(int)
    for e in kern:
        names[e["name"]] += _ns(e["dur"])
    best = max(names, key=names.get)
    assert top["name"] == best and top["total_ms"] * 1e6 == pytest.approx(names[best], abs=100)


# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rel", corpus_trace_params())
def test_works_on_every_corpus_trace(corpus: Path, rel: str):
    """Both functions run on every trace; traces without device activity give empty results."""
    trace, _ = read_kineto(corpus / rel)
    b = kernel_breakdown(trace, top_k=3)
    s = kernel_stats(trace, top_n=5)
    assert isinstance(b, KernelBreakdown) and isinstance(s, KernelStats)
    assert len(b.top_kernels.name) <= 3 * (3 + 1) and len(s.kernels.name) <= 5
    # device events counted in the gunzipped text: every kernel/memcpy/memset is an "X" event
    n_dev = len(DEVICE_CAT_RX.findall(raw_text(corpus / rel)))
    if n_dev == 0:
        assert not b.classes.kernel_class and not b.overlap.kernel_types and not b.top_kernels.name
        assert b.sum_ms == 0.0 and not s.kernels.name and s.kernel_count == 0
        assert s.fp32_gemm_share_pct is None and s.occupancy_pct is None
    else:
        assert sum(b.classes.count) == n_dev
        assert sum(b.overlap.share_pct) == pytest.approx(100.0)
        assert sum(b.classes.share_pct) == pytest.approx(100.0)
    if s.occupancy_pct is not None:
        assert 0.0 <= s.occupancy_pct <= 100.0
        assert all(0 <= x <= 100 for x in s.kernels.occupancy_pct if x is not None)
    assert MEMORY_TIMELINE not in rel


def test_downsample_keeps_epoch_nanosecond_timestamps():
    """Nsight exports carry epoch timestamps (~1.7e18 ns): bins over a 100 ns span must still exist
    (float64 bin edges lost the low digits and left no bin: an IndexError)."""
    import numpy as np
    from rankscope.analyses.rank.launch import _downsample
    t0 = 1_700_000_000_000_000_000
    got = _downsample(np.array([t0, t0 + 100], dtype=np.int64), np.array([2.0, 0.0]), 200)
    assert got["start"][0] == t0 and len(got["start"]) >= 1
    assert got["max"].max() == 2.0
