"""Hostile outputs, the cache and the engines (issue 34): what rankscope writes never destroys what
the user has, the cache owns only what it made and checks what it reads, and worker processes
never outlive their driver.

Real OS behaviour throughout: real FIFOs, sockets, device nodes (made with mknod in the test's own
folder: /dev/null itself is never a target), symbolic links, a full disk as RLIMIT_FSIZE in the
child (SIGXFSZ ignored: writes past it fail with EFBIG, for root too), real process trees and
signals. Expected values come from what the test set up (the bytes, inode and kind of each target
before the run, the bytes it flipped, the processes it saw) and from the same command run without
the fault.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (GLOO_HEALTHY, assert_no_traceback, corpus_files, ctrl_c, linked_job, process_tree, rankscope_cmd,
                      reading, run_cli, start_cli, wait_for)
from rankscope.files import TEMP_PREFIX, temp_name
from rankscope.ingest import Cache, load_rank
from rankscope.ingest.cache import MARKER, STALE_TEMP_S, content_key

# ---------------------------------------------------------------------------------------------
# 1. Outputs: only regular files, never through a link, stdout in one checked write
TARGETS = ["fifo", "socket", "folder", "device", "link-to-file", "link-to-stdout", "link-to-device"]


def _device(path: Path) -> Path:
    """A character device node like /dev/null (1, 3), but in the test's folder: what an old writer
    would replace there is harmless. Skipped where mknod is not allowed (no CAP_MKNOD)."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod of a device node is not allowed here")
    return path


def _target(kind: str, folder: Path, stdout_file: Path) -> tuple[Path, list]:
    """A path of the given kind in `folder`, and what must stay open while the command runs."""
    path, keep = folder / "target.out", []
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        keep.append(sock)
    elif kind == "folder":
        path.mkdir()
        (path / "inside.txt").write_text("the user's file")
    elif kind == "device":
        _device(path)
    elif kind == "link-to-file":
        victim = folder / "victim.txt"
        victim.write_text("the user's file")
        path.symlink_to(victim)
    elif kind == "link-to-stdout":
        path.symlink_to("/proc/self/fd/1")         # the command's stdout is `stdout_file`
    elif kind == "link-to-device":
        path.symlink_to(_device(folder / "null"))
    return path, keep


