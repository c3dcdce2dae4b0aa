"""Which files are traces and which rank each one is (ingest/discover.py, api.analyze).

Order of trust (discover.py docstring): distributedInfo.rank, then the file name, then the sorted
file order with a warning. Expected ranks come from the files' own distributedInfo (read with json)
or from the names the test gives the files.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import GLOO_HEALTHY, corpus_files, fresh_json, load_json, shared_cache_dir, write_trace
from rankscope import api
from rankscope.ingest.discover import assign_ranks, discover, rank_from_filename


def analyze_dir(d: Path) -> api.Analysis:
    return api.analyze(d, cache_dir=shared_cache_dir(), engine="inprocess")


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
    got = {Path(s.meta.file).name: s.rank for s in result.ranks}
    assert got == expected
    assert {s.meta.rank_source for s in result.ranks} == {"distributedInfo"}
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
    got = {Path(s.meta.file).name: (s.rank, s.meta.rank_source, s.meta.events_total) for s in result.ranks}
    assert got == {n: (r, "filename", events[n]) for n, r in names.items()}
    assert not [w for w in result.job.warnings if "order" in w]


def test_names_without_rank_are_numbered_by_order_with_a_warning(corpus: Path, tmp_path: Path):
    job = tmp_path / "job"
    job.mkdir()
    names = ["alpha.json", "bravo.json", "charlie.json", "delta.json"]
    for src, name in zip(reversed(_gloo(corpus)), names):
        _stripped(src, job / name)
    result = analyze_dir(job)
    got = {Path(s.meta.file).name: (s.rank, s.meta.rank_source) for s in result.ranks}
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
    got = {Path(s.meta.file).name: (s.rank, s.meta.rank_source) for s in result.ranks}
    assert got == {"x.json.gz": (0, "distributedInfo"), "rank-2.json": (2, "filename"),
                   "yyy.json": (1, "order"), "zzz.json": (3, "order")}
    assert [w for w in result.job.warnings if "order" in w]


def test_distributed_info_wins_over_the_file_name(corpus: Path, tmp_path: Path):
    src = _gloo(corpus)[1]
    r = _dist_rank(src)
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy2(src, job / f"rank{r + 2}.pt.trace.json.gz")
    (s,) = analyze_dir(job).ranks
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
