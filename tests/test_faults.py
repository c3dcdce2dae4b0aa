"""Faults (issue 16, class E): a cache that cannot be written, files replaced under the cache,
writes that fail half way. Real components and real OS failures: a write past RLIMIT_FSIZE fails
with EFBIG (SIGXFSZ ignored) for root too, where a read-only folder would not stop it. Expected
values come from the same command run without the fault (`--no-cache`)."""
from __future__ import annotations

import errno
import gzip
import json
import math
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import assert_no_traceback, rankscope_cmd
from rankscope.files import TEMP_PREFIX, atomic_write_bytes, atomic_write_text
from rankscope.ingest import Cache, load_rank
from rankscope.ingest.cache import MARKER, STALE_TEMP_S, content_key
from rankscope.synth import generate_job

MB = 1 << 20
CACHE_LIMIT = 64 << 10      # bytes a file may grow to: each rank's parquet frames are larger


def _fsize_limit(limit: int):
    """For preexec_fn: writes past `limit` bytes fail with EFBIG in the child and its children."""
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return apply


@contextmanager
def fsize_limit(limit: int):
    """The same in this process, for the block (the hard limit is left alone, so it is restored)."""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_handler)


def _cli(args: list, tmp_path: Path, limit: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "RANKSCOPE_CACHE_DIR": str(tmp_path / "default-cache"), "COLUMNS": "250"}
    return subprocess.run(rankscope_cmd() + [str(a) for a in args], capture_output=True, text=True, env=env,
                          timeout=300, preexec_fn=_fsize_limit(limit) if limit else None)


def _same(a, b, path: str = "") -> None:
    """Equal JSON values; floats to 1e-9 (the kernel shares differ in the last digit run to run)."""
    if isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {a} != {b}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _analysis(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    doc = json.loads(proc.stdout)
    doc.pop("engine")                 # which engine ran: what the runs differ in
    for r in doc["ranks"]:
        r.pop("from_cache")
    return doc


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("job")
    generate_job(out, ranks=8, steps=4, scale=0.5)
    (out / "ground_truth.json").unlink()
    return out


@pytest.fixture(scope="module")
def reference(job: Path, tmp_path_factory) -> dict:
    return _analysis(_cli(["analyze", job, "--json", "--no-cache"], tmp_path_factory.mktemp("ref")))


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["processes", "inprocess"])
def test_full_cache_disk_changes_nothing(job: Path, reference: dict, tmp_path: Path, engine: str):
    """Every cache write past 64 KB fails (EFBIG): all 8 ranks are analysed from the parse, one
    warning says so (stderr and the report's input warnings), and otherwise the JSON is the
    --no-cache one; a later run with room equals it too, and no temporary is left."""
    cache = tmp_path / "cache"
    full = _cli(["analyze", job, "--json", "--cache-dir", cache, "--engine", engine], tmp_path, limit=CACHE_LIMIT)
    doc = _analysis(full)
    said = [line for line in full.stderr.splitlines() if "cannot write the cache" in line]
    assert len(said) == 1 and "File too large" in said[0] and "the results are not affected" in said[0], full.stderr
    warning = doc["inputs"]["warnings"].pop()              # the same line, once, in the report
    assert warning["file"] == "cache" and warning["problem"] in said[0]
    _same(doc, reference)
    assert len(reference["ranks"]) == 8
    again = _cli(["analyze", job, "--json", "--cache-dir", cache, "--engine", engine], tmp_path)
    _same(_analysis(again), reference)
    assert not [p for p in cache.rglob("*") if p.name.startswith(".")]


