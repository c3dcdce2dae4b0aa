"""Nsight Systems SQLite export (`nsys export --type sqlite`) -> RankTrace, the same frames the
Kineto reader builds, so every per-rank and cross-rank analysis runs on it unchanged.

Tables read (each one optional: the schema varies by nsys version, so a missing table or column
is read as absent, never an error):
  CUPTI_ACTIVITY_KIND_KERNEL   kernels: name (StringIds; demangled, else short, else mangled),
                               start/end, deviceId, streamId, correlationId, grid, block,
                               registers, static + dynamic shared memory
  CUPTI_ACTIVITY_KIND_MEMCPY   named as Kineto does: "Memcpy HtoD (Pageable -> Device)"; bytes
  CUPTI_ACTIVITY_KIND_MEMSET   "Memset (Device)"; bytes
  CUPTI_ACTIVITY_KIND_SYNCHRONIZATION   device-side waits (kind SYNC): "Stream Sync", ...
  CUPTI_ACTIVITY_KIND_RUNTIME  CUDA runtime (eventClass 0) and driver (1) calls. The ABI suffix is
                               dropped (`cudaLaunchKernel_v7000` -> `cudaLaunchKernel`, Kineto's
                               name). correlationId = the launched activity's correlationId.
  NVTX_EVENTS                  push/pop and start/end ranges -> user annotations. Step ranges:
                               `ProfilerStep#N` as is; where there is none, `step_N` / `step N` /
                               `iteration N` / `train_step N` ranges are renamed `ProfilerStep#N`
                               (said in the rank's problems) so analyses.steps finds them.
  TARGET_INFO_GPU              -> RankMeta.devices with Kineto's deviceProperties keys
  TARGET_INFO_SESSION_START_TIME  times are ns since the session start; adding the session's
                               epoch gives epoch ns like Kineto's (comparable across files)
  ThreadNames, PROCESSES, TARGET_INFO_SYSTEM_ENV (Hostname), META_DATA_CAPTURE (the launched
  process's environment: RANK / WORLD_SIZE, or OMPI_COMM_WORLD_RANK / _SIZE -> dist_rank,
  world_size; without them the rank comes from the file name like any trace)
Host events: pid/tid decoded from globalTid (bits 24-47 pid, 0-23 tid); device events: pid =
device, tid = stream, as in Kineto traces. An event whose start or duration is unusable (NULL, end
before start, over a day...) is dropped and counted per reason, as the Kineto reader does.

Bounded: the file is untrusted, and a table read above may be a view that never ends (WITH
RECURSIVE). Each query has a time limit (`query_time_limit_s`: 30 s + 1 s per 10 MB of file, or
$RANKSCOPE_SQLITE_TIME_LIMIT_S) and may return at most one row per 8 bytes of the file (a stored row
takes more); past either, the file is refused with one line. Ctrl-C stops a query at once.
"""
from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path

import numpy as np
import polars as pl

from rankscope.ingest.discover import checked_rank, open_regular
from rankscope.ingest.errors import TraceError
from rankscope.ingest.kineto import MAX_DUR_NS, MAX_TS_NS, TIME_REASONS, _main_run, _mark
from rankscope.model import (DEVICE_KINDS, PROFILER_STEP_PATTERN, KernelClass, Kind, RankMeta, RankTrace,
                             event_kernel_classes)

SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_SUFFIXES = (".sqlite", ".sqlite3")
#: Tables that make an SQLite file an Nsight Systems export (any one of them).
NSYS_MARK_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "TARGET_INFO_GPU",
                    "StringIds")
#: NVTX_EVENTS.eventType of ranges (ENUM_NSYS_EVENT_TYPE): push/pop, start/end, and their Nvtxt twins.
NVTX_RANGE_TYPES = (59, 60, 70, 71)
#: NVTX names read as steps when the trace has no ProfilerStep#N: step_12, step 12, iteration 12, train_step 12
#: (at most 18 digits after leading zeros, as PROFILER_STEP_PATTERN).
NVTX_STEP_PATTERN = r"^(?:train[_ ]?)?(?:step|iteration|iter)[ _#:=-]*0*(\d{1,18})$"
_API_SUFFIX = re.compile(r"_v\d+$")
#: Time limit of one query: this, plus 1 s per QUERY_BYTES_PER_S of file; env RANKSCOPE_SQLITE_TIME_LIMIT_S sets it.
QUERY_TIME_LIMIT_S = 30.0
QUERY_BYTES_PER_S = 10 << 20
#: A query may return at most one row per this many bytes of the file (a stored row takes more).
MIN_ROW_BYTES = 8
_PROGRESS_STEPS = 10_000       # SQLite VM steps between two looks at the clock (and at Ctrl-C)

