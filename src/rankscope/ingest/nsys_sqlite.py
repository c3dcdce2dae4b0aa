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
device, tid = stream, as in Kineto traces, and their process from globalPid (bits 24-47). A report
of several processes with device activity (a whole job: `nsys profile torchrun ...`) is read as one
rank per process (`read_nsys_processes`). An event whose start or duration is unusable (NULL, end
before start, over a day...) is dropped and counted per reason, by the rules the Kineto reader
shares (rankscope.ingest.times).

Bounded: the file is untrusted, and a table read above may be a view that never ends (WITH
RECURSIVE). Each query has a time limit (`query_time_limit_s`: 30 s + 1 s per 10 MB of file, or
$RANKSCOPE_SQLITE_TIME_LIMIT_S) and may return at most one row per 8 bytes of the file (a stored row
takes more); past either, the file is refused with one line. Ctrl-C stops a query at once. The
rows come a batch at a time into int64 columns (`_Db.integers`: SQLite hands over integers only; a
cell of another type is absent, counted), never a Python object per row; names travel as StringIds
ids, each distinct one read once and cut at MAX_NAME_CHARS; SQLite makes no value over
MAX_VALUE_BYTES (past it, one line). The tables' columns are then joined and sorted a column at a
time (`_events`): 5M kernels and their launches peak at 2.0x the file.
"""
from __future__ import annotations

import os
import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import polars as pl

from rankscope.ingest.discover import checked_rank, open_regular
from rankscope.ingest.errors import TraceError
from rankscope.ingest.kineto.columns import _Column
from rankscope.ingest.kineto.frames import _categories
from rankscope.ingest.times import (MAX_TS_NS, mark, mark_durations, mark_far_from_the_others, out_of_range,
                                    reason_counts, start_reasons)
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
_BATCH_ROWS = 1 << 14          # rows fetched at once
#: A value SQLite may make or return (its length limit): a name, a view's string. Past it, the file
#: is refused: nsys writes none near it.
MAX_VALUE_BYTES = 16 << 20
#: Characters of a name kept (the longest kernel name of the corpus has 5,160); longer ones are cut.
MAX_NAME_CHARS = 1 << 16
#: An integer cell that is NULL, or holds another type: absent.
ABSENT = -2**63

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

_EMPTY: dict[str, dict[str, Any]] = {
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


def read_nsys_processes(path: str | Path, time_limit_s: float | None = None) -> list[tuple[RankTrace, dict]]:
    """Parse one nsys SQLite export into one (trace, header) per process with device activity: a
    report of a whole job (`nsys profile torchrun ...`) holds every worker, each a rank (its rank
    from its device index, said in its problems); a report of one process gives one. Raises
    TraceError. `time_limit_s`: of each query (default `query_time_limit_s`)."""
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
    _limit_values(con)
    try:
        limit = time_limit_s if time_limit_s is not None else query_time_limit_s(size)
        return _read(_Db(con, limit, size // MIN_ROW_BYTES + 1), path, size)
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"corrupt or unreadable SQLite database ({exc})") from None
    finally:
        con.close()


def read_nsys_sqlite(path: str | Path, time_limit_s: float | None = None) -> tuple[RankTrace, dict]:
    """Parse one nsys SQLite export of one process with device activity. Returns the RankTrace
    (rank not yet assigned, like read_kineto) and a header dict (`env`: RANK etc. when captured).
    Raises TraceError (also for a report of several such processes: `read_nsys_processes`).
    `time_limit_s`: of each query (default `query_time_limit_s`)."""
    found = read_nsys_processes(path, time_limit_s)
    if len(found) > 1:         # several ranks in one file: the caller asked for one
        raise TraceError(f"report of {len(found)} processes with device activity: read with read_nsys_processes")
    return found[0]


def _limit_values(con: sqlite3.Connection) -> None:
    """No value SQLite makes or returns past MAX_VALUE_BYTES (Python 3.11 and later: 3.10 cannot set
    the limit, SQLite's own of 1 GB holds there)."""
    if sys.version_info >= (3, 11):
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)


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

    def first_string_id(self, table: str, *id_columns: str) -> str:
        """SQL for the first of the id columns (integers) that names a StringIds row."""
        if "StringIds" not in self.tables:
            return "NULL"
        have = [f"(SELECT s.id FROM StringIds s WHERE s.id = {self.int_(table, c)})" for c in id_columns]
        return "NULL" if not have else have[0] if len(have) == 1 else f"COALESCE({', '.join(have)})"

    def int_(self, table: str, *candidates: str) -> str:
        """SQL for the first of `candidates` (those the table has) that holds an integer: a cell of
        another type (text, real, blob) reads as NULL."""
        have = [_as_int(f't."{c}"') for c in candidates if c in self.columns(table)]
        return "NULL" if not have else have[0] if len(have) == 1 else f"COALESCE({', '.join(have)})"

    def mistyped(self, table: str, *columns: str) -> str:
        """SQL counting the cells of `columns` (those the table has) that hold neither an integer nor NULL."""
        have = [f"(typeof(t.\"{c}\") NOT IN ('integer', 'null'))" for c in columns if c in self.columns(table)]
        return " + ".join(have) or "0"

    def rows(self, sql: str) -> list[tuple]:
        return [row for batch in self._batches(sql) for row in batch]

    def integers(self, exprs: list[str], source: str, mistyped: str = "0") -> tuple[list[np.ndarray], int]:
        """The integer expressions `exprs` (NULL as ABSENT) of `SELECT ... FROM source`, as int64
        arrays, and the sum of `mistyped` (a count per row) over the rows. The rows are read a batch
        at a time into columns that grow in place: memory holds the columns and one batch, never a
        Python object per row."""
        n = len(exprs)
        columns = [_Column(np.dtype(np.int64), ("nsys", str(j))) for j in range(n)]
        total = 0
        for batch in self._batches(f"SELECT {', '.join(f'COALESCE({e}, {ABSENT})' for e in exprs)}, {mistyped} "
                                   f"FROM {source}"):
            block = np.array(batch, dtype=np.int64).reshape(len(batch), n + 1)
            for j, column in enumerate(columns):
                column.append(block[:, j])
            total += int(block[:, n].sum())
        return [c.values() for c in columns], total

    def _batches(self, sql: str) -> Iterator[list[tuple]]:
        self.deadline, self.timed_out = time.monotonic() + self.time_limit_s, False
        n = 0
        try:
            cursor = self.con.execute(sql)
            while batch := cursor.fetchmany(_BATCH_ROWS):
                n += len(batch)
                if n > self.max_rows:
                    raise TraceError(f"a query returned more rows than the file can hold ({self.max_rows:,}; "
                                     f"{_table(sql)}: a view that does not end?)")
                yield batch
        except sqlite3.OperationalError as exc:
            if self.timed_out:
                raise TraceError(f"a query ran past its time limit of {self.time_limit_s:g} s ({_table(sql)}; a "
                                 f"recursive view?); set RANKSCOPE_SQLITE_TIME_LIMIT_S for a longer one") from None
            if str(exc) == "interrupted":       # the progress handler raised: Ctrl-C
                raise KeyboardInterrupt from None
            raise
        except sqlite3.DataError as exc:          # SQLITE_TOOBIG: a value past MAX_VALUE_BYTES
            raise TraceError(f"a value longer than {MAX_VALUE_BYTES >> 20} MiB ({_table(sql)}: {exc}); no Nsight "
                             f"Systems export holds one") from None

    def strings(self, ids: np.ndarray, cut: list[int]) -> dict[int, str]:
        """The StringIds texts of these ids (the others are not kept), each cut at MAX_NAME_CHARS
        characters (how many were: added to `cut[0]`). Read a batch at a time."""
        wanted = np.unique(ids[ids != ABSENT])
        if not len(wanted) or not {"id", "value"} <= self.columns("StringIds"):
            return {}
        out: dict[int, str] = {}
        for batch in self._batches(f"SELECT t.id, substr(t.value, 1, {MAX_NAME_CHARS}), "
                                   f"length(t.value) > {MAX_NAME_CHARS} FROM StringIds t "
                                   f"WHERE typeof(t.id) = 'integer' AND typeof(t.value) = 'text'"):
            keys = np.array([r[0] for r in batch], dtype=np.int64)
            for i in np.flatnonzero(np.isin(keys, wanted)).tolist():
                out[int(keys[i])] = batch[i][1]
                cut[0] += bool(batch[i][2])
        return out


