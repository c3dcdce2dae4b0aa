"""The Perfetto export's Flight Recorder track: per rank with a dump, one thread `rank 3 / Flight
Recorder` of its recorded collectives (analyses/inputs/flight_recorder.py `entry_slices`), in the
rank's process (made here for a rank without a profiler trace). Its tid is the last of the rank's
range (render/perfetto.py: `rank x TID_STRIDE + n`), so it never meets a trace track's."""
from __future__ import annotations

import msgspec
import polars as pl

from rankscope.render.perfetto import TID_STRIDE, slice_lines

#: The track's place among the rank's threads (after the trace's tracks).
SORT_INDEX = 1_000_000


def flight_recorder_json(rank: int, slices: pl.DataFrame, origin_ns: int, has_process: bool) -> tuple[list[bytes], int]:
    """One rank's Flight Recorder track as JSON text: (chunks of comma-separated events, events)."""
    tid = rank * TID_STRIDE + TID_STRIDE - 1
    meta = [] if has_process else [
        {"ph": "M", "pid": rank, "name": "process_name", "args": {"name": f"rank {rank}"}},
        {"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}}]
    meta += [{"ph": "M", "pid": rank, "tid": tid, "name": "thread_name",
              "args": {"name": f"rank {rank} / Flight Recorder"}},
             {"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": SORT_INDEX}}]
    chunks = [b",\n".join(msgspec.json.encode(m) for m in meta)]
    lines = slice_lines(slices, rank, {0: tid}, origin_ns)
    if len(lines):
        chunks.append(lines.str.join(",\n").item().encode())
    return chunks, len(meta) + len(lines)
