"""An invariant checker for `analyze`'s outputs (issue 16 A): whatever the trace, the figures must not
contradict each other.

`violations(analysis)` renders one Analysis three ways (`outputs`: the JSON as --json prints it, the terminal
report, the HTML page) and returns every broken invariant as a line of text (`check`); an empty list: all hold.

  * step breakdown: per rank and step the eight parts sum to the step (0.1 %), each within [0, step];
  * every percentage of the JSON (`*_pct`) within [0, 100];
  * per-stream sums: the HTA idle figures summed over a rank's streams live under a key that says so,
    each stream's idle time is within the span it was measured over, and the terminal and the HTML name
    them as sums over streams;
  * overlap: overlap efficiency > 0 wherever comm_overlapped > 0 and compute and comm both run, and equal
    to its definition from the breakdown's own columns; the HTA overlap within [0, 100];
  * the straggler verdict: consistent with the figures it prints and the bars in straggler_thresholds;
  * names: each name of render/figures.py shows in the terminal and the HTML the figure its JSON key
    holds (the values are compared), and no name stands for two keys;
  * the job header says how many steps, then their ids;
  * parallel layout: each dimension's groups are disjoint and of its size, the dimensions' sizes
    multiply to at most the world size; per rank the communication per dimension sums to the
    breakdown's comm_overlapped + comm_exposed; pipeline stages are the positions in the pp groups;
  * critical path: each step's segments tile it (sum within 2 %, in time order, no overlap), with
    breakdown categories; what-ifs save at most the step;
  * one estimate per fix: each finding's evidence.step_ms_saved equals the step_ms_saved of the what-if
    it names (what_if_key, within 1 %) and its summary prints that number; no saving is negative; no
    overlap what-if saves more than the exposed communication on the path (its segments' comm_exposed,
    per step); no straggler verdict of "no collective matched" on a pipeline (its send/recv are matched);
  * waits as a union: a rank's own waits per step (rank_stats) are at most its mean step;
  * one denominator: every "% of the median step" of a finding (step_pct_saved, cost_pct_of_step) is its
    ms over the job's median step, the median of every step of every rank in the JSON's `steps`.

Expected values come from the definitions (docs/json-schema.md, render/figures.py), applied here to the
JSON's own numbers, never from rankscope's arithmetic.
"""
from __future__ import annotations

import html
import io
import json
import re
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from rankscope.analyses.rank.breakdown import CATEGORIES as BREAKDOWN_CATEGORIES
from rankscope.render.base import render
from rankscope.render.figures import BREAKDOWN, TABLES, Figure
from rankscope.render.html import render_html
from conftest import as_report, report_json

#: The JSON rounds ms to 3 decimals.
MS_ROUNDING = 0.0005
#: Float noise allowed on a percentage bound (a share of a whole computed twice).
PCT_NOISE = 1e-6


@dataclass
class Outputs:
    """One analysis as each output has it."""
    report: dict                 # the rankscope.analysis/1 object, through JSON text and back
    tables: list[Table]          # the terminal's tables, as printed
    text: str                    # the terminal report (400 columns: nothing wraps a table)
    page: str                    # the HTML page
    charts: dict                 # the HTML page's chart specs by id (variant "all" where there is one)


class _Recorder(Console):
    """A console that keeps the tables it prints."""

    def __init__(self) -> None:
        super().__init__(width=400, file=io.StringIO(), color_system=None, record=True)
        self.tables: list[Table] = []

    def print(self, *objects, **options) -> None:
        self.tables += [o for o in objects if isinstance(o, Table)]
        super().print(*objects, **options)


def outputs(analysis) -> Outputs:
    report = report_json(analysis)
    console = _Recorder()
    render(analysis, "terminal", console)
    page = render_html(as_report(report))
    block = re.search(r'id="rankscope-figures">(.*?)</script>', page, re.DOTALL).group(1)
    charts = {k: v["variants"].get("all", v["variants"].get(v["initial"])) for k, v in json.loads(block).items()}
    return Outputs(report, console.tables, console.export_text(), page, charts)


def violations(analysis) -> list[str]:
    """Every broken invariant of `analysis`'s outputs."""
    return check(outputs(analysis))


