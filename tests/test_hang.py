"""Hangs and desyncs from Flight Recorder dumps (issue 30; docs/hangs.md).

Real data: tests/data/hangs/ (torch 2.13 CPU gloo jobs with injected faults, made by make_dumps.py:
the expected culprit, group, sequence number, call site and missing dumps are its ground_truth.json,
written from what the script injected and counted) and the corpus' fr-gloo-4rank-late (MANIFEST:
rank 2 never entered collective #11 of the default group). NCCL-style dumps (states scheduled /
started / completed, durations, send / recv, pg_config with ranks) are built here from the format
torch documents (the Flight Recorder tutorial's dump); their expected verdicts follow from how
each is built.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
from rich.console import Console

from conftest import assert_no_traceback, report_json, run_cli
from rankscope.api import analyze
from rankscope.ingest import TraceError
from rankscope.ingest.discover import discover, is_fr_dump
from rankscope.ingest.flight_recorder import read_fr_dump
from rankscope.render.base import render

DATA = Path(__file__).resolve().parent / "data" / "hangs"
CASES = sorted(p.name for p in DATA.iterdir() if (p / "ground_truth.json").exists())


def truth(case: str) -> dict:
    return json.loads((DATA / case / "ground_truth.json").read_text())


def dumps_only(case: str, dest: Path) -> Path:
    """A copy of a case's dumps (no profiler trace, no ground truth)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in (DATA / case).iterdir():
        if is_fr_dump(f):
            shutil.copy(f, dest / f.name)
    return dest


@pytest.fixture(scope="module")
def analyses(tmp_path_factory) -> dict:
    cache = tmp_path_factory.mktemp("cache")
    return {case: analyze(str(DATA / case), cache_dir=cache) for case in CASES}


# ---------------------------------------------------------------------------------------------- real gloo jobs
def test_the_cases_are_there():
    assert set(CASES) >= {"hang-late", "desync-op", "desync-size", "desync-size-json", "mesh-tp-skip", "no-dump",
                          "clean-end"}


@pytest.mark.parametrize("case", CASES)
def test_injected_fault_is_found(analyses, case):
    """Per case, against what make_dumps.py injected: status, culprit(s), the group (its ranks and
    dimension), the sequence number, the missing dumps, the culprit's call site, the finding."""
    t, a = truth(case), analyses[case]
    h = a.hang
    assert h.status == t["status"] and h.culprits == t["culprits"], h.verdict
    assert h.missing_dumps == t["missing_dumps"]
    assert h.ranks_dumped == sorted(set(range(t["world_size"])) - set(t["missing_dumps"]))
    ids = [f.id for f in a.findings if f.id.startswith("collective_")]
    if t["status"] == "none":
        assert h.first is None and h.groups == [] and ids == []
        return
    s = h.first
    assert (s.group_ranks, s.dim, s.seq) == (t["group_ranks"], t["dim"], t["seq"])
    assert ids == [f"collective_{t['status']}"]
    assert next(f for f in a.findings if f.id == ids[0]).ranks == t["culprits"]
    if t["mismatched_field"]:
        assert [(m.rank, m.field) for m in s.mismatched] == [(r, t["mismatched_field"]) for r in t["culprits"]]
    else:
        assert s.not_entered + [r for r in s.no_dump if r in s.culprits] == t["culprits"]
    frames = [(f.rank, Path(f.file).name, f.line) for f in s.culprit_frames]
    if t["culprit_site"] is None or case.endswith("-json"):      # no dump from it; a JSON dump has no frames
        assert frames == []
    else:
        site = t["culprit_site"]
        assert frames == [(t["culprits"][0], site["file"], site["line"])]
        assert f"{site['file']}:{site['line']}" in h.verdict


def test_json_dumps_give_the_pickles_verdict(analyses):
    """desync-size-json holds the JSON dumps the same ranks wrote at the same moment as the pickles of
    desync-size (`_dump_fr_trace_json()`): the same verdict, without Python frames."""
    p, j = analyses["desync-size"].hang, analyses["desync-size-json"].hang
    assert (j.status, j.culprits, j.first.seq, j.first.mismatched, j.missing_dumps) == \
        (p.status, p.culprits, p.first.seq, p.first.mismatched, p.missing_dumps)
    assert read_fr_dump(next((DATA / "desync-size-json").glob("fr_trace_*.json"))).format == "json"


