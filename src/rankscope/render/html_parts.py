"""The HTML pages' shared parts (render/html.py: the report; render/diff_html.py: the A/B comparison):
the page itself with its CSS, plotly.js inline and the boot script, tables, notes, chart specs and
the breakdown categories' colors and labels.

Every string from a trace (kernel, op, file, device names, evidence) is escaped: `escaped` in the
page and `chart_label` in chart labels (plotly reads `&lt;` back as `<` but never as a tag), and the
chart specs sit in a `<script type="application/json">` block with `<`, `>`, `&`, U+2028 and
U+2029 written as `\\uXXXX`, so no name can close the block.
"""
from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence, Set
from typing import Any, TypeAlias

import plotly.offline

from rankscope.version import __version__
from rankscope.render.format import escaped, shortened, value_text

CATEGORY_COLORS = {"compute": "#2e7d32", "comm_overlapped": "#00897b", "comm_exposed": "#d32f2f",
                   "memcpy": "#7b1fa2", "dataloader": "#f57c00", "sync": "#6d4c41", "host": "#1976d2",
                   "idle_other": "#9e9e9e"}
CATEGORY_LABELS = {"compute": "compute", "comm_overlapped": "comm overlapped with compute",
                   "comm_exposed": "comm exposed", "memcpy": "memcpy only", "dataloader": "DataLoader",
                   "sync": "host synchronize", "host": "host (CPU ops, launches)", "idle_other": "idle, other"}

_JSON_IN_SCRIPT = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                   0x2028: "\\u2028", 0x2029: "\\u2029"}

#: A plain JSON object: a chart's spec or layout, a part of a schema's dict.
JsonDict: TypeAlias = dict[str, Any]
#: The page's chart specs: chart id -> {"initial": a variant's key, "variants": {key: {"data", "layout"}}}.
Figures: TypeAlias = dict[str, JsonDict]

_BOOT = """
(function () {
  var figures = JSON.parse(document.getElementById("rankscope-figures").textContent);
  var config = {displaylogo: false, responsive: true};
  function draw(id, key) {
    var v = figures[id].variants[key];
    if (v) Plotly.react(id, v.data, v.layout, config);
  }
  Object.keys(figures).forEach(function (id) { draw(id, figures[id].initial); });
  document.querySelectorAll("select[data-group]").forEach(function (sel) {
    sel.addEventListener("change", function () {
      sel.dataset.charts.split(" ").forEach(function (id) { if (figures[id]) draw(id, sel.value); });
      document.querySelectorAll("[data-member-of='" + sel.dataset.group + "']").forEach(function (el) {
        el.hidden = el.dataset.key !== sel.value;
      });
    });
  });
})();
"""

_CSS = """
body { margin: 0; background: #f4f5f7; color: #1d2125; font: 14px/1.45 system-ui, -apple-system, "Segoe UI",
       Roboto, sans-serif; }
.page { max-width: 1100px; margin: 0 auto; padding: 16px 24px 48px; background: #fff; min-height: 100vh; }
h1 { font-size: 24px; margin: 8px 0 4px; } h2 { font-size: 19px; margin: 32px 0 8px; padding-top: 12px;
border-top: 1px solid #dfe1e6; } h3 { font-size: 15px; margin: 20px 0 6px; }
.note { color: #5e6c84; font-size: 13px; margin: 4px 0; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th.num { white-space: nowrap; }
th, td { border-bottom: 1px solid #ebecf0; padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { color: #5e6c84; font-weight: 500; padding-right: 16px; white-space: nowrap; }
.name { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; overflow-wrap: anywhere; }
.chart { width: 100%; min-height: 200px; }
ul.warnings { color: #974f0c; margin: 4px 0; padding-left: 20px; }
ul.capture { margin: 4px 0; padding-left: 20px; } ul.capture.partial { color: #c62828; }
ul.capture code { font-size: 12px; color: #5e6c84; }
.finding { border: 1px solid #dfe1e6; border-left: 5px solid #9e9e9e; border-radius: 4px; padding: 8px 14px;
           margin: 10px 0; }
.finding.sev-high { border-left-color: #c62828; } .finding.sev-medium { border-left-color: #ef6c00; }
.finding.sev-low { border-left-color: #f9a825; } .finding.sev-info { border-left-color: #1976d2; }
.finding .head { font-size: 15px; } .finding code { font-size: 12px; color: #5e6c84; }
.badge { display: inline-block; min-width: 52px; text-align: center; border-radius: 3px; padding: 0 6px;
         margin-right: 6px; color: #fff; font-size: 12px; font-weight: 600; background: #9e9e9e; }
.sev-high .badge { background: #c62828; } .sev-medium .badge { background: #ef6c00; }
.sev-low .badge { background: #f9a825; color: #1d2125; } .sev-info .badge { background: #1976d2; }
.fix { background: #e3fcef; padding: 4px 8px; border-radius: 3px; }
select { font-size: 14px; padding: 2px 6px; }
footer { margin-top: 40px; color: #8993a4; font-size: 12px; }
"""


