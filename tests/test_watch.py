"""`rankscope watch`: a real subprocess following a folder that cycles are fed into one by one, a file
still being written, a vanished or truncated file, a cycle with a missing rank, a late file, Ctrl-C.

Independent sources: the corpus MANIFEST.md for cpu-gloo-2rank-cycles (cycles of steps 2-3, 6-7, 10-11;
rank 1 slow from step 8, so the first slow cycle is the third); what each test writes into the folder itself.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from pathlib import Path

from conftest import ctrl_c, start_cli
from rankscope.pipelines.watch import RunWatch, json_closes
from rankscope.thresholds import resolve

CYCLES = "cpu-gloo-2rank-cycles"


def cycle_files(corpus: Path) -> list[list[Path]]:
    """The corpus run's files by cycle: per rank sorted by the timestamp in the name (MANIFEST: one file
    per rank per cycle, in order)."""
    by_rank = [sorted((corpus / CYCLES).glob(f"rank{r}.*.json")) for r in (0, 1)]
    return [list(pair) for pair in zip(*by_rank)]


class Lines:
    """A process's stdout read line by line in a thread (so a test can wait for the next one)."""

    def __init__(self, proc):
        self.q: queue.Queue = queue.Queue()

        def read():
            for line in proc.stdout:
                self.q.put(line)
            self.q.put(None)                 # the end of the output

        threading.Thread(target=read, daemon=True).start()

    def next(self, timeout: float = 60) -> str:
        return self.q.get(timeout=timeout)

    def rest(self) -> str:
        """Every line until the output ends."""
        lines = []
        while (line := self.next()) is not None:
            lines.append(line)
        return "".join(lines)

    def empty_for(self, seconds: float) -> bool:
        try:
            line = self.q.get(timeout=seconds)
        except queue.Empty:
            return True
        self.q.put(line)
        return False


def test_onset_reported_when_the_first_slow_cycle_lands_and_not_before(corpus, tmp_path):
    folder = tmp_path / "profiler"
    folder.mkdir()
    env = dict(os.environ, RANKSCOPE_CACHE_DIR=str(tmp_path / "cache"))
    proc = start_cli(["watch", folder, "--json", "--interval", "0.2", "--settle", "60", "--stop-after-idle", "6"],
                     env=env)
    lines = Lines(proc)
    try:
        seen = []
        for i, files in enumerate(cycle_files(corpus), start=1):
            assert lines.empty_for(1.0)                  # nothing before the cycle's files land
            for f in files:
                shutil.copy(f, folder / f.name)
            row = json.loads(lines.next())
            seen.append(row)
            assert row["cycle"]["cycle"] == i and row["cycle"]["ranks"] == [0, 1]
            slow = [c for c in row["changes"] if c["kind"] == "slowdown"]
            if i < 3:
                assert slow == [], row                   # not before the first slow cycle
            else:
                assert [(c["rank"], c["first_step"], c["first_cycle"], c["cause"]) for c in slow] == \
                    [(1, 10, 3, "idle_other")]
        final = json.loads(lines.next())                 # after 6 s without a new file: the run report
        assert final["schema"] == "rankscope.analysis/1" and len(final["run"]["cycles"]) == 3
        assert "slowdown_onset" in [f["id"] for f in final["findings"]]
        proc.wait(timeout=60)
        assert proc.returncode == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_ends_with_the_run_report(corpus, tmp_path):
    folder = tmp_path / "profiler"
    shutil.copytree(corpus / CYCLES, folder)
    env = dict(os.environ, RANKSCOPE_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="100")
    proc = start_cli(["watch", folder, "--interval", "0.2", "--html", tmp_path / "live.html"], env=env)
    lines = Lines(proc)
    first = [lines.next() for _ in range(3)]             # one line per cycle
    assert [ln.split(" (")[0] for ln in first] == ["cycle 1", "cycle 2", "cycle 3"]
    assert "slowdown: rank 1" in first[2] and "slowdown" not in first[0] + first[1]
    proc.stdout = None                                   # the reader thread keeps what follows
    done = ctrl_c(proc)
    out = lines.rest()
    assert done.returncode == 0
    assert "Traceback" not in done.stderr + out
    assert "Run: 3 profiler cycles" in out and "slowdown_onset" in out
    assert (tmp_path / "live.html").read_text().count('id="run"') == 1


def _watch(folder: Path, clock: list[float], **kw) -> RunWatch:
    return RunWatch(folder, resolve(), use_cache=False, engine="inprocess", clock=lambda: clock[0], **kw)


