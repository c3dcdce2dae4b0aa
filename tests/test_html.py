"""The HTML report: `render.html.render_html` and `rankscope analyze --html`.

Independent sources: the embedded plotly.js is compared byte for byte with the plotly package's own
bundle (`plotly.offline.get_plotlyjs()`); rank counts come from the trace files in the corpus folder
(a plain listing, and `distributedInfo` read with json); hostile names are written into traces by
the test itself (tests/tracebuilder.py) or into a report dict by hand; the chart contents are read
back from a real browser (Debian's `chromium`, driven by playwright, network blocked).

The browser tests FAIL (never skip) without Chromium: CI must run them (`.ci/run` installs it).
Screenshots go to `$RANKSCOPE_ARTIFACTS` (default: the test's tmp_path).
"""
from __future__ import annotations

import copy
import html
import json
import os
import re
import shutil
from pathlib import Path

import plotly.offline
import msgspec
import pytest

import rankscope
from conftest import DLRM, GLOO_HEALTHY, as_report, assert_no_traceback, corpus_files, load_json, report_json, run_cli
from rankscope.render.html import MAX_BAR_RANKS, MAX_HEATMAP_RANKS, render_html
from rankscope.results import Analysis, Finding
from rankscope.results.analysis import InputNote, Inputs, StepTime
from rankscope.results.collectives import CollectiveGroupRow
from tracebuilder import TraceBuilder

GLOO_STRAGGLER = "cpu-gloo-4rank-straggler"
RESNET = "kineto-resnet50-workers0"

#: Names that would run script if they reached the page unescaped (each sets window.__pwned).
HOSTILE_KERNEL = "<script>window.__pwned=1</script>"
HOSTILE_OP = '</script><img src=x onerror="window.__pwned=2">'
HOSTILE_DEVICE = '"><svg onload=window.__pwned=3>'
HOSTILE_TYPE = "\u2028</script><script>window.__pwned=4</script>"
HOSTILE_EVIDENCE = "<img src=y onerror=window.__pwned=5>"
HOSTILE = [HOSTILE_KERNEL, HOSTILE_OP, HOSTILE_DEVICE, HOSTILE_TYPE, HOSTILE_EVIDENCE]

SECTIONS = ["job", "findings", "breakdown", "step-heatmap", "collectives", "overlap", "idle", "rank-detail",
            "kernels", "memory"]

#: Charts each corpus set must show, from what MANIFEST.md says the set holds: gloo = CPU only with
#: collectives and [memory] events (profile_memory); ResNet50 = one V100 rank, no collectives, [memory]
#: events; DLRM = 8 V100 ranks with NCCL collectives, no [memory] events.
CHARTS = {
    GLOO_STRAGGLER: {"chart-breakdown", "chart-distribution", "chart-step-heatmap", "chart-collective-skew",
                     "chart-rank-wait", "chart-overlap", "chart-idle-gaps", "chart-memory", "chart-swimlane-0",
                     "chart-swimlane-1"},
    RESNET: {"chart-breakdown", "chart-step-heatmap", "chart-idle-hta", "chart-idle-gaps", "chart-kernel-classes",
             "chart-memory"},
    # DLRM's one dimension is its sharded embeddings over the whole job (emb 8, issue 33): no layout section
    DLRM: {"chart-breakdown", "chart-distribution", "chart-step-heatmap", "chart-collective-skew", "chart-rank-wait",
           "chart-overlap", "chart-idle-hta", "chart-idle-gaps", "chart-kernel-classes", "chart-swimlane-0"},
}

FINDING = {"id": "straggler_rank", "severity": "medium", "ranks": [2], "steps": [3, 4, 5],
           "summary": "rank 2 is a straggler", "evidence": {"cost_ms_per_step": 42.7, "cause": "host_idle"},
           "explanation": "one late rank makes all others wait", "fix": "gc.freeze() after setup",
           "threshold": {"straggler_high_cost_pct": 10.0}}


