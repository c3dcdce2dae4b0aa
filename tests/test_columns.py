"""Parity of the column extractors.

`columns.columnize` has a C implementation (`_fastcols.columnize`) and a pure-Python twin that
defines the contract (columns.py docstring): both must give identical arrays, and grow the code
tables identically. `_fastcols.scan_events` (the C scanner over raw JSON) must give the frames of
the msgspec reference path (`read_kineto(..., use_scanner=False)`).

The reference values here are the other implementation; known divergences are listed as strict
xfails with the exact input and both outputs.
"""
from __future__ import annotations

import json
import math
import random
from decimal import Decimal
from pathlib import Path

import msgspec
import numpy as np
import pytest

from conftest import load_json, write_trace
from rankscope.ingest import columns
from rankscope.ingest.columns import Col, columnize
from rankscope.ingest.errors import TraceError
from rankscope.ingest.kineto import Args, Event, read_kineto, reading
from rankscope.ingest.kineto import columns as kineto_columns

pytestmark = pytest.mark.skipif(not columns.has_c_extension(),
                                reason="C extension not built: nothing to compare the Python twin with")

NAN = float("nan")


def _all_specs(tables) -> list[Col]:
    specs = list(kineto_columns._core_specs(tables))
    for cols in kineto_columns._side_specs(tables).values():
        specs += [c for _, c in cols]
    return specs


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True)) and bool(np.array_equal(np.signbit(a), np.signbit(b)))
    return bool(np.array_equal(a, b))


def _decoded_events(path: Path) -> list:
    """The file's events decoded with msgspec into kineto.Event structs (what the msgspec path
    feeds to columnize); the text comes from a plain json reading of the file."""
    events = load_json(path)["traceEvents"]
    return msgspec.json.decode(json.dumps(events).encode(), type=list[Event])


PARITY_FILES = ["hta-amd-mi250", "hta-critical-path-alexnet", "param-dlrm-8rank", "hta-nccl-metadata"]


@pytest.mark.parametrize("folder", PARITY_FILES)
def test_columnize_c_equals_python_on_corpus_events(corpus: Path, folder: str):
    """Every column spec the reader uses (core + side frames), over all decoded events of a real
    file and over a scattered subset (indices), gives the same arrays and tables in C and Python."""
    path = sorted((corpus / folder).glob("*.json.gz"))[0]
    objs = _decoded_events(path)
    rng = np.random.default_rng(0)
    subset = np.sort(rng.choice(len(objs), size=min(len(objs), 500), replace=False)).astype(np.int64)
    for indices in (None, subset):
        t_c, t_py = kineto_columns._Tables(), kineto_columns._Tables()
        specs_c, specs_py = _all_specs(t_c), _all_specs(t_py)
        out_c = columnize(objs, specs_c, indices, use_c=True)
        out_py = columnize(objs, specs_py, indices, use_c=False)
        for spec, a, b in zip(specs_c, out_c, out_py):
            assert _same(a, b), f"{folder}: column {spec.outer.__name__}.{getattr(spec.inner, '__name__', '')} " \
                                f"kind {spec.kind} differs (indices={'subset' if indices is not None else 'all'})"
        assert t_c.__dict__ == t_py.__dict__, f"{folder}: code tables differ"


# ----------------------------------------------------------------------------------------------
# Crafted values: (kind, member, default) -> values. Python objects built directly (no JSON), so
# that every type a decoder could hand over is covered.
_BIG = [2**31, 2**53 + 1, 2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**64, 10**30]
_COMMON = [None, True, False, [1], {"a": 1}, (1,), b"12"]

