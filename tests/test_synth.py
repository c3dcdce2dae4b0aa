"""rankscope.synth: the synthetic Kineto job generator and its ground truth.

Every check reads the written files back with the standard library only (`gzip`, `zlib`, `json`),
never with rankscope's parser, and compares them with the generator's ground_truth.json, with a
healthy twin job (same seed, no injection) or with the shapes of real traces in the corpus.
"""
from __future__ import annotations

import gzip
import json
import re
import zlib
from collections import defaultdict
from pathlib import Path
from statistics import median

import pytest

from rankscope.synth import Injection, demo_job_dir, generate_job, parse_injection

RANKS, STEPS, SEED = 4, 3, 7
DELAY_MS = 40.0
NAME = re.compile(r"^rank(\d+)\.(\d+)\.pt\.trace\.json(\.gz)?$")


# ---------------------------------------------------------------------------------------------
# Independent readers
def gunzip_all(data: bytes) -> bytes:
    """Everything a gzip stream holds, also when it was cut off (no trailer)."""
    return zlib.decompressobj(wbits=31).decompress(data)


def load_job(folder: Path) -> tuple[dict, dict[int, dict]]:
    truth = json.loads((folder / "ground_truth.json").read_text())
    docs = {}
    for path in sorted(folder.glob("rank*.pt.trace.json*")):
        data = path.read_bytes()
        doc = json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
        docs[doc["distributedInfo"]["rank"]] = doc
    return truth, docs


def events(doc: dict, cat: str | None = None, ph: str = "X") -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == ph and (cat is None or e.get("cat") == cat)]


def step_durations_ms(doc: dict) -> list[float]:
    return [e["dur"] / 1000 for e in events(doc, "user_annotation") if e["name"].startswith("ProfilerStep#")]


def nccl_kernels(doc: dict) -> list[dict]:
    return [e for e in events(doc, "kernel") if e["name"].startswith("ncclDevKernel_")]


def compute_kernels(doc: dict) -> list[dict]:
    return [e for e in events(doc, "kernel") if not e["name"].startswith("ncclDevKernel_")]


def busy_ms(kernels: list[dict]) -> float:
    return sum(e["dur"] for e in kernels) / 1000


def make_job(root: Path, name: str, injections: list[Injection] = (), **kwargs) -> tuple[dict, dict[int, dict]]:
    generate_job(root / name, ranks=RANKS, steps=STEPS, seed=SEED, injections=list(injections), **kwargs)
    return load_job(root / name)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("synth")


@pytest.fixture(scope="module")
def healthy(jobs):
    return make_job(jobs, "healthy")


# ---------------------------------------------------------------------------------------------
# Files, headers and counts
def test_one_file_per_rank_with_kineto_header(jobs, healthy):
    truth, docs = healthy
    names = [p.name for p in (jobs / "healthy").iterdir() if p.name != "ground_truth.json"]
    assert sorted(int(NAME.match(n).group(1)) for n in names) == list(range(RANKS))
    assert all(NAME.match(n).group(3) == ".gz" for n in names)
    for rank, doc in docs.items():
        assert doc["schemaVersion"] == 1
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, RANKS, "nccl")
        assert info["pg_config"][0]["ranks"] == list(range(RANKS))
        assert doc["deviceProperties"][0]["name"] == "NVIDIA H100 80GB HBM3"
        assert doc["deviceProperties"][0]["numSms"] == 132
        base_time = doc["baseTimeNanoseconds"]
        assert isinstance(base_time, int) and doc["displayTimeUnit"] == "ms"
        assert doc["traceName"].startswith("/tmp/tmp") and doc["traceName"].endswith(".json")
    assert truth["schema"] == "rankscope.ground_truth/1"
    assert truth["world_size"] == RANKS and truth["random_seed"] == SEED
    assert truth["steps"] == [5, 6, 7]
    assert truth["expected"]["stragglers"] == [] and truth["expected"]["findings"] == []
    assert truth["expected"]["possible_findings"] == []


