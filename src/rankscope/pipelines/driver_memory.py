"""The driver's memory while a job's ranks are mapped: what it does to each rank's summary as it arrives
(`_arrived`: the strings every rank repeats shared, the collectives' arrays copied out of the engine's
reply buffer) and to the C heap once the map is done (`_trim_heap`). The flow itself (discover -> map
-> reduce -> findings) is pipelines/job.py, which calls these."""
from __future__ import annotations

import dataclasses
import gc
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from rankscope.ingest import reuse
from rankscope.model import InputProblem

if TYPE_CHECKING:
    from rankscope.results.rank import MappedRank


_NUMBERS = {int, float, bool, type(None)}


def share_strings(obj: Any, pool: dict[str, str]) -> Any:
    """`obj` with every string replaced by the equal one in `pool` (added there when new). The
    ranks of a job repeat the same kernel, op, category and column names, and each rank's summary
    arrives (unpickled from a worker, or decoded from the cache) with its own copies: at 10 MB
    synth ranks, 49 KB of a summary's 127 KB of Python objects outside its collectives are strings,
    35 KB of them the same on every rank. Dicts and tuples are rebuilt, lists, (non-frozen) msgspec Structs and
    (non-frozen) dataclasses changed in place; everything else is left as it is."""
    if type(obj) in _NUMBERS:
        return obj
    if isinstance(obj, str):
        return pool.setdefault(obj, obj)
    if isinstance(obj, dict):
        return {share_strings(k, pool): share_strings(v, pool) for k, v in obj.items()}
    if isinstance(obj, list):
        if not set(map(type, obj)) <= _NUMBERS:          # most lists are columns of numbers
            for i, v in enumerate(obj):
                obj[i] = share_strings(v, pool)
        return obj
    if isinstance(obj, tuple):
        return tuple(share_strings(v, pool) for v in obj)
    if isinstance(obj, msgspec.Struct) and not obj.__struct_config__.frozen:
        for name in obj.__struct_fields__:
            setattr(obj, name, share_strings(getattr(obj, name), pool))
        return obj
    if (dataclasses.is_dataclass(obj) and not isinstance(obj, type)
            and not obj.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        for f in dataclasses.fields(obj):
            setattr(obj, f.name, share_strings(getattr(obj, f.name), pool))
    return obj


def _arrived(result: MappedRank | list[MappedRank] | InputProblem, strings: dict[str, str]) -> None:
    """Runs in the driver on each rank's summary as it arrives, so that what the driver holds per
    rank stays small while the others are mapped: the strings every rank repeats are shared
    (`share_strings`), and the collectives' arrays are copied out of the buffer the engine
    delivered them in (Ray unpickles numpy arrays as views into the task's whole reply, which
    they would keep alive)."""
    if isinstance(result, list):
        for one in result:
            _arrived(one, strings)
        return
    if isinstance(result, InputProblem):
        return
    rc = result.collectives
    if rc is not None:
        for name in rc.__struct_fields__:
            value = getattr(rc, name)
            if isinstance(value, np.ndarray) and value.base is not None:
                setattr(rc, name, value.copy())
    share_strings(result, strings)


def _trim_heap(engine: str) -> None:
    """Hand the C heap's free pages back to the OS (glibc's malloc_trim) once the map is done.
    Receiving the summaries frees most of what it allocates (Ray's replies, the strings and
    arrays `_arrived` replaces), but glibc keeps the pages, between the objects that stay, where
    neither the reduce (polars has its own allocator) nor anything else would reuse them: 20 MB
    of 124 MB at 256 ranks on Ray. Nothing happens where the C library has no malloc_trim."""
    if engine == "ray":
        gc.collect()                  # Ray's replies leave reference cycles (a full collection: ~15 ms)
    reuse.trim_heap()
