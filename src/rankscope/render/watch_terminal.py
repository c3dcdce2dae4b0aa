"""What `rankscope watch` shows while it runs: the live view (rich Live: where it stands, the latest cycles,
the trend of the median step, the changes so far) and, when stdout is no terminal, one line per analysed
cycle. Formats only."""
from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from rankscope.render.format import number, printable, ranges
from rankscope.render.run_figures import RUN_CYCLE, change_text, straggler_text
from rankscope.results.run import Run, RunCycle, WatchStatus

#: Cycles the live view lists (the latest).
LIVE_CYCLES = 8
_SPARKS = "▁▂▃▄▅▆▇█"


def live_view(status: WatchStatus, run: Run | None) -> Group:
    """The live view: a status line, the latest cycles, the trend, the changes so far."""
    waiting = "; ".join(f"steps #{ranges(steps)}" if steps else "no steps" for steps in status.cycles_waiting)
    head = Text(f"rankscope watch {printable(status.folder)}: {status.files_read} of {status.files_seen} trace "
                f"files read, {status.cycles_analysed} cycles analysed"
                + (f"; waiting for {waiting} (analysed when every rank's file is there, or {status.settle_s:g} s "
                   f"after its latest file)" if waiting else "")
                + f"; last new file {status.idle_s:.0f} s ago (Ctrl-C ends with the run report)")
    if run is None:
        return Group(head)
    table = Table(title="latest cycles", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  header_style="bold")
    table.add_column("cycle", justify="right")
    for key in ("steps", "ranks", "median", "slowest", "straggler"):
        table.add_column(RUN_CYCLE[key].terminal_header(), justify="left" if key in ("steps", "straggler") else "right")
    for c in run.cycles[-LIVE_CYCLES:]:
        table.add_row(str(c.cycle), ranges(c.steps), str(len(c.ranks)), number(c.step_ms_median),
                      number(c.step_ms_max), straggler_text(c))
    medians = [c.step_ms_median for c in run.cycles if c.step_ms_median is not None]
    trend = Text("trend of the median step (one mark per cycle, scaled to its range): " + _sparkline(medians)
                 + (f"  {medians[0]:.1f} -> {medians[-1]:.1f} ms" if medians else ""))
    changes = [Text(printable(change_text(c)), style="bold red" if c.kind == "slowdown" else "")
               for c in run.changes] or [Text(f"no change over {len(run.cycles)} cycles")]
    return Group(head, table, trend, Text("changes so far:", style="bold"), *changes)


def _sparkline(values: list[float]) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(_SPARKS[min(len(_SPARKS) - 1, int((v - lo) / span * len(_SPARKS)))] for v in values[-60:])


def cycle_line(c: RunCycle, run: Run) -> str:
    """One line for an analysed cycle, with the changes that start in it."""
    new = [change_text(ch) for ch in run.changes if ch.first_cycle == c.cycle]
    return printable(f"cycle {c.cycle} (steps #{ranges(c.steps)}, {len(c.ranks)} ranks"
                     + (f", missing {ranges(c.missing_ranks)}" if c.missing_ranks else "")
                     + f"): median step {number(c.step_ms_median)} ms, slowest rank {number(c.step_ms_max)} ms, "
                     f"straggler {straggler_text(c)}" + "".join(f"; {t}" for t in new))
