"""The terminal's hang section (first in `analyze`'s report when Flight Recorder dumps were read):
the verdict, what the dumps hold, the stalled groups (first cause first) with where each culprit
is, the culprit's last calls, the members' waits, and the other groups. Readable at 80 columns."""
from __future__ import annotations

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from rankscope.render.format import number, printable, ranges
from rankscope.results.hang import HangReport

#: Members listed with their waits; culprits' last calls; other groups named.
MAX_WAITS = 8
MAX_GROUPS = 8
_HEAD = {"hang": "Job stopped (hang)", "desync": "Job stopped (desync)", "unknown": "Job stalled (cause unknown)",
         "none": "Flight Recorder"}
#: A dump's entry state in words: "scheduled" is all gloo records (the rank entered the collective).
STATE_WORDS = {"scheduled": "entered", "started": "started", "completed": "completed"}


def hang_section(r: HangReport, console: Console, brief: bool = False) -> None:
    line = Text()
    line.append(f"{_HEAD[r.status]}: ", style="bold red" if r.status in ("hang", "desync") else "bold")
    line.append(printable(r.verdict))
    console.print(line)
    progress = ("started / completed recorded" if r.states_recorded
                else "no progress recorded (gloo: a dump says which collectives a rank entered, not whether they "
                     "completed)")
    _line(console, f"dumps: {len(r.ranks_dumped)} of {r.world_size or '?'} ranks ({ranges(r.ranks_dumped)}), "
                   f"{r.backend}; {progress}")
    if r.unknown:
        _line(console, f"unknown: {r.unknown}")
    for t in r.culprit_traces:                     # the profiler traces beside the dumps
        _line(console, f"before: {t.summary}")
    if brief or r.first is None:
        return
    _stalls(r, console)
    for c in r.culprit_last:
        _line(console, f"rank {c.rank}'s last calls (oldest first; ms after the first time any dump records):")
        for e in c.entries:
            _line(console, f"{number(e.created_ms, ',.1f'):>10} ms  {e.op} #{e.seq} of {e.group_desc or e.group}, "
                           f"{STATE_WORDS[e.state]}" + (f"  {e.frame}" if e.frame else ""), indent=4)
    waits = r.first.waits
    if waits:
        shown = ", ".join(f"rank {w.rank} +{number(w.entered_ms, ',.1f')} ms" for w in waits[:MAX_WAITS])
        more = f" ... and {len(waits) - MAX_WAITS} more" if len(waits) > MAX_WAITS else ""
        least = min(w.waited_ms_at_least for w in waits)
        _line(console, f"entered {r.first.op} #{r.first.seq} (ms after the first member): {shown}{more}"
                       + (f"; each has waited at least {number(least, ',.1f')} ms (to the last time any dump "
                          f"records)" if least >= 1 else ""))
    others = [g for g in r.all_groups if g.state == "complete"]
    if others:
        text = "; ".join(f"{g.label} up to #{g.last_seq_all}" for g in others[:MAX_GROUPS])
        more = f" ... and {len(others) - MAX_GROUPS} more" if len(others) > MAX_GROUPS else ""
        _line(console, f"groups complete (every member entered every recorded collective): {text}{more}")


def _stalls(r: HangReport, console: Console) -> None:
    _line(console, "stalled process groups, first cause first:")
    for s in r.groups[:MAX_GROUPS]:
        held = ", ".join(f"{b.rank} (in {b.op} #{b.seq} of {b.label})" if b.group is not None
                         else f"{b.rank} ({'no dump' if b.rank in s.no_dump else 'in no collective'})"
                         for b in s.blockers_where[:4])
        more = f" and {len(s.culprits) - 4} more" if len(s.culprits) > 4 else ""
        _line(console, f"{s.label}, {s.op} #{s.seq}: entered by {ranges(s.entered)}; "
                       + (f"held up by {held}{more}" if held else "held up by no member"), indent=4)
    if len(r.groups) > MAX_GROUPS:
        _line(console, f"... and {len(r.groups) - MAX_GROUPS} more stalled groups (--json has them all)", indent=4)


def _line(console: Console, text: str, indent: int = 2) -> None:
    console.print(Padding(Text(printable(text)), (0, 0, 0, indent)))
