"""Every trace of the corpus, read by rankscope, against an independent plain-json reading.

Expected values come from `json.loads` of the same file in this test (see conftest.py), from the
file's own `distributedInfo`, or from MANIFEST.md's exact figures (stated where used).
"""
from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import (MEMORY_TIMELINE, corpus_trace_params, fresh_json, load_json, write_trace,
                      x_events)
from rankscope.ingest.errors import TraceError
from rankscope.ingest.kineto import read_kineto, reading
from rankscope.model import Kind, KernelClass

KERNEL_CATS = ("kernel", "Kernel")          # current Kineto / 2021 format
MEMCPY_CATS = ("gpu_memcpy", "Memcpy")
MEMSET_CATS = ("gpu_memset", "Memset")
RESNET_2021 = ["kineto-resnet50-workers0", "kineto-resnet50-workers4"]
LAUNCH_FLOWS = ("ac2g", "async", "async_cpu_to_gpu")


def _ns(us) -> int:
    """JSON microseconds (int, or Decimal holding the exact text) -> int nanoseconds."""
    if isinstance(us, int):
        return us * 1000
    return int((Decimal(us) * 1000).to_integral_value(rounding=ROUND_HALF_EVEN))


def _int_arg(args: dict, *keys) -> int:
    for k in keys:
        v = args.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return -1


def _check(problems: list[str], what: str, got, expected) -> None:
    if got != expected:
        problems.append(f"{what}: rankscope {got!r} != plain json {expected!r}")


