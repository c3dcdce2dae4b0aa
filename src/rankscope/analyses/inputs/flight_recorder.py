"""One Flight Recorder dump -> DumpSummary: the per-rank map of the hang analysis
(analyses/job/hang.py is the reduce).

A rank's entries are grouped into streams: per process group, its collectives (by
`collective_seq_id`) and its point-to-point ops (by `p2p_seq_id`), one row per sequence number
(the entries of a coalesced call share one); and its point-to-point ops once more per direction
(`channel`: sender -> receiver, the group's own ranks, from the op's name), one row per transfer in
order, as a group of more than two ranks is aligned (a rank's p2p_seq_id counts its ops to every
peer). Per row: its signature (op, input sizes, dtypes,
output sizes; the entries of a coalesced call joined), the state it reached (the least advanced
of its entries), when it was created, and its record id (the rank's running count of recorded
ops: the program position). Rows are columns (numpy), signatures codes into the dump's own table
of them, all computed over the dump's columns at once. The last entries of each stream are kept
whole with their Python frames, for the verdict's "its last call". `entry_slices`: a dump's
entries as timeline slices (the Perfetto export).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgspec
import numpy as np
import polars as pl

from rankscope.ingest.flight_recorder import STATE_CODE, FrDump, FrEntry, Frame

#: Entries kept whole (with frames) per stream and per rank: the stuck collectives and the grid.
LAST_ENTRIES = 8
#: Frames of these files are torch's own, not the user's call site.
_TORCH_PATH_PARTS = ("/torch/", "\\torch\\")
_STATE_NAMES = list(STATE_CODE)


@dataclass
class Stream:
    """One process group's collectives (or its p2p ops) on one rank, one row per sequence number."""
    group: str
    desc: str
    p2p: bool
    seq: np.ndarray                    # int64, ascending
    signature: np.ndarray              # int32: "op|input sizes|dtypes|output sizes" per row, in DumpSummary.signatures
    state: np.ndarray                  # int8: STATE_CODE of the least advanced entry of the row
    created_ns: np.ndarray             # int64: the row's first entry
    record_id: np.ndarray              # int64
    last: list[FrEntry]                # its last LAST_ENTRIES entries, whole
    channel: tuple[int, int] | None = None   # p2p of one direction: (sender, receiver), ranks in the group;
                                             # seq then counts its transfers (1, 2, ...)


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
    signatures: list[str] = field(default_factory=list)   # the streams' signature codes -> text


def signature(op: str, is_p2p: bool, input_sizes: str, input_dtypes: str, output_sizes: str,
              output_dtypes: str) -> str:
    """What members must agree on at one sequence number: op|input sizes|dtypes|output sizes. A send and
    its recv agree on the data moved (the send's input, the recv's output), as `p2p|sizes|dtypes|`."""
    if is_p2p:
        return (f"p2p|{input_sizes}|{input_dtypes}|" if op == "send" else f"p2p|{output_sizes}|{output_dtypes}|")
    return f"{op}|{input_sizes}|{input_dtypes}|{output_sizes}"


def call_site(frames: list[Frame]) -> Frame | None:
    """The innermost frame outside torch (the user's call), else the innermost one."""
    for f in frames:
        if not any(p in f[1] for p in _TORCH_PATH_PARTS) and not f[1].startswith("<"):
            return f
    return frames[0] if frames else None


