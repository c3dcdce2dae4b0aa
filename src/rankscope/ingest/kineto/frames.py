"""The frames of a parsed trace (`_build`): the kept columns as polars frames, the events with
unusable times dropped (rankscope.ingest.times), string keys recoded, launches linked, the rank's
metadata and problems."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from rankscope.ingest.columns import DTYPES, T_ABSENT, T_NOT_A_NUMBER, Col
from rankscope.ingest.devices import device_kind, refusal
from rankscope.ingest.discover import checked_rank, rank_from_filename
from rankscope.ingest.errors import TraceError
from rankscope.ingest.kineto.columns import _SIDE_KINDS, _Accumulator, _Tables
from rankscope.ingest.kineto.decode import MAX_NESTING
from rankscope.ingest.times import mark_durations, mark_far_from_the_others, reason_counts, start_reasons
from rankscope.model import (DEVICE_KINDS, PROFILER_STEP_PATTERN, Kind, RankMeta, RankTrace, category_kind,
                             event_kernel_classes)

if TYPE_CHECKING:
    from rankscope.ingest.kineto.reading import _Parsed


#: Flow categories that link a launch to its device activity; resolved into `correlation`.
LAUNCH_FLOW_CATEGORIES = ("ac2g", "async", "async_cpu_to_gpu")


def _build(path: Path, size: int, parsed: _Parsed, header: dict) -> RankTrace:
    acc, t = parsed.acc, parsed.acc.tables
    _canonical_key_codes(acc)
    dropped = _drop_unusable_times(acc)
    kept = acc.parts.get("x", {}).get("ts_ns")
    if dropped and (kept is None or not len(kept.values())):
        raise TraceError(f"no event with a usable start and duration ({sum(dropped.values())} dropped: "
                         + ", ".join(f"{k} with {reason}" for reason, k in dropped.items()) + ")")
    ph_names = _inverse(t.ph)
    phase_counts = {ph_names[i]: int(n) for i, n in enumerate(acc.phase_counts) if n}

    kind = acc.take("x", "kind", np.uint8)
    pid = acc.take("x", "pid")
    tid = acc.take("x", "tid")
    legacy = _legacy_kinds(kind, pid, t.tid)          # torch 1.x: no categories, kinds from process names
    names = _inverse(t.name)
    name_codes = acc.take("x", "name", np.int32)
    is_dev = np.isin(kind, [int(k) for k in DEVICE_KINDS])
    categories = _inverse(t.cat)
    not_read = {c: category_kind(c) for c in categories if category_kind(c) in (Kind.UNKNOWN, Kind.DEVICE_OTHER)}
    n_unknown, n_device_other = int((kind == int(Kind.UNKNOWN)).sum()), int((kind == int(Kind.DEVICE_OTHER)).sum())
    why = refusal(len(kind), n_unknown, int(is_dev.sum()) + n_device_other,
                  [c for c, k in not_read.items() if k == Kind.UNKNOWN], phase_counts)
    if why:
        raise TraceError(why)
    kclass = event_kernel_classes(kind, name_codes, names)

    device = acc.take("x", "device", np.int32)
    device = np.where((device < 0) & is_dev & (pid >= 0), pid, device)
    device = np.where((device < 0) & is_dev & legacy & (tid >= 0), tid, device).astype(np.int32)   # tid: device index
    ts = acc.take("x", "ts_ns")
    dur = acc.take("x", "dur_ns")
    problems: list[str] = []
    if dropped:
        n = sum(dropped.values())
        problems.append(f"{n} event{'s' if n > 1 else ''} dropped: "
                        + ", ".join(f"{k} with {reason}" for reason, k in dropped.items()))
    flows = _flows_frame(acc)
    corr = _link_launches(acc.take("x", "correlation"), flows, kind, pid, tid, ts)
    flows = flows.filter(~pl.col("cat").is_in(list(LAUNCH_FLOW_CATEGORIES)))   # now in `correlation`

    events = pl.DataFrame({
        "kind": kind,
        "name": _text_column(name_codes, _categories(names)),
        "ts_ns": ts, "dur_ns": dur, "pid": pid, "tid": tid, "device": device,
        "stream": acc.take("x", "stream"), "correlation": corr,
        "external_id": acc.take("x", "external_id"), "kclass": kclass.astype(np.uint8),
    })
    n_profiler_steps = _profiler_steps(names, name_codes, kind)
    del name_codes, kclass

    text = _categories(_inverse(t.text))
    side = {frame: _side_frame(acc, frame, text) for frame in ("gpu_args", "comm_args", "op_args")}
    if (legacy & is_dev).any():      # device events known as such only now: their launch details are absent
        side["gpu_args"] = _with_default_rows(side["gpu_args"], np.flatnonzero(legacy & is_dev),
                                              acc.side_specs["gpu_args"])
    memory = pl.DataFrame({"ts_ns": acc.take("memory", "ts_ns"),
                           **{n: acc.take("memory", n) for n in acc.side_names["memory"]}})
    threads, processes = _meta_names(acc, t)

    span = (int(ts.min()), int((ts + dur).max())) if len(ts) else None
    if acc.bad_events:
        problems.append(f"{acc.bad_events} malformed events skipped")
    if acc.invalid_utf8_chunks:
        problems.append("invalid UTF-8 in event strings, replaced by U+FFFD")
    if acc.repaired_events:
        problems.append(f"{acc.repaired_events} events with badly typed fields kept without those fields")
    if acc.deep_values:
        problems.append(f"{acc.deep_values} values nested over {MAX_NESTING} levels deep read as empty")
    if parsed.cut_at_byte is not None:
        problems.append(f"{parsed.cut_reason} at byte {parsed.cut_at_byte}: "
                        f"salvaged {acc.n_events} complete events before the cut")
    begin_end = phase_counts.get("B", 0) + phase_counts.get("E", 0)
    if begin_end:
        problems.append(f"begin/end ('B'/'E') events ignored: {begin_end}")

    dist = header.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    pg_config = dist.get("pg_config")
    dist_rank, world_size, rank_problems = checked_rank(dist.get("rank"), dist.get("world_size"))
    problems += rank_problems
    devices = header.get("deviceProperties")
    devices = devices if isinstance(devices, list) else []
    if parsed.fmt == "chrome-array":
        problems.append(_array_format_note(path, bool(legacy.any())))
    meta = RankMeta(
        file=str(path), rank=-1, rank_source="unknown",
        format=parsed.fmt if parsed.fmt != "kineto" else _format_of(t.cat),
        dist_rank=dist_rank, world_size=world_size,
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        pg_config=pg_config if isinstance(pg_config, list) else [],
        devices=[d for d in devices if isinstance(d, dict)],
        hostname=next((h for h in (header.get("host_name"), header.get("hostname")) if isinstance(h, str)), None),
        base_time_ns=_int_or_none(header.get("baseTimeNanoseconds")),
        display_time_unit=header.get("displayTimeUnit") if isinstance(header.get("displayTimeUnit"), str) else None,
        events_total=acc.n_events, phase_counts=phase_counts,
        device_events=int(is_dev.sum()), profiler_steps=n_profiler_steps,
        device_kind=device_kind(categories, [d["name"] for d in devices if isinstance(d, dict)
                                             and isinstance(d.get("name"), str)], bool(is_dev.any() or n_device_other)),
        device_other_events=n_device_other,
        device_other_categories=(sorted(c for c, k in not_read.items() if k == Kind.DEVICE_OTHER)
                                 if n_device_other else []),
        unknown_events=n_unknown,
        thread_names=threads, process_names=processes,
        span_ns=span, salvaged=parsed.cut_at_byte is not None, problems=problems, size_bytes=size,
        cut_at_byte=parsed.cut_at_byte, cut_reason=parsed.cut_reason or None, dropped=dropped,
    )
    return RankTrace(meta=meta, events=events, memory=memory, flows=flows, gpu_args=side["gpu_args"],
                     comm_args=side["comm_args"], op_args=side["op_args"])


def _drop_unusable_times(acc: _Accumulator) -> dict[str, int]:
    """Drop the kept events (complete, flow, memory sample) whose ts or dur is unusable (see
    rankscope.ingest.times), each under its first reason; return how many per reason. The side
    frames' rows follow the complete events they belong to."""
    groups = {g: acc.parts[g] for g in ("x", "flows", "memory") if "ts_ns" in acc.parts.get(g, {})}
    reasons: dict[str, np.ndarray] = {}
    for g, cols in groups.items():
        ts = cols["ts_ns"].values()
        reasons[g] = start_reasons(ts, ts == T_NOT_A_NUMBER, ts == T_ABSENT)
        if g == "x":
            dur = cols["dur_ns"].values()
            mark_durations(reasons[g], dur, dur == T_NOT_A_NUMBER, dur == T_ABSENT)
    mark_far_from_the_others([cols["ts_ns"].values() for cols in groups.values()], list(reasons.values()))
    for g, cols in groups.items():
        keep = reasons[g] == 0
        if keep.all():
            continue
        for column in cols.values():
            column.keep(keep)
        if g == "x":
            _keep_side_rows(acc, keep)
    return reason_counts(reasons.values())


