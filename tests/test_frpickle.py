"""The C reader of Flight Recorder pickles (ingest/_frpickle.c) against the reference reader: the
restricted unpickler (ingest/safe_pickle.py) and `_plain_entries` over its plain data, which define
the contract. Expected values are that reference reader's result on the same bytes: the same
columns, texts, groups and frames, or the same one-line error. The C reader may leave a file to the
reference (it returns None: an opcode or shape it does not take), never give another answer; the
tests also check that it does take every dump torch or Python's pickler writes (protocols 2-5).

Inputs: the committed torch 2.13 dumps (tests/data/hangs, the corpus' fr-gloo-4rank-late), the same
data re-pickled at every protocol, NCCL-style dumps made here (p2p, coalesced, wrapped, out of
record order), random dumps (hypothesis: any field of any plain type), and real dumps cut and
mutated byte by byte (a fixed random sequence).
"""
from __future__ import annotations

import pickle
import random
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rankscope.ingest import TraceError
from rankscope.ingest import flight_recorder as fr

DATA = Path(__file__).resolve().parent / "data" / "hangs"
pytestmark = pytest.mark.skipif(fr._frpickle is None, reason="C reader not built (no C compiler at install): "
                                                            "nothing to compare the reference with")


def _outcome(path: Path, frames_last: int | None, use_c: bool, monkeypatch):
    """read_fr_dump's FrDump, or its TraceError's message, by the C reader (where it takes the file)
    or by the reference alone."""
    with monkeypatch.context() as m:
        if not use_c:
            m.setattr(fr, "_frpickle", None)
        try:
            return fr.read_fr_dump(path, frames_last)
        except TraceError as exc:
            return f"TraceError: {exc}"


def _differs(a, b) -> str | None:
    """The first field where two outcomes differ (NaN equal to NaN), else None."""
    if isinstance(a, str) or isinstance(b, str):
        return None if a == b else f"{a!r} != {b!r}"
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
                return f"{f.name}: {x!r} != {y!r}"
        elif x != y:
            return f"{f.name}: {x!r} != {y!r}"
    return None


def _same_both_ways(path: Path, monkeypatch) -> None:
    for frames_last in (None, 2):
        c, ref = (_outcome(path, frames_last, use_c, monkeypatch) for use_c in (True, False))
        assert _differs(c, ref) is None, (path.name, frames_last, _differs(c, ref))


def _taken_by_c(data: bytes) -> bool:
    return fr._frpickle.read(data, 1 << 40) is not None


def _real_pickles() -> list[Path]:
    from conftest import corpus_root
    found = [p for p in DATA.rglob("*") if p.is_file() and p.read_bytes()[:1] == b"\x80"]
    return sorted(found) + sorted((corpus_root() / "fr-gloo-4rank-late").iterdir())


T0 = 1_700_000_000_000_000_000
FRAMES = [{"name": "all_reduce", "filename": "/site-packages/torch/distributed/distributed_c10d.py", "line": 2696},
          {"name": "step", "filename": "/job/train.py", "line": 42}]


def _nccl_entries() -> list[dict]:
    """Collectives, a coalesced pair, a send / recv pair, states and times as NCCL records them; the
    ring wrapped (record ids from 40), written out of record order."""
    out = []
    for i in range(12):
        p2p = i % 4 == 3
        op = ("send 0->1" if i % 8 == 3 else "recv 1->0") if p2p else "all_reduce" if i % 3 else "_reduce_scatter_base"
        state = "completed" if i < 9 else "started" if i < 11 else "scheduled"
        pg = ("1", "mesh_tp") if i % 2 else ["0", "default_pg"]          # a tuple as torch, a list as JSON
        out.append({"record_id": 40 + i, "pg_id": 0, "process_group": pg,
                    "collective_seq_id": i // 2 if not p2p else 0, "p2p_seq_id": i if p2p else 0, "op_id": i,
                    "profiling_name": f"nccl:{op}", "time_created_ns": T0 + i * 1000, "input_sizes": [[4096, i % 3]],
                    "input_dtypes": ["BFloat16"], "output_sizes": [[4096, i % 3]] if i != 5 else [[4096], [2]],
                    "output_dtypes": ["BFloat16"], "state": state,
                    "time_discovered_started_ns": T0 + i * 1000 + 5 if state != "scheduled" else None,
                    "time_discovered_completed_ns": T0 + i * 1000 + 90 if state == "completed" else None,
                    "duration_ms": 0.085 if state == "completed" else None, "retired": state == "completed",
                    "timeout_ms": 600_000, "is_p2p": p2p, "frames": FRAMES if i % 5 else [dict(f) for f in FRAMES]})
    out[4]["collective_seq_id"] = out[2]["collective_seq_id"]       # a coalesced call: two entries, one seq
    return out[6:] + out[:6]


def _nccl_dump() -> dict:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
                                             "1": {"name": "1", "desc": "mesh_tp", "ranks": [1, 0]}},
            "pg_status": {}, "entries": _nccl_entries(), "nccl_version": "2.21.5"}


def test_real_dumps_same_as_the_reference_and_taken(tmp_path, monkeypatch):
    """Every committed torch dump, and its plain data re-pickled by Python at protocols 2-5."""
    for path in _real_pickles():
        assert _taken_by_c(path.read_bytes()), path
        _same_both_ways(path, monkeypatch)
        plain = pickle.loads(path.read_bytes())                  # our own test data
        for protocol in range(2, 6):
            again = tmp_path / f"rank_{protocol}"
            again.write_bytes(pickle.dumps(plain, protocol=protocol))
            assert _taken_by_c(again.read_bytes()), (path, protocol)
            _same_both_ways(again, monkeypatch)