def check(out: Outputs) -> list[str]:
    """Every broken invariant of rendered outputs."""
    return (breakdown_sums(out.report) + percentages(out.report) + per_stream_sums(out) + overlap(out.report)
            + straggler_verdict(out) + names(out) + steps_header(out) + parallel_layout(out.report)
            + critical_path(out.report) + one_estimate_per_fix(out) + waits_union(out.report)
            + one_denominator(out.report))


# ---------------------------------------------------------------------------------------------- the checks

def breakdown_sums(report: dict) -> list[str]:
    bad = []
    for s in report["steps"]:
        parts, step = s["breakdown_ms"], s["duration_ms"]
        where = f"rank {s['rank']} step {s['step']}"
        if abs(sum(parts.values()) - step) > 0.001 * step + len(parts) * MS_ROUNDING:
            bad.append(f"{where}: parts sum to {sum(parts.values())} ms, the step is {step} ms")
        bad += [f"{where}: {k} = {v} ms outside [0, {step}]" for k, v in parts.items()
                if not -MS_ROUNDING <= v <= step + MS_ROUNDING]
    for r in report["ranks"]:
        mean, parts = r["step_time_ms"]["mean"], r["breakdown_ms"]
        if parts and abs(sum(parts.values()) - mean) > 0.001 * mean + len(parts) * MS_ROUNDING:
            bad.append(f"rank {r['rank']}: mean parts sum to {sum(parts.values())} ms, the mean step is {mean} ms")
    return bad


def percentages(report: dict) -> list[str]:
    bad = []

    def walk(x, path: str, pct: bool) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}.{k}", pct or k.endswith("_pct"))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]", pct)
        elif pct and isinstance(x, (int, float)) and not isinstance(x, bool) and not -PCT_NOISE <= x <= 100 + PCT_NOISE:
            bad.append(f"{path} = {x}: a percentage outside [0, 100]")

    walk(report, "", False)
    return bad


def per_stream_sums(out: Outputs) -> list[str]:
    """The HTA idle figures are sums over streams: under a key that says so (the stable `idle_ms` kept as the
    same sums), each stream's share within the span, and the terminal and HTML labels say "summed"."""
    bad = []
    for r in out.report["ranks"]:
        hta, where = r.get("hta"), f"rank {r['rank']}"
        if not hta:
            if r.get("idle_ms_summed_over_streams") is not None:
                bad.append(f"{where}: idle sums without HTA figures")
            continue
        streams = hta["idle"]["streams"]
        sums = {c: sum(s["idle_ms"][c] for s in streams) for c in ("host_wait", "kernel_wait", "other")}
        got = r.get("idle_ms_summed_over_streams") or {}
        if any(c not in got or abs(got[c] - v) > 1e-6 for c, v in sums.items()):
            bad.append(f"{where}: idle_ms_summed_over_streams {got} is not the sum over its streams {sums}")
        if r.get("idle_ms") != got:
            bad.append(f"{where}: idle_ms {r.get('idle_ms')} differs from idle_ms_summed_over_streams {got}")
        if r.get("idle_streams") != len(streams):
            bad.append(f"{where}: idle_streams {r.get('idle_streams')} but {len(streams)} streams")
        span = hta["temporal"]["span_ms"]
        bad += [f"{where} stream {s['stream']}: {s['idle_total_ms']} ms idle in a {span} ms span" for s in streams
                if span is not None and s["idle_total_ms"] > span + 1e-6]
    summed = [f for t in TABLES.values() for f in t.values() if f.json and "summed_over_streams" in f.json]
    shown = {c.header for t in out.tables for c in t.columns}
    bad += [f"terminal column {f.terminal!r} sums over streams without saying so" for f in summed
            if f.terminal in shown and "Σ streams" not in f.terminal]
    if any(f.terminal in shown for f in summed) and TABLES["details"]["streams"].terminal not in shown:
        bad.append("terminal: per-stream sums shown without the number of streams")
    for chart_id, spec in out.charts.items():
        for trace in spec["data"]:
            if any(trace.get("name") == f.html for f in summed) and \
                    "summed over" not in spec["layout"]["yaxis"]["title"]["text"]:
                bad.append(f"HTML {chart_id}: per-stream sums drawn on an axis that does not say so")
    return bad


