"""rankscope.analyses.rank.operators on real corpus traces.

Independent reference: the trace file read with plain `json.loads` (conftest.load_json, floats
kept as Decimal so nanoseconds are exact) and a classic per-thread stack sweep written here with
Python loops: ops sorted by (start, longest first), a stack of open ops, the top of the stack is
the parent of the next op / the owner of a runtime launch. Self CPU time, device time through
correlation ids, call counts, input shapes and source locations are recomputed from that.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import columns_frame, corpus_trace_params, load_json, write_trace, x_events
from rankscope.analyses.rank.operators import operator_stats
from rankscope.results.rank import OperatorStats
from rankscope.ingest.kineto import read_kineto

RESNET = "kineto-resnet50-workers0/worker0.1623143089861.pt.trace.json.gz"
B200 = "tracelens-b200-rank0/eager_trace.json.gz"
GLOO = "cpu-gloo-4rank-healthy/rank0.1795314552406548224.pt.trace.json.gz"
NQ = "hta-negative-queue/rank0.json.gz"

HOST_CATS = {"cpu_op", "operator", "user_annotation"}
LAUNCH_CATS = {"cuda_runtime", "runtime", "hip_runtime", "cuda_driver", "hip_driver"}
DEVICE_CATS = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset"}
STEP = re.compile(r"^ProfilerStep#\d+$")


def _ns(us) -> int:
    if isinstance(us, int):
        return us * 1000
    return int((Decimal(us) * 1000).to_integral_value(rounding=ROUND_HALF_EVEN))


# ----------------------------------------------------------------------------------------------
# The reference: a stack sweep per thread
class Ref:
    def __init__(self, doc: dict):
        xs = x_events(doc)
        self.ops = []                     # dicts: name, s, e, thread, args
        launches = {}
        self.device = []                  # (correlation, dur_ns)
        self.frames = []                  # python_function: name, s, e, thread
        for ev in xs:
            cat = str(ev.get("cat", "")).lower()
            args = ev.get("args") or {}
            s = _ns(ev["ts"])
            e = s + max(_ns(ev.get("dur", 0)), 0)
            thread = (ev.get("pid"), ev.get("tid"))
            if cat in HOST_CATS:
                self.ops.append({"name": ev["name"], "s": s, "e": e, "thread": thread, "args": args})
            elif cat in LAUNCH_CATS and isinstance(args.get("correlation"), int) and args["correlation"] >= 0:
                launches.setdefault(args["correlation"], (thread, s))
            elif cat in DEVICE_CATS and isinstance(args.get("correlation"), int):
                self.device.append((args["correlation"], e - s))
            elif cat in ("python_function", "python") and e > s:
                self.frames.append({"name": ev["name"], "s": s, "e": e, "thread": thread})
        self.parent = [None] * len(self.ops)
        owner_of_launch = {}
        by_thread = defaultdict(list)
        for i, op in enumerate(self.ops):
            by_thread[op["thread"]].append((op["s"], 0, -(op["e"] - op["s"]), "op", i))
        for corr, (thread, s) in launches.items():
            by_thread[thread].append((s, 1, 0, "launch", corr))
        for items in by_thread.values():
            stack: list[int] = []
            for s, _, _, what, key in sorted(items):
                while stack and self.ops[stack[-1]]["e"] <= s:
                    stack.pop()
                if what == "op":
                    if stack:
                        top = self.ops[stack[-1]]
                        assert top["e"] >= self.ops[key]["e"], "partly overlapping ops in a corpus trace"
                        self.parent[key] = stack[-1]
                    stack.append(key)
                else:
                    owner_of_launch[key] = stack[-1] if stack else None
        n = len(self.ops)
        self.self_cpu = [op["e"] - op["s"] for op in self.ops]
        for i, p in enumerate(self.parent):
            if p is not None:
                self.self_cpu[p] -= self.ops[i]["e"] - self.ops[i]["s"]
        self.self_dev = [0] * n
        self.total_dev = [0] * n
        self.attributed = 0
        for corr, dur in self.device:
            o = owner_of_launch.get(corr)
            if o is None:
                continue
            self.attributed += dur
            self.self_dev[o] += dur
            while o is not None:
                self.total_dev[o] += dur
                o = self.parent[o]

    def group(self, key) -> dict:
        out: dict = defaultdict(lambda: {"calls": 0, "self_cpu": 0, "self_dev": 0, "total_cpu": 0})
        for i, op in enumerate(self.ops):
            if STEP.match(op["name"]):
                continue
            g = out[key(i)]
            g["calls"] += 1
            g["self_cpu"] += self.self_cpu[i]
            g["self_dev"] += self.self_dev[i]
            g["total_cpu"] += op["e"] - op["s"]
        return dict(out)


_REFS: dict = {}


def _ref(corpus: Path, rel: str) -> Ref:
    if rel not in _REFS:
        _REFS[rel] = Ref(load_json(corpus / rel, exact=True))
    return _REFS[rel]


def _rows(groups, key_cols) -> dict:
    return {tuple(r[c] for c in key_cols) if len(key_cols) > 1 else r[key_cols[0]]: r
            for r in columns_frame(groups).to_dicts()}


# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rel,names", [
    (RESNET, ["aten::cudnn_convolution", "aten::add_", "aten::empty",
              "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "Optimizer.step#SGD.step"]),
    (B200, ["vllm::moe_forward", "aten::addmm", "aten::copy_", "symm_mem::multimem_all_reduce_"]),
    (GLOO, None),
])
def test_self_cpu_and_device_time_by_name(corpus: Path, rel: str, names):
    """Per op name: calls, total CPU, self CPU (duration minus direct child ops), self device
    (kernels whose launch lies directly in the op) and total device time equal the stack sweep."""
    ref = _ref(corpus, rel)
    expected = ref.group(lambda i: ref.ops[i]["name"])
    r = operator_stats(read_kineto(corpus / rel)[0], top_n=1000, group_by="name")
    got = _rows(r.by_self_cpu, ["name"])
    assert r.groups == len(expected)
    assert r.ops == sum(g["calls"] for g in expected.values())
    names = names or sorted(expected, key=lambda n: -expected[n]["self_cpu"])[:5]
    for name in names:
        e, g = expected[name], got[name]
        assert g["calls"] == e["calls"], name
        assert g["self_cpu_ms"] * 1e6 == pytest.approx(e["self_cpu"], abs=1e-3), name
        assert g["total_cpu_ms"] * 1e6 == pytest.approx(e["total_cpu"], abs=1e-3), name
        assert g["self_device_ms"] * 1e6 == pytest.approx(e["self_dev"], abs=1e-3), name
    total_dev = defaultdict(int)
    for i, op in enumerate(ref.ops):
        total_dev[op["name"]] += ref.total_dev[i]
    for name in names:
        assert got[name]["total_device_ms"] * 1e6 == pytest.approx(total_dev[name], abs=1e-3), name
    assert r.device_attributed_ms * 1e6 == pytest.approx(ref.attributed, abs=1e-3)
    assert r.self_cpu_ms * 1e6 == pytest.approx(sum(ref.self_cpu), abs=1e-3)
    assert r.nesting_conflicts == 0


def test_top_lists_are_sorted_and_cut(corpus: Path):
    """Top-N by self device time and by self CPU time: the N largest groups of the reference."""
    ref = _ref(corpus, RESNET)
    expected = ref.group(lambda i: ref.ops[i]["name"])
    r = operator_stats(read_kineto(corpus / RESNET)[0], top_n=5, group_by="name")
    assert len(r.by_self_device.calls) == 5 and len(r.by_self_cpu.calls) == 5
    by_dev = sorted(expected, key=lambda n: -expected[n]["self_dev"])[:5]
    by_cpu = sorted(expected, key=lambda n: -expected[n]["self_cpu"])[:5]
    assert r.by_self_device.name == by_dev
    assert r.by_self_cpu.name == by_cpu
    # ResNet50 V100 sample: the convolution backward ops lead the device time
    assert by_dev[0] == "aten::cudnn_convolution_backward_weight"


def test_group_by_shapes(corpus: Path):
    """(name, input shapes) groups: calls and self times per shape equal the reference, the
    shapes being the ops' `Input Dims` (compared as parsed JSON)."""
    ref = _ref(corpus, RESNET)

    def key(i):
        dims = ref.ops[i]["args"].get("Input Dims")
        return ref.ops[i]["name"], (json.dumps(dims) if dims is not None else None)

    expected = ref.group(key)
    r = operator_stats(read_kineto(corpus / RESNET)[0], top_n=10_000, group_by="shapes")
    assert r.groups == len(expected)
    got = {}
    for row in columns_frame(r.by_self_cpu).to_dicts():
        dims = row["input_dims"]
        got[(row["name"], json.dumps(json.loads(dims)) if dims is not None else None)] = row
    assert set(got) == set(expected)
    conv = [k for k in expected if k[0] == "aten::cudnn_convolution"]
    assert len(conv) > 5
    for k in conv + sorted(expected, key=lambda k: -expected[k]["self_dev"])[:10]:
        assert got[k]["calls"] == expected[k]["calls"]
        assert got[k]["self_cpu_ms"] * 1e6 == pytest.approx(expected[k]["self_cpu"], abs=1e-3)
        assert got[k]["self_device_ms"] * 1e6 == pytest.approx(expected[k]["self_dev"], abs=1e-3)