def test_tp_peer_that_skipped_is_the_first_cause_across_groups(analyses):
    """mesh-tp-skip: rank 3 skipped its tp all_reduce and went on to the default group, where it waits
    (with rank 1); its tp peer 2 waits for it, and rank 0 waits in dp for rank 2. Three groups are
    stalled; the first cause is the tp group, and the chain says where each holder is."""
    h = analyses["mesh-tp-skip"].hang
    by_group = {tuple(s.group_ranks): s for s in h.groups}
    assert set(by_group) == {(2, 3), (0, 2), (0, 1, 2, 3)}
    assert h.groups[0] is h.first and h.first.group_ranks == [2, 3]
    assert [(b.rank, b.label) for b in h.first.blockers_where] == [(3, "the default group [0-3]")]
    assert [(b.rank, tuple(by_group[(0, 2)].group_ranks)) for b in by_group[(0, 2)].blockers_where] == [(2, (0, 2))]
    assert by_group[(0, 2)].blockers_where[0].label == "tp group [2-3]"
    states = {tuple(g.group_ranks): g.state for g in h.all_groups}
    assert states == {(0, 1, 2, 3): "stuck", (0, 2): "stuck", (1, 3): "complete", (0, 1): "complete", (2, 3): "stuck"}


def test_corpus_late_rank(corpus, tmp_path):
    """fr-gloo-4rank-late (MANIFEST): rank 2 never entered collective #11 of the default group; ranks
    0, 1, 3 dumped when their all_reduce failed."""
    h = analyze(str(corpus / "fr-gloo-4rank-late"), cache_dir=tmp_path).hang
    assert (h.status, h.culprits, h.first.seq, h.first.group_ranks, h.first.entered) == ("hang", [2], 11, [0, 1, 2, 3],
                                                                                        [0, 1, 3])
    assert h.first.op == "all_reduce" and h.states_recorded is False and h.missing_dumps == []
    assert [w.timeout_ms for w in h.first.waits] == [6000.0] * 3


def test_beside_traces_and_alone_the_same_verdict_exit_1(tmp_path):
    """hang-late holds the job's profiler traces (steps 1-2) beside its dumps: both are analysed, and the
    dumps alone give the same `hang` object. The command exits 1 with one line why, the terminal
    report starts with the verdict and fits 80 columns."""
    both = run_cli(["analyze", DATA / "hang-late", "--json"], tmp_path)
    alone = run_cli(["analyze", dumps_only("hang-late", tmp_path / "alone"), "--json"], tmp_path)
    for proc in (both, alone):
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "rankscope: Flight Recorder dumps: the job stopped (hang): " + json.loads(proc.stdout)["hang"]["verdict"]]
        assert_no_traceback(proc)
    b, a = json.loads(both.stdout), json.loads(alone.stdout)
    assert [r["rank"] for r in b["ranks"]] == [0, 1, 2, 3] and a["ranks"] == []
    for key in ("status", "culprits", "first", "groups", "missing_dumps", "verdict"):
        assert b["hang"][key] == a["hang"][key], key
    # beside the traces: the culprit's profiled steps (#1-2: make_dumps.py's schedule, warmup 1 + active 2)
    (t,) = b["hang"]["culprit_traces"]
    assert (t["rank"], t["steps"], a["hang"]["culprit_traces"]) == (1, [1, 2], [])
    assert t["step_ms_mean"] == pytest.approx(next(r for r in b["ranks"] if r["rank"] == 1)["step_time_ms"]["mean"], abs=1e-3)
    assert t["straggler"] == (1 in [st["rank"] for st in b["stragglers"]])
    term = run_cli(["analyze", tmp_path / "alone"], tmp_path, env={"COLUMNS": "80"})
    lines = term.stdout.splitlines()
    assert lines[0].startswith("Job stopped (hang): rank 1 never entered all_reduce #7 of the default group")
    assert max(map(len, lines)) <= 80


