"""`rankscope export perfetto`: every rank of a job in ONE Chrome-trace JSON file (gzip when the
name ends in .gz) that opens in https://ui.perfetto.dev and chrome://tracing.

Layout: one process per rank (pid = rank, name `rank 3`, process_sort_index = rank); its tracks
(analyses/rank/timeline.py) as threads named `rank 3 / <track>` with tids unique across the file and
the original pid/tid in the thread_name event's args; counters (ph "C") per rank process.
Times: `ts`/`dur` in µs with ns decimals, ts = (own timestamp - rank's clock offset - origin) / 1000;
the origin (earliest aligned timestamp, ns) and the offsets are in the top-level "rankscope" key.

Streaming: `api.export_perfetto` runs the analysis (small per-rank summaries, for the clock
alignment and the collective waits), then loads, converts (`rank_json`) and writes one rank at a
time: memory holds one rank's frames, never the job's. `TraceWriter` writes JSON text built
column-wise (polars string expressions, names escaped once per distinct value), so no Python
object per event is created.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import polars as pl

from rankscope.results.timeline import RankTimeline
from rankscope.files import AtomicFile
from rankscope.render.format import json_bytes

#: Rows converted to JSON text at once (bounds the text held in memory: ~40 MB).
BATCH_ROWS = 200_000
#: isal gzip level (0-3): 1 writes ~3x faster than zlib's default at a few % larger files.
GZIP_LEVEL = 1
_SLICE_COLUMNS = ("track", "ts_ns", "dur_ns", "name", "cat")
#: Thread ids of rank r: r x TID_STRIDE + 1, + 2, ... (unique in the file; far more than a rank's tracks).
TID_STRIDE = 10_000


# ----------------------------------------------------------------------------------------------
# JSON text, column-wise
def _json_strings(s: pl.Series) -> pl.Series:
    """JSON string literals of a text column (each distinct value encoded once); null stays null."""
    s = s.cast(pl.String)
    distinct = s.drop_nulls().unique().to_list()
    encoded = [msgspec.json.encode(v).decode() for v in distinct]
    out: pl.Series = s.replace_strict(distinct, encoded, default=None, return_dtype=pl.String)
    return out


def _json_values(s: pl.Series) -> pl.Series:
    """JSON text of each value (null where the value is null or not a finite number)."""
    if s.dtype in (pl.String, pl.Categorical) or s.dtype == pl.Null:
        return _json_strings(s)
    if s.dtype == pl.Boolean:
        flags: pl.Series = s.replace_strict({True: "true", False: "false"}, return_dtype=pl.String)
        return flags
    if s.dtype.is_float():                         # whole numbers without ".0"; NaN/inf left out
        whole = s.is_finite() & (s == s.round()) & (s.abs() < 2**53)
        return pl.select(pl.when(whole).then(s.cast(pl.Int64, strict=False).cast(pl.String))
                         .when(s.is_finite()).then(s.cast(pl.String))).to_series()
    text: pl.Series = s.cast(pl.String)
    return text


def _us(ns: pl.Expr) -> pl.Expr:
    """Exact µs text of an int64 ns value: 1234567 -> "1234.567", 2000 -> "2"."""
    a = ns.abs()
    frac = (a % 1000).cast(pl.String).str.zfill(3).str.strip_chars_end("0")
    return pl.concat_str([pl.when(ns < 0).then(pl.lit("-")).otherwise(pl.lit("")), (a // 1000).cast(pl.String),
                          pl.when(frac == "").then(pl.lit("")).otherwise(pl.lit(".") + frac)])


def _args(frame: pl.DataFrame, columns: list[str]) -> pl.Series:
    """`{"key":value,...}` per row, leaving out null values."""
    if not columns:
        return pl.repeat("{}", frame.height, eager=True)
    values = pl.DataFrame([_json_values(frame[c]).alias(c) for c in columns])
    pieces = [(pl.lit("," + msgspec.json.encode(c).decode() + ":") + pl.col(c)).fill_null("") for c in columns]
    return values.select(pl.lit("{") + pl.concat_str(pieces).str.strip_prefix(",") + pl.lit("}")).to_series()


def slice_lines(frame: pl.DataFrame, pid: int, tids: dict[int, int], origin_ns: int) -> pl.Series:
    """Chrome `X` events (JSON text, one per row) of a timeline slice frame."""
    args = _args(frame, [c for c in frame.columns if c not in _SLICE_COLUMNS])
    return pl.DataFrame({
        "tid": frame["track"].replace_strict(tids, return_dtype=pl.Int64), "ts": frame["ts_ns"] - origin_ns,
        "dur": frame["dur_ns"], "name": _json_strings(frame["name"]).fill_null('""'),
        "cat": _json_strings(frame["cat"]).fill_null('""'), "args": args,
    }).select(pl.concat_str([
        pl.lit(f'{{"ph":"X","pid":{pid},"tid":'), pl.col("tid").cast(pl.String), pl.lit(',"ts":'), _us(pl.col("ts")),
        pl.lit(',"dur":'), _us(pl.col("dur")), pl.lit(',"name":'), pl.col("name"), pl.lit(',"cat":'), pl.col("cat"),
        pl.lit(',"args":'), pl.col("args"), pl.lit("}")]).alias("line"))["line"]


def counter_lines(frame: pl.DataFrame, pid: int, origin_ns: int) -> pl.Series:
    """Chrome `C` events: {"name": counter, "args": {series: value}}; non-finite values left out."""
    f = pl.DataFrame({"name": _json_strings(frame["counter"]), "key": _json_strings(frame["series"]),
                      "ts": frame["ts_ns"] - origin_ns, "value": _json_values(frame["value"])}).drop_nulls()
    return f.select(pl.concat_str([
        pl.lit(f'{{"ph":"C","pid":{pid},"name":'), pl.col("name"), pl.lit(',"ts":'), _us(pl.col("ts")),
        pl.lit(',"args":{'), pl.col("key"), pl.lit(":"), pl.col("value"), pl.lit("}}")]).alias("line"))["line"]


def rank_json(tl: RankTimeline, origin_ns: int) -> tuple[list[bytes], int]:
    """One rank as JSON text: its process, tracks (tids `rank x TID_STRIDE + n`, unique in the
    file), slices and counters, in chunks of comma-separated events. Returns (chunks, events)."""
    pid, tids = tl.rank, {}
    meta = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"rank {tl.rank}"}},
            {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": tl.rank}}]
    for n, (track, label, sort_index, opid, otid) in enumerate(tl.tracks.sort("sort_index").iter_rows()):
        tids[track] = tid = tl.rank * TID_STRIDE + n + 1
        original = {} if opid < 0 and otid < 0 else {"original_pid": opid, "original_tid": otid}
        meta += [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                  "args": {"name": f"rank {tl.rank} / {label}", **original}},
                 {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": sort_index}}]
    chunks, events = [b",\n".join(msgspec.json.encode(m) for m in meta)], len(meta)
    batches = [slice_lines(b, pid, tids, origin_ns) for f in tl.slices for b in f.iter_slices(BATCH_ROWS)]
    batches += [counter_lines(b, pid, origin_ns) for b in tl.counters.iter_slices(BATCH_ROWS)]
    for lines in batches:
        if len(lines):
            chunks.append(lines.str.join(",\n").item().encode())
            events += len(lines)
    return chunks, events


# ----------------------------------------------------------------------------------------------
class TraceWriter:
    """A Chrome-trace JSON object written incrementally: `{"displayTimeUnit": "ms", "traceEvents":
    [...], "rankscope": {...}}`. Written to a hidden temporary file beside `out` (`files.AtomicFile`:
    its own name per writer, so two exports to one name do not collide) and renamed by `close`: a
    failed export leaves no half file under the name asked for, and an earlier file of that name
    untouched. `out` must be a regular file or nothing (never a link, FIFO, device or folder)."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self._atomic = AtomicFile(self.out)
        self._file: BinaryIO
        if self.out.name.endswith(".gz"):
            from isal import igzip
            # igzip.open has no annotations; opened "wb" on a file object it returns an IGzipFile (binary).
            gzip_open: Callable[..., BinaryIO] = igzip.open
            self._file = gzip_open(self._atomic.file, "wb", compresslevel=GZIP_LEVEL)
        else:
            self._file = self._atomic.file
        self._file.write(b'{"displayTimeUnit":"ms","traceEvents":[\n')
        self._first = True
        self.events = 0

    def write(self, chunks: list[bytes], events: int) -> None:
        """Append chunks of comma-separated events (`rank_json`)."""
        for chunk in chunks:
            self._file.write(chunk if self._first else b",\n" + chunk)
            self._first = False
        self.events += events

    def close(self, metadata: dict[str, Any]) -> int:
        """Finish the file with the metadata; returns its size in bytes."""
        self._file.write(b'\n],"rankscope":' + json_bytes(metadata) + b"}\n")
        self._file.close()
        self._atomic.commit()
        return self.out.stat().st_size

    def abort(self) -> None:
        """Drop the temporary file (also after a `close` that failed, e.g. on a full disk)."""
        try:
            self._file.close()
        except OSError:
            pass
        finally:
            self._atomic.abort()