def _as_int(expr: str) -> str:
    """`expr` where it is an integer, else NULL (text, a real, a blob; an overflow, which SQLite makes real)."""
    return f"CASE WHEN typeof({expr}) = 'integer' THEN {expr} END"


def _saturated(expr: str) -> str:
    """Integer arithmetic on integers (or NULL): an overflow, which SQLite makes real, saturates."""
    return f"CAST({expr} AS INTEGER)"


def _table(sql: str) -> str:
    """What a query reads, for a message: its main table (the last FROM; subqueries come first)."""
    tables = re.findall(r'\bFROM\s+(\w+)|PRAGMA table_info\("(\w+)', sql)
    return f"reading {''.join(tables[-1])}" if tables else "reading the schema"


def _read(db: _Db, path: Path, size: int) -> list[tuple[RankTrace, dict]]:
    """One (trace, header) per process with device activity (one for the whole report when it has
    at most one such process, or when the export does not say which process ran the activity)."""
    if not any(t in db.tables for t in NSYS_MARK_TABLES):
        raise TraceError("SQLite database without Nsight Systems tables (CUPTI_ACTIVITY_KIND_*, NVTX_EVENTS, "
                         "StringIds): not an nsys export")
    epoch = _session_epoch_ns(db)
    problems: list[str] = []
    names = _Names()
    tables = [_kernels(db, names), _memcpy(db, names), _memset(db, names), _syncs(db, names), _runtime(db, names),
              _nvtx(db, names, problems)]
    parts = [p for p in tables if p is not None and len(p["ts_ns"])]
    del tables
    if not parts:
        raise TraceError("Nsight Systems export without CUDA or NVTX events (was it captured with -t cuda,nvtx?)")
    mistyped = sum(p.pop("mistyped") for p in parts)
    events, dropped = _events(parts, epoch)
    if not len(events["ts_ns"]):
        raise TraceError(f"no event with a usable start and duration ({sum(dropped.values())} dropped: "
                         + ", ".join(f"{k} with {reason}" for reason, k in dropped.items()) + ")")
    if dropped:
        n = sum(dropped.values())
        problems.append(f"{n} event{'s' if n > 1 else ''} dropped: "
                        + ", ".join(f"{k} with {reason}" for reason, k in dropped.items()))
    if mistyped:
        problems.append(f"{mistyped} cells of a wrong type (not an integer) read as absent")
    if names.cut:
        problems.append(f"{names.cut} names longer than {MAX_NAME_CHARS:,} characters cut there")
    _steps_from_nvtx(events, names, problems)

    kind = events.pop("kind")
    codes = events.pop("name")
    process = events.pop("process")
    gpu_args = _gpu_args(events, kind)
    kclass = event_kernel_classes(kind, codes, names.texts).astype(np.uint8)
    frame = pl.DataFrame({
        "kind": kind,
        "name": _categories(names.texts).gather(pl.Series(codes, dtype=pl.UInt32)),     # (every event has a name)
        **{c: events.pop(c) for c in ("ts_ns", "dur_ns", "pid", "tid")},
        "device": events.pop("device"),
        **{c: events.pop(c) for c in ("stream", "correlation")},
    }).with_columns(pl.lit(-1, pl.Int64).alias("external_id"),           # (one value, not a column of them)
                    pl.Series("kclass", kclass))
    del codes, kclass
    env = _captured_env(db)
    processes = _device_processes(kind, frame["device"].to_numpy(), process)
    del kind
    if len(processes) <= 1:
        trace = _trace(db, path, size, frame, gpu_args, env, problems)
        trace.meta.dropped = dropped
        return [(trace, {"env": env})]
    out: list[tuple[RankTrace, dict]] = []
    ranks = _process_ranks(processes)
    rows = gpu_args["row"].to_numpy()
    for pid, (device, rank, source) in ranks.items():
        keep = process == pid
        on_device = keep[rows]
        own_args = gpu_args.filter(pl.Series(on_device)).with_columns(
            pl.Series("row", (np.cumsum(keep) - 1)[rows[on_device]].astype(np.int64)))
        said = (f"process {pid} of {len(ranks)} with device activity in this report (device {device}): rank {rank} "
                f"{source}")
        trace = _trace(db, path, size, frame.filter(pl.Series(keep)), own_args, {}, problems + [said])
        trace.meta.dist_rank, trace.meta.world_size, trace.meta.process = rank, len(ranks), pid
        trace.meta.devices = [d for d in trace.meta.devices if d.get("id") == device] or trace.meta.devices
        trace.meta.dropped = dropped if not out else {}       # the report's drops, counted once
        out.append((trace, {"env": {}}))
    return out


