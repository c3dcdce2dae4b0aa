"""The critical path (docs/concepts.md "Critical path"): per step the chain of activities across ranks
that set its end, its parts by rank and category, the what-ifs (each fix re-timed through the job's
dependencies: "one estimate per fix"), swimlanes of the slowest and the median step, and the
replay error. Made by analyses/job/critical_path.py."""
from __future__ import annotations

import msgspec


class Segment(msgspec.Struct):
    rank: int
    category: str                    # a step-breakdown category
    name: str                        # the collective (type and dimension) or the window it belongs to
    start_ms: float                  # from the step's start
    dur_ms: float


class StepPath(msgspec.Struct):
    step: int
    duration_ms: float
    segments: list[Segment] = []
    start_ns: int = 0                # the step's start on the aligned clock (segments' start_ms count from it)


class RankCategory(msgspec.Struct):
    rank: int
    category: str                    # "host_idle" | a step-breakdown category
    ms_per_step: float
    pct_of_step: float


class WhatIf(msgspec.Struct):
    rank: int | None                 # None: a job-wide change
    change: str
    step_ms_saved: float
    key: str = ""                    # the change, for the findings that propose it (`WHAT_IF_KEYS`)
    ranks: list[int] = []   # the ranks it changes ([]: every rank)
    theory_step_ms_saved: float | None = None        # pipeline schedule changes: (p-1)/(m+p-1)'s saving


class Lane(msgspec.Struct):
    """One rank in a swimlane: its step window and its collectives, ms from the step's start:
    arrival, the last member's arrival (its wait ends), end; with their names."""
    rank: int
    step_start_ms: float
    step_end_ms: float
    collectives: list[list[float]] = []   # [arrival, last arrival, end]
    names: list[str] = []


class Swimlane(msgspec.Struct):
    step: int
    label: str                       # "slowest step" | "median step"
    lanes: list[Lane] = []


class CriticalPath(msgspec.Struct):
    steps: list[StepPath] = []
    by_rank_category: list[RankCategory] = []
    what_if: list[WhatIf] = []
    step_ms: float = 0.0                               # mean path duration
    owner: int | None = None                           # the rank holding >= critical_path_owner_pct of the path
    owner_pct: float = 0.0                             # the largest share of the path one rank holds
    swimlanes: list[Swimlane] = []   # the slowest and the median step (`_swimlane`)
    # the job's step as measured (the longest rank's step, end - start, mean over steps), as the
    # re-timing with no change gives it back, and how far apart (% of the measured step)
    measured_step_ms: float = 0.0
    replayed_step_ms: float = 0.0
    replay_error_pct: float = 0.0                      # mean over steps of |replayed - measured| / measured
    replay_error_max_pct: float = 0.0