def overlap(report: dict) -> list[str]:
    """overlap efficiency = comm_overlapped / min(compute + comm_overlapped, comm_overlapped + comm_exposed)."""
    bad = []
    for r in report["ranks"]:
        where, parts, eff = f"rank {r['rank']}", r["breakdown_ms"], r.get("overlap_efficiency")
        if r.get("overlap_pct") is not None and not 0 <= r["overlap_pct"] <= 100 + PCT_NOISE:
            bad.append(f"{where}: comm overlapped by compute {r['overlap_pct']}% outside [0, 100]")
        if not parts:
            continue
        both = parts["comm_overlapped"]
        comp, comm = parts["compute"] + both, both + parts["comm_exposed"]
        if eff is None:
            if min(comp, comm) > 2 * MS_ROUNDING:
                bad.append(f"{where}: no overlap efficiency, but compute {comp} ms and comm {comm} ms")
            continue
        if both > MS_ROUNDING and eff <= 0:
            bad.append(f"{where}: overlap efficiency {eff} with {both} ms of comm overlapped")
        lo = min(comp, comm)
        if lo > 0.01 and abs(eff - min(1.0, both / lo)) > 3 * MS_ROUNDING / lo + 1e-4:
            bad.append(f"{where}: overlap efficiency {eff}, its definition gives {both / lo:.4f}")
    return bad


def straggler_verdict(out: Outputs) -> list[str]:
    """A reported straggler's cost >= the bar and printed as the JSON has it; with none, every rank with the
    last-arrival share costs less than the bar, and the rank the verdict names is printed with its figures."""
    report = out.report
    verdict, found = report["straggler_verdict"], report["stragglers"]
    bars = report.get("straggler_thresholds") or {}
    stats = {s["rank"]: s for s in report.get("rank_stats") or []}
    bad = []
    if len(report["ranks"]) > 1 and stats and " ".join(verdict.split()) not in " ".join(out.text.split()):
        bad.append("terminal: the straggler verdict differs from the JSON's")
    if html.escape(verdict) not in out.page:
        bad.append("HTML: the straggler verdict differs from the JSON's")
    if not stats:
        return bad + [f"rank {s['rank']}: a last-arrival share without collectives" for s in found
                      if s.get("last_arrival_pct") is not None]
    bar, share_min = bars["min_cost_ms_per_step"], 100 * bars["last_share_min"]

    def share(s: dict) -> float:
        return max(s["last_arrival_pct"] or 0.0, s["lateness_share_pct"] or 0.0)

    for s in found:
        if s.get("last_arrival_pct") is None:
            continue
        if s["cost_ms_per_step"] < bar:
            bad.append(f"straggler rank {s['rank']} costs {s['cost_ms_per_step']} ms/step, under the bar {bar}")
        if f"rank {s['rank']} is a straggler" not in verdict or \
                f"costs {s['cost_ms_per_step']:.2f} ms/step >= {bar:.2f}" not in verdict:
            bad.append(f"the verdict does not print rank {s['rank']}'s cost and the bar: {verdict!r}")
    if found:
        return bad
    missed = [r for r, s in stats.items() if share(s) >= share_min and (s["cost_ms_per_step"] or 0.0) >= bar]
    bad += [f"rank {r} passes both bars but no straggler is reported" for r in missed]
    m = re.search(r"highest cost: rank (\d+), ([\d.]+) ms/step \(last at (\d+)%, (\d+)% of the lateness; the "
                  r"others waited ([\d.]+) ms/step", verdict)
    if m:
        r, cost, last, lateness, wait = int(m[1]), float(m[2]), int(m[3]), int(m[4]), float(m[5])
        s = stats[r]
        if f"costs >= {bar:.2f} ms/step" not in verdict:
            bad.append(f"the verdict does not print the cost bar {bar:.2f}: {verdict!r}")
        if not s["cost_ms_per_step"] < bar or cost > round(bar, 2):
            bad.append(f"no straggler, yet the highest cost {s['cost_ms_per_step']} is not under the bar {bar}")
        printed = (cost, last, lateness, wait)
        actual = (round(s["cost_ms_per_step"], 2), round(s["last_arrival_pct"] or 0),
                  round(s["lateness_share_pct"] or 0), round(s["wait_imposed_ms_per_step"], 2))
        if printed != actual or share(s) < share_min:
            bad.append(f"the verdict prints rank {r} as {printed}, the JSON has {actual} (share {share(s)})")
        if "cost = " not in verdict:
            bad.append("the verdict compares a cost without defining it")
    elif (m := re.search(r"most often last: rank (\d+)", verdict)) and share(stats[int(m[1])]) >= share_min:
        bad.append(f"the verdict says no rank reaches the share bar, rank {m[1]} does: {verdict!r}")
    return bad


