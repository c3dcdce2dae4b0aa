"""Nsight Systems SQLite exports as a trace input (issue 8 item 2).

Expected numbers come from the export itself, read with plain `sqlite3` queries written here
(row counts, summed kernel time, names through StringIds, the session epoch), never from rankscope.
Corpus: nsys-sqlite-h100/report1.sqlite (NVIDIA/Fuser, one process on an H100).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from conftest import assert_no_traceback, run_cli
from rankscope.pipelines.run import analyze_cycles
from rankscope.ingest import TraceError, load_rank, read_trace
from rankscope.ingest.cache import Cache
from rankscope.model import Kind, KernelClass

NSYS = "nsys-sqlite-h100"


@pytest.fixture(scope="module")
def report(corpus: Path) -> Path:
    path = corpus / NSYS / "report1.sqlite"
    assert path.is_file(), f"{path} missing from the corpus"
    return path


def sql(path: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def trace(report: Path):
    return read_trace(report)[0]


def _kind(trace, kind: Kind) -> pl.DataFrame:
    return trace.events.filter(pl.col("kind") == int(kind))


def test_device_activity_counts_and_kernel_time_match_sqlite(report: Path, trace):
    n_kernels, kernel_ns = sql(report, 'SELECT COUNT(*), SUM("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL')[0]
    (n_memcpy,), = sql(report, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    (n_memset,), = sql(report, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMSET")
    kernels = _kind(trace, Kind.KERNEL)
    assert kernels.height == n_kernels == 19          # MANIFEST.md: 19 kernels
    assert int(kernels["dur_ns"].sum()) == kernel_ns
    assert _kind(trace, Kind.MEMCPY).height == n_memcpy
    assert _kind(trace, Kind.MEMSET).height == n_memset
    assert trace.meta.device_events == n_kernels + n_memcpy + n_memset
    assert set(kernels["kclass"].to_list()) == {int(KernelClass.COMP)}      # no NCCL kernel in this report
    mem = trace.events.filter(pl.col("kind").is_in([int(Kind.MEMCPY), int(Kind.MEMSET)]))
    assert set(mem["kclass"].to_list()) == {int(KernelClass.MEM)}


def test_runtime_and_driver_calls_match_sqlite(report: Path, trace):
    by_class = dict(sql(report, "SELECT eventClass, COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY eventClass"))
    assert _kind(trace, Kind.RUNTIME).height == by_class[0]     # ENUM_NSYS_EVENT_CLASS 0: CUDA runtime
    assert _kind(trace, Kind.DRIVER).height == by_class[1]      # 1: CUDA driver
    names = set(pl.concat([_kind(trace, Kind.RUNTIME), _kind(trace, Kind.DRIVER)])["name"].cast(pl.String))
    raw = {n for (n,) in sql(report, "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                                     "JOIN StringIds s ON s.id = r.nameId")}
    assert names == {re.sub(r"_v\d+$", "", n) for n in raw}
    assert "cudaLaunchKernel" in names and "cudaLaunchKernel_v7000" in raw


def test_kernel_names_times_and_launch_links(report: Path, trace):
    (epoch,), = sql(report, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    expected = sorted(sql(report, 'SELECT k.start, k."end" - k.start, s.value, k.correlationId, k.streamId '
                                  "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"))
    kernels = _kind(trace, Kind.KERNEL).sort("ts_ns")
    got = list(zip((kernels["ts_ns"] - epoch).to_list(), kernels["dur_ns"].to_list(),
                   kernels["name"].cast(pl.String).to_list(), kernels["correlation"].to_list(),
                   kernels["stream"].to_list()))
    assert got == [tuple(r) for r in expected]
    # each kernel's launch: the API call with the same correlationId (plain join in the export)
    launches = dict(sql(report, "SELECT k.correlationId, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
                                "JOIN StringIds s ON s.id = r.nameId"))
    api = trace.events.filter(pl.col("kind").is_in([int(Kind.RUNTIME), int(Kind.DRIVER)]))
    linked = kernels.join(api.select("correlation", pl.col("name").cast(pl.String).alias("api")), on="correlation")
    assert dict(zip(linked["correlation"].to_list(), linked["api"].to_list())) == \
        {c: re.sub(r"_v\d+$", "", n) for c, n in launches.items()}


def test_memcpy_named_as_kineto_with_bytes(report: Path, trace):
    rows = sql(report, "SELECT bytes, copyKind, srcKind, dstKind FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    assert rows == [(1, 2, 2, 1)]     # 1 byte, DtoH (ENUM_CUDA_MEMCPY_OPER 2), Device (2) -> Pinned (1)
    memcpy = _kind(trace, Kind.MEMCPY).with_row_index("row")
    assert memcpy["name"].cast(pl.String).to_list() == ["Memcpy DtoH (Device -> Pinned)"]
    args = trace.gpu_args.join(trace.events.with_row_index("row").select(pl.col("row").cast(pl.Int64), "kind"),
                               on="row")
    assert args.filter(pl.col("kind") == int(Kind.MEMCPY))["bytes"].to_list() == [1]
    (memset_bytes,), = sql(report, "SELECT bytes FROM CUPTI_ACTIVITY_KIND_MEMSET")
    assert args.filter(pl.col("kind") == int(Kind.MEMSET))["bytes"].to_list() == [memset_bytes]


def test_nvtx_ranges_devices_and_metadata(report: Path, trace):
    (n_ranges,), = sql(report, 'SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType = 59 AND "end" IS NOT NULL')
    assert _kind(trace, Kind.USER_ANNOTATION).height == n_ranges
    gpus = sql(report, "SELECT id, name, smCount, totalMemory FROM TARGET_INFO_GPU ORDER BY id")
    assert [(d["id"], d["name"], d["numSms"], d["totalGlobalMem"]) for d in trace.meta.devices] == gpus
    assert trace.meta.format == "nsys-sqlite"
    # rank and world size: the launched process's environment as nsys captured it
    env = dict(v.split("=", 1) for (v,) in sql(report, "SELECT value FROM META_DATA_CAPTURE "
                                                       "WHERE name = 'PROCESS_0:ENVIRONMENT_VARIABLE'") if "=" in v)
    assert trace.meta.dist_rank == int(env["RANK"].strip('"')) == 0
    assert trace.meta.world_size == int(env["WORLD_SIZE"].strip('"'))
    (host,), = sql(report, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
    assert trace.meta.hostname == host


def test_cli_analyze_sqlite_json(report: Path, tmp_path: Path):
    proc = run_cli(["analyze", report, "--json", "--cache-dir", tmp_path / "cache"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    gpu_names = sorted({n for (n,) in sql(report, "SELECT name FROM TARGET_INFO_GPU")})
    assert out["job"]["devices"] == gpu_names == ["NVIDIA H100 80GB HBM3"]
    (rank,) = out["ranks"]
    assert rank["format"] == "nsys-sqlite"
    parts = rank["breakdown_ms"]
    assert set(parts) == {"compute", "comm_overlapped", "comm_exposed", "memcpy", "dataloader", "sync", "host",
                          "idle_other"}
    # no steps in this report: one step = the whole trace, whose parts sum to its duration
    assert abs(sum(parts.values()) - rank["step_time_ms"]["mean"]) <= 1e-3 * rank["step_time_ms"]["mean"]
    (kernel_ns,), = sql(report, 'SELECT SUM("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL')
    assert parts["compute"] == pytest.approx(kernel_ns / 1e6, abs=2e-3)     # one stream, kernels do not overlap


def test_cache_serves_sqlite_ranks(report: Path, tmp_path: Path):
    cache = Cache(tmp_path / "cache")
    first, hit1 = load_rank(report, cache)
    second, hit2 = load_rank(report, cache)
    assert (hit1, hit2) == (False, True)
    assert second.meta.format == "nsys-sqlite"
    for name, frame in first.frames().items():
        assert second.frames()[name].equals(frame), name


def _set_env(path: Path, name: str, value: str) -> None:
    con = sqlite3.connect(path)
    con.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE name = 'PROCESS_0:ENVIRONMENT_VARIABLE' "
                "AND value LIKE ?", (f'{name}="{value}"', f"{name}=%"))
    con.commit()
    con.close()


def test_folder_of_exports_one_rank_each(report: Path, tmp_path: Path):
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        target = job / f"report-{r}.sqlite"
        shutil.copy(report, target)
        os.chmod(target, 0o644)
        _set_env(target, "RANK", str(r))
        _set_env(target, "WORLD_SIZE", "2")
    result = analyze_cycles(job, use_cache=False, engine="inprocess")
    assert [s.rank for s in result.summaries] == [0, 1]
    assert result.job.world_size == 2 and not result.problems


def test_nvtx_step_ranges_become_steps(report: Path, tmp_path: Path):
    """Two `step_N` NVTX ranges added to a copy of the export: analyses.steps finds them."""
    path = tmp_path / "steps.sqlite"
    shutil.copy(report, path)
    os.chmod(path, 0o644)
    (tid,), = sql(report, "SELECT DISTINCT globalTid FROM NVTX_EVENTS")
    (epoch,), = sql(report, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    con = sqlite3.connect(path)
    for n, (a, b) in enumerate([(1_200_000_000, 1_500_000_000), (1_500_000_000, 1_900_000_000)], start=7):
        con.execute('INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)',
                    (a, b, f"step_{n}", tid))
    con.commit()
    con.close()
    trace = read_trace(path)[0]
    assert trace.meta.profiler_steps == 2
    assert any("step ranges" in p for p in trace.meta.problems)
    result = analyze_cycles(path, use_cache=False, engine="inprocess")
    (summary,) = result.summaries
    assert summary.steps_source == "profiler_step"
    assert [(s.step, s.start_ns - epoch) for s in summary.steps] == [(7, 1_200_000_000), (8, 1_500_000_000)]


def test_not_nsys_and_not_sqlite_one_line_errors(tmp_path: Path, report: Path):
    other = tmp_path / "bad" / "other.sqlite"
    other.parent.mkdir()
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    noise = tmp_path / "bad" / "noise.sqlite"
    noise.write_bytes(bytes(range(256)) * 40)
    for path, words in ((other, "not an nsys export"), (noise, "not an SQLite database")):
        with pytest.raises(TraceError, match=words):
            read_trace(path)
    proc = run_cli(["analyze", tmp_path / "bad", "--json", "--no-cache", "-q"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    for path, words in ((other, "not an nsys export"), (noise, "not an SQLite database")):
        mine = [ln for ln in lines if str(path) in ln]
        assert len(mine) == 1 and words in mine[0], proc.stderr


def _tiny_export(path: Path, kernels: list[tuple], runtime: list[tuple], epoch: int = 1_700_000_000_000_000_000) -> Path:
    """A minimal nsys export written here: the tables and columns the reader needs, nothing else.
    kernels: (start, end, correlationId, name); runtime: (start, end, correlationId, name)."""
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, "end" INTEGER, deviceId INTEGER,
            streamId INTEGER, correlationId INTEGER, demangledName INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, "end" INTEGER, globalTid INTEGER,
            correlationId INTEGER, nameId INTEGER, eventClass INTEGER);
    """)
    names = sorted({r[3] for r in kernels + runtime})
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(names)))
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?)", (epoch,))
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 7, ?, ?)",
                    [(a, b, c, names.index(n)) for a, b, c, n in kernels])
    gtid = (4242 << 24) | 17                       # pid 4242, tid 17
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?, 0)",
                    [(a, b, gtid, c, names.index(n)) for a, b, c, n in runtime])
    con.commit()
    con.close()
    return path


