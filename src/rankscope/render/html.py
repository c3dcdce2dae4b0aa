"""`analyze --html`: one self-contained, offline HTML page from the typed report (results/analysis.py
`Analysis`, the object `--json` encodes and `Analysis.load` reads back).

`AnalysisHtml` (the renderer) and `render_html(report) -> str` lay out what the report holds and
compute nothing: they pick values (findings sorted by severity, which ranks to draw when there are
many) and format them. The page, its escaping and
its charts' machinery are render/html_parts.py's: plotly.js is embedded inline (no CDN, nothing
fetched); the page's own script only hands each chart's spec to Plotly and switches the per-rank
views.

Many ranks: bars draw at most `MAX_BAR_RANKS` ranks, the heatmap `MAX_HEATMAP_RANKS`, the rank
selector offers `MAX_DETAIL_RANKS`: the stragglers, then the slowest by mean step time (each
chart says so); `--json` has them all.
"""
from __future__ import annotations

import msgspec

from rankscope.render.base import HtmlRenderer
from rankscope.render.figures import (BREAKDOWN, COMM_BY_DIM, COMM_BY_DIM_NOTE, DETAILS, GAPS, PIPELINE_STAGE,
                                      STRAGGLER, html_legend)
from rankscope.render.format import GAP_POSITIONS, escaped, no_device_words, ranges, value_text
from rankscope.render.hang_html import dumps_header, hang_section
from rankscope.render.html_parts import (CATEGORY_COLORS, CATEGORY_LABELS, Figures, JsonDict, chart, chart_label,
                                         chart_layout, html_table, kv_table, name_cell, note, one_chart, page)
from rankscope.render.html_views import distribution, evidence_value, heatmap_note, heatmap_z
from rankscope.render.rank_rows import FEW_RANKS, named_ranks, rank_list
from rankscope.render.run_html import run_section
from rankscope.render.step_spread import spread_text
from rankscope.results import Analysis, Finding
from rankscope.results.analysis import RankReport
from rankscope.results.rank import BREAKDOWN_CATEGORIES

MAX_BAR_RANKS = 64
MAX_HEATMAP_RANKS = 256
MAX_DETAIL_RANKS = 32
MAX_LISTED_WARNINGS = 30
MAX_LISTED_GAPS = 10
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}

IDLE_COLORS = {"host_wait": "#1976d2", "kernel_wait": "#7b1fa2", "other": "#9e9e9e"}
CLASS_COLORS = {"COMP": "#2e7d32", "COMM": "#d32f2f", "MEM": "#7b1fa2"}
GAP_COLORS = {"dataloader": "#f57c00", "sync": "#6d4c41", "host": "#1976d2", "idle_other": "#9e9e9e"}


class AnalysisHtml(HtmlRenderer):
    """`analyze --html`: the report page of an Analysis."""

    def text(self, result: Analysis) -> str:
        return render_html(result)


def render_html(report: Analysis) -> str:
    """The whole page of one report (also one read back from --json)."""
    figures: Figures = {}
    if not report.ranks:          # Flight Recorder dumps alone: their verdict, no trace sections
        body = "".join([dumps_header(report), hang_section(report), _findings(report)])
        dumped = len(report.hang.ranks_dumped) if report.hang is not None else 0
        return page(f"rankscope report: {dumped} Flight Recorder dumps", body, figures, report.schema)
    body = "".join([_header(report), hang_section(report), _findings(report), run_section(report, figures),
                    _breakdown(report, figures),
                    distribution(report, figures), _parallel(report, figures), _heatmap(report, figures),
                    _collectives(report, figures), _critical_path(report, figures), _overlap(report, figures),
                    _idle(report, figures),
                    _rank_detail(report, figures)])
    return page(f"rankscope report: {len(report.job.ranks)} ranks", body, figures, report.schema)


def _empty_layout(message: str, height: int = 300) -> JsonDict:
    return {"height": height, "xaxis": {"visible": False}, "yaxis": {"visible": False},
            "annotations": [{"text": chart_label(message), "showarrow": False, "xref": "paper", "yref": "paper",
                             "x": 0.5, "y": 0.5, "font": {"size": 14, "color": "#5e6c84"}}]}


def _bars_by_rank(ranks: list[tuple[int, dict[str, float] | None]], parts: dict[str, str], labels: dict[str, str],
                  hover_unit: str) -> list[JsonDict]:
    """One stacked-bar trace per part of each rank's parts (rank, {part: value}), x = rank."""
    shown = [(r, v) for r, v in ranks if v]
    x = [str(r) for r, _ in shown]
    return [{"type": "bar", "name": labels.get(p, p), "x": x, "y": [v.get(p) for _, v in shown],
             "marker": {"color": color}, "hovertemplate": f"rank %{{x}}: %{{y:.3f}} {hover_unit}"}
            for p, color in parts.items()]


