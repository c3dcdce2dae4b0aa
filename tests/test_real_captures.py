"""Real captures misread (issue 16, class B): each case a hand count on a small trace written here
(tracebuilder), or a figure counted from a real capture read with plain json / sqlite / pickle.
Each test says where its expected values come from.
"""
from __future__ import annotations

import gzip
import json

import pytest

from rankscope.analyses.rank.breakdown import step_breakdown
from rankscope.analyses.rank.gaps import idle_gaps
from rankscope.ingest.kineto import read_kineto
from rankscope.pipelines.run import analyze_cycles
from tracebuilder import TraceBuilder


# ----------------------------------------------------------------------------------------------
# 1. Python time recorded only as python_function events (with_stack=True) is host work
def _python_then_kernel(tmp_path, sleep: bool = False):
    """One step 0..1000 µs. Hand layout (µs): 0..200 only python_function events on the host (an
    outer frame 0..200 and a nested one 20..180; with `sleep`, 50..150 of it is a
    `<built-in function sleep>`); the launch at 200 (1 µs); the kernel 210..1000."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("train.py(40): train_step", 0, 200, cat="python_function")
    b.op("model.py(12): prepare_batch", 20, 160, cat="python_function")
    if sleep:
        b.op("<built-in function sleep>", 50, 100, cat="python_function")
    b.kernel("sm80_xmma_gemm_bf16", 200, 210, 790)
    return read_kineto(b.write(tmp_path / "rank0.json"))[0]


def test_python_function_time_is_host_not_idle(tmp_path):
    row = step_breakdown(_python_then_kernel(tmp_path)).frame.row(0, named=True)
    # hand count: device idle 0..210; the host is in Python 0..200 and in the launch 200..201 -> host
    # 201 µs; 201..210 nothing recorded -> idle_other 9 µs; the kernel 210..1000 -> compute 790 µs
    assert row["host"] == pytest.approx(0.201)
    assert row["idle_other"] == pytest.approx(0.009)
    assert row["compute"] == pytest.approx(0.790)


def test_python_sleep_stays_idle(tmp_path):
    row = step_breakdown(_python_then_kernel(tmp_path, sleep=True)).frame.row(0, named=True)
    # hand count: the sleep 50..150 (100 µs) is the host waiting, not working: idle_other 100 + 9 µs
    assert row["host"] == pytest.approx(0.101)
    assert row["idle_other"] == pytest.approx(0.109)


def test_python_gap_names_the_python_function(tmp_path):
    """Hand layout (µs), one step 0..1000: kernel 10..50 (launched at 0); Python 60..300 (outer frame
    60..300, nested 100..280); the launch at 300; kernel 310..1000."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("sm80_xmma_gemm_bf16", 0, 10, 40)
    b.op("train.py(40): train_step", 60, 240, cat="python_function")
    b.op("model.py(12): prepare_batch", 100, 180, cat="python_function")
    b.kernel("sm80_xmma_gemm_bf16", 300, 310, 690)
    gaps = idle_gaps(read_kineto(b.write(tmp_path / "rank0.json"))[0])
    # the one gap >= 100 µs: 50..310 (260 µs): host (Python 60..300 + launch 300..301) 241 µs, idle 19 µs
    assert gaps.gaps == 1
    g = gaps.top[0]
    assert g.duration_ms == pytest.approx(0.260)
    assert g.host_activity == "host"
    assert g.host_ms["host"] == pytest.approx(0.241)
    # no CPU op runs in the gap: the Python function with the most time of its own in it is named
    # (issue 33): prepare_batch 100..280 (180 µs) over train_step's own 60..100 and 280..300 (60 µs)
    assert g.busy_host_op == "model.py(12): prepare_batch"