def _device_processes(kind: np.ndarray, device: np.ndarray, process: np.ndarray) -> dict[int, int]:
    """The processes that ran device activity (pid -> the device most of it ran on); empty when
    the export does not say which process ran it (no globalPid)."""
    on_device = np.isin(kind, [int(k) for k in DEVICE_KINDS]) & (process >= 0)
    if not on_device.any():
        return {}
    dev = pl.DataFrame({"process": process[on_device], "device": device[on_device]})
    top = dev.group_by("process", "device").len().sort(["process", "len", "device"], descending=[False, True, False])
    return {int(p): int(d) for p, d in top.unique("process", keep="first", maintain_order=True).select(
        "process", "device").iter_rows()}


def _process_ranks(processes: dict[int, int]) -> dict[int, tuple[int, int, str]]:
    """pid -> (device, rank, where the rank comes from): the device index when every process has a
    device of its own (torchrun's workers, one GPU each), else the order of the pids."""
    devices = sorted(processes.values())
    if len(set(devices)) == len(devices):
        return {pid: (d, d, "from its device index (the report names no rank)") for pid, d in
                sorted(processes.items(), key=lambda kv: kv[1])}
    return {pid: (processes[pid], i, "from the order of the pids (processes share devices; the report names no "
                                     "rank)") for i, pid in enumerate(sorted(processes))}


