"""Which files are traces and which rank each one is (ingest/discover.py, api.analyze).

Order of trust (discover.py docstring): distributedInfo.rank, then the file name, then the sorted
file order with a warning. Expected ranks come from the files' own distributedInfo (read with json)
or from the names the test gives the files.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import (GLOO_HEALTHY, assert_no_traceback, copy_files, corpus_files, fresh_json, load_json, run_cli,
                      shared_cache_dir, write_trace)
from rankscope import api
from rankscope.ingest.discover import assign_ranks, discover, rank_from_filename
from rankscope.pipelines.run import analyze_cycles


def analyze_dir(d: Path) -> api.Analysis:
    return analyze_cycles(d, cache_dir=shared_cache_dir(), engine="inprocess")


@pytest.mark.parametrize("name, rank", [
    ("foo_rank_3.json", 3),
    ("rank-2.json", 2),
    ("worker1.pt.trace.json", 1),
    ("rank0.json", 0),
    ("RANK7.json", 7),
    ("rank_03.json", 3),
    ("worker10.pt.trace.json.gz", 10),
    ("node1_rank3.json", 3),
    ("rank3of8.json", 3),
    # corpus names
    ("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 34),
    ("worker0_step_12.1694128201545.pt.trace.json.gz", 0),
    ("rank0.1795314552406548224.pt.trace.json.gz", 0),
    ("sampled_rank-1.json.gz", 1),
    ("profile_trace_rank_0.json.gz", 0),
    # no rank in the name
    ("host_12345.1623143089861.pt.trace.json", None),
    ("eager_trace.json.gz", None),
    ("control.json.gz", None),
    ("rank.json", None),
    ("ranking3.json", None),
    ("frank3.json", None),
    ("trace.json", None),
])
def test_rank_from_filename(name: str, rank):
    assert rank_from_filename(name) == rank
    assert rank_from_filename(Path("/some/dir") / name) == rank


def test_rank_from_filename_reads_the_name_not_the_folder():
    assert rank_from_filename(Path("rank5") / "trace.json") is None


def _gloo(corpus: Path) -> list[Path]:
    files = corpus_files(corpus, GLOO_HEALTHY)
    assert len(files) == 4
    return files


def _dist_rank(path: Path) -> int:
    return load_json(path)["distributedInfo"]["rank"]


def test_renamed_files_keep_ranks_from_distributed_info(corpus: Path, tmp_path: Path):
    """The 4 gloo ranks copied to names without rank info, in an order unlike their ranks."""
    job = tmp_path / "job"
    job.mkdir()
    names = ["d.json.gz", "b.json.gz", "a.json.gz", "c.json.gz"]
    expected = {}
    for src, name in zip(_gloo(corpus), names):
        shutil.copy2(src, job / name)
        expected[name] = _dist_rank(src)
    assert sorted(expected.values()) == [0, 1, 2, 3]
    result = analyze_dir(job)
    got = {Path(s.meta.file).name: s.rank for s in result.summaries}
    assert got == expected
    assert {s.meta.rank_source for s in result.summaries} == {"distributedInfo"}
    assert not [w for w in result.job.warnings if "order" in w]
    assert result.job.world_size == 4 and result.job.missing_ranks == []


def _stripped(src: Path, dst: Path) -> int:
    """Write src without distributedInfo as plain JSON; return its number of traceEvents."""
    doc = fresh_json(src)
    doc.pop("distributedInfo")
    write_trace(dst, doc)
    return len(doc["traceEvents"])


def test_ranks_from_file_names_without_distributed_info(corpus: Path, tmp_path: Path):
    """distributedInfo removed; the content of rank i goes to a name saying another rank, so only
    the name can give the expected rank. Files are told apart by their event counts."""
    job = tmp_path / "job"
    job.mkdir()
    names = {"foo_rank_3.json": 3, "rank-2.json": 2, "worker1.pt.trace.json": 1, "rank0.json": 0}
    events = {}
    for src, name in zip(_gloo(corpus), names):
        events[name] = _stripped(src, job / name)
    result = analyze_dir(job)
    got = {Path(s.meta.file).name: (s.rank, s.meta.rank_source, s.meta.events_total) for s in result.summaries}
    assert got == {n: (r, "filename", events[n]) for n, r in names.items()}
    assert not [w for w in result.job.warnings if "order" in w]


def test_names_without_rank_are_numbered_by_order_with_a_warning(corpus: Path, tmp_path: Path):
    job = tmp_path / "job"
    job.mkdir()
    names = ["alpha.json", "bravo.json", "charlie.json", "delta.json"]
    for src, name in zip(reversed(_gloo(corpus)), names):
        _stripped(src, job / name)
    result = analyze_dir(job)
    got = {Path(s.meta.file).name: (s.rank, s.meta.rank_source) for s in result.summaries}
    assert got == {n: (i, "order") for i, n in enumerate(names)}
    (warning,) = [w for w in result.job.warnings if "order" in w]
    assert "\n" not in warning and all(n in warning for n in names)


def test_mixed_sources_fill_free_ranks(corpus: Path, tmp_path: Path):
    """x.json keeps distributedInfo (rank from json), rank-2.json says 2, the two others get the
    lowest free ranks in file order."""
    files = _gloo(corpus)
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy2(files[0], job / "x.json.gz")
    r0 = _dist_rank(files[0])
    assert r0 == 0
    _stripped(files[1], job / "rank-2.json")
    _stripped(files[2], job / "yyy.json")
    _stripped(files[3], job / "zzz.json")
    result = analyze_dir(job)
    got = {Path(s.meta.file).name: (s.rank, s.meta.rank_source) for s in result.summaries}
    assert got == {"x.json.gz": (0, "distributedInfo"), "rank-2.json": (2, "filename"),
                   "yyy.json": (1, "order"), "zzz.json": (3, "order")}
    assert [w for w in result.job.warnings if "order" in w]


def test_distributed_info_wins_over_the_file_name(corpus: Path, tmp_path: Path):
    src = _gloo(corpus)[1]
    r = _dist_rank(src)
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy2(src, job / f"rank{r + 2}.pt.trace.json.gz")
    (s,) = analyze_dir(job).summaries
    assert (s.rank, s.meta.rank_source) == (r, "distributedInfo")


# ----------------------------------------------------------------------------------------------
def test_discover_top_level_first_then_recursive(tmp_path: Path):
    top = tmp_path / "top"
    (top / "sub").mkdir(parents=True)
    (top / "a.pt.trace.json").write_text("{}")
    (top / "sub" / "b.pt.trace.json").write_text("{}")
    (top / "notes.txt").write_text("x")
    (top / ".hidden").write_text("x")
    d = discover([top])
    assert [p.name for p in d.traces] == ["a.pt.trace.json"]
    assert [(p.name, "not a trace" in why) for p, why in d.ignored] == [("notes.txt", True)]

    nested = tmp_path / "nested"
    (nested / "plugins" / "profile").mkdir(parents=True)
    for i in range(2):
        (nested / "plugins" / "profile" / f"rank{i}.pt.trace.json.gz").write_bytes(b"")
    d = discover([nested])
    assert sorted(p.name for p in d.traces) == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]


def test_discover_dedups_and_reports_missing_paths(tmp_path: Path):
    d0 = tmp_path / "job"
    d0.mkdir()
    f = d0 / "rank0.pt.trace.json"
    f.write_text("{}")
    d = discover([d0, f, str(f), tmp_path / "nope"])
    assert d.traces == [f.resolve()]
    assert [(p.name, why) for p, why in d.ignored] == [("nope", "no such file or folder")]


def test_assign_ranks_duplicates_keep_the_first():
    kept, warnings, skipped = assign_ranks(["/j/a.json", "/j/b.json", "/j/rank1.json"], [0, 0, None])
    assert [(k.file, k.rank, k.source) for k in kept] == [("/j/a.json", 0, "distributedInfo"),
                                                          ("/j/rank1.json", 1, "filename")]
    assert warnings == []
    ((file, why),) = skipped
    assert file == "/j/b.json" and "rank 0" in why and "a.json" in why and "\n" not in why


# ----------------------------------------------------------------------------------------------
# What is named like a trace but is no regular file: one line each, exit 1, never a hang
def _hostile(job: Path) -> dict[str, str]:
    """Beside the traces in `job`: a symlink to itself, a FIFO, a folder and a broken symlink, each
    named like a trace. Returns name -> the reason expected for it."""
    loop = job / "rank4.pt.trace.json"
    loop.symlink_to(loop.name)
    os.mkfifo(job / "rank5.pt.trace.json")
    (job / "rank0.pt.trace.json").mkdir()
    (job / "rank6.pt.trace.json").symlink_to("gone.pt.trace.json")
    return {"rank0.pt.trace.json": "not a trace file but a folder: skipped",
            "rank4.pt.trace.json": "symlink loop: skipped",
            "rank5.pt.trace.json": "not a trace file but a FIFO: skipped",
            "rank6.pt.trace.json": "broken symlink: skipped"}


def test_discover_names_what_is_not_a_regular_file(corpus: Path, tmp_path: Path):
    good = copy_files(corpus_files(corpus, GLOO_HEALTHY), tmp_path / "job")
    expected = _hostile(tmp_path / "job")
    d = discover([tmp_path / "job"])
    assert d.traces == [g.resolve() for g in good]
    assert {p.name: why for p, why in d.skipped} == expected
    fifo = tmp_path / "job" / "rank5.pt.trace.json"
    assert discover([fifo]).skipped == [(fifo, "not a trace file but a FIFO: skipped")]


def test_cli_skips_them_with_a_line_each_and_exit_1(corpus: Path, tmp_path: Path):
    """The 4 real ranks are analysed; each hostile entry gets one stderr line naming it and why,
    the exit code is 1 (input skipped), and the run ends (the FIFO is never opened: a read would
    wait for a writer forever; the subprocess has a timeout)."""
    job = tmp_path / "job"
    copy_files(corpus_files(corpus, GLOO_HEALTHY), job)
    expected = _hostile(job)
    proc = run_cli(["analyze", job, "--no-cache", "-q", "--json", "--engine", "inprocess"], tmp_path, timeout=120)
    assert_no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["job"]["ranks"] == [0, 1, 2, 3]
    lines = proc.stderr.splitlines()
    for name, why in expected.items():
        assert f"rankscope: {job / name}: {why}" in lines, proc.stderr


def test_unreadable_subfolder_is_named(corpus: Path, tmp_path: Path):
    """No trace at the top, so subfolders are searched: traces in a/ are found, the folder that
    cannot be listed is skipped with a line (its traces may be missing)."""
    top = tmp_path / "top"
    copy_files(corpus_files(corpus, GLOO_HEALTHY)[:2], top / "a")
    locked = top / "locked"
    copy_files(corpus_files(corpus, GLOO_HEALTHY)[2:], locked)
    locked.chmod(0)
    try:
        try:
            os.listdir(locked)
        except PermissionError:
            pass
        else:
            pytest.skip("a folder with mode 000 is still readable here (running as root): no unreadable folder")
        d = discover([top])
        assert [p.parent.name for p in d.traces] == ["a", "a"]
        assert d.skipped == [(locked, "cannot read this folder: Permission denied; traces in it are not analysed")]
        result = analyze_cycles(top, use_cache=False, engine="inprocess")
        assert [s.rank for s in result.summaries] == [0, 1] and [p.file for p in result.skipped] == [str(locked)]
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize("name, rank", [("rank99999999999.pt.trace.json", None), ("rank2147483647.json", 2**31 - 1),
                                        ("worker2147483648.json", None)])
def test_rank_from_filename_out_of_range(name: str, rank):
    assert rank_from_filename(name) == rank