def _user_frame(frames: list[str], library) -> str | None:
    src = [f for f in frames if re.match(r"^[^<].*\(\d+\): ", f)]
    return next((f for f in src if not library(f)), src[0] if src else None)


def _inherit(ref: Ref, own: list) -> list:
    loc = []
    for i in range(len(ref.ops)):
        j = i
        while j is not None and own[j] is None:
            j = ref.parent[j]
        loc.append(own[j] if j is not None else None)
    return loc


def test_group_by_stack_2021_call_stack(corpus: Path):
    """2021 format (`Call stack` arg): location = innermost frame outside site-packages of the
    op's own stack, inherited from the nearest enclosing op that has one; every group's calls
    and self times equal the reference."""
    ref = _ref(corpus, RESNET)

    def lib(f):
        return "site-packages" in f or "/lib/python" in f

    own = [_user_frame(op["args"]["Call stack"].split(";"), lib) if op["args"].get("Call stack") else None
           for op in ref.ops]
    loc = _inherit(ref, own)
    expected = ref.group(lambda i: loc[i])
    r = operator_stats(read_kineto(corpus / RESNET)[0], top_n=100, group_by="stack")
    assert r.stack_source == "call_stack"
    got = _rows(r.by_self_cpu, ["location"])
    assert set(got) == set(expected)
    assert "resnet50_profiler_api.py(46): <module>" in got           # the model's forward line
    for k, e in expected.items():
        assert got[k]["calls"] == e["calls"], k
        assert got[k]["self_cpu_ms"] * 1e6 == pytest.approx(e["self_cpu"], abs=1e-3), k
        assert got[k]["self_device_ms"] * 1e6 == pytest.approx(e["self_dev"], abs=1e-3), k


