"""The command line as a user runs it (subprocess `rankscope ...`).

Expected numbers: ranks / world_size from the files' own distributedInfo, event counts from a
plain json reading of each file (conftest.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DLRM, assert_no_traceback, copy_files, corpus_files, load_json, run_cli, shared_cache_dir


@pytest.fixture(scope="module")
def dlrm_expected(corpus: Path) -> dict:
    """file name -> (distributedInfo.rank, world_size, number of traceEvents), read with json."""
    out = {}
    for f in corpus_files(corpus, DLRM):
        doc = load_json(f)
        out[f.name] = (doc["distributedInfo"]["rank"], doc["distributedInfo"]["world_size"], len(doc["traceEvents"]))
    return out


def test_analyze_json_schema_ranks_and_step_times(corpus: Path, tmp_path: Path, dlrm_expected: dict):
    proc = run_cli(["analyze", corpus / DLRM, "--json", "--cache-dir", tmp_path / "cache"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["schema"] == "rankscope.analysis/1"
    assert out["job"]["world_size"] == 8 == {w for _, w, _ in dlrm_expected.values()}.pop()
    assert out["job"]["ranks"] == list(range(8))
    assert [r["rank"] for r in out["ranks"]] == list(range(8))
    for r in out["ranks"]:
        rank, _, n_events = dlrm_expected[Path(r["file"]).name]
        assert r["rank"] == rank and r["rank_source"] == "distributedInfo"
        assert r["events"] == n_events
        st = r["step_time_ms"]
        assert set(st) >= {"mean", "median", "max"}
        assert all(isinstance(st[k], (int, float)) and st[k] > 0 for k in ("mean", "median", "max")), st
    for key in ("job", "ranks", "steps", "collectives", "stragglers", "findings"):
        assert key in out
    assert out["job"]["missing_ranks"] == []


def test_analyze_table_output(corpus: Path, tmp_path: Path):
    proc = run_cli(["analyze", corpus / DLRM, "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert proc.stderr.strip() == ""


def test_validate_table(corpus: Path, tmp_path: Path, dlrm_expected: dict):
    proc = run_cli(["validate", corpus / DLRM, "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    for name in dlrm_expected:
        assert name in proc.stdout, f"{name} missing from the validate table"
    for _, _, n_events in dlrm_expected.values():
        assert f"{n_events:,}" in proc.stdout or str(n_events) in proc.stdout


def test_validate_json_with_a_bad_file(corpus: Path, tmp_path: Path, dlrm_expected: dict):
    job = tmp_path / "job"
    copy_files(corpus_files(corpus, DLRM), job)
    (job / "broken.pt.trace.json").write_text('{"traceEvents": [')
    proc = run_cli(["validate", job, "--json", "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["schema"] == "rankscope.validate/1"
    rows = {Path(r["file"]).name: r for r in out["files"]}
    for name, (rank, _, n_events) in dlrm_expected.items():
        assert rows[name]["ok"] is True and rows[name]["rank"] == rank and rows[name]["events"] == n_events
    assert rows["broken.pt.trace.json"]["ok"] is False and rows["broken.pt.trace.json"]["problems"]
    lines = [ln for ln in proc.stderr.splitlines() if "broken.pt.trace.json" in ln]
    assert len(lines) == 1 and lines[0].startswith("rankscope: ")


def test_analyze_without_arguments_is_a_usage_error(tmp_path: Path):
    proc = run_cli(["analyze"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2
    assert "Usage" in proc.stderr
    assert proc.stdout == ""


def test_validate_without_arguments_is_a_usage_error(tmp_path: Path):
    proc = run_cli(["validate"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2 and "Usage" in proc.stderr


def test_unknown_option_is_a_usage_error(corpus: Path, tmp_path: Path):
    proc = run_cli(["analyze", corpus / DLRM, "--no-such-option"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2 and "Usage" in proc.stderr


def _stderr_on_a_terminal(args: list, tmp_path: Path, quiet: bool = False) -> tuple[int, bytes, str]:
    """Run `rankscope ARGS` with stderr on a pseudo-terminal: (exit code, what stderr showed, stdout)."""
    import os
    import pty
    import select
    import subprocess
    from conftest import rankscope_cmd
    master, slave = pty.openpty()
    env = dict(os.environ, RANKSCOPE_CACHE_DIR=str(tmp_path / "default-cache"), COLUMNS="250")
    from rankscope.cli.common import _FORCE_TERMINAL
    for v in _FORCE_TERMINAL:
        env.pop(v, None)
    stdout = tmp_path / "stdout.json"             # a file: a full pipe would stop the run
    with stdout.open("wb") as f:
        proc = subprocess.Popen(rankscope_cmd() + [str(a) for a in args] + (["--quiet"] if quiet else []),
                                stdout=f, stderr=slave, env=env)
    os.close(slave)
    shown = b""
    while select.select([master], [], [], 60)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:                      # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, shown, stdout.read_text()


def test_progress_bar_only_on_a_terminal(corpus: Path, tmp_path: Path):
    """On a terminal, stderr shows the progress bar while the ranks are analysed; with --quiet, or
    when stderr is a pipe, nothing but the report (stdout the same JSON in every case)."""
    job = tmp_path / "job"
    copy_files(corpus_files(corpus, DLRM), job)
    args = ["analyze", job, "--json", "--no-cache"]
    rc, shown, out = _stderr_on_a_terminal(args, tmp_path)
    assert rc == 0 and b"analysing ranks" in shown
    rc, shown, quiet_out = _stderr_on_a_terminal(args, tmp_path, quiet=True)
    assert rc == 0 and b"analysing ranks" not in shown
    piped = run_cli(args, tmp_path)
    assert piped.returncode == 0 and "analysing ranks" not in piped.stderr
    steps = [[r["step_time_ms"] for r in json.loads(text)["ranks"]] for text in (out, quiet_out, piped.stdout)]
    assert steps[0] == steps[1] == steps[2] and len(steps[0]) == 8


OPENBLAS_CHECK = """
import os, sys
sys.argv = ["rankscope", "--version"]
import rankscope.__main__ as entry
assert "numpy" not in sys.modules          # else the setting would come too late
try:
    entry.run()
except SystemExit:
    pass
print(os.environ.get("OPENBLAS_NUM_THREADS"), "numpy" in sys.modules)
"""


@pytest.mark.parametrize("user_value,expected", [(None, "1"), ("3", "3")])
def test_the_command_line_gives_openblas_one_thread_unless_told(user_value, expected):
    """numpy's OpenBLAS starts a thread per core that spins for ~0.1 s of CPU (measured: importing
    numpy costs 0.15 s of user CPU by default, 0.05 s with one thread); the command line asks for
    one thread before numpy is imported, and keeps what the user set."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if user_value is not None:
        env["OPENBLAS_NUM_THREADS"] = user_value
    proc = subprocess.run([sys.executable, "-c", OPENBLAS_CHECK], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].split() == [expected, "True"]