def test_ground_truth_counts_equal_the_files(healthy):
    truth, docs = healthy
    per_step = truth["expected"]["collectives_per_step"]
    for rank, doc in docs.items():
        expected = truth["expected"]["per_rank"][str(rank)]
        kernels = events(doc, "kernel")
        assert expected["events"] == len(doc["traceEvents"])
        assert expected["kernel_count"] == len(kernels)
        assert expected["nccl_kernel_count"] == len(nccl_kernels(doc)) == per_step * STEPS
        assert expected["collective_count"] == sum(e["name"] == "record_param_comms" for e in events(doc, "cpu_op"))
        assert expected["memcpy_count"] == len(events(doc, "gpu_memcpy"))
        assert expected["step_time_ms"] == pytest.approx(step_durations_ms(doc), abs=1e-3)
        assert 100 <= len(kernels) / STEPS <= 300, "kernels per step per rank"
        assert all(30 <= ms <= 150 for ms in expected["step_time_ms"])


def test_healthy_ranks_differ_by_percent_not_more(healthy):
    _, docs = healthy
    compute = [busy_ms(compute_kernels(doc)) for doc in docs.values()]
    spread = (max(compute) - min(compute)) / min(compute)
    assert 0.002 < spread < 0.05, compute


# ---------------------------------------------------------------------------------------------
# Structure copied from real traces
def test_every_kernel_has_its_launch_and_flow(healthy):
    _, docs = healthy
    doc = docs[0]
    runtime = {e["args"]["correlation"]: e for e in events(doc, "cuda_runtime")}
    starts = {e["id"]: e for e in events(doc, "ac2g", ph="s")}
    finishes = {e["id"]: e for e in events(doc, "ac2g", ph="f")}
    for kernel in events(doc, "kernel") + events(doc, "gpu_memcpy"):
        corr = kernel["args"]["correlation"]
        launch = runtime[corr]
        assert launch["name"] in {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync"}
        assert launch["args"]["External id"] == kernel["args"]["External id"]
        assert launch["ts"] <= kernel["ts"]
        assert (starts[corr]["ts"], starts[corr]["tid"]) == (launch["ts"], launch["tid"])
        assert (finishes[corr]["ts"], finishes[corr]["tid"], finishes[corr]["bp"]) == (kernel["ts"], kernel["tid"], "e")
        assert kernel["pid"] == kernel["args"]["device"] == 0


def test_shapes_match_real_kineto_files(corpus, healthy):
    """Per (ph, cat): the same top-level keys as real events, and the same args keys for kernels,
    memcpys, runtime calls and [memory] events (NCCL kernels may add "Seq")."""
    real = {}
    for path in (corpus / "hta-nccl-metadata" / "nccl_data.json.gz",
                 next((corpus / "cpu-gloo-4rank-healthy").glob("rank0.*.json.gz"))):
        for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]:
            real.setdefault((e["ph"], e.get("cat")), e)
    _, docs = healthy
    ours = {}
    for e in docs[0]["traceEvents"]:
        ours.setdefault((e["ph"], e.get("cat"), e["name"].startswith("ncclDevKernel_")), e)
    for (ph, cat, is_nccl), event in ours.items():
        assert (ph, cat) in real, f"no real event of kind {(ph, cat)}"
        reference = real[(ph, cat)]
        assert set(event) == set(reference), (ph, cat)
        if cat in {"gpu_memcpy", "cuda_runtime", "cpu_instant_event"} or (cat == "kernel" and not is_nccl):
            assert set(event["args"]) == set(reference["args"]), (ph, cat)


def test_collective_args_on_record_param_comms_and_kernel(healthy):
    _, docs = healthy
    doc = docs[1]
    comms = [e for e in events(doc, "cpu_op") if e["name"] == "record_param_comms"]
    kernels = sorted(nccl_kernels(doc), key=lambda e: e["args"]["Seq"])
    assert [e["args"]["Seq"] for e in comms] == [e["args"]["Seq"] for e in kernels]
    for op, kernel in zip(comms, kernels):
        for key in ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
                    "Process Group Name", "Process Group Description", "Process Group Ranks", "Seq"):
            assert op["args"][key] == kernel["args"][key]
        assert op["args"]["Collective name"] == "allreduce" and op["args"]["dtype"] == "BFloat16"
        assert op["args"]["Process Group Ranks"] == str(list(range(RANKS)))
        assert kernel["tid"] == kernel["args"]["stream"] == 20
        assert kernel["args"]["External id"] == op["args"]["External id"]


