"""The jobs found in inputs that hold several (`analyze` lists them; the user picks one with
`--job N`)."""
from __future__ import annotations

import msgspec


class FoundJob(msgspec.Struct):
    job: int                        # its number, 1 = the earliest
    world_size: int | None
    ranks: list[int]                # the ranks its files claim
    files: list[str]
    group_sizes: list[int]          # sizes of its process groups other than the world (its layout's shape)
    start_utc: str | None           # its time range on the wall clock, when the traces give one
    end_utc: str | None
