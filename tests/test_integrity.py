"""Input integrity (issue 16 C): values that cannot be times are dropped with their event and
counted per file in one line; ranks and world sizes out of range are ignored with a line; files
that cannot be one job are said; a truncated file is marked in its metadata.

Real files: a private copy of the 8-rank param-dlrm job (conftest `dlrm_dir`) with one value of
rank 7 changed. Expected events come from the file read with `json` minus the events the test
changed (a hand count); ranks and world sizes from the files' own distributedInfo.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import (DLRM, assert_no_traceback, complete_events, complete_events_in_prefix, corpus_files, fresh_json,
                      moved_copy, raw_text, run_cli, write_trace, x_events)
from rankscope import api
from rankscope.ingest.consistency import different_jobs
from rankscope.ingest.kineto import read_kineto
from rankscope.model import RankMeta
from rankscope.pipelines.run import analyze_cycles

RANK7 = "worker7_step_12.1694128201553.pt.trace.json.gz"
K = 1000            # the X event (in file order) given a bad value


def _rank7_with(job: Path, edits: dict[int, dict]) -> tuple[Path, list[dict]]:
    """Rank 7 rewritten as plain JSON (json.dumps: NaN / Infinity written as Python does) with
    X event i updated by edits[i]; returns the file and its X events as written."""
    doc = fresh_json(job / RANK7)
    xs = x_events(doc)
    for i, fields in edits.items():
        xs[i].update(fields)
    (job / RANK7).unlink()
    return write_trace(job / RANK7.removesuffix(".gz"), doc), xs


def _read_both(path: Path):
    """The C scanner and the msgspec reference path: identical frames and metadata."""
    fast, _ = read_kineto(path, use_scanner=True)
    ref, _ = read_kineto(path, use_scanner=False)
    assert [n for n, f in fast.frames().items() if not f.equals(ref.frames()[n])] == []
    assert fast.meta.to_dict() == ref.meta.to_dict()
    return fast


BAD_VALUES = {   # id: (field, value, reason)
    "dur-NaN": ("dur", float("nan"), "dur not a number"),
    "dur-Infinity": ("dur", float("inf"), "dur not a number"),
    "dur-string": ("dur", "5", None),                 # a number in a string: taken as the number
    "dur-1e13-us": ("dur", 1e13, "dur over 1 day"),
    "dur-negative": ("dur", -5, "dur negative"),
    "dur-true": ("dur", True, "dur not a number"),
    "ts-string": ("ts", "abc", "ts not a number"),
    "ts--Infinity": ("ts", float("-inf"), "ts not a number"),
    "ts-list": ("ts", [1], "ts not a number"),
    "ts-zero": ("ts", 0, "ts over 1 day away from the other events"),
    "ts-1e300": ("ts", 1e300, "ts out of range"),
}


@pytest.mark.parametrize("case", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_one_bad_value_loses_only_its_event(dlrm_dir: Path, case: str):
    """X#1000 of rank 7 gets the value: that event alone is dropped, under its reason, in one line;
    every other X event is there, in order, with its name and times (json)."""
    field, value, reason = BAD_VALUES[case]
    path, xs = _rank7_with(dlrm_dir, {K: {field: value}})
    trace = _read_both(path)
    kept = xs if reason is None else xs[:K] + xs[K + 1:]
    assert trace.events["name"].cast(str).to_list() == [e["name"] for e in kept]
    assert trace.events["ts_ns"].to_list() == [round(Decimal(str(e["ts"])) * 1000) for e in kept]
    if reason is None:
        assert trace.events["dur_ns"][K] == 5000 and not trace.meta.dropped
        return
    assert trace.meta.dropped == {reason: 1}
    assert trace.meta.problems == [f"1 event dropped: 1 with {reason}"]


def test_two_bad_values_one_line_per_file(dlrm_dir: Path, corpus: Path):
    """A NaN dur and a string ts in one file: two events dropped, one line naming both counts; the
    job's span and findings are those of the file without these two events (json edit)."""
    path, xs = _rank7_with(dlrm_dir, {K: {"dur": float("nan")}, K + 1: {"ts": "abc"}})
    assert b"NaN" in path.read_bytes()
    trace = _read_both(path)
    assert trace.events.height == len(xs) - 2
    assert trace.meta.problems == ["2 events dropped: 1 with ts not a number, 1 with dur not a number"]
    damaged = api.analyze(dlrm_dir, use_cache=False, engine="inprocess")
    assert [str(p) for p in damaged.problems] == [f"{path}: {trace.meta.problems[0]}"]

    doc = fresh_json(corpus_files(corpus, DLRM)[7])
    gone = {id(e) for e in x_events(doc)[K:K + 2]}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if id(e) not in gone]
    write_trace(path, doc)
    clean = api.analyze(dlrm_dir, use_cache=False, engine="inprocess")
    assert clean.job.span_ms == damaged.job.span_ms
    assert [(f.id, f.ranks) for f in clean.findings] == [(f.id, f.ranks) for f in damaged.findings]


