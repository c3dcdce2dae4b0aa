"""A whole run: every profiler cycle of a job (docs/runs.md; JSON `run`).

A profiler schedule with `repeat` writes one file per rank per cycle. Each cycle is analysed as a
job of its own; the run keeps per cycle a small row (`RunCycle`), per rank and profiled step its step
time and breakdown (`TrendPoint`: both made by analyses/run/cycles.py), and the changes found over the
run (`RunChange`, analyses/run/changes.py). Pure data.
"""
from __future__ import annotations

import msgspec

from rankscope.analyses.run.changes import ChangeKind, RunChange
from rankscope.analyses.run.cycles import CycleStraggler, RunCycle, TrendPoint

__all__ = ["ChangeKind", "CycleStraggler", "Run", "RunChange", "RunCycle", "TrendPoint", "WatchStatus"]


class Run(msgspec.Struct):
    """Every cycle of the job in step order, the step-time trend and the changes."""
    cycles: list[RunCycle]
    trend: list[TrendPoint]
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