def test_failed_cache_write_is_reported_once_and_cleaned(job: Path, tmp_path: Path):
    rank = sorted(job.glob("*.pt.trace.json.gz"))[0]
    cache = Cache(tmp_path / "cache")
    with fsize_limit(CACHE_LIMIT):
        trace, hit = load_rank(rank, cache)
        cache.put_blob(content_key(rank), "summary.bin", b"x" * (2 * CACHE_LIMIT))
    assert not hit and trace.events.height > 0
    assert re.fullmatch(rf"cannot write the cache at {re.escape(str(cache.root))}: File too large.*", cache.write_error)
    assert [p.name for p in cache.root.rglob("*") if p.is_file()] == [MARKER]   # no half entry, no temporary
    assert load_rank(rank, cache)[1] is False and load_rank(rank, cache)[1] is True    # written once there is room


def test_leftovers_of_killed_writers_are_removed(job: Path, tmp_path: Path):
    """Temporary entries of a writer that died: old ones are removed by the next write beside them,
    young ones (a writer at work) are left; neither is ever read as an entry."""
    rank = sorted(job.glob("*.pt.trace.json.gz"))[0]
    key = content_key(rank)
    shard = tmp_path / "cache" / key[:2]
    shard.mkdir(parents=True)
    old, young, legacy = shard / f"{TEMP_PREFIX}1-0000dead-x", shard / f"{TEMP_PREFIX}2-0000b05e-x", shard / f".{key[:8]}-ab12"
    for leftover in (old, young, legacy):
        leftover.mkdir()
        (leftover / "events.parquet").write_bytes(b"half")
    past = time.time() - STALE_TEMP_S - 60
    for leftover in (old, legacy):
        os.utime(leftover, (past, past))
    trace, hit = load_rank(rank, Cache(tmp_path / "cache"))
    assert not hit and trace.events.height > 0
    assert not old.exists() and not legacy.exists() and young.exists()
    assert load_rank(rank, Cache(tmp_path / "cache"))[1]


# ---------------------------------------------------------------------------------------------
def _replace_a_duration(path: Path, how: str) -> None:
    """Rewrite one `"dur": N` in the middle of `path` to another number of as many digits, keeping
    the size and the mtime, the way `how` says: in place + os.utime, `cp -p` of an edited copy
    (shutil.copy2: same inode), or an edited copy renamed into place (rsync -a, tar)."""
    data = bytearray(path.read_bytes())
    st = path.stat()
    for m in re.finditer(rb'"dur": (\d{3,})', data[len(data) // 3:]):
        old = m.group(1)
        new = str(int(old) + 1).encode() if not old.startswith(b"9") else str(int(old) - 1).encode()
        if len(new) == len(old):
            at = len(data) // 3 + m.start(1)
            data[at:at + len(old)] = new
            break
    else:
        raise AssertionError(f"no duration to edit in {path}")
    edited = path.with_name("edited.tmp")
    edited.write_bytes(bytes(data))
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))
    if how == "in-place":
        path.write_bytes(bytes(data))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        edited.unlink()
    elif how == "cp-p":
        shutil.copy2(edited, path)
        edited.unlink()
    else:
        os.replace(edited, path)
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def _tripled_rank(job: Path, folder: Path) -> Path:
    """A plain-JSON rank of ~3 MB (a generated rank's events three times): the content key reads
    only the first and last MiB of a file over 2 MiB, so an edit in its middle is outside them."""
    doc = json.loads(gzip.decompress(sorted(job.glob("*.pt.trace.json.gz"))[0].read_bytes()))
    doc["traceEvents"] *= 3
    folder.mkdir()
    path = folder / "rank0.pt.trace.json"
    path.write_text(json.dumps(doc))
    assert path.stat().st_size > 2 * MB + 100_000
    return path


