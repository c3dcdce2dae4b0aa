"""CUDA memory snapshots (issue 8 item 3): `rankscope memory SNAPSHOT...`.

Independent sources of the expected answers:
- the corpus pickle read here with the standard library: `pickletools` first proves it names no
  global (so plain `pickle.loads` of this trusted file runs nothing), then a minimal walk of the
  plain structure: block sizes by state, segment sizes, the device trace's alloc / free_completed
  sizes and the end-anchored replay (allocated before = allocated at the end - what the trace added);
- snapshots written in the test as plain dicts, with hand-counted sizes (OOM, categories, theory);
- a malicious pickle (`__reduce__` -> os.system) must be refused and must NOT run: its marker file
  must not exist afterwards.
"""
from __future__ import annotations

import json
import os
import pickle
import pickletools
from pathlib import Path

import pytest
from rich.console import Console

from rankscope.analyses.inputs.memory_snapshot import analyze_snapshot, classify_frames, theoretical_breakdown
from rankscope.ingest import TraceError
from rankscope.ingest.memory_snapshot import read_memory_snapshot
from rankscope.render.base import render
from rankscope.render.memory_snapshot import MemoryJson
from rankscope.results import MemoryResult

from conftest import assert_no_traceback, run_cli

MB = 1 << 20


@pytest.fixture(scope="module")
def snapshot_path(corpus: Path) -> Path:
    return corpus / "memory-snapshot-1gpu" / "memory_snapshot.pickle"


@pytest.fixture(scope="module")
def raw(snapshot_path) -> dict:
    data = snapshot_path.read_bytes()
    assert not [op.name for op, _arg, _pos in pickletools.genops(data)
                if op.name in ("GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX")]
    return pickle.loads(data)


@pytest.fixture(scope="module")
def report(snapshot_path):
    return analyze_snapshot(read_memory_snapshot(snapshot_path))


def _blocks(raw: dict, state: str) -> list[dict]:
    return [b for s in raw["segments"] for b in s["blocks"] if b["state"] == state]


# ---------------------------------------------------------------------------------------------
def test_segments_match_a_plain_walk(raw, report):
    (dev,) = report.devices
    live = _blocks(raw, "active_allocated")
    free = [b["size"] for b in _blocks(raw, "inactive")]
    assert dev.allocated == sum(b["size"] for b in live)
    assert dev.reserved == sum(s["total_size"] for s in raw["segments"])
    assert dev.segments == len(raw["segments"]) and dev.live_blocks == len(live) and dev.free_blocks == len(free)
    assert dev.largest_free_block == max(free)
    assert dev.fragmentation_pct == pytest.approx(100 * (1 - max(free) / sum(free)))
    # the figures themselves, for the record: 13,524 MB reserved, 1,313.9 MB allocated
    assert (dev.reserved / MB, round(dev.allocated / MB, 1)) == (13524.0, 1313.9)


def test_largest_block_and_its_stack(raw, report):
    biggest = max(_blocks(raw, "active_allocated"), key=lambda b: b["size"])
    top = report.largest_blocks[0]
    assert top.size == biggest["size"] and top.address == biggest["address"]
    first_user = next(f for f in biggest["frames"] if "site-packages" not in f["filename"])
    assert top.user_frame == (first_user["name"], first_user["filename"], first_user["line"])
    assert top.category == "activations"            # allocated under forward (model.py)
    assert [b.size for b in report.largest_blocks] == sorted((b["size"] for b in _blocks(raw, "active_allocated")),
                                                               reverse=True)[:10]


def test_trace_replay_peak_matches_end_anchored_replay(raw, report):
    events = raw["device_traces"][0]
    added = [e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
             for e in events]
    end = sum(b["size"] for b in _blocks(raw, "active_allocated"))
    level = before = end - sum(added)
    peak = level
    for delta in added:
        level += delta
        peak = max(peak, level)
    replay = report.devices[0].replay
    assert replay.events == len(events)
    assert replay.actions == {a: sum(e["action"] == a for e in events) for a in {e["action"] for e in events}}
    # trace events carry the requested size, blocks the rounded one (4 B asked -> a 512 B block):
    # the two replays differ only by that rounding of the small blocks alive at the end
    assert abs(replay.allocated_before_window - before) < 4096
    assert abs(replay.peak_allocated - peak) < 4096
    assert replay.peak_reserved == sum(s["total_size"] for s in raw["segments"])   # no segment event recorded
    assert sum(replay.peak_by_category.values()) == replay.peak_allocated