def _keep_side_rows(acc: _Accumulator, keep: np.ndarray) -> None:
    """Side frames after complete events were dropped (`keep`): their rows go, the others' `row`
    numbers are renumbered."""
    new_row = np.cumsum(keep) - 1
    for frame in _SIDE_KINDS:
        cols = acc.parts.get(frame, {})
        if "row" not in cols:
            continue
        kept = keep[cols["row"].values()]
        for column in cols.values():
            column.keep(kept)
        rows = cols["row"].values()
        rows[:] = new_row[rows]


#: Kept columns that hold `k`-kind values: ints, or -2 - code of a string in the `tid` table.
_KEY_COLUMNS = {"x": ("pid", "tid"), "flows": ("id", "pid", "tid"), "meta": ("pid", "tid")}


def _canonical_key_codes(acc: _Accumulator) -> None:
    """String pids/tids/flow ids ("Traces", "stream 7") are coded in the order they are met, which
    differs between the scanner (event by event) and columnize (column by column): recode them in
    the order of their text, so both paths give identical frames."""
    table = acc.tables.tid
    if not table:
        return
    texts = sorted(table)
    remap = np.empty(len(texts), dtype=np.int64)
    remap[[table[x] for x in texts]] = np.arange(len(texts))
    table.clear()
    table.update((x, i) for i, x in enumerate(texts))
    for group, names in _KEY_COLUMNS.items():
        for name in names:
            column = acc.parts.get(group, {}).get(name)
            if column is None:
                continue
            values = column.values()
            coded = (values <= -2) & (values >= -1 - len(texts))     # below: a negative int as written
            values[coded] = -2 - remap[-2 - values[coded]]


