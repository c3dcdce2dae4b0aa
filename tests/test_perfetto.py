"""`rankscope export perfetto`: the merged Chrome-trace timeline (render/perfetto.py, analyses/rank/timeline.py).

Independent sources: the output is read back with plain `json` and checked against the Chrome Trace
Event Format (the phases and the fields each requires; X slices properly nested per thread, checked
with a stack walk written here); per-rank device-event counts and timestamps come from a plain `json`
read of the input traces; clock offsets from the synthetic generator's ground truth
(`ground_truth.json`); the straggler and the data-loading stalls from the corpus MANIFEST (rank 2 of
cpu-gloo-4rank-straggler sleeps 40 ms each step; kineto-resnet50-workers0 loads data on the main
thread); nesting of hand-made intervals from a brute-force pairwise check.
"""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import (DLRM, assert_no_traceback, copy_files, corpus_files, load_json, run_cli, shared_cache_dir,
                      x_events)
from rankscope.analyses.rank.timeline import is_laminar, nest_lanes
from rankscope.api import export_perfetto

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
META_NAMES = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


# ----------------------------------------------------------------------------------------------
# reading the output back, and the format rules
def read_output(path: Path) -> dict:
    data = path.read_bytes()
    text = gzip.decompress(data) if path.name.endswith(".gz") else data
    return json.loads(text, parse_float=Decimal)          # exact decimals: ns precision kept


def ns(x) -> int:
    """A µs value of the output as integer ns (exact: read as Decimal)."""
    return int(Decimal(x) * 1000)


def is_number(v) -> bool:
    return isinstance(v, (int, float, Decimal)) and not isinstance(v, bool)