def test_group_by_stack_python_function(corpus: Path):
    """with_stack trace (B200, vLLM): location = innermost enclosing `python_function` frame that
    is not torch/triton/flashinfer/numpy, standard library or `<built-in ...>` (else the
    innermost source frame), inherited from the enclosing op when the op has no frame."""
    ref = _ref(corpus, B200)
    stdlib_files = {"pathlib.py", "contextlib.py", "typing.py", "enum.py", "copy.py", "copyreg.py",
                    "threading.py", "functools.py", "abc.py", "weakref.py", "inspect.py"}

    def lib(f):
        path = f.split("(", 1)[0]
        top = path.split("/", 1)[0]
        return (top in {"torch", "triton", "flashinfer", "numpy", "logging", "json", "concurrent", "asyncio"}
                or path in stdlib_files)

    # innermost enclosing frames of each op's start, by a stack sweep over frames and ops
    frames_at = [None] * len(ref.ops)
    items = defaultdict(list)
    for k, fr in enumerate(ref.frames):
        items[fr["thread"]].append((fr["s"], 0, -(fr["e"] - fr["s"]), "f", k))
    for i, op in enumerate(ref.ops):
        items[op["thread"]].append((op["s"], 1, 0, "o", i))
    for lst in items.values():
        stack: list[int] = []
        for s, _, _, what, k in sorted(lst):
            while stack and ref.frames[stack[-1]]["e"] <= s:
                stack.pop()
            if what == "f":
                stack.append(k)
            elif stack:
                frames_at[k] = [ref.frames[j]["name"] for j in reversed(stack)]      # innermost first
    own = [_user_frame(f, lib) if f else None for f in frames_at]
    loc = _inherit(ref, own)
    expected = ref.group(lambda i: loc[i])
    r = operator_stats(read_kineto(corpus / B200)[0], top_n=1000, group_by="stack")
    assert r.stack_source == "python_function"
    got = _rows(r.by_self_device, ["location"])
    assert set(got) == set(expected)
    top = max(expected, key=lambda k: expected[k]["self_dev"])
    assert r.by_self_device.location[0] == top and top.startswith("vllm/")
    for k, e in expected.items():
        assert got[k]["calls"] == e["calls"], k
        assert got[k]["self_cpu_ms"] * 1e6 == pytest.approx(e["self_cpu"], abs=1e-3), k
        assert got[k]["self_device_ms"] * 1e6 == pytest.approx(e["self_dev"], abs=1e-3), k