T_VALUES = [0, 1, -1, 123456789, 8_999_999_999_999_999, -8_999_999_999_999_999, 9_000_000_000_000_000,
            *_BIG, 0.0, -0.0, 1.5, 1234.567, 1e-9, 1e15, 9.3e15, -9.2e15, NAN, math.inf, -math.inf,
            Decimal("1.0005"), Decimal("0.0005"), Decimal("0.0015"), Decimal("-0.0015"),
            Decimal("1694128201435478.123"), Decimal("1e400"), Decimal("-1e-400"), Decimal("NaN"),
            Decimal("Infinity"), "5", "abc", "", None, False, [1], {"a": 1}]
F_VALUES = [0, 1, -1, *_BIG, 0.0, -0.0, 0.625, 1e308, -1e-308, NAN, math.inf, -math.inf,
            Decimal("1.5"), "5", "abc", *_COMMON]
I_VALUES = [0, -1, 7, *_BIG, 1.0, 1.9, -1.9, 9.2e18, 9.3e18, -9.3e18, NAN, math.inf,
            "0", "123", "-5", "-0", "-", "", "+5", " 5", "5 ", "1" * 18, "1" * 19, "-" + "1" * 17,
            "-" + "1" * 18, "\u0661\u0662", "\u00b2", "12a", "0x10", "1e3", "\ud800", Decimal("5"), *_COMMON]
K_VALUES = I_VALUES + ["stream 7", "stream 7", "é", "Traces", "PyTorch Profiler"]
S_VALUES = ["a", "", "é", "ünï€😀", "\ud800", "0", "a", 5, 1.5, "x" * 1000, *_COMMON]
R_VALUES = [msgspec.Raw(b'[[1, 2], []]'), msgspec.Raw(b'"x"'), msgspec.Raw(b"\xff\xfe"), msgspec.Raw(b""),
            msgspec.Raw(b'[[1, 2], []]'), b"[]", bytearray(b"[1]"), "str", 5, None]
P_VALUES = [[], [0], [1], [2, 1, 1], [-1, 2], [2**31, 2**31], [2**62, 4], [True, 2], [None], [[1]],
            (2, 3), "23", 5, None, {}, [0, 2**63 - 1]]

CASES = [  # (id, member to set, kind, default, values)
    ("t-ts", Event.ts, None, "t", 0, T_VALUES),
    ("f-args.flops", Event.args, Args.flops, "f", NAN, F_VALUES),
    ("i-args.seq", Event.args, Args.seq, "i", -1, I_VALUES),
    ("k-tid", Event.tid, None, "k", -1, K_VALUES),
    ("s-name", Event.name, None, "s", 0, S_VALUES),
    ("r-args.input_dims", Event.args, Args.input_dims, "r", 0, R_VALUES),
    ("p-args.grid", Event.args, Args.grid, "p", -1, P_VALUES),
]


def _objs(outer, inner, values) -> list:
    if inner is None:
        return [Event(**{outer.__name__: v}) for v in values]
    return [Event(args=Args(**{inner.__name__: v})) for v in values] + [Event(), Event(args=None)]


def _run(outer, inner, kind, default, values, use_c: bool):
    table = {} if kind in "skr" else None
    out = columnize(_objs(outer, inner, values), [Col(outer, inner, kind, default, table)], use_c=use_c)[0]
    return out, table


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_columnize_c_equals_python_on_crafted_values(case):
    """Huge ints, floats (NaN/inf/-0.0), Decimals, digit strings, negative numbers, non-ASCII and
    lone-surrogate strings, raw bytes, lists for grid/block, missing args: same value per row, same
    table, in C and in Python. Known divergences are excluded here and pinned in the xfails below."""
    _, outer, inner, kind, default, values = case
    a, ta = _run(outer, inner, kind, default, values, use_c=True)
    b, tb = _run(outer, inner, kind, default, values, use_c=False)
    rows = list(values) + ([] if inner is None else ["<args without the key>", "<no args>"])
    bad = [(rows[i], a[i], b[i]) for i in range(len(a)) if not _same(a[i:i + 1], b[i:i + 1])]
    assert not bad, f"C vs Python differ (value, C, Python): {bad}"
    assert ta == tb