def _profiler_steps(names: list[str], name_codes: np.ndarray, kind: np.ndarray) -> int:
    step = re.compile(PROFILER_STEP_PATTERN)
    is_step = np.array([bool(step.match(n)) for n in names] + [False], dtype=bool)
    host = np.isin(kind, [int(Kind.CPU_OP), int(Kind.USER_ANNOTATION)])
    return int(len(np.unique(name_codes[host & is_step[name_codes]])))


#: torch 1.x autograd profiler (`export_chrome_trace` before Kineto: a top-level event array): its
#: complete events have no `cat`; the process they are filed under says where they ran (the tid of
#: a "CUDA functions" event is the device index).
LEGACY_PROCESS_KINDS = {"cpu functions": Kind.CPU_OP, "cuda functions": Kind.KERNEL}


def _legacy_kinds(kind: np.ndarray, pid: np.ndarray, pid_table: dict) -> np.ndarray:
    """Give the complete events without a category (Kind.OTHER) filed under a torch 1.x process
    name (LEGACY_PROCESS_KINDS) their kind, in place; return where that happened."""
    changed = np.zeros(len(kind), dtype=bool)
    for text, code in pid_table.items():
        k = LEGACY_PROCESS_KINDS.get(text.strip().lower())
        if k is not None:
            at = (pid == -2 - code) & (kind == int(Kind.OTHER))
            kind[at] = int(k)
            changed |= at
    return changed


def _with_default_rows(frame: pl.DataFrame, rows: np.ndarray, specs: list[Col]) -> pl.DataFrame:
    """`frame` (a side frame keyed by `row`) plus one row of defaults for each of `rows`."""
    extra = pl.DataFrame({"row": rows.astype(np.int64),
                          **{name: np.full(len(rows), spec.default, dtype=DTYPES[spec.kind])
                             for name, spec in zip(frame.columns[1:], specs)}})
    return pl.concat([frame, extra.cast(frame.schema)]).sort("row")


def _array_format_note(path: Path, legacy: bool) -> str:
    """The warning for a trace that is a bare event array (no header: no distributedInfo, no
    deviceProperties): what it is, where its rank comes from."""
    what = ("torch 1.x trace format (top-level event array, events without categories: kinds from the "
            "'CPU functions' / 'CUDA functions' processes)" if legacy else "top-level event array (no Kineto header)")
    rank = "rank from the file name" if rank_from_filename(path) is not None else "rank from the file order"
    return f"{what}: no distributedInfo nor deviceProperties, {rank}"