def test_dur_of_1e13_us_does_not_stretch_the_job(dlrm_dir: Path):
    """One dur of 1e13 us (115 days) on rank 7: dropped, so the job's span stays that of the 8 real
    ranks (largest rank span from json: max(ts + dur) - min(ts) over each file's X events)."""
    _rank7_with(dlrm_dir, {K: {"dur": 1e13}})
    spans = []
    for f in sorted(dlrm_dir.iterdir()):
        xs = [e for e in x_events(fresh_json(f)) if e["dur"] < 1e12]
        spans.append(max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs))
    result = api.analyze(dlrm_dir, use_cache=False, engine="inprocess")
    assert result.job.span_ms == pytest.approx(max(spans) / 1e3, abs=1e-6)


# ----------------------------------------------------------------------------------------------
# distributedInfo out of range, through the command line without the cache
@pytest.mark.parametrize("key, value, expected_line", [
    ("rank", 10**30, "distributedInfo.rank ~1e30 out of range (0 to 2147483647): ignored, rank from the file name or "
                     "order"),
    ("world_size", 10**12, "distributedInfo.world_size 1000000000000 out of range (1 to 1048576): ignored"),
    ("rank", 9, "distributedInfo.rank 9 not below world_size 8: ignored, rank from the file name or order"),
    ("rank", "7", "distributedInfo.rank '7' is not an integer: ignored, rank from the file name or order"),
    ("rank", float("nan"), "distributedInfo.rank 'NaN' is not an integer: ignored, rank from the file name or order"),
])
def test_distributed_info_out_of_range_is_ignored_with_a_line(dlrm_dir: Path, tmp_path: Path, key: str, value,
                                                              expected_line: str):
    """Rank 7's distributedInfo gets the value: no traceback, every rank analysed (rank 7 from its
    file name, worker7_...), world size 8 (the other files), one warning line naming the file."""
    doc = fresh_json(dlrm_dir / RANK7)
    doc["distributedInfo"][key] = value
    write_trace(dlrm_dir / RANK7, doc)
    proc = run_cli(["analyze", dlrm_dir, "--no-cache", "--json", "-q", "--engine", "inprocess"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout)
    assert out["job"]["ranks"] == list(range(8)) and out["job"]["world_size"] == 8
    assert f"{dlrm_dir / RANK7}: {expected_line}" in proc.stderr


# ----------------------------------------------------------------------------------------------
# Files that cannot be one job
def test_files_of_two_jobs_are_not_merged(corpus: Path, tmp_path: Path):
    """Two ranks of param-dlrm-8rank (world size 8, Sept 2023) and two of hta-sampled-2rank (world
    size 128, April 2023), read from their distributedInfo and timestamps with json: not analysed as
    one job (issue 33). Without a pick the jobs are listed, earliest first, and none is analysed;
    `job=2` analyses the two DLRM ranks alone, with no different-jobs warning."""
    dlrm = corpus_files(corpus, DLRM)[:2]
    sampled = corpus_files(corpus, "hta-sampled-2rank")
    job = tmp_path / "mixed"
    job.mkdir()
    for f in dlrm + sampled:
        (job / f.name).write_bytes(f.read_bytes())
    worlds = [json.loads(raw_text(f))["distributedInfo"]["world_size"] for f in dlrm + sampled]
    assert worlds == [8, 8, 128, 128]
    result = api.analyze(job, use_cache=False, engine="inprocess")
    assert not result.usable
    assert [(j.job, j.world_size, [Path(f).name for f in j.files]) for j in result.jobs] == \
        [(1, 128, [f.name for f in sampled]), (2, 8, [f.name for f in dlrm])]
    assert result.jobs[0].start_utc.startswith(_first_day(sampled))
    assert result.jobs[1].start_utc.startswith(_first_day(dlrm))
    picked = analyze_cycles(job, use_cache=False, engine="inprocess", job=2)
    assert [Path(s.meta.file).name for s in picked.summaries] == [f.name for f in dlrm]
    assert not any(w.startswith("these files look like different jobs") for w in picked.job.warnings)
    assert "the inputs hold 2 jobs: job 2 analysed (--job 2), the files of the others are not" in picked.job.warnings


def test_one_job_recorded_days_apart_is_said(corpus: Path, tmp_path: Path):
    """param-dlrm-8rank's rank 0 beside a copy of itself as rank 1 with every event moved 40 days
    later: the same world size and processes, so one job to ingest/jobs.py (issue 33 splits files of
    other world sizes, or apart in time by other processes, before). Recorded over a day apart, they
    still look like different jobs: one warning counts the days from the first file's end to the
    second's start and lists each file's time range (all read from the file with json). Told they are
    one job (`same_job`), the same ranges are the note that the time ranges do not overlap."""
    (first,) = [f for f in corpus_files(corpus, DLRM) if fresh_json(f)["distributedInfo"]["rank"] == 0]
    job = tmp_path / "job"
    job.mkdir()
    a = job / first.name
    a.write_bytes(first.read_bytes())
    b = moved_copy(first, job / "moved_rank1.pt.trace.json", rank=1, days=40)
    events = x_events(fresh_json(first))
    start, end = min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events)     # µs
    moved = 40 * 86_400 * 10**6
    clock = lambda us: datetime.fromtimestamp(us / 1e6, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    ranges = (f"{clock(start)} to {clock(end)} UTC in {a.name}; "
              f"{clock(start + moved)} to {clock(end + moved)} UTC in {b.name}")
    days = f"{(start + moved - end) / 86_400e6:,.0f}"
    assert days == "40"
    result = api.analyze(job, use_cache=False, engine="inprocess")
    assert result.usable and not result.jobs and [s.rank for s in result.ranks] == [0, 1]
    said = [w for w in result.job.warnings if w.startswith("these files look like different jobs: ")]
    assert said == [f"these files look like different jobs: recorded over a day apart ({days} days): {ranges}"]
    assert "different_jobs" in [i.kind for i in result.job.capture.issues] and result.job.capture.partial
    same = api.analyze(job, use_cache=False, engine="inprocess", same_job=True)
    said = [w for w in same.job.warnings if w.startswith("these files look like different jobs: ")]
    assert said == [f"these files look like different jobs: time ranges that do not overlap: {ranges}"]
    kinds = [i.kind for i in same.job.capture.issues]
    assert "clock_ranges_disjoint" in kinds and "different_jobs" not in kinds


def _first_day(files: list[Path]) -> str:
    """UTC day of the files' first complete event (ts: epoch microseconds in these files)."""
    first = min(e["ts"] for f in files for e in x_events(fresh_json(f)))
    return datetime.fromtimestamp(first / 1e6, timezone.utc).strftime("%Y-%m-%d")


def _meta(name: str, **kw) -> RankMeta:
    return RankMeta(file=f"/job/{name}", rank=-1, rank_source="unknown", format="kineto", **kw)


def test_different_jobs_devices_and_process_groups():
    """Hand-made metadata: device models and a process group's ranks that differ are said; a 3D
    layout whose ranks list different groups of one mesh (cpu-gloo-3d-pp2dp2tp2's shape) is not."""
    a100 = [{"name": "NVIDIA A100"}] * 2
    h100 = [{"name": "NVIDIA H100"}]
    metas = [_meta("a.json", devices=a100), _meta("b.json", devices=a100), _meta("c.json", devices=h100),
             _meta("d.json")]
    assert different_jobs(metas) == ["these files look like different jobs: devices NVIDIA A100 in a.json, b.json; "
                                     "NVIDIA H100 in c.json"]
    tp = [{"pg_name": "0", "pg_size": 4, "ranks": [0, 1, 2, 3]}]
    mesh = [_meta("r0.json", pg_config=tp + [{"pg_name": "9", "pg_size": 2, "ranks": [0, 1]}]),
            _meta("r2.json", pg_config=tp + [{"pg_name": "10", "pg_size": 2, "ranks": [2, 3]}])]
    assert different_jobs(mesh) == []
    other = _meta("x.json", pg_config=[{"pg_name": "9", "pg_size": 2, "ranks": [4, 5]}])
    assert different_jobs(mesh + [other]) == ["these files look like different jobs: process group '9' has size 2, "
                                              "ranks [0, 1] in r0.json; size 2, ranks [4, 5] in x.json"]


def test_time_ranges_within_the_clock_skew_are_one_job():
    """Epoch ranges (baseTimeNanoseconds + ts) 3 s apart overlap within the allowed skew; 1 h apart
    they do not; ts that are no wall-clock time (no base, small) are left out."""
    base = 1_700_000_000 * 10**9
    near = [_meta("a.json", base_time_ns=base, span_ns=(0, 10**9)), _meta("b.json", base_time_ns=base,
                                                                         span_ns=(4 * 10**9, 5 * 10**9))]
    assert different_jobs(near + [_meta("c.json", span_ns=(0, 10**6))]) == []
    far = near + [_meta("d.json", span_ns=(base + 3600 * 10**9, base + 3601 * 10**9))]
    assert different_jobs(far) == ["these files look like different jobs: time ranges that do not overlap: "
                                   "2023-11-14 22:13:20 to 2023-11-14 22:13:25 UTC in a.json, b.json; "
                                   "2023-11-14 23:13:20 to 2023-11-14 23:13:21 UTC in d.json"]


# ----------------------------------------------------------------------------------------------
def test_truncated_file_is_marked_in_its_metadata(dlrm_dir: Path, tmp_path: Path):
    """Rank 7 cut in the middle of an event: analysed from its complete events (count from
    json.raw_decode), and its metadata says salvaged, where the text breaks (just after the last
    complete event) and why; the same when its summary comes from the cache."""
    text = raw_text(dlrm_dir / RANK7)[:len(raw_text(dlrm_dir / RANK7)) // 2]
    (dlrm_dir / RANK7).unlink()
    (dlrm_dir / RANK7.removesuffix(".gz")).write_bytes(text)
    for use_cache, from_cache in ((False, False), (True, False), (True, True)):
        result = analyze_cycles(dlrm_dir, cache_dir=tmp_path / "cache", use_cache=use_cache, engine="inprocess")
        (rank7,) = [s for s in result.summaries if s.rank == 7]
        assert rank7.from_cache == from_cache
        meta = rank7.meta
        assert meta.salvaged and meta.cut_reason == "file ends mid-event (truncated)"
        assert meta.cut_at_byte == complete_events(text)[1]
        assert meta.events_total == complete_events_in_prefix(text)