def test_nccl_kernels_of_one_collective_end_together(healthy):
    _, docs = healthy
    ends = defaultdict(dict)
    for rank, doc in docs.items():
        for kernel in nccl_kernels(doc):
            ends[kernel["args"]["Seq"]][rank] = kernel["ts"] + kernel["dur"]
    assert len(ends) == STEPS * len(nccl_kernels(docs[0])) // STEPS
    for seq, by_rank in ends.items():
        assert sorted(by_rank) == list(range(RANKS)), seq
        assert max(by_rank.values()) - min(by_rank.values()) <= 10.0, f"collective {seq} ends {by_rank}"


def test_memory_events_balance_each_step(healthy):
    _, docs = healthy
    memory = events(docs[0], "cpu_instant_event", ph="i")
    assert memory and all(e["name"] == "[memory]" and e["args"]["Device Type"] == 1 for e in memory)
    assert sum(e["args"]["Bytes"] for e in memory) == 0
    assert all(e["args"]["Total Reserved"] >= e["args"]["Total Allocated"] > 0 for e in memory)


# ---------------------------------------------------------------------------------------------
# Injections, each against the healthy twin (same seed)
def test_host_idle_straggler_makes_the_step_longer_by_its_delay(jobs, healthy):
    _, calm = healthy
    injection = parse_injection(f"straggler:rank=2,cause=host_idle,delay_ms={DELAY_MS}")
    truth, docs = make_job(jobs, "host_idle", [injection])
    [straggler] = truth["expected"]["stragglers"]
    assert straggler == {"rank": 2, "cause": "host_idle", "injection": "straggler", "delay_ms_per_step": DELAY_MS,
                         "cost_ms_per_step": straggler["cost_ms_per_step"]}
    assert truth["expected"]["findings"] == ["straggler_rank"]
    for rank in range(RANKS):
        longer = [a - b for a, b in zip(step_durations_ms(docs[rank]), step_durations_ms(calm[rank]))]
        # The GPU still has a few ms of forward work queued when the host goes idle: it hides that much.
        assert all(0.75 * DELAY_MS < d <= DELAY_MS + 1 for d in longer), (rank, longer)
        assert longer == pytest.approx(straggler["cost_ms_per_step"], abs=0.2)
    # The others wait inside their NCCL kernels; the straggler does not.
    for rank in (0, 1, 3):
        waited = busy_ms(nccl_kernels(docs[rank])) - busy_ms(nccl_kernels(calm[rank]))
        assert waited / STEPS > 0.75 * DELAY_MS
    # The main thread is idle outside any op for the delay, between forward and backward.
    main = sorted((e for e in events(docs[2]) if e["tid"] == docs[2]["traceEvents"][0]["pid"]
                   and e["cat"] == "cpu_op"), key=lambda e: e["ts"])
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(main, main[1:])]
    assert sum(g >= DELAY_MS * 1000 for g in gaps) == STEPS


def test_dataloader_straggler_has_a_longer_next(jobs, healthy):
    _, calm = healthy
    truth, docs = make_job(jobs, "loader", [Injection("straggler", {"rank": 1, "cause": "dataloader", "delay_ms": 25})])
    assert truth["expected"]["findings"] == ["dataloader_stall", "straggler_rank"]

    def loader_ms(doc):
        return [e["dur"] / 1000 for e in events(doc, "user_annotation")
                if e["name"].startswith("enumerate(DataLoader)")]
    for rank in range(RANKS):
        extra = [a - b for a, b in zip(loader_ms(docs[rank]), loader_ms(calm[rank]))]
        assert extra == pytest.approx([25.0 if rank == 1 else 0.0] * STEPS, abs=1e-3)
    assert truth["expected"]["stragglers"][0]["cost_ms_per_step"] == pytest.approx([25.0] * STEPS, abs=1.0)


def test_gpu_compute_straggler_has_slower_kernels(jobs, healthy):
    _, calm = healthy
    truth, docs = make_job(jobs, "gpu", [parse_injection("straggler:rank=3,cause=gpu_compute,delay_ms=20")])
    for rank in range(RANKS):
        extra_ms = (busy_ms(compute_kernels(docs[rank])) - busy_ms(compute_kernels(calm[rank]))) / STEPS
        assert extra_ms == pytest.approx(20.0 if rank == 3 else 0.0, abs=1.0)
    assert min(truth["expected"]["stragglers"][0]["cost_ms_per_step"]) > 15.0


