"""Views that scale (issue 32): a large job's report still names the rank that matters.

A synthetic 64-rank job (4 times the rows a per-rank table shows) with one straggler the generator
injected (rank 37, host_idle, 30 ms per step: its ground truth). Expected values: the injected rank,
and the generator's host names (node000, node001, ...: GPUS_PER_NODE ranks per host). The 256- and 4,096-rank runs of
the same checks are `benchmarks/bench_scale_views.py` (too slow to make and analyse in CI).
"""
from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from rich.table import Table

from rankscope.api import analyze
from rankscope.render.base import render
from rankscope.render.rank_rows import host_list, pick, rank_list
from rankscope.synth import generate_job, parse_injection
from rankscope.synth.constants import GPUS_PER_NODE

STRAGGLER = 37


class _Piped(Console):
    """The console of a piped run (80 columns, no colour) that keeps the tables it prints."""

    def __init__(self) -> None:
        super().__init__(width=80, file=io.StringIO(), color_system=None, record=True)
        self.tables: list[Table] = []

    def print(self, *objects, **options) -> None:
        self.tables += [o for o in objects if isinstance(o, Table)]
        super().print(*objects, **options)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks64")
    truth = generate_job(out, ranks=64, steps=3, seed=5, gzip=False, scale=0.25,
                         injections=[parse_injection(f"straggler:rank={STRAGGLER},cause=host_idle,delay_ms=30")])
    return out, truth


@pytest.fixture(scope="module")
def piped(job):
    console = _Piped()
    render(analyze(job[0], use_cache=False, engine="local"), "terminal", console)
    return console


def test_every_per_rank_table_shows_the_straggler_first(piped):
    per_rank = [t for t in piped.tables if t.columns and t.columns[0].header == "rank"]
    assert len(per_rank) >= 3
    for t in per_rank:
        ranks = [int(c) for c in t.columns[0].cells]
        assert 0 < len(ranks) <= 16 and ranks[0] == STRAGGLER, t.title


def test_piped_lines_fit_80_columns_and_lists_one_line(piped, job):
    text = piped.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    # the generator names rank r's host node{r // GPUS_PER_NODE:03d}
    last = (64 - 1) // GPUS_PER_NODE
    assert f"hosts: node[000-{last:03d}]" in text
    assert not re.search(r"(\d+, ){8}", text), "a list of ranks not compressed to ranges"
    assert re.search(r"\d+ more: mean step min [\d.]+ / median [\d.]+ / max [\d.]+ ms", text)


def test_rank_and_host_lists_compress():
    """Hand-made lists: ranges, a stride, a count; host names sharing a prefix."""
    assert rank_list(list(range(128))) == "0-127"
    assert rank_list(list(range(0, 4096, 8))) == "0-4088/8"
    assert rank_list([1, 5, 9, 30, 31, 77, 100, 200, 300, 400, 500, 600, 700]).startswith("13 ranks: 1, 5, 9, 30")
    assert host_list([f"node{i:03d}" for i in range(32)]) == "node[000-031]"
    assert host_list(["a", "node001", "node002", "node007"]) == "a, node[001-002,007]"


def test_pick_puts_named_ranks_first_then_outliers():
    """16 rows of 100 (median 10): named 42 and 7 first, then the values farthest from the median (rank
    99: -40, 50 away; rank 3: 50, 40 away), the rest left out."""
    values = {r: 10.0 for r in range(100)} | {3: 50.0, 99: -40.0}
    shown, rest = pick(list(range(100)), values.get, named=[42, 7], limit=16)
    assert shown[:4] == [42, 7, 99, 3] and len(shown) == 16 and len(rest) == 84
    assert pick([1, 2], values.get, named=[2]) == ([1, 2], [])


