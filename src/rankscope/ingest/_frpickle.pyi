"""Types of the C Flight Recorder pickle reader (_frpickle.c); rankscope.ingest.flight_recorder wraps it."""
from typing import Any, Callable

from _typeshed import ReadableBuffer


class WalkLimit(Exception):
    """The walk over entries, sizes and frames passed its limit."""


def read(data: ReadableBuffer, walk_limit: int, /) -> None | tuple[
        dict[str, Any], int, Any, Any, Callable[[list[int]], list[list[tuple[str, str, int]]]]]:
    """None (left to the restricted unpickler) or (top-level values, entries, number columns, text
    columns, frames(places): the Python frames of the entries at those places)."""