def test_no_overlap_issues_all_reduces_after_backward(jobs, healthy):
    _, calm = healthy
    truth, docs = make_job(jobs, "no_overlap", [parse_injection("no_overlap")])
    assert truth["expected"]["findings"] == ["exposed_communication", "low_overlap"]
    assert truth["expected"]["comm_overlap"] is False

    def overlapped_ms(doc):
        compute = [(e["ts"], e["ts"] + e["dur"]) for e in compute_kernels(doc)]
        total = 0.0
        for k in nccl_kernels(doc):
            start, end = k["ts"], k["ts"] + k["dur"]
            total += sum(max(0.0, min(end, b) - max(start, a)) for a, b in compute)
        return total / 1000
    for rank in range(RANKS):
        assert overlapped_ms(calm[rank]) > 5 * STEPS
        assert overlapped_ms(docs[rank]) < 0.01 * overlapped_ms(calm[rank])
        assert min(a - b for a, b in zip(step_durations_ms(docs[rank]), step_durations_ms(calm[rank]))) > 2.0


GEMM = re.compile(r"gemm", re.IGNORECASE)


def gemm_kernels(doc: dict) -> list[dict]:
    return [e for e in compute_kernels(doc) if GEMM.search(e["name"])]


def pageable_htod(doc: dict) -> list[dict]:
    return [e for e in events(doc, "gpu_memcpy") if e["name"] == "Memcpy HtoD (Pageable -> Device)"]


def test_pageable_memcpy_copies_the_batch_blocking(jobs, healthy):
    """Plain json: two HtoD copies from pageable memory per step (features of batch_mb MB, labels),
    at ~gbps, each inside a cudaMemcpyAsync that lasts until the copy is done (the driver stages
    it), then cudaStreamSynchronize, as in the real ResNet50 trace (kineto-resnet50-workers0)."""
    _, calm = healthy
    truth, docs = make_job(jobs, "pageable", [parse_injection("pageable_memcpy:batch_mb=16,gbps=5")])
    assert truth["expected"]["findings"] == ["unpinned_memcpy"] and truth["expected"]["stragglers"] == []
    for rank, doc in docs.items():
        copies = pageable_htod(doc)
        assert len(copies) == 2 * STEPS and pageable_htod(calm[rank]) == []
        assert truth["expected"]["per_rank"][str(rank)]["pageable_memcpy_count"] == sum(
            "Pageable" in e["name"] for e in events(doc, "gpu_memcpy"))
        big = [e for e in copies if e["args"]["bytes"] > 1 << 20]
        assert len(big) == STEPS and all(abs(e["args"]["bytes"] - (16 << 20)) <= 8192 * 4 for e in big)
        gbps = [e["args"]["bytes"] / e["dur"] / 1000 for e in big]
        assert all(4 < x < 6.5 for x in gbps) and 4.5 < sum(gbps) / len(gbps) < 5.5, gbps   # 5% noise per copy
        runtime = sorted(events(doc, "cuda_runtime"), key=lambda e: e["ts"])
        for copy in copies:
            i = next(i for i, e in enumerate(runtime) if e["args"]["correlation"] == copy["args"]["correlation"])
            call = runtime[i]
            assert call["name"] == "cudaMemcpyAsync" and call["ts"] + call["dur"] >= copy["ts"] + copy["dur"]
            assert runtime[i + 1]["name"] == "cudaStreamSynchronize"
        longer = [a - b for a, b in zip(step_durations_ms(doc), step_durations_ms(calm[rank]))]
        copy_ms = sum(e["dur"] for e in big) / 1000 / STEPS
        assert all(0.8 * copy_ms < d < 1.2 * copy_ms for d in longer), (longer, copy_ms)


