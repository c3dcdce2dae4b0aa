"""The hang / desync verdict from Flight Recorder dumps (docs/hangs.md): the JSON `hang` object.

Field names are the JSON's (`rankscope.analysis/1`, "hang"). Sequence numbers are local to a
process group (`collective_seq_id`, or `p2p_seq_id` for send / recv). Times are milliseconds.
"""
from __future__ import annotations

from typing import Literal

import msgspec

#: What a member shows at one sequence number of its group. entered: it called the collective
#: (gloo records no progress: entered is all a gloo dump says); started / completed: the device
#: ran it (NCCL); not_entered: its dump goes past the previous one but has not this one;
#: no_dump: the rank left no dump; rolled_out: older than what its ring buffer still holds.
MemberState = Literal["completed", "started", "entered", "not_entered", "no_dump", "rolled_out"]
Status = Literal["hang", "desync", "none", "unknown"]
MismatchField = Literal["op", "input_sizes", "dtype", "output_sizes"]
StallKind = Literal["hang", "desync", "unknown"]


class Mismatch(msgspec.Struct):
    rank: int
    field: MismatchField
    value: str
    expected: str                      # what most members that entered it passed


class CallFrame(msgspec.Struct):
    rank: int
    name: str
    file: str
    line: int


class MemberWait(msgspec.Struct):
    """A member that entered the stuck collective: when, relative to the first member that did,
    and how long it has waited at least (until the last time any dump records)."""
    rank: int
    state: MemberState
    entered_ms: float                  # after the first member entered it
    waited_ms_at_least: float
    timeout_ms: float | None           # the collective's timeout (the watchdog gives up then)


class BlockerWhere(msgspec.Struct):
    """Where a member that holds a collective up is itself: waiting in another stuck collective
    (group and seq), or in none (`group` None: it stopped calling collectives, or left no dump)."""
    rank: int
    group: str | None
    label: str | None                  # the group in words (`tp group [2-3]`)
    seq: int | None
    op: str | None


class P2PChannel(msgspec.Struct):
    """The transfers one way between two members of a group of more than two ranks (a pipeline
    stage to the next): aligned on their own, `seq` then counting them (1 = the first)."""
    src: int
    dst: int


class StuckCollective(msgspec.Struct):
    """The first sequence number of one process group that is not completed (or, where completion is
    not recorded, not entered) by every member, or where members disagree (`kind`)."""
    kind: StallKind
    group: str                         # the process group's name
    group_desc: str
    label: str                         # the group in words: `tp group [2-3]`, `the default group [0-7]`
    dim: str | None                    # the parallel dimension its description names (tp, dp, ...)
    group_ranks: list[int]
    p2p: bool                          # seq is a p2p_seq_id (send / recv), else a collective_seq_id
    seq: int
    op: str
    entered: list[int]
    not_entered: list[int]
    no_dump: list[int]                 # members without a dump: whether they entered is unknown
    mismatched: list[Mismatch]
    culprits: list[int]                # the members that hold it up (or disagree)
    culprit_frames: list[CallFrame]    # per culprit: its call (desync) or its last call (hang)
    waits: list[MemberWait]
    blockers_where: list[BlockerWhere]
    program_position: int              # record id of its earliest waiter's entry (orders the stalls)
    verdict: str                       # one line in words
    channel: P2PChannel | None = None  # p2p in a group of more than two ranks: the direction; entered /
                                       # not_entered / waits are its two ranks, seq the n-th transfer


class GridRow(msgspec.Struct):
    rank: int
    states: list[MemberState]          # one per seq of GroupState.grid_seqs


class GroupState(msgspec.Struct):
    """Every process group seen: how far its members got, and a grid of the last sequence numbers."""
    group: str
    group_desc: str
    label: str
    dim: str | None
    group_ranks: list[int]
    p2p: bool
    state: Literal["complete", "stuck", "desync", "unknown"]
    last_seq_all: int | None           # the last seq every member with a dump entered (completed)
    grid_seqs: list[int]
    grid: list[GridRow]
    channel: P2PChannel | None = None  # as StuckCollective.channel: the grid is its two ranks


class LastEntry(msgspec.Struct):
    group: str
    group_desc: str
    seq: int
    op: str
    state: Literal["scheduled", "started", "completed"]
    created_ms: float                  # after the first time any dump records
    frame: str                         # the innermost call outside torch, file:line ("" if none)


class CulpritLast(msgspec.Struct):
    rank: int
    entries: list[LastEntry]           # its last entries, oldest first
    frames: list[CallFrame]            # the Python stack of its last call, innermost first


class CulpritTrace(msgspec.Struct):
    """A rank's profiler trace beside the dumps: its profiled steps, and whether it was already a
    straggler in them (the cross-rank analysis' verdict, with its cause and cost)."""
    rank: int
    steps: list[int]
    step_ms_mean: float | None
    job_median_step_ms: float | None   # the median over ranks of their mean step
    straggler: bool
    cause: str | None
    cost_ms_per_step: float | None
    summary: str


class HangReport(msgspec.Struct):
    status: Status
    ranks_dumped: list[int]
    missing_dumps: list[int]
    culprits: list[int]
    first: StuckCollective | None
    groups: list[StuckCollective]      # every group whose last collective is not complete on every member
    world_size: int | None
    backend: str
    states_recorded: bool              # the dumps record started / completed (NCCL); gloo's do not
    verdict: str                       # the headline in words
    unknown: str                       # what the missing dumps leave unknown ("" when none)
    all_groups: list[GroupState]
    culprit_last: list[CulpritLast]
    dumps: list[str]                   # the files read
    culprit_traces: list[CulpritTrace] = []   # the culprits' profiler traces beside the dumps
