"""The HTML report's views of a large job (issue 32): what to draw when a job has thousands of ranks.

  * `named_ranks` (rank_rows.py, as the terminal): the ranks the report names (stragglers, findings
    about a few ranks, the critical path's), drawn first wherever ranks are picked;
  * `distribution`: every rank's step breakdown as one box per category (all ranks, any count), the
    named ranks marked and labelled on it;
  * `heatmap_z`: a step's deviation from the job's median step, with deviations under
    `HEATMAP_NOISE_PCT` of it left blank (grey): the colour scale spans what differs, not the noise;
  * `evidence_value`: a finding's evidence value as one cell: a per-rank mapping of many ranks
    becomes its min / median / max and the named ranks' values.

Like the rest of render/, these lay out the typed report (results/analysis.py) and compute nothing
new (a min / median / max of the values shown is how they are shown).
"""
from __future__ import annotations

from statistics import median

from rankscope.render.html_parts import (CATEGORY_COLORS, CATEGORY_LABELS, Figures, JsonDict, chart_label, chart_layout,
                                         note, one_chart)
from rankscope.render.rank_rows import named_ranks
from rankscope.results import Analysis
from rankscope.results.rank import BREAKDOWN_CATEGORIES

#: Per-rank evidence mappings with more entries than this are summarised.
MAX_EVIDENCE_RANKS = 16
#: Steps within this % of the median step are drawn as noise (grey) in the heatmap.
HEATMAP_NOISE_PCT = 1.0


def distribution(report: Analysis, figures: Figures) -> str:
    """One box per breakdown category over every rank, the named ranks marked on it."""
    ranks = [(r.rank, r.breakdown_ms) for r in report.ranks if r.breakdown_ms]
    if len(ranks) < 2:
        return ""
    named = set(named_ranks(report))
    data: list[JsonDict] = []
    for c in BREAKDOWN_CATEGORIES:
        label = CATEGORY_LABELS[c]
        data.append({"type": "box", "name": label, "y": [getattr(b, c) for _, b in ranks], "boxpoints": False,
                     "marker": {"color": CATEGORY_COLORS[c]}, "showlegend": False,
                     "hoverinfo": "y"})
        marked = [(r, b) for r, b in ranks if r in named]
        if marked:
            data.append({"type": "scatter", "mode": "markers+text", "x": [label] * len(marked),
                         "y": [getattr(b, c) for _, b in marked],
                         "text": [chart_label(f"rank {r}") for r, _ in marked], "textposition": "middle right",
                         "marker": {"color": "#000000", "size": 7, "symbol": "diamond"}, "showlegend": False,
                         "hovertemplate": "%{text}: %{y:.3f} ms per step<extra></extra>"})
    layout = chart_layout("", "ms per step", 420, xaxis={"type": "category"})
    return ('<section id="distribution"><h2>Step breakdown over the ranks</h2>'
            + note(f"Every rank's mean ms per step in each category, as a box (median, quartiles, whiskers to "
                   f"1.5 x the interquartile range) over all {len(ranks):,} ranks; the ranks the report names "
                   f"(stragglers, findings, the critical path) are marked and labelled.")
            + one_chart(figures, "chart-distribution", data, layout) + "</section>")


def heatmap_z(durations: list[list[float | None]], median_step: float) -> tuple[list[list[float | None]], float]:
    """Per cell: its step minus the median step (ms), None (drawn grey) within the noise band; and
    the band's half-width (ms)."""
    noise = HEATMAP_NOISE_PCT / 100.0 * median_step
    return [[None if v is None or abs(v - median_step) < noise else round(v - median_step, 3) for v in row]
            for row in durations], noise


def evidence_value(value: object, named: list[int]) -> object:
    """A finding's evidence value as one table cell: a mapping of many ranks to numbers becomes its
    min / median / max over them and the named ranks' values; anything else as it is."""
    if not isinstance(value, dict) or len(value) <= MAX_EVIDENCE_RANKS:
        return value
    numbers = {k: v for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if len(numbers) < len(value):
        return f"{len(value):,} entries (--json has them)"
    vals = sorted(numbers.values())
    shown = "; ".join(f"rank {r}: {numbers[k]:g}" for r in named for k in (str(r), r) if k in numbers)
    return (f"{len(vals):,} ranks: min {vals[0]:g} / median {median(vals):g} / max {vals[-1]:g}"
            + (f"; {shown}" if shown else ""))


def heatmap_note(noise_ms: float, median_step: float) -> str:
    return note(f"Each step's duration minus the job's median step ({median_step:,.1f} ms), per rank and step: "
                f"slower red, faster blue; within {HEATMAP_NOISE_PCT:g}% of the median ({noise_ms:,.2f} ms) grey, "
                f"as noise.")
