"""The rule registry: every rule has one signature, `(view) -> Iterable[Finding]`, and registers the
finding id it produces, the view it reads and the thresholds it compares against:

    @rule("dataloader_stall", reads=("dataloader_low_pct", "dataloader_medium_pct", "dataloader_high_pct"))
    def dataloader_stall(job: JobView) -> Iterable[Finding]: ...

A view is what one kind of input gives the rules: `JobView` (a job's analysis) or `NcclView` (one
run of compared NCCL logs). `run(view)` calls the rules of the view's kind in `FINDING_IDS` order
(findings tied in severity and cost keep it), each with the thresholds cut to those it declares,
so reading an undeclared one fails.

Also the helpers the rules share: severity tiers, per-rank shares of the step, `ordered`, and
`saving`: a fix's step_ms_saved from the what-if of the same change (analyses/job/critical_path.py,
"one estimate per fix") with the severity its share of the job's median step gives, in the same
bands for every finding (`SEVERITY_BANDS`, declared by every job rule).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Protocol, TypeVar, get_args

import msgspec

from rankscope.results.rank import RankSummary
from rankscope.numbers import rounded
from rankscope.results import Finding, to_plain
from rankscope.results.findings import FindingId, Severity
from rankscope.thresholds import THRESHOLDS, Thresholds

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results.nccl import NcclReport, NcclRun
    from rankscope.results import JobInfo
    from rankscope.results.critical_path import WhatIf
    from rankscope.results.job import JobResult
    from rankscope.results.pipeline import Pipeline

SEVERITIES: tuple[Severity, Severity, Severity] = ("high", "medium", "low")
#: The bands of severity by cost: a fix saving >= saving_high_pct of the median step is high, >=
#: saving_medium_pct medium, else low. Every job rule reads them (`rule` adds them).
SEVERITY_BANDS = ("saving_high_pct", "saving_medium_pct")

#: The stable finding ids, in the order their rules run.
FINDING_IDS: tuple[str, ...] = get_args(FindingId)


@dataclass
class JobView:
    """What the job's rules read: the ranks with steps, the typed cross-rank result, the thresholds
    in force; per rank its mean step and its waits for late ranks at collectives (ms per step,
    concurrent waits once); the job's median step (every "% of step" is of it); the
    job's devices and hosts; per rank the time it waits on its pipeline neighbours (the pp
    dimension's exposed communication, ms per step), which the pipeline findings explain."""
    ranks: list[RankSummary]
    cross: JobResult | None
    thresholds: Thresholds
    step_ms: dict[int, float]
    wait_ms: dict[int, float]
    devices: list[str]
    hosts: list[str]
    pipeline_wait_ms: dict[int, float] = dataclasses.field(default_factory=dict)
    median_step_ms: float = 0.0           # the job's median step (over every rank's steps): "% of step"

    def what_if(self, key: str) -> WhatIf | None:
        """The what-if of change `key` (`critical_path.WHAT_IF_KEYS`), None when not re-timed."""
        cp = self.cross.critical_path if self.cross else None
        return next((w for w in cp.what_if if w.key == key), None) if cp else None

    def pct_of_step(self, ms: float) -> float:
        """`ms` as a share of the job's median step: every "% of step" has that denominator."""
        return 100.0 * ms / self.median_step_ms if self.median_step_ms > 0 else 0.0

    @property
    def pipeline(self) -> Pipeline | None:
        return self.cross.pipeline if self.cross else None

    @classmethod
    def of(cls, summaries: list[RankSummary], cross: JobResult | None, job: JobInfo, thresholds: Thresholds) -> JobView:
        """The view of a job's per-rank summaries and cross-rank result judged against `thresholds`."""
        ranks = [s for s in summaries if s.steps]
        steps = sorted(st.duration_ms for s in ranks for st in s.steps)
        return cls(ranks=ranks, cross=cross, thresholds=thresholds,
                   step_ms={s.rank: sum(s.breakdown_mean_ms.values()) for s in ranks},
                   wait_ms={r.rank: r.own_wait_ms_per_step or 0.0 for r in cross.rank_stats} if cross else {},
                   devices=job.devices, hosts=job.hosts,
                   pipeline_wait_ms={c.rank: c.by_dim["pp"].exposed for c in cross.comm_by_dim if "pp" in c.by_dim}
                   if cross else {},
                   median_step_ms=(cross.median_step_ms if cross and cross.median_step_ms
                                   else median(steps) if steps else 0.0))

    def part(self, s: RankSummary, category: str) -> float:
        """The rank's mean ms per step in a breakdown category."""
        return s.breakdown_mean_ms.get(category, 0.0)

    def steps(self) -> list[int]:
        return sorted({st.step for s in self.ranks for st in s.steps})


@dataclass
class NcclView:
    """What the NCCL-log rules read: the logs compared as runs, the run judged, the thresholds."""
    report: NcclReport
    run: NcclRun
    thresholds: Thresholds


class View(Protocol):
    """What `run` takes: a view dataclass (JobView, NcclView, findings.run.RunView, findings.hang.HangView,
    findings.inputs.MemorySnapshotView) with the thresholds in force, which `run` cuts per rule."""
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    thresholds: Thresholds


@dataclass(frozen=True)
class Rule:
    id: str
    view: type
    reads: tuple[str, ...]
    fn: Callable[..., Iterable[Finding]]


