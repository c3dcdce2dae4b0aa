"""Which rank stopped the job: the cross-rank reduce over the ranks' Flight Recorder dump summaries
(analyses/inputs/flight_recorder.py) -> HangReport (docs/hangs.md).

Per process group (sequence numbers are local to a group), its members' rows are aligned by
sequence number (`collective_seq_id`; `p2p_seq_id` for the send / recv of a two-member group),
over the numbers every member's ring buffer still holds. In a group of more than two ranks a
rank's p2p_seq_id counts its ops to every peer, so the point-to-point ops are aligned per direction
(a channel: the sender's sends to one receiver against that receiver's recvs from it, the n-th with
the n-th), where both ranks' dumps hold the group's p2p ops from the first (p2p_seq_id 1).

A number is settled when every member
with a dump entered it with the same signature (op, input sizes, dtypes, output sizes) and it is
complete: where the dumps record progress (NCCL: scheduled / started / completed), every member
completed it; where they do not (gloo: every entry reads "scheduled", and pg_status counts a
failed collective as completed), entering is all the evidence, so the last number everyone
entered is taken as passed, unless a member left no dump and nobody went past it. The first
number that is not settled is the group's stall, classified:

  desync   members entered it with different signatures: the culprits are the minority
           (ties: those that differ from the lowest rank), with the field that differs;
  hang     members never entered it (their rows end before it): they are the culprits; or every
           member with a dump entered it and the others left no dump (they are the culprits, and
           whether they entered is unknown); or, with progress recorded, some members never
           started it while others did (their device is stuck on earlier work);
  unknown  every member entered and started it and it did not complete: no member holds it up
           (the transport, or a member that died inside it).

Across groups, a culprit may itself wait in another group's stall (a pipeline stage stuck sending
to the next stage, which stopped; a tp peer that skipped its tp collective and waits in the default
group): the stalls are ordered by program position, the record id of the first waiter's entry (a
rank's running count of recorded collectives: the same count at the same point of an SPMD
program), and the first cause is the earliest stall held up by a culprit that waits in no other
stall (the end of the chain); where every culprit waits in another (a cycle: a member that skipped
a collective waits in the next one, for the members that wait for it), the earliest stall with a
culprit. A group's dimension comes from its description (`mesh_tp` -> tp), named as the layout
analysis names them (analyses/rank/groups.py).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from rankscope.analyses.inputs.flight_recorder import STATE_CODE, DumpSummary, Stream, call_site
from rankscope.analyses.job.capture import ranks_text
from rankscope.analyses.rank.groups import dim_of_desc
from rankscope.ingest.flight_recorder import FrEntry
from rankscope.numbers import ranges
from rankscope.results.hang import (BlockerWhere, CallFrame, CulpritLast, CulpritTrace, GridRow, GroupState, HangReport,
                                    LastEntry, MemberState, MemberWait, Mismatch, MismatchField, P2PChannel,
                                    StallKind, StuckCollective)
from rankscope.units import NS_PER_MS

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.analyses.job.stragglers import Straggler
    from rankscope.results.rank import RankSummary

#: Sequence numbers shown per group in the grid.
GRID_SEQS = 8
#: Entries of a culprit shown.
CULPRIT_ENTRIES = 5
#: Clock difference allowed between the hosts of one job on top of the collectives' timeout: the
#: same collective is created on every member within its timeout (else it would have failed).
FOREIGN_SLACK_NS = 10_000 * 1_000_000
#: Without a timeout in the dumps: the gap beyond which a dump is another job's.
FOREIGN_DEFAULT_NS = 600_000 * 1_000_000
_FIELDS: tuple[MismatchField, ...] = ("op", "input_sizes", "dtype", "output_sizes")
_STATE_NAMES: dict[int, MemberState] = {STATE_CODE["completed"]: "completed", STATE_CODE["started"]: "started",
                                        STATE_CODE["scheduled"]: "entered"}


# ------------------------------------------------------------------------------------ other jobs
def foreign_dumps(dumps: list[DumpSummary]) -> list[tuple[DumpSummary, str]]:
    """The dumps that cannot be of the same job as the others, each with why: its process groups name
    another world size than most dumps do, or its collectives were created further from the same
    collectives (group, seq) on the other ranks than their timeout allows (+ FOREIGN_SLACK_NS of
    clock difference), or, sharing none, its time range lies that far from theirs."""
    if len(dumps) < 2:
        return []
    out: dict[int, str] = {}
    worlds = Counter(d.world_hint for d in dumps if d.world_hint)
    if len(worlds) > 1:
        common = worlds.most_common(1)[0][0]
        for d in dumps:
            if d.world_hint and d.world_hint != common:
                out[d.rank] = f"its process groups name {d.world_hint} ranks, the other dumps' {common}"
    timeouts = [e.timeout_ms for d in dumps for e in d.last if e.timeout_ms]
    tolerance = (max(timeouts) * 1_000_000 + FOREIGN_SLACK_NS) if timeouts else FOREIGN_DEFAULT_NS
    offsets = _time_offsets(dumps)
    spans = [(d.first_ns, d.last_ns or d.first_ns) for d in dumps if d.first_ns is not None]
    for d in dumps:
        if d.rank in out or d.first_ns is None or d.last_ns is None:
            continue
        off = offsets.get(d.rank)
        if off is not None:
            if abs(off) > tolerance:
                out[d.rank] = (f"its collectives were created {_duration(abs(off))} "
                               f"{'after' if off > 0 else 'before'} the same collectives on the other ranks "
                               f"(more than the {_duration(tolerance - FOREIGN_SLACK_NS)} timeout allows)")
            continue
        others = [s for s, dd in zip(spans, (x for x in dumps if x.first_ns is not None)) if dd is not d]
        lo, hi = min(s[0] for s in others), max(s[1] for s in others)
        gap = max(lo - d.last_ns, d.first_ns - hi, 0)
        if gap > tolerance:
            out[d.rank] = f"its time range lies {_duration(gap)} away from the other dumps'"
    return [(d, out[d.rank]) for d in dumps if d.rank in out]


def _time_offsets(dumps: list[DumpSummary]) -> dict[int, float]:
    """Per rank, the median over its rows of (created - the median creation of that (group, seq)
    over the ranks): 0 for one job's ranks (within their clock difference and arrival skew)."""
    devs: dict[int, list[np.ndarray]] = {}
    keys: dict[tuple[str, bool], list[tuple[int, Stream]]] = {}
    for d in dumps:
        for s in d.streams:
            if s.channel is None:
                keys.setdefault((s.group, s.p2p), []).append((d.rank, s))
    for members in keys.values():
        if len(members) < 2:
            continue
        seq = np.concatenate([s.seq for _, s in members])
        created = np.concatenate([s.created_ns for _, s in members])
        owner = np.concatenate([np.full(len(s.seq), i) for i, (_, s) in enumerate(members)])
        order = np.lexsort((created, seq))
        seq, created, owner = seq[order], created[order], owner[order]
        starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
        counts = np.diff(np.r_[starts, len(seq)])
        mid = created[starts + (counts - 1) // 2]
        dev = (created - np.repeat(mid, counts)).astype(np.float64)
        shared = np.repeat(counts >= 2, counts)
        for i, (rank, _) in enumerate(members):
            mine = (owner == i) & shared
            if mine.any():
                devs.setdefault(rank, []).append(dev[mine])
    return {rank: float(np.median(np.concatenate(parts))) for rank, parts in devs.items()}


def _duration(ns: float) -> str:
    s = ns / 1e9
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


# ------------------------------------------------------------------------------------ the report
@dataclass
class _Group:
    """One stream of one process group across its members (of a channel: its two ranks)."""
    name: str
    desc: str
    p2p: bool
    ranks: list[int]
    dim: str | None
    streams: dict[int, Stream]             # member with a dump -> its rows (absent: none recorded)
    members: list[int] | None = None       # a channel's: the whole group's ranks
    channel: P2PChannel | None = None      # (sender, receiver), ranks in the job

    @property
    def label(self) -> str:
        label = group_label(self.desc, self.dim, self.name, self.members or self.ranks)
        return label + (f", {self.channel.src} -> {self.channel.dst}" if self.channel else "")


def hang_report(dumps: list[DumpSummary], world_size: int | None = None,
                trace_groups: dict[str, list[int]] | None = None,
                traced: dict[int, CulpritTrace] | None = None) -> HangReport:
    """The verdict over one job's dump summaries (one per rank). `world_size` and `trace_groups`
    (group name -> ranks) come from the job's profiler traces when they are beside the dumps: they
    fill in what the dumps do not say (gloo's dumps name no group's members); `traced`: per rank
    with a trace, what it shows (`trace_facts`), of which the culprits' join the verdict."""
    by_rank = {d.rank: d for d in sorted(dumps, key=lambda d: d.rank)}
    candidates = [world_size or 0, max(by_rank) + 1 if by_rank else 0]
    candidates += [d.world_hint or 0 for d in by_rank.values()]      # covers each dump's group_ranks
    candidates += [max(r) + 1 for r in (trace_groups or {}).values() if r]
    world = max(candidates) or None
    groups = _groups(by_rank, world, trace_groups or {})
    horizon = max((d.last_ns for d in by_rank.values() if d.last_ns), default=0)
    first_ns = min((d.first_ns for d in by_rank.values() if d.first_ns), default=0)
    states = all(d.states_recorded for d in by_rank.values())
    stalls, all_groups = [], []
    sig_ids: dict[str, int] = {}          # signature text -> job-wide id; per dump, its codes -> those ids
    sig_lut = {r: np.array([sig_ids.setdefault(x, len(sig_ids)) for x in d.signatures], dtype=np.int64)
               for r, d in by_rank.items()}
    sig_texts = list(sig_ids)
    for g in groups:
        stall, state = _group_stall(g, by_rank, sig_lut, sig_texts, horizon)
        all_groups.append(state)
        if stall is not None:
            stalls.append(stall)
    stalls.sort(key=lambda s: (s.program_position, s.group))
    waiting_in = [set(s.entered) - set(s.culprits) for s in stalls]       # who waits in each stall
    for s in stalls:
        s.blockers_where = [_where(r, s, stalls, waiting_in) for r in s.culprits]
        s.verdict = _verdict(s)
    first = next((s for s in stalls if any(b.group is None for b in s.blockers_where)), None) or \
        next((s for s in stalls if s.culprits), stalls[0] if stalls else None)
    missing = [r for r in range(world or 0) if r not in by_rank]
    culprits = first.culprits if first else []
    return HangReport(
        status=first.kind if first else "none", ranks_dumped=sorted(by_rank), missing_dumps=missing,
        culprits=culprits, first=first, groups=stalls, world_size=world,
        backend=", ".join(sorted({d.backend for d in by_rank.values()})) or "unknown", states_recorded=states,
        verdict=first.verdict if first else _none_verdict(by_rank, all_groups),
        unknown=_unknown(missing, first), all_groups=all_groups,
        culprit_last=[_culprit_last(by_rank[r], first_ns) for r in culprits if r in by_rank],
        dumps=[d.file for d in by_rank.values()],
        culprit_traces=[(traced or {})[r] for r in culprits if r in (traced or {})])


def _groups(by_rank: dict[int, DumpSummary], world: int | None, trace_groups: dict[str, list[int]]) -> list[_Group]:
    """Every (group, collectives | p2p) stream the dumps show, with its members: from the dumps'
    pg_config, else the traces', else every rank for the default group, else the ranks whose dumps
    hold rows of the group. A p2p stream is aligned as it is in a two-member group, per channel in a
    larger one (`_channel_groups`)."""
    found: dict[tuple[str, bool], dict[int, Stream]] = {}
    channels: dict[str, dict[tuple[int, int], dict[int, Stream]]] = {}
    seen_in: dict[str, set[int]] = {}
    desc: dict[str, str] = {}
    for rank, d in by_rank.items():
        for s in d.streams:
            if s.channel is not None:
                channels.setdefault(s.group, {}).setdefault(s.channel, {})[rank] = s
                continue
            found.setdefault((s.group, s.p2p), {})[rank] = s
            seen_in.setdefault(s.group, set()).add(rank)
            desc.setdefault(s.group, s.desc)
    config = {name: ranks for d in by_rank.values() for name, ranks in d.group_ranks.items()}
    out = []
    for (name, p2p), streams in sorted(found.items()):
        ranks = config.get(name) or trace_groups.get(name)
        if not ranks and (desc[name] == "default_pg" or (name == "0" and not desc[name])) and world:
            ranks = list(range(world))
        ranks = sorted(set(ranks or seen_in[name]) | seen_in[name])
        dim = dim_of_desc(desc[name])
        if p2p and len(ranks) > 2:
            out += _channel_groups(name, desc[name], dim, ranks, streams, channels.get(name, {}), by_rank)
        elif not p2p or len(ranks) == 2:
            out.append(_Group(name, desc[name], p2p, ranks, dim, {r: streams[r] for r in ranks if r in streams}))
    return out


def _channel_groups(name: str, desc: str, dim: str | None, ranks: list[int], p2p: dict[int, Stream],
                    channels: dict[tuple[int, int], dict[int, Stream]], by_rank: dict[int, DumpSummary]
                    ) -> list[_Group]:
    """The channels of a group of more than two ranks (`ranks`, ascending: the n-th is the group's
    rank n), each a two-member _Group. A channel is left out where either rank's dump lost the
    group's first p2p ops (its n-th transfer is then unknown)."""
    out = []
    for (src, dst), streams in sorted(channels.items()):
        if max(src, dst) >= len(ranks) or src == dst:
            continue
        pair = [ranks[src], ranks[dst]]
        if any(r in by_rank and (int(p2p[r].seq[0]) != 1 if r in p2p else by_rank[r].wrapped) for r in pair):
            continue
        out.append(_Group(name, desc, True, sorted(pair), dim, {r: streams[r] for r in pair if r in streams},
                          members=ranks, channel=P2PChannel(src=pair[0], dst=pair[1])))
    return out


def _group_stall(g: _Group, by_rank: dict[int, DumpSummary], sig_lut: dict[int, np.ndarray], sig_texts: list[str],
                 horizon: int) -> tuple[StuckCollective | None, GroupState]:
    dumped = [r for r in g.ranks if r in by_rank]
    no_dump = [r for r in g.ranks if r not in by_rank]
    rolled = [r for r in dumped if r not in g.streams and by_rank[r].wrapped]     # its rows rolled out
    gone = set(rolled)
    rows = [r for r in dumped if r not in gone]
    start = max(int(g.streams[r].seq[0]) for r in g.streams)
    cols = np.unique(np.concatenate([g.streams[r].seq for r in g.streams]))
    cols = cols[cols >= start]
    n, m = len(rows), len(cols)
    present = np.zeros((n, m), dtype=bool)
    state = np.full((n, m), -1, dtype=np.int8)
    sig = np.full((n, m), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        s = g.streams.get(r)
        if s is None:
            continue
        keep = s.seq >= start
        at = np.searchsorted(cols, s.seq[keep])
        present[i, at] = True
        state[i, at] = s.state[keep]
        sig[i, at] = sig_lut[r][s.signature[keep]]
    states = all(by_rank[r].states_recorded for r in rows)
    entered_all = present.all(axis=0) if n else np.zeros(m, dtype=bool)
    lo = np.where(present, sig, np.iinfo(np.int64).max).min(axis=0) if n else np.zeros(m)
    hi = np.where(present, sig, -1).max(axis=0) if n else np.zeros(m)
    same = lo == hi
    if states:
        complete = entered_all & (np.where(present, state, 0) == STATE_CODE["completed"]).all(axis=0)
    else:
        complete = entered_all.copy()
        if no_dump and m:
            complete[-1] = False          # nobody went past the last one: the ranks without a dump may not have
    ok = complete & same
    bad = np.flatnonzero(~ok)
    grid_state = _grid(g, rows, rolled, no_dump, cols, present, state, ok)
    last_all = int(cols[ok][-1]) if ok.any() else None
    if not len(bad):
        return None, GroupState(**grid_state, state="complete", last_seq_all=last_all)
    c = int(bad[0])
    stall = _stall(g, rows, no_dump, c, cols, present, state, sig, sig_texts, states, by_rank, horizon)
    kind: Literal["stuck", "desync", "unknown"] = "stuck" if stall.kind == "hang" else stall.kind
    return stall, GroupState(**grid_state, state=kind, last_seq_all=last_all)


def _stall(g: _Group, rows: list[int], no_dump: list[int], c: int, cols: np.ndarray, present: np.ndarray,
           state: np.ndarray, sig: np.ndarray, text: list[str], states: bool,
           by_rank: dict[int, DumpSummary], horizon: int) -> StuckCollective:
    seq = int(cols[c])
    entered = [r for i, r in enumerate(rows) if present[i, c]]
    not_entered = [r for i, r in enumerate(rows) if not present[i, c]]
    sigs = {r: int(sig[i, c]) for i, r in enumerate(rows) if present[i, c]}
    counts = Counter(sigs.values())
    top = max(counts.values())
    majority = next(sigs[r] for r in entered if counts[sigs[r]] == top)
    mismatched = [_mismatch(r, text[sigs[r]], text[majority]) for r in entered if sigs[r] != majority]
    started = [r for i, r in enumerate(rows) if present[i, c] and state[i, c] >= STATE_CODE["started"]]
    kind: StallKind
    if mismatched:
        kind, culprits = "desync", [m.rank for m in mismatched]
    elif not_entered:
        kind, culprits = "hang", not_entered
    elif no_dump:
        kind, culprits = "hang", list(no_dump)
    elif states and started and len(started) < len(entered):
        kind, culprits = "hang", [r for r in entered if r not in started]
    else:
        kind, culprits = "unknown", []
    entries = {r: _entry_at(g, r, seq) for r in entered}
    firsts = [int(g.streams[r].created_ns[np.searchsorted(g.streams[r].seq, seq)]) for r in entered]
    t0 = min(firsts)
    row_of = {r: i for i, r in enumerate(rows)}
    held = set(culprits)
    waits = [MemberWait(rank=r, state=_STATE_NAMES[int(state[row_of[r], c])],
                        entered_ms=round((t - t0) / NS_PER_MS, 3),
                        waited_ms_at_least=round(max(horizon - t, 0) / NS_PER_MS, 3),
                        timeout_ms=_timeout_ms(entries[r]))
             for r, t in zip(entered, firsts) if r not in held]
    position = min(int(g.streams[r].record_id[np.searchsorted(g.streams[r].seq, seq)]) for r in entered)
    frames = []
    for r in culprits:
        if r not in by_rank:
            continue
        e = entries.get(r) if kind == "desync" else (by_rank[r].last[-1] if by_rank[r].last else None)
        site = call_site(e.frames) if e else None
        if site:
            frames.append(CallFrame(rank=r, name=site[0], file=site[1], line=site[2]))
    return StuckCollective(
        kind=kind, group=g.name, group_desc=g.desc, label=g.label, dim=g.dim, group_ranks=g.members or g.ranks,
        p2p=g.p2p, seq=seq, channel=g.channel,
        op=_op_name(text[majority], entries.get(entered[0])), entered=entered, not_entered=not_entered,
        no_dump=list(no_dump),
        mismatched=mismatched, culprits=culprits, culprit_frames=frames, waits=waits, blockers_where=[],
        program_position=position, verdict="")


def _op_name(sig: str, e: FrEntry | None) -> str:
    """The op of a signature; a p2p one's from the entry (send / recv)."""
    op = sig.split("|", 1)[0]
    return e.op if op == "p2p" and e is not None else op


def _timeout_ms(e: FrEntry | None) -> float | None:
    return float(e.timeout_ms) if e is not None and e.timeout_ms else None


def _entry_at(g: _Group, rank: int, seq: int) -> FrEntry | None:
    s = g.streams.get(rank)
    return next((e for e in s.last if e.seq == seq), None) if s else None


def _mismatch(rank: int, value: str, expected: str) -> Mismatch:
    """The first field (op, input sizes, dtypes, output sizes) in which a member's signature differs."""
    mine = [part.split("|") for part in value.split(";")]
    theirs = [part.split("|") for part in expected.split(";")]
    for a, b in zip(mine, theirs):
        for field, x, y in zip(_FIELDS, a, b):
            if x != y:
                return Mismatch(rank=rank, field=field, value=x, expected=y)
    return Mismatch(rank=rank, field="op", value=f"{len(mine)} ops coalesced", expected=f"{len(theirs)} ops coalesced")


def _grid(g: _Group, rows: list[int], rolled: list[int], no_dump: list[int], cols: np.ndarray,
          present: np.ndarray, state: np.ndarray, ok: np.ndarray) -> dict:
    """The group's identity and its grid: members x the last GRID_SEQS sequence numbers (ending two
    after its first unsettled one, when it has one)."""
    bad = np.flatnonzero(~ok)
    end = min(len(cols), int(bad[0]) + 3) if len(bad) else len(cols)
    shown = list(range(max(0, end - GRID_SEQS), end))
    missing, gone, row_of = set(no_dump), set(rolled), {r: i for i, r in enumerate(rows)}
    grid = []
    for r in g.ranks:
        cells: list[MemberState]
        if r in missing:
            cells = ["no_dump"] * len(shown)
        elif r in gone:
            cells = ["rolled_out"] * len(shown)
        else:
            i = row_of[r]
            cells = [_STATE_NAMES[int(state[i, j])] if present[i, j] else "not_entered" for j in shown]
        grid.append(GridRow(rank=r, states=cells))
    return dict(group=g.name, group_desc=g.desc, label=g.label, dim=g.dim, group_ranks=g.members or g.ranks,
                p2p=g.p2p, channel=g.channel,
                grid_seqs=[int(cols[j]) for j in shown], grid=grid)


def _where(rank: int, stall: StuckCollective, stalls: list[StuckCollective],
           waiting_in: list[set[int]]) -> BlockerWhere:
    """Where a culprit of `stall` is: waiting in another stall (`waiting_in`: who waits in each), or in none."""
    other = next((s for s, waiting in zip(stalls, waiting_in) if s is not stall and rank in waiting), None)
    if other is None:
        return BlockerWhere(rank=rank, group=None, label=None, seq=None, op=None)
    return BlockerWhere(rank=rank, group=other.group, label=other.label, seq=other.seq, op=other.op)


def group_label(desc: str, dim: str | None, name: str, ranks: list[int]) -> str:
    """`tp group [2-3]`, `the default group [0-7]`, `group my_pg [0, 4]`."""
    members = f"[{ranges(ranks)}]"
    if desc == "default_pg" or (name == "0" and not desc):
        return f"the default group {members}"
    if dim:
        return f"{dim} group {members}"
    return f"group {desc or name} {members}"


def _op(s: StuckCollective) -> str:
    return f"{s.op} #{s.seq}" + (" (p2p)" if s.p2p else "")


def _verdict(s: StuckCollective) -> str:
    where = s.label
    sites = {f.rank: f"{_short(f.file)}:{f.line}" for f in s.culprit_frames}
    waiting = len(s.waits)
    timeout = next((w.timeout_ms for w in s.waits if w.timeout_ms), None)
    waited = (f"; {waiting} {'rank' if waiting == 1 else 'ranks'} entered it and waited"
              + (f" (timeout {_duration(timeout * 1e6)})" if timeout else "")) if waiting else ""
    if s.kind == "desync":
        parts = [f"rank {m.rank} passed {m.field} {m.value}" + (f" ({sites[m.rank]})" if m.rank in sites else "")
                 for m in s.mismatched[:3]]
        return (f"ranks disagree at {_op(s)} of {where}: " + "; ".join(parts)
                + f" where the others passed {s.mismatched[0].expected}")
    if s.kind == "unknown":
        return (f"every member entered {_op(s)} of {where} and it did not complete: no member holds it up "
                f"(the transport, or a member that died inside it)")
    if s.not_entered:
        moved = {b.rank: b for b in s.blockers_where if b.group is not None}
        calls = [f"{'its' if len(s.culprits) == 1 else f'rank {r}'} last call: {sites[r]}"
                 for r in s.culprits[:3] if r in sites]
        text = f"{ranks_text(s.culprits)} never entered {_op(s)} of {where}"
        if calls:
            text += f" ({'; '.join(calls)})"
        if moved and len(s.culprits) == 1:
            b = moved[s.culprits[0]]
            text += f"; it went on to {b.op} #{b.seq} of {b.label}, where it waits"
        return text + waited
    if s.no_dump and s.culprits == s.no_dump:
        return (f"{ranks_text(s.entered)} entered {_op(s)} of {where}; {ranks_text(s.no_dump)} left no dump: "
                f"{'it' if len(s.no_dump) == 1 else 'they'} never got there or died (whether "
                f"{'it' if len(s.no_dump) == 1 else 'they'} entered is unknown)")
    return (f"{ranks_text(s.culprits)} never started {_op(s)} of {where} on the device while the others did "
            f"(the stream was still busy with earlier work)" + waited)


def _short(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _none_verdict(by_rank: dict[int, DumpSummary], groups: list[GroupState]) -> str:
    if not by_rank:
        return "no usable Flight Recorder dump"
    done = " and completed" if all(d.states_recorded for d in by_rank.values()) else ""
    return (f"no hang or desync: in each of the {len(groups)} process group{'s' if len(groups) != 1 else ''} "
            f"recorded, every member entered{done} the last collective, with the same op, sizes and dtypes")


def _unknown(missing: list[int], first: StuckCollective | None) -> str:
    """What the missing dumps leave unknown ("" when none is missing)."""
    if not missing:
        return ""
    who, they = ranks_text(missing), "it" if len(missing) == 1 else "they"
    if first is None:
        return f"{who} left no dump: what {they} did last is unknown; the other dumps show no stall"
    if first.kind == "desync":
        return f"{who} left no dump: what {they} passed at {_op(first)} is unknown"
    text = f"{who} left no dump: whether {they} entered {_op(first)} is unknown"
    if first.culprits and first.culprits == first.no_dump:
        text += f"; every member that dumped entered it, so only {they} can have held it up"
    return text


def _culprit_last(d: DumpSummary, t0: int) -> CulpritLast:
    entries = [LastEntry(group=e.pg_name, group_desc=e.pg_desc, seq=e.seq, op=e.op, state=e.state,
                         created_ms=round((e.created_ns - t0) / NS_PER_MS, 3),
                         frame=(lambda f: f"{_short(f[1])}:{f[2]}" if f else "")(call_site(e.frames)))
               for e in d.last[-CULPRIT_ENTRIES:]]
    last = d.last[-1].frames if d.last else []
    return CulpritLast(rank=d.rank, entries=entries,
                       frames=[CallFrame(rank=d.rank, name=f[0], file=f[1], line=f[2]) for f in last])


def trace_facts(ranks: list[RankSummary], stragglers: list[Straggler]) -> dict[int, CulpritTrace]:
    """Per rank with a profiler trace beside the dumps: its profiled steps and mean step against the
    job's median, and whether the cross-rank analysis names it a straggler (`stragglers`)."""
    means = [s.step_time.mean_ms for s in ranks if s.step_time.mean_ms is not None]
    job_median = float(np.median(means)) if means else None
    by_rank = {st.rank: st for st in stragglers}
    out = {}
    for s in ranks:
        steps = [st.step for st in s.steps]
        mean = s.step_time.mean_ms
        st = by_rank.get(s.rank)
        pace = (f"mean step {mean:,.1f} ms against the job's median {job_median:,.1f} ms"
                if mean is not None and job_median else "no step time")
        verdict = (f"already a straggler there ({st.cause}), costing the others {st.cost_ms_per_step:,.2f} ms per step"
                   if st else "not a straggler there")
        out[s.rank] = CulpritTrace(
            rank=s.rank, steps=steps, step_ms_mean=None if mean is None else round(mean, 3),
            job_median_step_ms=None if job_median is None else round(job_median, 3), straggler=st is not None,
            cause=st.cause if st else None, cost_ms_per_step=round(st.cost_ms_per_step, 3) if st else None,
            summary=f"rank {s.rank}'s profiled steps (#{ranges(steps)}): {pace}; {verdict}")
    return out