def check_chrome_format(doc: dict) -> None:
    """Every event has an allowed phase and the fields it requires (Trace Event Format:
    X: name, ts, dur >= 0, pid, tid; C: name, ts, pid, numeric args; M: name + args)."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    for e in doc["traceEvents"]:
        ph = e["ph"]
        assert ph in {"X", "C", "M"}, e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str), e
        if ph == "X":
            assert isinstance(e["tid"], int) and isinstance(e["cat"], str), e
            assert is_number(e["ts"]) and is_number(e["dur"]) and e["dur"] >= 0, e
            assert isinstance(e["args"], dict), e
        elif ph == "C":
            assert is_number(e["ts"]) and e["args"] and all(is_number(v) for v in e["args"].values()), e
        else:
            assert e["name"] in META_NAMES, e
            if e["name"].endswith("_name"):
                assert isinstance(e["args"]["name"], str) and e["args"]["name"], e
            else:
                assert isinstance(e["args"]["sort_index"], int), e
            if e["name"].startswith("thread_"):
                assert isinstance(e["tid"], int), e


def check_ids(doc: dict) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    """One process name per pid, one thread name per (pid, tid), each tid in one process only,
    every slice on a named thread. Returns (process names, thread names)."""
    procs, threads, tid_pid = {}, {}, {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            assert e["pid"] not in procs, f"pid {e['pid']} named twice"
            procs[e["pid"]] = e["args"]["name"]
        elif e["ph"] == "M" and e["name"] == "thread_name":
            key = (e["pid"], e["tid"])
            assert key not in threads, f"thread {key} named twice"
            threads[key] = e["args"]["name"]
            assert tid_pid.setdefault(e["tid"], e["pid"]) == e["pid"], f"tid {e['tid']} in two processes"
    for e in doc["traceEvents"]:
        if e["ph"] in ("X", "C"):
            assert e["pid"] in procs
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in threads, e
    return procs, threads


def partial_overlaps(slices: list[tuple[int, int]]) -> list[tuple]:
    """Slices of one thread that neither nest in nor stay clear of an open one (stack walk)."""
    bad, stack = [], []
    for s, e in sorted(slices, key=lambda x: (x[0], -x[1])):
        while stack and stack[-1][1] <= s:
            stack.pop()
        if stack and e > stack[-1][1]:
            bad.append((stack[-1], (s, e)))
        stack.append((s, e))
    return bad


def slices_by_thread(doc: dict) -> dict[tuple[int, int], list[tuple[int, int]]]:
    out = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            out[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
    return out


def track_events(doc: dict, label: str) -> list[dict]:
    """X events on the thread(s) whose name is `label` (e.g. 'rank 2 / straggler waits')."""
    _, threads = check_ids(doc)
    keys = {k for k, name in threads.items() if name == label}
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and (e["pid"], e["tid"]) in keys]


def input_rank(path: Path) -> int:
    return int(load_json(path)["distributedInfo"]["rank"])


# ----------------------------------------------------------------------------------------------
# exports, once per module
def _export(folder: Path | list, out: Path) -> tuple[dict, object]:
    result = export_perfetto(folder if isinstance(folder, list) else [folder], out, cache_dir=shared_cache_dir())
    return read_output(out), result


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("perfetto")


@pytest.fixture(scope="module")
def dlrm(corpus, out_dir):
    return _export(corpus / DLRM, out_dir / "dlrm.json.gz")


@pytest.fixture(scope="module")
def clock_job(out_dir):
    """4 synthetic ranks, rank 2's clock 5 ms ahead (the generator's ground truth says so)."""
    from rankscope.synth import generate_job, parse_injection
    job = out_dir / "clock-job"
    generate_job(job, ranks=4, steps=3, seed=1, injections=[parse_injection("clock_offset:rank=2,offset_ms=5")])
    doc, _ = _export(job, out_dir / "clock.json")
    return job, doc


# ----------------------------------------------------------------------------------------------
def test_dlrm_output_follows_the_chrome_trace_format(dlrm):
    doc, result = dlrm
    check_chrome_format(doc)
    procs, threads = check_ids(doc)
    assert procs == {r: f"rank {r}" for r in range(8)}            # 8 ranks (distributedInfo), once each
    sort_index = {e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"]
                  if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert sort_index == {r: r for r in range(8)}
    assert all(name.startswith(f"rank {pid} / ") for (pid, _), name in threads.items())
    assert result.ranks == list(range(8)) and result.events == len(doc["traceEvents"])
    assert doc["rankscope"]["schema"] == "rankscope.perfetto/1"


def test_dlrm_slices_are_properly_nested_on_every_thread(dlrm):
    doc, _ = dlrm
    for key, slices in slices_by_thread(doc).items():
        assert partial_overlaps(slices) == [], f"partial overlap on {key}"


def test_device_events_per_rank_match_the_input(corpus, dlrm):
    """Kernels + gpu_memcpy + gpu_memset ('X') per rank, counted in each input file with plain json."""
    doc, _ = dlrm
    expected = {input_rank(f): sum(e.get("cat") in DEVICE_CATS for e in x_events(load_json(f)))
                for f in corpus_files(corpus, DLRM)}
    got = defaultdict(int)
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["cat"] in DEVICE_CATS:
            got[e["pid"]] += 1
    assert dict(got) == expected
    assert all(n > 200 for n in expected.values())                 # MANIFEST: ~250 kernels per rank


def test_threads_and_streams_are_named_after_the_input(corpus, dlrm):
    doc, _ = dlrm
    _, threads = check_ids(doc)
    f = next(f for f in corpus_files(corpus, DLRM) if input_rank(f) == 3)
    raw = x_events(load_json(f))
    streams = {e["args"]["stream"] for e in raw if e.get("cat") == "kernel"}
    names = set(threads.values())
    assert {f"rank 3 / stream {s}" for s in streams} <= names
    main = [n for n in names if n.startswith("rank 3 / thread") and n.endswith("(main)")]
    step_tid = next(e["tid"] for e in raw if e["name"].startswith("ProfilerStep#"))
    assert main == [f"rank 3 / thread {step_tid} (main)"]         # the thread with the step marks


def test_timestamps_start_at_the_origin_and_keep_ns(corpus, dlrm):
    """Earliest slice at 0; every slice of rank 0 = its input ts (plain json, µs) - origin (no offset
    applied on this set: the ranks share a clock within noise)."""
    doc, _ = dlrm
    meta = doc["rankscope"]
    assert min(ns(e["ts"]) for e in doc["traceEvents"] if e["ph"] == "X") == 0
    f = next(f for f in corpus_files(corpus, DLRM) if input_rank(f) == 0)
    raw = sorted(ns(e["ts"]) for e in x_events(load_json(f, exact=True)) if e.get("cat") in DEVICE_CATS)
    out = sorted(ns(e["ts"]) for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 0 and e["cat"] in DEVICE_CATS)
    assert [r - meta["origin_ns"] for r in raw] == out


def test_clock_offsets_are_applied(clock_job):
    """Ground truth: rank 2's clock is 5 ms ahead. Output minus input time is one constant per rank;
    rank 2's differs from the others' by 5 ms; collectives (n-th NCCL kernel on each rank) then end
    together, while in the input rank 2's end 5 ms later."""
    job, doc = clock_job
    truth = json.loads((job / "ground_truth.json").read_text())
    assert truth["expected"]["clock_offsets_ms"] == {"2": 5.0}
    shift, ends_in, ends_out = {}, {}, {}
    for f in sorted(job.glob("*.pt.trace.json.gz")):
        r = input_rank(f)
        raw = sorted((e for e in x_events(load_json(f, exact=True)) if e.get("cat") == "kernel"),
                     key=lambda e: Decimal(e["ts"]))
        out = sorted((e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == r and e["cat"] == "kernel"),
                     key=lambda e: e["ts"])
        assert [e["name"] for e in raw] == [e["name"] for e in out]
        diffs = {ns(a["ts"]) - ns(b["ts"]) for a, b in zip(raw, out)}
        assert len(diffs) == 1, f"rank {r}: not one constant shift"
        shift[r] = diffs.pop()
        ends_in[r] = [ns(e["ts"]) + ns(e["dur"]) for e in raw if "nccl" in e["name"].lower()]
        ends_out[r] = [ns(e["ts"]) + ns(e["dur"]) for e in out if "nccl" in e["name"].lower()]
    assert abs((shift[2] - shift[0]) - 5_000_000) < 10_000          # 5 ms, within 10 µs
    assert shift[1] == shift[0] == shift[3]                         # no offset applied to the others
    spread_in = np.ptp(np.array([ends_in[r] for r in sorted(ends_in)]), axis=0)
    spread_out = np.ptp(np.array([ends_out[r] for r in sorted(ends_out)]), axis=0)
    assert spread_in.min() > 4_900_000
    assert spread_out.max() < 10_000
    applied = {r["rank"]: r["clock_offset_ns"] for r in doc["rankscope"]["ranks"]}
    assert applied[2] == shift[2] - shift[0] and applied[0] == 0
    # straggler waits are on the same clock: each starts where one of the rank's NCCL kernels starts
    for r in range(4):
        starts = {ns(e["ts"]) for e in doc["traceEvents"]
                  if e["ph"] == "X" and e["pid"] == r and e["cat"] == "kernel" and "nccl" in e["name"].lower()}
        waits = track_events(doc, f"rank {r} / straggler waits")
        assert waits and all(ns(w["ts"]) in starts for w in waits)


