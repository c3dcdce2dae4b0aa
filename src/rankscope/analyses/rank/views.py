"""The parts of one rank's events that several analyses start from, each made once per trace.

A rank's analyses ask the same first questions (which events are kernels, which are host ops,
which names are ProfilerStep marks); answered once here and kept in `RankTrace.derived` (never
persisted), the summary of a rank no longer filters its event frame dozens of times.
"""
from __future__ import annotations

from typing import Callable, Iterable, TypeVar

import numpy as np
import polars as pl

from rankscope import model
from rankscope.model import DEVICE_KINDS, HOST_OP_KINDS, RankTrace

T = TypeVar("T")


def memo(trace: RankTrace, key: tuple, make: Callable[[], T]) -> T:
    """`make()` once per trace and key."""
    if key not in trace.derived:
        trace.derived[key] = make()
    return trace.derived[key]


def _kind_key(kinds: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted({int(k) for k in kinds}))


def of_kinds(trace: RankTrace, kinds: Iterable[int]) -> pl.DataFrame:
    """The events of these kinds, in the frame's order."""
    wanted = _kind_key(kinds)
    return memo(trace, ("of_kinds", wanted),
                lambda: trace.events.filter(pl.col("kind").is_in(list(wanted))))


def device_events(trace: RankTrace) -> pl.DataFrame:
    """Kernels, memcpy and memset."""
    return of_kinds(trace, DEVICE_KINDS)


def host_ops(trace: RankTrace) -> pl.DataFrame:
    """CPU ops and user annotations (ProfilerStep spans included)."""
    return of_kinds(trace, HOST_OP_KINDS)


def distinct_names(trace: RankTrace) -> list[str]:
    """Every event name of the rank, once."""
    return model.distinct_names(trace.events)


def names_matching(trace: RankTrace, pattern: str) -> list[str]:
    """The rank's distinct names that match `pattern` (regex search), for `pl.col("name").is_in(...)`
    on any of its frames."""
    return memo(trace, ("names_matching", pattern), lambda: model.names_matching(trace.events, pattern))


def column(trace: RankTrace, frame: Callable[[RankTrace], pl.DataFrame], name: str) -> np.ndarray:
    """One column of one of the frames above as a numpy array (no copy where polars allows)."""
    return memo(trace, ("column", frame.__name__, name), lambda: frame(trace)[name].to_numpy())


def is_kind(kind: np.ndarray, kinds: Iterable[int]) -> np.ndarray:
    """Whether each of these event kinds (uint8 `kind` values) is one of `kinds`: a table lookup,
    cheaper than np.isin."""
    table = np.zeros(256, bool)
    table[list(_kind_key(kinds))] = True
    return table[kind]


def kind_mask(trace: RankTrace, kinds: Iterable[int]) -> np.ndarray:
    """Whether each event of the rank is of one of these kinds."""
    return is_kind(trace.events["kind"].to_numpy(), kinds)


def rows_of_kinds(trace: RankTrace, kinds: Iterable[int]) -> np.ndarray:
    """The positions in the rank's event frame of the events of these kinds, ascending (int64: the
    key of the side frames' `row`). Cheaper than `of_kinds` where a few columns are read."""
    wanted = _kind_key(kinds)
    return memo(trace, ("rows_of_kinds", wanted), lambda: np.flatnonzero(kind_mask(trace, wanted)))
