"""One rank's merged timeline for `export perfetto` (docs/perfetto.md): its tracks, slices and counters
on the aligned clock, as frames (made by analyses/rank/timeline.py, written by render/perfetto.py a
rank at a time: a timeline is no part of the report)."""
from __future__ import annotations

import msgspec
import polars as pl


class RankTimeline(msgspec.Struct):
    """`tracks`: track (id, unique in the rank), label, sort_index, pid, tid (original ids; -1 for
    overlays). `slices`: frames with columns track, ts_ns, dur_ns, name, cat, then arguments
    (any further columns; null = absent). `counters`: counter, series, ts_ns, value.
    `moved` / `clipped`: slices put on an overlap lane / clipped to their parent (`nest_lanes`)."""
    rank: int
    offset_ns: int
    tracks: pl.DataFrame
    slices: list[pl.DataFrame]
    counters: pl.DataFrame
    moved: int = 0
    clipped: int = 0
    notes: list[str] = []