def _pick_ranks(report: Analysis, cap: int) -> tuple[list[RankReport], str]:
    """The ranks to draw (in rank order): all, or the ranks the report names (html_views.named_ranks:
    stragglers, findings about a few ranks, the critical path's), then the slowest by mean step time."""
    ranks = report.ranks
    if len(ranks) <= cap:
        return ranks, ""
    flagged = set(named_ranks(report))
    order = sorted(ranks, key=lambda r: (r.rank not in flagged, -(r.step_time_ms.mean or 0)))
    chosen = sorted(order[:cap], key=lambda r: r.rank)
    return chosen, (f"{cap} of {len(ranks)} ranks drawn: the ranks the report names (stragglers, findings, the "
                    f"critical path), then the slowest by mean step time (--json has every rank).")


# ---------------------------------------------------------------------------------------- sections

def _header(report: Analysis) -> str:
    job = report.job
    inputs = report.inputs
    steps = job.steps
    rows = [("ranks", f"{len(job.ranks)} ({ranges(job.ranks)})"),
            ("world size", value_text(job.world_size)),
            ("backend", job.backend or "unknown"),
            ("devices", ", ".join(job.devices) or "none (CPU only)"),
            ("steps", f"{len(steps)} (#{ranges(steps)}; {job.steps_source or 'unknown'})" if steps
             else f"none ({job.steps_source or 'unknown'})"),
            ("hosts", ", ".join(job.hosts) or "unknown"),
            ("time span", f"{value_text(job.span_ms)} ms")]
    if job.missing_ranks:
        rows.append(("missing ranks", ranges(job.missing_ranks)))
    capture = job.capture
    if capture:
        rows.append(("capture", capture.headline or ""))
    said = set(capture.restated_warnings) if capture else set()
    warnings = [w for w in job.warnings if w not in said]
    warnings += [f"skipped {p.file}: {p.problem}" for p in inputs.skipped]
    warnings += [w for p in inputs.warnings if (w := f"{p.file}: {p.problem}") not in said]
    more = len(warnings) - MAX_LISTED_WARNINGS
    items = "".join(f"<li>{escaped(w)}</li>" for w in warnings[:MAX_LISTED_WARNINGS])
    if more > 0:
        items += f"<li>… and {more} more (see --json)</li>"
    warn_html = (f'<h3>Input warnings</h3><ul class="warnings">{items}</ul>' if warnings
                 else note("No input warnings."))
    issues = capture.issues if capture else []
    capture_html = (f'<ul class="capture{" partial" if capture and capture.partial else ""}">'
                    + "".join(f"<li><code>{escaped(i.kind)}</code> {escaped(i.detail)}</li>" for i in issues)
                    + "</ul>") if issues else ""
    return f'<header id="job"><h1>rankscope report</h1>{kv_table(rows)}{capture_html}{warn_html}</header>'


def _no_device_words(report: Analysis) -> str:
    issues = report.job.capture.issues if report.job.capture else []
    return no_device_words(i.kind for i in issues)


def _findings(report: Analysis) -> str:
    findings = sorted(report.findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))
    if not findings:
        return '<section id="findings"><h2>Findings</h2><p>No findings: no rule fired on this job.</p></section>'
    return ('<section id="findings"><h2>Findings</h2>' + note("Sorted by severity (high, medium, low, info).")
            + "".join(_finding(f) for f in findings) + "</section>")


def _finding(f: Finding) -> str:
    severity = str(f.severity or "info")
    where = [f"ranks {rank_list(f.ranks)}" if f.ranks else "",
             f"steps {ranges(sorted(f.steps))}" if f.steps else ""]
    evidence = f.evidence
    threshold = f.threshold
    named = sorted(f.ranks)[:FEW_RANKS]
    parts = [(f'<div class="head"><span class="badge">{escaped(severity)}</span>{escaped(f.summary or "")} '
              f'<code>{escaped(f.id)}</code></div>'),
             note(" · ".join(w for w in where if w)),
             html_table(["evidence", "value"], [[k, evidence_value(v, named)] for k, v in evidence.items()])
             if evidence else "",
             f"<p>{escaped(f.explanation)}</p>" if f.explanation else "",
             f'<p class="fix"><b>Fix:</b> {escaped(f.fix)}</p>' if f.fix else "",
             note("threshold: " + ", ".join(f"{k} = {value_text(v)}" for k, v in threshold.items()))
             if threshold else ""]
    return f'<article class="finding sev-{escaped(severity)}">{"".join(parts)}</article>'