def test_python_time_straggler_cause_is_cpu_ops(tmp_path):
    from rankscope.api import analyze
    # hand-made 4-rank job, 6 steps of 100 ms. Every rank: a 10 ms kernel, then an all-reduce. Rank 1
    # first spends 40 ms in Python (python_function events only), so it arrives 40 ms late each step;
    # that time is host work (cpu_ops), not host_idle
    for rank in range(4):
        b = TraceBuilder(rank=rank, world_size=4)
        for step in range(6):
            t0, late = step * 100_000, (40_000 if rank == 1 else 0)
            b.step(step + 1, t0, 100_000)
            if late:
                b.op("train.py(55): preprocess", t0, late, cat="python_function")
            b.kernel("sm80_xmma_gemm_bf16", t0 + late, t0 + late + 10, 10_000)
            arrive = t0 + late + 10_010
            b.op("nccl:all_reduce", arrive - 5, 3)
            b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", arrive - 5, arrive, t0 + 55_010 - arrive, stream=20)
        b.write(tmp_path / f"rank{rank}.json")
    a = analyze_cycles(tmp_path, use_cache=False, engine="inprocess")
    by_rank = {s.rank: s for s in a.summaries}
    # the Python 0..40 ms of each step and the 1 µs launch right after it (device idle until +10 µs)
    assert by_rank[1].breakdown_mean_ms["host"] == pytest.approx(40.001)
    (f,) = [f for f in a.findings if f.id == "straggler_rank"]
    assert f.ranks == [1] and "(cpu_ops)" in f.summary and "host_idle" not in f.summary

# ----------------------------------------------------------------------------------------------
# 2. Devices named from the device events when the trace has no deviceProperties
def _without_device_properties(path):
    doc = json.loads(path.read_text())
    del doc["deviceProperties"]
    path.write_text(json.dumps(doc))
    return path


def test_devices_from_device_events_without_device_properties(tmp_path):
    from rankscope.api import analyze
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("sm80_xmma_gemm_bf16", 10, 20, 500)          # written on device 0 (tracebuilder)
    path = _without_device_properties(b.write(tmp_path / "rank0.json"))
    a = analyze(path, use_cache=False, engine="inprocess")
    # the file (as written above) has one kernel, on device 0, and no deviceProperties
    assert a.job.devices == ["GPU (device 0, no deviceProperties in the trace)"]


def test_devices_named_when_device_properties_present(tmp_path):
    from rankscope.api import analyze
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("sm80_xmma_gemm_bf16", 10, 20, 500)
    a = analyze(b.write(tmp_path / "rank0.json"), use_cache=False, engine="inprocess")
    assert a.job.devices == ["Test GPU"]                    # tracebuilder's deviceProperties name