def test_categories_at_the_snapshot(raw, report):
    live = _blocks(raw, "active_allocated")
    forward = sum(b["size"] for b in live if any(f["name"] == "forward" for f in b["frames"]))
    names = {f["name"] for b in live for f in b["frames"]}
    # no stack here names an optimizer, backward or a module __init__: all else is unknown
    assert not names & {"step", "_init_group", "backward", "__init__", "_apply"}
    cats = report.devices[0].live_by_category
    assert cats["activations"] == forward and cats["unknown"] == sum(b["size"] for b in live) - forward
    assert sum(cats.values()) == report.devices[0].allocated


# ---------------------------------------------------------------------------------------------
def _frames(*names_files):
    return [{"name": n, "filename": f, "line": 1} for n, f in names_files]


def _write(path: Path, snapshot) -> Path:
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return path


def test_oom_events_and_categories_hand_count(tmp_path):
    fwd = _frames(("forward", "/work/model.py"), ("_call_impl", "/x/site-packages/torch/nn/modules/module.py"))
    adam = _frames(("_init_group", "/x/site-packages/torch/optim/adam.py"), ("step", "/x/torch/optim/adam.py"))
    snap = {
        "segments": [{"device": 0, "address": 0, "total_size": 1000, "allocated_size": 300, "segment_type": "large",
                      "stream": 0, "blocks": [
                          {"address": 0, "size": 100, "requested_size": 100, "state": "active_allocated",
                           "frames": _frames(("__init__", "/work/model.py"))},
                          {"address": 100, "size": 200, "requested_size": 200, "state": "active_allocated",
                           "frames": adam},
                          {"address": 300, "size": 700, "requested_size": 700, "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": "alloc", "addr": 100, "size": 200, "stream": 0, "time_us": 10, "frames": adam},
            {"action": "alloc", "addr": 300, "size": 500, "stream": 0, "time_us": 20, "frames": fwd},
            {"action": "free_requested", "addr": 300, "size": 500, "stream": 0, "time_us": 30, "frames": fwd},
            {"action": "free_completed", "addr": 300, "size": 500, "stream": 0, "time_us": 31, "frames": fwd},
            {"action": "oom", "addr": 0, "size": 4000, "stream": 0, "time_us": 40, "frames": fwd, "device_free": 64},
        ]],
    }
    report = analyze_snapshot(read_memory_snapshot(_write(tmp_path / "oom.pickle", snap)))
    (dev,) = report.devices
    # by hand: 100 B (parameters, allocated before the trace) + 200 optimizer + 500 activations = 800 at the peak
    assert dev.replay.allocated_before_window == 100
    assert dev.replay.peak_allocated == 800 and dev.replay.peak_time_us == 20
    assert dev.replay.peak_by_category == {"parameters": 100, "gradients": 0, "optimizer": 200, "activations": 500,
                                           "unknown": 0}
    assert dev.live_by_category["optimizer"] == 200 and dev.live_by_category["parameters"] == 100
    (oom,) = report.ooms
    assert (oom.requested, oom.device_free, oom.allocated_at_oom) == (4000, 64, 300)
    assert [e["action"] for e in oom.events_before] == ["alloc", "alloc", "free_requested", "free_completed"]
    assert oom.events_before[1]["frame"] == "forward /work/model.py:1"
    out = MemoryJson().to_dict(MemoryResult([report], []))
    assert out["snapshots"][0]["ooms"][0]["events_before"][0]["category"] == "optimizer"


@pytest.mark.parametrize("frames, category", [
    ([("step", "/x/site-packages/torch/optim/adamw.py", 1)], "optimizer"),
    ([("backward", "/x/site-packages/torch/_tensor.py", 1)], "gradients"),
    ([("_apply", "/x/site-packages/torch/nn/modules/module.py", 1), ("to", "/x/module.py", 1)], "parameters"),
    ([("__init__", "/work/model.py", 1), ("forward", "/work/model.py", 2)], "activations"),
    ([("<module>", "/work/train.py", 1)], "unknown"),
    ([], "unknown"),
])
def test_classify_frames(frames, category):
    assert classify_frames(frames) == category


def test_theoretical_breakdown_hand_count():
    # seed 003: 1000 params fp32: 4000 params + 4000 grads + 8000 Adam (2 x fp32) = 16000 static
    t = theoretical_breakdown(1000, 4, measured_peak=20000)
    assert t.by_category == {"parameters": 4000, "gradients": 4000, "optimizer": 8000, "activations": 4000}
    # bf16: 2000 + 2000 + (8000 Adam + 4000 fp32 master) = 16000 (the 16 bytes per parameter of mixed precision)
    assert theoretical_breakdown(1000, 2, measured_peak=10000).by_category == {
        "parameters": 2000, "gradients": 2000, "optimizer": 12000, "activations": 0}


# ---------------------------------------------------------------------------------------------
class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_malicious_pickle_is_refused_and_does_not_run(tmp_path):
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "x": _Exploit(marker)}))
    with pytest.raises(TraceError, match=r"unsafe pickle, not loaded: it names the global (posix|os)\.system"):
        read_memory_snapshot(evil)
    assert not marker.exists()
    proc = run_cli(["memory", evil], tmp_path)
    assert proc.returncode == 2 and not marker.exists()
    assert len(proc.stderr.strip().splitlines()) == 1 and f"{evil}: unsafe pickle" in proc.stderr
    assert_no_traceback(proc)


