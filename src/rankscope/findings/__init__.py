"""Findings: analysis results -> diagnoses with evidence and a concrete fix (docs/findings.md).

Each rule (registry.py: one signature, registered by finding id) reads the per-rank summaries and
the typed cross-rank result of a job (results/), or one run of compared NCCL logs (nothing is
recomputed from events), and yields at most one `Finding` of its id (per NCCL run). Every
threshold is a named entry of `rankscope.thresholds.THRESHOLDS` with its unit and source; users
override any of them (`rankscope analyze --threshold dataloader_high_pct=30`, or
`evaluate(..., thresholds=resolve(overrides))`: resolved once, by the pipeline). Families: stragglers.py,
communication.py, host.py, memory.py, compute.py, parallel.py (parallel layouts), inputs.py (NCCL logs),
hang.py (Flight Recorder dumps); docs/findings.md lists every id.

Job-level shares are the median over ranks of a per-rank share of the mean step (docs/concepts.md,
Step breakdown), so one odd rank does not decide for the job; the ranks a finding names are those
over the lowest tier. Severity tiers: high (fix first: costs a large share of every step),
medium, low. Findings are ordered by severity, then by what they cost per step.

Time that a rank spends waiting at a collective for a late rank is not counted as exposed
communication: it belongs to the straggler / load-imbalance findings that name its cause.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rankscope.findings import communication, compute, host, inputs, memory, parallel, stragglers  # noqa: F401  (rules)
from rankscope.findings.hang import hang_findings
from rankscope.findings import run as _run  # noqa: F401  (the whole run's rules)
from rankscope.findings.registry import JobView, NcclView, ordered, run
from rankscope.results import Finding
from rankscope.thresholds import resolve

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results.nccl import NcclReport
    from rankscope.results import JobInfo
    from rankscope.results.hang import HangReport
    from rankscope.results.job import JobResult
    from rankscope.results.rank import RankSummary
    from rankscope.thresholds import Thresholds

__all__ = ["evaluate", "nccl_findings", "ordered"]


def evaluate(ranks: list[RankSummary], cross: JobResult | None, job: JobInfo, hang: HangReport | None = None,
             thresholds: Thresholds | None = None) -> list[Finding]:
    """All findings of a job (its ranks' summaries and cross-rank result, and its Flight Recorder
    dumps' verdict), ordered by severity then cost per step. `thresholds`: the values in force
    (`rankscope.thresholds.resolve`), by default the defaults."""
    t = resolve(thresholds)
    return ordered(run(JobView.of(ranks, cross, job, t)) + hang_findings(hang, t))


def nccl_findings(report: NcclReport, thresholds: Mapping[str, float] | None = None) -> list[Finding]:
    """Findings of NCCL logs compared as runs (analyses/inputs/nccl.py), ordered by severity;
    `thresholds` as in `evaluate`."""
    t = resolve(thresholds)
    return ordered([f for r in report.runs for f in run(NcclView(report, r, t))])
