"""Whole runs (issue 31): every profiler cycle of a rank used, the run view, the changes and the finding
`slowdown_onset`.

Independent sources: the corpus MANIFEST.md for cpu-gloo-2rank-cycles (3 files per rank, cycles of steps
2-3, 6-7, 10-11; rank 1 sleeps 30 ms per step from step 8 on, outside any op, so the first profiled slow step
is #10 in cycle 3); tests/data/runs/*/ground_truth.json, written by make_runs.py from what it injected (which
ranks, from which step, where the time lands); the synthetic generator's run ground truth; hand-made trends
whose change the test itself puts in.
"""
from __future__ import annotations

import json
import math
import random
import re
import shutil
from pathlib import Path

import pytest

from conftest import assert_no_traceback, report_json, run_cli
from test_html import artifacts, browser  # noqa: F401  (fixtures: a real headless browser, screenshots)
from rankscope.analyses.run.changes import find_changes
from rankscope.api import analyze
from rankscope.ingest.cycles import CycleFile, cycles_in_names, group_cycles, run_cycles
from rankscope.analyses.run.cycles import TrendPoint
from rankscope.results.run import RunCycle
from rankscope.thresholds import resolve

CYCLES = "cpu-gloo-2rank-cycles"
DATA = Path(__file__).parent / "data" / "runs"
RUNS = sorted(p.name for p in DATA.iterdir() if (p / "ground_truth.json").is_file())


def truth(job: str) -> dict:
    return json.loads((DATA / job / "ground_truth.json").read_text())


@pytest.fixture(scope="module")
def corpus_run(corpus):
    return analyze(corpus / CYCLES, use_cache=False)


# ------------------------------------------------------------------------------------ the corpus run

def test_every_cycle_of_every_rank_is_used(corpus, corpus_run):
    """MANIFEST: 3 files per rank, one per cycle (steps 2-3, 6-7, 10-11); none is skipped as a duplicate."""
    run = corpus_run.run
    assert [c.steps for c in run.cycles] == [[2, 3], [6, 7], [10, 11]]
    used = sorted(Path(f).name for c in run.cycles for f in c.files)
    assert used == sorted(p.name for p in (corpus / CYCLES).iterdir() if p.name.endswith(".json"))
    assert all(c.ranks == [0, 1] and c.missing_ranks == [] for c in run.cycles)
    assert not [p for p in corpus_run.problems if "claims rank" in p.problem]
    # steps keep the profiler's numbers: the trend has each rank's 6 profiled steps
    assert sorted({(p.rank, p.step) for p in run.trend}) == [(r, s) for r in (0, 1) for s in (2, 3, 6, 7, 10, 11)]
    # the rest of the report details the last cycle
    assert run.detailed_cycle == 3 and corpus_run.job.steps == [10, 11]


def test_corpus_onset_named_with_rank_step_cycle_and_cause(corpus_run):
    """MANIFEST: rank 1 sleeps 30 ms per step from step 8 (outside any op: idle_other); the first profiled
    slow step is #10, cycle 3. The others wait for it: rank 1 becomes the straggler (host_idle) there."""
    slow = [c for c in corpus_run.run.changes if c.kind == "slowdown"]
    assert len(slow) == 1
    c = slow[0]
    assert (c.rank, c.first_step, c.first_cycle, c.cause) == (1, 10, 3, "idle_other")
    assert c.after_ms - c.before_ms == pytest.approx(30.0, rel=0.25)     # the injected 30 ms per step
    onsets = [(c.rank, c.first_cycle, c.cause) for c in corpus_run.run.changes if c.kind == "straggler_onset"]
    assert onsets == [(1, 3, "host_idle")]
    found = [f for f in corpus_run.findings if f.id == "slowdown_onset"]
    assert len(found) == 1 and found[0].ranks == [1] and found[0].steps == [10] and found[0].severity == "high"
    assert "step 10" in found[0].summary and found[0].fix


def test_run_json_validates_and_has_the_contract_shape(corpus_run):
    from test_findings import _schema_validator
    d = report_json(corpus_run)
    assert list(_schema_validator().iter_errors(d)) == []
    run = d["run"]
    assert set(run["cycles"][0]) >= {"cycle", "files", "steps", "step_ms_median", "straggler", "findings"}
    assert set(run["trend"][0]) >= {"rank", "step", "step_ms"}
    assert set(run["changes"][0]) >= {"kind", "rank", "first_step", "first_cycle", "before_ms", "after_ms", "cause"}
    d["run"]["changes"][0]["kind"] = "got_worse"            # the schema is not vacuous
    assert len(list(_schema_validator().iter_errors(d))) == 1