#: ENUM_CUDA_MEMCPY_OPER / ENUM_CUDA_MEM_KIND / ENUM_CUPTI_SYNC_TYPE, spelled as Kineto names them.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
MEMORY_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
                6: "Managed Static"}
SYNC_TYPES = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}

#: TARGET_INFO_GPU column -> deviceProperties key (what analyses.kernels / memory read).
GPU_PROPERTIES = {"id": "id", "name": "name", "totalMemory": "totalGlobalMem", "computeMajor": "computeMajor",
                  "computeMinor": "computeMinor", "smCount": "numSms", "threadsPerWarp": "warpSize",
                  "maxThreadsPerBlock": "maxThreadsPerBlock", "maxRegistersPerBlock": "regsPerBlock",
                  "maxRegistersPerSm": "regsPerMultiprocessor", "maxShmemPerBlock": "sharedMemPerBlock",
                  "maxShmemPerBlockOptin": "sharedMemPerBlockOptin", "maxShmemPerSm": "sharedMemPerMultiprocessor",
                  "busLocation": "busLocation", "uuid": "uuid", "memoryBandwidth": "memoryBandwidth",
                  "clockRate": "clockRate"}
RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK")
WORLD_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")

_EVENT_COLUMNS = ("kind", "name", "ts_ns", "dur_ns", "pid", "tid", "device", "stream", "correlation")
_GPU_ARGS = ("grid_blocks", "block_threads", "registers_per_thread", "shared_memory_bytes", "bytes")
_EMPTY = {
    "comm_args": {"row": pl.Int64, "collective": pl.Categorical, "in_msg_nelems": pl.Int64,
                  "out_msg_nelems": pl.Int64, "in_split_size": pl.Categorical, "out_split_size": pl.Categorical,
                  "group_size": pl.Int64, "dtype": pl.Categorical, "pg_name": pl.Categorical,
                  "pg_desc": pl.Categorical, "pg_ranks": pl.Categorical, "seq": pl.Int64},
    "op_args": {"row": pl.Int64, "input_dims": pl.Categorical, "input_types": pl.Categorical,
                "call_stack": pl.Categorical, "sequence_number": pl.Int64, "fwd_thread_id": pl.Int64,
                "flops": pl.Float64, "python_id": pl.Int64, "python_parent_id": pl.Int64},
    "memory": {"ts_ns": pl.Int64, "bytes": pl.Int64, "total_allocated": pl.Int64, "total_reserved": pl.Int64,
               "device_type": pl.Int64, "device_id": pl.Int64, "addr": pl.Int64},
    "flows": {"phase": pl.Categorical, "cat": pl.Categorical, "id": pl.Int64, "ts_ns": pl.Int64,
              "pid": pl.Int64, "tid": pl.Int64},
}


def is_sqlite(path: str | Path) -> bool:
    try:
        with open_regular(path) as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def query_time_limit_s(size: int) -> float:
    """Seconds one query of a file of `size` bytes may run."""
    env = os.environ.get("RANKSCOPE_SQLITE_TIME_LIMIT_S", "")
    try:
        return float(env)
    except ValueError:
        return QUERY_TIME_LIMIT_S + size / QUERY_BYTES_PER_S