def _snapshot(folder: Path) -> dict:
    """Every entry of `folder` (and of its subfolders): kind, inode, size, link target, content."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(folder))] = (stat.S_IFMT(st.st_mode), st.st_ino, st.st_size,
                                           os.readlink(p) if p.is_symlink() else None,
                                           p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out


def _run_to_file(args: list, stdout_file: Path, tmp_path: Path, env: dict | None = None,
                 limit: int | None = None, append: bool = False) -> subprocess.CompletedProcess:
    """The CLI with its stdout on `stdout_file` (appended to when `append`), optionally with
    writes past `limit` bytes failing (RLIMIT_FSIZE, SIGXFSZ ignored). stdout is read back."""
    def fsize_limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    full_env = {**os.environ, "RANKSCOPE_CACHE_DIR": str(tmp_path / "default-cache"), "COLUMNS": "250", **(env or {})}
    with open(stdout_file, "ab" if append else "wb") as out:
        proc = subprocess.run(rankscope_cmd() + [str(a) for a in args], stdout=out, stderr=subprocess.PIPE,
                              text=True, env=full_env, timeout=300, preexec_fn=fsize_limit if limit else None)
    proc.stdout = stdout_file.read_text(errors="replace")
    return proc


def _one_line(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert_no_traceback(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankscope: "), proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def _commands(corpus: Path, target: Path) -> dict[str, list]:
    job = corpus / GLOO_HEALTHY
    return {"analyze --html": ["analyze", job, "-q", "--no-cache", "--html", target],
            "diff --html": ["diff", job, job, "-q", "--no-cache", "--html", target],
            "export -o": ["export", "perfetto", job, "-q", "--no-cache", "-o", target]}


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("command", ["analyze --html", "diff --html", "export -o"])
def test_a_target_that_is_no_regular_file_is_refused_and_left_alone(corpus: Path, tmp_path: Path, command: str,
                                                                    kind: str):
    folder = tmp_path / "out"
    folder.mkdir()
    stdout_file = tmp_path / "stdout.txt"
    target, keep = _target(kind, folder, stdout_file)
    before = _snapshot(folder)
    stdout_file.write_bytes(b"")
    stdout_inode = stdout_file.stat().st_ino
    proc = _run_to_file(_commands(corpus, target)[command], stdout_file, tmp_path)
    for k in keep:
        k.close()
    assert proc.returncode == 2, proc.stderr
    _one_line(proc, str(target), {"fifo": "is a FIFO", "socket": "is a socket", "folder": "is a folder",
                                  "device": "is a device"}.get(kind, "is a symbolic link"))
    assert _snapshot(folder) == before                         # nothing replaced, nothing left beside it
    assert stdout_file.stat().st_ino == stdout_inode and stdout_file.read_bytes() == b""


def test_synth_never_writes_through_a_link_nor_into_a_fifo(tmp_path: Path):
    out = tmp_path / "job"
    out.mkdir()
    victim = tmp_path / "victim.json"
    victim.write_text("the user's file")
    (out / "ground_truth.json").symlink_to(victim)
    proc = run_cli(["synth", out, "--ranks", "2", "--steps", "1", "--scale", "0.1"], tmp_path)
    assert proc.returncode == 2
    _one_line(proc, str(out / "ground_truth.json"), "is a symbolic link")
    assert victim.read_text() == "the user's file" and (out / "ground_truth.json").is_symlink()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = run_cli(["synth", fifo, "--ranks", "2", "--steps", "1", "--scale", "0.1"], tmp_path)
    assert proc.returncode == 2
    _one_line(proc, str(fifo), "is a FIFO")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_synth_never_removes_traces_it_did_not_write(corpus: Path, tmp_path: Path):
    """OUT holding a real job's traces (no ground truth of the generator): refused, every file kept.
    A folder of an earlier synthetic job is reused: its traces replaced (here 4 ranks by 2)."""
    out = tmp_path / "real"
    out.mkdir()
    for i, f in enumerate(corpus_files(corpus, GLOO_HEALTHY)):
        shutil.copyfile(f, out / f"rank{i}.{1000 + i}.pt.trace.json.gz")     # names the generator would use
    before = _snapshot(out)
    proc = run_cli(["synth", out, "--ranks", "2", "--steps", "1", "--scale", "0.1"], tmp_path)
    assert proc.returncode == 2
    _one_line(proc, str(out), "rankscope synth did not write")
    assert _snapshot(out) == before
    earlier = tmp_path / "synthetic"
    for ranks in (4, 2):
        proc = run_cli(["synth", earlier, "--ranks", ranks, "--steps", "1", "--scale", "0.1"], tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert len(list(earlier.glob("rank*.pt.trace.json.gz"))) == 2


@pytest.mark.parametrize("unbuffered", ["", "1"])
@pytest.mark.parametrize("output", ["--json", "terminal"])
def test_stdout_on_a_full_disk_is_one_line_exit_2_and_no_half_output(corpus: Path, tmp_path: Path, unbuffered: str,
                                                                     output: str):
    """stdout a file on a disk that fills half-way through the output, with and without
    PYTHONUNBUFFERED=1 (Docker images set it; stdout then took what fitted and the run went on with
    exit 0): one line, exit 2, and what was written cut off again: the file ends as it began."""
    args = ["analyze", corpus / GLOO_HEALTHY, "-q", "--cache-dir", tmp_path / "cache"] + (["--json"] if output == "--json"
                                                                                         else [])
    whole = _run_to_file(args, tmp_path / "whole.txt", tmp_path)
    assert whole.returncode == 0, whole.stderr
    limit = len(whole.stdout.encode()) // 2                      # the output does not fit
    assert limit > 500
    for previous in (b"", b"an earlier line of the user's\n"):   # `>` and `>>`
        out = tmp_path / "out.txt"
        out.write_bytes(previous)
        proc = _run_to_file(args, out, tmp_path, env={"PYTHONUNBUFFERED": unbuffered}, limit=limit,
                            append=bool(previous))
        assert proc.returncode == 2, proc.stderr
        _one_line(proc, "cannot write to standard output", "File too large")
        assert out.read_bytes() == previous


def test_stdout_json_in_one_piece_equals_what_a_pipe_gets(corpus: Path, tmp_path: Path):
    """The checked write changes nothing for a normal run: the same bytes in a file and a pipe."""
    args = ["analyze", corpus / GLOO_HEALTHY, "-q", "--json", "--no-cache"]
    to_file = _run_to_file(args, tmp_path / "out.json", tmp_path)
    piped = run_cli(args, tmp_path)
    assert to_file.returncode == piped.returncode == 0
    assert to_file.stdout == piped.stdout and json.loads(to_file.stdout)["schema"] == "rankscope.analysis/1"


@pytest.mark.parametrize(("command", "how"), [
    (c, "the file") for c in ["analyze --html", "diff --html", "export -o", "report --html", "watch --html"]]
    + [("export -o", "a link to it")])             # an --html target that is a link is refused as a link (above)
def test_an_output_that_is_one_of_the_inputs_is_refused_and_left_alone(corpus: Path, tmp_path: Path, command: str,
                                                                       how: str):
    """An output path naming a file the command reads (a trace of the job folder given, or the saved
    report shown) would destroy the user's input (before: the trace became the HTML page). Refused in
    one line that names both, exit 2, the input's bytes and inode as they were (read before the run)."""
    job = tmp_path / "job"
    shutil.copytree(corpus / GLOO_HEALTHY, job)
    saved = tmp_path / "saved.json"
    if command == "report --html":
        saved.write_bytes(run_cli(["analyze", job, "--json", "-q", "--no-cache"], tmp_path).stdout.encode())
        victim = saved
    else:
        victim = sorted(p for p in job.iterdir() if p.name.endswith(".pt.trace.json.gz"))[0]
    target = victim
    if how == "a link to it":
        target = tmp_path / "link.json.gz"
        target.symlink_to(victim)
    before = (victim.read_bytes(), victim.stat().st_ino)
    args = {"analyze --html": ["analyze", job, "-q", "--no-cache", "--html", target],
            "diff --html": ["diff", job, job, "-q", "--no-cache", "--html", target],
            "export -o": ["export", "perfetto", job, "-q", "--no-cache", "-o", target],
            "report --html": ["report", saved, "-q", "--html", target],
            "watch --html": ["watch", job, "--no-cache", "--stop-after-idle", "1", "--html", target]}[command]
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 2, proc.stderr
    _one_line(proc, str(target), str(victim), "an input of this command")
    assert (victim.read_bytes(), victim.stat().st_ino) == before