def test_device_time_follows_external_id(corpus: Path):
    """Cross-check by another link: on hta-negative-queue, the kernels given to an op by the
    time-containment rule carry that op's `External id` in nearly every case (Kineto stamps
    the innermost op's id on launches)."""
    doc = load_json(corpus / NQ)
    xs = x_events(doc)
    ops_ext = defaultdict(int)
    for e in xs:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            ops_ext[e["args"].get("External id")] += 1
    name_of_ext = {e["args"]["External id"]: e["name"] for e in xs
                   if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {})}
    by_name = defaultdict(int)
    for ext, n in ops_ext.items():
        if ext in name_of_ext:
            by_name[name_of_ext[ext]] += n
    r = operator_stats(read_kineto(corpus / NQ)[0], top_n=1000, group_by="name")
    got = dict(zip(r.by_self_cpu.name, r.by_self_cpu.device_events))
    agree = sum(min(got.get(n, 0), c) for n, c in by_name.items())
    assert agree >= 0.95 * sum(by_name.values())


# ----------------------------------------------------------------------------------------------
def _synthetic(tmp_path: Path) -> Path:
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 0, "dur": 40},     # same start
        {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 50, "dur": 30},
        {"ph": "X", "cat": "cpu_op", "name": "leaf", "pid": 1, "tid": 1, "ts": 55, "dur": 0},      # zero duration
        {"ph": "X", "cat": "cpu_op", "name": "skew", "pid": 1, "tid": 1, "ts": 90, "dur": 20},     # sticks out
        {"ph": "X", "cat": "cpu_op", "name": "other_thread", "pid": 1, "tid": 2, "ts": 10, "dur": 50},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 50, "dur": 5,
         "args": {"correlation": 7}},                                                            # at inner's start
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 85, "dur": 3,
         "args": {"correlation": 8}},                                                            # in outer only
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 3, "ts": 20, "dur": 3,
         "args": {"correlation": 9}},                                                            # no op around
        {"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 60, "dur": 11,
         "args": {"correlation": 7, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 90, "dur": 13,
         "args": {"correlation": 8, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "k3", "pid": 0, "tid": 7, "ts": 120, "dur": 17,
         "args": {"correlation": 9, "device": 0, "stream": 7}},
    ]
    return write_trace(tmp_path / "t.json", {"traceEvents": ev})


def test_synthetic_edge_cases(tmp_path: Path):
    """Hand-built trace (us): outer [0,100) holds inner [0,40) and inner [50,80) (which holds a
    zero-length leaf at 55); skew [90,110) sticks out of outer and is left unnested (1
    conflict). Launch at 50 -> kernel 11 us on the second inner; launch at 85 -> 13 us on outer;
    a launch on a thread without ops -> unattributed 17 us."""
    r = operator_stats(read_kineto(_synthetic(tmp_path))[0], top_n=10, group_by="name")
    rows = _rows(r.by_self_cpu, ["name"])
    assert rows["outer"]["self_cpu_ms"] == pytest.approx((100 - 40 - 30) / 1e3)
    assert rows["inner"]["calls"] == 2 and rows["inner"]["self_cpu_ms"] == pytest.approx(70 / 1e3)
    assert rows["leaf"]["calls"] == 1 and rows["leaf"]["self_cpu_ms"] == 0.0
    assert rows["skew"]["self_cpu_ms"] == pytest.approx(20 / 1e3)
    assert rows["other_thread"]["self_cpu_ms"] == pytest.approx(50 / 1e3)
    assert rows["inner"]["self_device_ms"] == pytest.approx(11 / 1e3)
    assert rows["outer"]["self_device_ms"] == pytest.approx(13 / 1e3)
    assert rows["outer"]["total_device_ms"] == pytest.approx(24 / 1e3)
    assert r.device_ms == pytest.approx(41 / 1e3) and r.device_attributed_ms == pytest.approx(24 / 1e3)
    assert r.nesting_conflicts == 1
    assert r.by_self_device.name[:2] == ["outer", "inner"]
    s = operator_stats(read_kineto(_synthetic(tmp_path))[0], group_by="stack")
    assert s.stack_source is None and s.by_self_cpu.location == [None]
    with pytest.raises(ValueError):
        operator_stats(read_kineto(_synthetic(tmp_path))[0], group_by="module")


@pytest.mark.parametrize("rel", corpus_trace_params())
def test_works_on_every_corpus_trace(corpus: Path, rel: str):
    """All three groupings run on every trace; CPU-only traces give zero device time."""
    trace, _ = read_kineto(corpus / rel)
    for group_by in ("name", "shapes", "stack"):
        r = operator_stats(trace, top_n=7, group_by=group_by)
        assert isinstance(r, OperatorStats)
        assert len(r.by_self_cpu.calls) <= 7 and len(r.by_self_device.calls) <= 7
        assert r.device_attributed_ms <= r.device_ms + 1e-9
        if not trace.has_device_activity():
            assert r.device_ms == 0.0
            assert sum(r.by_self_cpu.self_device_ms) == 0.0
        if r.by_self_cpu.calls:
            cpu, dev = r.by_self_cpu, r.by_self_device
            assert all(s <= t + 1e-9 for s, t in zip(cpu.self_cpu_ms, cpu.total_cpu_ms))
            assert all(s >= 0 for s in cpu.self_cpu_ms)
            assert all(s <= t + 1e-9 for s, t in zip(dev.self_device_ms, dev.total_device_ms))


_interval = st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(1, 40))     # thread, start, duration