def _trace(db: _Db, path: Path, size: int, frame: pl.DataFrame, gpu_args: pl.DataFrame, env: dict,
           problems: list[str]) -> RankTrace:
    """The rank of these events (`frame`, and the launch details of its device rows)."""
    meta = _meta(db, path, size, frame, env, list(problems))
    empty = {name: pl.DataFrame(schema=schema) for name, schema in _EMPTY.items()}
    return RankTrace(meta=meta, events=frame, gpu_args=gpu_args, comm_args=empty["comm_args"],
                     op_args=empty["op_args"], memory=empty["memory"], flows=empty["flows"])


class _Names:
    """The events' names as codes into one list of texts (each distinct text once)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.code: dict[str, int] = {}
        self.cut = 0                   # StringIds texts cut at MAX_NAME_CHARS

    def of(self, text: str) -> int:
        code = self.code.get(text)
        if code is None:
            code = self.code[text] = len(self.texts)
            self.texts.append(text)
        return code

    def codes(self, keys: np.ndarray | list[np.ndarray], text_of: Callable[..., str]) -> np.ndarray:
        """A code per row: `keys` (ints, one per row; or a list of such, one per key part) named by
        `text_of(*key)`, once per distinct key."""
        distinct, at = _distinct(keys if isinstance(keys, list) else [keys])
        return np.array([self.of(text_of(*k)) for k in distinct], dtype=np.int32)[at]

    def strings(self, db: _Db, ids: np.ndarray) -> dict[int, str]:
        cut = [0]
        out = db.strings(ids, cut)
        self.cut += cut[0]
        return out


def _distinct(keys: list[np.ndarray], step: int = 1 << 20) -> tuple[list[list[int]], np.ndarray]:
    """The distinct keys (a key: the values of `keys` at one position) in order of first sight, and
    the index of each position's key among them. A slice at a time: memory holds one slice's work."""
    n = len(keys[0]) if keys else 0
    seen: dict[tuple, int] = {}
    at = np.empty(n, dtype=np.int32)
    for a in range(0, n, step):
        u, inverse = np.unique(np.stack([k[a:a + step] for k in keys]), axis=1, return_inverse=True)
        codes = np.array([seen.setdefault(key, len(seen)) for key in map(tuple, u.T.tolist())], dtype=np.int32)
        at[a:a + step] = codes[inverse.ravel()]
    return [list(key) for key in seen], at


def _part(kind: Kind, columns: list[str], values: list[np.ndarray], names: np.ndarray, mistyped: int) -> dict:
    """One table's events: its columns, kind, name codes and count of mistyped cells."""
    out: dict[str, Any] = dict(zip(columns, values))
    if "device" in out:                    # device activity: pid = device, tid = stream
        out["pid"], out["tid"] = out["device"], out["stream"]
    else:                                  # host activity: its process is its pid
        out["process"] = out["pid"]
    out["kind"] = np.full(len(names), int(kind), dtype=np.uint8)
    out["name"] = names.astype(np.int32)
    out["mistyped"] = mistyped
    return out


