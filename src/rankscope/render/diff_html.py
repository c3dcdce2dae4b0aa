"""`rankscope diff --html`: the A/B comparison as a section of the HTML report, from the
`rankscope.diff/1` dict (render.diff_json). Shares the report's page parts (render/html_parts.py):
tables, charts, the CSS and the embedded plotly.js. Computes nothing: it picks rows
(the largest changes first, as the dict orders them) and formats them. Every name is escaped.
"""
from __future__ import annotations

from rankscope.results.rank import BREAKDOWN_CATEGORIES as CATEGORIES
from rankscope.render.base import HtmlRenderer
from rankscope.render.diff_json import diff_to_dict
from rankscope.render.diff_terminal import metric_label
from rankscope.render.format import escaped, p_value_text, ranges, value_text
from rankscope.render.html_parts import (CATEGORY_COLORS, CATEGORY_LABELS, Figures, JsonDict, Markup, chart_layout,
                                         html_table, kv_table, name_cell, note, one_chart, page)
from rankscope.results import DiffResult

#: Rows listed per table (the dict, i.e. --json, has all).
MAX_RANK_ROWS = 32
MAX_NAME_ROWS = 20


class DiffHtml(HtmlRenderer):
    """`diff --html`: the comparison page, laid out from the `rankscope.diff/1` dict."""

    def text(self, result: DiffResult) -> str:
        # The CLI writes only a usable result, which has a diff.
        assert result.diff is not None
        return render_diff_html(diff_to_dict(result.diff))


def render_diff_html(report: JsonDict) -> str:
    """One self-contained page (plotly.js inline, no network) holding `diff_section`."""
    figures: Figures = {}
    body = diff_section(report, figures)
    return page("rankscope diff", body, figures, report.get("schema"))


def diff_section(report: JsonDict, figures: Figures) -> str:
    """The `<section id="diff">` of a report: conclusion, what was compared, the tests, per rank,
    collectives and stragglers, findings, and the op / kernel diff."""
    parts = [f'<section id="diff"><h2>A/B comparison</h2><p><b>{escaped(report["headline"])}</b></p>',
             _compared(report), _breakdown_chart(report, figures),
             "<h3>Job-wide, mean per step</h3>", note("Samples: every compared step of every compared rank."),
             _metrics(report["job"]), _ranks(report), _cross(report), _findings(report),
             _names("Kernels (device activity) by impact", report["kernels"]),
             _names("Ops (host) by impact", report["ops"]), "</section>"]
    return "".join(parts)


def _compared(report: JsonDict) -> str:
    c, s = report["compared"], report["settings"]

    def side(x: JsonDict) -> str:
        return (f"{x['input']}: {len(x['ranks'])} rank(s) ({ranges(x['ranks'])}), {x['steps']} steps on the "
                f"compared ranks, {', '.join(x['formats'])}")
    how = "by rank id" if c["rank_match"] == "rank_id" else "paired in sorted order"
    rows = [("before", side(c["before"])), ("after", side(c["after"])),
            ("ranks compared", f"{len(c['rank_pairs'])} ({how})"), ("step samples a side", value_text(c["samples"])),
            ("test", f"Welch's t-test (two-sided) and a {value_text(s['ci_level_pct'], 0)}% percentile bootstrap CI "
                     f"of the delta ({s['bootstrap_resamples']} resamples, seed {s['bootstrap_seed']}); significant: "
                     f"p < {s['alpha']} and the CI excludes 0")]
    warnings = "".join(f"<li>{escaped(w)}</li>" for w in c["warnings"])
    return kv_table(rows) + (f'<ul class="warnings">{warnings}</ul>' if warnings else "")


def _breakdown_chart(report: JsonDict, figures: Figures) -> str:
    parts = report["job"].get("breakdown_ms") or {}
    data = [{"type": "bar", "name": CATEGORY_LABELS[cat], "x": ["before", "after"],
             "y": [parts[cat]["before"], parts[cat]["after"]], "marker": {"color": CATEGORY_COLORS[cat]},
             "hovertemplate": "%{x}: %{y:.3f} ms per step"} for cat in CATEGORIES if cat in parts]
    return one_chart(figures, "chart-diff-breakdown", data, chart_layout("", "ms per step", slots=2))