def _entries(out: Outputs, table: str) -> dict[int, dict]:
    """The JSON entries a table's figures are keys of, by rank."""
    rows = out.report["stragglers"] if table == "straggler" else out.report["ranks"]
    return {e["rank"]: e for e in rows}


def _value(entry: dict, key: str):
    for k in key.split("."):
        entry = entry.get(k) if isinstance(entry, dict) else None
    return entry


def _shows(cell: str, value) -> bool:
    """Whether a terminal cell shows `value` (to the digits it prints; '-' or 'n/a' for None)."""
    cell = cell.strip()
    if value is None:
        return cell in ("-", "n/a")
    try:
        shown = float(cell.rstrip("%").replace(",", ""))
    except ValueError:
        return False
    digits = len(cell.rstrip("%").partition(".")[2])
    return abs(shown - value) <= 0.5 * 10 ** -digits + 0.006


def names(out: Outputs) -> list[str]:
    """Each glossary name stands for one key, and shows that key's values in the terminal and the HTML."""
    bad = []
    by_name: dict[tuple[str, str], set[str]] = {}
    for table, figures in TABLES.items():
        for f in figures.values():
            for where, name in (("terminal", f.terminal), ("HTML", f.html)):
                if name:
                    by_name.setdefault((where, name), set()).add(f.json or f"{table}:{name}")
    bad += [f"{where} name {name!r} stands for {sorted(keys)}" for (where, name), keys in by_name.items()
            if len(keys) > 1]
    for t in out.tables:
        headers = [c.header for c in t.columns]
        for table, figures in TABLES.items():
            shown = [f for f in figures.values() if f.terminal in headers]
            if not shown or len(shown) < len([f for f in figures.values() if f.terminal]):
                continue
            ranks = [int(x) for x in t.columns[headers.index("rank")].cells]
            entries = _entries(out, table)
            for f in shown:
                if f.json is None:
                    continue
                cells = list(t.columns[headers.index(f.terminal)].cells)
                bad += [f"terminal {f.terminal!r} rank {r}: shows {c!r}, JSON {f.json} = {_value(entries[r], f.json)}"
                        for r, c in zip(ranks, cells) if not _shows(c, _value(entries[r], f.json))]
        unknown = set(headers) - {"rank", "cause"} - {f.terminal for t2 in TABLES.values() for f in t2.values()}
        if any(set(headers) & {f.terminal for f in figs.values()} for figs in TABLES.values()) and unknown:
            bad.append(f"terminal table {t.title!r}: columns {sorted(unknown)} have no entry in render/figures.py")
    bad += _html_names(out)
    return bad


def _html_names(out: Outputs) -> list[str]:
    """Chart series named after a figure draw that figure's JSON values (overlap efficiency in percent)."""
    bad = []
    labels: dict[str, tuple[str, Figure, float]] = {}
    for table, figures in TABLES.items():
        for f in figures.values():
            if f.html and f.json:
                scale = 100.0 if f is BREAKDOWN["overlap_efficiency"] else 1.0
                labels[f.html] = labels[f"{f.html}, %"] = (table, f, scale)
    stats = {s["rank"]: s for s in out.report.get("rank_stats") or []}
    for chart_id, spec in out.charts.items():
        for trace in spec["data"]:
            if trace.get("name") not in labels or trace.get("type") != "bar":
                continue
            table, f, scale = labels[trace["name"]]
            entries = stats if table == "straggler" else _entries(out, table)
            for x, y in zip(trace["x"], trace["y"]):
                v = _value(entries[int(x)], f.json)
                if (v is None) != (y is None) or (v is not None and abs(v * scale - y) > 0.01):
                    bad.append(f"HTML {chart_id} {trace['name']!r} rank {x}: draws {y}, JSON {f.json} = {v}")
            if html.escape(f.definition) not in out.page:
                bad.append(f"HTML {chart_id} draws {f.html!r} without its definition")
    return bad


