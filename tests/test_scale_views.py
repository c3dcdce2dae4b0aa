"""Views that scale (issue 32): a large job's report still names the rank that matters.

A synthetic 64-rank job (4 times the rows a per-rank table shows) with one straggler the generator
injected (rank 37, host_idle, 30 ms per step: its ground truth). Expected values: the injected rank,
and the generator's host names (node000, node001, ...: GPUS_PER_NODE ranks per host). The 256- and 4,096-rank runs of
the same checks are `benchmarks/bench_scale_views.py` (too slow to make and analyse in CI).
"""
from __future__ import annotations

import io
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