@settings(max_examples=300, deadline=None)
@example(intervals=[(0, 0, 100), (0, 52, 8)], queries=[(0, 55), (0, 51)])     # a query just before the one before it
@given(intervals=st.lists(_interval, max_size=60), queries=st.lists(st.tuples(st.integers(-1, 4), st.integers(-5, 110)),
                                                                      max_size=30))
def test_c_nesting_is_the_numpy_nesting(intervals, queries):
    """The C sweep (built at install) gives the numpy method's parents, conflict count and
    innermost ops, on small random intervals: nested, disjoint, partly overlapping (conflicts),
    equal ones, several threads; queries in any order and in time order."""
    from rankscope.analyses.rank import operators
    if operators._nesting is None:
        pytest.skip("built without a C compiler: only the numpy method exists")
    ordered = sorted(intervals, key=lambda x: (x[0], x[1], -x[2]))
    g, s, d = (np.array([x[k] for x in ordered], dtype=np.int64) for k in range(3))
    c, ref = operators._Forest(g, s, s + d), operators._Forest(g, s, s + d, use_c=False)
    assert c.c and not ref.c
    assert c.parent.tolist() == ref.parent.tolist() and c.conflicts == ref.conflicts
    for asked in (queries, sorted(queries)):      # sorted: the C search gallops from each answer to the next
        qg, qt = (np.array([q[k] for q in asked], dtype=np.int64) for k in range(2))
        assert c.innermost(qg, qt).tolist() == ref.innermost(qg, qt).tolist()