@pytest.mark.parametrize("rel", corpus_trace_params())
def test_trace_matches_plain_json(corpus: Path, rel: str):
    """Counts, metadata, names, times and ids of one corpus file equal an independent json.loads
    of it. All mismatches of the file are reported together."""
    path = corpus / rel
    doc = load_json(path, exact=True)            # floats kept as Decimal: exact ns
    trace, header = read_kineto(path)
    ev = trace.events
    events = doc["traceEvents"]
    xs = x_events(doc)
    p: list[str] = []

    _check(p, "events_total (all traceEvents)", trace.meta.events_total, len(events))
    _check(p, "complete ('X') events", len(ev), len(xs))
    kinds = ev["kind"].to_numpy()
    for label, cats, kind in (("kernels", KERNEL_CATS, Kind.KERNEL), ("memcpy", MEMCPY_CATS, Kind.MEMCPY),
                              ("memset", MEMSET_CATS, Kind.MEMSET)):
        _check(p, f"{label} count", int((kinds == int(kind)).sum()), sum(e.get("cat") in cats for e in xs))
    _check(p, "[memory] instants", len(trace.memory),
           sum(e.get("ph") in ("i", "I") and e.get("name") == "[memory]" for e in events if isinstance(e, dict)))
    # launch flows (ac2g / 2021 "async" / async_cpu_to_gpu) are resolved into `correlation` and not
    # kept as rows (kineto.LAUNCH_FLOW_CATEGORIES); every other flow event is a row of `flows`
    _check(p, "non-launch flow events (s/f/t)", len(trace.flows),
           sum(e.get("ph") in ("s", "f", "t") and e.get("cat") not in LAUNCH_FLOWS
               for e in events if isinstance(e, dict)))

    # a complete file is not damaged, and keeps header and trailer keys wherever they are
    _check(p, "salvaged", trace.meta.salvaged, False)
    _check(p, "problems", trace.meta.problems, [])
    _check(p, "displayTimeUnit", trace.meta.display_time_unit, doc.get("displayTimeUnit"))
    _check(p, "baseTimeNanoseconds", trace.meta.base_time_ns, doc.get("baseTimeNanoseconds"))

    dist = doc.get("distributedInfo") or {}
    _check(p, "distributedInfo.rank", trace.meta.dist_rank, dist.get("rank"))
    _check(p, "distributedInfo.world_size", trace.meta.world_size, dist.get("world_size"))

    # kernel time: sum of JSON dur (µs) within 1e-6 relative
    kern_us = sum((Decimal(e["dur"]) for e in xs if e.get("cat") in KERNEL_CATS), Decimal(0))
    got_us = int(ev.filter(pl.col("kind") == int(Kind.KERNEL))["dur_ns"].sum() or 0) / 1000.0
    if float(kern_us) != pytest.approx(got_us, rel=1e-6, abs=1e-9):
        p.append(f"sum of kernel dur: rankscope {got_us} us != plain json {float(kern_us)} us")

    # names, in file order; the first and last named explicitly for a readable failure
    names = ev["name"].cast(pl.String).to_list()
    if xs:
        _check(p, "name of the first X event", names[0], xs[0]["name"])
        _check(p, "name of the last X event", names[-1], xs[-1]["name"])
    bad_names = [i for i, (a, e) in enumerate(zip(names, xs)) if a != e.get("name")]
    if bad_names:
        i = bad_names[0]
        p.append(f"{len(bad_names)} X events with another name, first at X#{i}: {names[i]!r} != {xs[i].get('name')!r}")

    # exact timestamps and durations (int64 ns)
    ts = ev["ts_ns"].to_numpy()
    dur = ev["dur_ns"].to_numpy()
    exp_ts = np.array([_ns(e["ts"]) for e in xs], dtype=np.int64)
    exp_dur = np.array([max(_ns(e.get("dur", 0)), 0) for e in xs], dtype=np.int64)
    for label, got, exp in (("ts_ns", ts, exp_ts), ("dur_ns", dur, exp_dur)):
        diff = np.flatnonzero(got != exp)
        if len(diff):
            i = diff[0]
            p.append(f"{label}: {len(diff)} X events differ, first X#{i} ({names[i]!r}): {got[i]} != {exp[i]}")

    # external ids ("External id", 2021: "external id"); -1 where absent
    exp_ext = np.array([_int_arg(e.get("args") or {}, "External id", "external id") for e in xs], dtype=np.int64)
    diff = np.flatnonzero(ev["external_id"].to_numpy() != exp_ext)
    if len(diff):
        p.append(f"external_id: {len(diff)} X events differ, first X#{diff[0]}")

    # kernels: correlation and stream from their args
    kern_rows = np.flatnonzero(kinds == int(Kind.KERNEL))
    kern_json = [e for e in xs if e.get("cat") in KERNEL_CATS]
    if len(kern_rows) == len(kern_json):
        corr = ev["correlation"].to_numpy()[kern_rows]
        exp_corr = np.array([_int_arg(e.get("args") or {}, "correlation") for e in kern_json], dtype=np.int64)
        known = exp_corr >= 0
        diff = np.flatnonzero((corr != exp_corr) & known)
        if len(diff):
            p.append(f"kernel correlation: {len(diff)} kernels differ from args.correlation")
        stream = ev["stream"].to_numpy()[kern_rows]
        exp_stream = np.array([_int_arg(e.get("args") or {}, "stream") for e in kern_json], dtype=np.int64)
        diff = np.flatnonzero((stream != exp_stream) & (exp_stream >= 0))
        if len(diff):
            p.append(f"kernel stream: {len(diff)} kernels differ from args.stream")

    # every side-frame row points at an X event of the right kind
    n = len(ev)
    for frame in ("gpu_args", "comm_args", "op_args"):
        rows = getattr(trace, frame)["row"].to_numpy()
        if len(rows) and (rows.min() < 0 or rows.max() >= n):
            p.append(f"{frame}.row out of range [0, {n})")
    gpu_rows = trace.gpu_args["row"].to_numpy()
    if len(gpu_rows) and not np.isin(kinds[gpu_rows], [int(Kind.KERNEL), int(Kind.MEMCPY), int(Kind.MEMSET)]).all():
        p.append("gpu_args has rows that are not device events")

    assert not p, f"{rel}:\n  " + "\n  ".join(p)


def test_trailer_with_an_array_is_not_truncation(tmp_path: Path):
    """Hand-made: one event, then a trailer with an array whose string holds ']'."""
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1}],'
                 ' "INFO": ["x.cpp:12] hello"], "displayTimeUnit": "ms"}')
    trace, _ = read_kineto(p)
    assert (trace.meta.salvaged, trace.meta.problems, trace.meta.display_time_unit) == (False, [], "ms")


def test_memory_timeline_is_not_a_trace(corpus: Path):
    """hta-memory-timeline holds `export_memory_timeline` raw output: a JSON array of
    [ts, action, bytes, category] lists (checked here with json), not trace events."""
    path = next((corpus / MEMORY_TIMELINE).glob("*.gz"))
    doc = load_json(path)
    assert isinstance(doc, list) and all(isinstance(x, list) for x in doc[:100])
    with pytest.raises(TraceError) as exc:
        read_kineto(path)
    msg = str(exc.value)
    assert msg and "\n" not in msg


def test_memory_timeline_message_says_not_a_trace(corpus: Path):
    """The memory timeline is reported as not a trace (like {"a": 1}), not as an empty one."""
    path = next((corpus / MEMORY_TIMELINE).glob("*.gz"))
    with pytest.raises(TraceError, match=r"not a (profiler )?trace"):
        read_kineto(path)


