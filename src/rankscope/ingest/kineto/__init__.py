"""Kineto / Chrome-trace JSON (.json, .json.gz) -> RankTrace.

Streaming: the file is read (and gunzipped, with ISA-L) in chunks; each chunk of whole events is
decoded by msgspec into Structs and turned into typed columns, then dropped. Peak memory is the
columns plus one chunk, not the whole text nor a Python object per event.

Robustness, in order of cost:
  1. fast path: a chunk decodes as `list[Event]` (typed Structs, unknown keys skipped in C);
  2. a chunk with a badly typed event (e.g. `"args": []`) is decoded event by event, bad fields
     dropped, and the count reported; NaN / Infinity literals (not JSON) are read as values that
     are not numbers;
  3. a file cut mid-write (or with garbage inside) keeps every complete event before the cut and
     says how many were salvaged;
  4. no trace inside (empty, not JSON, JSON without events, corrupt gzip) -> TraceError, one line.
An event whose ts or dur cannot be a time (absent, not a number, out of range, negative or over a
day, a day away from the others) is dropped alone and counted per reason (`frames._drop_unusable_times`,
by the rules the Nsight reader shares: rankscope.ingest.times); a file with no event left is refused.
Bounded: an event longer than MAX_EVENT_BYTES, or a gzip text past MAX_GZIP_RATIO times the file,
cuts the file there (the events before kept); a value nested deeper than MAX_NESTING is read as
empty (`decode._flatten_deep`), never a recursion past the stack.
A run of whitespace between tokens is not kept in memory (`_Gaps`). A bare top-level array of
events ("chrome-array") says so in the problems; torch 1.x wrote one with no categories, its
kinds are taken from its process names (`LEGACY_PROCESS_KINDS`).

One module per job:
  events.py      the keys kept (msgspec Structs) and their decoders
  reading.py     bytes (gunzip with ISA-L) and the stream: header, events chunk by chunk, trailer
  boundaries.py  event boundaries, the event list's key, whitespace runs, found in the raw text
  decode.py      one chunk: C scanner, msgspec, lenient repairs
  salvage.py     what is kept of a text that breaks
  columns.py     column specs, the growing columns, the accumulator of what each frame needs
  frames.py      the frames and the rank's metadata (times checked by rankscope.ingest.times)
"""
from __future__ import annotations

import stat
from pathlib import Path

from rankscope.ingest.devices import NOT_A_CAPTURE
from rankscope.ingest.errors import TraceError
from rankscope.ingest.kineto.events import Args as Args, Event as Event, Header as Header
from rankscope.ingest.kineto.frames import LAUNCH_FLOW_CATEGORIES as LAUNCH_FLOW_CATEGORIES
from rankscope.ingest.kineto.frames import LEGACY_PROCESS_KINDS as LEGACY_PROCESS_KINDS
from rankscope.ingest.kineto.frames import _build
from rankscope.ingest.kineto.decode import MAX_NESTING as MAX_NESTING
from rankscope.ingest.kineto.reading import MAX_EVENT_BYTES as MAX_EVENT_BYTES, MAX_GZIP_RATIO as MAX_GZIP_RATIO
from rankscope.ingest.kineto.reading import _parse_stream
from rankscope.ingest.times import MAX_DUR_NS as MAX_DUR_NS, MAX_TS_NS as MAX_TS_NS, TIME_REASONS as TIME_REASONS
from rankscope.model import RankTrace

#: The schema of what `rankscope export perfetto` writes (pipelines/export.py), named in its
#: top-level "rankscope" key.
EXPORT_SCHEMA = "rankscope.perfetto/1"


def read_kineto(path: str | Path, use_scanner: bool = True) -> tuple[RankTrace, dict]:
    """Parse one Kineto/Chrome trace file. Returns the RankTrace (rank not yet assigned: -1,
    `rank_source` "unknown") and the header dict (distributedInfo etc.). Raises TraceError.
    `use_scanner=False` forces the msgspec reference path (tests compare the two)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise TraceError("not a regular file (a folder, FIFO or device): not read")
    size = st.st_size
    if size == 0:
        raise TraceError("empty file")
    parsed = _parse_stream(path, use_scanner)
    if parsed.acc.n_events == 0:
        if parsed.acc.bad_events:
            raise TraceError(f"JSON array of {parsed.acc.bad_events} values that are not trace events: "
                             f"not a profiler trace")
        if parsed.cut_at_byte is not None:
            raise TraceError(f"{parsed.cut_reason} at byte {parsed.cut_at_byte}; no complete event before it")
        raise TraceError("no trace events")
    header = {**parsed.trailer, **parsed.header} if isinstance(parsed.trailer, dict) else parsed.header
    export = header.get("rankscope")
    if isinstance(export, dict) and export.get("schema") == EXPORT_SCHEMA:
        raise TraceError(f"{NOT_A_CAPTURE}: rankscope's Perfetto export of a whole job (open it in "
                         f"ui.perfetto.dev), not one rank's trace")
    trace = _build(path, size, parsed, header)
    return trace, header