def test_hta_sampled_gpu_job_is_not_cpu_only(corpus):
    from rankscope.api import analyze
    folder = corpus / "hta-sampled-2rank"
    ids = set()
    for f in sorted(folder.glob("*.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        assert "deviceProperties" not in doc                # plain json: the files have none
        ids |= {e["args"]["device"] for e in doc["traceEvents"]
                if e.get("cat") == "kernel" and "device" in e.get("args", {})}
    a = analyze(folder, use_cache=False, engine="inprocess")
    assert len(a.job.devices) == 1
    text = a.job.devices[0]
    assert "no deviceProperties" in text and "CPU only" not in text
    lo, hi = min(ids), max(ids)
    assert (f"device {lo}," if lo == hi else f"devices {lo}..{hi},") in text


# ----------------------------------------------------------------------------------------------
# 3. Fragmentation is judged when allocated memory peaks
MiB = 1 << 20


def _memory_trace(tmp_path, samples):
    """A GPU step 0..1000 µs with a kernel, and `[memory]` samples (ts µs, allocated MiB, reserved MiB)
    of cuda:0 on an 8 GiB device."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("sm80_xmma_gemm_bf16", 5, 10, 980)
    for ts, alloc, res in samples:
        b.events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": b.pid,
                         "tid": b.tid, "ts": ts, "args": {"Total Allocated": alloc * MiB, "Total Reserved": res * MiB,
                                                          "Bytes": 0, "Device Id": 0, "Device Type": 1, "Addr": 1}})
    path = b.write(tmp_path / "rank0.json")
    doc = json.loads(path.read_text())
    doc["deviceProperties"][0]["totalGlobalMem"] = 8192 * MiB
    path.write_text(json.dumps(doc))
    return path


def test_fragmentation_at_peak_allocated_not_after_it(tmp_path):
    from rankscope.analyses.rank.memory import memory_timeline
    from rankscope.api import analyze
    # hand-made: allocated peaks at t=200 (4200 MiB, 4293 reserved: 93 MiB cached free, 2.2%); then
    # the activations are freed and the pool grows once more: t=400 300 allocated of 4365 reserved
    # (4065 MiB, 93% cached free: what the old "at peak reserved" rule reported).
    path = _memory_trace(tmp_path, [(100, 1000, 1024), (200, 4200, 4293), (300, 2000, 4293), (400, 300, 4365)])
    trace = read_kineto(path)[0]
    (gpu,) = memory_timeline(trace).devices
    assert gpu.peak_allocated_mb == 4200.0 and gpu.peak_reserved_mb == 4365.0
    assert gpu.reserved_at_peak_allocated_mb == 4293.0
    assert gpu.fragmentation_mb == 93.0                                  # 4293 - 4200
    assert gpu.fragmentation_pct == pytest.approx(100 * 93 / 4293)       # 2.17%
    a = analyze(path, use_cache=False, engine="inprocess")
    assert "memory_fragmentation" not in {f.id for f in a.findings}


def test_fragmentation_finding_says_its_definition(tmp_path):
    from rankscope.api import analyze
    # hand-made: allocated peaks at t=200 with 1000 MiB of 3000 reserved: 2000 MiB (66.7%) cached free
    path = _memory_trace(tmp_path, [(100, 500, 3000), (200, 1000, 3000), (300, 200, 3000)])
    a = analyze(path, use_cache=False, engine="inprocess")
    (f,) = [f for f in a.findings if f.id == "memory_fragmentation"]
    assert "2000 MB (67%) of the 3000 MB reserved" in f.summary
    assert "reserved - allocated at peak allocated" in f.summary
    ev = f.evidence["0"]                 # the evidence as JSON has it: ranks as keys
    assert ev["fragmentation_mb"] == 2000.0 and ev["reserved_at_peak_allocated_mb"] == 3000.0
    assert ev["fragmentation_pct_of_reserved"] == pytest.approx(66.7)


# ----------------------------------------------------------------------------------------------
# 6. Memory snapshots: fragmentation judged (at peak allocated where the history allows) with a verdict
def test_snapshot_fragmentation_judged_at_peak_allocated(corpus):
    import pickle
    from rankscope.analyses.inputs.memory_snapshot import analyze_snapshot
    from rankscope.findings.inputs import memory_snapshot_findings
    from rankscope.ingest.memory_snapshot import read_memory_snapshot
    path = corpus / "memory-snapshot-1gpu" / "memory_snapshot.pickle"
    raw = pickle.loads(path.read_bytes())       # plain pickle: the file holds only builtins
    # hand replay, anchored at the end: allocated at the end = the live blocks; walk back the trace
    events = raw["device_traces"][0]
    live_end = sum(b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    deltas = [e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
              for e in events]
    level = live_end - sum(deltas)
    peak = level
    for d in deltas:
        level += d
        peak = max(peak, level)
    assert not any(e["action"].startswith("segment") for e in events)   # the pool never changed in the window
    reserved = sum(s["total_size"] for s in raw["segments"])
    j = analyze_snapshot(read_memory_snapshot(path)).devices[0].judged
    assert j.at == "peak_allocated"
    assert j.reserved == reserved
    # trace events carry requested sizes, blocks rounded ones: the replays agree within 4 KiB
    assert abs(j.free_cached - (reserved - peak)) < 4096
    assert j.pct_of_reserved == pytest.approx(100 * (reserved - peak) / reserved, abs=0.01)   # ~1.8%
    # 241 MB (1.8%) of the pool free at the peak: under the 30% / 512 MB bar, no finding
    assert memory_snapshot_findings([analyze_snapshot(read_memory_snapshot(path))]) == []


def _snapshot(tmp_path, total_mib: int, allocated_mib: int, expandable: bool = False):
    import pickle
    snap = {"segments": [{"device": 0, "address": 0, "total_size": total_mib * MiB,
                          "allocated_size": allocated_mib * MiB, "segment_type": "large", "stream": 0, "blocks": [
                              {"address": 0, "size": allocated_mib * MiB, "requested_size": allocated_mib * MiB,
                               "state": "active_allocated", "frames": []},
                              {"address": allocated_mib * MiB, "size": (total_mib - allocated_mib) * MiB,
                               "requested_size": 0, "state": "inactive", "frames": []}]}],
            "device_traces": [[]],
            "allocator_settings": {"expandable_segments": expandable, "PYTORCH_CUDA_ALLOC_CONF": ""}}
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


def test_snapshot_fragmentation_finding_without_history(tmp_path):
    from rankscope.analyses.inputs.memory_snapshot import analyze_snapshot
    from rankscope.findings.inputs import memory_snapshot_findings
    from rankscope.ingest.memory_snapshot import read_memory_snapshot
    # hand-made: one 2048 MiB segment, 512 MiB allocated, no allocation history -> judged at the
    # snapshot: 1536 MiB free = 75% of reserved (>= 30% and >= 512 MB)
    report = analyze_snapshot(read_memory_snapshot(_snapshot(tmp_path, 2048, 512)))
    (f,) = memory_snapshot_findings([report])
    assert f.id == "memory_fragmentation" and f.severity == "medium"
    assert "1536 MB (75%) of the 2048 MB reserved" in f.summary and "at the snapshot" in f.summary
    assert f.evidence["devices"]["cuda:0"]["judged_at"] == "snapshot"
    assert "expandable_segments:True" in f.fix and "empty_cache" in f.fix
    assert f.threshold == {"fragmentation_pct": 30.0, "fragmentation_min_mb": 512.0}
    # under the bar: 2048 MiB with 1600 allocated -> 448 MiB (21.9%)
    assert memory_snapshot_findings([analyze_snapshot(read_memory_snapshot(_snapshot(tmp_path, 2048, 1600)))]) == []


def test_snapshot_fragmentation_fix_when_expandable_segments_on(tmp_path):
    from rankscope.analyses.inputs.memory_snapshot import analyze_snapshot
    from rankscope.findings.inputs import memory_snapshot_findings
    from rankscope.ingest.memory_snapshot import read_memory_snapshot
    report = analyze_snapshot(read_memory_snapshot(_snapshot(tmp_path, 2048, 512, expandable=True)))
    (f,) = memory_snapshot_findings([report])
    assert "already on" in f.fix and "expandable_segments:True" not in f.fix


# ----------------------------------------------------------------------------------------------
# 7. An NCCL environment setting that differs between the healthy and the degraded run is named
def _env_lines(path) -> dict[str, str]:
    """NCCL_* settings of a log read with a plain regex over its lines."""
    import re
    out = {}
    for line in path.read_text(errors="replace").splitlines():
        m = re.search(r"NCCL INFO (NCCL_\w+) set by environment to (.*)$", line)
        if m:
            out.setdefault(m[1], m[2].strip())
    return out


def test_nccl_env_difference_named_in_findings(corpus):
    from rankscope.api import analyze_nccl_logs
    healthy, faulty = corpus / "nccl-logs-2xA100" / "nccl.log", corpus / "nccl-logs-2xA100" / "nccl-fault.log"
    env_ok, env_bad = _env_lines(healthy), _env_lines(faulty)
    only_bad = sorted(set(env_bad) - set(env_ok))
    assert only_bad == ["NCCL_TOPO_FILE"]                 # plain read of the two logs
    topo = env_bad["NCCL_TOPO_FILE"]
    result = analyze_nccl_logs([healthy, faulty])
    bad_run = next(r for r in result.report.runs if r.file == str(faulty))
    assert [(d.name, d.change, d.value) for d in bad_run.env_vs_reference if not d.diagnostic] == \
        [("NCCL_TOPO_FILE", "set_only_here", topo)]
    judged = [f for f in result.findings if f.evidence.get("file") == str(faulty)]
    assert {f.id for f in judged} == {"low_bus_bandwidth", "degraded_nccl_link"}
    for f in judged:
        assert "NCCL_TOPO_FILE is set only in the degraded run" in f.fix and topo in f.fix
        assert "check or unset it" in f.fix
        assert f.evidence["env_differences"] == [{"name": "NCCL_TOPO_FILE", "change": "set_only_here", "value": topo,
                                                  "reference_value": None, "reference_from": str(healthy)}]


def test_nccl_env_same_in_both_runs_names_nothing(tmp_path, corpus):
    from rankscope.api import analyze_nccl_logs
    # the healthy log against a copy of itself with NCCL_DEBUG_FILE added (logging only): no env cause
    healthy = corpus / "nccl-logs-2xA100" / "nccl.log"
    text = healthy.read_text(errors="replace").splitlines(keepends=True)
    at = next(i for i, line in enumerate(text) if "set by environment to" in line)
    prefix = text[at].split("NCCL INFO")[0]
    copy = tmp_path / "again.log"
    copy.write_text("".join(text[:at] + [f"{prefix}NCCL INFO NCCL_DEBUG_FILE set by environment to x.%h.%p\n"]
                            + text[at:]))
    result = analyze_nccl_logs([healthy, copy])
    run = next(r for r in result.report.runs if r.file == str(copy))
    assert [(d.name, d.diagnostic) for d in run.env_vs_reference] == [("NCCL_DEBUG_FILE", True)]
    assert all("env_differences" not in f.evidence or f.evidence["env_differences"] == [] for f in result.findings)


# ----------------------------------------------------------------------------------------------
# 4. A device idle almost all the time gets a finding, with GPU busy % and the longest idle gap
def test_nsys_mostly_idle_gpu_gets_a_finding(corpus):
    import sqlite3
    from rankscope.api import analyze
    path = corpus / "nsys-sqlite-h100" / "report1.sqlite"
    # plain sqlite: the device intervals (kernels, memcpy, memset), their union, the longest gap in it
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    spans = sorted(row for t in ("KERNEL", "MEMCPY", "MEMSET")
                   for row in db.execute(f"SELECT start, end FROM CUPTI_ACTIVITY_KIND_{t}"))
    db.close()
    merged = [list(spans[0])]
    for a, b in spans[1:]:
        if a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    longest_ms = max(b2[0] - b1[1] for b1, b2 in zip(merged, merged[1:])) / 1e6
    busy_ns = sum(b - a for a, b in merged)
    a = analyze(path, use_cache=False, engine="inprocess")
    (f,) = [f for f in a.findings if f.id == "gpu_idle_host_bound"]
    assert f.severity == "high"
    step_ms = f.evidence["step_ms"]
    assert f.evidence["gpu_busy_pct"]["0"] == pytest.approx(100 * busy_ns / 1e6 / step_ms, abs=0.01)   # ~0.05%
    gap = f.evidence["longest_idle_gap"]
    assert gap["duration_ms"] == pytest.approx(longest_ms, abs=1e-3)                                 # ~351 ms
    assert gap["host_op_most_present"] == "KernelExecutor::compileFusion"
    assert "busy only 0.1% of each step" in f.summary and "351.1 ms" in f.summary
    assert "steady-state" in f.fix


def test_mostly_idle_gpu_hand_made(tmp_path):
    from rankscope.api import analyze
    # hand-made: one step 0..100 ms; kernels 0.01..1.01 ms and 99..100 ms; between them the host is
    # outside any op. GPU busy = 2 ms of 100 = 2% (< 10%); the one gap 1.01..99 ms = 97.99 ms
    b = TraceBuilder()
    b.step(1, 0, 100_000)
    b.kernel("sm80_xmma_gemm_bf16", 0, 10, 1000)
    b.kernel("sm80_xmma_gemm_bf16", 98_990, 99_000, 1000)
    a = analyze(b.write(tmp_path / "rank0.json"), use_cache=False, engine="inprocess")
    (f,) = [f for f in a.findings if f.id == "gpu_idle_host_bound"]
    assert f.evidence["gpu_busy_pct"] == {"0": pytest.approx(2.0)}
    assert f.evidence["longest_idle_gap"]["duration_ms"] == pytest.approx(97.99)
    assert f.evidence["longest_idle_gap"]["host_activity"] == "idle_other"
    assert "torch.compile" in f.fix                     # eager kernels: compiling is advised


def test_busy_gpu_gets_no_mostly_idle_finding(tmp_path):
    from rankscope.api import analyze
    # hand-made: kernels 0.01..80 ms of a 100 ms step: busy 80%, nothing to say
    b = TraceBuilder()
    b.step(1, 0, 100_000)
    b.kernel("sm80_xmma_gemm_bf16", 0, 10, 79_990)
    a = analyze(b.write(tmp_path / "rank0.json"), use_cache=False, engine="inprocess")
    assert "gpu_idle_host_bound" not in {f.id for f in a.findings}


# ----------------------------------------------------------------------------------------------
# 5. Triton-generated kernels: torch.compile is not advised
def test_triton_kernels_get_no_torch_compile_advice(corpus):
    from rankscope.api import analyze
    path = corpus / "hta-triton" / "triton_example.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    kernels = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and all(k.startswith("triton_") for k in kernels)     # plain json: all Inductor kernels
    a = analyze(path, use_cache=False, engine="inprocess")
    st = a.ranks[0].kernels.stats     # as the report shows it
    assert st.generated_kernel_pct == pytest.approx(100.0) and st.generated_kernel_count_pct == pytest.approx(100.0)
    advised = [f for f in a.findings if f.id in ("launch_overhead", "gpu_idle_host_bound")]
    assert {f.id for f in advised} == {"launch_overhead", "gpu_idle_host_bound"}
    for f in advised:
        assert "torch.compile" not in f.fix
        assert "reduce-overhead" in f.fix and "compile" in f.fix   # CUDA graphs via mode="reduce-overhead"


def test_generated_kernel_share_counts_triton_names(tmp_path):
    from rankscope.analyses.rank.kernels import kernel_stats
    # hand-made: 3 Triton kernels (10 + 20 + 30 µs) and 1 cuBLAS kernel (140 µs):
    # by time 60 / 200 = 30%, by count 3 / 4 = 75%
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("triton_poi_fused_add_0", 0, 10, 10)
    b.kernel("triton_red_fused_sum_1", 20, 30, 20)
    b.kernel("triton_per_fused_softmax_2", 60, 70, 30)
    b.kernel("sm80_xmma_gemm_bf16", 110, 120, 140)
    st = kernel_stats(read_kineto(b.write(tmp_path / "rank0.json"))[0])
    assert st.generated_kernel_pct == pytest.approx(30.0)
    assert st.generated_kernel_count_pct == pytest.approx(75.0)


def test_snapshot_terminal_shows_the_finding_and_its_fix(tmp_path):
    from rich.console import Console
    from rankscope.analyses.inputs.memory_snapshot import analyze_snapshot
    from rankscope.findings.inputs import memory_snapshot_findings
    from rankscope.ingest.memory_snapshot import read_memory_snapshot
    from rankscope.render.base import render
    from rankscope.results import MemoryResult
    report = analyze_snapshot(read_memory_snapshot(_snapshot(tmp_path, 2048, 512)))
    result = MemoryResult([report], [])
    result.findings = memory_snapshot_findings([report])     # what the memory pipeline hands the renderer
    console = Console(width=80, record=True, color_system=None)
    render(result, "terminal", console)
    text = " ".join(console.export_text().split())
    assert "fragmentation at the snapshot (peak unknown): 1,536.0 MB cached but not allocated, 75.0% of the " \
           "2,048.0 MB reserved then" in text
    assert "MEDIUM memory_fragmentation" in text and "expandable_segments:True" in text
