"""The step-time spread across ranks (analyses/job/step_spread.py, docs/concepts.md "Step-time
spread"). Expected values are counted by hand from the step durations the test writes."""
from __future__ import annotations

import json

from click.testing import CliRunner

from rankscope.cli import main
from tracebuilder import TraceBuilder

#: rank -> its steps' durations (µs). Step 4 only rank 0 profiled: left out; step 3 two ranks did.
DURATIONS_US = {0: [10_000, 11_000, 12_000, 9_000], 1: [10_500, 14_000, 12_000], 2: [9_000, 11_000]}


def _job(tmp_path):
    for rank, durations in DURATIONS_US.items():
        b = TraceBuilder(rank=rank, world_size=3)
        t = 1_000.0
        for n, d in enumerate(durations, start=1):
            b.step(n, t, d).op("aten::mm", t + 10, d - 20).kernel("sm90_gemm", t + 20, t + 30, d - 100)
            t += d + 50
        b.write(tmp_path / f"rank{rank}.json")
    return tmp_path


def test_spread_per_step_and_mean(tmp_path):
    out = CliRunner().invoke(main, ["analyze", str(_job(tmp_path)), "--no-cache", "--json"])
    spread = json.loads(out.output)["step_spread"]
    # by hand: step 1: 9.0 (rank 2) .. 10.5 (rank 1); step 2: 11.0 .. 14.0 (rank 1); step 3: 12.0 .. 12.0
    # (a tie: the lower rank, 0); mean of 1.5, 3.0, 0.0 = 1.5 ms; the median of all nine steps is 11.0 ms
    assert [(r["step"], r["fastest_ms"], r["slowest_ms"], r["slowest_rank"]) for r in spread["steps"]] == [
        (1, 9.0, 10.5, 1), (2, 11.0, 14.0, 1), (3, 12.0, 12.0, 0)]
    assert spread["spread_ms"] == 1.5
    assert spread["spread_pct_of_median_step"] == round(100 * 1.5 / 11.0, 2)


def test_spread_shown_in_terminal_and_html(tmp_path):
    job = _job(tmp_path / "job") if (tmp_path / "job").mkdir() is None else None
    text = CliRunner().invoke(main, ["analyze", str(job), "--no-cache"], env={"COLUMNS": "200"}).output
    assert "step-time spread 1.50 ms per step (13.6% of the median step)" in text
    assert "(widest: step 2, 3.00 ms, rank 1 slowest)" in text
    page = tmp_path / "r.html"
    CliRunner().invoke(main, ["analyze", str(job), "--no-cache", "--html", str(page)])
    assert "Step-time spread 1.50 ms per step" in page.read_text()


def test_one_rank_has_no_spread(tmp_path):
    TraceBuilder(rank=0, world_size=1).step(1, 0, 5_000).write(tmp_path / "rank0.json")
    out = CliRunner().invoke(main, ["analyze", str(tmp_path), "--no-cache", "--json"])
    assert json.loads(out.output)["step_spread"] is None