def _breakdown(report: Analysis, figures: Figures) -> str:
    ranks, capped = _pick_ranks(report, MAX_BAR_RANKS)
    head = '<section id="breakdown"><h2>Where step time went</h2>'
    if not any(r.breakdown_ms for r in ranks):
        return head + note("No step breakdown (no rank has steps).") + "</section>"
    cpu_only = any(r.breakdown_mode == "cpu_only" for r in report.ranks)
    colors = {c: CATEGORY_COLORS[c] for c in BREAKDOWN_CATEGORIES}
    data = _bars_by_rank([(r.rank, msgspec.structs.asdict(r.breakdown_ms) if r.breakdown_ms else None) for r in ranks],
                         colors, CATEGORY_LABELS, "ms per step")
    return (head + note("Mean ms per step on each rank; each instant goes to one category, the parts sum to "
                        "the step. " + html_legend(*(BREAKDOWN[c] for c in BREAKDOWN_CATEGORIES))
                        + (f" {_no_device_words(report)}: the training thread plays the device, gloo spans play "
                           "communication." if cpu_only else ""))
            + note(capped)
            + one_chart(figures, "chart-breakdown", data, chart_layout("rank", "ms per step", slots=len(ranks)))
            + "</section>")


#: One color per parallel dimension (exposed; overlapped is drawn lighter).
DIM_COLORS = {"pp": "#6a1b9a", "dp": "#1565c0", "dp_shard": "#00838f", "dp_replicate": "#283593", "tp": "#c62828",
              "cp": "#ef6c00", "ep": "#2e7d32", "emb": "#8d6e63", "other": "#757575"}
MAX_LISTED_GROUPS = 16


def _parallel(report: Analysis, figures: Figures) -> str:
    """The parallel layout: dimensions and groups, communication per dimension, the pipeline, the experts."""
    par = report.parallelism
    dims = par.dims
    # one dimension over the whole job (plain DDP / FSDP): the header's layout row says it all
    if not (len(dims) > 1 or report.pipeline or report.experts):
        return ""
    out = [f'<section id="parallel"><h2>Parallel layout: {escaped(par.layout or "")}</h2>',
           html_table(["dimension", "size", "groups (global ranks)", "from"],
                      [[d.name, d.size,
                        " ".join("[" + ",".join(map(str, g)) + "]" for g in d.groups[:MAX_LISTED_GROUPS])
                        + (f" … {len(d.groups) - MAX_LISTED_GROUPS} more" if len(d.groups) > MAX_LISTED_GROUPS
                           else ""),
                        "process group names" if d.source == "pg_desc" else "inferred from the collectives"]
                       for d in dims], {1})]
    ranks, capped = _pick_ranks(report, MAX_BAR_RANKS)
    names = [d.name for d in dims] + (["other"] if any("other" in (r.comm_by_dim_ms or {}) for r in ranks) else [])
    comm = [(r.rank, r.comm_by_dim_ms) for r in ranks if r.comm_by_dim_ms]
    x = [str(r) for r, _ in comm]
    data: list[JsonDict] = []
    for name in names:
        for part, opacity in (("exposed", 1.0), ("overlapped", 0.45)):
            data.append({"type": "bar", "name": f"{name} {COMM_BY_DIM[part].html}", "x": x,
                         "y": [getattr(v, part) if (v := by_dim.get(name)) else None for _, by_dim in comm],
                         "marker": {"color": DIM_COLORS.get(name, "#757575"), "opacity": opacity},
                         "hovertemplate": f"rank %{{x}}: %{{y:.3f}} ms per step ({name} {part})"})
    out += ["<h3>Communication per dimension</h3>",
            note("Mean ms per step. " + html_legend(*COMM_BY_DIM.values()) + " " + COMM_BY_DIM_NOTE + "."),
            note(capped),
            one_chart(figures, "chart-comm-by-dim", data, chart_layout("rank", "ms per step", 360, len(x),
                                                                       barmode="stack"))]
    pipe = report.pipeline
    if pipe and pipe.stages:
        stages = pipe.stages
        sx = [f"stage {st.stage}" for st in stages]
        theory = pipe.bubble_pct_theory
        data = [{"type": "bar", "name": PIPELINE_STAGE["bubble_pct"].html_label(), "x": sx,
                 "y": [st.bubble_pct for st in stages], "marker": {"color": DIM_COLORS["pp"]},
                 "hovertemplate": "%{x}: %{y:.1f}% of the step"}]
        if theory is not None:
            data.append({"type": "scatter", "mode": "lines", "name": "theory, (p-1)/(m+p-1)", "x": sx,
                         "y": [theory] * len(sx), "line": {"color": "#212121", "dash": "dash"}})
        mb = pipe.microbatches
        out += [f"<h3>Pipeline: {escaped(pipe.schedule)} schedule, {len(stages)} stages, "
                f"{escaped(mb if mb else 'unknown')} microbatches</h3>",
                note(f"Bubble {value_text(pipe.bubble_pct)}% of the step (mean stage)"
                     + (f", against {theory}% for equal stages ("
                        + ("(p-1)/(v m+p-1), v = {} model chunks per rank".format(pipe.stages_per_rank)
                           if pipe.stages_per_rank > 1 else "(p-1)/(m+p-1)") + ")"
                        if theory is not None else "")
                     + (f"; bottleneck: stage {pipe.bottleneck_stage}, "
                        f"{value_text(pipe.imbalance_pct_over_mean)}% "
                        f"more compute than the stages' mean" if pipe.bottleneck_stage is not None else "")
                     + ". " + html_legend(*PIPELINE_STAGE.values())),
                one_chart(figures, "chart-pipeline-bubble", data, chart_layout("stage", "% of step", 320, len(sx))),
                html_table(["stage", "ranks", *(f.html_label() for f in PIPELINE_STAGE.values())],
                           [[st.stage, ranges(st.ranks), st.compute_ms_per_step, st.bubble_ms_per_step,
                             st.bubble_pct] for st in stages], {0, 2, 3, 4})]
    experts = report.experts
    if experts and experts.groups:
        out += ["<h3>Expert-parallel load</h3>",
                note(f"MB of tokens each rank receives per step in the expert-parallel all_to_all "
                     f"({value_text(experts.all_to_all_per_step)} all_to_all per step and rank); imbalance: "
                     f"the most-loaded rank over its group's mean."),
                html_table(["group", "received MB per step, by rank", "imbalance %", "hottest rank"],
                           [[ranges(g.ranks), ", ".join(f"{r}: {v}" for r, v in g.received_mb_per_step.items()),
                             g.imbalance_pct_over_mean, g.hottest_rank] for g in experts.groups], {2, 3})]
    return "".join(out) + "</section>"