def _format_of(cat_table: dict) -> str:
    return "kineto-2021" if any(c in cat_table for c in ("Operator", "Kernel", "Runtime")) else "kineto"


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _inverse(table: dict) -> list[str]:
    out = [""] * len(table)
    for k, i in table.items():
        out[i] = k
    return out


_SIDE_TEXT = {"collective", "in_split_size", "out_split_size", "dtype", "pg_name", "pg_desc",
              "pg_ranks", "input_dims", "input_types", "call_stack"}


def _side_frame(acc: _Accumulator, frame: str, text: pl.Series) -> pl.DataFrame:
    data: dict[str, np.ndarray | pl.Series] = {"row": acc.take(frame, "row")}
    for name, spec in zip(acc.side_names[frame], acc.side_specs[frame]):
        values = acc.take(frame, name, DTYPES[spec.kind])
        data[name] = _text_column(values, text) if name in _SIDE_TEXT else values
    return pl.DataFrame(data)


def _text_column(codes: np.ndarray, categories: pl.Series) -> pl.Series:
    """Codes into a per-file text table -> Categorical (a gather of the categorical table, no
    string per row); negative codes -> null."""
    if len(categories) == 0:
        return pl.Series([None] * len(codes), dtype=pl.Categorical)
    c = pl.Series(codes, dtype=pl.Int64)
    index = pl.select(pl.when(c >= 0).then(c).cast(pl.UInt32)).to_series()
    return categories.gather(index)


def _categories(texts: list[str]) -> pl.Series:
    try:
        return pl.Series(texts, dtype=pl.String).cast(pl.Categorical)
    except UnicodeEncodeError:     # lone surrogates ("\ud800" escapes): valid JSON, not UTF-8
        fixed = [t.encode("utf-8", "replace").decode("utf-8") for t in texts]
        return pl.Series(fixed, dtype=pl.String).cast(pl.Categorical)


def _meta_names(acc: _Accumulator, t: _Tables) -> tuple[dict, dict]:
    """thread_name / process_name metadata events -> {"pid/tid": name}, {"pid": name}."""
    threads: dict[str, str] = {}
    procs: dict[str, str] = {}
    text, names, keys = _inverse(t.text), _inverse(t.name), _inverse(t.tid)
    rows = zip(acc.take("meta", "name").tolist(), acc.take("meta", "pid").tolist(),
               acc.take("meta", "tid").tolist(), acc.take("meta", "label").tolist())
    for name, pid, tid, label in rows:
        if label < 0 or name < 0:
            continue
        if names[name] == "thread_name":
            threads[f"{_key_text(pid, keys)}/{_key_text(tid, keys)}"] = text[label]
        elif names[name] == "process_name":
            procs[_key_text(pid, keys)] = text[label]
    return threads, procs


def _key_text(v: int, keys: list[str]) -> str:
    return keys[-2 - v] if v <= -2 else str(v)


def _flows_frame(acc: _Accumulator) -> pl.DataFrame:
    t = acc.tables
    return pl.DataFrame({
        "phase": _text_column(acc.take("flows", "ph", np.int32), _categories(_inverse(t.ph))),
        "cat": _text_column(acc.take("flows", "cat", np.int32), _categories(_inverse(t.cat))),
        "id": acc.take("flows", "id"), "ts_ns": acc.take("flows", "ts_ns"),
        "pid": acc.take("flows", "pid"), "tid": acc.take("flows", "tid"),
    })


def _link_launches(corr: np.ndarray, flows: pl.DataFrame, kind: np.ndarray, pid: np.ndarray,
                   tid: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Launch links (ac2g / 2021 'async' flows) fill `correlation` where the args lack it: a
    flow's start lies on the runtime call, its finish on the device event, same id."""
    missing = (corr < 0) & np.isin(kind, [int(Kind.RUNTIME), int(Kind.DRIVER)] + [int(k) for k in DEVICE_KINDS])
    if not missing.any() or flows.is_empty():
        return corr
    links = flows.filter(pl.col("cat").is_in(list(LAUNCH_FLOW_CATEGORIES)) & (pl.col("id") >= 0))
    if links.is_empty():
        return corr
    idx = np.flatnonzero(missing)
    ev = pl.DataFrame({"i": idx, "pid": pid[idx], "tid": tid[idx], "ts_ns": ts[idx]})
    joined = ev.join(links.select("pid", "tid", "ts_ns", "id").unique(["pid", "tid", "ts_ns"]),
                     on=["pid", "tid", "ts_ns"], how="inner")
    corr = corr.copy()
    corr[joined["i"].to_numpy()] = joined["id"].to_numpy()
    return corr
