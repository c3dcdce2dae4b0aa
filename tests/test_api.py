"""The API and engines: same results whichever engine maps the ranks; the summary cache."""
from __future__ import annotations


import msgspec
import pytest

import rankscope
from rankscope.api import analyze
from rankscope.results.analysis import Inputs
from conftest import report_json


def _rounded(x):
    """Floats to 9 significant digits: polars' parallel sums may differ in the last bits."""
    if isinstance(x, float):
        return float(f"{x:.9g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def _comparable(a) -> dict:
    d = report_json(a)
    d.pop("engine")                 # which engine ran is all that differs
    for r in d["ranks"]:
        r.pop("from_cache")
    return _rounded(d)


@pytest.mark.parametrize("folder", ["param-dlrm-8rank", "cpu-gloo-4rank-straggler"])
def test_engines_agree(corpus, folder):
    results = [_comparable(analyze(corpus / folder, use_cache=False, engine=e, workers=2))
               for e in ("inprocess", "local", "processes")]
    assert results[0] == results[1] == results[2]
    assert results[0]["job"]["ranks"] == list(range(results[0]["job"]["world_size"]))


def test_summary_cache_hit_equals_fresh_and_follows_code(corpus, tmp_path, monkeypatch):
    folder = corpus / "param-dlrm-8rank"
    first = analyze(folder, cache_dir=tmp_path, engine="inprocess")
    second = analyze(folder, cache_dir=tmp_path, engine="inprocess")
    assert not any(s.from_cache for s in first.ranks) and all(s.from_cache for s in second.ranks)
    assert _comparable(first) == _comparable(second)
    # a change of the analysis code (its fingerprint) must not serve the old summary
    import rankscope.analyses
    monkeypatch.setattr(rankscope.analyses, "code_fingerprint", lambda: "another-version")
    third = analyze(folder, cache_dir=tmp_path, engine="inprocess")
    blobs = sorted(p.name for p in tmp_path.rglob("summary-*"))
    assert any("another-version" in b for b in blobs)
    assert _comparable(third) == _comparable(first)


def test_summary_cache_damaged_blob_is_recomputed(corpus, tmp_path):
    folder = corpus / "cpu-gloo-4rank-healthy"
    fresh = analyze(folder, cache_dir=tmp_path, engine="inprocess")
    for blob in tmp_path.rglob("summary-*"):
        blob.write_bytes(b"\x00garbage")
    again = analyze(folder, cache_dir=tmp_path, engine="inprocess")
    said = [str(p) for p in again.problems]                  # once for the 4 damaged blobs
    assert len(said) == 1 and "damaged" in said[0] and not again.skipped
    assert _comparable(msgspec.structs.replace(again, inputs=Inputs())) == _comparable(fresh)


def test_json_output_is_plain_json(corpus):
    d = report_json(analyze(corpus / "cpu-gloo-4rank-healthy", use_cache=False))
    assert msgspec.json.decode(msgspec.json.encode(d)) == d
    assert d["schema"] == "rankscope.analysis/1"
    for r in d["ranks"]:
        assert set(r["breakdown_ms"]) == {"compute", "comm_overlapped", "comm_exposed", "memcpy", "dataloader",
                                          "sync", "host", "idle_other"}
        assert sum(r["breakdown_ms"].values()) == pytest.approx(r["step_time_ms"]["mean"], rel=1e-3)


def test_lazy_job_loads_one_rank(corpus, tmp_path):
    job = rankscope.load(corpus / "param-dlrm-8rank", cache_dir=tmp_path)
    assert len(job) == 8
    trace = job.rank(3)
    assert trace.meta.rank == 3 and trace.meta.dist_rank == 3 and len(trace.events) > 0


def test_arriving_summaries_share_strings_and_keep_their_content(corpus):
    """What the driver does to each summary as it arrives (`pipelines.job._arrived`) changes how it is held,
    not what it says: the same plain data (msgpack, collectives aside), with the strings every rank
    repeats held once, and the collectives' arrays owning their memory."""
    import copy

    import numpy as np

    from rankscope.pipelines.job import _arrived, _rank_task, _Task
    files = sorted((corpus / "param-dlrm-8rank").glob("*.json.gz"))[:2]
    summaries = [_rank_task(_Task(str(f), None, False)) for f in files]
    for s in summaries:
        s.collectives.start_ns = np.frombuffer(s.collectives.start_ns.tobytes(), dtype=np.int64)  # a view, as Ray's
    before = [copy.deepcopy(s) for s in summaries]
    strings: dict[str, str] = {}
    for s in summaries:
        _arrived(s, strings)
    for s, b in zip(summaries, before):
        assert np.array_equal(s.collectives.start_ns, b.collectives.start_ns) and s.collectives.start_ns.base is None
        s.collectives = b.collectives = None
        assert msgspec.msgpack.encode(s) == msgspec.msgpack.encode(b)
    names = [s.summary.kernels.stats.kernels.name for s in summaries]
    same = set(names[0]) & set(names[1])
    assert same and all(any(x is y for y in names[1]) for x in names[0] if x in same)