def test_pageable_memcpy_on_one_rank_makes_it_a_memcpy_straggler(jobs):
    truth, docs = make_job(jobs, "pageable-one", [parse_injection("pageable_memcpy:rank=2,batch_mb=16,gbps=5")])
    assert [len(pageable_htod(docs[r])) for r in range(RANKS)] == [0, 0, 2 * STEPS, 0]
    [straggler] = truth["expected"]["stragglers"]
    assert (straggler["rank"], straggler["cause"], straggler["injection"]) == (2, "memcpy", "pageable_memcpy")
    assert straggler["delay_ms_per_step"] is None
    copy_ms = sum(e["dur"] for e in pageable_htod(docs[2])) / 1000 / STEPS
    assert all(0.7 * copy_ms < c < 1.05 * copy_ms for c in straggler["cost_ms_per_step"]), (straggler, copy_ms)
    assert truth["expected"]["findings"] == ["straggler_rank"]


def test_fp32_gemm_uses_cublas_sgemm_kernels_slowdown_times_slower(jobs, healthy):
    """Kernel names of cuBLAS FP32 SGEMM on CUDA cores (`sgemm`: the FP32 GEMM prefix); the same
    GEMMs as the healthy twin, `slowdown` times longer in total; aten::mm inputs in float."""
    _, calm = healthy
    truth, docs = make_job(jobs, "fp32", [parse_injection("fp32_gemm:slowdown=6")])
    assert truth["expected"]["findings"] == ["tensor_cores_unused"]
    for rank, doc in docs.items():
        gemms, twin = gemm_kernels(doc), gemm_kernels(calm[rank])
        assert len(gemms) == len(twin) > 0
        assert all("sgemm" in e["name"] and "bf16" not in e["name"] for e in gemms)
        assert all("bf16" in e["name"] for e in twin)
        assert busy_ms(gemms) / busy_ms(twin) == pytest.approx(6.0, rel=0.03)
        mm = [e for e in events(doc, "cpu_op") if e["name"] == "aten::mm"]
        assert mm and all(t == "float" for e in mm for t in e["args"]["Input type"])
    assert {e["name"] for e in gemm_kernels(docs[0])} == {
        "ampere_sgemm_128x64_tn", "ampere_sgemm_128x64_nt",
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
         "(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)")}


def test_fp32_gemm_on_one_rank_is_a_gpu_compute_straggler(jobs):
    truth, docs = make_job(jobs, "fp32-one", [parse_injection("fp32_gemm:rank=3,slowdown=4")])
    assert [any("sgemm" in e["name"] for e in gemm_kernels(docs[r])) for r in range(RANKS)] == [False] * 3 + [True]
    [straggler] = truth["expected"]["stragglers"]
    assert (straggler["rank"], straggler["cause"]) == (3, "gpu_compute")
    extra_ms = (busy_ms(gemm_kernels(docs[3])) * 3 / 4) / STEPS          # 4x slower: 3/4 of it is extra
    assert all(0.8 * extra_ms < c <= 1.02 * extra_ms for c in straggler["cost_ms_per_step"]), (straggler, extra_ms)
    assert truth["expected"]["findings"] == ["straggler_rank", "tensor_cores_unused"]


def test_uneven_shards_lengthen_only_the_batch_sized_kernels(jobs, healthy):
    """Against the healthy twin (same seed, same noise draws): the uneven rank's GEMMs (batch-sized)
    take extra_pct % longer, its optimizer kernels (parameter-sized) exactly as long; other ranks
    are unchanged."""
    _, calm = healthy
    truth, docs = make_job(jobs, "uneven", [parse_injection("uneven_shards:rank=1,extra_pct=30")])
    assert truth["expected"]["findings"] == ["straggler_rank"]
    [straggler] = truth["expected"]["stragglers"]
    assert (straggler["rank"], straggler["cause"], straggler["injection"]) == (1, "gpu_compute", "uneven_shards")

    def adam_ms(doc):
        return busy_ms([e for e in compute_kernels(doc) if "FusedAdamMathFunctor" in e["name"]])
    for rank, doc in docs.items():
        ratio = busy_ms(gemm_kernels(doc)) / busy_ms(gemm_kernels(calm[rank]))
        assert ratio == pytest.approx(1.30 if rank == 1 else 1.0, abs=0.005), rank
        assert adam_ms(doc) == pytest.approx(adam_ms(calm[rank]), rel=1e-3)
    # What rank 1 computes more per step, the others wait (most of it: GEMMs are ~55% of its compute).
    extra_ms = (busy_ms(compute_kernels(docs[1])) - busy_ms(compute_kernels(calm[1]))) / STEPS
    assert all(0.8 * extra_ms < c <= 1.02 * extra_ms for c in straggler["cost_ms_per_step"]), (straggler, extra_ms)