@pytest.fixture(scope="module")
def reports(corpus: Path) -> dict[str, dict]:
    return {name: report_json(rankscope.analyze(str(corpus / name), use_cache=False))
            for name in (GLOO_STRAGGLER, RESNET, DLRM)}


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory) -> dict:
    """Two hand-written ranks whose kernel, op and device names are script injections, plus a finding,
    a collective type and an input warning with injections put into the report dict by hand."""
    folder = tmp_path_factory.mktemp("hostile")
    for rank in (0, 1):
        tb = (TraceBuilder(rank=rank, world_size=2).step(1, 0, 1000).op(HOSTILE_OP, 10, 50)
              .kernel(HOSTILE_KERNEL, 20, 100, 200).kernel(HOSTILE_OP, 30, 400, 100))
        for ts, nbytes in ((50, 1 << 20), (500, -(1 << 19))):
            tb.events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 100,
                              "tid": 100, "ts": ts, "args": {"Bytes": nbytes, "Device Type": 1, "Device Id": 0,
                                                             "Addr": 4096}})
        path = tb.write(folder / f"rank{rank}.pt.trace.json")
        doc = json.loads(path.read_text())
        doc["deviceProperties"][0]["name"] = HOSTILE_DEVICE
        path.write_text(json.dumps(doc))
    report = rankscope.analyze(str(folder), use_cache=False)
    row = CollectiveGroupRow(type=HOSTILE_TYPE, group_size=2, count=1, max_ranks=2, total_bytes=8, transfer_ms=0.1,
                             skew_mean_ms=0.2, skew_max_ms=0.3, algbw_gbps=None, busbw_mean_gbps=None,
                             most_often_last=None)
    return msgspec.structs.replace(
        report, findings=[Finding(**dict(FINDING, summary=HOSTILE_EVIDENCE, fix=HOSTILE_KERNEL,
                                         evidence={"detail": HOSTILE_EVIDENCE, HOSTILE_OP: 1.5}))],
        collectives=msgspec.structs.replace(report.collectives, by_type=[row]),
        inputs=Inputs(skipped=report.inputs.skipped, warnings=[InputNote(HOSTILE_OP, HOSTILE_TYPE)]))


def _figures(page: str) -> dict:
    """The chart specs the page hands to Plotly (its one application/json block)."""
    blocks = re.findall(r'<script type="application/json" id="rankscope-figures">(.*?)</script>', page, re.DOTALL)
    assert len(blocks) == 1
    return json.loads(blocks[0])


# ------------------------------------------------------------------------------------------ the string

def test_self_contained_plotly_embedded(reports):
    page = render_html(as_report(reports[DLRM]))
    plotly_js = plotly.offline.get_plotlyjs()
    assert plotly_js in page                                  # the package's bundle, inline, byte for byte
    ours = page.replace(plotly_js, "")                        # (plotly.js's own strings name URLs it never loads)
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=", ours, re.IGNORECASE)
    assert "http://" not in ours and "https://" not in ours
    assert ours.count("<script") == 3                         # plotly.js, the chart specs, the page's boot code


def test_all_sections_present_and_findings_line(reports):
    page = render_html(as_report(reports[GLOO_STRAGGLER]))
    for section in SECTIONS:
        assert f'id="{section}"' in page, section
    empty = render_html(as_report(dict(reports[GLOO_STRAGGLER], findings=[])))
    assert "No findings" in empty


def test_job_header_from_the_files(reports, corpus):
    """Ranks, world size and backend in the header equal the files' own distributedInfo (json)."""
    infos = [load_json(f)["distributedInfo"] for f in corpus_files(corpus, DLRM)]
    page = render_html(as_report(reports[DLRM]))
    header = page[page.index('<header id="job">'):page.index("</header>")]
    ranks = sorted(i["rank"] for i in infos)
    assert f"<td>{len(ranks)} ({ranks[0]}-{ranks[-1]})</td>" in header
    assert f"<td>{infos[0]['world_size']}</td>" in header
    assert f"<td>{infos[0]['backend']}</td>" in header


def test_findings_sorted_by_severity_with_all_fields(reports):
    findings = [Finding(**dict(FINDING, id="low_overlap", severity="low", summary="third")),
                Finding(**dict(FINDING, id="comm_bound", severity="high", summary="first")),
                Finding(**dict(FINDING, summary="second"))]
    page = render_html(msgspec.structs.replace(as_report(reports[GLOO_STRAGGLER]), findings=findings))
    order = [page.index(f'<article class="finding sev-{s}">') for s in ("high", "medium", "low")]
    assert order == sorted(order)
    medium = page[order[1]:order[2]]
    for text in ("second", "straggler_rank", "ranks 2", "steps 3-5", "cost_ms_per_step", "42.70", "host_idle",
                 "one late rank makes all others wait", "gc.freeze() after setup", "straggler_high_cost_pct = 10.00"):
        assert text in medium, text


