"""Issue 33: partial jobs (ranks missing) and folders holding several jobs.

Expected values come from the corpus files themselves, read with json here (distributedInfo's rank
and world size, the events' timestamps, the pids in their metadata), never from rankscope.
"""
from __future__ import annotations

import json
from pathlib import Path

from conftest import assert_no_traceback, copy_files, corpus_files, fresh_json, run_cli, shared_cache_dir, x_events
from rankscope import analyze

SAMPLED = "hta-sampled-2rank"


def test_partial_job_says_so_in_every_verdict(corpus: Path, tmp_path: Path):
    """hta-sampled-2rank: ranks 0 and 1 of a world of 128 (distributedInfo). The capture line starts
    with "2 of 128 ranks present", every finding says so after its summary, and the verdicts across
    ranks (stragglers, critical path) on the terminal too; nothing is skipped or lost: exit 0."""
    infos = [fresh_json(f)["distributedInfo"] for f in corpus_files(corpus, SAMPLED)]
    present, world = len(infos), infos[0]["world_size"]
    said = f"{present} of {world} ranks present"
    proc = run_cli(["analyze", corpus / SAMPLED, "--json", "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    cap = out["job"]["capture"]
    assert cap["coverage"] == said and cap["headline"].startswith(f"{said}: every figure across ranks")
    assert [i["kind"] for i in cap["issues"]] == ["ranks_missing"] and not cap["partial"]
    assert out["findings"] and all(f["summary"].endswith(f"({said}: drawn from those)") and
                                   f["evidence"]["ranks_present"] == said for f in out["findings"])
    term = run_cli(["analyze", corpus / SAMPLED, "--cache-dir", shared_cache_dir()], tmp_path).stdout
    flat = " ".join(term.split())
    assert f"capture: {said}:" in flat and f"Across ranks: {said}:" in flat
    assert "of the path of the ranks present" in flat


def _first_ts_ns(path: Path) -> int:
    doc = fresh_json(path)
    return int(min(e["ts"] for e in x_events(doc)) * 1000) + int(doc.get("baseTimeNanoseconds") or 0)


def test_same_world_size_apart_in_time_are_two_jobs(corpus: Path, tmp_path: Path):
    """Ranks 0-1 of cpu-gloo-4rank-healthy and ranks 2-3 of cpu-gloo-4rank-straggler: one world size
    (4) and layout, but recorded 17 s apart by other processes (pids in their metadata): two jobs,
    the healthy one first (its first event is earlier); `job=1` analyses its two ranks, 2 of 4 present."""
    def rank(f: Path) -> int:
        return fresh_json(f)["distributedInfo"]["rank"]

    healthy = [f for f in corpus_files(corpus, "cpu-gloo-4rank-healthy") if rank(f) < 2]
    slow = [f for f in corpus_files(corpus, "cpu-gloo-4rank-straggler") if rank(f) >= 2]
    pids = [{e["pid"] for e in x_events(fresh_json(f)) if isinstance(e["pid"], int)} for f in healthy + slow]
    assert not (set().union(*pids[:2]) & set().union(*pids[2:]))
    assert max(_first_ts_ns(f) for f in healthy) + 5 * 10**9 < min(_first_ts_ns(f) for f in slow)
    job = tmp_path / "two"
    copy_files(healthy + slow, job)
    result = analyze(job, cache_dir=shared_cache_dir())
    assert not result.usable
    assert [(j.job, j.world_size, j.ranks, sorted(Path(f).name for f in j.files)) for j in result.jobs] == \
        [(1, 4, [0, 1], sorted(f.name for f in healthy)), (2, 4, [2, 3], sorted(f.name for f in slow))]
    picked = analyze(job, cache_dir=shared_cache_dir(), job=1)
    assert [s.rank for s in picked.ranks] == [0, 1] and picked.job.capture.coverage == "2 of 4 ranks present"
    proc = run_cli(["analyze", job, "--job", "3", "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2 and proc.stderr.splitlines()[0] == "rankscope: --job 3: the inputs hold 2 jobs"


def test_cycles_of_one_job_stay_one_job(corpus: Path):
    """cpu-gloo-2rank-cycles: 3 files per rank, one per profiler cycle, written by the same two
    processes (their pids, read with json): one job, not three."""
    files = sorted((corpus / "cpu-gloo-2rank-cycles").glob("*.pt.trace.json"))
    by_rank: dict[int, set] = {}
    for f in files:
        doc = fresh_json(f)
        by_rank.setdefault(doc["distributedInfo"]["rank"], set()).update(
            {e["pid"] for e in x_events(doc) if isinstance(e["pid"], int)})
    assert len(files) == 6 and all(len(p) == 1 for p in by_rank.values())
    result = analyze(corpus / "cpu-gloo-2rank-cycles", cache_dir=shared_cache_dir())
    assert result.usable and not result.jobs and [s.rank for s in result.ranks] == [0, 1]
