"""Findings of the Flight Recorder verdict (analyses/job/hang.py): `collective_hang` (a member never
entered a collective the others entered) and `collective_desync` (members entered collectives that
differ in op, sizes or dtypes at one sequence number). Their rules read a `HangView`; the fix says
what the culprit's call and the stall suggest."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Iterable

from rankscope.findings.registry import ordered, rule, run
from rankscope.numbers import ranges
from rankscope.results import Finding
from rankscope.results.hang import HangReport, StuckCollective
from rankscope.thresholds import Thresholds, resolve


@dataclass
class HangView:
    """What the hang rules read: the verdict over the job's dumps, the thresholds in force."""
    report: HangReport
    thresholds: Thresholds


def hang_findings(report: HangReport | None, thresholds: Mapping[str, float] | None = None) -> list[Finding]:
    """The findings of a hang verdict (none without one), ordered by severity."""
    if report is None:
        return []
    t = thresholds if isinstance(thresholds, Thresholds) else resolve(thresholds)
    return ordered(run(HangView(report, t)))


def _evidence(r: HangReport, s: StuckCollective) -> dict[str, Any]:
    return {"group": s.group, "group_desc": s.group_desc, "dim": s.dim, "group_ranks": s.group_ranks, "seq": s.seq,
            "op": s.op, "entered": s.entered, "not_entered": s.not_entered, "no_dump": s.no_dump,
            "mismatched": [{"rank": m.rank, "field": m.field, "value": m.value, "expected": m.expected}
                           for m in s.mismatched],
            "culprit_frames": [{"rank": f.rank, "name": f.name, "file": f.file, "line": f.line}
                               for f in s.culprit_frames],
            "missing_dumps": r.missing_dumps, "stalled_groups": len(r.groups)}


def _site(s: StuckCollective, rank: int) -> str:
    f = next((f for f in s.culprit_frames if f.rank == rank), None)
    return f"{PurePath(f.file).name}:{f.line} ({f.name})" if f else "its last call (no Python frames in the dump)"


@rule("collective_hang", view=HangView)
def collective_hang(view: HangView) -> Iterable[Finding]:
    """The verdict's first stall is a hang: members never entered (or, where progress is recorded,
    never started) a collective the others entered, or left no dump while every other member entered it."""
    r, s = view.report, view.report.first
    if s is None or s.kind != "hang":
        return
    culprit = s.culprits[0]
    where = next((b for b in s.blockers_where if b.rank == culprit and b.group is not None), None)
    if s.culprits == s.no_dump and not s.not_entered:
        fix = (f"rank{'s' if len(s.culprits) > 1 else ''} {ranges(s.culprits)} left no dump: most likely "
               f"{'it' if len(s.culprits) == 1 else 'they'} died (the kernel's OOM killer, a segfault, an exception "
               "or an NCCL abort on that rank only). Check that host's logs (dmesg, the launcher's exit codes, the "
               "rank's stderr) and its memory; with torchrun, the first failed worker's error names it")
    elif where is not None:
        fix = (f"rank {culprit} skipped {s.op} #{s.seq} and went on to {where.op} #{where.seq} of {where.label}: a "
               f"branch taken on that rank only (a condition on the rank, its data or a flag). Make every member call "
               f"the group's collectives in the same order; look at the code after {_site(s, culprit)}")
    elif s.not_entered:
        fix = (f"rank {culprit} stopped calling collectives after {_site(s, culprit)}: look at what it does next. "
               "Usual causes: a branch taken on that rank only (skipping a collective, e.g. an uneven last "
               "batch: drop_last=True or pad the shards), an input pipeline or I/O stuck on that rank "
               f"(py-spy dump --pid on it shows where), an exception caught on that rank only, or a checkpoint "
               f"save longer than the timeout (raise init_process_group(timeout=...) or save asynchronously)")
    else:
        fix = (f"rank {culprit}'s device never started {s.op} #{s.seq}: its stream is held by earlier work (a long "
               "or stuck kernel, a device-side assert): check that GPU (nvidia-smi, Xid errors in dmesg) and run "
               "the rank with CUDA_LAUNCH_BLOCKING=1 to find the kernel")
    summary = f"Job stopped: {r.verdict}"
    if r.unknown:
        summary += f" ({r.unknown})"
    yield Finding(
        id="collective_hang", severity="high", ranks=list(s.culprits), steps=[], summary=summary,
        evidence=_evidence(r, s),
        explanation=("A collective completes only when every member of its process group enters it; the members "
                     "that entered wait until the timeout ends the job. The Flight Recorder dumps show, per group, "
                     "which members entered each sequence number."),
        fix=fix, threshold={})


_DESYNC_FIXES = {
    "op": "members called different collectives at the same point: the code path differs between ranks (a "
          "condition on the rank or on its data). Make every rank call the same collectives in the same order",
    "input_sizes": "members passed tensors of different sizes: usually an uneven last batch (drop_last=True, or pad "
                   "the shards) or shapes that depend on the rank's data (pad to a common size)",
    "output_sizes": "members expect outputs of different sizes: check the output tensors' shapes on that rank "
                    "(all_gather / reduce_scatter lists, uneven shards)",
    "dtype": "members passed different dtypes: mixed precision set differently on some ranks (autocast, "
             "model.to(dtype), a buffer left in float32): make the dtypes equal before the collective",
}


@rule("collective_desync", view=HangView)
def collective_desync(view: HangView) -> Iterable[Finding]:
    """The verdict's first stall is a desync: members entered collectives that differ in op, sizes or
    dtypes at one sequence number."""
    r, s = view.report, view.report.first
    if s is None or s.kind != "desync":
        return
    field = s.mismatched[0].field
    sites = "; ".join(f"rank {m.rank}: {_site(s, m.rank)}" for m in s.mismatched[:3])
    summary = f"Job stopped: {r.verdict}" + (f" ({r.unknown})" if r.unknown else "")
    yield Finding(
        id="collective_desync", severity="high", ranks=list(s.culprits), steps=[], summary=summary,
        evidence=_evidence(r, s),
        explanation=("Every member of a process group must call the same collective, with the same sizes and "
                     "dtypes, at each sequence number; when they do not, the collective fails or hangs."),
        fix=f"{_DESYNC_FIXES[field]} (the call: {sites})", threshold={})