def steps_header(out: Outputs) -> list[str]:
    """The header says how many steps, then their ids (a single step #6 is "1 (#6)", never "6")."""
    steps = out.report["job"]["steps"]
    if not steps:
        return []
    count = f"steps profiled: {len(steps)} (#"
    return [] if count in out.text else [f"terminal header: no {count!r}"]


def parallel_layout(report: dict) -> list[str]:
    bad = []
    dims = (report.get("parallelism") or {}).get("dims") or []
    product = 1
    for d in dims:
        seen: set[int] = set()
        for g in d["groups"]:
            if len(g) != d["size"]:
                bad.append(f"dimension {d['name']}: group {g} has {len(g)} ranks, the dimension's size is {d['size']}")
            if seen & set(g):
                bad.append(f"dimension {d['name']}: group {g} shares ranks with another group")
            seen |= set(g)
        product *= d["size"]
    world = report["job"].get("world_size")
    if world and product > world:
        bad.append(f"layout {report['parallelism']['layout']!r}: sizes multiply to {product} > world size {world}")
    for r in report["ranks"]:
        by_dim, parts = r.get("comm_by_dim_ms"), r.get("breakdown_ms")
        if by_dim is None or not parts:
            continue
        total = sum(v["overlapped"] + v["exposed"] for v in by_dim.values())
        want = parts["comm_overlapped"] + parts["comm_exposed"]
        if abs(total - want) > 0.001 * max(want, 1.0) + 2 * len(by_dim) * MS_ROUNDING:
            bad.append(f"rank {r['rank']}: communication per dimension sums to {total} ms, the breakdown's "
                       f"communication is {want} ms")
    pipe = report.get("pipeline")
    pp = next((d for d in dims if d["name"] == "pp"), None)
    if pipe and pp:
        for st in pipe["stages"]:
            want = sorted(g[st["stage"]] for g in pp["groups"] if len(g) == pp["size"])
            if sorted(st["ranks"]) != want:
                bad.append(f"pipeline stage {st['stage']}: ranks {st['ranks']}, position {st['stage']} of the pp "
                           f"groups is {want}")
    return bad


def critical_path(report: dict) -> list[str]:
    bad = []
    cp = report.get("critical_path")
    if not cp:
        return bad
    categories = set(BREAKDOWN_CATEGORIES)
    for p in cp["steps"]:
        covered = sum(sg["dur_ms"] for sg in p["segments"])
        if abs(covered - p["duration_ms"]) > 0.02 * p["duration_ms"] + MS_ROUNDING:
            bad.append(f"critical path step {p['step']}: segments cover {covered} ms of {p['duration_ms']} ms")
        end = 0.0
        for sg in p["segments"]:
            if sg["start_ms"] < end - 1e-3:
                bad.append(f"critical path step {p['step']}: a segment at {sg['start_ms']} ms starts before the "
                           f"previous one ends ({end} ms)")
            end = sg["start_ms"] + sg["dur_ms"]
            if sg["category"] not in categories:
                bad.append(f"critical path step {p['step']}: category {sg['category']!r}")
    for w in cp["what_if"]:
        if w["step_ms_saved"] > cp["step_ms"] + MS_ROUNDING:
            bad.append(f"what-if {w['change']!r} saves {w['step_ms_saved']} ms of a {cp['step_ms']} ms step")
    return bad