RULES: list[Rule] = []

#: A rule function: (view) -> Iterable[Finding], its own signature kept by `rule`.
RuleFn = TypeVar("RuleFn", bound=Callable[..., Iterable[Finding]])


def rule(finding_id: str, reads: tuple[str, ...] = (), view: type = JobView) -> Callable[[RuleFn], RuleFn]:
    """Register the decorated function as the rule of `finding_id` for inputs of kind `view`,
    comparing against the thresholds `reads`."""
    if finding_id not in FINDING_IDS:
        raise ValueError(f"rule of an unknown finding id {finding_id!r}")
    if view is JobView:
        reads = tuple(reads) + tuple(b for b in SEVERITY_BANDS if b not in reads)
    unknown = [name for name in reads if name not in THRESHOLDS]
    if unknown:
        raise ValueError(f"rule {finding_id!r} reads unknown thresholds {unknown}")

    def register(fn: RuleFn) -> RuleFn:
        if any(r.id == finding_id and r.view is view for r in RULES):
            raise ValueError(f"two rules of {finding_id!r} for {view.__name__}")
        RULES.append(Rule(finding_id, view, tuple(reads), fn))
        return fn
    return register


def rules(view: type) -> list[Rule]:
    """The rules of inputs of kind `view`, in FINDING_IDS order."""
    return sorted((r for r in RULES if r.view is view), key=lambda r: FINDING_IDS.index(r.id))


def run(view: View) -> list[Finding]:
    """Every rule of the view's kind on it, each seeing only the thresholds it declares; each finding's
    evidence as plain JSON data (per-rank mappings keyed by the rank as a string), as every output
    shows it."""
    return [msgspec.structs.replace(f, evidence=to_plain(f.evidence)) for r in rules(type(view))
            for f in r.fn(dataclasses.replace(view, thresholds=view.thresholds.only(r.reads)))]


def ordered(findings: list[Finding]) -> list[Finding]:
    """Most urgent first: by severity, then by what the finding costs per step."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), -(f.cost_ms_per_step or 0.0)))


# ------------------------------------------------------------------------------ shared helpers
def tier(value: float, t: Mapping[str, float], low: str | None, medium: str | None, high: str | None,
         ) -> Severity | None:
    """The severity whose threshold (by name; None: no such tier) `value` reaches, highest first."""
    tiers: tuple[tuple[str | None, Severity], ...] = ((high, "high"), (medium, "medium"), (low, "low"))
    for name, severity in tiers:
        if name is not None and value >= t[name]:
            return severity
    return None


_LOW_TO_HIGH: tuple[Severity, Severity, Severity] = ("low", "medium", "high")


def job_or_rank_tier(shares: dict[int, float], t: Mapping[str, float],
                     tiers: tuple[str | None, str | None, str | None]) -> tuple[Severity | None, list[int]]:
    """Severity from the median rank's share (tiers: low, medium, high threshold names), and the
    ranks over the lowest tier. When the job as a whole is fine, ranks over the top tier still
    make a finding one tier lower: a fault of one rank (often a straggler's cause)."""
    named = [(name, severity) for name, severity in zip(tiers, _LOW_TO_HIGH) if name is not None]
    severity = tier(median(shares.values()), t, *tiers)
    if severity is not None:
        return severity, sorted(r for r, v in shares.items() if v >= t[named[0][0]])
    top, top_severity = named[-1]
    ranks = sorted(r for r, v in shares.items() if v >= t[top])
    one_down = SEVERITIES[min(SEVERITIES.index(top_severity) + 1, len(SEVERITIES) - 1)]
    return (one_down if ranks else None), ranks


def rank_shares(job: JobView, fn: Callable[[RankSummary], float | None]) -> dict[int, float]:
    """Per rank, a share of the step (ranks where `fn` gives None are left out)."""
    out: dict[int, float] = {}
    for s in job.ranks:
        v = fn(s)
        if v is not None:
            out[s.rank] = v
    return out


@dataclass
class Saving:
    """What a fix saves per step, from the what-if of the same change: ms, % of the job's median
    step, the severity those give, the what-if's words."""
    ms: float
    pct: float
    severity: Severity
    change: str
    key: str

    def evidence(self) -> dict[str, Any]:
        return {"step_ms_saved": rounded(self.ms, 3), "step_pct_saved": rounded(self.pct, 2),
                "what_if": self.change, "what_if_key": self.key}

    def text(self) -> str:
        return f"fixing it would shorten the step by {self.ms:,.1f} ms ({self.pct:.1f}% of the median step; what-if)"


def saving(job: JobView, *keys: str) -> Saving | None:
    """The first of the what-ifs `keys` that was re-timed, as a Saving; None when none was."""
    for key in keys:
        w = job.what_if(key)
        if w is not None:
            pct = job.pct_of_step(w.step_ms_saved)
            t = job.thresholds
            severity: Severity = ("high" if pct >= t["saving_high_pct"] else "medium" if pct >= t["saving_medium_pct"]
                                  else "low")
            return Saving(w.step_ms_saved, pct, severity, w.change, key)
    return None


#: What a finding whose fix the model cannot re-time says instead of a number.
NOT_RETIMED = "not re-timed: the model re-times removed or overlapped time, not {what}"
