"""`rankscope diff` in the terminal (rich): the conclusion first, then what was compared, the
job-wide metrics with their tests, per rank, collectives and stragglers, findings, and the op- and
kernel-level diff by impact. Readable at 80 columns: no number is cut, and the name column takes
the room the numbers leave, different names shortened so that they look different. Renders a
`Diff`; computes nothing."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rankscope.results.diff import ALPHA, Comparison, Diff, NameDiff
from rankscope.render.base import TerminalRenderer
from rankscope.render.format import (distinct_shortened, literal, natural_width, number, p_value_text,
                                     print_table)
from rankscope.results import DiffResult

#: Rows of the per-rank table and of each name table (all are in --json).
MAX_RANK_ROWS = 16
MAX_NAME_ROWS = 10
#: The narrowest the name column gets: below it the table is let wider than the console.
MIN_NAME_WIDTH = 16

LABELS = {"step_time_ms": "step time ms", "gpu_idle_ms": "GPU idle ms", "gpu_idle_pct": "GPU idle %",
          "dataloader_share_pct": "DataLoader %", "collective_skew_ms": "arrival skew ms",
          "collective_transfer_ms": "transfer ms", "collective_wait_ms": "wait ms",
          "collective_busbw_gbps": "busbw GB/s"}


def metric_label(metric: str) -> str:
    group, _, part = metric.partition(".")
    return f"  {part.replace('_', ' ')}" if part else LABELS.get(metric, metric)


def _p(c: Comparison) -> str:
    """The p-value, starred when the change is significant."""
    return p_value_text(c.p_value) + ("*" if c.significant else " " if c.p_value is not None else "")


def _ci(c: Comparison) -> str:
    return "-" if c.ci is None else f"{c.ci[0]:+.1f}..{c.ci[1]:+.1f}"


def _table(title: str, columns: tuple[str, ...]) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
    for i, name in enumerate(columns):
        t.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    return t


def _metrics_table(title: str, metrics: dict[str, Comparison], console: Console) -> None:
    t = _table(title, ("metric", "before", "after", "delta", "delta %", "p", f"{100 * (1 - ALPHA):.0f}% CI"))
    for m, c in metrics.items():
        if m == "breakdown_ms.compute":
            t.add_row("step breakdown ms", style="dim")
        t.add_row(metric_label(m), number(c.before), number(c.after), number(c.delta), number(c.delta_pct, "+.1f", "%"),
                  _p(c), _ci(c), style="bold" if c.significant else None)
    print_table(console, t)
    console.print(f"  * significant: p < {ALPHA} (Welch's t-test) and the bootstrap CI of the delta excludes 0",
                  style="dim", highlight=False)


class DiffTerminal(TerminalRenderer):
    """`diff`: the conclusion, what was compared, the metrics with their tests, per rank, collectives,
    stragglers, findings, and the kernels and ops by impact."""

    def render(self, result: DiffResult, out: Console) -> None:
        d = result.diff
        # The CLI prints only a usable result, which has a diff.
        assert d is not None
        _header(d, out)
        _metrics_table("Job-wide, mean per step (samples: every compared step of every rank)", d.job, out)
        _ranks(d, out)
        _cross(d, out)
        _findings(d, out)
        _names("Kernels (device activity)", d.kernels, out)
        _names("Ops (host)", d.ops, out)


def _header(d: Diff, console: Console) -> None:
    c = d.compared
    console.print(f"[bold]rankscope diff[/] {literal(c.labels[0])} -> {literal(c.labels[1])}", highlight=False)
    console.print(f"[bold]{literal(d.headline)}[/]", highlight=False)
    how = "by rank id" if c.rank_match == "rank_id" else "paired in sorted order"
    console.print(f"  compared: {len(c.rank_pairs)} rank(s) {how} ({len(c.ranks_before)} before, "
                  f"{len(c.ranks_after)} after); steps {c.steps_before} before, {c.steps_after} after; "
                  f"{c.samples} step samples a side (steps x ranks); formats {'/'.join(c.formats_before)} vs "
                  f"{'/'.join(c.formats_after)}", highlight=False)
    for w in c.warnings:
        console.print(f"[yellow]warning:[/] {literal(w)}", highlight=False)


def _ranks(d: Diff, console: Console) -> None:
    if len(d.ranks) < 2 and d.compared.rank_match == "rank_id":
        return                                # one rank: the job-wide table is that rank
    t = _table("Per rank: step time ms (samples: its own steps)",
               ("rank", "before", "after", "delta %", "p", "largest significant move"))
    rows = sorted(d.ranks, key=lambda r: -abs(r.metrics["step_time_ms"].delta or 0.0))[:MAX_RANK_ROWS]
    for r in sorted(rows, key=lambda r: r.rank_after):
        st = r.metrics["step_time_ms"]
        move = r.largest_move
        rank = str(r.rank_after) if r.rank_before == r.rank_after else f"{r.rank_before}->{r.rank_after}"
        t.add_row(rank, number(st.before), number(st.after), number(st.delta_pct, "+.1f", "%"), _p(st),
                  f"{metric_label(move.metric).strip()} {move.delta:+.1f} ms" if move else "")
    t.columns[-1].justify = "left"
    print_table(console, t)
    if len(rows) < len(d.ranks):
        console.print(f"  ({len(d.ranks) - len(rows)} more rank pairs: the {len(rows)} largest changes are "
                      f"listed; --json has all)", style="dim", highlight=False)


def _cross(d: Diff, console: Console) -> None:
    if d.collectives:
        _metrics_table("Collectives (samples: matched collectives)", d.collectives, console)
    before, after = d.straggler_verdicts
    if before or after:
        console.print(f"stragglers before: {literal(before or 'n/a')}", highlight=False)
        console.print(f"stragglers after:  {literal(after or 'n/a')}", highlight=False)
    for s in d.stragglers:
        costs = f"{number(s.cost_ms_per_step_before)} -> {number(s.cost_ms_per_step_after)} ms/step"
        console.print(f"  rank {s.rank}: {s.status} (cause {s.cause_before or '-'} -> {s.cause_after or '-'}, "
                      f"cost {costs})", highlight=False)


def _findings(d: Diff, console: Console) -> None:
    if d.findings is None:
        console.print("findings: not compared (no findings in these analyses)", style="dim")
        return
    if not d.findings:
        console.print("findings: none on either side")
        return
    console.print("[bold]Findings[/] (by id and ranks)")
    for f in d.findings:
        sev = f"{f.severity_before or '-'} -> {f.severity_after or '-'}"
        console.print(f"  {f.status:<10} {f.id} (ranks {', '.join(map(str, f.ranks)) or '-'}; severity {sev}): "
                      f"{literal(f.summary or '')}", highlight=False)


def _names(title: str, d: NameDiff, console: Console) -> None:
    if d.rows.is_empty():
        return
    counts = ", ".join(f"{n} {s}" for s, n in d.counts.items())
    rows = list(d.rows.head(MAX_NAME_ROWS).iter_rows(named=True))
    cells: list[tuple[str, ...]] = [
        (r["status"], f"{r['calls_before']}->{r['calls_after']}",
         f"{number(r['per_call_us_before'], '.0f')}->{number(r['per_call_us_after'], '.0f')}",
         f"{r['impact_ms_per_step']:+.2f}") for r in rows]
    title = f"{title} by impact: {counts}"
    others = natural_width(console, _name_table(title, [""] * len(rows), cells))   # names as wide as "name"
    room = max(console.width - others + len("name"), MIN_NAME_WIDTH)
    names = distinct_shortened([r["name"] for r in rows], room)
    console.print(_name_table(title, [escape(n) for n in names], cells))
    console.print(f"  slower / faster: time per call, p < {ALPHA} (Welch's t-test over the calls); "
                  "ms/step: change of total time per step", style="dim", highlight=False)


def _name_table(title: str, names: list[str], cells: list[tuple[str, ...]]) -> Table:
    t = _table(title, ("name", "status", "calls", "µs per call", "ms/step"))
    t.columns[0].no_wrap, t.columns[0].overflow = False, "fold"     # a name longer than the room folds
    t.columns[1].justify = "left"
    for name, row in zip(names, cells):
        t.add_row(name, *row)
    return t