@pytest.mark.parametrize("how", ["in-place", "cp-p", "rename"])
def test_same_size_same_mtime_replacement_is_not_served_stale(job: Path, tmp_path: Path, how: str):
    path = _tripled_rank(job, tmp_path / "run")
    cache = tmp_path / "cache"
    _analysis(_cli(["analyze", path.parent, "--json", "--cache-dir", cache, "--engine", "inprocess"], tmp_path))
    before, hit = load_rank(path, Cache(cache))
    assert hit
    _replace_a_duration(path, how)
    second = _cli(["analyze", path.parent, "--json", "--cache-dir", cache, "--engine", "inprocess"], tmp_path)
    assert [r["from_cache"] for r in json.loads(second.stdout)["ranks"]] == [False]
    _same(_analysis(second), _analysis(_cli(["analyze", path.parent, "--json", "--no-cache"], tmp_path)))
    after, hit = load_rank(path, Cache(cache))
    assert hit and after.events["dur_ns"].sum() == load_rank(path)[0].events["dur_ns"].sum()
    assert after.events["dur_ns"].sum() != before.events["dur_ns"].sum()


def test_a_different_file_with_the_same_size_mtime_and_ends_never_shares_an_entry(job: Path, tmp_path: Path):
    """A copy shares its original's entry only once compared byte for byte: an edited copy (same
    content part of the key) is parsed, and the original keeps its own result."""
    original = _tripled_rank(job, tmp_path / "a")
    cache = Cache(tmp_path / "cache")
    base, _ = load_rank(original, cache)
    same = tmp_path / "b" / "rank0.pt.trace.json"
    same.parent.mkdir()
    shutil.copy2(original, same)
    copy, hit = load_rank(same, cache)
    assert hit and copy.events.equals(base.events)
    edited = tmp_path / "c" / "rank0.pt.trace.json"
    edited.parent.mkdir()
    shutil.copy2(original, edited)
    _replace_a_duration(edited, "in-place")
    assert content_key(edited).rpartition("-")[0] == content_key(original).rpartition("-")[0]
    changed, hit = load_rank(edited, cache)
    assert not hit and changed.events["dur_ns"].sum() != base.events["dur_ns"].sum()
    again, hit = load_rank(original, cache)
    assert hit and again.events.equals(base.events)


# ---------------------------------------------------------------------------------------------
def test_atomic_write_on_a_full_disk_keeps_the_old_file(tmp_path: Path):
    report = tmp_path / "report.html"
    report.write_text("<html>previous report</html>")
    with fsize_limit(CACHE_LIMIT), pytest.raises(OSError) as failed:
        atomic_write_text(report, "<html>" + "x" * (2 * CACHE_LIMIT) + "</html>")
    assert failed.value.errno == errno.EFBIG
    assert report.read_text() == "<html>previous report</html>"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_atomic_write_replaces_keeps_the_mode_and_never_follows_a_link(tmp_path: Path):
    target = tmp_path / "out.html"
    target.write_text("old")
    target.chmod(0o640)
    atomic_write_bytes(target, b"new", fsync=True)
    assert target.read_bytes() == b"new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    link = tmp_path / "latest.html"
    link.symlink_to(target)
    with pytest.raises(OSError, match="is a symbolic link"):        # refused: neither target nor link replaced
        atomic_write_bytes(link, b"newer")
    assert link.is_symlink() and target.read_bytes() == b"new"
    fresh = tmp_path / "new.json"
    atomic_write_text(fresh, "{}")
    assert fresh.read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == ["latest.html", "new.json",
                                                                                      "out.html"]


@pytest.mark.parametrize("command", ["analyze", "diff"])
def test_html_page_onto_a_full_disk_keeps_the_previous_page(job: Path, tmp_path: Path, command: str):
    """`--html` where the disk fills up: one line, exit 2, the earlier page byte for byte as it was,
    no temporary file left (the page is ~4 MB: far past the limit)."""
    page = tmp_path / "report.html"
    page.write_text("<!DOCTYPE html><p>the previous report</p>", encoding="utf-8")
    before = page.read_bytes()
    inputs = [job] if command == "analyze" else [job, job]
    proc = _cli([command, *inputs, "--html", page, "-q", "--no-cache"], tmp_path, limit=256 << 10)
    assert_no_traceback(proc)
    assert proc.returncode == 2, proc.stderr
    assert [line for line in proc.stderr.splitlines() if "cannot write" in line and str(page) in line]
    assert page.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)) == []