def _sig(m: JsonDict) -> Markup:
    return Markup("<b>yes</b>" if m["significant"] else "no")


def _ci(m: JsonDict) -> str | None:
    return None if m["ci"] is None else f"{value_text(m['ci'][0])} .. {value_text(m['ci'][1])}"


def _metrics(metrics: JsonDict) -> str:
    rows = []
    for name, m in metrics.items():
        group = m.items() if name == "breakdown_ms" else [(None, m)]
        for part, x in group:
            label = metric_label(f"{name}.{part}" if part else name).strip() + (" ms" if part else "")
            rows.append([label, x["before"], x["after"], x["delta"], x["delta_pct"], p_value_text(x["p_value"]), _ci(x),
                         _sig(x)])
    return html_table(["metric", "before", "after", "delta", "delta %", "p", "CI of delta", "significant"], rows,
                      numeric={1, 2, 3, 4, 5, 6})


def _ranks(report: JsonDict) -> str:
    ranks = sorted(report["ranks"], key=lambda r: -abs(r["metrics"]["step_time_ms"]["delta"] or 0))[:MAX_RANK_ROWS]
    if len(report["ranks"]) < 2:
        return ""
    rows = [[f"{r['rank_before']} / {r['rank_after']}", r["steps_compared"], st["before"], st["after"],
             st["delta_pct"], p_value_text(st["p_value"]), _sig(st)]
            for r in sorted(ranks, key=lambda r: r["rank_after"]) for st in [r["metrics"]["step_time_ms"]]]
    more = len(report["ranks"]) - len(ranks)
    return ("<h3>Per rank: step time ms</h3>" + note("Samples: the rank's own compared steps."
                                                     + (f" The {len(ranks)} largest changes of {len(report['ranks'])}"
                                                        " rank pairs are listed." if more > 0 else ""))
            + html_table(["rank before / after", "steps", "before", "after", "delta %", "p", "significant"], rows,
                         numeric={1, 2, 3, 4, 5}))


def _cross(report: JsonDict) -> str:
    out = ""
    if report["collectives"]:
        out += "<h3>Collectives</h3>" + note("Samples: the matched collectives of each job.") \
            + _metrics(report["collectives"])
    s = report["stragglers"]
    if s["verdict_before"] or s["verdict_after"]:
        out += "<h3>Stragglers</h3>" + kv_table([("before", s["verdict_before"] or "n/a"),
                                                 ("after", s["verdict_after"] or "n/a")])
        rows = [[x["rank"], x["status"], x["cause_before"], x["cause_after"], x["cost_ms_per_step_before"],
                 x["cost_ms_per_step_after"]] for x in s["changes"]]
        if rows:
            out += html_table(["rank", "status", "cause before", "cause after", "cost ms/step before",
                               "cost ms/step after"], rows, numeric={0, 4, 5})
    return out


def _findings(report: JsonDict) -> str:
    findings = report["findings"]
    if findings is None:
        return "<h3>Findings</h3>" + note("Not compared: the analyses carry no findings.")
    rows = [[f["status"], Markup(f"<code>{escaped(f['id'])}</code>"), ranges(f["ranks"]),
             f"{f['severity_before'] or '–'} → {f['severity_after'] or '–'}", f["summary"]] for f in findings]
    return "<h3>Findings, by id and ranks</h3>" + (html_table(["status", "id", "ranks", "severity", "summary"],
                                                              rows) if rows else note("No findings on either side."))


def _names(title: str, names: JsonDict) -> str:
    if not names["rows"]:
        return ""
    counts = ", ".join(f"{n} {s}" for s, n in names["counts"].items())
    rows = [[name_cell(r["name"], 90), r["status"], r["calls_before"], r["calls_after"], r["per_call_us_before"],
             r["per_call_us_after"], r["impact_ms_per_step"]] for r in names["rows"][:MAX_NAME_ROWS]]
    return (f"<h3>{escaped(title)}</h3>" + note(f"{counts}. Slower / faster: time per call, Welch's t-test over "
                                                f"the calls; impact: change of total time per step.")
            + html_table(["name", "status", "calls before", "calls after", "µs per call before", "µs per call after",
                          "impact ms/step"], rows, numeric={2, 3, 4, 5, 6}))
