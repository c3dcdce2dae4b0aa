"""Clock alignment across ranks (docs/concepts.md "Clock alignment"): per rank the offset of its
clock from the median clock of the ranks, estimated from matched collective ends, and whether it
was applied. Made by analyses/job/clock.py."""
from __future__ import annotations

from typing import Literal

import msgspec


class RankClock(msgspec.Struct):
    """One rank: its offset (ms, to subtract from its timestamps), the offset's uncertainty (ms, one
    standard error; None when not estimated), the collectives it used, whether it was applied."""
    rank: int
    offset_ms: float
    uncertainty_ms: float | None
    collectives_used: int
    applied: bool


ClockMethod = Literal["collective_end", "raw"]


class ClockAlignment(msgspec.Struct):
    """`method`: "collective_end" when at least one offset was estimated, else "raw" (timestamps used
    as recorded); `note`: one line for the user."""
    method: ClockMethod = "raw"
    reference: Literal["median clock of the ranks"] = "median clock of the ranks"
    note: str = ""
    ranks: list[RankClock] = []