def test_clean_end_exit_0(tmp_path):
    proc = run_cli(["analyze", DATA / "clean-end"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Flight Recorder: no hang or desync")
    assert "collective_" not in proc.stdout


# ---------------------------------------------------------------------------------------------- bad input
class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _tuple_chain(levels: int) -> bytes:
    """{"version": "2.10", "x": {t(n): 1}} where t(0) = () and t(i+1) = (t(i), t(i)), by hand: the key
    t(n) is 2**(n+1) - 1 tuples, hashed whole when the inner dict is built (pickle opcodes: PROTO,
    EMPTY_DICT, MARK, two strings, the key "x", the chain (each level: BINGET, DUP, TUPLE2, MEMOIZE,
    POP), EMPTY_DICT, BINGET, BININT1, SETITEM, SETITEMS, STOP)."""
    out = bytearray(b"\x80\x04}(\x8c\x07version\x8c\x042.10\x8c\x01x)\x940")
    for i in range(levels):
        out += b"h%c2\x86\x940" % i
    return bytes(out) + b"}h%cK\x01su." % levels


def _shared_sizes() -> bytes:
    """A dump whose 20,000 entries are one entry dict, whose input sizes are one list of 1,000
    references to one list of 1,000 ints: ~6 kB of pickle, 2e10 size values to walk."""
    inner = list(range(1000))
    entry = {"record_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1, "p2p_seq_id": 0,
             "profiling_name": "gloo:all_reduce", "time_created_ns": 1, "input_sizes": [inner] * 1000}
    return pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [entry] * 20_000})


HOSTILE = {
    "calls_os_system": lambda tmp: pickle.dumps({"version": "2.10", "entries": [], "x": _Exploit(tmp / "PWNED")}),
    "imports_a_module": lambda tmp: b"\x80\x02}(X\x07\x00\x00\x00versionq\x00cthis\nd\nq\x01u.",
    "hash_bomb": lambda tmp: _tuple_chain(60),
    "shared_sizes": lambda tmp: _shared_sizes(),
    "truncated": lambda tmp: (DATA / "hang-late" / "nccl_trace_rank_2").read_bytes()[:1000],
    "truncated_json": lambda tmp: b'{"comm_lib_version":"","entries":[{"collective_seq_id":1,"input',
    "not_a_dump": lambda tmp: pickle.dumps({"version": "2.10", "pg_config": {}}),
    # EXT1 code 1 as a dict value (past find_class where the extension is cached: test_safe_pickle.py)
    "ext_opcode": lambda tmp: b"\x80\x02}(X\x07\x00\x00\x00versionq\x00\x82\x01u.",
    # {"version": EMPTY_DICT stored at memo index 2**20} (the unpickler would clear 2**21 slots first)
    "memo_index": lambda tmp: b"\x80\x02}X\x07\x00\x00\x00version}r\x00\x00\x10\x00s.",
}
PROBLEMS = {"calls_os_system": "unsafe pickle, not loaded: it names the global (posix|os).system",
            "imports_a_module": "unsafe pickle, not loaded: it names the global this.d",
            "hash_bomb": r"Flight Recorder dump: its dict keys or set members \(built from shared references",
            "shared_sizes": "Flight Recorder dump: its shared references repeat entries, frames and sizes beyond",
            "truncated": "truncated or damaged pickle", "truncated_json": "truncated or damaged JSON",
            "not_a_dump": "a dict without 'entries': not a Flight Recorder dump",
            "ext_opcode": "unsafe pickle, not loaded: it names an entry of the copyreg extension registry",
            "memo_index": "unsafe pickle, not loaded: it stores an object at a memo index beyond"}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_bad_dump_one_line_and_the_other_ranks_analysed(tmp_path, kind):
    """hang-late with rank 2's dump replaced: one stderr line naming it, nothing it names is run or
    imported, and the verdict from ranks 0, 1, 3 still names rank 1 (rank 2: no dump)."""
    import re
    job = dumps_only("hang-late", tmp_path / "job")
    bad = job / ("nccl_trace_rank_2" if kind != "truncated_json" else "nccl_trace_rank_2.json")
    (job / "nccl_trace_rank_2").unlink()
    bad.write_bytes(HOSTILE[kind](tmp_path))
    assert "this" not in sys.modules
    with pytest.raises(TraceError, match=PROBLEMS[kind]):
        read_fr_dump(bad)
    assert "this" not in sys.modules and not (tmp_path / "PWNED").exists()
    proc = run_cli(["analyze", job, "--json"], tmp_path, timeout=60)
    assert not (tmp_path / "PWNED").exists()
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and re.match(rf"rankscope: {re.escape(str(bad))}: {PROBLEMS[kind]}", lines[0]), lines
    h = json.loads(proc.stdout)["hang"]
    assert (h["status"], h["culprits"], h["ranks_dumped"], h["missing_dumps"]) == ("hang", [1], [0, 1, 3], [2])
    assert_no_traceback(proc)