_EVENT_COLUMNS = ("pid", "tid", "device", "stream", "correlation", "name", "process")
_LAUNCH_COLUMNS = ("grid_blocks", "block_threads", "registers_per_thread", "shared_memory_bytes", "bytes")


def _events(parts: list[dict], epoch: int) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The parts' columns joined, times made absolute (+ the session's epoch), the events whose start
    or duration is unusable dropped (`_unusable`), sorted by start (stable). A column a part lacks, or
    an ABSENT value, is -1. The launch columns (`_LAUNCH_COLUMNS`) hold the device events only, in
    their order. Each part's column is written to its place in the joined one and let go: memory
    holds the columns about once, never a second joined copy."""
    lengths = [len(p["kind"]) for p in parts]
    offsets = np.cumsum([0] + lengths)
    ts = np.concatenate([p.pop("ts_ns") for p in parts])
    dur = np.concatenate([p.pop("dur_ns") for p in parts])
    reasons, ts = _unusable(ts, dur, epoch)
    dropped = reason_counts([reasons])
    keep = np.flatnonzero(reasons == 0)
    del reasons
    order = keep[np.argsort(ts[keep], kind="stable")]
    del keep
    events = {"ts_ns": ts[order], "dur_ns": dur[order]}
    del ts, dur
    position = np.full(int(offsets[-1]), -1, dtype=np.int32)      # where each row goes; -1: dropped
    position[order] = np.arange(len(order), dtype=np.int32)        # (rows: at most one per 8 bytes of file)
    del order
    events["kind"] = _joined(parts, "kind", position, offsets, len(events["ts_ns"]), np.uint8)
    device = np.isin(events["kind"], [int(k) for k in DEVICE_KINDS])
    for c in _EVENT_COLUMNS:
        events[c] = _joined(parts, c, position, offsets, len(device), np.int32 if c in ("name", "device") else np.int64)
    on_device = position >= 0
    on_device[on_device] = device[position[on_device]]
    at_device = np.full(len(position), -1, dtype=np.int32)    # where each device row goes among them
    at_device[on_device] = (np.cumsum(device, dtype=np.int32) - 1)[position[on_device]]
    del position, on_device
    for c in _LAUNCH_COLUMNS:
        events[c] = _joined(parts, c, at_device, offsets, int(device.sum()), np.int64)
    return events, dropped


def _joined(parts: list[dict], column: str, position: np.ndarray, offsets: np.ndarray, n: int, dtype) -> np.ndarray:
    """`column` of every part (popped: let go), each row written at its `position` (-1: not kept);
    -1 where a part lacks it or holds ABSENT."""
    out = np.full(n, 0 if dtype == np.uint8 else -1, dtype=dtype)
    for part, a, b in zip(parts, offsets, offsets[1:]):
        values = part.pop(column, None)
        if values is None:
            continue
        at = position[a:b]
        kept = at >= 0
        values = values[kept]
        if values.dtype == np.int64:
            values[values == ABSENT] = -1
        out[at[kept]] = values
    return out


def _unusable(ts: np.ndarray, dur: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """Why each event's start or duration is unusable (0: usable), under its first reason by the
    Kineto reader's rules (rankscope.ingest.times: not a number, i.e. NULL or not an integer; out of
    range; a negative duration, end before start; over a day; a day away from the other events), and
    the starts made absolute (the session's epoch added once: the frames' times are epoch ns)."""
    reasons = start_reasons(ts, ts == ABSENT)
    if abs(epoch) < MAX_TS_NS:
        ts[reasons != 0] = 0                                   # (in place: the joined starts are ours)
        ts += epoch                                            # both below 2**62: no overflow
        mark(reasons, out_of_range(ts), 2)
    else:                                                      # a session start no clock gives
        mark(reasons, np.ones(len(ts), dtype=bool), 2)
    mark_durations(reasons, dur, dur == ABSENT)
    mark_far_from_the_others([ts], [reasons])
    return reasons, ts


def _session_epoch_ns(db: _Db) -> int:
    if "utcEpochNs" in db.columns("TARGET_INFO_SESSION_START_TIME"):
        row = db.rows("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
        if row and isinstance(row[0][0], int):
            return row[0][0]
    return 0


def _timed(db: _Db, table: str, start: str = "start", end: str = "end") -> list[str]:
    """start, and the duration (end - start; NULL unless both are integers)."""
    a, b = db.int_(table, start), db.int_(table, end)
    return [a, _saturated(f"({b}) - ({a})")]


def _device(db: _Db, table: str, *extra: str) -> tuple[list[str], list[str], str]:
    """The integer expressions of a device activity table: start, dur, device, stream, correlation,
    process (the pid of globalPid, bits 24-47), then `extra`; their column names; and the count of
    mistyped cells (the times' aside: those drop their event). `_part` makes pid (= device) and tid
    (= stream), as in Kineto traces."""
    i = lambda *names: db.int_(table, *names)     # noqa: E731
    exprs = _timed(db, table) + [i("deviceId"), i("streamId"), i("correlationId"),
                                 f"({i('globalPid')} >> 24) & 16777215"]
    return (exprs + list(extra), _DEVICE_NAMES,
            db.mistyped(table, "deviceId", "streamId", "correlationId", "globalPid"))


_DEVICE_NAMES = ["ts_ns", "dur_ns", "device", "stream", "correlation", "process"]
_KERNEL_NAME_IDS = ("demangledName", "shortName", "mangledName")


def _kernels(db: _Db, names: _Names) -> dict | None:
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not {"start", "end"} <= db.columns(table):
        return None
    i = lambda *c: db.int_(table, *c)     # noqa: E731
    ids = [c for c in _KERNEL_NAME_IDS if c in db.columns(table)]
    launch = [_saturated(f"({i('gridX')}) * ({i('gridY')}) * ({i('gridZ')})"),
              _saturated(f"({i('blockX')}) * ({i('blockY')}) * ({i('blockZ')})"), i("registersPerThread"),
              _saturated(f"COALESCE({i('staticSharedMemory')}, 0) + COALESCE({i('dynamicSharedMemory')}, 0)"),
              db.first_string_id(table, *ids)]
    exprs, columns, mistyped = _device(db, table, *launch)
    values, bad = db.integers(exprs, f"{table} t", mistyped + " + " + db.mistyped(
        table, "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread", "staticSharedMemory",
        "dynamicSharedMemory", *ids))
    text = names.strings(db, values[-1])
    return _part(Kind.KERNEL, columns + ["grid_blocks", "block_threads", "registers_per_thread", "shared_memory_bytes"],
                 values, names.codes(values[-1], lambda k: text.get(k, "")), bad)


def _memcpy(db: _Db, names: _Names) -> dict | None:
    table = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if not {"start", "end"} <= db.columns(table):
        return None
    i = lambda *c: db.int_(table, *c)     # noqa: E731
    exprs, columns, mistyped = _device(db, table, i("bytes"), i("copyKind"), i("srcKind"), i("dstKind"))
    values, bad = db.integers(exprs, f"{table} t",
                              mistyped + " + " + db.mistyped(table, "bytes", "copyKind", "srcKind", "dstKind"))
    return _part(Kind.MEMCPY, columns + ["bytes"], values[:7],
                 names.codes(values[7:10], lambda *k: _memcpy_name(*(None if v == ABSENT else v for v in k))),
                 bad)


def _memcpy_name(copy_kind, src, dst) -> str:
    name = f"Memcpy {COPY_KINDS.get(copy_kind, 'Unknown')}"
    return name if src is None and dst is None else \
        f"{name} ({MEMORY_KINDS.get(src, 'Unknown')} -> {MEMORY_KINDS.get(dst, 'Unknown')})"


def _memset(db: _Db, names: _Names) -> dict | None:
    table = "CUPTI_ACTIVITY_KIND_MEMSET"
    if not {"start", "end"} <= db.columns(table):
        return None
    exprs, columns, mistyped = _device(db, table, db.int_(table, "bytes"), db.int_(table, "memKind"))
    values, bad = db.integers(exprs, f"{table} t", mistyped + " + " + db.mistyped(table, "bytes", "memKind"))
    return _part(Kind.MEMSET, columns + ["bytes"], values[:7],
                 names.codes(values[7], lambda k: f"Memset ({MEMORY_KINDS.get(k, 'Unknown')})"), bad)


def _syncs(db: _Db, names: _Names) -> dict | None:
    table = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if not {"start", "end"} <= db.columns(table):
        return None
    exprs, columns, mistyped = _device(db, table, db.int_(table, "syncType"))
    values, bad = db.integers(exprs, f"{table} t", mistyped + " + " + db.mistyped(table, "syncType"))
    return _part(Kind.SYNC, columns, values[:6], names.codes(values[6], lambda k: SYNC_TYPES.get(k, "Unknown Sync")),
                 bad)


def _runtime(db: _Db, names: _Names) -> dict | None:
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not {"start", "end", "globalTid"} <= db.columns(table):
        return None
    tid = db.int_(table, "globalTid")
    exprs = _timed(db, table) + [f"({tid} >> 24) & 16777215", f"({tid}) & 16777215", db.int_(table, "correlationId"),
                                 db.int_(table, "nameId"), db.int_(table, "eventClass")]
    values, bad = db.integers(exprs, f"{table} t", db.mistyped(table, "globalTid", "correlationId", "nameId",
                                                               "eventClass"))
    text = names.strings(db, values[5])
    pairs, at = _distinct(values[5:7])                  # (name id, event class)
    part = _part(Kind.RUNTIME, ["ts_ns", "dur_ns", "pid", "tid", "correlation"], values[:5],
                 np.array([names.of(_API_SUFFIX.sub("", text.get(i, ""))) for i, _ in pairs], dtype=np.int32)[at], bad)
    part["kind"] = np.array([int(_api_kind(text.get(i, ""), None if c == ABSENT else c)) for i, c in pairs],
                            dtype=np.uint8)[at]
    return part


def _api_kind(name: str, event_class: int | None) -> Kind:
    """ENUM_NSYS_EVENT_CLASS 1 is the CUDA driver; without the column, `cu*` (not `cuda*`) names are."""
    if event_class is None:
        return Kind.DRIVER if name.startswith("cu") and not name.startswith("cuda") else Kind.RUNTIME
    return Kind.DRIVER if event_class == 1 else Kind.RUNTIME


def _nvtx(db: _Db, names: _Names, problems: list[str]) -> dict | None:
    """NVTX ranges: integers streamed as the device tables; the inline text (or its StringIds id) of
    each, cut at MAX_NAME_CHARS, coded as it comes."""
    table = "NVTX_EVENTS"
    if not {"start", "end", "eventType"} <= db.columns(table):
        return None
    tid = db.int_(table, "globalTid")
    types = ", ".join(map(str, NVTX_RANGE_TYPES))
    where = f"{table} t WHERE t.eventType IN ({types})"
    values, bad = db.integers(_timed(db, table) + [f"({tid} >> 24) & 16777215", f"({tid}) & 16777215",
                                                   db.int_(table, "textId"), 't."end" IS NULL'], where,
                              db.mistyped(table, "globalTid", "textId"))
    code = np.full(len(values[0]), -1, dtype=np.int64)
    if "text" in db.columns(table):
        at = 0
        for batch in db._batches(f"SELECT CASE WHEN typeof(t.text) = 'text' THEN substr(t.text, 1, {MAX_NAME_CHARS}) "
                                 f"END FROM {where}"):
            batch = batch[:len(code) - at]            # (a view may not give the same rows twice)
            code[at:at + len(batch)] = [names.of(r[0]) if r[0] is not None else -1 for r in batch]
            at += len(batch)
    text = names.strings(db, values[4][code < 0])
    code = np.where(code >= 0, code, names.codes(values[4], lambda k: text.get(k, "")))
    open_ranges = values[5] == 1
    if open_ranges.any():
        problems.append(f"{int(open_ranges.sum())} NVTX ranges never closed (skipped)")
    keep = ~open_ranges
    return _part(Kind.USER_ANNOTATION, ["ts_ns", "dur_ns", "pid", "tid"], [v[keep] for v in values[:4]], code[keep],
                 bad)


def _steps_from_nvtx(events: dict[str, np.ndarray], names: _Names, problems: list[str]) -> None:
    """Where no range is a ProfilerStep#N, step-like NVTX ranges become ProfilerStep#N (new names: a
    text used by other events keeps its own)."""
    ann = events["kind"] == int(Kind.USER_ANNOTATION)
    used = np.unique(events["name"][ann])
    texts = pl.Series([names.texts[c] for c in used.tolist()], dtype=pl.String)
    if not len(texts) or texts.str.contains(PROFILER_STEP_PATTERN).any():
        return
    step = texts.str.extract(f"(?i){NVTX_STEP_PATTERN}", 1)
    if step.null_count() == len(step):
        return
    renamed = np.arange(len(names.texts) + 1)
    for c, n in zip(used.tolist(), step.to_list()):
        if n is not None:
            renamed[c] = names.of(f"ProfilerStep#{n}")
    rows = ann & (renamed[events["name"]] != events["name"])
    examples = ", ".join(sorted({names.texts[c] for c in np.unique(events["name"][rows]).tolist()})[:3])
    problems.append(f"{int(rows.sum())} NVTX step ranges ({examples}...) read as steps ProfilerStep#N")
    events["name"] = np.where(rows, renamed[events["name"]], events["name"])


def _gpu_args(events: dict[str, np.ndarray], kind: np.ndarray) -> pl.DataFrame:
    """Launch details of the device activity rows (row = position in `events`); bandwidth = bytes
    per ns = GB/s."""
    rows = np.flatnonzero(np.isin(kind, [int(k) for k in DEVICE_KINDS]))
    out = {"row": rows.astype(np.int64)}
    for c in ("grid_blocks", "block_threads", "registers_per_thread", "shared_memory_bytes"):
        out[c] = events.pop(c)
    size = events.pop("bytes")
    moved = np.flatnonzero(size > 0)                 # memcpy / memset rows: the few with bytes
    dur = events["dur_ns"][rows[moved]]
    bandwidth = np.full(len(rows), np.nan)
    bandwidth[moved[dur > 0]] = size[moved[dur > 0]] / dur[dur > 0]
    nan = [pl.lit(np.nan).alias(c) for c in ("blocks_per_sm", "warps_per_sm", "est_occupancy_pct")]
    return pl.DataFrame(out).with_columns(*nan, pl.Series("bytes", size), pl.Series("bandwidth_gbps", bandwidth))


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


def _distinct_where(values: np.ndarray, where: np.ndarray, step: int = 1 << 20) -> set[int]:
    """The distinct `values` where `where` holds, a slice at a time (no copy of the whole column)."""
    out: set[int] = set()
    for a in range(0, len(values), step):
        out.update(np.unique(values[a:a + step][where[a:a + step]]).tolist())
    return out


def _meta(db: _Db, path: Path, size: int, events: pl.DataFrame, env: dict, problems: list[str]) -> RankMeta:
    kinds, pid = events["kind"].to_numpy(), events["pid"].to_numpy()      # (columns: no copy of the frame)
    pids = sorted(_distinct_where(pid, ~np.isin(kinds, [int(k) for k in DEVICE_KINDS] + [int(Kind.SYNC)])) - {-1})
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
    step_names = events["name"].filter(pl.Series(kinds == int(Kind.USER_ANNOTATION))).cast(pl.String)
    dist_rank, world_size, rank_problems = checked_rank(_env_int(env, RANK_ENV), _env_int(env, WORLD_ENV),
                                                        ("RANK", "WORLD_SIZE"))
    return RankMeta(
        file=str(path), rank=-1, rank_source="unknown", format="nsys-sqlite",
        dist_rank=dist_rank, world_size=world_size,
        backend="nccl" if (events["kclass"] == int(KernelClass.COMM)).any() else None,
        devices=_devices(db), hostname=hostname,         # times are epoch ns already: no base time to add
        events_total=events.height, phase_counts={"X": events.height},
        device_events=int(np.isin(kinds, [int(k) for k in DEVICE_KINDS]).sum()),
        profiler_steps=int(step_names.str.extract(PROFILER_STEP_PATTERN, 1).drop_nulls().n_unique()),
        thread_names=threads, process_names=processes,
        span_ns=(int(ts.min()), int((ts + dur).max())) if len(ts) else None,
        problems=problems + rank_problems, size_bytes=size,
    )


def device_process_count(path: str | Path) -> int:
    """How many processes ran device activity in this report (0 when it is unreadable or does not
    say): a query of the kernel, memcpy and memset tables alone."""
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error:
        return 0
    _limit_values(con)
    try:
        db = _Db(con, query_time_limit_s(Path(path).stat().st_size), 1 << 20)
        tables = [t for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
                  if "globalPid" in db.columns(t)]
        if not tables:
            return 0
        union = " UNION ".join(f"SELECT DISTINCT (globalPid >> 24) & 16777215 FROM {t}" for t in tables)
        return int(db.rows(f"SELECT COUNT(*) FROM ({union})")[0][0])
    except (sqlite3.Error, TraceError, OSError):
        return 0
    finally:
        con.close()
