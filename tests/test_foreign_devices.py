"""Issue 33: device activity of other accelerators (MTIA, Intel XPU, Gaudi HPU, a device kind no
analysis reads) and JSON files that are no profiler capture.

The files are built by hand here. Their category names are the activity type names Kineto writes
(libkineto's ActivityType table: `mtia_runtime`, `mtia_ccp_events`, `mtia_insight`, `xpu_runtime`,
`hpu_op`, `kernel`, `gpu_memcpy`); their device models are the names these devices report. Every
expected figure is a hand count of the events each test lists (times in µs).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_no_traceback, copy_files, corpus_files, run_cli
from rankscope.pipelines.run import analyze_cycles
from rankscope.ingest import TraceError, read_trace


def _trace(path: Path, events: list[dict], devices: list[dict] | None = None, rank: int = 0, world: int = 1) -> Path:
    doc = {"schemaVersion": 1, "traceEvents": events,
           "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}}
    if devices is not None:
        doc["deviceProperties"] = devices
    path.write_text(json.dumps(doc))
    return path


def _host_and_device(runtime_cat: str, device_cat: str, kernels: list[tuple[str, int, int]], step_us: int = 1000,
                     memcpy_cat: str | None = None) -> list[dict]:
    """One step of `step_us` on host thread 1 (pid 10) with a cpu_op and a launch (`runtime_cat`) per
    device activity (`device_cat`, pid 0 = the device, stream 5): kernels = (name, ts, dur)."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 10, "tid": 1, "ts": 0,
           "dur": step_us}]
    for i, (name, ts, dur) in enumerate(kernels):
        cat = memcpy_cat if memcpy_cat and name.lower().startswith("memcpy") else device_cat
        ev += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 1, "ts": ts - 30, "dur": 20,
                "args": {"External id": i + 1}},
               {"ph": "X", "cat": runtime_cat, "name": "launchKernel", "pid": 10, "tid": 1, "ts": ts - 25, "dur": 5,
                "args": {"correlation": 100 + i}},
               {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 5, "ts": ts, "dur": dur,
                "args": {"correlation": 100 + i, "device": 0, "stream": 5}}]
    return ev


def _rank(result, rank: int = 0):
    return next(s for s in result.summaries if s.rank == rank)


def test_mtia_device_activity_is_analysed_and_never_cpu_only(tmp_path: Path):
    """MTIA: the on-device (CCP) events are its device activity. Hand count: kernels at 100-250,
    300-450 and 600-800 (COMP, 500 µs), a `Memcpy HtoD` at 850-900 (MEM, 50 µs) in a 1000 µs step:
    device busy 550 µs = 55%, compute 0.5 ms, memcpy 0.05 ms. One `mtia_insight` event is device
    activity of a kind no analysis reads: named, and the capture is not complete."""
    ev = _host_and_device("mtia_runtime", "mtia_ccp_events",
                          [("gemm_kernel", 100, 150), ("gemm_kernel", 300, 150), ("relu_kernel", 600, 200),
                           ("Memcpy HtoD", 850, 50)])
    ev.append({"ph": "X", "cat": "mtia_insight", "name": "insight_sample", "pid": 0, "tid": 6, "ts": 100,
               "dur": 10})
    result = analyze_cycles(_trace(tmp_path / "rank0.json", ev, [{"id": 0, "name": "MTIA T2"}]), use_cache=False)
    s = _rank(result)
    assert s.meta.device_kind == "mtia" and s.device_events == 4
    assert s.step_time.device_busy_pct == pytest.approx(55.0)
    bd = s.breakdown_mean_ms
    assert bd["compute"] == pytest.approx(0.5) and bd["memcpy"] == pytest.approx(0.05)
    assert result.job.devices == ["MTIA T2"]
    assert not any("CPU-only" in w for w in result.job.warnings)
    cap = result.job.capture
    assert cap.partial and [i.kind for i in cap.issues] == ["device_not_analysed"]
    assert "1 event on device kind mtia (categories mtia_insight), not analysed" in cap.issues[0].detail


def test_xpu_runtime_launches_and_model_name(tmp_path: Path):
    """Intel XPU: `xpu_runtime` launches (host runtime calls, linked by correlation) and `kernel` /
    `gpu_memcpy` device activity; the device kind comes from the categories, and without
    deviceProperties the device is named by its kind. Hand count: kernels 100-300 and 400-500
    (300 µs), memcpy 600-700 (100 µs) in 1000 µs: busy 40%; 3 launches."""
    ev = _host_and_device("xpu_runtime", "kernel", [("gemm_xe", 100, 200), ("softmax_xe", 400, 100),
                                                     ("Memcpy DtoH", 600, 100)], memcpy_cat="gpu_memcpy")
    result = analyze_cycles(_trace(tmp_path / "rank0.json", ev), use_cache=False)
    s = _rank(result)
    assert s.meta.device_kind == "xpu"
    assert s.step_time.device_busy_pct == pytest.approx(40.0)
    assert s.breakdown_mean_ms["compute"] == pytest.approx(0.3)
    assert s.breakdown_mean_ms["memcpy"] == pytest.approx(0.1)
    assert result.job.devices == ["XPU (device 0, no deviceProperties in the trace)"]
    assert result.job.capture.complete


@pytest.mark.parametrize("model, kind", [("GAUDI2", "hpu"), ("Intel(R) Data Center GPU Max 1550", "xpu"),
                                         ("NVIDIA H100 80GB HBM3", "cuda"), ("AMD Instinct MI300X", "rocm")])