def test_columnize_indices_select_rows():
    """`indices` picks rows (in the given order, repeats allowed) in both implementations."""
    objs = [Event(ts=i, name=f"n{i}") for i in range(10)]
    idx = np.array([9, 0, 3, 3], dtype=np.int64)
    for use_c in (True, False):
        ts, name = columnize(objs, [Col(Event.ts, None, "t", 0), Col(Event.name, None, "s", 0, {})], idx, use_c=use_c)
        assert ts.tolist() == [9000, 0, 3000, 3000]
        assert name.tolist() == [0, 1, 2, 2]


def test_parity_t_float_half_ns():
    vals = [0.0005, 0.0025, -0.0005]
    a, _ = _run(Event.ts, None, "t", 0, vals, True)
    b, _ = _run(Event.ts, None, "t", 0, vals, False)
    assert a.tolist() == b.tolist()


def test_parity_t_bool():
    a, _ = _run(Event.ts, None, "t", 0, [True], True)
    b, _ = _run(Event.ts, None, "t", 0, [True], False)
    assert a.tolist() == b.tolist()


def test_parity_p_float_and_string_items():
    vals = [[1.5, 2], ["2", "3"]]
    a, _ = _run(Event.args, Args.grid, "p", -1, vals, True)
    b, _ = _run(Event.args, Args.grid, "p", -1, vals, False)
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("inner, kind, default, value", [(Args.grid, "p", -1, [2**70]),
                                                         (Args.flops, "f", NAN, 2**1100)],
                         ids=["p-2**70", "f-2**1100"])
def test_python_twin_never_raises_on_huge_ints(inner, kind, default, value):
    a, _ = _run(Event.args, inner, kind, default, [value], True)
    b, _ = _run(Event.args, inner, kind, default, [value], False)
    assert _same(a, b)


def test_reader_without_c_extension_survives_huge_grid(tmp_path: Path, monkeypatch):
    p = write_trace(tmp_path / "t.json", {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1, "args": {"grid": [2**70, 1, 1]}},
        {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 2, "dur": 1, "args": {"grid": [2, 1, 1]}}]})
    monkeypatch.setattr(columns, "_fastcols", None)
    try:
        trace, _ = read_kineto(p)
    except TraceError:
        return
    assert len(trace.events) == 2


# ----------------------------------------------------------------------------------------------
# C scanner (raw JSON -> columns) vs the msgspec reference path
def _frames_equal(a, b) -> list[str]:
    """Frames that differ. String pids/tids/flow ids are coded in the order of their text on both
    paths (the scanner meets them event by event, columnize column by column), so even those
    columns must be identical (param-dlrm-8rank has them: "Traces", "stream 7")."""
    return [name for name, f in a.frames().items() if not f.equals(b.frames()[name])]


SCANNER_FILES = ["hta-amd-mi250", "hta-triton", "hta-cpu-only", "hta-critical-path-alexnet",
                 "param-dlrm-8rank", "hta-nccl-metadata", "cpu-gloo-4rank-healthy", "tracelens-b200-rank0"]


@pytest.mark.parametrize("folder", SCANNER_FILES)
def test_scanner_equals_msgspec_path_on_corpus(corpus: Path, folder: str):
    path = sorted((corpus / folder).glob("*.json.gz"))[0]
    fast, _ = read_kineto(path, use_scanner=True)
    ref, _ = read_kineto(path, use_scanner=False)
    assert _frames_equal(fast, ref) == [], f"{folder}: frames differ between scanner and msgspec path"
    assert fast.meta.to_dict() == ref.meta.to_dict()


ROUTING_FILES = ["hta-nccl-metadata", "cpu-gloo-4rank-healthy", "tracelens-b200-rank0", "param-dlrm-8rank",
                 "hta-amd-mi250", "hta-critical-path-alexnet"]