def test_hostile_names_escaped(hostile_report):
    page = render_html(hostile_report)
    for name in HOSTILE:
        assert name not in page
    for fragment in ("<script>window", "<img src=x", "<img src=y", "<svg onload"):
        assert fragment not in page
    assert html.escape(HOSTILE_KERNEL) in page                # reached the top-kernels table, as text
    assert html.escape(HOSTILE_DEVICE) in page                # the device name in the header
    block = re.search(r'id="rankscope-figures">(.*?)</script>', page, re.DOTALL).group(1)
    assert "<" not in block and ">" not in block and "\u2028" not in block
    labels = _figures(page)["chart-collective-skew"]["variants"]["all"]["data"][0]["x"]
    assert labels == [html.escape(f"{HOSTILE_TYPE} (2 ranks)", quote=False)]   # plotly shows it as text


def _many_ranks(report: Analysis, n: int, straggler: int, slow: set[int]) -> Analysis:
    """`report` blown up to n ranks by hand: rank `straggler` is flagged, ranks in `slow` take 10x the
    step time, all others 1 ms."""
    replace = msgspec.structs.replace
    rank, stats, step = report.ranks[0], report.rank_stats[0], report.steps[0]
    return replace(
        report, job=replace(report.job, ranks=list(range(n)), world_size=n),
        ranks=[replace(rank, rank=r, step_time_ms=StepTime(10.0 if r in slow else 1.0, None, None)) for r in range(n)],
        steps=[replace(step, rank=r, step=s, duration_ms=1.0) for r in range(n) for s in (1, 2)],
        rank_stats=[replace(stats, rank=r, own_wait_ms_per_step=1.0, wait_imposed_ms_per_step=0.0) for r in range(n)],
        stragglers=[replace(report.stragglers[0], rank=straggler, cause="host_idle")])


def test_many_ranks_capped_and_said(reports):
    slow = set(range(1000, 1000 + 300))
    big = _many_ranks(as_report(reports[GLOO_STRAGGLER]), 4096, straggler=7, slow=slow)
    page = render_html(big)
    figures = _figures(page)
    bars = figures["chart-breakdown"]["variants"]["all"]["data"][0]["x"]
    # the ranks the report names (the straggler, findings about a few ranks, the critical path's), then the slow
    cp = big.critical_path
    named = {7} | {r for f in big.findings if len(f.ranks) <= 8 for r in f.ranks} | \
        {x.rank for x in cp.by_rank_category[:4]} | ({cp.owner} if cp.owner is not None else set())
    assert len(bars) == MAX_BAR_RANKS and "7" in bars
    assert {int(x) for x in bars} - named <= slow and bars == sorted(bars, key=int)
    rows = figures["chart-step-heatmap"]["variants"]["all"]["data"][0]["y"]
    assert len(rows) == MAX_HEATMAP_RANKS and {int(y) for y in rows} - named <= slow
    assert f"{MAX_BAR_RANKS} of 4096 ranks drawn" in page and f"{MAX_HEATMAP_RANKS} of 4096 ranks drawn" in page


def test_memory_timeline_in_json(reports, corpus):
    """The JSON extra ranks[].memory.timeline: the devices are those of the file's [memory] events
    (json: Device Type 0 = cpu, 1 = cuda:<Device Id>), at most 200 points each, times from 0 on."""
    doc = load_json(corpus_files(corpus, RESNET)[0])
    devices = {"cpu" if e["args"]["Device Type"] == 0 else f"cuda:{e['args']['Device Id']}"
               for e in doc["traceEvents"] if isinstance(e, dict) and e.get("name") == "[memory]"}
    timeline = reports[RESNET]["ranks"][0]["memory"]["timeline"]
    assert set(timeline["device"]) == devices == {"cpu", "cuda:0"}
    assert all(timeline["device"].count(d) <= 200 for d in devices)
    assert len(timeline["t_ms"]) == len(timeline["allocated_mb"]) == len(timeline["device"])
    assert min(timeline["t_ms"]) >= 0


