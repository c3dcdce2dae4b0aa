"""The parts of one rank's events that several analyses start from, each made once per trace.

A rank's analyses ask the same first questions (which events are kernels, which are host ops,
which names are ProfilerStep marks, where each event ends, which call launched a kernel, what its
launch arguments were); answered once here and kept in `RankTrace.derived` (never persisted), the
summary of a rank no longer filters its event frame dozens of times. Frames of events, or numpy
arrays aligned with `trace.events` (masks) or indexing it (row numbers).
"""
from __future__ import annotations

from typing import Callable, Iterable, TypeVar

import numpy as np
import polars as pl

from rankscope import model
from rankscope.analyses.intervals import find_sorted
from rankscope.model import DEVICE_KINDS, HOST_OP_KINDS, Kind, RankTrace

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


def column(trace: RankTrace, kinds: Iterable[int], name: str) -> np.ndarray:
    """One column of the events of these kinds, in the frame's order (`of_kinds(trace, kinds)[name]`
    without the frame), as a numpy array."""
    wanted = _kind_key(kinds)
    return memo(trace, ("column", wanted, name),
                lambda: trace.events[name].to_numpy()[rows_of_kinds(trace, wanted)])


def is_kind(kind: np.ndarray, kinds: Iterable[int]) -> np.ndarray:
    """Whether each of these event kinds (uint8 `kind` values) is one of `kinds`: one comparison per
    kind wanted (on uint8, cheaper than a table lookup, which widens each value to an index)."""
    out = np.zeros(len(kind), bool)
    for k in _kind_key(kinds):
        out |= kind == k
    return out


def kind_mask(trace: RankTrace, kinds: Iterable[int]) -> np.ndarray:
    """Whether each event of the rank is of one of these kinds."""
    return is_kind(trace.events["kind"].to_numpy(), kinds)


def rows_of_kinds(trace: RankTrace, kinds: Iterable[int]) -> np.ndarray:
    """The positions in the rank's event frame of the events of these kinds, ascending (int64: the
    key of the side frames' `row`). Cheaper than `of_kinds` where a few columns are read."""
    wanted = _kind_key(kinds)
    return memo(trace, ("rows_of_kinds", wanted), lambda: np.flatnonzero(kind_mask(trace, wanted)))


def event_end_ns(trace: RankTrace) -> np.ndarray:
    """ts_ns + dur_ns of every event."""
    return memo(trace, ("event_end_ns",), lambda: trace.events["ts_ns"].to_numpy() + trace.events["dur_ns"].to_numpy())


def name_mask(trace: RankTrace, pattern: str) -> np.ndarray:
    """Whether each event's name matches `pattern` (regex search)."""
    return named_mask(trace, names_matching(trace, pattern))


def named_mask(trace: RankTrace, names: Iterable[str]) -> np.ndarray:
    """Whether each event's name is one of `names`: a table of their name codes, read at each
    event's code."""
    wanted = frozenset(names)

    def make() -> np.ndarray:
        codes = model.name_codes(trace.events)
        table = np.zeros(int(codes.present.max(initial=0)) + 1, bool)
        table[[c for c, n in codes.name_of.items() if n in wanted]] = True
        return table[codes.code] & codes.named
    return memo(trace, ("named_mask", wanted), make)


def launch_calls_by_id(trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """The runtime / driver calls with a correlation id: (their ids, their rows), sorted by id, in
    frame order within one id."""
    def make() -> tuple[np.ndarray, np.ndarray]:
        rows = rows_of_kinds(trace, (Kind.RUNTIME, Kind.DRIVER))
        corr = trace.events["correlation"].to_numpy()[rows]
        rows, corr = rows[corr >= 0], corr[corr >= 0]
        order = np.argsort(corr, kind="stable")
        return corr[order], rows[order]
    return memo(trace, ("launch_calls_by_id",), make)


def first_launch_rows(trace: RankTrace, correlation: np.ndarray) -> np.ndarray:
    """For each correlation id, the row of the first (frame order) runtime / driver call with it: the
    call that launched the device event with that id; -1 where none (or the id is negative)."""
    ids, rows = launch_calls_by_id(trace)
    at = find_sorted(ids, np.asarray(correlation, dtype=np.int64))
    return np.where(at >= 0, rows[np.maximum(at, 0)] if len(rows) else -1, -1)


def gpu_args_at(trace: RankTrace, rows: np.ndarray, columns: Iterable[str]) -> dict[str, np.ndarray]:
    """These columns of `trace.gpu_args` (launch details, keyed by `row`) for the events at `rows`
    of trace.events: int64 with -1, or float64 with NaN, where the trace has no value."""
    args = trace.gpu_args
    float_columns = {c for c, t in args.schema.items() if t.is_float()}
    out = {c: np.full(len(rows), np.nan) if c in float_columns else np.full(len(rows), -1, dtype=np.int64)
           for c in columns}
    present = [c for c in out if c in args.columns]
    if not len(rows) or args.is_empty() or "row" not in args.columns or not present:
        return out
    args = args.select("row", *[pl.col(c).cast(pl.Float64).fill_null(np.nan) if c in float_columns
                                else pl.col(c).cast(pl.Int64).fill_null(-1) for c in present])
    order = np.argsort(args["row"].to_numpy(), kind="stable")
    at = find_sorted(args["row"].to_numpy()[order], rows)
    found = at >= 0
    for c in present:
        out[c][found] = args[c].to_numpy()[order[at[found]]]
    return out
