"""The typed in-memory job: vocabulary, per-rank frames and job metadata.

The vocabulary (event kinds, kernel classes and the patterns that assign them) lives here and
nowhere else. Times are int64 nanoseconds inside; outputs convert to `_ms`.

Per rank, `RankTrace` holds polars frames:
  events      every complete ('X') event: kind, name, ts_ns, dur_ns, pid, tid, device, stream,
              correlation, external_id, kclass. Row position = `row` used by the side frames.
  gpu_args    launch details of device activity (kernels, memcpy, memset), keyed by `row`
  comm_args   collective metadata (record_param_comms / nccl:* / collective kernels), keyed by `row`
  op_args     operator details (input shapes/types, call stack, sequence number, flops), by `row`
  memory      `[memory]` instant events (allocator samples)
  flows       flow events ('s'/'f'/'t') other than launch links (those are resolved into
              `events.correlation` at ingest): e.g. forward-backward links (fwdbwd)
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from enum import IntEnum
from typing import Any

import numpy as np
import polars as pl


class Kind(IntEnum):
    """Normalized event kind of a complete event (from the trace category)."""
    CPU_OP = 0
    USER_ANNOTATION = 1
    PYTHON_FUNCTION = 2
    RUNTIME = 3          # cuda_runtime / hip runtime / 2021 "Runtime"
    DRIVER = 4           # cuda_driver
    KERNEL = 5
    MEMCPY = 6
    MEMSET = 7
    GPU_ANNOTATION = 8   # gpu_user_annotation
    SYNC = 9             # cuda_sync (event/stream waits recorded on the device)
    OVERHEAD = 10
    TRACE = 11           # the profiler's own "Trace" span
    OTHER = 12           # a category profilers write that no analysis reads (cuda_event, ...)
    DEVICE_OTHER = 13    # device activity of a kind rankscope does not analyse (DEVICE_OTHER_CATEGORY)
    UNKNOWN = 14         # a category no profiler writes: the event is not understood


#: Trace category (lower-cased) -> kind. Current Kineto names and the 2021 ones.
CATEGORY_KINDS: dict[str, Kind] = {
    "cpu_op": Kind.CPU_OP, "operator": Kind.CPU_OP,
    "user_annotation": Kind.USER_ANNOTATION,
    "python_function": Kind.PYTHON_FUNCTION, "python": Kind.PYTHON_FUNCTION,
    "cuda_runtime": Kind.RUNTIME, "runtime": Kind.RUNTIME, "hip_runtime": Kind.RUNTIME,
    "cuda_driver": Kind.DRIVER, "hip_driver": Kind.DRIVER,
    "kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY, "memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET, "memset": Kind.MEMSET,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_sync": Kind.SYNC,
    "overhead": Kind.OVERHEAD,
    "trace": Kind.TRACE,
    # other devices (Kineto's activity types): host runtimes, and MTIA's on-device (CCP) activity
    "mtia_runtime": Kind.RUNTIME, "xpu_runtime": Kind.RUNTIME, "xpu_driver": Kind.DRIVER,
    "hpu_op": Kind.RUNTIME, "privateuse1_runtime": Kind.RUNTIME, "privateuse1_driver": Kind.DRIVER,
    "mlu_runtime": Kind.RUNTIME, "gcu_runtime": Kind.RUNTIME, "gcu_driver": Kind.DRIVER,
    "mtia_ccp_events": Kind.KERNEL,
    "mlu_memcpy": Kind.MEMCPY, "mlu_memset": Kind.MEMSET, "gcu_memcpy": Kind.MEMCPY, "gcu_memset": Kind.MEMSET,
    "mlu_user_annotation": Kind.GPU_ANNOTATION, "gcu_user_annotation": Kind.GPU_ANNOTATION,
    "xpu_sync": Kind.SYNC, "gcu_sync": Kind.SYNC,
    # written by profilers, read by no analysis
    "cuda_event": Kind.OTHER, "cuda_profiler_range": Kind.OTHER, "glow_runtime": Kind.OTHER,
    "collective_comm": Kind.OTHER, "external_correlation": Kind.OTHER, "cpu_instant_event": Kind.OTHER,
    "mtia_counters": Kind.OTHER, "mtia_workloadd": Kind.OTHER, "xpu_scope_profiler": Kind.OTHER,
    "mlu_profiler_range": Kind.OTHER, "mlu_notifier": Kind.OTHER, "gcu_profiler_range": Kind.OTHER,
}
#: Categories of device activity that no analysis reads (other accelerators' own event kinds, such
#: as MTIA's `mtia_insight`): counted per device kind and named, never taken for host work.
DEVICE_OTHER_CATEGORY = (r"^(mtia|xpu|hpu|npu|tpu|ipu|mlu|gcu|privateuse1)_|(^|_)(device|ccp|dma)(_|$)"
                         r"|(^|_)(kernel|kernels)$")


def category_kind(category: str) -> Kind:
    """The kind of a complete event of this trace category (case-insensitive): CATEGORY_KINDS, else
    DEVICE_OTHER for device activity of another kind, else UNKNOWN."""
    text = category.lower()
    known = CATEGORY_KINDS.get(text)
    if known is not None:
        return known
    return Kind.DEVICE_OTHER if re.search(DEVICE_OTHER_CATEGORY, text) else Kind.UNKNOWN

DEVICE_KINDS = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
HOST_OP_KINDS = (Kind.CPU_OP, Kind.USER_ANNOTATION)


class KernelClass(IntEnum):
    """Kernel classes (docs/concepts.md). NONE for host events that play no device role."""
    NONE = 0
    COMP = 1
    COMM = 2
    MEM = 3


#: Name patterns (regex, case-insensitive) -> class, first match wins. Data, extendable by the user
#: with `register_kernel_pattern`. MEM before COMM: `hipMemcpy*` is MEM, not COMM.
KERNEL_CLASS_PATTERNS: list[tuple[str, KernelClass]] = [
    (r"^(gpu_)?mem(cpy|set)|^hipmem(cpy|set)", KernelClass.MEM),
    (r"nccl|rccl|hccl", KernelClass.COMM),
    (r"multimem_", KernelClass.COMM),
    (r"cross_device_reduce", KernelClass.COMM),                  # vLLM / SGLang custom all-reduce
    (r"deep_?ep|dpsk::ep", KernelClass.COMM),                    # DeepEP dispatch / combine
    (r"nvshmem", KernelClass.COMM),                              # NVSHMEM kernels
    (r"symmetric_memory|symm_mem|(one|two)_?shot_?all_?reduce", KernelClass.COMM),   # PyTorch symmetric memory
    (r"custom_?all_?reduce|all_?reduce_?fusion|lamport", KernelClass.COMM),          # inference engines' all-reduce
    (r"mscclpp|msccl", KernelClass.COMM),                        # MSCCL / MSCCL++
]

#: Host spans that are collectives on CPU-only (gloo) jobs: they play COMM there.
HOST_COMM_PATTERN = r"^gloo:"


def register_kernel_pattern(regex: str, kernel_class: KernelClass) -> None:
    """Add a name pattern ahead of the built-in ones (e.g. a vendor's collective kernels)."""
    KERNEL_CLASS_PATTERNS.insert(0, (regex, KernelClass(kernel_class)))


def classify_names(names: list[str], kinds_present_gpu: np.ndarray) -> np.ndarray:
    """Kernel class for each distinct name: `kinds_present_gpu[i]` says whether name i is used
    by a device event (the first pattern of KERNEL_CLASS_PATTERNS that matches, else COMP). Host
    names get COMM when they are gloo collectives, else NONE (`name_matches`: linear in the names'
    length, each name matched in its first MATCHED_NAME_CHARS characters)."""
    on_device = np.asarray(kinds_present_gpu, dtype=bool)
    out = np.where(on_device, np.uint8(KernelClass.COMP), np.uint8(KernelClass.NONE))
    open_ = on_device.copy()                 # device names no pattern has matched yet
    for pattern, kernel_class in KERNEL_CLASS_PATTERNS:
        hit = open_ & name_matches(re.compile(pattern, re.IGNORECASE), names)
        out[hit] = kernel_class
        open_ &= ~hit
    host_comm = name_matches(re.compile(HOST_COMM_PATTERN, re.IGNORECASE), names)
    out[~on_device & host_comm] = KernelClass.COMM
    return out


def event_kernel_classes(kind: np.ndarray, name_codes: np.ndarray, names: list[str]) -> np.ndarray:
    """Kernel class per event: memcpy/memset events are MEM whatever their name; other events
    take their name's class (`classify_names`). `name_codes` index `names`; -1 = no name."""
    is_dev = np.isin(kind, [int(k) for k in DEVICE_KINDS])
    used_by_dev = np.zeros(len(names) + 1, dtype=bool)
    used_by_dev[name_codes[is_dev & (name_codes >= 0)]] = True
    class_of_name = np.append(classify_names(names, used_by_dev[:len(names)]), np.uint8(KernelClass.NONE))
    kclass = class_of_name[np.where(name_codes >= 0, name_codes, len(names))]
    return np.where(np.isin(kind, [int(Kind.MEMCPY), int(Kind.MEMSET)]), np.uint8(KernelClass.MEM), kclass)


def names_matching(frame: pl.DataFrame, pattern: str | re.Pattern) -> list[str]:
    """The distinct names of `frame` that match `pattern` (regex search). Filter rows with
    `pl.col("name").is_in(...)` on these instead of a string match on every row."""
    names = distinct_names(frame)
    return [n for n, hit in zip(names, name_matches(pattern, names)) if hit]


def name_matches(pattern: str | re.Pattern, names: list[str]) -> np.ndarray:
    """Whether each name matches `pattern` (regex search in its first MATCHED_NAME_CHARS characters), as
    a bool array. The time is linear in the names' length: the pattern runs in polars' regex engine
    (finite automata, no backtracking) over all the names at once. A pattern that engine cannot run
    (look-around, backreferences: a user's own) runs in Python's `re`, each (pattern, name) searched
    once per process."""
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern
    if not names:
        return np.zeros(0, dtype=bool)
    automaton = _automaton_pattern(rx)
    if automaton is not None:
        try:
            return _names_series(names).str.contains(automaton).to_numpy()
        except pl.exceptions.ComputeError:           # not a pattern polars' regex engine runs
            _NOT_AUTOMATON.add((rx.pattern, rx.flags))
    known = _matched.setdefault((rx.pattern, rx.flags), {})
    if len(known) > _MATCHED_MAX:
        known.clear()
    out = np.zeros(len(names), dtype=bool)
    for i, n in enumerate(names):
        hit = known.get(n)
        if hit is None:
            hit = known[n] = rx.search(n[:MATCHED_NAME_CHARS]) is not None
        out[i] = hit
    return out


#: Characters of a name that a pattern is matched against (its start). The longest real kernel name
#: of the corpus has 5,160 (a CUTLASS template); a name of megabytes costs no more than this.
MATCHED_NAME_CHARS = 16_384

#: Python `re` flags -> the inline flags of polars' regex engine (str patterns are Unicode in both).
_INLINE_FLAGS = {re.IGNORECASE: "i", re.MULTILINE: "m", re.DOTALL: "s", re.VERBOSE: "x"}
_NOT_AUTOMATON: set[tuple[str, int]] = set()


def _automaton_pattern(rx: re.Pattern) -> str | None:
    """`rx` written for polars' regex engine, or None where it cannot run there (bytes, ASCII or
    locale flags, or polars refused it before)."""
    if not isinstance(rx.pattern, str) or (rx.pattern, rx.flags) in _NOT_AUTOMATON:
        return None
    flags = rx.flags & ~re.UNICODE
    inline = "".join(c for f, c in _INLINE_FLAGS.items() if flags & f)
    if flags & ~sum(_INLINE_FLAGS):
        return None
    return f"(?{inline}){rx.pattern}" if inline else rx.pattern


_last_series: tuple[list[str], pl.Series] | None = None


def _names_series(names: list[str]) -> pl.Series:
    """`names` as a polars Series, cut at MATCHED_NAME_CHARS characters; the last one is kept (the
    analyses of a rank ask a dozen patterns of the same list of names)."""
    global _last_series
    last = _last_series
    if last is not None and last[0] is names:
        return last[1]
    try:
        series = pl.Series(names, dtype=pl.String)
    except UnicodeEncodeError:             # a lone surrogate (a JSON escape): matched as "?"
        series = pl.Series([n.encode("utf-8", "replace").decode() for n in names], dtype=pl.String)
    longest = series.str.len_bytes().max()
    if isinstance(longest, int) and longest > MATCHED_NAME_CHARS:
        series = series.str.slice(0, MATCHED_NAME_CHARS)
    _last_series = (names, series)
    return series


#: Per pattern that runs in Python's `re`, whether each name seen so far matches it (the ranks a
#: process analyses repeat their names).
_matched: dict[tuple[str, int], dict[str, bool]] = {}
_MATCHED_MAX = 100_000


@dataclass(frozen=True)
class NameCodes:
    """The names of a frame's rows as codes: each name's position in polars' (process-wide) table
    of Categorical strings. Lookups and per-name sums on codes hash no string per row."""
    code: np.ndarray                 # per row, intp; 0 where the name is null
    named: np.ndarray                # per row, whether it has a name
    present: np.ndarray              # the distinct codes of the frame's names ("" included)
    names: list[str]                 # their names

    @cached_property
    def nonempty(self) -> list[str]:
        """The names, without ""."""
        return [n for n in self.names if n]

    def distinct_at(self, rows: np.ndarray) -> tuple[list[str | None], np.ndarray]:
        """The distinct names of the rows at `rows` (None: unnamed), and for each row the position of
        its name among them: what is worked out once per name is then read at each row."""
        distinct, at = np.unique(self.at(rows, -1), return_inverse=True)
        return [self.name_of.get(c) for c in distinct.tolist()], at

    @cached_property
    def name_of(self) -> dict[int, str]:
        """Each present code's name."""
        return dict(zip(self.present.tolist(), self.names))

    def at(self, rows: np.ndarray | slice, unnamed: int) -> np.ndarray:
        """The codes of the rows at `rows`, `unnamed` where a row has no name."""
        return np.where(self.named[rows], self.code[rows], unnamed)


_name_codes: dict[int, NameCodes] = {}


def name_codes(frame: pl.DataFrame) -> NameCodes:
    """`NameCodes` of `frame`, found once per frame while it lives (the analyses of a rank ask a
    dozen patterns of the same event frame; frames are never changed in place)."""
    key = id(frame)
    found = _name_codes.get(key)
    if found is None:
        column = frame["name"]
        if column.dtype != pl.Categorical:
            column = column.cast(pl.String).cast(pl.Categorical)
        physical = column.to_physical()
        code = physical.fill_null(0).to_numpy().astype(np.intp)
        named = physical.is_not_null().to_numpy()
        present = np.flatnonzero(np.bincount(code[named]))
        found = NameCodes(code, named, present, names_of_codes(column, present))
        _name_codes[key] = found
        weakref.finalize(frame, _name_codes.pop, key, None)
    return found


def names_of_codes(column: pl.Series, codes: np.ndarray, from_table: bool = True) -> list[str]:
    """The names of these codes of a Categorical column: read from polars' table of categories
    (polars >= 1.32: one per process, a category's code is its position there), else, or without
    `from_table`, from the column's own distinct values."""
    table = getattr(column.dtype, "categories", None) if from_table else None
    if table is not None and hasattr(table, "to_series"):
        return table.to_series().gather(codes).to_list()
    distinct = column.drop_nulls().unique()
    name_of = dict(zip(distinct.to_physical().to_list(), distinct.cast(pl.String).to_list()))
    return [name_of[c] for c in codes.tolist()]


def distinct_names(frame: pl.DataFrame) -> list[str]:
    """The non-empty distinct names of `frame`."""
    return name_codes(frame).nonempty


#: Step annotation, DataLoader span and synchronization names (used by analyses). A step number has
#: at most 18 digits (after leading zeros), so it fits int64: a longer one marks no step.
PROFILER_STEP_PATTERN = r"^ProfilerStep#0*(\d{1,18})$"
DATALOADER_PATTERN = r"^enumerate\(DataLoader\)#.*__next__"
#: Host calls that block until the device catches up (`.item()`, explicit synchronize).
BLOCKING_SYNC_PATTERN = r"^(cuda|hip)(Device|Stream|Event)Synchronize"


@dataclass
class RankMeta:
    """What one trace file says about itself (small; cached as JSON)."""
    file: str
    rank: int
    rank_source: str                      # "distributedInfo" | "filename" | "order"
    format: str                           # "kineto" | "kineto-2021" | "chrome-array"
    dist_rank: int | None = None          # distributedInfo.rank, when the trace has it
    world_size: int | None = None
    backend: str | None = None
    pg_config: list[dict] = field(default_factory=list)
    devices: list[dict] = field(default_factory=list)   # deviceProperties
    hostname: str | None = None
    base_time_ns: int | None = None
    display_time_unit: str | None = None
    events_total: int = 0                 # trace events read (all phases)
    phase_counts: dict[str, int] = field(default_factory=dict)
    thread_names: dict[str, str] = field(default_factory=dict)   # "pid/tid" -> name
    process_names: dict[str, str] = field(default_factory=dict)  # "pid" -> name
    span_ns: tuple[int, int] | None = None
    salvaged: bool = False                # the file was cut or corrupt; events before the cut kept
    cut_at_byte: int | None = None        # where a salvaged file breaks (bytes of its JSON text) ...
    cut_reason: str | None = None         # ... and why ("file ends mid-event (truncated)", ...)
    dropped: dict[str, int] = field(default_factory=dict)   # events dropped for unusable ts/dur, per reason
    problems: list[str] = field(default_factory=list)
    size_bytes: int = 0
    device_events: int = 0                # kernels + memcpy + memset
    profiler_steps: int = 0               # distinct ProfilerStep#N marks on the host
    device_kind: str | None = None        # what the device activity ran on (ingest/devices.py DEVICE_KINDS)
    device_other_events: int = 0          # device activity of a kind not analysed (Kind.DEVICE_OTHER) ...
    device_other_categories: list[str] = field(default_factory=list)   # ... in these trace categories
    unknown_events: int = 0               # complete events of a category no profiler writes (Kind.UNKNOWN)
    process: int | None = None            # the pid, where the file holds several ranks (an Nsight report of a job)
    cache_error: str | None = None        # what this run is to say about the cache: a failed write, damaged entries

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["span_ns"] = list(self.span_ns) if self.span_ns else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RankMeta":
        d = dict(d)
        if d.get("span_ns") is not None:
            d["span_ns"] = tuple(d["span_ns"])
        return cls(**d)


FRAME_NAMES = ("events", "gpu_args", "comm_args", "op_args", "memory", "flows")


@dataclass
class RankTrace:
    """One rank's parsed trace: metadata plus columnar frames (see module docstring)."""
    meta: RankMeta
    events: pl.DataFrame
    gpu_args: pl.DataFrame
    comm_args: pl.DataFrame
    op_args: pl.DataFrame
    memory: pl.DataFrame
    flows: pl.DataFrame
    #: Derived frames that several analyses share (e.g. HTA's event scope), computed once per
    #: trace by the analysis that owns them. Never persisted.
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def rank(self) -> int:
        return self.meta.rank

    def frames(self) -> dict[str, pl.DataFrame]:
        return {name: getattr(self, name) for name in FRAME_NAMES}

    def has_device_activity(self) -> bool:
        return self.events["kind"].is_in([int(k) for k in DEVICE_KINDS]).any()


@dataclass
class InputProblem:
    """A file that could not be used (or only partly): one line for the user."""
    file: str
    problem: str
    fatal: bool = True          # True: the file was skipped; False: loaded with a warning

    def __str__(self) -> str:
        return f"{self.file}: {self.problem}"