def read_nsys_sqlite(path: str | Path, time_limit_s: float | None = None) -> tuple[RankTrace, dict]:
    """Parse one nsys SQLite export. Returns the RankTrace (rank not yet assigned, like
    read_kineto) and a header dict (`env`: RANK etc. when captured). Raises TraceError.
    `time_limit_s`: of each query (default `query_time_limit_s`)."""
    path = Path(path)
    try:
        with open_regular(path) as f:
            magic, size = f.read(len(SQLITE_MAGIC)), os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    if magic != SQLITE_MAGIC:
        raise TraceError("empty file" if size == 0 else
                         "not an SQLite database (expected an Nsight Systems export: nsys export --type sqlite)")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as exc:
        raise TraceError(f"cannot open the SQLite database ({exc})") from None
    try:
        limit = time_limit_s if time_limit_s is not None else query_time_limit_s(size)
        return _read(_Db(con, limit, size // MIN_ROW_BYTES + 1), path, size)
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"corrupt or unreadable SQLite database ({exc})") from None
    finally:
        con.close()


# ----------------------------------------------------------------------------------------------
class _Db:
    """Column-tolerant queries: a wanted column the table lacks reads as NULL. Each query runs
    under `time_limit_s` and returns at most `max_rows` rows (TraceError past either)."""

    def __init__(self, con: sqlite3.Connection, time_limit_s: float, max_rows: int):
        self.con, self.time_limit_s, self.max_rows = con, time_limit_s, max_rows
        self.deadline = 0.0
        self.timed_out = False
        con.set_progress_handler(self._progress, _PROGRESS_STEPS)
        self.tables = {r[0] for r in self.rows("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        self._cols: dict[str, set[str]] = {}

    def _progress(self) -> bool:
        """Called by SQLite every _PROGRESS_STEPS steps: True stops the query. A KeyboardInterrupt
        raised in here stops it too (SQLite then reports `interrupted`; rows() raises it again)."""
        self.timed_out = time.monotonic() > self.deadline
        return self.timed_out

    def columns(self, table: str) -> set[str]:
        if table not in self._cols:
            self._cols[table] = ({r[1] for r in self.rows(f'PRAGMA table_info("{table}")')}
                                 if table in self.tables else set())
        return self._cols[table]

    def col(self, table: str, *candidates: str, alias: str = "t") -> str:
        """SQL for the first non-null of `candidates` that the table has; NULL if none."""
        have = [f"{alias}.{c}" for c in candidates if c in self.columns(table)]
        return "NULL" if not have else have[0] if len(have) == 1 else f"COALESCE({', '.join(have)})"

    def text(self, table: str, *id_columns: str) -> str:
        """SQL for a name stored as StringIds ids: the first id column that resolves."""
        have = [c for c in id_columns if c in self.columns(table)]
        if not have or "StringIds" not in self.tables:
            return "NULL"
        parts = [f"(SELECT value FROM StringIds WHERE id = t.{c})" for c in have]
        return parts[0] if len(parts) == 1 else f"COALESCE({', '.join(parts)})"

    def rows(self, sql: str) -> list[tuple]:
        self.deadline, self.timed_out = time.monotonic() + self.time_limit_s, False
        out: list[tuple] = []
        try:
            cursor = self.con.execute(sql)
            while batch := cursor.fetchmany(4096):
                out += batch
                if len(out) > self.max_rows:
                    raise TraceError(f"a query returned more rows than the file can hold ({self.max_rows:,}; "
                                     f"{_table(sql)}: a view that does not end?)")
        except sqlite3.OperationalError as exc:
            if self.timed_out:
                raise TraceError(f"a query ran past its time limit of {self.time_limit_s:g} s ({_table(sql)}; a "
                                 f"recursive view?); set RANKSCOPE_SQLITE_TIME_LIMIT_S for a longer one") from None
            if str(exc) == "interrupted":       # the progress handler raised: Ctrl-C
                raise KeyboardInterrupt from None
            raise
        return out


def _table(sql: str) -> str:
    """What a query reads, for a message: its main table (the last FROM; subqueries come first)."""
    tables = re.findall(r'\bFROM\s+(\w+)|PRAGMA table_info\("(\w+)', sql)
    return f"reading {''.join(tables[-1])}" if tables else "reading the schema"


def _read(db: _Db, path: Path, size: int) -> tuple[RankTrace, dict]:
    if not any(t in db.tables for t in NSYS_MARK_TABLES):
        raise TraceError("SQLite database without Nsight Systems tables (CUPTI_ACTIVITY_KIND_*, NVTX_EVENTS, "
                         "StringIds): not an nsys export")
    epoch = _session_epoch_ns(db)
    problems: list[str] = []
    parts = [_kernels(db), _memcpy(db), _memset(db), _syncs(db), _runtime(db), _nvtx(db, problems)]
    parts = [p for p in parts if p is not None and p.height]
    if not parts:
        raise TraceError("Nsight Systems export without CUDA or NVTX events (was it captured with -t cuda,nvtx?)")
    frame, dropped = _drop_unusable_times(pl.concat(parts, how="diagonal_relaxed"), epoch)
    if frame.is_empty():
        raise TraceError(f"no event with a usable start and duration ({sum(dropped.values())} dropped: "
                         + ", ".join(f"{k} with {reason}" for reason, k in dropped.items()) + ")")
    if dropped:
        n = sum(dropped.values())
        problems.append(f"{n} event{'s' if n > 1 else ''} dropped: "
                        + ", ".join(f"{k} with {reason}" for reason, k in dropped.items()))
    frame = _steps_from_nvtx(frame, problems).sort("ts_ns", maintain_order=True)

    kind = frame["kind"].to_numpy().astype(np.uint8)
    names = frame["name"].fill_null("").to_numpy().astype(object)
    uniq, codes = np.unique(names, return_inverse=True)
    events = pl.DataFrame({
        "kind": kind,
        "name": pl.Series(frame["name"].fill_null(""), dtype=pl.String).cast(pl.Categorical),
        "ts_ns": frame["ts_ns"].cast(pl.Int64), "dur_ns": frame["dur_ns"].cast(pl.Int64),
        "pid": frame["pid"].fill_null(-1).cast(pl.Int64), "tid": frame["tid"].fill_null(-1).cast(pl.Int64),
        "device": frame["device"].fill_null(-1).cast(pl.Int32), "stream": frame["stream"].fill_null(-1).cast(pl.Int64),
        "correlation": frame["correlation"].fill_null(-1).cast(pl.Int64),
        "external_id": pl.Series(np.full(frame.height, -1, dtype=np.int64)),
        "kclass": event_kernel_classes(kind, codes.astype(np.int32), list(uniq)).astype(np.uint8),
    })
    gpu_args = _gpu_args(frame)
    header = {"env": _captured_env(db)}
    meta = _meta(db, path, size, events, header["env"], problems)
    meta.dropped = dropped
    empty = {name: pl.DataFrame(schema=schema) for name, schema in _EMPTY.items()}
    return RankTrace(meta=meta, events=events, gpu_args=gpu_args, **empty), header


def _drop_unusable_times(frame: pl.DataFrame, epoch: int) -> tuple[pl.DataFrame, dict[str, int]]:
    """Times made absolute (+ the session's epoch), and the events whose start or duration is
    unusable dropped, each under its first reason, as the Kineto reader does (kineto.TIME_REASONS:
    not a number, i.e. NULL or not an integer; out of range; a negative duration, end before start;
    over a day; a day away from the other events). Returns the frame and the count per reason."""
    ts = frame["ts_ns"].cast(pl.Int64, strict=False)
    dur = frame["dur_ns"].cast(pl.Int64, strict=False)
    t, d = ts.fill_null(0).to_numpy(), dur.fill_null(0).to_numpy()
    reasons = np.zeros(frame.height, np.uint8)
    _mark(reasons, ts.is_null().to_numpy(), 1)
    _mark(reasons, (t >= MAX_TS_NS) | (t <= -MAX_TS_NS), 2)
    if abs(epoch) < MAX_TS_NS:
        t = np.where(reasons == 0, t, 0) + epoch             # both below 2**62: no overflow
        _mark(reasons, (t >= MAX_TS_NS) | (t <= -MAX_TS_NS), 2)
    else:                                                    # a session start no clock gives
        _mark(reasons, np.ones(len(t), dtype=bool), 2)
    _mark(reasons, dur.is_null().to_numpy(), 3)
    _mark(reasons, d < 0, 4)
    _mark(reasons, d > MAX_DUR_NS, 5)
    usable = t[reasons == 0]
    if len(usable) and int(usable.max()) - int(usable.min()) > MAX_DUR_NS:
        lo, hi = _main_run(usable)
        _mark(reasons, (t < lo) | (t > hi), 6)
    counts = np.bincount(reasons, minlength=len(TIME_REASONS) + 1)
    dropped = {reason: int(n) for reason, n in zip(TIME_REASONS, counts[1:]) if n}
    frame = frame.with_columns(pl.Series("ts_ns", t), pl.Series("dur_ns", d))
    return (frame.filter(pl.Series(reasons == 0)) if dropped else frame), dropped


def _session_epoch_ns(db: _Db) -> int:
    if "utcEpochNs" in db.columns("TARGET_INFO_SESSION_START_TIME"):
        row = db.rows("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
        if row and isinstance(row[0][0], int):
            return row[0][0]
    return 0


def _frame(rows: list[tuple], columns: list[str], kind: Kind) -> pl.DataFrame:
    f = pl.DataFrame(rows, schema=columns, orient="row", infer_schema_length=None)
    return f.with_columns(pl.lit(int(kind), pl.UInt8).alias("kind"))


def _device_columns(db: _Db, table: str) -> str:
    """start, dur, pid (= device), tid (= stream), device, stream, correlation."""
    c = lambda *names: db.col(table, *names)     # noqa: E731
    return (f"t.start, t.\"end\" - t.start, {c('deviceId')}, {c('streamId')}, {c('deviceId')}, {c('streamId')}, "
            f"{c('correlationId')}")


_DEVICE_NAMES = ["ts_ns", "dur_ns", "pid", "tid", "device", "stream", "correlation"]


def _kernels(db: _Db) -> pl.DataFrame | None:
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not {"start", "end"} <= db.columns(table):
        return None
    c = lambda *names: db.col(table, *names)     # noqa: E731
    sql = (f"SELECT {_device_columns(db, table)}, {db.text(table, 'demangledName', 'shortName', 'mangledName')}, "
           f"{c('gridX')} * {c('gridY')} * {c('gridZ')}, {c('blockX')} * {c('blockY')} * {c('blockZ')}, "
           f"{c('registersPerThread')}, COALESCE({c('staticSharedMemory')}, 0) + COALESCE({c('dynamicSharedMemory')}, 0)"
           f" FROM {table} t")
    cols = _DEVICE_NAMES + ["name", "grid_blocks", "block_threads", "registers_per_thread", "shared_memory_bytes"]
    return _frame(db.rows(sql), cols, Kind.KERNEL)


def _memcpy(db: _Db) -> pl.DataFrame | None:
    table = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if not {"start", "end"} <= db.columns(table):
        return None
    c = lambda *names: db.col(table, *names)     # noqa: E731
    rows = db.rows(f"SELECT {_device_columns(db, table)}, {c('bytes')}, {c('copyKind')}, {c('srcKind')}, "
                   f"{c('dstKind')} FROM {table} t")
    named = [r[:7] + (r[7], _memcpy_name(*r[8:])) for r in rows]
    return _frame(named, _DEVICE_NAMES + ["bytes", "name"], Kind.MEMCPY)


def _memcpy_name(copy_kind, src, dst) -> str:
    name = f"Memcpy {COPY_KINDS.get(copy_kind, 'Unknown')}"
    return name if src is None and dst is None else \
        f"{name} ({MEMORY_KINDS.get(src, 'Unknown')} -> {MEMORY_KINDS.get(dst, 'Unknown')})"


def _memset(db: _Db) -> pl.DataFrame | None:
    table = "CUPTI_ACTIVITY_KIND_MEMSET"
    if not {"start", "end"} <= db.columns(table):
        return None
    rows = db.rows(f"SELECT {_device_columns(db, table)}, {db.col(table, 'bytes')}, {db.col(table, 'memKind')} "
                   f"FROM {table} t")
    named = [r[:8] + (f"Memset ({MEMORY_KINDS.get(r[8], 'Unknown')})",) for r in rows]
    return _frame(named, _DEVICE_NAMES + ["bytes", "name"], Kind.MEMSET)


def _syncs(db: _Db) -> pl.DataFrame | None:
    table = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if not {"start", "end"} <= db.columns(table):
        return None
    rows = db.rows(f"SELECT {_device_columns(db, table)}, {db.col(table, 'syncType')} FROM {table} t")
    named = [r[:7] + (SYNC_TYPES.get(r[7], "Unknown Sync"),) for r in rows]
    return _frame(named, _DEVICE_NAMES + ["name"], Kind.SYNC)


def _runtime(db: _Db) -> pl.DataFrame | None:
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not {"start", "end", "globalTid"} <= db.columns(table):
        return None
    sql = (f"SELECT t.start, t.\"end\" - t.start, (t.globalTid >> 24) & 16777215, t.globalTid & 16777215, "
           f"{db.col(table, 'correlationId')}, {db.text(table, 'nameId')}, {db.col(table, 'eventClass')} "
           f"FROM {table} t")
    fixed = [r[:5] + (_API_SUFFIX.sub("", r[5] or ""), int(_api_kind(r[5] or "", r[6]))) for r in db.rows(sql)]
    f = pl.DataFrame(fixed, schema=["ts_ns", "dur_ns", "pid", "tid", "correlation", "name", "kind"], orient="row",
                     infer_schema_length=None)
    return f.with_columns(pl.col("kind").cast(pl.UInt8))


def _api_kind(name: str, event_class: int | None) -> Kind:
    """ENUM_NSYS_EVENT_CLASS 1 is the CUDA driver; without the column, `cu*` (not `cuda*`) names are."""
    if event_class is None:
        return Kind.DRIVER if name.startswith("cu") and not name.startswith("cuda") else Kind.RUNTIME
    return Kind.DRIVER if event_class == 1 else Kind.RUNTIME


def _nvtx(db: _Db, problems: list[str]) -> pl.DataFrame | None:
    table = "NVTX_EVENTS"
    if not {"start", "end", "eventType"} <= db.columns(table):
        return None
    text = db.col(table, "text")
    resolved = db.text(table, "textId")
    name = text if resolved == "NULL" else f"COALESCE({text}, {resolved})"
    tid = db.col(table, "globalTid")
    types = ", ".join(map(str, NVTX_RANGE_TYPES))
    rows = db.rows(f"SELECT t.start, t.\"end\", ({tid} >> 24) & 16777215, {tid} & 16777215, {name} "
                   f"FROM {table} t WHERE t.eventType IN ({types})")
    open_ranges = sum(1 for r in rows if r[1] is None)
    if open_ranges:
        problems.append(f"{open_ranges} NVTX ranges never closed (skipped)")
    kept = [(r[0], r[1] - r[0], r[2], r[3], r[4] or "") for r in rows if r[1] is not None]
    return _frame(kept, ["ts_ns", "dur_ns", "pid", "tid", "name"], Kind.USER_ANNOTATION)


def _steps_from_nvtx(frame: pl.DataFrame, problems: list[str]) -> pl.DataFrame:
    """Where no range is a ProfilerStep#N, step-like NVTX ranges become ProfilerStep#N."""
    ann = frame.filter(pl.col("kind") == int(Kind.USER_ANNOTATION))
    if ann.is_empty() or ann["name"].str.contains(PROFILER_STEP_PATTERN).any():
        return frame
    step = pl.col("name").str.extract(f"(?i){NVTX_STEP_PATTERN}", 1)
    is_step = (pl.col("kind") == int(Kind.USER_ANNOTATION)) & step.is_not_null()
    matched = ann.filter(pl.col("name").str.contains(f"(?i){NVTX_STEP_PATTERN}"))
    if matched.is_empty():
        return frame
    examples = ", ".join(sorted(matched["name"].unique().to_list())[:3])
    problems.append(f"{matched.height} NVTX step ranges ({examples}...) read as steps ProfilerStep#N")
    return frame.with_columns(pl.when(is_step).then(pl.lit("ProfilerStep#") + step).otherwise(pl.col("name"))
                              .alias("name"))


def _gpu_args(frame: pl.DataFrame) -> pl.DataFrame:
    """Launch details of the device activity rows (row = position in `events`)."""
    have = [c for c in _GPU_ARGS if c in frame.columns]
    dev = (frame.with_row_index("row").filter(pl.col("kind").is_in([int(k) for k in DEVICE_KINDS]))
           .select(pl.col("row").cast(pl.Int64), "dur_ns", *have))
    out = dev.select("row", *[pl.col(c).fill_null(-1).cast(pl.Int64).alias(c) for c in have],
                     *[pl.lit(-1, pl.Int64).alias(c) for c in _GPU_ARGS if c not in have])
    if "bytes" in have:         # bytes per ns = GB/s
        bandwidth = dev.select(pl.when((pl.col("bytes") > 0) & (pl.col("dur_ns") > 0))
                               .then(pl.col("bytes") / pl.col("dur_ns")).otherwise(np.nan).cast(pl.Float64)).to_series()
    else:                       # no memcpy / memset table
        bandwidth = pl.Series(np.full(dev.height, np.nan))
    return out.with_columns(
        pl.lit(np.nan).alias("blocks_per_sm"), pl.lit(np.nan).alias("warps_per_sm"),
        pl.lit(np.nan).alias("est_occupancy_pct"), bandwidth.alias("bandwidth_gbps"),
    ).select("row", "grid_blocks", "block_threads", "registers_per_thread", "shared_memory_bytes", "blocks_per_sm",
             "warps_per_sm", "est_occupancy_pct", "bytes", "bandwidth_gbps")


# ----------------------------------------------------------------------------------------------
def _captured_env(db: _Db) -> dict[str, str]:
    """The launched process's environment as nsys captured it (META_DATA_CAPTURE)."""
    if not {"name", "value"} <= db.columns("META_DATA_CAPTURE"):
        return {}
    env = {}
    for (value,) in db.rows("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_0:ENVIRONMENT_VARIABLE'"):
        key, sep, val = str(value).partition("=")
        if sep and key in RANK_ENV + WORLD_ENV:
            env[key] = val.strip().strip('"')
    return env


def _env_int(env: dict[str, str], keys: tuple[str, ...]) -> int | None:
    for k in keys:
        v = env.get(k, "")
        if v.isdigit():
            return int(v)
    return None


def _devices(db: _Db) -> list[dict]:
    table = "TARGET_INFO_GPU"
    have = [c for c in GPU_PROPERTIES if c in db.columns(table)]
    if "id" not in have:
        return []
    out = []
    for row in db.rows(f"SELECT {', '.join(have)} FROM {table} ORDER BY id"):
        out.append({GPU_PROPERTIES[c]: v for c, v in zip(have, row) if v is not None})
    if {"maxWarpsPerSm", "threadsPerWarp"} <= db.columns(table):
        per_sm = dict(db.rows(f"SELECT id, maxWarpsPerSm * threadsPerWarp FROM {table}"))
        for d in out:
            if per_sm.get(d["id"]):
                d["maxThreadsPerMultiprocessor"] = per_sm[d["id"]]
    return out


def _meta(db: _Db, path: Path, size: int, events: pl.DataFrame, env: dict, problems: list[str]) -> RankMeta:
    host_pids = events.filter(~pl.col("kind").is_in([int(k) for k in DEVICE_KINDS] + [int(Kind.SYNC)]))["pid"]
    pids = sorted(set(host_pids.unique().to_list()) - {-1})
    gpu_pids = sorted(set(events.filter(pl.col("kind") == int(Kind.RUNTIME))["pid"].unique().to_list()) - {-1})
    if len(gpu_pids) > 1:
        problems.append(f"{len(gpu_pids)} processes with CUDA activity in one report (pids "
                        f"{', '.join(map(str, gpu_pids[:8]))}): analysed together as one rank")
    threads, processes = {}, {}
    if {"nameId", "globalTid"} <= db.columns("ThreadNames") and "StringIds" in db.tables:
        for gtid, name in db.rows("SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId"):
            pid, tid = (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF
            if pid in pids:
                threads[f"{pid}/{tid}"] = name
    if {"pid", "name"} <= db.columns("PROCESSES"):
        for pid, name in db.rows("SELECT pid, name FROM PROCESSES"):
            if pid in pids and name:
                processes[str(pid)] = name
    hostname = None
    if {"name", "value"} <= db.columns("TARGET_INFO_SYSTEM_ENV"):
        row = db.rows("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1")
        hostname = row[0][0] if row and isinstance(row[0][0], str) else None
    ts, dur = events["ts_ns"].to_numpy(), events["dur_ns"].to_numpy()
    kinds = events["kind"].to_numpy()
    step_names = events.filter(pl.col("kind") == int(Kind.USER_ANNOTATION))["name"].cast(pl.String)
    dist_rank, world_size, rank_problems = checked_rank(_env_int(env, RANK_ENV), _env_int(env, WORLD_ENV),
                                                        ("RANK", "WORLD_SIZE"))
    return RankMeta(
        file=str(path), rank=-1, rank_source="unknown", format="nsys-sqlite",
        dist_rank=dist_rank, world_size=world_size,
        backend="nccl" if (events["kclass"] == int(KernelClass.COMM)).any() else None,
        devices=_devices(db), hostname=hostname, base_time_ns=_session_epoch_ns(db) or None,
        events_total=events.height, phase_counts={"X": events.height},
        device_events=int(np.isin(kinds, [int(k) for k in DEVICE_KINDS]).sum()),
        profiler_steps=int(step_names.str.extract(PROFILER_STEP_PATTERN, 1).drop_nulls().n_unique()),
        thread_names=threads, process_names=processes,
        span_ns=(int(ts.min()), int((ts + dur).max())) if len(ts) else None,
        problems=problems + rank_problems, size_bytes=size,
    )