def test_launch_bound_splits_work_into_tiny_kernels_and_the_gpu_idles(jobs, healthy):
    """HTA's short kernel (launch call longer than the kernel it launches), counted with plain json;
    GPU busy share of the step from the kernels' union."""
    _, calm = healthy
    truth, docs = make_job(jobs, "launch", [parse_injection("launch_bound:kernels_per_op=4,kernel_us=3")])
    assert truth["expected"]["findings"] == ["launch_overhead"]
    assert "gpu_idle_host_bound" in truth["expected"]["possible_findings"]

    def busy_share(doc):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in compute_kernels(doc))
        busy, end = 0.0, float("-inf")
        for a, b in spans:
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        return busy / 1000 / sum(step_durations_ms(doc))
    for rank, doc in docs.items():
        kernels = compute_kernels(doc)
        # batch-sized ops launch 4 kernels each; the optimizer's (parameter-sized) are unchanged
        assert len(gemm_kernels(doc)) == 4 * len(gemm_kernels(calm[rank]))
        assert [e["name"] for e in kernels if "FusedAdam" in e["name"]] == [
            e["name"] for e in compute_kernels(calm[rank]) if "FusedAdam" in e["name"]]
        assert median(e["dur"] for e in kernels) == pytest.approx(3.0, rel=0.1)          # kernel_us
        launches = {e["args"]["correlation"]: e for e in events(doc, "cuda_runtime") if e["name"] == "cudaLaunchKernel"}
        short = sum(launches[k["args"]["correlation"]]["dur"] > k["dur"] for k in kernels)
        assert short / len(kernels) > 0.9
        assert busy_share(doc) < 0.3 and busy_share(calm[rank]) > 0.8


def test_clock_offset_shifts_one_rank_only(jobs, healthy):
    _, calm = healthy
    truth, docs = make_job(jobs, "clock", [parse_injection("clock_offset:rank=1,offset_ms=12.5")])
    assert truth["expected"]["clock_offsets_ms"] == {"1": 12.5}
    for rank in range(RANKS):
        shifts = {round(a["ts"] - b["ts"], 3) for a, b in zip(docs[rank]["traceEvents"], calm[rank]["traceEvents"])}
        assert shifts == {12_500.0 if rank == 1 else 0.0}


@pytest.mark.parametrize("gz", [True, False])
def test_truncated_file_is_cut_mid_event_and_its_prefix_is_valid(jobs, gz):
    folder = jobs / f"truncated-{gz}"
    truth = generate_job(folder, ranks=RANKS, steps=STEPS, seed=SEED, gzip=gz,
                         injections=[parse_injection("truncated:rank=2")])
    assert truth["expected"]["truncated_ranks"] == [2]
    for rank in range(RANKS):
        expected = truth["expected"]["per_rank"][str(rank)]
        data = (folder / expected["file"]).read_bytes()
        text = gunzip_all(data) if gz else data
        if rank != 2:
            assert len(json.loads(text)["traceEvents"]) == expected["events"]
            continue
        assert expected["truncated"] is True
        if gz:
            with pytest.raises(EOFError):
                gzip.decompress(data)
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
        cut = text.rindex(b"},\n") + 1              # end of the last complete event
        salvaged = json.loads(text[:cut] + b"]}")
        assert len(salvaged["traceEvents"]) == expected["events"]
        assert sum(e.get("cat") == "kernel" for e in salvaged["traceEvents"]) == expected["kernel_count"]


# ---------------------------------------------------------------------------------------------
# Determinism, API
def test_same_seed_same_bytes_other_seed_other_job(tmp_path):
    def files(folder):
        return {p.name: p.read_bytes() for p in folder.iterdir()}
    first = generate_job(tmp_path / "a", ranks=2, steps=2, seed=5)
    again = generate_job(tmp_path / "b", ranks=2, steps=2, seed=5)
    assert again == first
    assert files(tmp_path / "a") == files(tmp_path / "b")
    generate_job(tmp_path / "b", ranks=2, steps=2, seed=5)        # again into the same folder: replaced
    assert files(tmp_path / "a") == files(tmp_path / "b")
    other = generate_job(tmp_path / "c", ranks=2, steps=2, seed=6)
    assert other["expected"]["per_rank"]["0"]["step_time_ms"] != first["expected"]["per_rank"]["0"]["step_time_ms"]