def test_nccl_style_dump_same_as_the_reference(tmp_path, monkeypatch):
    """p2p, a coalesced call, a wrapped ring written out of order, states and times: the columns as
    the reference reads them, and the hand count of what was built (12 entries, sorted by record id
    40-51, 2 process groups, frames of the last 2 per stream)."""
    path = tmp_path / "nccl_trace_rank_0"
    for protocol in (2, 4, 5):
        path.write_bytes(pickle.dumps(_nccl_dump(), protocol=protocol))
        assert _taken_by_c(path.read_bytes())
        _same_both_ways(path, monkeypatch)
    d = fr.read_fr_dump(path, frames_last=2)
    assert d.record_id.tolist() == list(range(40, 52)) and len(d.pgs) == 2 and d.comm_lib_version == "2.21.5"
    assert int(d.is_p2p.sum()) == 3 and sorted(d.frames) == [5, 7, 8, 9, 10, 11]


_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
                    st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\ud800\udfff\u2003 :"),
                            max_size=6), st.sampled_from(["scheduled", "started", "completed", "nccl:send 0->1",
                                                          "gloo:all_reduce", " nccl: recv\u2003x"]))
_VALUE = st.recursive(_SCALAR, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
                      | st.dictionaries(st.sampled_from(["name", "filename", "line", "desc", "ranks", "x"]), inner,
                                        max_size=3), max_leaves=8)
_FIELDS = ["record_id", "process_group", "collective_seq_id", "p2p_seq_id", "profiling_name", "time_created_ns",
           "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state", "time_discovered_started_ns",
           "time_discovered_completed_ns", "duration_ms", "timeout_ms", "is_p2p", "frames"]


@st.composite
def _dumps(draw):
    """A dump whose entries start from a typical one and replace a few fields by any plain value."""
    entries = []
    for e in draw(st.lists(st.sampled_from(_nccl_entries()), min_size=0, max_size=5)):
        e = dict(e)
        for key in draw(st.lists(st.sampled_from(_FIELDS), max_size=4)):
            if draw(st.booleans()):
                e[key] = draw(_VALUE)
            else:
                e.pop(key, None)
        entries.append(e if draw(st.integers(0, 9)) else draw(_VALUE))
    odd = draw(st.integers(0, 9)) == 0                     # now and then, any value at the top too
    dump = {"version": draw(_VALUE) if odd else "2.10", "entries": entries,
            "pg_config": draw(_VALUE) if odd else draw(st.sampled_from([_nccl_dump()["pg_config"], {}]))}
    if draw(st.booleans()):
        dump["comm_lib_version"] = draw(_VALUE)
    return dump, draw(st.sampled_from([4, 2, 5, 3]))      # 0 and 1 start with no PROTO: not read as dumps


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_dumps())
def test_random_dumps_same_as_the_reference(tmp_path, monkeypatch, dump_protocol):
    dump, protocol = dump_protocol
    path = tmp_path / "rank_0"
    path.write_bytes(pickle.dumps(dump, protocol=protocol))
    _same_both_ways(path, monkeypatch)


def test_cut_and_mutated_dumps_same_as_the_reference(tmp_path, monkeypatch):
    """A real dump cut at every 97th byte, and 400 mutations from a fixed random sequence (a byte
    changed, inserted or deleted; the rest kept): the same FrDump or the same error; the C reader
    never crashes."""
    data = (DATA / "mesh-tp-skip" / "rank_3").read_bytes()
    rng = random.Random(30)
    samples = [data[:n] for n in range(1, len(data), 97)]
    for _ in range(400):
        b = bytearray(data)
        at = rng.randrange(len(b))
        kind = rng.randrange(3)
        if kind == 0:
            b[at] = rng.randrange(256)
        elif kind == 1:
            b.insert(at, rng.randrange(256))
        else:
            del b[at]
        samples.append(bytes(b))
    path = tmp_path / "rank_3"
    for sample in samples:
        path.write_bytes(sample)
        c, ref = (_outcome(path, 8, use_c, monkeypatch) for use_c in (True, False))
        assert _differs(c, ref) is None, (sample[:60], _differs(c, ref))


@pytest.mark.parametrize("stream", [
    b"\x80\x02cos\nsystem\nq\x00.",                                 # GLOBAL
    b"\x80\x02}(X\x07\x00\x00\x00entries]\x82\x01u.",                 # EXT1 as a value
    b"\x80\x02}K\x01]s.",                                            # an int dict key
    b"\x80\x04\x8f.",                                                # EMPTY_SET
    b"\x80\x02(dp0\nVentries\np1\n(lp2\ns.",                         # text opcodes (protocol 0's)
    b"\x80\x02}X\x07\x00\x00\x00entries]r\x05\x00\x00\x00s.",         # memo index 5 with none stored
    b"\x80\x02}X\x07\x00\x00\x00entries]s",                          # no STOP
    b"\x80\x02]X\x02\x00\x00\x00\xed\xa0s.",                         # a cut UTF-8 sequence
])
def test_left_to_the_reference(stream):
    """What the C reader does not take (read by hand from each stream's opcodes) it leaves to the
    reference (None), which then reads or refuses it."""
    assert fr._frpickle.read(stream, 1 << 40) is None


def test_shared_references_bounded_in_c():
    """One entry dict shared 20,000 times, its sizes one list of 1,000 references to one list of
    1,000 ints (45 kB): the C reader itself stops at the walk limit (2e10 values otherwise)."""
    inner = list(range(1000))
    entry = {"record_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1, "p2p_seq_id": 0,
             "profiling_name": "gloo:all_reduce", "time_created_ns": 1, "input_sizes": [inner] * 1000}
    data = pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [entry] * 20_000})
    with pytest.raises(fr._frpickle.WalkLimit):
        fr._frpickle.read(data, fr.MAX_WALK_PER_BYTE * len(data))