def test_straggler_waits_on_the_ranks_that_wait(corpus, out_dir):
    """MANIFEST: rank 2 sleeps 40 ms each step; ranks 0, 1, 3 wait for it in the collectives."""
    doc, _ = _export(corpus / "cpu-gloo-4rank-straggler", out_dir / "gloo.json.gz")
    check_chrome_format(doc)
    for r in (0, 1, 3):
        waits = track_events(doc, f"rank {r} / straggler waits")
        assert waits, f"rank {r} has no straggler waits"
        assert all(e["args"]["last_rank"] == 2 and e["name"] == "wait for rank 2" for e in waits)
        assert max(e["dur"] for e in waits) > 30_000                 # the 40 ms sleep, in µs
    assert track_events(doc, "rank 2 / straggler waits") == []
    for key, slices in slices_by_thread(doc).items():
        assert partial_overlaps(slices) == [], f"partial overlap on {key}"


def test_idle_gaps_labelled_dataloader(corpus, out_dir):
    """kineto-resnet50-workers0 loads data on the main thread: some device idle gaps are labelled
    dataloader, and each of those is mostly covered by the input's DataLoader __next__ spans
    (plain json)."""
    doc, _ = _export(corpus / "kineto-resnet50-workers0", out_dir / "resnet.json.gz")
    check_chrome_format(doc)
    gaps = track_events(doc, "rank 0 / idle gaps")
    loader = [g for g in gaps if g["args"]["host_activity"] == "dataloader"]
    assert loader and all(g["name"] == "idle: dataloader" for g in loader)
    f = corpus_files(corpus, "kineto-resnet50-workers0")[0]
    spans = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in x_events(load_json(f, exact=True))
             if e["name"].startswith("enumerate(DataLoader)") and "__next__" in e["name"]]
    origin = doc["rankscope"]["origin_ns"]
    for g in loader:
        a, b = ns(g["ts"]) + origin, ns(g["ts"]) + ns(g["dur"]) + origin
        covered = sum(max(0, min(b, e) - max(a, s)) for s, e in spans)
        assert covered >= 0.5 * (b - a)
    counters = {e["name"] for e in doc["traceEvents"] if e["ph"] == "C"}
    assert {"memory cuda:0", "stream 7 queue"} <= counters


