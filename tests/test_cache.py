"""The parse cache (ingest/cache.py): hits equal fresh parses, a changed file is never served
stale (the key: size, mtime, first and last MiB, inode and ctime), damaged entries are misses,
--no-cache writes nothing, an unwritable cache never fails the analysis."""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DLRM, corpus_files, fresh_json, run_cli, write_trace
from rankscope import api
from rankscope.ingest import Cache, load_rank
from rankscope.ingest.cache import content_key
from rankscope.pipelines.run import analyze_cycles

MIB = 1 << 20


def same_trace(a, b, ignore=("file",)) -> None:
    for name, frame in a.frames().items():
        assert b.frames()[name].equals(frame), f"frame {name} differs"
    da, db = a.meta.to_dict(), b.meta.to_dict()
    for k in ignore:
        da.pop(k), db.pop(k)
    assert da == db


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@pytest.fixture
def rank0(corpus: Path, tmp_path: Path) -> Path:
    src = corpus_files(corpus, DLRM)[0]
    dst = tmp_path / "in" / src.name
    dst.parent.mkdir()
    shutil.copyfile(src, dst)
    return dst


def test_second_load_is_served_from_cache_and_equal(rank0: Path, tmp_path: Path):
    cache = Cache(tmp_path / "cache")
    first, hit1 = load_rank(rank0, cache)
    second, hit2 = load_rank(rank0, cache)
    assert (hit1, hit2) == (False, True)
    same_trace(first, second)
    assert second.meta.file == str(rank0)


def test_cache_hit_under_another_name_reports_the_new_name(rank0: Path, tmp_path: Path):
    cache = Cache(tmp_path / "cache")
    first, _ = load_rank(rank0, cache)
    other = rank0.with_name("renamed.pt.trace.json.gz")
    shutil.copy2(rank0, other)                      # same content, same mtime
    again, hit = load_rank(other, cache)
    assert hit and again.meta.file == str(other)
    same_trace(first, again)


def test_analyze_twice_second_run_from_cache(corpus: Path, tmp_path: Path):
    job = tmp_path / "job"
    for f in corpus_files(corpus, DLRM):
        job.mkdir(exist_ok=True)
        shutil.copyfile(f, job / f.name)         # fresh mtimes: not in any earlier cache
    a = analyze_cycles(job, cache_dir=tmp_path / "cache", engine="inprocess")
    b = analyze_cycles(job, cache_dir=tmp_path / "cache", engine="inprocess")
    assert [s.from_cache for s in a.summaries] == [False] * 8
    assert [s.from_cache for s in b.summaries] == [True] * 8
    assert [(s.rank, s.meta.events_total, s.steps) for s in a.summaries] == \
        [(s.rank, s.meta.events_total, s.steps) for s in b.summaries]


def test_analyze_after_validate_reads_the_cached_traces(corpus: Path, tmp_path: Path):
    """`validate` leaves each rank's parsed trace in the cache; the `analyze` that follows analyses
    those (no second parse: its ranks say from_cache) and finds what an uncached analyze finds."""
    job = tmp_path / "job"
    job.mkdir()
    for f in corpus_files(corpus, DLRM):
        shutil.copyfile(f, job / f.name)
    api.ingest(job, cache_dir=tmp_path / "cache", engine="inprocess")
    after = analyze_cycles(job, cache_dir=tmp_path / "cache", engine="inprocess")
    fresh = analyze_cycles(job, use_cache=False, engine="inprocess")
    assert [s.from_cache for s in after.summaries] == [True] * 8
    assert [(s.rank, s.meta.events_total, s.steps, s.breakdown_mean_ms) for s in after.summaries] == \
        [(s.rank, s.meta.events_total, s.steps, s.breakdown_mean_ms) for s in fresh.summaries]


def test_appended_whitespace_is_a_miss(rank0: Path, tmp_path: Path):
    """Whitespace appended to a plain-JSON trace (still the same trace): a miss, not the old entry,
    and the re-parse equals the first parse."""
    plain = rank0.with_suffix("")                   # .pt.trace.json
    plain.write_bytes(gzip.decompress(rank0.read_bytes()))
    cache = Cache(tmp_path / "cache")
    first, _ = load_rank(plain, cache)
    with open(plain, "ab") as f:
        f.write(b"\n   \n")
    second, hit = load_rank(plain, cache)
    assert not hit
    assert second.meta.size_bytes == first.meta.size_bytes + 5
    same_trace(first, second, ignore=("file", "size_bytes"))
    assert load_rank(plain, cache)[1]


