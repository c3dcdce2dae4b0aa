"""Types of the C column extractor and JSON scanner (_fastcols.c); rankscope.ingest.columns wraps it.
A spec is a tuple: (outer, inner, kind, default, table) for `columnize` (member descriptors and a dict),
(event key, args key or None, kind, default, table index) for `scan_events`."""
from typing import Any, Sequence

import numpy as np
from _typeshed import ReadableBuffer


class ScanState:
    """What `scan_events` keeps across the chunks of one file (opaque)."""


def columnize(objs: list[Any], specs: Sequence[tuple[Any, ...]], indices: np.ndarray | None, /) -> list[bytes]: ...
def scan_events(body: ReadableBuffer, specs: Sequence[tuple[Any, ...]], tables: list[dict[str, int]],
                state: ScanState | None = None, routing: tuple[Any, ...] | None = None, /
                ) -> tuple[list[bytes] | tuple[list[list[bytes]], bytes], int, int] | int: ...
def scan_state(tables: int, /) -> ScanState: ...
