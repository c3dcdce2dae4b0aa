"""Issue 33: one Nsight Systems report holding several processes (`nsys profile torchrun ...`), and
the report's session start counted once.

The exports are written here with sqlite3, their tables created with the very statements of the
real export in the corpus (nsys-sqlite-h100/report1.sqlite: its `sqlite_master.sql`), so they have
the tables and columns a real export has. Expected figures are hand counts per device of the rows
each test writes (times in µs after the session start).
"""
from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import assert_no_traceback, run_cli
from rankscope.pipelines.run import analyze_cycles
from rankscope.ingest import TraceError, read_trace, read_traces

TABLES = ("StringIds", "TARGET_INFO_SESSION_START_TIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
          "NVTX_EVENTS", "TARGET_INFO_GPU", "PROCESSES")
EPOCH = 1_700_000_000_000_000_000          # 2023-11-14 22:13:20 UTC
US = 1000


def _schema(corpus: Path) -> list[str]:
    con = sqlite3.connect(f"{(corpus / 'nsys-sqlite-h100' / 'report1.sqlite').resolve().as_uri()}?mode=ro&immutable=1",
                          uri=True)
    try:
        return [con.execute("SELECT sql FROM sqlite_master WHERE name = ?", (t,)).fetchone()[0] for t in TABLES]
    finally:
        con.close()


def _export(path: Path, schema: list[str], processes: dict[int, tuple[int, list[tuple[str, int, int]]]],
            epoch: int = EPOCH) -> Path:
    """processes: pid -> (device, kernels (name, start µs, end µs)), each kernel launched 20 µs
    before it starts by a cudaLaunchKernel of 5 µs on the process's main thread; one NVTX range
    ProfilerStep#1 over 0..1000 µs per process."""
    con = sqlite3.connect(path)
    for sql in schema:
        con.execute(sql)
    names = ["ProfilerStep#1", "cudaLaunchKernel_v7000"] + sorted({k[0] for _, ks in processes.values() for k in ks})
    con.executemany("INSERT INTO StringIds (id, value) VALUES (?, ?)", list(enumerate(names)))
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME (utcEpochNs, utcTime, localTime) VALUES (?, '', '')",
                (epoch,))
    corr = 0
    for pid, (device, kernels) in processes.items():
        gpid, gtid = pid << 24, (pid << 24) | pid
        con.execute("INSERT INTO PROCESSES (globalPid, pid, name) VALUES (?, ?, 'python')", (gpid, pid))
        con.execute("INSERT INTO TARGET_INFO_GPU (vmId, id, name, smCount) VALUES (0, ?, 'NVIDIA H100 80GB HBM3', "
                    "132)", (device,))
        con.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, text, globalTid) VALUES (0, ?, 59, "
                    "'ProfilerStep#1', ?)", (1000 * US, gtid))
        for name, a, b in kernels:
            corr += 1
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, \"end\", eventClass, globalTid, correlationId,"
                        " nameId, returnValue) VALUES (?, ?, 0, ?, ?, 1, 0)",
                        ((a - 20) * US, (a - 15) * US, gtid, corr))
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, \"end\", deviceId, contextId, streamId, "
                        "correlationId, globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, "
                        "blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, "
                        "localMemoryTotal, gridId) VALUES (?, ?, ?, 1, 7, ?, ?, ?, ?, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, "
                        "0, ?)", (a * US, b * US, device, corr, gpid, names.index(name), names.index(name), corr))
    con.commit()
    con.close()
    return path


#: Two torchrun workers, one GPU each. Device 0: gemm 100-400, all_to_all 400-600, gemm 600-700 (one
#: stream: the NCCL kernel overlaps nothing of its own GPU). Device 1: gemm 300-650, all_to_all 650-800.
A2A = "ncclDevKernel_AllToAll_RING_LL"
JOB = {4242: (0, [("sm90_gemm", 100, 400), (A2A, 400, 600), ("sm90_gemm", 600, 700)]),
       4343: (1, [("sm90_gemm", 300, 650), (A2A, 650, 800)])}