def test_a_dump_from_another_job_is_named_and_left_out(corpus, tmp_path):
    """hang-late's rank 3 replaced by the corpus job's rank 3 (made hours apart): named as another
    job's, and the verdict over ranks 0-2 still names rank 1."""
    job = dumps_only("hang-late", tmp_path / "job")
    (job / "nccl_trace_rank_3").unlink()
    shutil.copy(corpus / "fr-gloo-4rank-late" / "rank_3", job / "rank_3")
    a = analyze(str(job), cache_dir=tmp_path / "cache")
    (p,) = [p for p in a.problems if p.fatal]
    assert p.file == str(job / "rank_3") and p.problem.startswith("looks like another job's Flight Recorder dump: "
                                                                   "its collectives were created")
    assert " h before the same collectives on the other ranks" in p.problem
    assert (a.hang.ranks_dumped, a.hang.missing_dumps, a.hang.culprits) == ([0, 1, 2], [3], [1])


def test_two_dumps_of_one_rank_and_a_fifo(tmp_path):
    """A second dump of rank 0 (as JSON) is skipped with a line; a FIFO named like a dump is never
    opened (the analysis does not wait on it)."""
    job = dumps_only("clean-end", tmp_path / "job")
    shutil.copy(DATA / "desync-size-json" / "fr_trace_0.json", job / "zz_rank_0.json")
    os.mkfifo(job / "rank_9")
    a = analyze(str(job), cache_dir=tmp_path / "cache")
    assert [(Path(p.file).name, p.problem.split(" (")[0]) for p in a.problems] == [
        ("zz_rank_0.json", "a second Flight Recorder dump of rank 0")]
    assert a.hang.status == "none" and a.hang.ranks_dumped == [0, 1, 2, 3]


def test_discovery_sets_dumps_aside(tmp_path):
    """hang-late: 4 traces and 4 dumps; ground_truth.json is neither. A Kineto trace named like a dump
    (rank_5.json) stays a trace."""
    found = discover([DATA / "hang-late"])
    assert sorted(p.name for p in found.fr_dumps) == [f"nccl_trace_rank_{r}" for r in range(4)]
    assert len(found.traces) == 4 and all(p.name.endswith(".pt.trace.json.gz") for p in found.traces)
    assert found.ignored == []
    import gzip
    trace = tmp_path / "rank_5.json"
    trace.write_bytes(gzip.decompress(next((DATA / "hang-late").glob("rank0.*.gz")).read_bytes()))
    assert not is_fr_dump(trace) and discover([trace]).traces == [trace.resolve()]


# ---------------------------------------------------------------------------------------------- NCCL-style dumps
T0 = 1_700_000_000_000_000_000
FRAMES = [{"name": "all_reduce", "filename": "/site-packages/torch/distributed/distributed_c10d.py", "line": 2696},
          {"name": "train_step", "filename": "/job/train.py", "line": 42}]


def entry(record_id: int, seq: int, state: str = "completed", op: str = "all_reduce", pg=("0", "default_pg"),
          sizes=((1024,),), dtype: str = "Float", p2p_seq: int = 0, detail: str = "", t_ms: float | None = None) -> dict:
    """One entry as the tutorial's dump shows it (NCCL: started / completed times, duration)."""
    created = T0 + int((record_id if t_ms is None else t_ms) * 1e6)
    is_p2p = op in ("send", "recv")
    return {"record_id": record_id, "pg_id": 0, "process_group": pg, "collective_seq_id": 0 if is_p2p else seq,
            "p2p_seq_id": seq if is_p2p else p2p_seq, "op_id": record_id + 1,
            "profiling_name": f"nccl:{op}" + (f" {detail}" if detail else ""), "time_created_ns": created,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": [dtype], "output_sizes": [list(s) for s in sizes],
            "output_dtypes": [dtype], "state": state,
            "time_discovered_started_ns": created + 1000 if state != "scheduled" else None,
            "time_discovered_completed_ns": created + 50_000 if state == "completed" else None,
            "duration_ms": 0.05 if state == "completed" else None, "retired": state == "completed",
            "timeout_ms": 600_000, "is_p2p": is_p2p, "frames": FRAMES}


