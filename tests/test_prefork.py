"""The local engine's worker process (`rankscope.prefork`): forked as the command line starts, it
takes ranks beside the threads, and the result never depends on it: same output, a lost worker's
rank analysed here, nothing left behind after a Ctrl-C.

Expected values: the items of a map and the process that ran each (os.getpid() in the task),
counted here; the output of the same command without the worker process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (assert_no_traceback, corpus_root, ctrl_c, linked_job, process_tree, reading, run_cli, start_cli,
                      wait_for)
from rankscope import prefork

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                                reason="the worker process is forked on Linux with two usable CPUs")

TASKS = '''
import os, time

def work(i):
    time.sleep(0.15)
    if os.environ.get("DIE_IN_WORKER") and os.getpid() != int(os.environ["DRIVER_PID"]):
        os.kill(os.getpid(), 9)           # the worker process dies in the middle of a task
    return i, os.getpid()
'''

MAP = '''
import json, os, sys
from rankscope import prefork
os.environ["DRIVER_PID"] = str(os.getpid())
prefork.start(["analyze", "job"])         # first, as the command line does
import tasks
from rankscope.engine import map_ranks
done = []
results = map_ranks(tasks.work, range(12), engine="local", workers=2, on_done=lambda i, r: done.append(i))
worker = prefork._worker
print(json.dumps({"results": results, "driver": os.getpid(), "worker": worker.pid, "lost": worker.lost,
                  "done": sorted(done)}))
'''


def _run(tmp_path: Path, script: str, **env: str) -> dict:
    """`script` run by a fresh interpreter beside the `tasks` module; the JSON it prints."""
    (tmp_path / "tasks.py").write_text(TASKS)
    (tmp_path / "script.py").write_text(script)
    proc = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_worker_process_takes_items_beside_the_threads(tmp_path: Path):
    out = _run(tmp_path, MAP)
    assert [i for i, _ in out["results"]] == list(range(12))        # every item, in item order
    assert out["done"] == list(range(12))                            # on_done once for each
    pids = {pid for _, pid in out["results"]}
    assert pids == {out["driver"], out["worker"]}, "both processes ran items"
    assert not out["lost"]


def test_a_lost_worker_process_leaves_its_item_and_the_rest_here(tmp_path: Path):
    out = _run(tmp_path, MAP, DIE_IN_WORKER="1")
    assert out["lost"]
    assert [i for i, _ in out["results"]] == list(range(12))
    assert {pid for _, pid in out["results"]} == {out["driver"]}     # the item it died on was run again here
    assert out["done"] == list(range(12))


UNUSED = '''
import json, os
from rankscope import prefork
prefork.start(["analyze", "job"])
import tasks
from rankscope.engine import map_ranks
pid = prefork.worker().pid
map_ranks(tasks.work, [0], engine="local", workers=2)          # one item: nothing to share
try:
    os.kill(pid, 0)
    alive = True
except ProcessLookupError:
    alive = False
print(json.dumps({"usable": prefork.worker() is not None, "alive": alive}))
'''


def test_a_map_that_cannot_use_the_worker_process_ends_it(tmp_path: Path):
    assert _run(tmp_path, UNUSED) == {"usable": False, "alive": False}


@pytest.mark.parametrize("argv, wanted", [
    (["analyze", "job"], True),
    (["diff", "a", "b"], True),
    (["mfu", "job"], True),
    (["analyze", "job", "--engine", "local", "--workers", "4"], True),
    (["analyze", "job", "--engine=auto"], True),
    (["validate", "job"], False),                     # parses only: threads hardly contend
    (["analyze", "job", "--engine", "processes"], False),
    (["analyze", "job", "--engine=ray"], False),
    (["analyze", "job", "--address", "auto"], False),
    (["analyze", "job", "--workers", "1"], False),
    (["analyze", "--help"], False),
    (["analyze", "--demo"], False),
    ([], False),
])
def test_which_command_lines_fork_it(argv: list[str], wanted: bool):
    assert prefork.wanted(argv) is wanted


def test_one_trace_file_is_not_worth_a_worker_process(tmp_path: Path):
    one, log = tmp_path / "rank0.pt.trace.json", tmp_path / "nccl.log"
    one.write_text("{}")
    log.write_text("")
    assert not prefork.wanted(["analyze", str(one), "--nccl-log", str(log), "--cache-dir", str(tmp_path)])
    assert prefork.wanted(["analyze", str(one), str(one)])
    assert prefork.wanted(["analyze", str(tmp_path)])


def test_the_value_options_are_those_of_the_commands():
    """`wanted` skips the word after each option that takes a value: the list must be complete."""
    import click

    from rankscope.cli import main
    taking = {o for c in prefork.COMMANDS for p in main.commands[c].params
              if isinstance(p, click.Option) and not p.is_flag for o in p.opts}
    assert taking == prefork._VALUE_OPTIONS


def test_analyze_says_the_same_with_and_without_the_worker_process(corpus, tmp_path: Path):
    args = ["analyze", corpus_root() / "cpu-gloo-3d-pp2dp2tp2", "--engine", "local", "--workers", "2", "--no-cache",
            "--json"]
    runs = [run_cli(args, tmp_path, env={"RANKSCOPE_NO_WORKER_PROCESS": off}, timeout=300) for off in ("", "1")]
    for r in runs:
        assert r.returncode == 0, r.stderr
    with_worker, without = (json.loads(r.stdout) for r in runs)
    assert len(with_worker["ranks"]) == 8
    assert with_worker == without


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """48 plain-JSON files of ~8 MB (4 generated ranks, each linked 12 times): ~2 s of work."""
    return linked_job(tmp_path_factory.mktemp("prefork"), copies=12)


def _worker_reading(proc: subprocess.Popen, folder: Path) -> int | None:
    """The command line's worker process once it has a file of `folder` open (60 s at most). A rank
    file is open only while it is scanned (~10 ms of each ~50 ms rank here), so once the worker is
    known, only its open files are looked at, every millisecond: a poll of the whole process tree
    every 20 ms missed all of them in a run on a CI machine."""
    children: list[int] = []

    def forked() -> bool:
        children[:] = process_tree(proc.pid)[1:]
        return bool(children)

    if wait_for(proc, forked) and wait_for(proc, lambda: reading(children, folder), poll_s=0.001):
        return children[0]
    return None


def _group_gone(pgid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def test_analyze_says_the_same_when_its_worker_process_is_killed(job: Path, tmp_path: Path):
    args = ["analyze", job, "--engine", "local", "--workers", "2", "--no-cache", "--json"]
    reference = run_cli(args, tmp_path, env={"RANKSCOPE_NO_WORKER_PROCESS": "1"}, timeout=300)
    proc = start_cli(args)
    worker = _worker_reading(proc, job)
    assert worker is not None, "the worker process never read a rank"
    os.kill(worker, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert (proc.returncode, err) == (reference.returncode, reference.stderr)
    assert len(json.loads(out)["ranks"]) == len(json.loads(reference.stdout)["ranks"]) > 0
    assert json.loads(out) == json.loads(reference.stdout)


def test_ctrl_c_leaves_no_worker_process(job: Path):
    proc = start_cli(["analyze", job, "--workers", "2", "--no-cache", "-q"])
    assert _worker_reading(proc, job) is not None, "the worker process never read a rank"
    done = ctrl_c(proc)
    assert_no_traceback(done)
    assert done.returncode == 130 and done.stderr.strip() == "rankscope: interrupted"
    assert _group_gone(proc.pid), "a process of the command outlived it"