def _read_counting_routed(path: Path, monkeypatch) -> tuple:
    """read_kineto with the scanner, and the rows that the C routing put in each group."""
    rows: dict[str, int] = {}
    original = kineto_columns._Accumulator._add_routed

    def counting(self, groups, phase_counts, n):
        for (name, columns), buffers in zip(self.routed_columns.items(), groups):
            rows[name] = rows.get(name, 0) + len(buffers[0]) // np.dtype(columns[0][1]).itemsize
        return original(self, groups, phase_counts, n)

    monkeypatch.setattr(kineto_columns._Accumulator, "_add_routed", counting)
    try:
        return read_kineto(path, use_scanner=True)[0], rows
    finally:
        monkeypatch.setattr(kineto_columns._Accumulator, "_add_routed", original)


@pytest.mark.parametrize("folder", ROUTING_FILES)
def test_c_routing_equals_msgspec_path_on_corpus(corpus: Path, monkeypatch, folder: str):
    """After the chunk where a file's phase and category codes are first met, the scanner splits
    each chunk's rows into the kept groups in C instead of `_Accumulator._add`. With 4 KB chunks
    (a gzip file is read in inflate steps of ~50 KB) most chunks are split in C; the frames must
    equal those of the msgspec reference path."""
    monkeypatch.setattr(reading, "CHUNK_BYTES", 4 << 10)
    path = sorted((corpus / folder).glob("*.json.gz"))[0]
    ref, _ = read_kineto(path, use_scanner=False)
    fast, rows = _read_counting_routed(path, monkeypatch)
    assert rows.get("x", 0) > 0 or fast.events.height < 1000, f"{folder}: no chunk was split in C"
    assert _frames_equal(fast, ref) == [], f"{folder}: frames differ between C routing and msgspec path"
    assert fast.meta.to_dict() == ref.meta.to_dict()


@pytest.mark.parametrize("chunk", [4 << 10, 1 << 20])
def test_c_routing_fills_every_group(tmp_path: Path, monkeypatch, chunk: int):
    """A crafted trace where every kind of row comes again after the chunk that first met its codes
    (real traces have their metadata in the first or last chunk): complete events of each side
    kind with and without side values, flows, '[memory]' and other instants, metadata, 'B'/'E'
    (counted only). Each group gets rows from the C routing, and the frames equal the msgspec
    reference path's. With 1 MB chunks a chunk holds several of the routing's blocks of rows."""
    def block(i: int) -> list[dict]:
        return [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": i, "args": {"name": f"thread {i}"}},
            {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 2, "ts": 10 * i, "dur": 5,
             "args": {"External id": i, "Input Dims": [[i % 3, 4]], "Sequence number": i}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 2, "ts": 10 * i + 1, "dur": 1},
            {"ph": "X", "cat": "python_function", "name": "fn", "pid": 1, "tid": 2, "ts": 10 * i, "dur": 9,
             "args": {"Python id": i, "Python parent id": i - 1}},
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 2, "ts": 10 * i + 2,
             "dur": 3, "args": {"Collective name": "allreduce", "In msg nelems": 1024 + i, "Seq": i,
                                "dtype": "Float", "Process Group Name": "0"}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 10 * i + 3,
             "dur": 1, "args": {"correlation": i, "External id": i}},
            {"ph": "X", "cat": "kernel", "name": f"kernel{i % 5}", "pid": 0, "tid": 7, "ts": 10 * i + 4, "dur": 2,
             "args": {"correlation": i, "stream": 7, "device": 0, "grid": [i % 4 + 1, 1, 1], "block": [128, 1, 1],
                      "shared memory": 0, "registers per thread": 32, "est. achieved occupancy %": 50}},
            {"ph": "s", "cat": "ac2g", "id": i, "pid": 1, "tid": 2, "ts": 10 * i + 3, "name": "ac2g"},
            {"ph": "f", "cat": "ac2g", "id": i, "pid": 0, "tid": 7, "ts": 10 * i + 4, "name": "ac2g", "bp": "e"},
            {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 10 * i + 5, "s": "t",
             "args": {"Bytes": 512 * (1 - 2 * (i % 2)), "Total Allocated": 1 << 20, "Total Reserved": 2 << 20,
                      "Device Id": 0, "Device Type": 1, "Addr": 4096 + i}},
            {"ph": "i", "name": "marker", "pid": 1, "tid": 2, "ts": 10 * i + 6, "s": "t"},
            {"ph": "B", "name": "begin", "pid": 1, "tid": 2, "ts": 10 * i + 7},
            {"ph": "E", "name": "begin", "pid": 1, "tid": 2, "ts": 10 * i + 8},
        ]
    events = [e for i in range(1, 1500) for e in block(i)]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(reading, "CHUNK_BYTES", chunk)
    ref, _ = read_kineto(path, use_scanner=False)
    fast, rows = _read_counting_routed(path, monkeypatch)
    groups = kineto_columns._Accumulator(kineto_columns._Tables()).routed_columns
    assert {g for g, n in rows.items() if n > 0} == set(groups), rows
    assert _frames_equal(fast, ref) == []
    assert fast.meta.to_dict() == ref.meta.to_dict()


