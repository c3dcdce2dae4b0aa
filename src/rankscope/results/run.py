"""A whole run: every profiler cycle of a job (docs/runs.md; JSON `run`).

A profiler schedule with `repeat` writes one file per rank per cycle. Each cycle is analysed as a
job of its own; the run keeps per cycle a small row (`RunCycle`), per rank and profiled step its step
time (`TrendStep`: both made by analyses/run/cycles.py), and the changes found over the
run (`RunChange`, analyses/run/changes.py). Pure data.
"""
from __future__ import annotations

import msgspec

from typing import Literal

from rankscope.results.stragglers import StragglerCause

__all__ = ["ChangeKind", "CycleStraggler", "Run", "RunChange", "RunCycle", "TrendStep", "WatchStatus"]

ChangeKind = Literal["slowdown", "speedup", "straggler_onset", "straggler_end", "finding_onset"]


class CycleStraggler(msgspec.Struct):
    """The cycle's costliest straggler (the cross-rank verdict of that cycle)."""
    rank: int
    cause: StragglerCause
    cost_ms_per_step: float


class RunCycle(msgspec.Struct):
    """One profiler cycle: its files (one per rank), its profiled steps, the median over its ranks'
    steps of the step time, its straggler and the finding ids of its own analysis."""
    cycle: int                          # 1-based, in step order
    files: list[str]
    ranks: list[int]
    rank_step_ms: list[float | None]    # each rank's median step in the cycle (the order of `ranks`; None: no step)
    missing_ranks: list[int]            # ranks of the job's world without a file in this cycle
    steps: list[int]
    step_ms_median: float | None
    step_ms_max: float | None           # the slowest rank's median step in the cycle
    straggler: CycleStraggler | None
    findings: list[str]


class RunChange(msgspec.Struct):
    """A change over the run. slowdown / speedup: a rank (or the whole job: rank None) whose step time
    moved from `first_step` on; `before_ms` / `after_ms` are the median step before and after, `cause`
    the step breakdown category that moved most, `z` the move over the run's noise (`noise_ms`: the
    standard deviation of a step time that the run shows without a change). straggler_onset / _end: the
    cycle's straggler verdict began / ended (`before_ms` / `after_ms`: its cost per step to the other
    ranks; `cause`: the straggler cause). finding_onset: a finding first raised in `first_cycle`
    (`finding`: its id; `cause`: its id too)."""
    kind: ChangeKind
    rank: int | None
    first_step: int
    first_cycle: int
    before_ms: float | None
    after_ms: float | None
    cause: str | None
    ranks: list[int] = []               # slowdown / speedup of the job: the ranks whose own work moved
    z: float | None = None
    noise_ms: float | None = None
    finding: str | None = None


class TrendStep(msgspec.Struct):
    """One rank's profiled step: which cycle it is in, its time (ms)."""
    rank: int
    step: int
    cycle: int
    step_ms: float


class Run(msgspec.Struct):
    """Every cycle of the job in step order, the step-time trend and the changes."""
    cycles: list[RunCycle]
    trend: list[TrendStep]
    changes: list[RunChange]
    detailed_cycle: int                 # the cycle whose analysis the rest of the report shows (the last)
    noise_pct: float | None             # the run's noise from one profiled step to the next in a cycle, % of a step
    cycle_noise_pct: float | None       # ... from one cycle's median step to the next cycle's, % of a step
    z_critical: float                   # how far over the noise a move must be to count (from the false-alarm rate)


class WatchStatus(msgspec.Struct):
    """Where `rankscope watch` stands: the folder, files seen and read, cycles analysed and waiting
    (each by its steps), seconds since a file last appeared or changed."""
    folder: str
    files_seen: int
    files_read: int
    cycles_analysed: int
    cycles_waiting: list[list[int]]
    idle_s: float
    settle_s: float