def _heatmap(report: Analysis, figures: Figures) -> str:
    ranks, capped = _pick_ranks(report, MAX_HEATMAP_RANKS)
    head = '<section id="step-heatmap"><h2>Step time, rank by step</h2>'
    durations = {(s.rank, s.step): s.duration_ms for s in report.steps}
    steps = sorted({step for _, step in durations})
    if not steps:
        return head + note("No steps.") + "</section>"
    y = [str(r.rank) for r in ranks]
    z = [[durations.get((r.rank, step)) for step in steps] for r in ranks]
    height = max(260, min(760, 110 + 16 * len(y)))
    layout = chart_layout("step", "rank", height, yaxis={"title": {"text": "rank"}, "type": "category",
                                                         "autorange": "reversed"})
    data = [{"type": "heatmap", "x": [str(s) for s in steps], "y": y, "z": z, "colorscale": "YlOrRd",
             "reversescale": True, "colorbar": {"title": {"text": "ms"}}, "xgap": 1, "ygap": 1 if len(y) <= 64 else 0,
             "hovertemplate": "rank %{y}, step %{x}: %{z:.3f} ms<extra></extra>"}]
    median_step = report.median_step_ms
    if not median_step:          # no cross-rank result (one rank): the durations themselves
        return (head + note("Duration of every step on every rank (ms); a slow rank is a row, a slow step a column.")
                + note(capped) + one_chart(figures, "chart-step-heatmap", data, layout) + "</section>")
    data[0].update(z=heatmap_z(z, median_step)[0], colorscale="RdBu", zmid=0, hoverongaps=False,
                   colorbar={"title": {"text": "ms vs median"}},
                   hovertemplate="rank %{y}, step %{x}: %{z:+.3f} ms against the median step<extra></extra>")
    layout["plot_bgcolor"] = "#e0e0e0"
    return (head + heatmap_note(heatmap_z([], median_step)[1], median_step) + note(capped)
            + (note("S" + spread_text(report.step_spread)[1:]) if report.step_spread else "")
            + one_chart(figures, "chart-step-heatmap", data, layout) + "</section>")


