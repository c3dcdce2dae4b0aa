"""The HTML report's run section, from the report's `run` (results/run.py): the changes, a line
chart of the median and the slowest rank's step over the cycles with the changes marked, a heatmap of
rank x cycle, one row per cycle. Lays out; computes nothing."""
from __future__ import annotations

from rankscope.render.format import escaped, ranges, value_text
from rankscope.render.html_parts import Figures, chart_label, chart_layout, html_table, note, one_chart
from rankscope.render.run_figures import RUN_CYCLE, change_text, noise_text, run_steps
from rankscope.results import Analysis
from rankscope.results.run import RunChange, RunCycle

#: Ranks drawn in the heatmap: the slowest (by their slowest cycle) when there are more.
MAX_HEATMAP_RANKS = 256
CHANGE_COLORS = {"slowdown": "#d32f2f", "speedup": "#2e7d32", "straggler_onset": "#f57c00",
                 "straggler_end": "#1976d2", "finding_onset": "#7b1fa2"}


def run_section(report: Analysis, figures: Figures) -> str:
    """The section (empty for a report of one cycle)."""
    run = report.run
    if not run:
        return ""
    cycles = run.cycles
    changes = run.changes
    head = (f'<section id="run"><h2>Run: {len(cycles)} profiler cycles</h2>'
            + note(f"Every profiler cycle of the job (steps #{ranges(run_steps(run))}), "
                   f"each analysed as a job of its own; the other sections detail cycle {run.detailed_cycle}."))
    items = "".join(f'<li class="{escaped(c.kind)}">{escaped(change_text(c))}</li>' for c in changes)
    listed = (f"<h3>Changes</h3><ul class=\"changes\">{items}</ul>" if changes
              else "<h3>Changes</h3>" + note(f"None over {len(cycles)} cycles."))
    return (head + listed + note(noise_text(run.noise_pct, run.cycle_noise_pct, run.z_critical))
            + _trend(cycles, changes, figures)
            + _heatmap(cycles, changes, figures) + _table(cycles) + "</section>")


def _trend(cycles: list[RunCycle], changes: list[RunChange], figures: Figures) -> str:
    x = [c.cycle for c in cycles]
    hover = [f"cycle {c.cycle}, steps {ranges(c.steps)}" for c in cycles]
    data = [{"type": "scatter", "mode": "lines+markers", "name": chart_label(RUN_CYCLE[key].html_label()), "x": x,
             "y": [getattr(c, RUN_CYCLE[key].json_key()) for c in cycles], "text": hover, "line": {"color": color},
             "hovertemplate": "%{text}: %{y:.3f} ms"} for key, color in (("median", "#1976d2"),
                                                                         ("slowest", "#d32f2f"))]
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": c.first_cycle - 0.5, "x1": c.first_cycle - 0.5,
               "y0": 0, "y1": 1, "line": {"color": CHANGE_COLORS[c.kind], "dash": "dot", "width": 2}}
              for c in changes]
    notes = [{"x": c.first_cycle - 0.5, "y": 1, "xref": "x", "yref": "paper", "showarrow": False,
              "text": chart_label(f"{c.kind}" + (f" r{c.rank}" if c.rank is not None else "")),
              "textangle": -90, "xanchor": "right", "yanchor": "top", "font": {"size": 10,
                                                                              "color": CHANGE_COLORS[c.kind]}}
             for c in changes]
    layout = chart_layout("cycle", "step time, ms", 360, shapes=shapes, annotations=notes)
    layout["xaxis"] = {"title": {"text": "cycle"}, "dtick": 1}
    return (note(f"{RUN_CYCLE['median'].html}: {RUN_CYCLE['median'].definition}; {RUN_CYCLE['slowest'].html}: "
                 f"{RUN_CYCLE['slowest'].definition}. Dotted lines: the changes, before the first cycle they show in.")
            + one_chart(figures, "chart-run-trend", data, layout))


def _heatmap(cycles: list[RunCycle], changes: list[RunChange], figures: Figures) -> str:
    worst: dict[int, float] = {}
    for c in cycles:
        for r, ms in zip(c.ranks, c.rank_step_ms):
            if ms is not None:
                worst[r] = max(worst.get(r, 0.0), ms)
    shown = sorted(sorted(worst, key=lambda r: -worst[r])[:MAX_HEATMAP_RANKS])
    capped = (f"{len(shown)} of {len(worst)} ranks drawn: the slowest by their slowest cycle (--json has every "
              f"rank)." if len(shown) < len(worst) else "")
    at = [dict(zip(c.ranks, c.rank_step_ms)) for c in cycles]
    z = [[row.get(r) for row in at] for r in shown]
    data = [{"type": "heatmap", "x": [c.cycle for c in cycles], "y": [str(r) for r in shown], "z": z,
             "colorscale": "YlOrRd", "reversescale": True, "colorbar": {"title": {"text": "ms"}}, "xgap": 1,
             "ygap": 1 if len(shown) <= 64 else 0,
             "hovertemplate": "rank %{y}, cycle %{x}: median step %{z:.3f} ms<extra></extra>"}]
    marked = [{"x": c.first_cycle, "y": str(c.rank), "xref": "x", "yref": "y", "text": "&#9650;", "showarrow": False,
               "font": {"color": "#000", "size": 12}} for c in changes
              if c.rank is not None and c.kind in ("slowdown", "straggler_onset") and c.rank in shown]
    layout = chart_layout("cycle", "rank", max(260, min(760, 110 + 16 * len(shown))), annotations=marked)
    layout["xaxis"] = {"title": {"text": "cycle"}, "dtick": 1}
    layout["yaxis"] = {"title": {"text": "rank"}, "type": "category", "autorange": "reversed"}
    return (note("Each rank's median step per cycle (ms): a rank that got slow is a row that turns red from a "
                 "cycle on; a triangle marks the first cycle of a rank's slowdown or straggler onset.")
            + note(capped) + one_chart(figures, "chart-run-heatmap", data, layout))


def _table(cycles: list[RunCycle]) -> str:
    headers = ["cycle"] + [f.html_label() for f in RUN_CYCLE.values()]
    rows = []
    for c in cycles:
        s = c.straggler
        rows.append([c.cycle, ranges(c.steps),
                     f"{len(c.ranks)}" + (f" (missing {ranges(c.missing_ranks)})" if c.missing_ranks else ""),
                     value_text(c.step_ms_median), value_text(c.step_ms_max),
                     f"rank {s.rank} {s.cause} {value_text(s.cost_ms_per_step)} ms/step" if s else "-",
                     ", ".join(c.findings) or "-"])
    return (html_table(headers, rows, numeric={0, 3, 4})
            + note("; ".join(f"{f.html}: {f.definition}" for f in RUN_CYCLE.values())))