# MANIFEST.md exact figures: kernels / COMM kernels ("nccl" column; b200: 1 NCCL + 73 multimem) /
# ProfilerStep count. Only rows given there as exact numbers (no "~").
MANIFEST_EXACT = {
    "hta-negative-queue": (6080, 80, 5),
    "hta-nccl-metadata": (2700, 21, 3),
    "hta-ns-resolution": (4350, 0, 5),
    "hta-amd-mi250": (14, 0, 3),
    "hta-cpu-only": (0, 0, 1),
    "hta-rank-non-gpu": (0, 0, 1),
    "hta-critical-path-alexnet": (79, 0, 0),
    "hta-cuda-event-sync-multistream": (3, 0, 0),
    "hta-triton": (1, 0, 1),
    "kineto-resnet50-workers0": (8772, 0, 6),
    "kineto-resnet50-workers4": (8868, 0, 6),
    "tracelens-b200-rank0": (768, 1 + 73, 0),
    "tracelens-mi300-resnet-rank0": (2995, 17, 6),
    "big-mi300-xdit": (8042, 0, 1),
}


@pytest.mark.parametrize("folder", sorted(MANIFEST_EXACT))
def test_manifest_kernel_comm_step_counts(corpus: Path, folder: str):
    """Kernel count, COMM-class kernels (DESIGN kernel classes) and ProfilerStep count equal the
    exact figures of MANIFEST.md."""
    (path,) = sorted((corpus / folder).glob("*.json.gz"))
    trace, _ = read_kineto(path)
    ev = trace.events
    kern = ev.filter(pl.col("kind") == int(Kind.KERNEL))
    steps = ev.filter(pl.col("name").cast(pl.String).str.contains(r"^ProfilerStep#\d+$")).height
    got = (kern.height, int((kern["kclass"] == int(KernelClass.COMM)).sum()), steps)
    assert got == MANIFEST_EXACT[folder], f"{folder}: (kernels, comm, steps) {got} != MANIFEST {MANIFEST_EXACT[folder]}"


# ----------------------------------------------------------------------------------------------
# Launch links: kernel -> the runtime call that launched it
def _launch_pairs_from_flows(doc: dict) -> dict[int, int]:
    """Plain-json reading of launch flows: X-event index of each device event -> X-event index of
    the runtime event that launched it, joined by flow id ('s' at the runtime call, 'f' at the
    device event; same pid/tid/ts as the X event). tids are compared as text because the 2021
    format writes "25738" on X events and 25738 on flows."""
    xs = x_events(doc)
    at = {(str(e.get("pid")), str(e.get("tid")), e.get("ts")): i for i, e in enumerate(xs)}
    starts, finishes = {}, {}
    for e in doc["traceEvents"]:
        if isinstance(e, dict) and e.get("cat") in ("async", "ac2g") and e.get("ph") in ("s", "f"):
            key = (str(e.get("pid")), str(e.get("tid")), e.get("ts"))
            if key in at:
                (starts if e["ph"] == "s" else finishes).setdefault(e["id"], at[key])
    return {finishes[i]: starts[i] for i in finishes if i in starts}


@pytest.mark.parametrize("folder", RESNET_2021)
def test_2021_kernels_correlate_with_launching_runtime(corpus: Path, folder: str):
    """2021 format: each kernel's correlation equals the correlation of the Runtime event that
    launched it, where 'launched it' is read independently from the file's "async" flows."""
    (path,) = (corpus / folder).glob("*.json.gz")
    doc = load_json(path)
    xs = x_events(doc)
    pairs = _launch_pairs_from_flows(doc)
    kernels = [i for i, e in enumerate(xs) if e.get("cat") == "Kernel"]
    linked = [i for i in kernels if i in pairs]
    assert len(linked) > 0.9 * len(kernels), "the reference found too few flow links"
    trace, _ = read_kineto(path)
    assert trace.meta.format == "kineto-2021"
    kind = trace.events["kind"].to_numpy()
    corr = trace.events["correlation"].to_numpy()
    wrong = [i for i in linked if not (kind[i] == int(Kind.KERNEL) and kind[pairs[i]] == int(Kind.RUNTIME)
                                       and corr[i] >= 0 and corr[i] == corr[pairs[i]])]
    assert not wrong, f"{len(wrong)} of {len(linked)} kernels do not share the correlation of their launching runtime call"