def test_one_cycle_has_no_run(corpus):
    a = analyze(corpus / "cpu-gloo-4rank-healthy", use_cache=False)
    assert a.run is None and report_json(a)["run"] is None


def test_same_rank_same_steps_is_still_named(corpus, tmp_path):
    """Two files of one rank with the same steps claim the rank twice: one is skipped, named."""
    src = corpus / CYCLES
    job = tmp_path / "job"
    shutil.copytree(src, job)
    first = sorted(job.glob("rank0.*"))[0]
    shutil.copy(first, job / f"rank0.copy{first.name[len('rank0'):]}")
    a = analyze(job, use_cache=False)
    claims = [p for p in a.problems if "claims rank 0" in p.problem]
    assert len(claims) == 1 and len(a.run.cycles) == 3


def test_names_without_cycles_still_make_a_run(corpus, tmp_path):
    """Files whose names do not look like cycles: the summaries already in memory are grouped."""
    job = tmp_path / "job"
    job.mkdir()
    for i, f in enumerate(sorted((corpus / CYCLES).iterdir())):
        shutil.copy(f, job / f"trace_{i}.json")
    assert not cycles_in_names(sorted(job.iterdir()))
    a = analyze(job, use_cache=False)
    assert [c.steps for c in a.run.cycles] == [[2, 3], [6, 7], [10, 11]]
    assert [(c.kind, c.rank, c.first_step) for c in a.run.changes if c.kind == "slowdown"] == [("slowdown", 1, 10)]


def test_cache_and_no_cache_agree(corpus, tmp_path):
    """The run read back from the cache (second run: every summary cached) is the run made without one."""
    cold = analyze(corpus / CYCLES, cache_dir=tmp_path / "c")
    warm = analyze(corpus / CYCLES, cache_dir=tmp_path / "c")
    none = analyze(corpus / CYCLES, use_cache=False)
    assert all(s.from_cache for s in warm.ranks)
    assert report_json(cold)["run"] == report_json(warm)["run"] == report_json(none)["run"]


# ----------------------------------------------------------------------- real captures of tests/data/runs

def test_all_runs_present():
    assert set(RUNS) == {"ddp3-rank2-sleeps", "ddp3-loader-degrades", "ddp3-healthy", "fsdp2-rank1-compute"}


@pytest.mark.parametrize("job", RUNS)
def test_real_run_changes_match_what_was_injected(job):
    t = truth(job)
    a = analyze(DATA / job, use_cache=False)
    run = a.run
    assert [c.steps for c in run.cycles] == [c["steps"] for c in t["cycles"]]
    assert [sorted(Path(f).name for f in c.files) for c in run.cycles] == [c["files"] for c in t["cycles"]]
    slowdowns = [(c.kind, c.rank, c.first_step, c.first_cycle, c.cause) for c in run.changes if c.kind == "slowdown"]
    expected = [(e["kind"], e["rank"], e["first_step"], e["first_cycle"], e["cause"]) for e in t["expected_changes"]]
    assert slowdowns == expected
    if not t["expected_changes"]:                      # the healthy run: no change of any kind
        assert run.changes == [] and not [f for f in a.findings if f.id == "slowdown_onset"]
    else:
        inj = t["injection"]
        change = next(c for c in run.changes if c.kind == "slowdown")
        assert change.ranks == inj["ranks"]            # the ranks whose own work moved: those injected
        onsets = [(c.rank, c.first_cycle, c.cause) for c in run.changes if c.kind == "straggler_onset"]
        if inj["straggler_cause"]:                     # one rank late: the others wait for it from then on
            assert onsets == [(inj["ranks"][0], inj["first_cycle"], inj["straggler_cause"])]
        assert [f.id for f in a.findings].count("slowdown_onset") == 1


# --------------------------------------------------------------------------------- synthetic runs

def test_synth_run_onset_matches_its_ground_truth(tmp_path):
    from rankscope.synth import parse_injection
    from rankscope.synth.runs import generate_run
    t = generate_run(tmp_path / "run", ranks=6, cycles=5, steps=2, seed=3, from_cycle=3,
                     injections=[parse_injection("straggler:rank=4,cause=host_idle,delay_ms=25")])
    a = analyze(tmp_path / "run", use_cache=False)
    got = [(c.kind, c.rank, c.first_step, c.first_cycle, c.cause) for c in a.run.changes
           if c.kind in ("slowdown", "straggler_onset")]
    assert got == [(e["kind"], e["rank"], e["first_step"], e["first_cycle"], e["cause"]) for e in t["expected_changes"]]
    assert [c.steps for c in a.run.cycles] == [c["steps"] for c in t["cycles"]]