def test_unusable_times_are_dropped_and_counted(tmp_path: Path):
    """Issue 16: an event whose end lies before its start (or has no end) is dropped and counted
    per reason, as Kineto events are; never clipped to 0. Hand count of the rows written here:
    kernels 1000-3000 and 7000-9000 usable, 5000-4000 negative, 6000-NULL no duration; runtime
    900-950 and 6900-6950 usable, 2000-1990 negative."""
    epoch = 1_700_000_000_000_000_000
    path = _tiny_export(tmp_path / "rank0.sqlite",
                        kernels=[(1000, 3000, 1, "gemm"), (5000, 4000, 2, "gemm"), (6000, None, 3, "relu"),
                                 (7000, 9000, 4, "relu")],
                        runtime=[(900, 950, 1, "cudaLaunchKernel_v7000"), (2000, 1990, 2, "cudaLaunchKernel_v7000"),
                                 (6900, 6950, 4, "cudaLaunchKernel_v7000")],
                        epoch=epoch)
    trace = read_trace(path)[0]
    meta = trace.meta
    assert meta.dropped == {"dur not a number": 1, "dur negative": 2}
    assert "3 events dropped: 1 with dur not a number, 2 with dur negative" in meta.problems
    ev = trace.events.sort("ts_ns")
    assert list(zip((ev["ts_ns"] - epoch).to_list(), ev["dur_ns"].to_list(), ev["name"].cast(pl.String).to_list())) \
        == [(900, 50, "cudaLaunchKernel"), (1000, 2000, "gemm"), (6900, 50, "cudaLaunchKernel"), (7000, 2000, "relu")]
    assert (ev["dur_ns"] > 0).all() and meta.device_events == 2
    assert meta.span_ns == (epoch + 900, epoch + 9000)

    # every event unusable: one line, and the other rank of the job is still analysed
    bad = _tiny_export(tmp_path / "rank1.sqlite", kernels=[(5000, 4000, 1, "gemm")], runtime=[], epoch=epoch)
    with pytest.raises(TraceError, match=r"no event with a usable start and duration \(1 dropped: 1 with dur negative\)"):
        read_trace(bad)
    proc = run_cli(["analyze", path, bad, "--json", "--no-cache", "-q"], tmp_path)
    assert_no_traceback(proc)
    out = json.loads(proc.stdout)
    assert [r["rank"] for r in out["ranks"]] == [0]
    assert [ln for ln in proc.stderr.splitlines() if str(bad) in ln][0].endswith("1 with dur negative)")