def test_c_routing_misuse_raises():
    """The routing's output buffers live in the scan state: routing without one, or a malformed
    routing, is a programming error (TypeError), not a chunk handed to the msgspec path."""
    from rankscope.ingest import _fastcols
    acc = kineto_columns._Accumulator(kineto_columns._Tables())
    body = b'[{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}]'
    with pytest.raises(TypeError, match="scan state"):
        _fastcols.scan_events(body, acc.scan_specs, acc.table_list, None, acc.routing())
    with pytest.raises(TypeError):
        _fastcols.scan_events(body, acc.scan_specs, acc.table_list, acc.scan_state, (b"", b"", 0))
    assert _fastcols.scan_events(body, acc.scan_specs, acc.table_list, acc.scan_state, acc.routing())[1:] == (1, 0)


def test_scanner_equals_msgspec_path_when_its_buffers_grow(tmp_path: Path):
    """Events far smaller than the scanner's first guess (one row per 256 bytes of a chunk), with
    whitespace (the single-space fast path) and a string long enough for the 16-byte search: its
    column buffers grow several times within a chunk. Reference: the msgspec path."""
    events = [{"ph": "X", "cat": "kernel", "name": "k" * (i % 40), "pid": 0, "tid": 7, "ts": i, "dur": 1,
               "args": {"correlation": i}} for i in range(20_000)]
    fast, ref = _read_both(tmp_path, json.dumps({"traceEvents": events}, separators=(", ", ": ")))
    assert not isinstance(fast, str) and not isinstance(ref, str), (fast, ref)
    assert fast.events.height == 20_000
    assert _frames_equal(fast, ref) == []


def _kernel(i: int, **over) -> dict:
    e = {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 100 + i, "dur": 5,
         "args": {"correlation": i, "stream": 7, "grid": [2, 1, 1], "block": [32, 1, 1],
                  "blocks per SM": 0.5, "External id": i, "Seq": i}}
    e.update(over)
    return e


def _scanner_case_text(mutation: str) -> str:
    """Six kernels; the third one mutated. `mutation` is JSON text that replaces the "@@" marker."""
    events = [_kernel(i) for i in range(6)]
    events[2]["args"]["grid"] = "@@"
    text = json.dumps({"traceEvents": events})
    return text


AGREE = {   # JSON value text for the third kernel's grid, or whole-event edits (see below)
    "grid-ints": "[4, 2, 1]", "grid-empty": "[]", "grid-null": "null", "grid-nested": "[[1], 2]",
    "grid-neg": "[-1, 3]", "grid-bigint": "[123456789012345678901234567890]", "grid-bool": "[true]",
    "grid-string": "\"abc\"", "grid-object": "{\"a\": [1, {\"b\": null}]}",
}