def test_overlays_and_counters_on_dlrm(corpus, dlrm):
    """Steps = the input's ProfilerStep#N marks; exposed communication never overlaps a compute
    kernel and lies under NCCL kernels (kernel names and times from the output itself)."""
    doc, _ = dlrm
    for r in range(8):
        steps = track_events(doc, f"rank {r} / steps")
        f = next(f for f in corpus_files(corpus, DLRM) if input_rank(f) == r)
        marks = {e["name"].split("#")[1] for e in x_events(load_json(f)) if e["name"].startswith("ProfilerStep#")}
        assert sorted(e["name"] for e in steps) == sorted(f"step {m}" for m in marks)
        kernels = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == r and e["cat"] == "kernel"]
        comp = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in kernels if "nccl" not in e["name"].lower()]
        comm = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in kernels if "nccl" in e["name"].lower()]
        exposed = track_events(doc, f"rank {r} / exposed comm")
        assert exposed
        for e in exposed:
            a, b = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
            assert all(min(b, t) <= max(a, s) for s, t in comp)
            assert sum(max(0, min(b, t) - max(a, s)) for s, t in comm) >= b - a
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "C"}
    assert any(n.endswith(" queue") for n in names) and "Memcpy HtoD" in names


def test_partially_overlapping_kernels_move_to_an_overlap_track(corpus, out_dir):
    """hta-negative-queue has kernels on one stream that overlap partially: they go to a
    '(overlap)' track, every thread nests properly, and no device event is lost."""
    doc, result = _export(corpus / "hta-negative-queue", out_dir / "negq.json")
    check_chrome_format(doc)
    _, threads = check_ids(doc)
    assert any(name.endswith("(overlap)") for name in threads.values())
    for key, slices in slices_by_thread(doc).items():
        assert partial_overlaps(slices) == [], f"partial overlap on {key}"
    f = corpus_files(corpus, "hta-negative-queue")[0]
    expected = sum(e.get("cat") in DEVICE_CATS for e in x_events(load_json(f)))
    assert sum(e["ph"] == "X" and e["cat"] in DEVICE_CATS for e in doc["traceEvents"]) == expected
    assert doc["rankscope"]["ranks"][0]["moved_to_overlap_tracks"] >= 1
    assert (out_dir / "negq.json").read_bytes()[:1] == b"{"            # no .gz: plain JSON


#: Corpus sets of other shapes: ROCm, CPU only, no GPU events, no steps, cross-stream syncs, Triton,
#: symmetric-memory kernels with GPU annotations, sampled ranks of a large job.
ODD_SETS = ["hta-amd-mi250", "hta-cpu-only", "hta-rank-non-gpu", "hta-critical-path-alexnet",
            "hta-cuda-event-sync-multistream", "hta-triton", "tracelens-b200-rank0", "hta-sampled-2rank"]


@pytest.mark.parametrize("folder", ODD_SETS)
def test_other_trace_shapes_export_validly(corpus, out_dir, folder):
    """Format, ids and nesting hold, and the device events of each file (plain json: kernel / memcpy /
    memset 'X' events, current or 2021 category names) are all there."""
    doc, result = _export(corpus / folder, out_dir / f"{folder}.json.gz")
    assert result.ranks and not result.skipped
    check_chrome_format(doc)
    check_ids(doc)
    for key, slices in slices_by_thread(doc).items():
        assert partial_overlaps(slices) == [], f"partial overlap on {key}"
    cats = DEVICE_CATS | {"memcpy", "memset"}
    expected = sum(str(e.get("cat", "")).lower() in cats for f in sorted((corpus / folder).glob("*.json.gz"))
                   for e in x_events(load_json(f)))
    assert sum(e["ph"] == "X" and e["cat"] in DEVICE_CATS for e in doc["traceEvents"]) == expected


