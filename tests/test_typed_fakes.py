"""Renderers and rules on small typed reports built by hand (rankscope.results), not on corpus
analyses: every expected value below is a value the test itself put in the report."""
from __future__ import annotations

import json

from rich.console import Console

from conftest import DLRM, run_cli
from rankscope import analyze
from rankscope.render.base import render, renderer
from rankscope.results import Analysis, Finding, JobInfo
from rankscope.results.analysis import BreakdownMs, RankReport, StepRow, StepTime
from rankscope.results.clock import ClockAlignment, RankClock
from rankscope.results.step_spread import StepSpread, StepSpreadRow
from rankscope.results.stragglers import Straggler
from rankscope.thresholds import THRESHOLDS

BREAKDOWN = BreakdownMs(compute=12.0, comm_overlapped=2.0, comm_exposed=3.0, memcpy=0.0, dataloader=2.5, sync=0.0,
                        host=0.5, idle_other=0.0)


def _rank(rank: int) -> RankReport:
    return RankReport(rank=rank, file=f"rank{rank}.json", rank_source="distributedInfo", format="kineto",
                      events=1000 + rank, device_events=400, step_time_ms=StepTime(20.0, 20.0, 21.0),
                      gpu_busy_pct=71.25, breakdown_ms=BREAKDOWN, breakdown_mode="device", comm_by_dim_ms=None,
                      overlap_efficiency=0.4, temporal_pct=None, overlap_pct=None, idle_ms=None,
                      idle_ms_summed_over_streams=None, idle_streams=None, hta=None, kernels=None, operators=None,
                      idle_gaps=None, dataloader=None, memory=None, memcpy=None, salvaged=False, from_cache=False)


def _report() -> Analysis:
    finding = Finding(id="straggler_rank", severity="high", ranks=[1], steps=[3, 4], summary="rank 1 is late",
                      evidence={"cost_ms_per_step": 7.5}, explanation="the others wait for it",
                      fix="look at rank 1's data loading", threshold={"straggler_step_z": 2.0}, cost_ms_per_step=7.5)
    return Analysis(
        job=JobInfo(world_size=2, ranks=[0, 1], backend="nccl", steps=[3, 4], steps_source="profiler_step",
                    devices=["Test GPU"], hosts=["node0"], span_ms=50.0, missing_ranks=[], warnings=[]),
        ranks=[_rank(0), _rank(1)],
        steps=[StepRow(r, s, 20.0, 14.0, BREAKDOWN) for r in (0, 1) for s in (3, 4)],
        stragglers=[Straggler(rank=1, cause="dataloader", cost_ms_per_step=7.5, last_arrival_pct=100.0,
                              step_time_z=None, step_time_pct_over_mean=None, wait_imposed_ms_per_step=7.25,
                              excess_ms_per_step={"dataloader": 7.0}, steps=[3, 4],
                              evidence="arrives last at 2 of 2 collectives")],
        straggler_verdict="rank 1 is a straggler",
        clock=ClockAlignment(method="collective_end", note="offsets from 2 collectives",
                             ranks=[RankClock(0, 0.0, 0.01, 2, True), RankClock(1, 0.5, 0.01, 2, True)]),
        median_step_ms=20.0,
        step_spread=StepSpread([StepSpreadRow(3, 19.0, 21.0, 1), StepSpreadRow(4, 20.0, 20.5, 0)], 1.25, 6.25),
        findings=[finding])


def _terminal(report: Analysis) -> str:
    console = Console(width=200, highlight=False, color_system=None)
    with console.capture() as out:
        render(report, "terminal", console)
    return out.get()


def test_terminal_shows_the_typed_report():
    text = _terminal(_report())
    assert "Across ranks:" in text and "rank 1 is a straggler" in text
    assert "rank 1: arrives last at 2 of 2 collectives" in text
    assert "clocks: offsets from 2 collectives" in text
    # 1.25 ms, 6.25 % and the widest step: step 3, 21.0 - 19.0 = 2.00 ms, rank 1
    assert "step-time spread 1.25 ms per step (6.2% of the median step)" in text
    assert "(widest: step 3, 2.00 ms, rank 1 slowest)" in text
    assert "1. HIGH straggler_rank (rank 1): rank 1 is late" in text
    assert "fix: look at rank 1's data loading" in text


def test_html_shows_the_typed_report():
    page = renderer(Analysis, "html").text(_report())
    assert "arrives last at 2 of 2 collectives" in page
    assert "Step-time spread 1.25 ms per step" in page
    assert "look at rank 1&#x27;s data loading" in page or "look at rank 1's data loading" in page


def test_json_is_the_report_and_loads_back(tmp_path):
    report = _report()
    saved = tmp_path / "saved.json"
    saved.write_text(renderer(Analysis, "json").text(report))
    data = json.loads(saved.read_text())
    assert data["schema"] == "rankscope.analysis/1"
    assert data["stragglers"][0]["evidence"] == "arrives last at 2 of 2 collectives"
    assert data["step_spread"]["spread_ms"] == 1.25
    assert Analysis.load(saved) == report
    assert _terminal(Analysis.load(saved)) == _terminal(report)


def test_reported_threshold_names_are_the_ones_threshold_takes(corpus, tmp_path):
    """Every threshold a finding reports is one `--threshold NAME=VALUE` accepts (the registry of
    thresholds is the oracle; before the typed report, load_imbalance reported `all_idle_pct`)."""
    report = analyze(corpus / DLRM, use_cache=False)
    reported = {name for f in report.findings for name in f.threshold}
    assert "load_all_idle_pct" in reported                  # load_imbalance fires on this set
    assert reported <= set(THRESHOLDS)
    out = run_cli(["analyze", corpus / DLRM, "--no-cache", "-q", "--json", "--threshold", "load_all_idle_pct=99"],
                  tmp_path)
    assert out.returncode in (0, 1), out.stderr