def _collectives(report: Analysis, figures: Figures) -> str:
    coll = report.collectives
    by_type = coll.by_type
    out = ['<section id="collectives"><h2>Stragglers and collectives</h2>']
    if report.straggler_verdict:
        coverage = report.job.capture.coverage if report.job.capture else None
        out.append(f"<p><b>{escaped((coverage + ': ' if coverage else '') + report.straggler_verdict)}</b></p>")
    stragglers = report.stragglers
    if stragglers:
        shown = [STRAGGLER[k] for k in ("cost", "last_arrival", "step_time_z")]
        out.append(html_table(["rank", "cause", *(f.html_label() for f in shown), "evidence"],
                              [[str(s.rank), s.cause, *(getattr(s, f.json_key()) for f in shown), s.evidence]
                               for s in stragglers], {0, 2, 3, 4}))
        out.append(note(html_legend(*shown)))
    if not by_type:
        return "".join(out) + note("No collectives matched across ranks.") + "</section>"
    x = [chart_label(f"{t.type} ({t.group_size} ranks)") for t in by_type]
    data = [{"type": "bar", "name": name, "x": x, "y": [getattr(t, key) for t in by_type], "marker": {"color": color},
             "hovertemplate": "%{x}: %{y:.3f} ms"}
            for key, name, color in (("skew_mean_ms", "arrival skew, mean", "#ef6c00"),
                                     ("skew_max_ms", "arrival skew, max", "#c62828"),
                                     ("transfer_ms", "transfer (min duration across ranks), total", "#1976d2"))]
    out += ["<h3>Arrival skew by collective type</h3>",
            note(f"{value_text(coll.count)} collectives matched across ranks. Skew = last start − first start "
                 f"of one collective; transfer = its shortest duration on any rank (docs/concepts.md, Collective)."),
            one_chart(figures, "chart-collective-skew", data,
                      chart_layout("collective", "ms", 340, len(x), barmode="group")),
            html_table(["type", "group size", "count", "bytes", "transfer ms", "skew mean ms", "skew max ms",
                        "algbw GB/s", "busbw GB/s", "most often last"],
                       [[t.type, t.group_size, t.count, t.total_bytes, t.transfer_ms, t.skew_mean_ms, t.skew_max_ms,
                         t.algbw_gbps, t.busbw_mean_gbps, t.most_often_last] for t in by_type], set(range(1, 10)))]
    out.append(_rank_wait(report, figures))
    return "".join(out) + "</section>"


def _critical_path(report: Analysis, figures: Figures) -> str:
    """The critical path: its largest parts, the what-ifs, and a swimlane of the slowest and the
    median step (ranks x time, collectives with their waits, the path highlighted)."""
    cp = report.critical_path
    if not cp or len(report.ranks) < 2:
        return ""
    owner = (f"rank {cp.owner} holds {cp.owner_pct:.0f}% of it" if cp.owner is not None
             else f"no single rank holds it (at most {cp.owner_pct:.0f}% on one rank)")
    out = ['<section id="critical-path"><h2>Critical path</h2>',
           note(f"The chain of work across ranks that set each step's end: walked back from the rank whose step "
                f"ends last, through each collective to its last arriver (and pipeline recvs to their sends); "
                f"mean {value_text(cp.step_ms)} ms per step; {owner}."),
           html_table(["rank", "category", "ms per step", "% of step"],
                      [[x.rank, x.category, x.ms_per_step, x.pct_of_step] for x in cp.by_rank_category[:12]],
                      {0, 2, 3})]
    if cp.what_if:
        out += ["<h3>What-if (the step re-timed through the same dependencies)</h3>",
                html_table(["change", "step ms saved"], [[w.change, w.step_ms_saved] for w in cp.what_if], {1}),
                note(f"Replay: re-timed with no change, the steps come out at {value_text(cp.replayed_step_ms)} ms "
                     f"against {value_text(cp.measured_step_ms)} ms measured (the longest rank's step, mean): "
                     f"error {value_text(cp.replay_error_pct)}% (worst step "
                     f"{value_text(cp.replay_error_max_pct)}%), how far the model of dependencies holds the "
                     f"data. A finding's saving is the what-if of its fix, the same number as here.")]
    paths = {p.step: p for p in cp.steps}
    for k, lane_set in enumerate(cp.swimlanes):
        lanes = lane_set.lanes
        stragglers = {st.rank for st in report.stragglers}
        y_of = {ln.rank: f"rank {ln.rank}" + (" (straggler)" if ln.rank in stragglers else "") for ln in lanes}
        data = [{"type": "bar", "orientation": "h", "name": "step window", "y": [y_of[ln.rank] for ln in lanes],
                 "base": [ln.step_start_ms for ln in lanes],
                 "x": [ln.step_end_ms - ln.step_start_ms for ln in lanes],
                 "marker": {"color": "#eceff1"}, "hoverinfo": "skip", "width": 0.9}]
        for part, color, lo, hi, pp in (("waiting for the last member", "#ffb74d", 0, 1, False),
                                        ("pipeline bubble (waiting on a neighbour stage)", "#ce93d8", 0, 1, True),
                                        ("collective after the last arrival", "#64b5f6", 1, 2, None)):
            ys, bases, xs, texts = [], [], [], []
            for ln in lanes:
                for c, name in zip(ln.collectives, ln.names):
                    if c[hi] > c[lo] and (pp is None or pp == name.endswith("(pp)")):
                        ys.append(y_of[ln.rank]); bases.append(c[lo]); xs.append(c[hi] - c[lo]); texts.append(name)
            if not ys and pp:
                continue
            data.append({"type": "bar", "orientation": "h", "name": part, "y": ys, "base": bases, "x": xs,
                         "text": [chart_label(t) for t in texts], "textposition": "none", "width": 0.6,
                         "marker": {"color": color},
                         "hovertemplate": "rank %{y}: %{text}, %{base:.2f} + %{x:.2f} ms<extra></extra>"})
        path = paths.get(lane_set.step)
        if path:
            # the path as one line, in time order: along a rank, and a jump where it moves to another
            line_x, line_y = [], []
            for sg in path.segments:
                if sg.rank in y_of:
                    line_x += [sg.start_ms, sg.start_ms + sg.dur_ms]
                    line_y += [y_of[sg.rank]] * 2
            data.append({"type": "scatter", "mode": "lines", "name": "critical path", "x": line_x, "y": line_y,
                         "line": {"color": "#000000", "width": 1.5}, "hoverinfo": "skip"})
            for cat in BREAKDOWN_CATEGORIES:
                segs = [sg for sg in path.segments if sg.category == cat]
                if segs:
                    data.append({"type": "bar", "orientation": "h", "name": f"path: {CATEGORY_LABELS[cat]}",
                                 "y": [y_of.get(sg.rank, f"rank {sg.rank}") for sg in segs],
                                 "base": [sg.start_ms for sg in segs], "x": [sg.dur_ms for sg in segs],
                                 "text": [chart_label(sg.name) for sg in segs], "textposition": "none",
                                 "width": 0.25, "marker": {"color": CATEGORY_COLORS[cat],
                                                           "line": {"color": "#000000", "width": 0.5}},
                                 "hovertemplate": "path on rank %{y}: %{text}, %{x:.2f} ms<extra></extra>"})
        height = max(300, min(1800, 120 + 14 * len(lanes)))
        layout = chart_layout("ms from the step's start", "", height, barmode="overlay",
                              margin={"l": 140, "r": 20, "t": 30, "b": 60},
                              xaxis={"title": {"text": "ms from the step's start"}, "type": "linear"},
                              yaxis={"type": "category", "autorange": "reversed", "tickmode": "array",
                                     "tickvals": [y_of[ln.rank] for ln in lanes],
                                     "ticktext": [y_of[ln.rank] for ln in lanes]})
        out += [f"<h3>Swimlane: {escaped(lane_set.label)} (step {lane_set.step})</h3>",
                note(f"The ranks on this step's critical path, the stragglers, then their collectives' peers "
                     f"({len(lanes)} of {len(report.ranks):,} ranks): each rank's step (grey), its collectives: "
                     f"the wait for the last member (orange; a pipeline stage's wait for its neighbour: the bubble, "
                     f"violet) and the rest (blue); the critical path drawn over them in the colors of the step "
                     f"breakdown, joined by a black line where it moves from rank to rank."),
                one_chart(figures, f"chart-swimlane-{k}", data, layout)]
    return "".join(out) + "</section>"