@pytest.mark.parametrize("folder, kernel_cat", [(RESNET_2021[0], "Kernel"), ("param-dlrm-8rank", "kernel")])
def test_correlation_filled_from_flows_when_args_lack_it(corpus: Path, tmp_path: Path, folder: str, kernel_cat: str):
    """With "correlation" removed from every device event's args (rewritten copy), the reader must
    recover it from the launch flow ('async' 2021 / 'ac2g'): kernel correlation == flow id."""
    src = sorted((corpus / folder).glob("*.json.gz"))[0]
    doc = fresh_json(src)
    flow_id = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "f" and e.get("cat") in ("async", "ac2g"):
            flow_id.setdefault((str(e.get("pid")), str(e.get("tid")), e.get("ts")), e["id"])
    expected = []
    for e in x_events(doc):
        if e.get("cat") in (kernel_cat, "Memcpy", "Memset", "gpu_memcpy", "gpu_memset"):
            (e.get("args") or {}).pop("correlation", None)
        if e.get("cat") == kernel_cat:
            expected.append(flow_id.get((str(e.get("pid")), str(e.get("tid")), e.get("ts")), None))
    dst = write_trace(tmp_path / "stripped.json", doc)
    trace, _ = read_kineto(dst)
    got = trace.events.filter(pl.col("kind") == int(Kind.KERNEL))["correlation"].to_list()
    assert len(got) == len(expected)
    known = [(g, e) for g, e in zip(got, expected) if e is not None]
    assert len(known) > 0.9 * len(expected)
    assert [g for g, _ in known] == [e for _, e in known]


# ----------------------------------------------------------------------------------------------
SMALL_FILES = ["hta-amd-mi250", "hta-triton", "hta-cpu-only", "hta-cuda-event-sync-multistream",
               "param-dlrm-8rank", "hta-critical-path-alexnet"]


@pytest.mark.parametrize("folder", SMALL_FILES)
@pytest.mark.parametrize("chunk", [4096, 65536])
def test_chunk_size_does_not_change_the_result(corpus: Path, monkeypatch, folder: str, chunk: int):
    """The streaming reader decodes the text in chunks (2 MiB by default): with tiny chunks, so
    that many chunk boundaries fall inside events, the frames are identical to the default."""
    path = sorted((corpus / folder).glob("*.json.gz"))[0]
    ref, _ = read_kineto(path)
    monkeypatch.setattr(reading, "CHUNK_BYTES", chunk)
    small, _ = read_kineto(path)
    assert small.meta.events_total == ref.meta.events_total
    for name, frame in ref.frames().items():
        assert small.frames()[name].equals(frame), f"{folder}: frame {name} differs with CHUNK_BYTES={chunk}"


def test_plain_json_and_gzip_give_the_same_trace(corpus: Path, tmp_path: Path):
    """The same text, gunzipped on disk (.json) or gzip (.json.gz), reads the same."""
    src = sorted((corpus / "param-dlrm-8rank").glob("*.json.gz"))[0]
    plain = tmp_path / "rank0.json"
    plain.write_bytes(__import__("gzip").decompress(src.read_bytes()))
    a, _ = read_kineto(src)
    b, _ = read_kineto(plain)
    for name, frame in a.frames().items():
        assert b.frames()[name].equals(frame), name
    assert a.meta.events_total == b.meta.events_total


def test_trailer_after_events_is_read(tmp_path: Path):
    """Keys after the event list (Kineto writes traceName etc. there; some writers put
    distributedInfo last) are still read. Hand-made 2-event trace."""
    text = ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1},\n'
            '{"ph": "X", "name": "b", "ts": 3, "dur": 4, "pid": 1, "tid": 1}],\n'
            '"distributedInfo": {"rank": 5, "world_size": 6, "backend": "nccl"}, "traceName": "x"}')
    p = tmp_path / "t.json"
    p.write_text(text)
    trace, _ = read_kineto(p)
    assert len(trace.events) == 2 and trace.meta.events_total == 2
    assert (trace.meta.dist_rank, trace.meta.world_size, trace.meta.backend) == (5, 6, "nccl")
    assert trace.events["ts_ns"].to_list() == [1000, 3000]
    assert trace.events["dur_ns"].to_list() == [2000, 4000]


def test_bare_array_chrome_trace(tmp_path: Path):
    """The Chrome trace format also allows a bare array of events (hand-made, 3 events, 2 X)."""
    p = tmp_path / "t.json"
    p.write_text('[{"ph": "X", "name": "a", "ts": 1.5, "dur": 2, "pid": 1, "tid": 1},'
                 ' {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},'
                 ' {"ph": "X", "name": "b", "ts": 3, "dur": 0.25, "pid": 1, "tid": 1}]')
    trace, _ = read_kineto(p)
    assert trace.meta.events_total == 3
    assert trace.events["name"].cast(pl.String).to_list() == ["a", "b"]
    assert trace.events["ts_ns"].to_list() == [1500, 3000]
    assert trace.events["dur_ns"].to_list() == [2000, 250]
    assert trace.meta.thread_names == {"1/1": "main"}