def nccl_job(folder: Path, entries: dict[int, list[dict]], config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    world = max(entries) + 1
    config = config or {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    for rank, es in entries.items():
        dump = {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": es, "comm_lib_version": "2.21.5"}
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))
    return folder


def hang_of(folder: Path, tmp_path: Path):
    return analyze(str(folder), cache_dir=tmp_path / "cache")


def test_nccl_a_rank_whose_device_never_started_it(tmp_path):
    """seq 1-5 completed everywhere; seq 6 started on ranks 0, 1, 3, only scheduled on rank 2."""
    job = nccl_job(tmp_path / "j", {r: [entry(i, i + 1) for i in range(5)]
                                    + [entry(5, 6, "scheduled" if r == 2 else "started")] for r in range(4)})
    a = hang_of(job, tmp_path)
    h = a.hang
    assert (h.status, h.culprits, h.first.seq, h.first.entered, h.states_recorded) == ("hang", [2], 6, [0, 1, 2, 3], True)
    assert "never started all_reduce #6" in h.verdict
    assert [w.state for w in h.first.waits] == ["started"] * 3
    assert "nvidia-smi" in next(f for f in a.findings if f.id == "collective_hang").fix
    grid = {g.rank: g.states for g in h.all_groups[0].grid}
    assert grid[2][-1] == "entered" and grid[0][-1] == "started" and grid[0][-2] == "completed"


def test_nccl_every_member_started_none_completed_is_unknown(tmp_path):
    job = nccl_job(tmp_path / "j", {r: [entry(0, 1), entry(1, 2, "started")] for r in range(4)})
    h = hang_of(job, tmp_path).hang
    assert (h.status, h.culprits, h.first.seq) == ("unknown", [], 2)


def test_nccl_completion_proves_a_missing_rank_entered(tmp_path):
    """Rank 3 left no dump, but every other member completed every collective: a completed collective
    had every member in it, so there is no stall; the missing dump is named."""
    job = nccl_job(tmp_path / "j", {r: [entry(i, i + 1) for i in range(6)] for r in range(3)},
                   config={"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}})
    h = hang_of(job, tmp_path).hang
    assert (h.status, h.missing_dumps, h.world_size) == ("none", [3], 4)
    assert h.unknown.startswith("rank 3 left no dump")


def test_nccl_dtype_desync(tmp_path):
    job = nccl_job(tmp_path / "j", {r: [entry(0, 1), entry(1, 2, "started", dtype="BFloat16" if r == 1 else "Float")]
                                    for r in range(4)})
    h = hang_of(job, tmp_path).hang
    assert (h.status, h.culprits) == ("desync", [1])
    assert [(m.field, m.value, m.expected) for m in h.first.mismatched] == [("dtype", "[BFloat16]", "[Float]")]
    assert [(f.rank, f.file, f.line) for f in h.first.culprit_frames] == [(1, "/job/train.py", 42)]


def test_nccl_send_recv_of_a_pipeline_pair(tmp_path):
    """Group "5" (mesh_pp, ranks [0, 1]): rank 0's third send started, rank 1 posted two recvs only."""
    pp = ("5", "mesh_pp")
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
              "5": {"name": "5", "desc": "mesh_pp", "ranks": "[0, 1]"}}
    job = nccl_job(tmp_path / "j", {
        0: [entry(0, 1, op="send", pg=pp, detail="0->1"), entry(1, 2, op="send", pg=pp, detail="0->1"),
            entry(2, 3, "started", op="send", pg=pp, detail="0->1")],
        1: [entry(0, 1, op="recv", pg=pp, detail="1<-0"), entry(1, 2, op="recv", pg=pp, detail="1<-0")]}, config)
    h = hang_of(job, tmp_path).hang
    s = h.first
    assert (h.status, h.culprits, s.p2p, s.seq, s.group_ranks, s.dim, s.op) == ("hang", [1], True, 3, [0, 1], "pp", "send")


PP = ("5", "mesh_pp")
PP_CONFIG = {"5": {"name": "5", "desc": "mesh_pp", "ranks": "[0, 1, 2, 3]"}}


def pipeline(stops: int | None = None, microbatches: int = 4) -> dict[int, list[dict]]:
    """A 4-stage pipeline (group "5", mesh_pp, ranks 0-3), per microbatch each stage receives from the
    one before and sends to the next, as torch names them ("recv 2<-1", "send 1->2"); each rank's
    p2p_seq_id counts all its p2p ops. With `stops`: rank 2 records nothing from that microbatch on;
    what it never does leaves the others' matching ops started, not completed, and stage 1, stuck
    sending to it, posts nothing after."""
    out = {}
    for r in range(4):
        es: list[dict] = []
        for m in range(1, microbatches + 1):
            for op, peer in (("recv", r - 1), ("send", r + 1)):
                if not 0 <= peer <= 3:
                    continue
                stuck = stops is not None and m >= stops and 2 in (r, peer)
                if stops is not None and (r == 2 and m >= stops or r == 1 and m > stops or r == 0 and m > stops + 1):
                    continue                  # stopped; stage 1 blocked in its send; stage 0 in its next send
                stuck = stuck or (stops is not None and r == 0 and m == stops + 1)
                detail = f"{r}->{peer}" if op == "send" else f"{r}<-{peer}"
                es.append(entry(len(es), len(es) + 1, "started" if stuck else "completed", op=op, pg=PP,
                                detail=detail, t_ms=10 * m + r))
        out[r] = es
    return out


def test_nccl_pipeline_of_four_stages_aligned_per_direction(tmp_path):
    """Rank 2 stops at microbatch 3 (built above): rank 1 waits in its 3rd send to 2, rank 3 in its 3rd
    recv from 2, rank 0 in its 4th send to 1 (rank 1 never posts that recv: it is stuck in the send to
    2). Each rank's p2p_seq_ids count its ops to both neighbours, so only direction by direction do
    they pair. Rank 2 is the culprit; the 0 -> 1 stall is held by rank 1, which waits in 1 -> 2."""
    h = hang_of(nccl_job(tmp_path / "j", pipeline(stops=3), PP_CONFIG), tmp_path).hang
    s = h.first
    assert (h.status, h.culprits, s.dim, s.group_ranks, s.p2p) == ("hang", [2], "pp", [0, 1, 2, 3], True)
    assert ((s.channel.src, s.channel.dst), s.seq, s.entered, s.not_entered) == ((2, 3), 3, [3], [2])
    rows = {(g.channel.src, g.channel.dst): g for g in h.groups}
    assert {k: (g.seq, g.culprits) for k, g in rows.items()} == {(0, 1): (4, [1]), (1, 2): (3, [2]), (2, 3): (3, [2])}
    assert [(b.rank, b.label, b.seq) for b in rows[(0, 1)].blockers_where] == [(1, "pp group [0-3], 1 -> 2", 3)]
    assert s.verdict.startswith("rank 2 never entered recv #3 (p2p) of pp group [0-3], 2 -> 3")


def test_nccl_pipeline_that_ended_and_one_whose_ring_wrapped_no_hang(tmp_path):
    """The same pipeline with no fault: no stall. Then rank 1's ring buffer holds only its last 4 of 8
    p2p ops (p2p_seq_id 5-8): its transfers' numbers one way are unknown, so its directions are not
    aligned (no false hang), and the others still are."""
    entries = pipeline()
    assert hang_of(nccl_job(tmp_path / "a", entries, PP_CONFIG), tmp_path).hang.status == "none"
    entries[1] = entries[1][4:]
    h = hang_of(nccl_job(tmp_path / "b", entries, PP_CONFIG), tmp_path).hang
    assert h.status == "none" and h.groups == []
    assert sorted((g.channel.src, g.channel.dst) for g in h.all_groups if g.channel) == [(2, 3)]


def test_nccl_ring_buffers_that_wrapped_are_aligned_from_the_common_start(tmp_path):
    """Each rank's buffer holds the last entries only (record ids not from 0, different first seqs):
    the sequence numbers are compared from the latest first one (55); rank 2 alone entered #61."""
    starts = {0: 50, 1: 40, 2: 55, 3: 55}
    job = nccl_job(tmp_path / "j", {r: [entry(100 + s, s, t_ms=s) for s in range(first, 61)]
                                    + ([entry(161, 61, "started", t_ms=61)] if r == 2 else [])
                                    for r, first in starts.items()})
    h = hang_of(job, tmp_path).hang
    assert (h.status, h.culprits, h.first.seq, h.first.entered) == ("hang", [0, 1, 3], 61, [2])
    assert h.all_groups[0].grid_seqs == list(range(55, 62))


def test_nccl_chain_across_groups_names_the_first_cause(tmp_path):
    """A 2 x 2 mesh (dp [0, 2], [1, 3]; tp [0, 1], [2, 3]), each step a dp all_reduce then a tp one.
    Rank 3 stopped after step 9 (its last entries completed). Rank 1 waits in dp #11 for rank 3; rank 0
    waits in tp #11 for rank 1, which is stuck in dp; rank 2 waits in tp #11 for rank 3. The first
    cause is rank 3 in dp [1, 3] #11, and the chain says rank 1 is held in dp."""
    groups = {"dp": {0: ("1", "mesh_dp"), 2: ("1", "mesh_dp"), 1: ("2", "mesh_dp"), 3: ("2", "mesh_dp")},
              "tp": {0: ("3", "mesh_tp"), 1: ("3", "mesh_tp"), 2: ("4", "mesh_tp"), 3: ("4", "mesh_tp")}}
    config = {"1": {"name": "1", "desc": "mesh_dp", "ranks": "[0, 2]"}, "2": {"name": "2", "desc": "mesh_dp", "ranks": "[1, 3]"},
              "3": {"name": "3", "desc": "mesh_tp", "ranks": "[0, 1]"}, "4": {"name": "4", "desc": "mesh_tp", "ranks": "[2, 3]"}}
    entries = {}
    for r in range(4):
        es = []
        for step in range(1, 12):
            if r == 3 and step == 11:
                break
            dp_state = "started" if (r == 1 and step == 11) else "completed"
            es.append(entry(2 * step, step, dp_state, pg=groups["dp"][r], t_ms=10 * step))
            if r == 1 and step == 11:
                break
            es.append(entry(2 * step + 1, step, "started" if step == 11 else "completed", pg=groups["tp"][r],
                            t_ms=10 * step + 5))
        entries[r] = es
    h = hang_of(nccl_job(tmp_path / "j", entries, config), tmp_path).hang
    assert (h.status, h.culprits, h.first.group_ranks, h.first.dim, h.first.seq) == ("hang", [3], [1, 3], "dp", 11)
    rows = {tuple(s.group_ranks): s for s in h.groups}
    assert set(rows) == {(1, 3), (0, 1), (2, 3)} and h.groups[0].group_ranks == [1, 3]
    assert [(b.rank, b.label, b.seq) for b in rows[(0, 1)].blockers_where] == [(1, "dp group [1, 3]", 11)]
    assert [(b.rank, b.group) for b in rows[(1, 3)].blockers_where] == [(3, None)]
    assert h.first.verdict.startswith("rank 3 never entered all_reduce #11 of dp group [1, 3] (its last call: train.py:42)")


# ---------------------------------------------------------------------------------------------- outputs
def test_json_validates_against_the_schema(analyses):
    from importlib.resources import files

    import jsonschema
    validator = jsonschema.Draft202012Validator(
        json.loads(files("rankscope").joinpath("schemas/analysis.schema.json").read_text()))
    for case, a in analyses.items():
        d = report_json(a)
        assert list(validator.iter_errors(d)) == [], case
        assert d["hang"]["status"] == truth(case)["status"]
    for path, bad in ((("status",), "stuck"), (("first", "mismatched", 0, "field"), "color"),
                      (("groups", 0, "seq"), "7")):             # the schema is not vacuous: each is refused
        d = report_json(analyses["desync-op"])
        at = d["hang"]
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = bad
        assert list(validator.iter_errors(d)), path


def test_terminal_section_at_80_columns(analyses):
    for case, a in analyses.items():
        console = Console(width=80, record=True, color_system=None)
        render(a, "terminal", console)
        text = console.export_text()
        assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, case
        assert text.splitlines()[0].startswith({"hang": "Job stopped (hang): ", "desync": "Job stopped (desync): ",
                                                "none": "Flight Recorder: no hang"}[truth(case)["status"]])


def test_html_grid_escapes_names(tmp_path):
    """The grid's cells carry each member's state; a group description from the dump is escaped."""
    from rankscope.render.html import render_html
    pg = ("0", "<script>alert(1)</script>")
    job = nccl_job(tmp_path / "j", {r: [entry(0, 1, pg=pg), entry(1, 2, "started", pg=pg)] + ([] if r == 1 else [
        entry(2, 3, "started", pg=pg)]) for r in range(2)}, config={})
    page = render_html(hang_of(job, tmp_path))
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
    assert 'title="rank 1 #3: not entered"' in page and 'title="rank 0 #3: started, not completed"' in page


def test_perfetto_track_per_rank_on_the_traces_clock(tmp_path):
    """hang-late: one Flight Recorder thread per rank, one slice per entry of the dump (counted from the
    plainly unpickled file), and the entries of profiled step 1 (collectives #3 and #4: make_dumps.py
    calls two per step) fall inside that step's ProfilerStep#1 slice of the same rank."""
    out = tmp_path / "job.json"
    proc = run_cli(["export", "perfetto", DATA / "hang-late", "-o", out], tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    names = {e["pid"]: e["tid"] for e in events if e.get("name") == "thread_name"
             and e["args"]["name"].endswith("/ Flight Recorder")}
    assert sorted(names) == [0, 1, 2, 3]
    for rank in range(4):
        raw = pickle.loads((DATA / "hang-late" / f"nccl_trace_rank_{rank}").read_bytes())   # our own test data
        slices = [e for e in events if e.get("cat") == "flight_recorder" and e["pid"] == rank]
        assert len(slices) == len(raw["entries"]) and all(e["tid"] == names[rank] for e in slices)
        (step,) = [e for e in events if e.get("name") == "ProfilerStep#1" and e["pid"] == rank]
        for s in slices:
            if s["name"] in ("all_reduce #3", "all_reduce #4"):
                assert step["ts"] <= s["ts"] <= step["ts"] + step["dur"], (rank, s)
    assert [d["rank"] for d in doc["rankscope"]["flight_recorder"]] == [0, 1, 2, 3]


def test_c_prescan_counts_as_the_python_one(corpus):
    """The pickle pre-scan in C (_picklescan.c) against the Python one (safe_pickle._hash_work, the
    contract): the same count on real pickles (every dump here, the corpus' memory snapshot),
    hand-made hash bombs cut at every 7th byte, ints at the int64 edges as keys, and random
    nested data (tuples, sets, frozensets, dicts, big and negative ints) in every protocol."""
    import random

    from rankscope.ingest import safe_pickle
    if safe_pickle._picklescan is None:
        pytest.skip("C pre-scan not built (no C compiler at install): nothing to compare the Python scan with")
    real = [p.read_bytes() for p in DATA.rglob("*") if p.is_file() and p.read_bytes()[:1] == b"\x80"]
    real += [p.read_bytes() for p in (corpus / "memory-snapshot-1gpu").iterdir() if p.is_file()]
    bomb = _tuple_chain(12)
    samples = real + [bomb[:n] for n in range(0, len(bomb), 7)]
    for v in (0, -1, 127, -128, 2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**200, -2**300):
        samples += [pickle.dumps({v: 1, (v, v): {v}, frozenset([v]): [v]}, protocol=p) for p in range(6)]
    rng = random.Random(30)

    def hashable_value(x) -> bool:
        try:
            hash(x)
            return True
        except TypeError:
            return False

    def value(depth: int):
        kind = rng.randrange(8 if depth < 4 else 3)
        if kind == 0:
            return rng.choice([0, 1, -5, 2**40, -2**70, 3**90])
        if kind == 1:
            return rng.choice(["a", "version", ""])
        if kind == 2:
            return rng.choice([None, True, 1.5])
        items = [value(depth + 1) for _ in range(rng.randrange(4))]
        hashable = [x for x in items if hashable_value(x)]
        return {3: tuple(items), 4: items, 5: frozenset(hashable), 6: set(hashable),
                7: {k: v for k, v in zip(hashable, items)}}[kind]
    for _ in range(300):
        v = value(0)
        shared = (v, v, [v, (v, v)])
        samples.append(pickle.dumps(shared, protocol=rng.randrange(6)))
    for data in samples:
        assert safe_pickle.hash_work(data, 1 << 62) == safe_pickle._hash_work(data, 1 << 62), data[:40]
        assert safe_pickle.hash_work(data, 10) == safe_pickle._hash_work(data, 10)