def _read_both(tmp_path: Path, text: str):
    p = tmp_path / "t.json"
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    out = []
    for scanner in (True, False):
        try:
            out.append(read_kineto(p, use_scanner=scanner)[0])
        except TraceError as exc:
            out.append(f"TraceError: {exc}")
    return out


def test_scanner_key_and_value_prediction_misses(tmp_path: Path):
    """The scanner compares each key (and each string value of a text column) in place against the
    one met after the same key in the previous event (the previous value). Events here break that
    guess every way: keys in shuffled order, keys that extend the guessed one ("ts" -> "tsx",
    "name" -> "names"), values that extend or cut the previous one ("cpu_op" -> "cpu_op2" -> "cpu"),
    an escaped quote right after the guessed text ("cpu_op" -> "cpu_op\\"x"), a repeated key, and
    more distinct unknown keys than the scanner remembers (KEYMAP_UNWANTED_MAX), raw values (Input
    Dims) that repeat or extend the previous one (12 -> 123). Reference: the msgspec path."""
    rng = random.Random(7)
    events = []
    for i in range(600):
        e = {"ph": "X", "cat": ["cpu_op", r'cpu_op\"x', "cpu_op2", "cpu"][i % 4],     # JSON text of each string
             "name": ["aten::mm", "aten::mm_out", "aten::m", r"n\u0061me"][i % 4], "pid": 1, "tid": ["7", "t7", "t"][i % 3],
             "ts": 100 + i, "dur": 3, "args": {"External id": i, "Seq": i, f"unknown {i % 200}": i,
                                             "Input Dims": [[[4096], [4096]], [[4096], [4096]], 12, 123, 12, [[4096]]][i % 6]}}
        if i % 5 == 0:
            e["tsx"] = 1
            e["names"] = "x"
        items = list(e.items())
        if i % 7 == 0:
            rng.shuffle(items)
        text = ", ".join(f"{json.dumps(k)}: {json.dumps(v) if not isinstance(v, str) else chr(34) + v + chr(34)}"
                         for k, v in items)
        if i % 11 == 0:
            text += ', "name": "dup"'
        events.append("{" + text + "}")
    fast, ref = _read_both(tmp_path, '{"traceEvents": [' + ",\n".join(events) + "]}")
    assert not isinstance(fast, str) and not isinstance(ref, str), (fast, ref)
    assert fast.events.height == 600
    assert _frames_equal(fast, ref) == []
    assert sorted(fast.events["name"].cast(str).unique()) == ["aten::m", "aten::mm", "aten::mm_out", "dup", "name"]


@pytest.mark.parametrize("value", list(AGREE.values()), ids=list(AGREE))
def test_scanner_equals_msgspec_path_on_crafted_args(tmp_path: Path, value: str):
    fast, ref = _read_both(tmp_path, _scanner_case_text("").replace('"@@"', value))
    assert not isinstance(fast, str) and not isinstance(ref, str), (fast, ref)
    assert _frames_equal(fast, ref) == []
    assert fast.meta.problems == ref.meta.problems


EVENT_EDITS = {   # whole-event edits of the third kernel (JSON text of the event)
    "ts-string-number": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": "102.5", "dur": 5}',
    "ts-exponent": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 1.025e2, "dur": 5}',
    "ts-many-decimals": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 102.00050000001, "dur": 0.0025}',
    "ts-huge": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 12345678901234567890, "dur": 5}',
    "ts-abc": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": "abc", "dur": 5}',
    "dur-null": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 102, "dur": null}',
    "args-list": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 102, "dur": 5, "args": []}',
    "args-null": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 102, "dur": 5, "args": null}',
    "name-number": '{"ph": "X", "cat": "kernel", "name": 5, "pid": 0, "tid": 7, "ts": 102, "dur": 5}',
    "tid-string": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": "Traces", "tid": "stream 7", "ts": 102, "dur": 5}',
    "unicode": '{"ph": "X", "cat": "kernel", "name": "\\u00fcn\\u00efcode \\ud83d\\ude00 \\"q\\"", "pid": 0, "tid": 7, "ts": 102, "dur": 5}',
    "not-an-object": "5",
    "deep": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 102, "dur": 5, "x": ' + "[" * 40 + "]" * 40 + "}",
    "corr-string": '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 102, "dur": 5, "args": {"correlation": "77", "stream": 7.9}}',
}