def page(title: str, body: str, figures: Figures, schema: str | None) -> str:
    """A self-contained page: the report CSS, plotly.js inline (no network), `body`, and the
    chart specs `figures` drawn by the page's boot script."""
    plotly_js = plotly.offline.get_plotlyjs().replace("</script", "<\\/script")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escaped(title)}</title><style>{_CSS}</style>\n<script>{plotly_js}</script>\n</head>\n"
            f'<body><main class="page">{body}'
            f"<footer>rankscope {escaped(__version__)} &middot; schema {escaped(schema)} &middot; "
            f"self-contained page (plotly.js inline, no network)</footer></main>\n"
            f'<script type="application/json" id="rankscope-figures">{_script_json(figures)}</script>\n'
            f"<script>{_BOOT}</script>\n</body></html>\n")


def _finite(obj: object) -> object:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _script_json(obj: object) -> str:
    """JSON that cannot end its <script> block or break a JS parser (see module doc)."""
    return json.dumps(_finite(obj), separators=(",", ":"), ensure_ascii=False).translate(_JSON_IN_SCRIPT)


# ---------------------------------------------------------------------------------------- text

class Markup(str):
    """Markup already escaped (a cell that html_table must not escape again)."""


def html_table(headers: list[str], rows: Sequence[Sequence[object]], numeric: Set[int] = frozenset(),
               attrs: str = "") -> str:
    """An HTML table; cells are escaped text (None renders as a dash, numbers formatted)."""
    def cell(tag: str, i: int, v: object) -> str:
        cls = ' class="num"' if i in numeric else ""
        return f"<{tag}{cls}>{v if isinstance(v, Markup) else escaped(value_text(v))}</{tag}>"
    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def name_cell(full: str, width: int = 110) -> Markup:
    """A kernel, op or file name in monospace, shortened to `width`; the full name on hover."""
    return Markup(f'<span class="name" title="{escaped(full)}">{escaped(shortened(full, width))}</span>')


def kv_table(rows: list[tuple[str, str]]) -> str:
    """A two-column table of labels and values."""
    return ('<table class="kv">' + "".join(f"<tr><th>{escaped(k)}</th><td>{escaped(v)}</td></tr>" for k, v in rows)
            + "</table>")


def note(text: str) -> str:
    """A grey explanatory paragraph; nothing for empty text."""
    return f'<p class="note">{escaped(text)}</p>' if text else ""


# ---------------------------------------------------------------------------------------- charts

def chart_label(value: object) -> str:
    """A name inside a chart: plotly turns `<b>`, `<br>`, `<a>` into markup, so escape it."""
    return html.escape(str(value), quote=False)


def chart_layout(x_title: str, y_title: str, height: int = 380, slots: int = 0, **extra: Any) -> JsonDict:
    """Axes, legend on top; bars stacked, and narrower when there are only a few x slots."""
    return {"height": height, "margin": {"l": 70, "r": 20, "t": 30, "b": 60}, "barmode": "stack",
            "bargap": 0.6 if 0 < slots <= 3 else 0.2,
            "xaxis": {"title": {"text": x_title}, "type": "category"}, "yaxis": {"title": {"text": y_title}},
            "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0, "traceorder": "normal"},
            "font": {"size": 12}, "paper_bgcolor": "#fff", "plot_bgcolor": "#fff", **extra}


def chart(figures: Figures, chart_id: str, variants: dict[str, JsonDict], initial: str) -> str:
    """A chart's `<div>`; its spec per variant (e.g. per rank) goes into `figures`, `initial` drawn first."""
    figures[chart_id] = {"initial": initial, "variants": variants}
    return f'<div class="chart" id="{chart_id}"></div>'


def one_chart(figures: Figures, chart_id: str, data: list[JsonDict], layout: JsonDict) -> str:
    """A chart with one variant."""
    return chart(figures, chart_id, {"all": {"data": data, "layout": layout}}, "all")
