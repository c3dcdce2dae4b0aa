"""Capture quality: whether the traces hold everything the job did while it was profiled, and if
not, what is missing (docs/concepts.md "Capture quality").

A pure function of the per-rank metadata and summaries (what ingest says about each file: cut,
dropped values, format, device events, step marks, kernel-launch calls) and of the consistency
warnings (files that cannot be one job). Each issue names its ranks and says, in one line with
its numbers, what it means. Kinds:

  truncated             the file was cut or corrupt: the events after the break are lost
  dropped_values        events dropped for a ts / dur that is no time (NaN, negative, ...)
  kernels_not_captured  kernel-launch calls recorded, no device activity (CUPTI activity missing)
  legacy_format         an old trace format (2021 Kineto names, a bare event array)
  no_steps              no ProfilerStep#N marks: one step = the whole trace
  different_jobs        the files disagree on world size, devices or a process group, or their trace
                        formats are years apart, or they were recorded over a day apart
  clock_ranges_disjoint their wall-clock time ranges do not overlap (5 s allowed)
  device_not_analysed   device activity of a kind no analysis reads (an accelerator's own event kinds)
  events_not_recognised complete events in categories no profiler writes
  not_a_capture         files refused as no profiler capture (the other ranks are analysed)
  ranks_missing         fewer ranks than the world size: every figure across ranks covers those present

`PARTIAL_KINDS` lose or mix data: the ranks they name are `partial_ranks` (all ranks for
different_jobs), findings drawn from them say so, and `analyze` exits 1.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING


from rankscope.ingest.consistency import CLOCK_SKEW_NS, RECORDED_APART
from rankscope.model import RankMeta
from rankscope.numbers import ranges
from rankscope.units import NS_PER_MS
from rankscope.results.capture import Capture, CaptureIssue, CaptureIssueKind

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results.rank import RankSummary

KINDS = ("truncated", "dropped_values", "kernels_not_captured", "legacy_format", "no_steps", "different_jobs",
         "clock_ranges_disjoint", "device_not_analysed", "events_not_recognised", "not_a_capture", "ranks_missing")
#: Kinds whose data is lost or mixed: the input is partial (exit code 1).
PARTIAL_KINDS = ("truncated", "dropped_values", "kernels_not_captured", "different_jobs", "device_not_analysed",
                 "events_not_recognised", "not_a_capture")
#: Per-rank kinds: the ranks they name are the partial ranks.
_RANK_KINDS = ("truncated", "dropped_values", "kernels_not_captured", "device_not_analysed", "events_not_recognised")
#: Formats read, but older than today's Kineto trace.
LEGACY_FORMATS = {"kineto-2021": "2021 profiler trace format (categories Operator, Kernel, Runtime)",
                  "chrome-array": "bare event array (no Kineto header: no distributedInfo nor deviceProperties)"}
#: Per-rank issues (truncated, dropped values) are listed one by one up to this many ranks, then as one.
MAX_RANK_ISSUES = 4

_JOBS_PREFIX = "these files look like different jobs: "
_TIME_RANGES = "time ranges that do not overlap"
_ERAS_APART = ("trace formats years apart", RECORDED_APART)
_NO_STEPS_WARNING = "have no ProfilerStep marks"
_LEGACY_PROBLEM = "no distributedInfo nor deviceProperties"


def ranks_text(ranks: Sequence[int]) -> str:
    """'rank 3' / 'ranks 0-3, 5'."""
    ranks = sorted(ranks)
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ranges(ranks)


def launches_not_captured(launches: int, ranks: Sequence[int] | None = None) -> str:
    """The line for kernel launches without device activity (the job warning, and the issue's after
    its ranks); `ranks`: where, when not the whole job."""
    where = f" on {ranks_text(ranks)}" if ranks else ""
    return (f"{launches:,} kernel launch{'es' if launches != 1 else ''} recorded{where} but no GPU activity captured "
            f"(CUPTI activity missing or disabled): device figures are unavailable")


def job_capture(ranks: Sequence[RankSummary], warnings: Sequence[str] = (), refused: Sequence[str] = (),
                coverage: tuple[int, int] | None = None) -> Capture:
    """The capture quality of the ranks analysed (sorted by rank); `warnings`: the job's warnings,
    among them the consistency ones (`ingest.consistency.different_jobs`); `refused`: the files
    refused as no profiler capture ("file: why"); `coverage`: (ranks present, world size) when ranks
    are missing."""
    issues: list[CaptureIssue] = []
    restated: list[str] = []
    present = None
    if coverage is not None and coverage[0] < coverage[1]:
        present = f"{coverage[0]:,} of {coverage[1]:,} ranks present"
        said = [w for w in warnings if w.startswith(f"{coverage[0]} of {coverage[1]} ranks present")]
        issues.append(CaptureIssue("ranks_missing", [], f"{said[0] if said else present}: the figures across ranks "
                                   f"(stragglers, critical path, collectives) cover the ranks present only"))
        restated += said
    issues += _per_rank(ranks, "truncated", lambda s: s.meta.salvaged, lambda hit: _truncated(hit, ranks))
    issues += _per_rank(ranks, "dropped_values", lambda s: bool(s.meta.dropped), _dropped)
    for s in ranks:
        m = s.meta
        for p in m.problems:
            if (m.salvaged and p.startswith(f"{m.cut_reason} at byte {m.cut_at_byte}")) or \
                    (m.dropped and p.startswith(f"{sum(m.dropped.values())} event")) or \
                    (m.format in LEGACY_FORMATS and _LEGACY_PROBLEM in p):
                restated.append(f"{m.file}: {p}")

    launched = [s for s in ranks if s.device_events == 0 and s.kernel_launches > 0]
    if launched:
        where, n = [s.rank for s in launched], sum(s.kernel_launches for s in launched)
        issues.append(CaptureIssue("kernels_not_captured", where, f"{ranks_text(where)}: {launches_not_captured(n)}"))
        line = launches_not_captured(n, None if len(launched) == len(ranks) else where)
        restated += [w for w in warnings if w == line]

    for fmt, what in LEGACY_FORMATS.items():
        old = [s for s in ranks if s.meta.format == fmt]
        if old:
            from_names = sorted({s.meta.rank_source for s in old} - {"distributedInfo"})
            source = (f": rank from the file {'name' if from_names == ['filename'] else 'name or order'}"
                      if from_names else "")
            issues.append(CaptureIssue("legacy_format", [s.rank for s in old],
                                       f"{ranks_text([s.rank for s in old])}: {what}{source}"))

    no_steps = [s for s in ranks if s.steps_source == "whole_trace"]
    if no_steps:
        marks = ("no ProfilerStep#N marks nor NVTX step ranges" if all(s.meta.format == "nsys-sqlite" for s in no_steps)
                 else "no ProfilerStep#N marks (the profiler's step() was not called)")
        issues.append(CaptureIssue("no_steps", [s.rank for s in no_steps],
                                   f"{ranks_text([s.rank for s in no_steps])}: {marks}: each is analysed as one step "
                                   f"spanning its trace"))
        restated += [w for w in warnings if _NO_STEPS_WARNING in w]

    everyone = [s.rank for s in ranks]
    for w in warnings:
        if not w.startswith(_JOBS_PREFIX):
            continue
        what = w.removeprefix(_JOBS_PREFIX)
        if what.startswith(_TIME_RANGES):
            issues.append(CaptureIssue("clock_ranges_disjoint", everyone,
                                       f"{what}: recorded at different times (over {CLOCK_SKEW_NS // 10**9} s "
                                       f"apart), so they cannot be one profiling window"))
        elif what.startswith(_ERAS_APART):
            issues.append(CaptureIssue("different_jobs", everyone,
                                       f"{what}: they look like different jobs, and every figure across ranks "
                                       f"mixes them (`analyze --same-job` if they are one)"))
        else:
            issues.append(CaptureIssue("different_jobs", everyone,
                                       f"the files disagree on the {what}: they look like different jobs, and "
                                       f"every figure across ranks mixes them"))
        restated.append(w)

    other = [s for s in ranks if s.meta.device_other_events]
    if other:
        from rankscope.ingest.devices import device_other_line
        n = sum(s.meta.device_other_events for s in other)
        kinds = sorted({s.meta.device_kind or "unknown" for s in other})
        cats = sorted({c for s in other for c in s.meta.device_other_categories})
        line = device_other_line(n, ", ".join(kinds), cats)
        issues.append(CaptureIssue("device_not_analysed", [s.rank for s in other],
                                   f"{ranks_text([s.rank for s in other])}: {line}"))
    unknown = [s for s in ranks if s.meta.unknown_events]
    if unknown:
        n = sum(s.meta.unknown_events for s in unknown)
        issues.append(CaptureIssue("events_not_recognised", [s.rank for s in unknown],
                                   f"{ranks_text([s.rank for s in unknown])}: {n:,} complete event"
                                   f"{'s' if n != 1 else ''} in categories no profiler writes: not understood, "
                                   f"left out of every figure"))
    if refused:
        issues.append(CaptureIssue("not_a_capture", [], f"{len(refused)} file{'s' if len(refused) != 1 else ''} "
                                   f"refused as no profiler capture, not analysed: " + "; ".join(refused[:2])
                                   + (" ..." if len(refused) > 2 else "")))

    partial_ranks = sorted({r for i in issues if i.kind in _RANK_KINDS for r in i.ranks})
    partial = any(i.kind in PARTIAL_KINDS for i in issues)
    return Capture(complete=not issues, partial=partial, issues=issues, partial_ranks=partial_ranks,
                   restated_warnings=restated, coverage=present, headline=_headline(len(issues), partial, present))


def _headline(n: int, partial: bool, coverage: str | None) -> str:
    """The header's capture line: complete; complete with notes (nothing lost: the format, no step
    marks); or PARTIAL with how many issues."""
    if not n:
        return "complete (no trace cut, no value dropped, every launch's kernel captured, steps marked)"
    if coverage:
        others = n - 1
        rest = (f"; PARTIAL: {others} more issue{'s' if others != 1 else ''}" if partial else
                f"; {others} note{'s' if others != 1 else ''}" if others else "")
        return f"{coverage}: every figure across ranks covers the ranks present{rest}"
    if not partial:
        return f"complete, {n} note{'s' if n != 1 else ''} (nothing lost; read below how it was recorded)"
    return (f"PARTIAL: {n} issue{'s' if n != 1 else ''} (what the traces miss or mix; findings drawn from it "
            f"are marked)")


def partial_input_ranks(capture: Capture, ranks: Sequence[int]) -> list[int]:
    """The ranks of partial data behind something drawn from `ranks` ([] = the whole job): its
    partial ranks among them, or every rank of a different_jobs issue."""
    mixed = sorted({r for i in capture.issues if i.kind == "different_jobs" for r in i.ranks})
    if mixed:
        return mixed
    return sorted(set(capture.partial_ranks) & set(ranks)) if ranks else list(capture.partial_ranks)


def partial_reason(capture: Capture) -> str | None:
    """Why the input is partial, one line (None when it is not)."""
    by_kind: dict[str, set[int]] = {}
    for i in capture.issues:
        if i.kind in PARTIAL_KINDS:
            by_kind.setdefault(i.kind, set()).update(i.ranks)
    if not by_kind:
        return None
    parts = [f"{kind.replace('_', ' ')} ({ranks_text(sorted(ranks))})" for kind, ranks in by_kind.items()]
    return ("partial input: " + "; ".join(parts) + ": the figures and findings drawn from it are incomplete "
            "(the report's capture line says what is missing)")


def _per_rank(ranks: Sequence[RankSummary], kind: CaptureIssueKind, has, detail) -> list[CaptureIssue]:
    """One issue per rank that `has` it, or one for all of them beyond MAX_RANK_ISSUES ranks."""
    hit = [s for s in ranks if has(s)]
    if len(hit) <= MAX_RANK_ISSUES:
        return [CaptureIssue(kind, [s.rank], f"rank {s.rank}: {detail([s])}") for s in hit]
    return [CaptureIssue(kind, [s.rank for s in hit], f"{ranks_text([s.rank for s in hit])}: {detail(hit)}")]


def _truncated(hit: Sequence[RankSummary], ranks: Sequence[RankSummary]) -> str:
    if len(hit) > 1:
        kept = sum(s.meta.events_total for s in hit)
        return (f"{len(hit)} files cut or corrupt: the {kept:,} events before their cuts are used, "
                f"those after them are lost")
    m = hit[0].meta
    reason = (m.cut_reason or "file cut").removesuffix(" (truncated)")
    cut = m.cut_at_byte or 0
    if m.file.endswith(".gz"):
        where = f"at byte {cut:,} of its decompressed text (the gzip file holds {m.size_bytes:,} bytes)"
    else:
        where = f"at byte {cut:,} of {m.size_bytes:,} ({cut_percent(cut, m.size_bytes)}% of the file)"
    return (f"{reason} {where}: the {m.events_total:,} events before the cut are used, those after it are lost"
            + _time_lost(m, [s.meta for s in ranks if not s.meta.salvaged]))


def _time_lost(cut: RankMeta, whole: Sequence[RankMeta]) -> str:
    """How far the cut rank's last event falls short of the other ranks' (epoch clock: ts plus
    baseTimeNanoseconds); "" without whole ranks whose time range holds that last event."""
    spans = [_epoch(m) for m in whole if m.span_ns]
    if not spans or not cut.span_ns:
        return ""
    start, end = min(min(a for a, _ in spans), _epoch(cut)[0]), max(b for _, b in spans)
    last = _epoch(cut)[1]
    if not start < last < end:
        return ""
    return (f"; its last event comes {(end - last) / NS_PER_MS:,.1f} ms before the other ranks' last, at "
            f"{math.floor(1000 * (last - start) / (end - start)) / 10:.1f}% of the job's time span")


def _epoch(m: RankMeta) -> tuple[int, int]:
    assert m.span_ns is not None              # ranks with a time range
    a, b = m.span_ns
    return a + (m.base_time_ns or 0), b + (m.base_time_ns or 0)


def cut_percent(cut: int, size: int) -> str:
    """cut / size in percent, one decimal, rounded down (a cut file never reads 100%)."""
    return f"{math.floor(1000 * cut / size) / 10:.1f}" if size > 0 else "?"


def _dropped(hit: Sequence[RankSummary]) -> str:
    totals: dict[str, int] = {}
    for s in hit:
        for reason, n in s.meta.dropped.items():
            totals[reason] = totals.get(reason, 0) + n
    n = sum(totals.values())
    why = ", ".join(f"{k:,} with {reason}" for reason, k in totals.items())
    return (f"{n:,} event{'s' if n != 1 else ''} dropped ({why}): their time is missing from every figure")