def one_estimate_per_fix(out: Outputs) -> list[str]:
    """A finding's saving is its what-if's (1 %), printed in its summary; no saving negative; an overlap
    what-if saves at most the path's exposed communication; a pipeline's send/recv are matched."""
    report = out.report
    bad = []
    cp = report.get("critical_path") or {}
    what_ifs = {w.get("key"): w for w in cp.get("what_if") or []}
    for w in cp.get("what_if") or []:
        if w["step_ms_saved"] < 0:
            bad.append(f"what-if {w['change']!r} saves {w['step_ms_saved']} ms: a loss")
    n = len(cp.get("steps") or [])
    exposed = sum(sg["dur_ms"] for p in cp.get("steps") or [] for sg in p["segments"]
                  if sg["category"] == "comm_exposed") / n if n else 0.0
    for key, w in what_ifs.items():
        if key and key.startswith("overlap:") and w["step_ms_saved"] > exposed * 1.01 + MS_ROUNDING:
            bad.append(f"what-if {key} saves {w['step_ms_saved']} ms, the path holds {exposed:.3f} ms of exposed "
                       f"communication per step")
    for f in report["findings"]:
        ev = f["evidence"]
        if "step_ms_saved" not in ev:
            continue
        w = what_ifs.get(ev.get("what_if_key"))
        if w is None:
            bad.append(f"finding {f['id']}: step_ms_saved {ev['step_ms_saved']} from no what-if "
                       f"({ev.get('what_if_key')!r})")
            continue
        if ev["step_ms_saved"] < 0 or abs(ev["step_ms_saved"] - w["step_ms_saved"]) > \
                0.01 * abs(w["step_ms_saved"]) + MS_ROUNDING:
            bad.append(f"finding {f['id']}: step_ms_saved {ev['step_ms_saved']}, its what-if "
                       f"{w['key']} {w['step_ms_saved']}")
        if ev["what_if"] != w["change"]:
            bad.append(f"finding {f['id']}: names the what-if {ev['what_if']!r}, the list {w['change']!r}")
        if ev["step_ms_saved"] >= 0.05 and f"{ev['step_ms_saved']:,.1f} ms" not in f["summary"]:
            bad.append(f"finding {f['id']}: its summary does not print its saving {ev['step_ms_saved']:,.1f} ms")
    if report.get("pipeline") and report["collectives"]["count"] == 0 and \
            "no collective matched" in report["straggler_verdict"]:
        bad.append("a pipeline job whose send/recv no collective matched")
    return bad


def waits_union(report: dict) -> list[str]:
    """A rank waits at most its whole step: concurrent waits count once."""
    means = {r["rank"]: r["step_time_ms"]["mean"] for r in report["ranks"]}
    return [f"rank {s['rank']}: waits {s['own_wait_ms_per_step']} ms per step in a {means[s['rank']]} ms step"
            for s in report.get("rank_stats") or []
            if s["rank"] in means and means[s["rank"]] and s["own_wait_ms_per_step"] > means[s["rank"]] * 1.001 +
            MS_ROUNDING]


def one_denominator(report: dict) -> list[str]:
    """Every finding's "% of the median step" is its ms over the median of every rank's every step."""
    steps = sorted(s["duration_ms"] for s in report["steps"])
    if not steps:
        return []
    k = len(steps) // 2
    median_step = steps[k] if len(steps) % 2 else (steps[k - 1] + steps[k]) / 2
    bad = []
    if report.get("median_step_ms") is not None and abs(report["median_step_ms"] - median_step) > 1e-3 * median_step:
        bad.append(f"median_step_ms {report['median_step_ms']}, the median of the steps {median_step}")
    for f in report["findings"]:
        ev = f["evidence"]
        for ms_key, pct_key in (("step_ms_saved", "step_pct_saved"), ("cost_ms_per_step", "cost_pct_of_step")):
            if isinstance(ev.get(ms_key), (int, float)) and isinstance(ev.get(pct_key), (int, float)):
                want = 100.0 * ev[ms_key] / median_step
                if abs(ev[pct_key] - want) > 0.01 * want + 0.02:
                    bad.append(f"finding {f['id']}: {pct_key} {ev[pct_key]}, {ms_key} over the median step "
                               f"{median_step:.3f} ms gives {want:.2f}")
    return bad
