"""The terminal's run section (`analyze` of several profiler cycles, `watch`): one line per cycle, then
the changes. Readable at 80 columns; formats only."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from rankscope.render.figures import legend
from rankscope.render.format import number, print_table, printable, ranges
from rankscope.render.run_figures import RUN_CYCLE, change_text, noise_text, run_steps, straggler_text
from rankscope.results.run import Run

#: Cycles listed in full; a longer run shows its first and last MAX_CYCLE_ROWS // 2.
MAX_CYCLE_ROWS = 60


def run_header(run: Run, console: Console) -> None:
    """The header line: how many cycles, which steps, which cycle the rest of the report details."""
    steps = run_steps(run)
    detailed = run.cycles[run.detailed_cycle - 1]
    console.print(Padding(Text(f"run: {len(run.cycles)} profiler cycles (steps #{ranges(steps)}); the run "
                               f"section covers them all, the others detail cycle {detailed.cycle} "
                               f"(#{ranges(detailed.steps)})"), (0, 0, 0, 2)))


def run_section(run: Run, console: Console) -> None:
    """One row per cycle (the first and last when there are many), then the changes."""
    table = Table(title=f"Run: {len(run.cycles)} profiler cycles", title_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False, caption=legend(RUN_CYCLE), caption_justify="left")
    table.add_column("cycle", justify="right")
    for key, f in RUN_CYCLE.items():
        table.add_column(f.terminal_header(), justify="left" if key in ("steps", "straggler") else "right")
    rows = run.cycles
    cut = len(rows) > MAX_CYCLE_ROWS
    if cut:
        rows = rows[:MAX_CYCLE_ROWS // 2] + rows[-(MAX_CYCLE_ROWS // 2):]
    for i, c in enumerate(rows):
        if cut and i == MAX_CYCLE_ROWS // 2:
            table.add_row("...", "", "", "", "", "", "")
        table.add_row(str(c.cycle), ranges(c.steps), str(len(c.ranks)) + (f" (-{len(c.missing_ranks)})"
                                                                        if c.missing_ranks else ""),
                      number(c.step_ms_median), number(c.step_ms_max), straggler_text(c), str(len(c.findings)))
    print_table(console, table)
    if cut:
        console.print(f"  {len(run.cycles) - MAX_CYCLE_ROWS} cycles in the middle not listed (--json has all)")
    missing = [c for c in run.cycles if c.missing_ranks]
    for c in missing[:5]:
        console.print(Padding(Text(f"cycle {c.cycle}: no file of rank(s) {ranges(c.missing_ranks)}"), (0, 0, 0, 2)))
    changes(run, console)


def changes(run: Run, console: Console) -> None:
    """The changes so far, one sentence each, and how they are judged."""
    if not run.changes:
        console.print(f"[bold]Changes[/]: none over {len(run.cycles)} cycles")
    else:
        console.print(f"[bold]Changes[/] ({len(run.changes)}), in step order:")
        for c in run.changes:
            style = "bold red" if c.kind == "slowdown" else ""
            console.print(Padding(Text(printable(change_text(c)), style=style), (0, 0, 0, 2)))
    console.print(Padding(Text(noise_text(run.noise_pct, run.cycle_noise_pct, run.z_critical)), (0, 0, 0, 2)))