def test_a_file_being_written_is_not_read_until_complete(corpus, tmp_path):
    """Half a file (as a writer leaves it mid-write) is not read while it grows; once whole and its JSON
    closes it is read at the next look; a gzip file waits for `stable_s` without a change."""
    folder = tmp_path / "p"
    folder.mkdir()
    clock = [0.0]
    w = _watch(folder, clock, stable_s=5, settle_s=100)
    try:
        src = cycle_files(corpus)[0]
        data = [f.read_bytes() for f in src]
        with open(folder / src[0].name, "wb") as f:
            f.write(data[0][: len(data[0]) // 2])
        for t in (1, 2, 3, 4):                   # unchanged, but the JSON does not close and 5 s have not passed
            clock[0] = t
            assert w.poll() == [] and w.status().files_read == 0
        with open(folder / src[0].name, "ab") as f:
            f.write(data[0][len(data[0]) // 2:])
        (folder / src[1].name).write_bytes(data[1])
        clock[0] = 4.5
        assert w.poll() == [] and w.status().files_read == 0        # just changed: seen, not read
        clock[0] = 4.7
        done = w.poll()                          # unchanged since the last look and the JSON closes: read
        assert w.status().files_read == 2 and len(done) == 1 and done[0].report.run.cycles[0].steps == [2, 3]
        assert json_closes(str(folder / src[0].name))
        assert not json_closes(str(tmp_path / "missing.json"))
    finally:
        w.close()


def test_missing_rank_analysed_after_settle_vanished_and_truncated_files(corpus, tmp_path):
    folder = tmp_path / "p"
    folder.mkdir()
    clock = [0.0]
    w = _watch(folder, clock, stable_s=1, settle_s=10)
    cycles = cycle_files(corpus)
    try:
        shutil.copy(cycles[0][0], folder)        # cycle 1: rank 0 only
        gone = folder / "rank1.999.pt.trace.json.gz"
        gone.write_bytes(b"\x1f\x8b partial")    # seen once, then deleted before it is complete
        clock[0] = 0.5
        assert w.poll() == []
        gone.unlink()
        clock[0] = 2.0
        assert w.poll() == []                    # rank 0's file read; its cycle waits for rank 1
        clock[0] = 11.5
        assert w.poll() == []                    # 9.5 s since its file was read
        clock[0] = 12.5
        done = w.poll()                          # 10 s settle: analysed without rank 1, which is named
        assert len(done) == 1 and done[0].analysis.job.missing_ranks == [1]
        assert done[0].report.run.cycles[0].missing_ranks == [1]
        # a file of cycle 1 that arrives now is named and left out; a truncated cycle-2 file is salvaged
        shutil.copy(cycles[0][1], folder)
        shutil.copy(cycles[1][0], folder)
        cut = cycles[1][1].read_bytes()
        (folder / cycles[1][1].name).write_bytes(cut[: len(cut) * 2 // 3])
        clock[0] = 13.0
        w.poll()
        clock[0] = 15.0
        done = w.poll()
        assert len(done) == 1 and done[0].report.run.cycles[1].ranks == [0, 1]
        problems = {Path(p.file).name: p.problem for p in w.run.problems}
        assert "arrived after its cycle was analysed" in problems[cycles[0][1].name]
        assert cycles[1][1].name in problems                       # the cut file: salvaged, named
        assert "rank1.999.pt.trace.json.gz" not in problems        # vanished before it was complete: never read
    finally:
        w.close()


def test_file_names_that_are_not_utf8(corpus, tmp_path):
    """The run's files under names that start with the byte ff, which no UTF-8 decoder takes (a
    UnicodeEncodeError traceback at the first cycle's JSON line before): every cycle line and the run
    report name them with that byte as an escape, `\\xff` (render/format.py json_bytes); the HTML
    report is written and the 'wrote' line names its path."""
    from conftest import run_cli
    folder = tmp_path / "profiler"
    folder.mkdir()
    for f in [f for cycle in cycle_files(corpus) for f in cycle]:
        shutil.copy(f, os.path.join(os.fsencode(folder), b"\xff" + os.fsencode(f.name)))
    html = tmp_path / "live.html"
    proc = run_cli(["watch", folder, "--json", "--interval", "0.2", "--settle", "1", "--stable", "0.2",
                    "--stop-after-idle", "3", "--html", html], tmp_path, timeout=300)   # (stdout read as UTF-8)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    *cycles, final = [json.loads(line) for line in proc.stdout.splitlines()]
    shown = [[str(folder / ("\\xff" + f.name)) for f in cycle] for cycle in cycle_files(corpus)]
    assert [sorted(row["cycle"]["files"]) for row in cycles] == shown
    assert [r["file"] for r in final["ranks"]] == shown[-1]          # the last cycle, detailed
    assert f"wrote HTML report to {html}" in proc.stderr and html.is_file()