# ----------------------------------------------------------------------------------------------
# nesting of hand-made intervals
def brute_force_laminar(iv: list[tuple[int, int]]) -> bool:
    for i, (a, b) in enumerate(iv):
        for c, d in iv[i + 1:]:
            disjoint = b <= c or d <= a
            nested = (a <= c and d <= b) or (c <= a and b <= d)
            if not (disjoint or nested):
                return False
    return True


def test_nest_lanes_by_hand():
    # [0,10) holds [2,5); [4,8) crosses [2,5): own lane; [10,12) touches [0,10): fine
    s = np.array([0, 2, 4, 10])
    e = np.array([10, 5, 8, 12])
    assert not is_laminar(s, e)
    lane, end = nest_lanes(s, e)
    assert lane.tolist() == [0, 0, 1, 0] and end.tolist() == e.tolist()
    # beyond the last lane a slice is clipped to its parent: 3 crossing slices, 2 lanes
    lane, end = nest_lanes(np.array([0, 5, 7]), np.array([10, 15, 20]), max_lanes=2)
    assert lane.tolist() == [0, 1, 1] and end.tolist() == [10, 15, 15]
    assert is_laminar(np.array([0, 0, 5, 5]), np.array([10, 10, 5, 10]))   # equal and empty intervals


intervals = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 15)), min_size=0, max_size=25)


@settings(max_examples=300, deadline=None)
@given(intervals)
def test_is_laminar_agrees_with_brute_force(raw):
    iv = [(a, a + d) for a, d in raw]
    s = np.array([a for a, _ in iv], dtype=np.int64)
    e = np.array([b for _, b in iv], dtype=np.int64)
    assert is_laminar(s, e) == brute_force_laminar(iv)
    lane, end = nest_lanes(s, e)
    assert (end >= s).all() and (end <= e).all()
    for k in set(lane.tolist()):
        assert brute_force_laminar([(int(a), int(b)) for a, b, l in zip(s, end, lane) if l == k])


# ----------------------------------------------------------------------------------------------
def test_cli_bad_file_is_one_line_and_others_are_exported(corpus, tmp_path):
    job = tmp_path / "job"
    copy_files(corpus_files(corpus, "cpu-gloo-4rank-straggler"), job)
    bad = job / "rank9.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": ')            # cut before any complete event
    out = tmp_path / "job.json.gz"
    proc = run_cli(["export", "perfetto", job, "-o", out, "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 1
    bad_lines = [line for line in proc.stderr.splitlines() if bad.name in line]
    assert len(bad_lines) == 1 and bad_lines[0].startswith("rankscope: ")
    assert proc.stdout.startswith(f"wrote 4 ranks, ") and "https://ui.perfetto.dev" in proc.stdout
    doc = read_output(out)
    check_chrome_format(doc)
    assert check_ids(doc)[0] == {r: f"rank {r}" for r in range(4)}
    assert doc["rankscope"]["skipped"] and bad.name in doc["rankscope"]["skipped"][0]


def test_cli_nothing_usable_writes_nothing(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rank0.pt.trace.json").write_text("not json")
    out = tmp_path / "x.json"
    proc = run_cli(["export", "perfetto", tmp_path / "in", "-o", out, "--no-cache"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2 and not out.exists() and not list(tmp_path.glob("x.json*"))


def test_no_cache_export_parses_each_file_once(corpus, tmp_path, monkeypatch):
    """--no-cache: a scratch cache lives for the export only, so the analysis' parse serves the
    export too (hand count: one parse per rank file), and the user's cache stays empty."""
    import rankscope.pipelines.job as job
    import rankscope.ingest as ingest
    parsed = []
    real = ingest.read_trace

    def counting(path):
        parsed.append(str(path))
        return real(path)

    monkeypatch.setattr(ingest, "read_trace", counting)
    monkeypatch.setattr(job, "read_trace", counting)
    user_cache = tmp_path / "user-cache"
    monkeypatch.setenv("RANKSCOPE_CACHE_DIR", str(user_cache))
    folder = corpus / "cpu-gloo-4rank-straggler"
    result = export_perfetto([folder], tmp_path / "job.json.gz", use_cache=False)
    assert result.ranks == [0, 1, 2, 3]
    # resolved on both sides: discovery resolves symlinks (a corpus reached through one differs)
    assert sorted(str(Path(p).resolve()) for p in parsed) == sorted(str(p.resolve()) for p in folder.iterdir())
    assert not user_cache.exists() or not any(user_cache.iterdir())
