"""Decoded msgspec Structs -> typed numpy columns.

`columnize(objs, specs, indices)` walks a list of event Structs once per column and returns one
numpy array per spec. The C extension `_fastcols` does this at a few ns per value; this module's
pure-Python twin defines the same contract (tests compare both) and is used where the extension
could not be built.

A spec is `Col(outer, inner, kind, default, table)`; see `_fastcols.c` for the kinds:
't' JSON microseconds -> int64 ns, 'f' float64, 'i' int64, 's' str -> int32 code,
'k' int or str key -> int64, 'r' raw JSON text -> int32 code, 'p' list product -> int64.
A 't' value that is present but not a number (NaN, text, a list...) becomes T_NOT_A_NUMBER, one
beyond int64 nanoseconds (Infinity, 1e30) saturates at +-T_MAX: the reader drops those events.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any, NamedTuple, Sequence

import numpy as np

try:  # pragma: no cover - exercised implicitly when the build succeeded
    from rankscope.ingest import _fastcols
except ImportError:  # pragma: no cover - fallback when no C compiler was available
    _fastcols = None  # type: ignore[assignment]  # no C module: None (its stub types the built one)

#: 't' columns: a value that is not a number; magnitudes beyond int64 nanoseconds saturate at +-T_MAX
T_NOT_A_NUMBER = -2**63
T_MAX = 2**63 - 1
#: The default of a 't' column whose value must be there (an event's ts and dur): absent or null
T_ABSENT = -2**63 + 2

#: numpy dtype of the column each kind produces
DTYPES = {"t": np.int64, "f": np.float64, "i": np.int64, "s": np.int32, "k": np.int64,
           "r": np.int32, "p": np.int64}


class Col(NamedTuple):
    outer: Any            # member descriptor of the event Struct, e.g. Event.ts
    inner: Any            # member descriptor of the nested Struct, e.g. Args.stream, or None
    kind: str
    default: float | int = 0
    table: dict | None = None


def _digits(s: str) -> int | None:
    if 0 < len(s) <= 18 and (s.isdigit() or (s[0] == "-" and s[1:].isdigit())) and s.isascii():
        return int(s)
    return None


def _code(table: dict | None, key: str) -> int:
    assert table is not None          # the specs of kinds 'k', 's' and 'r' have a table
    code = table.get(key)
    if code is None:
        code = table[key] = len(table)
    return code


def _saturated(negative: bool) -> int:
    return -T_MAX if negative else T_MAX


def _time_ns(v: Any, default: int) -> int:
    """Kind 't': microseconds -> round(v * 1000) ns, half to even, saturated; absent -> default."""
    if v is None:
        return default
    if type(v) is int:
        return max(-T_MAX, min(T_MAX, v * 1000))
    if type(v) is float:
        if v != v:
            return T_NOT_A_NUMBER
        ns = v * 1000.0
        return int(np.rint(ns)) if abs(ns) < 9.2e18 else _saturated(ns < 0)
    if not isinstance(v, Decimal) or v.is_nan():       # the exact text of a JSON number, or not a number
        return T_NOT_A_NUMBER
    if v.is_infinite() or v.adjusted() >= 19:        # |v| >= 1e19 us: far beyond int64 ns
        return _saturated(v.is_signed())
    ns = round(v * 1000)
    return ns if -T_MAX <= ns <= T_MAX else _saturated(v.is_signed())


def _convert(v: Any, spec: Col) -> float | int:
    kind, default = spec.kind, spec.default
    if kind == "t":
        return _time_ns(v, int(default))
    if kind == "f":
        try:
            return float(v) if type(v) in (int, float) else float(default)
        except OverflowError:
            return float(default)
    if kind == "i":
        if type(v) is int and -2**63 <= v < 2**63:
            return v
        if type(v) is float and np.isfinite(v) and abs(v) <= 9.2e18:
            return int(v)
        if type(v) is str:
            d = _digits(v)
            return int(default) if d is None else d
        return int(default)
    if kind == "k":
        if type(v) is int and -2**63 <= v < 2**63:
            return v
        if type(v) is str:
            d = _digits(v)
            return d if d is not None else -2 - _code(spec.table, v)
        return int(default)
    if kind == "s":
        return _code(spec.table, v) if type(v) is str else -1
    if kind == "r":
        try:
            text = bytes(memoryview(v)).decode("utf-8", "replace")
        except TypeError:
            return -1
        return _code(spec.table, text)
    if kind == "p":
        if type(v) is list and v and all(type(x) is int and -2**63 <= x < 2**63 for x in v):
            product = 1
            for x in v:
                product = (product * x + 2**63) % 2**64 - 2**63     # int64 wrap-around, like C
            return product
        return int(default)
    raise ValueError(f"unknown column kind {kind!r}")


def _columnize_py(objs: list, specs: Sequence[Col], indices: np.ndarray | None) -> list[np.ndarray]:
    picked = objs if indices is None else [objs[i] for i in indices]
    out = []
    for spec in specs:
        outer_name = spec.outer.__name__
        inner_name = spec.inner.__name__ if spec.inner is not None else None
        values = []
        for obj in picked:
            v = getattr(obj, outer_name, None)
            if inner_name is not None:
                v = getattr(v, inner_name, None)
            values.append(_convert(v, spec))
        out.append(np.array(values, dtype=DTYPES[spec.kind]))
    return out


def columnize(objs: list, specs: Sequence[Col], indices: np.ndarray | None = None,
              use_c: bool = True) -> list[np.ndarray]:
    """One typed numpy array per spec, over `objs` (or only `objs[indices]`)."""
    if _fastcols is None or not use_c:
        return _columnize_py(objs, specs, indices)
    idx = None if indices is None else np.ascontiguousarray(indices, dtype=np.int64)
    buffers = _fastcols.columnize(objs, [tuple(s) for s in specs], idx)
    return [np.frombuffer(b, dtype=DTYPES[s.kind]) for b, s in zip(buffers, specs)]


def scan_json(body, specs: Sequence[tuple], tables: list[dict], state=None,
              routing: tuple | None = None
              ) -> tuple[list[np.ndarray] | tuple[list[list[bytes]], bytes], int, int] | int | None:
    """C scanner over a JSON array of events: (one array per spec, events, non-object elements);
    an int where the scanner declines (invalid JSON, unexpected types): the byte offset where it
    stopped, and the caller decodes with msgspec; None without the extension.
    Specs are (event key, args key or None, kind, default, table index). `state`: from
    `scan_state(tables)`, passed with every chunk of one file. With `routing` (see the Kineto
    reader), the first item is instead the rows already split into groups, as the C code returns
    them, unless a code of the chunk is not in the routing yet."""
    if _fastcols is None:
        return None
    out = _fastcols.scan_events(body, specs, tables, state, routing)
    if not isinstance(out, tuple):
        return int(out)
    buffers, n, bad = out
    if isinstance(buffers, tuple):
        return buffers, n, bad
    return [np.frombuffer(b, dtype=DTYPES[s[2]]) for b, s in zip(buffers, specs)], n, bad


def scan_state(tables: list[dict]):
    """What the scanner keeps from chunk to chunk of one file (string caches for its `tables`,
    column buffers); None without the extension."""
    return None if _fastcols is None else _fastcols.scan_state(len(tables))


def has_c_extension() -> bool:
    return _fastcols is not None