def test_one_rank_per_process_with_its_own_figures(corpus: Path, tmp_path: Path):
    """Per device (hand count over the 1000 µs step): device 0 busy 600 µs (60%), compute 400, comm
    exposed 200, overlapped 0; device 1 busy 500 (50%), compute 350, exposed 150, overlapped 0.
    (Read as one rank, device 0's all_to_all 400-600 would "overlap" device 1's gemm 300-650.)"""
    path = _export(tmp_path / "job.sqlite", _schema(corpus), JOB)
    traces = read_traces(path)
    assert [(t.meta.process, t.meta.dist_rank, t.meta.device_events) for t in traces] == [(4242, 0, 3), (4343, 1, 2)]
    with pytest.raises(TraceError, match="report of 2 processes"):
        read_trace(path)
    result = analyze_cycles(path, use_cache=False)
    expected = {0: (60.0, 0.4, 0.0, 0.2), 1: (50.0, 0.35, 0.0, 0.15)}
    got = {s.rank: (s.step_time.device_busy_pct, s.breakdown_mean_ms["compute"], s.breakdown_mean_ms["comm_overlapped"],
                    s.breakdown_mean_ms["comm_exposed"]) for s in result.summaries}
    assert got.keys() == expected.keys()
    for rank, values in expected.items():
        assert got[rank] == pytest.approx(values)
        s = next(x for x in result.summaries if x.rank == rank)
        assert s.hta.overlap.overlapped_ms == pytest.approx(0.0)    # HTA's |COMM ∩ COMP|, per device: none
        assert [d["id"] for d in s.meta.devices] == [rank]
    notes = [p.problem for p in result.problems if "with device activity in this report" in p.problem]
    assert notes == ["process 4242 of 2 with device activity in this report (device 0): rank 0 from its device "
                     "index (the report names no rank)",
                     "process 4343 of 2 with device activity in this report (device 1): rank 1 from its device "
                     "index (the report names no rank)"]
    assert result.job.world_size == 2 and result.job.capture.coverage is None


def test_whole_job_report_on_the_command_line(corpus: Path, tmp_path: Path):
    path = _export(tmp_path / "job.sqlite", _schema(corpus), JOB)
    proc = run_cli(["analyze", path, "--json", "--no-cache"], tmp_path)
    assert_no_traceback(proc)
    out = json.loads(proc.stdout)
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    assert [r["gpu_busy_pct"] for r in out["ranks"]] == pytest.approx([60.0, 50.0])
    proc = run_cli(["validate", path], tmp_path)
    assert_no_traceback(proc)
    assert proc.stdout.count("nsys-sqlite") == 2


def test_one_process_report_is_one_rank_as_before(corpus: Path, tmp_path: Path):
    path = _export(tmp_path / "one.sqlite", _schema(corpus), {4242: JOB[4242]})
    trace, _ = read_trace(path)
    assert trace.meta.process is None and trace.meta.device_events == 3


def test_session_start_counted_once(corpus: Path, tmp_path: Path):
    """Two single-process reports an hour apart (session epochs written here): their time ranges are
    told apart with the dates of those epochs (2023-11-14), not dates 54 years later; the real
    report's span lies at its own session start (utcEpochNs, read with sqlite3)."""
    schema = _schema(corpus)
    (tmp_path / "a").mkdir()
    a = _export(tmp_path / "a" / "rank0.sqlite", schema, {4242: JOB[4242]})
    _export(tmp_path / "a" / "rank1.sqlite", schema, {4343: JOB[4343]}, epoch=EPOCH + 3600 * 10**9)
    assert read_trace(a)[0].meta.base_time_ns is None
    proc = run_cli(["validate", tmp_path / "a"], tmp_path)
    assert_no_traceback(proc)
    day = datetime.fromtimestamp(EPOCH / 1e9, timezone.utc).strftime("%Y-%m-%d")
    said = " ".join(proc.stdout.split())
    assert f"{day} 22:13:20 to {day} 22:13:20 UTC in rank0.sqlite" in said
    assert f"{day} 23:13:20 to {day} 23:13:20 UTC in rank1.sqlite" in said and "2082" not in said
    real = corpus / "nsys-sqlite-h100" / "report1.sqlite"
    (epoch,), = sqlite3.connect(f"{real.resolve().as_uri()}?mode=ro&immutable=1", uri=True).execute(
        "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchall()
    meta = read_trace(real)[0].meta
    assert meta.base_time_ns is None and 0 <= meta.span_ns[0] - epoch < 3600 * 10**9