def _rank_wait(report: Analysis, figures: Figures) -> str:
    stats = {s.rank: s for s in report.rank_stats}
    ranks, capped = _pick_ranks(report, MAX_BAR_RANKS)
    shown = [stats[r.rank] for r in ranks if r.rank in stats]
    if not shown:
        return ""
    x = [str(s.rank) for s in shown]
    series = [(STRAGGLER["own_wait"], "#9e9e9e"), (STRAGGLER["wait_imposed"], "#ef6c00"),
              (STRAGGLER["cost"], "#c62828")]
    data = [{"type": "bar", "name": f.html, "x": x, "y": [getattr(s, f.json_key()) for s in shown],
             "marker": {"color": color}, "hovertemplate": "rank %{x}: %{y:.3f} ms per step"} for f, color in series]
    return ("<h3>Wait per rank</h3>"
            + note(html_legend(*(f for f, _ in series)) + " The straggler verdict compares the cost, evaluated "
                   "for the ranks most often last only (no bar for the others).") + note(capped)
            + one_chart(figures, "chart-rank-wait", data,
                        chart_layout("rank", "ms per step", 340, len(x), barmode="group")))


def _overlap(report: Analysis, figures: Figures) -> str:
    ranks, capped = _pick_ranks(report, MAX_BAR_RANKS)
    head = '<section id="overlap"><h2>Communication / computation overlap</h2>'
    if all(r.overlap_pct is None and r.overlap_efficiency is None for r in ranks):
        return head + note("No communication on any rank: nothing to overlap.") + "</section>"
    x = [str(r.rank) for r in ranks]
    hidden, efficiency = DETAILS["overlap_pct"], BREAKDOWN["overlap_efficiency"]
    data = [{"type": "bar", "name": f"{hidden.html}, %", "x": x, "y": [getattr(r, hidden.json_key()) for r in ranks],
             "marker": {"color": "#00897b"}, "hovertemplate": "rank %{x}: %{y:.1f}%"},
            {"type": "bar", "name": f"{efficiency.html}, %", "x": x,
             "y": [None if (v := getattr(r, efficiency.json_key())) is None else round(100 * v, 2) for r in ranks],
             "marker": {"color": "#5c6bc0"}, "hovertemplate": "rank %{x}: %{y:.1f}%"}]
    layout = chart_layout("rank", "%", 340, len(x), barmode="group")
    layout["yaxis"]["range"] = [0, 105]
    return (head + note(html_legend(hidden, efficiency) + " Both are high when communication is hidden under "
                        "compute.")
            + note(capped) + one_chart(figures, "chart-overlap", data, layout) + "</section>")