def test_synth_healthy_run_has_no_change(tmp_path):
    from rankscope.synth.runs import generate_run
    generate_run(tmp_path / "run", ranks=4, cycles=6, steps=2, seed=11)
    assert analyze(tmp_path / "run", use_cache=False).run.changes == []


# ------------------------------------------------------------------------ the change detection itself

def _trend(values: dict[int, list[list[float]]], extra: dict | None = None) -> tuple[list, list]:
    """TrendPoints of per-rank, per-cycle step times (ms); the breakdown puts each step's time in compute,
    plus `extra[(rank, cycle)]` = (category index, ms) moved into that category."""
    points, cycles = [], []
    step = 2
    n_cycles = len(next(iter(values.values())))
    for c in range(n_cycles):
        steps = []
        for s in range(len(values[0][c])):
            for r, per_cycle in values.items():
                ms = per_cycle[c][s]
                parts = [ms, 0, 0, 0, 0, 0, 0, 0]
                if extra and (r, c + 1) in extra:
                    j, moved = extra[(r, c + 1)]
                    parts = [ms - moved, 0, 0, 0, 0, 0, 0, 0]
                    parts[j] += moved
                points.append(TrendPoint(r, step + s, c + 1, ms, parts))
            steps.append(step + s)
        cycles.append(RunCycle(c + 1, [], sorted(values), [], [], steps, 10.0, 10.0, None, []))
        step += 4
    return points, cycles


def _noisy(rng: random.Random, n_cycles: int, steps: int, level: float = 10.0, sd: float = 0.03) -> list[list[float]]:
    return [[level * math.exp(rng.gauss(0, sd)) for _ in range(steps)] for _ in range(n_cycles)]


def test_a_shift_put_in_is_found_at_its_step():
    """Rank 2 of 4 gets 40% slower from cycle 5 of 8, its extra time in dataloader (index 4); noise 3%."""
    rng = random.Random(7)
    values = {r: _noisy(rng, 8, 2) for r in range(4)}
    for c in range(4, 8):
        values[2][c] = [v * 1.4 for v in values[2][c]]
    extra = {(2, c): (4, values[2][c - 1][0] - values[2][c - 1][0] / 1.4) for c in range(5, 9)}
    points, cycles = _trend(values, extra)
    found = find_changes(points, cycles, [{}] * 8, resolve())
    assert [(c.kind, c.rank, c.first_step, c.first_cycle, c.cause) for c in found.changes] == \
        [("slowdown", 2, 18, 5, "dataloader")]
    assert found.noise_pct == pytest.approx(3.0, abs=1.5)


def test_pure_noise_and_one_outlier_step_are_no_change():
    """Noise only (3%), then the same with one step 3x slower: an outlier, not a change."""
    rng = random.Random(1)
    values = {r: _noisy(rng, 8, 2) for r in range(4)}
    points, cycles = _trend(values)
    assert find_changes(points, cycles, [{}] * 8, resolve()).changes == []
    values[1][7][1] *= 3.0
    points, cycles = _trend(values)
    assert find_changes(points, cycles, [{}] * 8, resolve()).changes == []


def test_every_rank_slower_is_one_change_of_the_job():
    rng = random.Random(5)
    values = {r: _noisy(rng, 6, 3) for r in range(6)}
    for r in values:
        for c in range(3, 6):
            values[r][c] = [v * 1.5 for v in values[r][c]]
    extra = {(r, c): (4, 5.0) for r in values for c in range(4, 7)}
    points, cycles = _trend(values, extra)
    changes = find_changes(points, cycles, [{}] * 6, resolve()).changes
    assert [(c.kind, c.rank, c.first_cycle, c.cause, c.ranks) for c in changes] == \
        [("slowdown", None, 4, "dataloader", list(range(6)))]


def test_min_pct_threshold_decides():
    """A 15% shift with tiny noise is a change at the default 10%, none at 20%."""
    rng = random.Random(2)
    values = {r: _noisy(rng, 6, 2, sd=0.005) for r in range(3)}
    for r in values:
        for c in range(3, 6):
            values[r][c] = [v * 1.15 for v in values[r][c]]
    points, cycles = _trend(values)
    assert len(find_changes(points, cycles, [{}] * 6, resolve()).changes) == 1
    assert find_changes(points, cycles, [{}] * 6, resolve({"run_change_min_pct": 20})).changes == []


# ----------------------------------------------------------------------------------- grouping files