def test_export_perfetto_picks_ranks_and_steps(corpus, tmp_path):
    """cpu-gloo-4rank-straggler (4 ranks, steps 2-5): --ranks 0-1,3 --steps 3-4 writes ranks 0, 1 and 3
    only, and every slice overlaps that rank's steps 3-4 (its own 'steps' track gives their windows)."""
    from conftest import corpus_root, run_cli
    out = tmp_path / "job.json"
    proc = run_cli(["export", "perfetto", corpus_root() / "cpu-gloo-4rank-straggler", "-o", out, "--ranks", "0-1,3",
                    "--steps", "3-4", "--no-cache", "-q"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    events = json.loads(out.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1, 3}
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    for pid in (0, 1, 3):
        steps = [e for e in events if e.get("ph") == "X" and e["pid"] == pid
                 and tracks[(pid, e["tid"])].endswith("/ steps")]
        assert sorted(e["name"] for e in steps) == ["step 3", "step 4"]
        lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
        slices = [e for e in events if e.get("ph") == "X" and e["pid"] == pid]
        assert slices and all(e["ts"] < hi and e["ts"] + e["dur"] > lo for e in slices)
    bad = run_cli(["export", "perfetto", corpus_root() / "cpu-gloo-4rank-straggler", "-o", out, "--ranks", "3-1"],
                  tmp_path)
    assert bad.returncode == 2 and "'3-1' is not a range from low to high" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_export_size_estimate_is_the_written_size(corpus, tmp_path):
    """The estimate (first rank's JSON x ranks, said before the rest is written) against the file written:
    the 4 ranks of cpu-gloo-4rank-straggler run the same code, so within 25%."""
    from conftest import corpus_root
    from rankscope.api import export_perfetto
    said = []
    result = export_perfetto(corpus_root() / "cpu-gloo-4rank-straggler", tmp_path / "job.json", use_cache=False,
                             on_estimate=lambda size, ranks: said.append((size, ranks)))
    assert len(said) == 1 and said[0][1] == 4
    assert said[0][0] == pytest.approx(result.size_bytes, rel=0.25)


def _blown_up(report: dict, n: int) -> dict:
    """A real job's report with its rank entries repeated up to n ranks (new rank ids; the analysed ranks
    keep theirs): the size a 4,096-rank job gives the HTML page."""
    big = dict(report)
    base = report["ranks"]
    big["ranks"] = base + [dict(base[r % len(base)], rank=r) for r in range(len(base), n)]
    by_rank = [s for s in report["steps"]]
    big["steps"] = by_rank + [dict(s, rank=r) for r in range(len(base), n) for s in by_rank if s["rank"] == 0]
    big["job"] = dict(report["job"], ranks=list(range(n)), world_size=n)
    return big


def test_html_at_4096_ranks_renders_in_a_browser_with_the_straggler_lane_labelled(job, tmp_path):
    """The 64-rank job's report blown up to 4,096 ranks: Chromium draws every chart without an error, the
    swimlanes label the injected straggler's lane, the distribution marks it, the evidence tables hold no
    per-rank list of thousands. (The time it takes: benchmarks/bench_scale_views.py.)"""
    import shutil
    from playwright.sync_api import sync_playwright
    from rankscope.render.html import render_html
    from conftest import as_report, report_json
    report = report_json(analyze(job[0], use_cache=False, engine="local"))
    page_html = render_html(as_report(_blown_up(report, 4096)))
    assert len(page_html) < 30_000_000
    path = tmp_path / "big.html"
    path.write_text(page_html, encoding="utf-8")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"))
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        problems = []
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_function("Array.from(document.querySelectorAll('.chart')).every(d => d.querySelector("
                               "'.main-svg'))", timeout=60_000)
        ticks = page.evaluate("Array.from(document.querySelectorAll('#chart-swimlane-0 .ytick text'))"
                              ".map(t => t.textContent)")
        marked = page.evaluate("Array.from(document.querySelectorAll('#chart-distribution .textpoint text'))"
                               ".map(t => t.textContent)")
        page.screenshot(path=str(tmp_path / "big.png"))
        browser.close()
    assert problems == []
    assert f"rank {STRAGGLER} (straggler)" in ticks and len(ticks) <= 24
    assert f"rank {STRAGGLER}" in marked