def test_uncompressed_and_scaled_output(tmp_path):
    small = generate_job(tmp_path / "plain", ranks=2, steps=1, seed=1, gzip=False)
    big = generate_job(tmp_path / "big", ranks=2, steps=1, seed=1, gzip=False, scale=2)
    assert all(NAME.match(p.name).group(3) is None for p in (tmp_path / "plain").glob("rank*"))
    assert big["model"]["layers"] == 2 * small["model"]["layers"]
    assert big["expected"]["per_rank"]["0"]["events"] > 1.8 * small["expected"]["per_rank"]["0"]["events"]


def test_parse_injection_fills_defaults_and_types():
    assert parse_injection("straggler:rank=19,cause=dataloader,delay_ms=40") == Injection(
        "straggler", {"rank": 19, "cause": "dataloader", "delay_ms": 40.0})
    assert parse_injection(" straggler : rank=3 ") == Injection(
        "straggler", {"rank": 3, "cause": "host_idle", "delay_ms": 40.0})
    assert parse_injection("no_overlap") == Injection("no_overlap", {})
    assert parse_injection("clock_offset:rank=1,offset_ms=-3") == Injection(
        "clock_offset", {"rank": 1, "offset_ms": -3.0})
    assert parse_injection("fp32_gemm") == Injection("fp32_gemm", {"rank": "all", "slowdown": 8.0})
    assert parse_injection("launch_bound:rank=all,kernels_per_op=16") == Injection(
        "launch_bound", {"rank": "all", "kernels_per_op": 16, "kernel_us": 3.0})
    assert parse_injection("uneven_shards:rank=3,extra_pct=30") == Injection(
        "uneven_shards", {"rank": 3, "extra_pct": 30.0})
    assert parse_injection("pageable_memcpy:rank=0") == Injection(
        "pageable_memcpy", {"rank": 0, "batch_mb": 32.0, "gbps": 6.0})


@pytest.mark.parametrize("text, message", [
    ("", "unknown injection kind"),
    ("stragler:rank=1", "unknown injection kind 'stragler'"),
    ("straggler:rank", "expected key=value"),
    ("straggler:rank=1,rank=2", "given twice"),
    ("straggler:rank=1,speed=3", "unknown parameter(s) speed"),
    ("straggler:cause=dataloader", "missing parameter(s) rank"),
    ("straggler:rank=1,cause=cosmic_rays", "cause must be one of"),
    ("straggler:rank=one", "rank must be int"),
    ("straggler:rank=1,delay_ms=0", "delay_ms must be > 0"),
    ("clock_offset:rank=-1,offset_ms=2", "rank -1 out of range"),
    ("fp32_gemm:rank=some", "rank must be a rank number or 'all'"),
    ("uneven_shards:rank=all", "rank must be int"),
    ("launch_bound:kernels_per_op=0", "kernels_per_op must be >= 1"),
    ("pageable_memcpy:gbps=0", "gbps must be >= 0.1"),
])
def test_parse_injection_rejects_bad_text(text, message):
    with pytest.raises(ValueError) as error:
        parse_injection(text)
    assert message in str(error.value)


def test_generate_job_checks_injections_against_the_job(tmp_path):
    with pytest.raises(ValueError, match=r"rank 8 out of range \(job has 8 ranks\)"):
        generate_job(tmp_path, ranks=8, injections=[parse_injection("straggler:rank=8")])
    with pytest.raises(ValueError, match=r"fp32_gemm: rank 2 out of range \(job has 2 ranks\)"):
        generate_job(tmp_path, ranks=2, injections=[parse_injection("fp32_gemm:rank=2")])


def test_demo_job_is_generated_once(tmp_path):
    folder = demo_job_dir(tmp_path)
    truth, docs = load_job(folder)
    assert sorted(docs) == list(range(8))
    assert [s["rank"] for s in truth["expected"]["stragglers"]] == [5]
    stamp = (folder / "ground_truth.json").stat().st_mtime_ns
    assert demo_job_dir(tmp_path) == folder
    assert (folder / "ground_truth.json").stat().st_mtime_ns == stamp