def _edit_dur_in_range(path: Path, lo: int, hi: int) -> tuple[int, int, int]:
    """Change one `"dur": N` value whose digits lie in [lo, hi) to another value with as many
    digits, keeping size and (restored) mtime. Returns (offset, old, new)."""
    data = bytearray(path.read_bytes())
    st = os.stat(path)
    for m in re.finditer(rb'"dur": ?(\d{2,})', data):
        if lo <= m.start(1) and m.end(1) <= hi:
            old = int(m.group(1))
            new_digits = str(old + 1 if not str(old + 1).startswith("1" + "0" * len(m.group(1))) else old - 1).encode()
            assert len(new_digits) == len(m.group(1))
            data[m.start(1):m.end(1)] = new_digits
            path.write_bytes(bytes(data))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
            assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
            return m.start(1), old, int(new_digits)
    raise AssertionError(f"no dur value in [{lo}, {hi})")


def _durations_us(trace) -> set[int]:
    return set((trace.events["dur_ns"] // 1000).to_list())


def test_small_file_rewritten_same_size_same_mtime_is_a_miss(rank0: Path, tmp_path: Path):
    """Files up to 2 MiB are hashed whole: a one-digit change anywhere is caught even with size and
    mtime unchanged."""
    plain = rank0.with_suffix("")
    plain.write_bytes(gzip.decompress(rank0.read_bytes()))
    size = plain.stat().st_size
    assert size <= 2 * MIB
    cache = Cache(tmp_path / "cache")
    load_rank(plain, cache)
    _, old, new = _edit_dur_in_range(plain, size // 2, size)
    trace, hit = load_rank(plain, cache)
    assert not hit
    assert new in _durations_us(trace)


@pytest.fixture
def big_plain(corpus: Path, tmp_path: Path) -> Path:
    """A ~3.6 MB plain-JSON trace (> 2 MiB, so the cache key hashes only its first and last MiB):
    the dlrm rank 0 events four times."""
    doc = fresh_json(corpus_files(corpus, DLRM)[0])
    doc["traceEvents"] = doc["traceEvents"] * 4
    (tmp_path / "in").mkdir()
    p = write_trace(tmp_path / "in" / "big.pt.trace.json", doc)
    assert p.stat().st_size > 3 * MIB
    return p


@pytest.mark.parametrize("where", ["first-MiB", "last-MiB"])
def test_big_file_change_in_hashed_ends_is_a_miss(big_plain: Path, tmp_path: Path, where: str):
    size = big_plain.stat().st_size
    cache = Cache(tmp_path / "cache")
    load_rank(big_plain, cache)
    lo, hi = (0, MIB) if where == "first-MiB" else (size - MIB, size)
    _, old, new = _edit_dur_in_range(big_plain, lo, hi)
    trace, hit = load_rank(big_plain, cache)
    assert not hit, f"a change in the {where} with size and mtime restored was served from the cache"
    assert new in _durations_us(trace)


def test_big_file_change_in_the_middle_is_a_miss(big_plain: Path, tmp_path: Path):
    """A same-size edit strictly between the first and last MiB with the mtime restored by hand
    (os.utime): the content part of the key (size, mtime, ends) is unchanged, but the file's ctime
    moved, so the key is new and the edit is read (it was served stale before the identity part)."""
    size = big_plain.stat().st_size
    cache = Cache(tmp_path / "cache")
    key_before = content_key(big_plain)
    full_before = content_key(big_plain, full_hash=True)
    load_rank(big_plain, cache)
    _, old, new = _edit_dur_in_range(big_plain, MIB + 1000, size - MIB - 1000)
    assert content_key(big_plain).rpartition("-")[0] == key_before.rpartition("-")[0]
    assert content_key(big_plain) != key_before
    assert content_key(big_plain, full_hash=True) != full_before
    trace, hit = load_rank(big_plain, cache)
    assert not hit and new in _durations_us(trace)


def test_no_cache_writes_nothing(corpus: Path, tmp_path: Path):
    cache_dir = tmp_path / "explicit-cache"
    env_dir = tmp_path / "env-cache"
    proc = run_cli(["analyze", corpus / DLRM, "--no-cache"], tmp_path, env={"RANKSCOPE_CACHE_DIR": str(env_dir)})
    assert proc.returncode == 0, proc.stderr
    assert files_under(cache_dir) == [] and files_under(env_dir) == [] and files_under(tmp_path / "xdg-cache") == []
    api.analyze(corpus / DLRM, cache_dir=cache_dir, use_cache=False, engine="inprocess")
    assert files_under(cache_dir) == []


def test_cli_default_cache_dir_from_env(corpus: Path, tmp_path: Path):
    """Without --cache-dir the cache lives in $RANKSCOPE_CACHE_DIR; the second run is served from it."""
    env_dir = tmp_path / "env-cache"
    for expected in (False, True):
        proc = run_cli(["analyze", corpus / DLRM, "--json"], tmp_path, env={"RANKSCOPE_CACHE_DIR": str(env_dir)})
        assert proc.returncode == 0, proc.stderr
        assert [r["from_cache"] for r in json.loads(proc.stdout)["ranks"]] == [expected] * 8
    assert files_under(env_dir)


def _entry(cache: Cache, path: Path) -> Path:
    key = content_key(path)
    entry = cache.root / key[:2] / key
    assert (entry / "meta.bin").exists()
    return entry


DAMAGES = {
    "truncated-parquet": lambda e: (e / "events.parquet").write_bytes((e / "events.parquet").read_bytes()[:200]),
    "missing-parquet": lambda e: (e / "flows.parquet").unlink(),
    "garbage-meta": lambda e: (e / "meta.bin").write_text("{not json"),
    "empty-meta": lambda e: (e / "meta.bin").write_text(""),
    "meta-wrong-fields": lambda e: (e / "meta.bin").write_text('{"file": "x", "bogus": 1}'),
}


@pytest.mark.parametrize("damage", list(DAMAGES), ids=list(DAMAGES))
def test_damaged_entry_is_a_miss_and_rewritten(rank0: Path, tmp_path: Path, damage: str):
    cache = Cache(tmp_path / "cache")
    first, _ = load_rank(rank0, cache)
    DAMAGES[damage](_entry(cache, rank0))
    second, hit = load_rank(rank0, cache)
    assert not hit
    same_trace(first, second)
    third, hit = load_rank(rank0, cache)
    assert hit, "the damaged entry was not rewritten"
    same_trace(first, third)


def _unwritable(kind: str, tmp_path: Path) -> Path:
    if kind == "under-a-file":                       # works as root too: mkdir fails with ENOTDIR
        blocker = tmp_path / "blocker"
        blocker.write_text("a file where the cache folder should be")
        return blocker / "cache"
    ro = tmp_path / "ro-cache"                      # a no-op for root, effective otherwise
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return ro


@pytest.mark.parametrize("kind", ["under-a-file", "read-only-folder"])
def test_unwritable_cache_does_not_fail_the_analysis(rank0: Path, tmp_path: Path, kind: str):
    root = _unwritable(kind, tmp_path)
    try:
        trace, hit = load_rank(rank0, Cache(root))
        assert not hit and len(trace.events) > 0
        result = api.analyze(rank0.parent, cache_dir=root, engine="inprocess")
        assert [s.rank for s in result.ranks] == [0] and not result.skipped
        cache_warnings = [p for p in result.problems if p.file == "cache"]
        assert len(result.problems) == len(cache_warnings) <= 1     # root writes to a read-only folder
        assert kind == "read-only-folder" or len(cache_warnings) == 1
        proc = run_cli(["analyze", rank0.parent, "--cache-dir", root], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        assert len([line for line in proc.stderr.splitlines() if "cannot write the cache" in line]) == \
            len(cache_warnings)
    finally:
        if root.exists() and root.is_dir():
            root.chmod(stat.S_IRWXU)


def test_read_only_populated_cache_is_still_read(rank0: Path, tmp_path: Path):
    cache = Cache(tmp_path / "cache")
    first, _ = load_rank(rank0, cache)
    for p in [cache.root, *cache.root.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        second, hit = load_rank(rank0, cache)
        assert hit
        same_trace(first, second)
    finally:
        for p in [cache.root, *cache.root.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


CONCURRENT_DECODE = '''
import sys, threading
from rankscope.pipelines.job import decode_summary
blobs = [open(p, "rb").read() for p in sys.argv[1:]]
barrier = threading.Barrier(8)
def decode(k):
    barrier.wait()
    assert decode_summary(blobs[k % len(blobs)]) is not None
threads = [threading.Thread(target=decode, args=(k,)) for k in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
'''


def test_cached_summaries_decoded_by_threads_at_once(corpus: Path, tmp_path: Path):
    """Eight worker threads decoding cached summaries at the same instant, first thing in a fresh
    process (what a cached `analyze` with the thread engine does): with one msgpack decode per
    thread, msgspec's first-use set-up raced and crashed the process in about half of these runs."""
    cache = tmp_path / "cache"
    assert run_cli(["analyze", corpus / DLRM, "--cache-dir", cache, "--json"], tmp_path).returncode == 0
    blobs = sorted(cache.rglob("summary-*.msgpack"))
    assert len(blobs) == len(corpus_files(corpus, DLRM))
    for _ in range(6):
        proc = subprocess.run([sys.executable, "-c", CONCURRENT_DECODE] + [str(b) for b in blobs],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
