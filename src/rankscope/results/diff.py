"""What `rankscope diff` finds (docs/diff-schema.md): two runs compared, per metric the means, the
change, Welch's test and a bootstrap interval, the stragglers and findings that came and went, the
kernels and ops that moved. Made by analyses/job/diff.py."""
from __future__ import annotations

from typing import Literal

import msgspec
import polars as pl

#: Significance level: the conventional 5% (R. A. Fisher, Statistical Methods for Research
#: Workers, 1925): what "beyond noise" means in an A/B reading.
ALPHA = 0.05
#: Bootstrap resamples; Efron & Tibshirani (1993, ch. 19) ask for >= 1000 for percentile intervals.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


class Comparison(msgspec.Struct):
    """One metric, BEFORE vs AFTER (module docstring: statistics)."""
    metric: str
    before: float | None               # mean of the samples
    after: float | None
    delta: float | None                # after - before
    delta_pct: float | None            # 100 * delta / before (None when before is 0)
    p_value: float | None              # Welch's t-test, two-sided
    ci: tuple[float, float] | None     # bootstrap CI of delta at level 1 - ALPHA
    significant: bool
    n_before: int
    n_after: int
    t: float | None = None
    df: float | None = None


# ----------------------------------------------------------------------------------------------
# The diff
class Compared(msgspec.Struct):
    """What was compared with what."""
    labels: tuple[str, str]                     # how the two sides are named (the inputs)
    rank_match: str                             # "rank_id" | "order"
    rank_pairs: list[tuple[int, int]]           # (BEFORE rank, AFTER rank)
    ranks_before: list[int]                     # every rank each side has
    ranks_after: list[int]
    steps_before: int                           # steps on the compared ranks, each side
    steps_after: int
    samples: int                                # step samples compared per side (steps x ranks)
    formats_before: list[str]
    formats_after: list[str]
    warnings: list[str] = []


class RankDiff(msgspec.Struct):
    rank_before: int
    rank_after: int
    steps_before: int
    steps_after: int
    steps_compared: int
    metrics: dict[str, Comparison]
    largest_move: Comparison | None = None   # the step-breakdown category that moved most, significantly


ChangeStatus = Literal["resolved", "introduced", "persisting"]


class StragglerChange(msgspec.Struct):
    rank: int                                   # AFTER's rank id (BEFORE's renamed by the pairing)
    status: ChangeStatus
    cause_before: str | None
    cause_after: str | None
    cost_ms_per_step_before: float | None
    cost_ms_per_step_after: float | None


class FindingChange(msgspec.Struct):
    id: str
    ranks: list[int]                            # AFTER's rank ids
    status: ChangeStatus
    severity_before: str | None
    severity_after: str | None
    summary: str | None                         # AFTER's summary, else BEFORE's


class NameDiff(msgspec.Struct):
    """Per-name diff of kernels or ops: `rows` (NAME_COLUMNS, by impact) and the count per status."""
    rows: pl.DataFrame
    counts: dict[str, int]


class Diff(msgspec.Struct):
    headline: str
    compared: Compared
    job: dict[str, Comparison]                  # STEP_METRICS over steps x ranks
    ranks: list[RankDiff]
    collectives: dict[str, Comparison]          # COLLECTIVE_METRICS; {} unless both jobs have collectives
    straggler_verdicts: tuple[str | None, str | None]
    stragglers: list[StragglerChange]
    findings: list[FindingChange] | None        # None: neither analysis carries findings
    kernels: NameDiff
    ops: NameDiff