def test_an_export_into_the_job_folder_is_not_read_as_a_rank(corpus: Path, tmp_path: Path):
    """`export -o job/all.json.gz` writes `job/.tmp-...-all.json.gz` first: the ranks read are the
    job's 4 (before: the temporary was read too, as an empty fifth file). The export left there is
    no rank either when the job is analysed again (before: a fifth rank, "5 of 4 ranks")."""
    job = tmp_path / "job"
    shutil.copytree(corpus / GLOO_HEALTHY, job)
    ranks = len(corpus_files(corpus, GLOO_HEALTHY))
    proc = run_cli(["export", "perfetto", job, "--no-cache", "-q", "-o", job / "all.json.gz"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert TEMP_PREFIX not in proc.stderr and f"wrote {ranks} ranks" in proc.stdout
    again = run_cli(["analyze", job, "--no-cache", "-q", "--json"], tmp_path)
    assert [r["rank"] for r in json.loads(again.stdout)["ranks"]] == list(range(ranks))
    assert f"{job / 'all.json.gz'}: not a profiler capture: rankscope's Perfetto export" in again.stderr


def test_no_temporary_file_is_left_beside_a_refused_or_failed_target(corpus: Path, tmp_path: Path):
    """`--html` onto a full disk: the earlier report kept, no temporary file left beside it."""
    page = tmp_path / "out" / "report.html"
    page.parent.mkdir()
    page.write_text("the previous report")
    proc = _run_to_file(["analyze", corpus / GLOO_HEALTHY, "-q", "--no-cache", "--html", page],
                        tmp_path / "stdout.txt", tmp_path, limit=64 << 10)
    assert proc.returncode == 2
    _one_line(proc, str(page), "File too large")
    assert page.read_text() == "the previous report"
    assert [p.name for p in page.parent.iterdir() if p.name.startswith(TEMP_PREFIX)] == []


# ---------------------------------------------------------------------------------------------
# 2. The cache owns only what it made, and checks what it reads
def _users_folder(folder: Path, key: str) -> Path:
    """A user's project folder that happens to have a subfolder named like a cache shard of `key`,
    holding hidden files (a git repository, an .env) older than the stale-temporary age."""
    shard = folder / key[:2]
    (shard / ".git").mkdir(parents=True)
    (shard / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (shard / ".env").write_text("SECRET=1\n")
    (folder / "README.md").write_text("the user's project\n")
    past = time.time() - STALE_TEMP_S - 3600
    for p in (shard / ".git", shard / ".env"):
        os.utime(p, (past, past))
    return folder


@pytest.mark.parametrize("how", ["analyze", "validate", "diff", "export", "demo", "env"])
def test_a_folder_that_is_no_cache_is_refused_and_untouched(corpus: Path, tmp_path: Path, how: str):
    job = corpus / GLOO_HEALTHY
    user = _users_folder(tmp_path / "project", content_key(corpus_files(corpus, GLOO_HEALTHY)[0]))
    before = _snapshot(user)
    cache = ["--cache-dir", user]
    args = {"analyze": ["analyze", job, "-q", *cache], "validate": ["validate", job, "-q", *cache],
            "diff": ["diff", job, job, "-q", *cache], "export": ["export", "perfetto", job, "-o", tmp_path / "t.json",
                                                                 "-q", *cache],
            "demo": ["analyze", "--demo", "-q", *cache], "env": ["analyze", job, "-q"]}[how]
    proc = run_cli(args, tmp_path, env={"RANKSCOPE_CACHE_DIR": str(user)} if how == "env" else None)
    assert proc.returncode == 2, proc.stderr
    _one_line(proc, str(user), "is not a rankscope cache")
    assert _snapshot(user) == before
    assert not (tmp_path / "t.json").exists()


def test_new_empty_and_earlier_caches_are_used(corpus: Path, tmp_path: Path):
    """A missing or empty folder becomes a cache (its marker written); a cache of an earlier
    version (two-hex-digit folders of entries, the demo job: built here by hand) is adopted."""
    rank = corpus_files(corpus, GLOO_HEALTHY)[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    earlier = tmp_path / "earlier"
    (earlier / "ab" / ("ab" + "0" * 62 + "-" + "1" * 16)).mkdir(parents=True)
    (earlier / "demo-job-v3").mkdir()
    for root in (tmp_path / "new" / "cache", empty, earlier):
        trace, hit = load_rank(rank, Cache(root))
        assert not hit and load_rank(rank, Cache(root))[1], root
        assert (root / MARKER).read_bytes().startswith(b"Signature: 8a477f597d28d172789f06886806bc55")


def test_cleaning_removes_only_its_own_temporaries(corpus: Path, tmp_path: Path):
    """In a cache, a shard folder holding a user's hidden files beside an old temporary entry of
    a killed writer: the next write there removes the temporary entry only."""
    rank = corpus_files(corpus, GLOO_HEALTHY)[0]
    root = tmp_path / "cache"
    load_rank(corpus_files(corpus, GLOO_HEALTHY)[1], Cache(root))         # a cache, with its marker
    key = content_key(rank)
    _users_folder(root, key)
    leftover = root / key[:2] / temp_name(key[:8])
    leftover.mkdir()
    (leftover / "events.parquet").write_bytes(b"half")
    past = time.time() - STALE_TEMP_S - 60
    os.utime(leftover, (past, past))
    assert not load_rank(rank, Cache(root))[1]
    assert not leftover.exists()
    assert (root / key[:2] / ".env").read_text() == "SECRET=1\n" and (root / key[:2] / ".git" / "HEAD").exists()


@pytest.fixture
def cached_job(corpus: Path, tmp_path: Path) -> tuple[Path, Path, dict]:
    """A private copy of the 4-rank gloo job analysed once into a fresh cache: (job, cache, the
    fresh --no-cache JSON without from_cache)."""
    job = tmp_path / "job"
    job.mkdir()
    for f in corpus_files(corpus, GLOO_HEALTHY):
        shutil.copyfile(f, job / f.name)
    cache = tmp_path / "cache"
    assert run_cli(["analyze", job, "--json", "--cache-dir", cache], tmp_path).returncode == 0
    fresh = run_cli(["analyze", job, "--json", "--no-cache"], tmp_path)
    return job, cache, _without_from_cache(fresh.stdout)


def _without_from_cache(text: str) -> dict:
    doc = json.loads(text)
    for r in doc["ranks"]:
        r.pop("from_cache")
    return doc


def _entries(cache: Path) -> list[Path]:
    return sorted(p.parent for p in cache.rglob("meta.bin"))


def _flip(path: Path, offsets: list[int]) -> None:
    data = bytearray(path.read_bytes())
    for at in offsets:
        data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _analysed_again(job: Path, cache: Path, fresh: dict, tmp_path: Path) -> None:
    """The next run equals the fresh one but for one line saying damaged entries were rebuilt (in
    stderr and the report), and the one after says nothing: the entries were rewritten."""
    again = run_cli(["analyze", job, "--json", "--cache-dir", cache], tmp_path, timeout=60)
    assert again.returncode == 0, again.stderr
    said = [line for line in again.stderr.splitlines() if "damaged" in line]
    assert len(said) == 1 and str(cache) in said[0], again.stderr
    doc = _without_from_cache(again.stdout)
    assert [w["file"] for w in doc["inputs"]["warnings"]] == ["cache"]
    doc["inputs"]["warnings"] = []
    assert doc == fresh
    third = run_cli(["analyze", job, "--json", "--cache-dir", cache], tmp_path, timeout=60)
    assert third.returncode == 0 and "damaged" not in third.stderr
    assert [r["from_cache"] for r in json.loads(third.stdout)["ranks"]] == [True] * 4


@pytest.mark.parametrize("where", ["header", "middle", "last"])
def test_a_flipped_byte_in_a_summary_is_a_miss_rebuilt_and_said_once(cached_job, tmp_path: Path, where: str):
    job, cache, fresh = cached_job
    blobs = sorted(cache.rglob("summary-*"))
    assert len(blobs) == 4
    for blob in blobs:                              # every rank's: still one line
        size = blob.stat().st_size
        _flip(blob, [{"header": 12, "middle": size // 2, "last": size - 1}[where]])
    _analysed_again(job, cache, fresh, tmp_path)


def test_a_summary_swapped_for_another_ranks_is_a_miss(cached_job, tmp_path: Path):
    job, cache, fresh = cached_job
    a, b = sorted(cache.rglob("summary-*"))[:2]
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    _analysed_again(job, cache, fresh, tmp_path)


def _frames_read_again(cache: Path, rank: Path) -> Cache:
    """load_rank of `rank` through `cache` is a miss that equals a fresh parse, and said so; the
    next one is a hit again. Returns the Cache that missed."""
    missed = Cache(cache)
    trace, hit = load_rank(rank, missed)
    assert not hit and missed.damaged and str(cache) in missed.damaged
    fresh, _ = load_rank(rank)
    for name, frame in fresh.frames().items():
        assert trace.frames()[name].equals(frame), name
    assert load_rank(rank, Cache(cache))[1]
    return missed


def test_eight_flipped_bytes_in_an_events_frame_are_a_miss(cached_job):
    job, cache, _ = cached_job
    rank = sorted(job.iterdir())[0]
    events = cache / content_key(rank)[:2] / content_key(rank) / "events.parquet"
    size = events.stat().st_size
    _flip(events, [size // 3 + 997 * i for i in range(8)])         # in the column data of an uncompressed file
    _frames_read_again(cache, rank)


def test_a_frame_swapped_for_another_ranks_is_a_miss(cached_job):
    """Two ranks whose events frames have the same size (the gloo job's ranks 2 and 3: 88,835
    bytes each here): only the checksum tells them apart."""
    job, cache, _ = cached_job
    by_size: dict[int, list[Path]] = {}
    for entry in _entries(cache):
        by_size.setdefault((entry / "events.parquet").stat().st_size, []).append(entry)
    pair = next((entries for entries in by_size.values() if len(entries) > 1), None)
    assert pair, "no two events frames of the same size"
    a, b = pair[0] / "events.parquet", pair[1] / "events.parquet"
    tmp = a.with_name("swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)
    rank = next(f for f in job.iterdir() if content_key(f) == pair[0].name)
    _frames_read_again(cache, rank)


def _limited(limit_as: int):
    """For preexec_fn: an address-space limit, so that a reader of /dev/zero fails instead of
    taking the machine's memory."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
    return apply


@pytest.mark.parametrize("what", ["events.parquet", "meta.bin", "summary"])
@pytest.mark.parametrize("kind", ["fifo", "link-to-dev-zero", "link-to-file"])
def test_an_entry_file_that_is_no_regular_file_is_a_miss_never_waited_on(cached_job, tmp_path: Path, what: str,
                                                                         kind: str):
    """A FIFO (an open for reading would wait for a writer for ever), a link to /dev/zero (endless
    bytes) or a link to another rank's file, in place of one entry's file: a miss, rebuilt, said
    once. In a child with 3 GB of address space and 60 s."""
    job, cache, fresh = cached_job
    entries = _entries(cache)
    entry = entries[0]
    name = next(entry.glob("summary-*")).name if what == "summary" else what
    if what != "summary":
        for blob in cache.rglob("summary-*"):           # the frames are read only when the summary misses
            blob.unlink()
    (entry / name).unlink()
    if kind == "fifo":
        os.mkfifo(entry / name)
    elif kind == "link-to-dev-zero":
        (entry / name).symlink_to("/dev/zero")
    else:
        (entry / name).symlink_to(next(entries[1].glob("summary-*")) if what == "summary" else entries[1] / name)
    env = {**os.environ, "RANKSCOPE_CACHE_DIR": str(tmp_path / "default-cache"), "COLUMNS": "250"}
    again = subprocess.run(rankscope_cmd() + ["analyze", str(job), "--json", "--cache-dir", str(cache)],
                           capture_output=True, text=True, env=env, timeout=60, preexec_fn=_limited(3 << 30))
    assert again.returncode == 0, again.stderr
    said = [line for line in again.stderr.splitlines() if "damaged" in line]
    assert len(said) == 1, again.stderr
    doc = _without_from_cache(again.stdout)
    doc["inputs"]["warnings"] = []
    assert doc == fresh
    assert (entry / name).is_file() and not (entry / name).is_symlink()       # rebuilt


# ---------------------------------------------------------------------------------------------
# 3. Engines clean up: worker processes end with their driver; a local Ray runtime is the
#    driver's alone (loopback only) and a Ctrl-C while it starts leaves nothing behind
@pytest.fixture(scope="module")
def busy_job(tmp_path_factory) -> Path:
    """48 plain-JSON ranks of ~8 MB (4 generated, each linked 12 times): seconds of work."""
    return linked_job(tmp_path_factory.mktemp("busy"), copies=12)


def _marked_processes(mark: str) -> list[int]:
    """Processes whose environment holds RANKSCOPE_TEST_MARK=`mark` (set for the command line here,
    inherited by everything it starts, also what is reparented when its parent dies); zombies
    are not counted."""
    found = []
    needle = f"RANKSCOPE_TEST_MARK={mark}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0") and \
                    (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(d.name))
        except OSError:
            pass
    return found


def _gone(mark: str, within_s: float = 15.0) -> list[int]:
    """What is left of the marked processes after at most `within_s` (then killed: nothing of a
    failed run stays on the machine)."""
    deadline = time.monotonic() + within_s
    while (left := _marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def _start_marked(args: list, mark: str) -> subprocess.Popen:
    return start_cli(args, env={**os.environ, "RANKSCOPE_TEST_MARK": mark})


@pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="finds the processes through /proc")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_worker_processes_end_with_their_driver(busy_job: Path, sig: str):
    """`--engine processes`: the driver alone killed while its workers parse (as `timeout` and
    Kubernetes do): the workers, their server and the resource tracker end too, within seconds."""
    mark = f"workers-{sig}-{os.getpid()}"
    proc = _start_marked(["analyze", busy_job, "--engine", "processes", "--workers", "2", "--no-cache", "-q"], mark)
    try:
        assert wait_for(proc, lambda: reading(process_tree(proc.pid)[1:], busy_job)), "no worker read a rank"
        assert len(_marked_processes(mark)) >= 3                      # the driver and two workers at least
        os.kill(proc.pid, getattr(signal, sig))
        proc.communicate(timeout=60)
    finally:
        left = _gone(mark)
    assert left == [], f"left behind after {sig} of the driver: {left}"


def _listening(pids: list[int]) -> set[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket and bound UDP socket of `pids`,
    read from /proc/net/{tcp,tcp6,udp,udp6} and the processes' open sockets."""
    owner = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    link = os.readlink(fd)
                except OSError:
                    continue
                if link.startswith("socket:["):
                    owner[link[8:-1]] = pid
        except OSError:
            continue
    found = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            listening = fields[3] == "0A" if table.startswith("tcp") else True
            if listening and fields[9] in owner:
                hex_ip, port = fields[1].split(":")
                raw = bytes.fromhex(hex_ip)
                if len(raw) == 4:
                    ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
                else:
                    ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                try:
                    name = Path(f"/proc/{owner[fields[9]]}/comm").read_text().strip()
                except OSError:
                    name = "?"
                found.add((ip, int(port, 16), name))
    return found


def _loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1",) or ip.startswith("::ffff:127.")


def _takes_sigint(pid: int) -> bool:
    """Whether a SIGINT sent to `pid` would reach it: neither blocked nor ignored (/proc status)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    bit = 1 << (signal.SIGINT - 1)
    return not (int(fields["SigBlk"], 16) & bit or int(fields["SigIgn"], 16) & bit)


@pytest.mark.skipif(not Path("/proc/net/tcp").is_file(), reason="reads the sockets from /proc")
def test_a_local_ray_runtime_listens_on_loopback_only_and_leaves_ctrl_c_to_its_driver(busy_job: Path):
    """A real local Ray runtime started by `--engine ray`, sampled while it works: every socket its
    processes (GCS, raylet, agents, workers, the driver) listen on is on the loopback interface,
    and none of them but the driver takes a SIGINT (a terminal's Ctrl-C reaches the whole process
    group: Ray's agents that took it could outlive the run; the driver shuts the runtime down)."""
    mark = f"ray-listen-{os.getpid()}"
    proc = _start_marked(["analyze", busy_job, "--engine", "ray", "--workers", "2", "--no-cache", "-q"], mark)
    seen: set = set()
    taking: dict[int, bool] = {}
    try:
        def sample() -> None:
            pids = _marked_processes(mark)
            seen.update(_listening(pids))
            for pid in pids:
                try:
                    taking[pid] = _takes_sigint(pid)
                except (OSError, KeyError):
                    pass

        def working() -> bool:
            sample()
            return reading(_marked_processes(mark), busy_job) and len({name for _, _, name in seen}) >= 3

        assert wait_for(proc, working, poll_s=0.1), f"the runtime never worked: {seen}"
        for _ in range(10):
            sample()
            time.sleep(0.1)
        ctrl_c(proc)
    finally:
        _gone(mark)
    names = {name for _, _, name in seen}
    assert {"gcs_server", "raylet"} <= names, names
    assert [s for s in seen if not _loopback(s[0])] == []
    assert taking.pop(proc.pid) and len(taking) >= 4                 # the driver does; GCS, raylet, workers...
    assert [pid for pid, takes in taking.items() if takes] == []


@pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="finds the processes through /proc")
@pytest.mark.parametrize("after_s", [0.0, 0.5, 1.5, 3.0])
def test_ctrl_c_while_the_ray_runtime_starts_leaves_no_process(busy_job: Path, after_s: float):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) `after_s` seconds after
    the runtime's GCS server appears: one line, exit 130, and within seconds no process of the run
    is left (Ray's agents, which took the Ctrl-C themselves, outlived it before)."""
    mark = f"ray-ctrl-c-{after_s}-{os.getpid()}"
    proc = _start_marked(["analyze", busy_job, "--engine", "ray", "--workers", "2", "--no-cache", "-q"], mark)
    try:
        def gcs_started() -> bool:
            return any(Path(f"/proc/{pid}/comm").read_text().strip() == "gcs_server"
                       for pid in _marked_processes(mark) if Path(f"/proc/{pid}/comm").exists())

        assert wait_for(proc, gcs_started, poll_s=0.01), "the runtime never started"
        time.sleep(after_s)
        done = ctrl_c(proc)
    finally:
        left = _gone(mark)
    assert_no_traceback(done)
    assert done.returncode == 130 and done.stderr.strip() == "rankscope: interrupted", done.stderr
    assert left == [], f"left behind: {left}"