SCANNER_BUGS = {
    "ts-true": ('{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": true, "dur": 5}',
                "scanner keeps the event with ts 0; msgspec path drops it ('1 malformed events skipped')"),
    "ts-list": ('{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": [102], "dur": 5}',
                "scanner keeps the event with ts 0; msgspec path drops it"),
    "grid-floats": ('{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 102, "dur": 5, "args": {"grid": [1.5, 2]}}',
                    "grid_blocks: scanner -1, msgspec path (C columnize) 2"),
    "grid-digit-strings": ('{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 102, "dur": 5, "args": {"grid": ["2", "3"]}}',
                           "grid_blocks: scanner -1, msgspec path 6"),
    "float-arg-bigint": ('{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 102, "dur": 5, "args": {"blocks per SM": 1180591620717411303424}}',
                         "blocks_per_sm: scanner NaN (V_BIGINT -> default), msgspec path 1.18e21"),
    "float-arg-1e400": ('{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 102, "dur": 5, "args": {"blocks per SM": 1e400}}',
                        "blocks_per_sm: scanner inf, msgspec path NaN"),
    "escaped-key": ('{"ph": "X", "cat": "kernel", "n\\u0061me": "k2", "pid": 0, "tid": 7, "ts": 102, "dur": 5}',
                    "the scanner skips keys written with escapes (\"n\\u0061me\"): the name is missing, the msgspec path reads it"),
    "duplicate-key": ('{"ph": "X", "cat": "kernel", "name": "k2", "name": 5, "pid": 0, "tid": 7, "ts": 102, "dur": 5}',
                      "scanner keeps the first string for a repeated key, msgspec the last value"),
    "lone-surrogate-name": ('{"ph": "X", "cat": "kernel", "name": "bad \\ud800", "pid": 0, "tid": 7, "ts": 102, "dur": 5}',
                            "the scanner read all 6 events; the msgspec path refused the text (msgspec refuses lone "
                            "surrogates) and kept nothing; it now reads the escape as '?', as the frames' categories do"),
}


def _event_case(event_text: str) -> str:
    events = [json.dumps(_kernel(i)) for i in range(6)]
    events[2] = event_text
    return '{"traceEvents": [' + ",\n".join(events) + "]}"


@pytest.mark.parametrize("event", list(EVENT_EDITS.values()), ids=list(EVENT_EDITS))
def test_scanner_equals_msgspec_path_on_crafted_events(tmp_path: Path, event: str):
    fast, ref = _read_both(tmp_path, _event_case(event))
    assert not isinstance(fast, str) and not isinstance(ref, str), (fast, ref)
    assert _frames_equal(fast, ref) == []
    assert fast.meta.problems == ref.meta.problems
    assert fast.meta.events_total == ref.meta.events_total


@pytest.mark.parametrize("event, why", list(SCANNER_BUGS.values()), ids=list(SCANNER_BUGS))
def test_scanner_divergences(tmp_path: Path, event: str, why: str):
    """Inputs on which the two paths once differ(ed) (`why`): fixed, kept as regression tests."""
    try:
        fast, ref = _read_both(tmp_path, _event_case(event))
    except Exception as exc:     # not TraceError: a crash
        pytest.fail(f"read_kineto raised {type(exc).__name__}: {exc}")
    assert not isinstance(fast, str) and not isinstance(ref, str), (fast, ref)
    assert _frames_equal(fast, ref) == []
    assert fast.meta.events_total == ref.meta.events_total
