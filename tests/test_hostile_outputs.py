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
from pathlib import Path

import pytest

from conftest import GLOO_HEALTHY, assert_no_traceback, corpus_files, rankscope_cmd, run_cli
from rankscope.files import TEMP_PREFIX

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