def _distinct_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per row of the columns (non-negative ints, one length), the id of its distinct combination;
    and per id, its first row."""
    key = np.zeros(len(columns[0]), np.int64)
    first = np.zeros(0, np.int64)
    for c in columns:
        key = key * (int(c.max()) + 1 if len(c) else 1) + c      # < rows x (max + 1): no overflow
        _, first, key = np.unique(key, return_index=True, return_inverse=True)
        key = key.reshape(-1)
    return key, first


_SEND, _RECV = re.compile(r"(\d+)->(\d+)"), re.compile(r"(\d+)<-(\d+)")


def _direction(op: str, detail: str) -> tuple[int, int] | None:
    """(sender, receiver) of a send ("send 1->2") or a recv ("recv 2<-1"), ranks in the group."""
    pattern = _SEND if op == "send" else _RECV if op == "recv" else None
    m = pattern.fullmatch(detail) if pattern else None
    if m is None:
        return None
    a, b = int(m[1]), int(m[2])
    return (a, b) if op == "send" else (b, a)


def _channels(dump: FrDump, name: str, desc: str, mine: np.ndarray, entry_sig: np.ndarray) -> list[Stream]:
    """A group's p2p entries (`mine`, in record order) split by direction: per (sender, receiver), its
    transfers in p2p_seq_id order, numbered 1, 2, ... (the n-th transfer that way)."""
    directions = [_direction(op, detail) for op, detail in dump.calls]
    known = {d: i for i, d in enumerate(dict.fromkeys(d for d in directions if d))}
    code = np.array([known[d] if d else -1 for d in directions], dtype=np.int64)[dump.call[mine]]
    out = []
    for (src, dst), c in known.items():
        rows = mine[code == c]
        if not len(rows):
            continue
        rows = rows[np.argsort(dump.seq[rows], kind="stable")]
        nth = np.arange(1, len(rows) + 1, dtype=np.int64)
        out.append(Stream(
            group=name, desc=desc, p2p=True, seq=nth, signature=entry_sig[rows].astype(np.int32),
            state=dump.state[rows], created_ns=dump.created_ns[rows], record_id=dump.record_id[rows],
            last=[msgspec.structs.replace(dump.entry(i), seq=n)
                  for i, n in zip(rows[-LAST_ENTRIES:].tolist(), nth[-LAST_ENTRIES:].tolist())],
            channel=(src, dst)))
    return out


def summarize_dump(dump: FrDump) -> DumpSummary:
    n = len(dump)
    # each entry's signature, made once per distinct (op, p2p, sizes, dtypes)
    kind, firsts = _distinct_rows([dump.call, dump.is_p2p.astype(np.int64), *dump.sizes.T])
    sig_ids: dict[str, int] = {}        # a send and a recv of the same data: one signature
    text_of_kind = np.array([sig_ids.setdefault(signature(dump.calls[dump.call[i]][0], bool(dump.is_p2p[i]),
                                                          *(dump.texts[t] for t in dump.sizes[i])), len(sig_ids))
                             for i in firsts.tolist()], dtype=np.int64)
    entry_sig = text_of_kind[kind] if n else kind
    signatures = list(sig_ids)
    # streams: (group name, p2p), in order of their first entry; rows: (stream, seq)
    names: dict[str, int] = {}
    name_of_pg = np.array([names.setdefault(name, len(names)) for name, _ in dump.pgs], dtype=np.int64)
    stream_key = name_of_pg[dump.pg] * 2 + dump.is_p2p if n else np.zeros(0, np.int64)
    order = np.lexsort((dump.seq, stream_key))
    key, seq = stream_key[order], dump.seq[order]
    row_at = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]) | (seq[1:] != seq[:-1])]) if n else np.zeros(0, int)
    row_sig = entry_sig[order][row_at].astype(np.int32)
    sizes = np.diff(np.r_[row_at, n])
    for r in np.flatnonzero(sizes > 1).tolist():        # a coalesced call: its entries' signatures joined
        text = ";".join(signatures[j] for j in entry_sig[order[row_at[r]:row_at[r] + sizes[r]]].tolist())
        row_sig[r] = sig_ids.setdefault(text, len(sig_ids))
    row_state = np.minimum.reduceat(dump.state[order], row_at) if n else np.zeros(0, np.int8)
    row_first = order[row_at]
    row_key = key[row_at]
    keys, first_entry = np.unique(stream_key, return_index=True)
    streams = []
    for k in keys[np.argsort(first_entry)].tolist():
        lo, hi = np.searchsorted(row_key, [k, k + 1])
        mine = np.flatnonzero(stream_key == k)
        name, desc = dump.pgs[dump.pg[mine[0]]]
        streams.append(Stream(
            group=name, desc=desc, p2p=bool(k & 1), seq=seq[row_at[lo:hi]], signature=row_sig[lo:hi],
            state=row_state[lo:hi].astype(np.int8), created_ns=dump.created_ns[row_first[lo:hi]],
            record_id=dump.record_id[row_first[lo:hi]], last=[dump.entry(i) for i in mine[-LAST_ENTRIES:].tolist()]))
        if k & 1:
            streams += _channels(dump, name, desc, mine, entry_sig)
    times = np.concatenate([dump.created_ns, dump.started_ns, dump.completed_ns])
    times = times[times != 0]
    named = {g.name: g.ranks for g in dump.groups if g.name and g.ranks}
    highest = max((g.ranks[-1] for g in dump.groups if g.ranks), default=None)     # ranks are sorted
    return DumpSummary(
        rank=dump.rank, file=dump.file, format=dump.format, version=dump.version, backend=dump.backend,
        states_recorded=dump.backend != "gloo", group_ranks=named,
        world_hint=None if highest is None else highest + 1,
        wrapped=bool(n) and int(dump.record_id[0]) > 0,
        first_ns=int(times.min()) if len(times) else None, last_ns=int(times.max()) if len(times) else None,
        streams=streams, last=[dump.entry(i) for i in range(max(0, n - LAST_ENTRIES), n)],
        skipped_entries=dump.skipped_entries, signatures=list(sig_ids))


def entry_slices(dump: FrDump, horizon_ns: int, shift_ns: int = 0) -> pl.DataFrame:
    """The dump's entries as timeline slices (the Perfetto export's Flight Recorder track): each from
    its creation to its recorded completion, else to the rank's next entry, else to `horizon_ns`
    (the last time any dump records); `end` says which. Times minus `shift_ns` (a trace's base time)."""
    n = len(dump)
    starts = dump.created_ns
    done = dump.completed_ns != 0
    nexts = np.r_[starts[1:], max(horizon_ns, int(starts[-1]))] if n else starts
    ends = np.where(done, dump.completed_ns, nexts)
    why = ["completed" if d else "next call" for d in done.tolist()]
    if n and not done[-1]:
        why[-1] = "last record of any dump"
    ops = [dump.calls[c][0] for c in dump.call.tolist()]
    seqs = dump.seq.tolist()
    p2p = dump.is_p2p.tolist()
    group = [desc or name for name, desc in dump.pgs]
    sites = [call_site(dump.frames.get(i, [])) for i in range(n)]
    return pl.DataFrame({
        "track": np.zeros(n, np.int64), "ts_ns": starts - shift_ns, "dur_ns": np.maximum(ends - starts, 0),
        "name": [f"{op} #{s}" + (" (p2p)" if p else "") for op, s, p in zip(ops, seqs, p2p)],
        "cat": ["flight_recorder"] * n, "group": [group[g] for g in dump.pg.tolist()],
        "state": [_STATE_NAMES[s] for s in dump.state.tolist()], "until": why,
        "input_sizes": [dump.texts[t] for t in dump.sizes[:, 0].tolist()],
        "dtypes": [dump.texts[t] for t in dump.sizes[:, 1].tolist()],
        "call": [f"{f[1]}:{f[2]}" if f else None for f in sites],
    }, schema_overrides={"ts_ns": pl.Int64, "dur_ns": pl.Int64, "track": pl.Int64})
