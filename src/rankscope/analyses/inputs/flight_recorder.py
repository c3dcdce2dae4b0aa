"""One Flight Recorder dump -> DumpSummary: the per-rank map of the hang analysis
(analyses/job/hang.py is the reduce).

A rank's entries are grouped into streams: per process group, its collectives (by
`collective_seq_id`) and its point-to-point ops (by `p2p_seq_id`), one row per sequence number
(the entries of a coalesced call share one). Per row: its signature (op, input sizes, dtypes,
output sizes; the entries of a coalesced call joined), the state it reached (the least advanced
of its entries), when it was created, and its record id (the rank's running count of recorded
ops: the program position). The last entries of each stream keep their Python frames, for the
verdict's "its last call". `entry_slices`: a dump's entries as timeline slices (the Perfetto export).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from rankscope.ingest.flight_recorder import FrDump, FrEntry, Frame

#: Entries kept whole (with frames) per stream and per rank: the stuck collectives and the grid.
LAST_ENTRIES = 8
STATE_CODE = {"scheduled": 0, "started": 1, "completed": 2}
#: Frames of these files are torch's own, not the user's call site.
_TORCH_PATH_PARTS = ("/torch/", "\\torch\\")


@dataclass
class Stream:
    """One process group's collectives (or its p2p ops) on one rank, one row per sequence number."""
    group: str
    desc: str
    p2p: bool
    seq: np.ndarray                    # int64, ascending
    signature: list[str]               # "op|input sizes|dtypes|output sizes" per row (interned)
    state: np.ndarray                  # int8: STATE_CODE of the least advanced entry of the row
    created_ns: np.ndarray             # int64: the row's first entry
    record_id: np.ndarray              # int64
    last: list[FrEntry]                # its last LAST_ENTRIES entries, whole


@dataclass
class DumpSummary:
    rank: int
    file: str
    format: str
    version: str
    backend: str
    states_recorded: bool              # started / completed are recorded (not gloo: every entry "scheduled")
    group_ranks: dict[str, list[int]]  # members per group name, from pg_config (names given there only)
    world_hint: int | None             # highest rank any pg_config names, + 1
    wrapped: bool                      # the ring buffer wrapped: older entries are gone
    first_ns: int | None
    last_ns: int | None                # the last time the dump records (created, started or completed)
    streams: list[Stream] = field(default_factory=list)
    last: list[FrEntry] = field(default_factory=list)     # its last LAST_ENTRIES entries, whole
    skipped_entries: int = 0


def signature(e: FrEntry) -> str:
    """What members must agree on at one sequence number: op|input sizes|dtypes|output sizes. A send and
    its recv agree on the data moved (the send's input, the recv's output), as `p2p|sizes|dtypes|`."""
    if e.is_p2p:
        return (f"p2p|{e.input_sizes}|{e.input_dtypes}|" if e.op == "send"
                else f"p2p|{e.output_sizes}|{e.output_dtypes}|")
    return f"{e.op}|{e.input_sizes}|{e.input_dtypes}|{e.output_sizes}"


def call_site(frames: list[Frame]) -> Frame | None:
    """The innermost frame outside torch (the user's call), else the innermost one."""
    for f in frames:
        if not any(p in f[1] for p in _TORCH_PATH_PARTS) and not f[1].startswith("<"):
            return f
    return frames[0] if frames else None


def summarize_dump(dump: FrDump) -> DumpSummary:
    by_stream: dict[tuple[str, bool], list[FrEntry]] = {}
    for e in dump.entries:
        by_stream.setdefault((e.pg_name, e.is_p2p), []).append(e)
    streams = [_stream(name, p2p, entries) for (name, p2p), entries in by_stream.items()]
    times = [t for e in dump.entries for t in (e.created_ns, e.started_ns, e.completed_ns) if t]
    named = {g.name: g.ranks for g in dump.groups if g.name and g.ranks}
    every = [r for g in dump.groups if g.ranks for r in g.ranks]
    return DumpSummary(
        rank=dump.rank, file=dump.file, format=dump.format, version=dump.version, backend=dump.backend,
        states_recorded=dump.backend != "gloo", group_ranks=named, world_hint=max(every) + 1 if every else None,
        wrapped=bool(dump.entries) and dump.entries[0].record_id > 0,
        first_ns=min(times) if times else None, last_ns=max(times) if times else None,
        streams=streams, last=dump.entries[-LAST_ENTRIES:], skipped_entries=dump.skipped_entries)


def _stream(name: str, p2p: bool, entries: list[FrEntry]) -> Stream:
    rows: dict[int, list[FrEntry]] = {}
    for e in entries:
        rows.setdefault(e.seq, []).append(e)
    seqs = sorted(rows)
    firsts = [rows[s][0] for s in seqs]
    return Stream(
        group=name, desc=entries[0].pg_desc, p2p=p2p, seq=np.array(seqs, dtype=np.int64),
        signature=[sys.intern(";".join(signature(e) for e in rows[s])) for s in seqs],
        state=np.array([min(STATE_CODE[e.state] for e in rows[s]) for s in seqs], dtype=np.int8),
        created_ns=np.array([e.created_ns for e in firsts], dtype=np.int64),
        record_id=np.array([e.record_id for e in firsts], dtype=np.int64),
        last=entries[-LAST_ENTRIES:])


def entry_slices(dump: FrDump, horizon_ns: int, shift_ns: int = 0) -> pl.DataFrame:
    """The dump's entries as timeline slices (the Perfetto export's Flight Recorder track): each from
    its creation to its recorded completion, else to the rank's next entry, else to `horizon_ns`
    (the last time any dump records); `end` says which. Times minus `shift_ns` (a trace's base time)."""
    entries = dump.entries
    starts = [e.created_ns for e in entries]
    ends, why = [], []
    for i, e in enumerate(entries):
        if e.completed_ns:
            ends.append(e.completed_ns)
            why.append("completed")
        elif i + 1 < len(entries):
            ends.append(starts[i + 1])
            why.append("next call")
        else:
            ends.append(max(horizon_ns, e.created_ns))
            why.append("last record of any dump")
    return pl.DataFrame({
        "track": [0] * len(entries), "ts_ns": [s - shift_ns for s in starts],
        "dur_ns": [max(b - a, 0) for a, b in zip(starts, ends)],
        "name": [f"{e.op} #{e.seq}" + (" (p2p)" if e.is_p2p else "") for e in entries],
        "cat": ["flight_recorder"] * len(entries),
        "group": [e.pg_desc or e.pg_name for e in entries], "state": [e.state for e in entries], "until": why,
        "input_sizes": [e.input_sizes for e in entries], "dtypes": [e.input_dtypes for e in entries],
        "call": [(lambda f: f"{f[1]}:{f[2]}" if f else None)(call_site(e.frames)) for e in entries],
    }, schema_overrides={"ts_ns": pl.Int64, "dur_ns": pl.Int64, "track": pl.Int64})