def test_cli_html_with_json(corpus, tmp_path):
    out = tmp_path / "report.html"
    proc = run_cli(["analyze", corpus / GLOO_HEALTHY, "--html", out, "--json", "-q", "--cache-dir", tmp_path / "c"],
                   tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote HTML report to {out}" in proc.stderr.splitlines()
    assert json.loads(proc.stdout)["schema"] == "rankscope.analysis/1"
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and 'id="chart-breakdown"' in page


def test_cli_html_unwritable_one_line_error(corpus, tmp_path):
    target = tmp_path / "no-such-folder" / "report.html"
    proc = run_cli(["analyze", corpus / GLOO_HEALTHY, "--html", target, "-q", "--cache-dir", tmp_path / "c"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "HTML report" in line]
    assert len(errors) == 1 and str(target) in errors[0]


# ------------------------------------------------------------------------------------------ a real browser

@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Chromium not found: the HTML report is tested in a real headless browser. Install it with "
                    "`apt-get install chromium` (as root; .ci/run does this).", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright not installed: pip install '.[test]'", pytrace=False)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium)
        yield b
        b.close()


@pytest.fixture
def artifacts(tmp_path) -> Path:
    folder = Path(os.environ.get("RANKSCOPE_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


_CHART_STATE = """() => Array.from(document.querySelectorAll('.chart')).map(d => ({
    id: d.id,
    svg: d.querySelectorAll('.main-svg').length,
    marks: d.querySelectorAll('.main-svg .point, .main-svg .slice, .main-svg image, .main-svg .js-line').length,
    xticks: d.querySelectorAll('.xaxislayer-above .xtick').length}))"""


def _open(browser, report: dict | Analysis, tmp_path: Path, name: str, artifacts: Path):
    """Load the report (typed, or its --json data) from file:// with every other request aborted;
    return the page, its chart state, the problems the browser reported and the requests it tried to
    send out."""
    path = tmp_path / f"{name}.html"
    path.write_text(render_html(report if isinstance(report, Analysis) else as_report(report)), encoding="utf-8")
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    problems, outside = [], []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

    def route(r):
        if r.request.url.startswith("file:"):
            return r.continue_()
        outside.append(r.request.url)
        return r.abort()
    page.route("**/*", route)
    page.goto(path.as_uri())
    page.wait_for_function("Array.from(document.querySelectorAll('.chart')).every(d => d.querySelector('.main-svg'))",
                           timeout=10_000)
    page.screenshot(path=str(artifacts / f"html-{name}.png"), full_page=True)
    return page, page.evaluate(_CHART_STATE), problems, outside


@pytest.mark.parametrize("name", [GLOO_STRAGGLER, RESNET, DLRM])
def test_browser_renders_every_chart(browser, reports, corpus, tmp_path, artifacts, name):
    page, charts, problems, outside = _open(browser, reports[name], tmp_path, name, artifacts)
    try:
        assert problems == [] and outside == []
        assert {c["id"] for c in charts} == CHARTS[name]
        for c in charts:
            assert c["svg"] >= 1 and c["marks"] > 0, c
        ranks_in_folder = len(corpus_files(corpus, name))      # one file per rank
        breakdown = next(c for c in charts if c["id"] == "chart-breakdown")
        assert breakdown["xticks"] == ranks_in_folder
        assert page.evaluate("typeof window.__pwned") == "undefined"
    finally:
        page.close()


def test_browser_rank_selector_switches_views(browser, reports, tmp_path, artifacts):
    page, _, problems, _ = _open(browser, reports[DLRM], tmp_path, "dlrm-rank3", artifacts)
    try:
        page.select_option("#rank-select", "3")
        visible = page.evaluate("Array.from(document.querySelectorAll('[data-member-of=rank]'))"
                                ".filter(e => !e.hidden).map(e => e.dataset.key)")
        assert visible and set(visible) == {"3"}
        assert "rank 3" in page.text_content("#chart-kernel-classes .gtitle")
        assert problems == []
    finally:
        page.close()


def test_browser_hostile_names_do_not_run(browser, hostile_report, tmp_path, artifacts):
    page, charts, problems, outside = _open(browser, hostile_report, tmp_path, "hostile", artifacts)
    try:
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert problems == [] and outside == []
        assert all(c["svg"] >= 1 for c in charts)
        assert HOSTILE_KERNEL in page.inner_text("#rank-detail")     # shown as text
    finally:
        page.close()