def test_group_cycles_by_steps_then_by_time():
    files = [CycleFile("a0", (2, 3), (0, 10)), CycleFile("a1", (2, 3), (1, 11)),
             CycleFile("b0", (6, 7), (50, 60)), CycleFile("b1", (6, 7), (51, 61)),
             CycleFile("x0", (), (100, 120)), CycleFile("x1", (), (110, 130)), CycleFile("y0", (), (200, 210))]
    assert group_cycles(files) == [["a0", "a1"], ["b0", "b1"], ["x0", "x1"], ["y0"]]


def test_a_file_cut_before_its_first_step_joins_its_time_and_one_job_stays_one():
    """A salvaged file that lost its step marks lies in the time of the others' steps: their cycle. Files
    whose ranks appear in one group each are one job, whatever their steps."""
    files = [CycleFile("r0", (2, 3), (0, 10), 0), CycleFile("r1", (2, 3), (1, 11), 1), CycleFile("r2", (), (2, 5), 2)]
    assert group_cycles(files) == [["r0", "r1", "r2"]]
    odd = [CycleFile("r0", (2,), (0, 10), 0), CycleFile("r1", (3,), (20, 30), 1)]
    assert group_cycles(odd) == [["r0"], ["r1"]] and run_cycles(odd) == [["r0", "r1"]]
    run = odd + [CycleFile("r0b", (6,), (40, 50), 0)]
    assert run_cycles(run) == [["r0"], ["r1"], ["r0b"]]
    # two jobs (world sizes 8 and 128) whose rank 0 appears in both: one folder of two jobs, not a run
    two_jobs = [CycleFile("a0", (5,), (0, 10), 0, 8), CycleFile("b0", (9,), (20, 30), 0, 128)]
    assert run_cycles(two_jobs) == [["a0", "b0"]]


def test_cycles_in_names():
    assert cycles_in_names([Path("w1.17.pt.trace.json"), Path("w1.18.pt.trace.json")])
    assert cycles_in_names([Path("rank0_a.json"), Path("rank0_b.json")])
    assert not cycles_in_names([Path("rank0.17.pt.trace.json"), Path("rank1.17.pt.trace.json")])


# ------------------------------------------------------------------------------------- the CLI

def test_cli_analyze_run_section(corpus, tmp_path):
    proc = run_cli(["analyze", corpus / CYCLES, "--html", tmp_path / "r.html"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "run: 3 profiler cycles" in out and "Run: 3 profiler cycles" in out
    assert re.search(r"slowdown: rank 1 slower from step 10 \(cycle 3\)", out)
    page = (tmp_path / "r.html").read_text()
    assert 'id="run"' in page and "chart-run-trend" in page and "chart-run-heatmap" in page
    assert "claims rank" not in proc.stderr


def test_synth_cli_writes_cycles(tmp_path):
    proc = run_cli(["synth", tmp_path / "run", "--ranks", "3", "--cycles", "3", "--steps", "2",
                    "--inject", "straggler:rank=1,delay_ms=30", "--from-cycle", "3", "--no-gzip"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    t = json.loads((tmp_path / "run" / "ground_truth.json").read_text())
    assert [c["steps"] for c in t["cycles"]] == [[5, 6], [9, 10], [13, 14]]
    assert len(list((tmp_path / "run").glob("rank*.pt.trace.json"))) == 9
    assert t["expected_changes"][0] == {"kind": "slowdown", "rank": 1, "cause": "idle_other", "first_step": 13,
                                        "first_cycle": 3}


# ---------------------------------------------------------------------------------- HTML in a browser

def test_run_charts_draw_in_a_browser(browser, corpus_run, tmp_path, artifacts):
    """The run section's charts are drawn (real headless Chromium, network blocked): the line chart has the
    median and the slowest per cycle (3 cycles: MANIFEST), the heatmap one row per rank, the change is
    marked; nothing is fetched and no script error."""
    from test_html import _open
    page, charts, problems, outside = _open(browser, report_json(corpus_run), tmp_path, "run-cycles", artifacts)
    try:
        assert problems == [] and outside == []
        by_id = {c["id"]: c for c in charts}
        assert by_id["chart-run-trend"]["svg"] >= 1 and by_id["chart-run-heatmap"]["marks"] > 0
        trend = page.evaluate("document.getElementById('chart-run-trend').data.map(t => [t.name, t.y.length])")
        assert sorted(n for n, _ in trend) == ["median step ms", "slowest rank ms"] and {k for _, k in trend} == {3}
        assert page.evaluate("document.getElementById('chart-run-heatmap').data[0].y") == ["0", "1"]
        assert "slowdown" in page.text_content("#run .changes")
    finally:
        page.close()