def _idle(report: Analysis, figures: Figures) -> str:
    ranks, capped = _pick_ranks(report, MAX_BAR_RANKS)
    out = ['<section id="idle"><h2>Device idle time</h2>', note(capped)]
    idle = [(r, r.idle_ms_summed_over_streams) for r in ranks if r.idle_ms_summed_over_streams]
    if idle:
        parts = {"host_wait": DETAILS["host_wait"], "kernel_wait": DETAILS["kernel_wait"],
                 "other": DETAILS["other_wait"]}
        data = [{"type": "bar", "name": f.html, "x": [str(r.rank) for r, _ in idle],
                 "y": [v.get(p) for _, v in idle],
                 "customdata": [r.idle_streams for r, _ in idle], "marker": {"color": IDLE_COLORS[p]},
                 "hovertemplate": "rank %{x}: %{y:.3f} ms, summed over %{customdata} streams"}
                for p, f in parts.items()]
        out += ["<h3>Idle categories (HTA), summed over each rank's streams</h3>",
                note(html_legend(*parts.values()) + " Each stream's idle time counts: a rank's sum over its "
                     "streams is no wall time and can exceed the trace's time span."),
                one_chart(figures, "chart-idle-hta", data,
                          chart_layout("rank", "ms, summed over the rank's streams", 340, len(idle)))]
    gaps = [(r.rank, r.idle_gaps.gap_ms_by_host_activity if r.idle_gaps else None) for r in ranks]
    if any(v for _, v in gaps):
        data = _bars_by_rank(gaps, GAP_COLORS, {k: f.html_label() for k, f in GAPS.items()}, "ms")
        gap_min = next(r.idle_gaps.gap_min_us for r in ranks if r.idle_gaps)
        out += ["<h3>Idle gaps by what the host was doing</h3>",
                note(f"Device idle stretches of at least {value_text(gap_min, 0)} µs inside steps, total ms, split by "
                     f"the host's activity during the gap. " + html_legend(*GAPS.values())),
                one_chart(figures, "chart-idle-gaps", data, chart_layout("rank", "ms", 340, len(ranks)))]
    if len(out) == 2:
        out.append(note(f"No device idle figures (no GPU events: {_no_device_words(report)})."))
    return "".join(out) + "</section>"


# ---------------------------------------------------------------------------------------- one rank at a time

def _rank_detail(report: Analysis, figures: Figures) -> str:
    ranks, capped = _pick_ranks(report, MAX_DETAIL_RANKS)
    flagged = [s.rank for s in report.stragglers]
    slowest = max(ranks, key=lambda r: (r.rank in flagged, r.step_time_ms.mean or 0))
    initial = str(slowest.rank)
    options = "".join(f'<option value="{r.rank}"{" selected" if str(r.rank) == initial else ""}>'
                      f'rank {r.rank}</option>' for r in ranks)
    charts: list[str] = []
    kernels = _kernels(ranks, initial, figures, charts, report)
    gaps = _top_gaps(ranks, initial)
    memory = _memory(ranks, initial, figures, charts)
    select = (f'<p><label>Rank: <select id="rank-select" data-group="rank" data-charts="{" ".join(charts)}">'
              f"{options}</select></label></p>")
    return ('<section id="rank-detail"><h2>One rank in detail</h2>'
            + note("Kernels, idle gaps and memory of the rank chosen here (first shown: "
                   + ("a straggler" if slowest.rank in flagged else "the slowest rank by mean step time")
                   + ").") + note(capped) + select + kernels + gaps + memory + "</section>")


def _member(initial: str, key: str, inner: str) -> str:
    hidden = "" if key == initial else " hidden"
    return f'<div data-member-of="rank" data-key="{escaped(key)}"{hidden}>{inner}</div>'