def test_device_kind_from_the_model_name(tmp_path: Path, model: str, kind: str):
    """With host events in categories every device shares (`cpu_op`, `kernel`) and an `hpu_op`-free
    trace, the deviceProperties model names the kind. One kernel 100-600 in a 1000 µs step: 50%."""
    ev = _host_and_device("cuda_runtime" if kind in ("cuda", "rocm") else "cpu_op", "kernel", [("k", 100, 500)])
    trace = read_trace(_trace(tmp_path / "rank0.json", ev, [{"id": 0, "name": model}]))[0]
    assert trace.meta.device_kind == kind


def test_unknown_device_kind_is_named_not_cpu_only(tmp_path: Path):
    """An accelerator whose device events no analysis reads (category `npu_kernel`): 3 events named
    plainly with their device kind; the job is never called CPU-only and the capture is PARTIAL
    (exit 1), the host side still analysed."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 10, "tid": 1, "ts": 0, "dur": 1000},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 1, "ts": 10, "dur": 100}]
    ev += [{"ph": "X", "cat": "npu_kernel", "name": f"MatMul_{i}", "pid": 0, "tid": 3, "ts": 200 + 200 * i, "dur": 150}
           for i in range(3)]
    path = _trace(tmp_path / "rank0.json", ev)
    result = analyze_cycles(path, use_cache=False)
    s = _rank(result)
    assert s.meta.device_kind == "npu" and s.meta.device_other_events == 3 and s.device_events == 0
    assert not any("CPU-only" in w for w in result.job.warnings)
    (issue,) = result.job.capture.issues
    assert issue.kind == "device_not_analysed" and result.job.capture.partial
    assert "3 events on device kind npu (categories npu_kernel), not analysed" in issue.detail
    proc = run_cli(["analyze", path, "--no-cache"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 1
    assert "CPU-only" not in proc.stdout and "device activity not analysed" in proc.stdout


def _other_tool_timeline(path: Path, n: int = 600) -> Path:
    """A Chrome-trace timeline as a browser writes it: complete events in `devtools.timeline`, `v8`
    and `blink` categories, metadata events; no profiler category."""
    cats = ["devtools.timeline", "v8", "blink"]
    ev = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "CrRendererMain"}}]
    ev += [{"ph": "X", "cat": cats[i % 3], "name": f"Task{i % 7}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 8}
           for i in range(n)]
    path.write_text(json.dumps({"traceEvents": ev, "metadata": {"source": "DevTools"}}))
    return path


def test_not_a_profiler_capture_is_refused_in_one_line(tmp_path: Path):
    """600 complete events, none in a profiler category (the file written here): refused, naming its
    event count and categories; alone it exits 2. A file of metadata events only is refused too."""
    path = _other_tool_timeline(tmp_path / "timeline.json")
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value) == ("not a profiler capture: 600 complete events in categories 'blink', "
                              "'devtools.timeline', 'v8', 0 of them in a category the PyTorch profiler or Kineto "
                              "writes (a timeline from another tool?)")
    proc = run_cli(["analyze", path, "--no-cache"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2
    assert [ln for ln in proc.stderr.splitlines() if "not a profiler capture" in ln] == \
        [f"rankscope: {path}: {err.value}"]
    meta_only = tmp_path / "meta.json"
    meta_only.write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1,
                                                      "args": {"name": "x"}}] * 3}))
    with pytest.raises(TraceError, match=r"^not a profiler capture: no complete \('X'\) event, only 3 'M' events$"):
        read_trace(meta_only)


def test_a_few_profiler_events_among_many_foreign_ones_are_refused(tmp_path: Path):
    """The threshold: 1 cpu_op among 601 complete events is under 1% understood (refused); 10 among
    610 is over it (analysed, but the capture names the 600 events not understood: PARTIAL)."""
    few = json.loads(_other_tool_timeline(tmp_path / "a.json").read_text())
    few["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1, "dur": 1})
    (tmp_path / "a.json").write_text(json.dumps(few))
    with pytest.raises(TraceError, match=r"601 complete events in categories .*, 1 of them in a category"):
        read_trace(tmp_path / "a.json")
    many = dict(few, traceEvents=few["traceEvents"] + [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 100 * i, "dur": 1}
        for i in range(2, 11)])
    (tmp_path / "a.json").write_text(json.dumps(many))
    result = analyze_cycles(tmp_path / "a.json", use_cache=False)
    issue = next(i for i in result.job.capture.issues if i.kind == "events_not_recognised")
    assert result.job.capture.partial
    assert issue.detail.startswith("rank 0: 600 complete events in categories no profiler writes")


def test_refused_file_beside_good_ranks_makes_the_job_partial(corpus: Path, tmp_path: Path):
    """A real 4-rank job (corpus cpu-gloo-4rank-healthy) plus a foreign timeline in its folder: the 4
    ranks are analysed, the timeline is refused on one line, the capture is PARTIAL naming it, exit 1."""
    job = tmp_path / "job"
    copy_files(corpus_files(corpus, "cpu-gloo-4rank-healthy"), job)
    bad = _other_tool_timeline(job / "extra.json")
    proc = run_cli(["analyze", job, "--json"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["job"]["ranks"] == [0, 1, 2, 3]
    cap = out["job"]["capture"]
    assert cap["partial"] and [i["kind"] for i in cap["issues"]] == ["not_a_capture"]
    assert cap["issues"][0]["detail"].startswith(f"1 file refused as no profiler capture, not analysed: {bad}: "
                                                 f"not a profiler capture: 600 complete events")