@pytest.mark.parametrize("make, problem", [
    (lambda data: b"", "empty file"),
    (lambda data: data[: len(data) // 2], "truncated or damaged pickle"),
    (lambda data: b"segments: []\n", "not a pickle"),
    (lambda data: pickle.dumps([1, 2, 3]), "a list without 'segments': not a torch.cuda.memory._snapshot"),
    (lambda data: pickle.dumps({"segments": [{"blocks": []}]}), "unexpected snapshot layout"),
])
def test_bad_input_one_line_error(tmp_path, snapshot_path, make, problem):
    path = tmp_path / "bad.pickle"
    path.write_bytes(make(snapshot_path.read_bytes()))
    with pytest.raises(TraceError, match=problem):
        read_memory_snapshot(path)


def test_cli_json_and_exit_codes(tmp_path, snapshot_path, raw):
    ok = run_cli(["memory", snapshot_path, "--json", "--params", "1000000"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["schema"] == "rankscope.memory_snapshot/1"
    (snap,) = out["snapshots"]
    assert snap["devices"][0]["allocated_mb"] == round(sum(b["size"] for b in _blocks(raw, "active_allocated")) / MB, 3)
    theory = {row["category"]: row["theoretical_mb"] for row in snap["theoretical"]["rows"]}
    assert theory["parameters"] == round(4_000_000 / MB, 3) and theory["optimizer"] == round(8_000_000 / MB, 3)

    truncated = tmp_path / "cut.pickle"
    truncated.write_bytes(snapshot_path.read_bytes()[:1000])
    some = run_cli(["memory", snapshot_path, truncated, "--json"], tmp_path)
    assert some.returncode == 1 and some.stderr.startswith(f"rankscope: {truncated}: truncated or damaged pickle")
    assert json.loads(some.stdout)["inputs"]["skipped"][0]["file"] == str(truncated)
    none = run_cli(["memory", truncated], tmp_path)
    assert none.returncode == 2 and len(none.stderr.strip().splitlines()) == 1
    for proc in (ok, some, none):
        assert_no_traceback(proc)


def test_terminal_fits_80_columns(report):
    console = Console(width=80, record=True, color_system=None)
    render(MemoryResult([report], []), "terminal", console)
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    assert "scattered 97.4%" in text and "forward model.py:39" in text   # 1 - largest free block / free cached
    assert "fragmentation at peak allocated" in text


# ---------------------------------------------------------------------------------------------
# Issue 16: tuples nested by memo references, hashed as dict keys / set members, at unpickle.
def _tuple_chain(levels: int) -> bytes:
    """Pickle opcodes, by hand: t0 = () in memo 0, then t(i+1) = (t(i), t(i)) in memo i+1, each
    item the one before (6 bytes a level, the stack left empty). t(n) expands to
    2**(n+1) - 1 tuples."""
    out = bytearray(b"\x80\x04)\x940")                      # PROTO 4, EMPTY_TUPLE, MEMOIZE (as 0), POP
    for i in range(levels):
        out += b"h%c2\x86\x940" % i                           # BINGET i, DUP, TUPLE2, MEMOIZE (as i+1), POP
    return bytes(out)


#: How the chain's last tuple gets hashed: as a dict key (three opcodes), a set or frozenset member.
_HASH_SITES = {
    "setitem": b"}h%cK\x01s.",           # EMPTY_DICT, BINGET n, BININT1 1, SETITEM, STOP
    "setitems": b"}(h%cK\x01u.",         # EMPTY_DICT, MARK, key, value, SETITEMS
    "dict": b"(h%cK\x01d.",              # MARK, key, value, DICT
    "frozenset": b"(h%c\x91.",           # MARK, member, FROZENSET
    "set": b"\x8f(h%c\x90.",             # EMPTY_SET, MARK, member, ADDITEMS
}


def test_shared_tuple_keys_are_refused_before_unpickling(tmp_path):
    """~380-byte pickles whose one key is a tuple of 2**61 - 1 tuples (hashing it would not end):
    each refused from its opcodes, with one line naming the file, while the subprocess's timeout
    (generous: unpickling would take years) guards the suite against a hang."""
    files = []
    for site, tail in _HASH_SITES.items():
        path = tmp_path / f"{site}.pickle"
        path.write_bytes(_tuple_chain(60) + tail % 60)
        assert len(path.read_bytes()) < 400
        files.append(path)
    proc = run_cli(["memory", *files], tmp_path, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == len(files)
    for path, line in zip(files, lines):
        assert line.startswith(f"rankscope: {path}: memory snapshot: its dict keys or set members") \
            and line.endswith("refused, not unpickled"), line
    assert_no_traceback(proc)
    with pytest.raises(TraceError, match="would take over 1,048,576 hashing steps"):      # in-process: as quick
        read_memory_snapshot(files[0])


def test_hash_work_hand_count(tmp_path):
    """The count the refusal rests on, by hand: a key t(n) hashes 2**(n+1) - 1 tuples; a small
    one passes the floor of MIN_HASH_LIMIT and the snapshot reads."""
    from rankscope.ingest.safe_pickle import MIN_HASH_LIMIT, _hash_work
    for site, tail in _HASH_SITES.items():
        assert _hash_work(_tuple_chain(10) + tail % 10, 1 << 40) == 2**11 - 1, site
    # {"segments": [], "x": {t10: 1}}: 2047 + its 2 string keys; below the floor, so it reads
    snap = b"\x80\x04}(\x8c\x08segments]\x8c\x01x}" + _tuple_chain(10)[2:] + b"h\x0aK\x01su."
    assert _hash_work(snap, 1 << 40) == 2 + 2**11 - 1 < MIN_HASH_LIMIT
    assert pickle.loads(snap) == {"segments": [], "x": {pickle.loads(_tuple_chain(10) + b"h\x0a."): 1}}
    path = tmp_path / "small.pickle"
    path.write_bytes(snap)
    assert read_memory_snapshot(path).segments == []


def test_corpus_snapshot_hashes_far_below_the_limit(snapshot_path, raw):
    """The corpus pickle (string keys, a few small tuples) passes the pre-scan with a wide margin.
    Independent count: the plainly unpickled object graph (`raw`), each distinct dict once (it was
    built once), each of its keys at its hashing cost (str 1, tuple 1 + its items', int 1 + its
    60-bit digits beyond the first)."""
    from rankscope.ingest.safe_pickle import MAX_HASH_PER_BYTE, _hash_work

    def cost(key) -> int:
        if isinstance(key, tuple):
            return 1 + sum(cost(k) for k in key)
        return 1 + (key.bit_length() // 60 if isinstance(key, int) else 0)

    seen, todo, expected = set(), [raw], 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or not isinstance(obj, (dict, list, tuple)):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            expected += sum(cost(k) for k in obj)
            todo += list(obj.values())
        else:
            todo += list(obj)
    data = snapshot_path.read_bytes()
    assert _hash_work(data, 1 << 40) == expected
    assert expected < len(data) < MAX_HASH_PER_BYTE * len(data)
    assert read_memory_snapshot(snapshot_path).segments