def _kernels(ranks: list[RankReport], initial: str, figures: Figures, charts: list[str], report: Analysis) -> str:
    head = '<h3 id="kernels">Kernels by class</h3>'
    if not any(r.kernels for r in ranks):
        return head + note(f"No device kernels ({_no_device_words(report)}).")
    variants: dict[str, JsonDict] = {}
    tables: list[str] = []
    for r in ranks:
        key = str(r.rank)
        breakdown = r.kernels.breakdown if r.kernels else None
        classes = breakdown.classes if breakdown else None
        if breakdown is None or classes is None or not classes.kernel_class:
            variants[key] = {"data": [], "layout": _empty_layout(f"rank {key}: no device kernels")}
            tables.append(_member(initial, key, ""))
            continue
        variants[key] = {"data": [{"type": "pie", "labels": [chart_label(c) for c in classes.kernel_class],
                                   "values": classes.sum_ms, "sort": False, "hole": 0.35,
                                   "marker": {"colors": [CLASS_COLORS.get(c, "#9e9e9e")
                                                         for c in classes.kernel_class]},
                                   "hovertemplate": "%{label}: %{value:.3f} ms (%{percent})<extra></extra>"}],
                         "layout": {"height": 300, "margin": {"l": 20, "r": 20, "t": 30, "b": 20},
                                    "title": {"text": f"rank {key}: kernel time by class (sum of durations, ms)",
                                              "font": {"size": 13}}}}
        top = breakdown.top_kernels
        rows = [[cls, name_cell(name), count, sum_us / 1000, mean_us, share]
                for cls, name, count, sum_us, mean_us, share in zip(
                    top.kernel_class, top.name, top.count, top.sum_us, top.mean_us, top.share_of_class_pct)]
        tables.append(_member(initial, key, html_table(["class", "kernel", "count", "total ms", "mean µs",
                                                        "% of class"], rows, {2, 3, 4, 5})))
    charts.append("chart-kernel-classes")
    return (head + note("Kernel classes COMP / COMM / MEM (docs/concepts.md); top kernels per class by total "
                        "time, the rest of each class folded into \"others\".")
            + chart(figures, "chart-kernel-classes", variants, initial) + "".join(tables))


def _top_gaps(ranks: list[RankReport], initial: str) -> str:
    if not any(r.idle_gaps and r.idle_gaps.top for r in ranks):
        return ""
    members = []
    for r in ranks:
        top = (r.idle_gaps.top if r.idle_gaps else [])[:MAX_LISTED_GAPS]
        rows = [[str(g.step), g.start_in_step_ms, g.duration_ms, g.host_activity,
                 name_cell((g.next_device_op or "–") + GAP_POSITIONS.get(g.position, ""), 60),
                 name_cell(g.launched_by or "–", 40),
                 name_cell(g.busy_host_op or "–", 40)] for g in top]
        members.append(_member(initial, str(r.rank), html_table(
            ["step", "start in step ms", "duration ms", "host was in", "next device op", "launched by",
             "busiest host op"], rows, {0, 1, 2}) if rows else note("No idle gaps on this rank.")))
    return ('<h3 id="idle-gaps">Longest device idle gaps</h3>'
            + note(f"The {MAX_LISTED_GAPS} longest gaps and what each was waiting for: the host's activity, and "
                   f"the device op that ended it.")
            + "".join(members))


def _memory(ranks: list[RankReport], initial: str, figures: Figures, charts: list[str]) -> str:
    head = '<h3 id="memory">Memory timeline</h3>'
    if not any(r.memory for r in ranks):
        return head + note("No [memory] events (record them with torch.profiler(profile_memory=True)).")
    variants: dict[str, JsonDict] = {}
    tables: list[str] = []
    for r in ranks:
        key = str(r.rank)
        memory = r.memory
        devices = memory.timeline.device if memory else []
        if not memory or not devices:
            variants[key] = {"data": [], "layout": _empty_layout(f"rank {key}: no [memory] events")}
            tables.append(_member(initial, key, ""))
            continue
        data: list[JsonDict] = []
        for device in dict.fromkeys(devices):
            at = [i for i, d in enumerate(devices) if d == device]
            t_ms = [memory.timeline.t_ms[i] for i in at]
            for series, dash in (("allocated_mb", "solid"), ("reserved_mb", "dash")):
                values = [getattr(memory.timeline, series)[i] for i in at]
                if any(v is not None for v in values):
                    data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "dash": dash},
                                 "name": chart_label(f"{device} {series.removesuffix('_mb')}"), "x": t_ms, "y": values,
                                 "hovertemplate": "%{x:.1f} ms: %{y:.1f} MB"})
        layout = chart_layout("time since the trace's first event (ms)", "MB", 360, showlegend=True,
                              xaxis={"title": {"text": "time since the trace's first event (ms)"}})
        variants[key] = {"data": data, "layout": layout}
        tables.append(_member(initial, key, html_table(
            ["device", "peak allocated MB", "peak reserved MB", "fragmentation MB", "capacity MB",
             "peak % of capacity", "peak at step", "notes"],
            [[d.device, d.peak_allocated_mb, d.peak_reserved_mb, d.fragmentation_mb, d.capacity_mb,
              d.peak_allocated_pct_of_capacity, d.peak_allocated_step, "; ".join(d.notes)] for d in memory.devices],
            {1, 2, 3, 4, 5, 6})))
    charts.append("chart-memory")
    return (head + note("Allocator totals per device (solid: allocated, dashed: reserved), at most 200 samples "
                        "per device that keep both peaks.")
            + chart(figures, "chart-memory", variants, initial) + "".join(tables))
