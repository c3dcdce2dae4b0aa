"""The HTML report's hang section, laid out from the report's `hang` (results/hang.py): the verdict,
the stalled groups with who holds each up, the culprits' last calls, and per process group a grid of
its members x its last sequence numbers coloured by what each member shows there."""
from __future__ import annotations

from rankscope.render.format import escaped, ranges
from rankscope.render.hang_terminal import STATE_WORDS
from rankscope.render.html_parts import html_table, kv_table, note
from rankscope.results import Analysis
from rankscope.results.hang import HangReport

#: Grids drawn: the stalled groups, then complete ones up to this many in all; members per grid.
MAX_GRIDS = 12
MAX_GRID_RANKS = 64
STATE_COLORS = {"completed": "#a5d6a7", "started": "#fff59d", "entered": "#90caf9", "not_entered": "#ef9a9a",
                "no_dump": "#bdbdbd", "rolled_out": "#eeeeee"}
STATE_LABELS = {"completed": "completed", "started": "started, not completed", "entered": "entered (gloo: "
                "entered is all a dump records; NCCL: queued, not started)", "not_entered": "not entered",
                "no_dump": "no dump from this rank", "rolled_out": "older than its ring buffer holds"}
_HEAD = {"hang": "Job stopped (hang)", "desync": "Job stopped (desync)", "unknown": "Job stalled (cause unknown)",
         "none": "Flight Recorder: no hang"}


def hang_section(report: Analysis) -> str:
    h = report.hang
    if not h:
        return ""
    rows = [("verdict", h.verdict), ("dumps", f"{len(h.ranks_dumped)} of {h.world_size or '?'} ranks "
                                              f"({ranges(h.ranks_dumped)}), {h.backend}"),
            ("progress", "started / completed recorded" if h.states_recorded
             else "not recorded (gloo: a dump says which collectives a rank entered)")]
    rows += [("before", t.summary) for t in h.culprit_traces]
    if h.missing_dumps:
        rows.append(("missing dumps", f"{ranges(h.missing_dumps)}: {h.unknown}"))
    parts = [f'<section id="hang"><h2>{escaped(_HEAD[h.status])}</h2>', kv_table(rows)]
    if h.groups:
        parts.append("<h3>Stalled process groups, first cause first</h3>")
        parts.append(html_table(["group", "collective", "entered", "holding it up", "where those are"], [
            [s.label, f"{s.op} #{s.seq}" + (" (p2p)" if s.p2p else ""), ranges(s.entered),
             ranges(s.culprits),
             "; ".join(f"{b.rank}: {b.op} #{b.seq} of {b.label}" if b.group is not None
                       else f"{b.rank}: {'no dump' if b.rank in s.no_dump else 'in no collective'}"
                       for b in s.blockers_where) or "-"] for s in h.groups]))
    for c in h.culprit_last:
        parts.append(f"<h3>Rank {c.rank}: its last calls</h3>")
        parts.append(html_table(["ms after the first record", "collective", "group", "state", "call"], [
            [e.created_ms, f"{e.op} #{e.seq}", e.group_desc or e.group, STATE_WORDS[e.state], e.frame or "-"]
            for e in c.entries], numeric={0}))
        if c.frames:
            parts.append(note("Its last call's Python stack, innermost first: " + " <- ".join(
                f"{f.name} {f.file}:{f.line}" for f in c.frames)))
    parts.append(_grids(h))
    return "".join(parts) + "</section>"


def _grids(h: HangReport) -> str:
    first = h.first
    mismatched = {m.rank: m for m in first.mismatched} if first else {}
    order = {(s.group, s.p2p): i for i, s in enumerate(h.groups)}       # stalled: first cause first
    groups = sorted(h.all_groups, key=lambda g: order.get((g.group, g.p2p), len(order)))[:MAX_GRIDS]
    legend = " ".join(f'<span style="background:{color};padding:0 6px">{escaped(STATE_LABELS[s])}</span>'
                      for s, color in STATE_COLORS.items())
    out = ["<h3>Process groups: members x last sequence numbers</h3>", f'<p class="note">{legend}</p>']
    for g in groups:
        stall = first is not None and g.group == first.group and g.p2p == first.p2p
        culprits = set(first.culprits) if first is not None and stall else set()
        rows = sorted(g.grid, key=lambda r: r.rank not in culprits)[:MAX_GRID_RANKS]
        head = "".join(f"<th>#{seq}</th>" for seq in g.grid_seqs)
        body = []
        for row in rows:
            cells = []
            for seq, state in zip(g.grid_seqs, row.states):
                m = mismatched.get(row.rank) if first is not None and stall and seq == first.seq else None
                mark = f"&ne; {escaped(m.value)}" if m else ""
                cells.append(f'<td title="rank {row.rank} #{seq}: {escaped(STATE_LABELS[state])}" '
                             f'style="background:{STATE_COLORS[state]};min-width:28px">{mark}</td>')
            body.append(f"<tr><th>rank {row.rank}</th>{''.join(cells)}</tr>")
        more = len(g.grid) - len(rows)
        out.append(f"<h4>{escaped(g.label)}: {escaped(g.state)}"
                   + (f", every member up to #{g.last_seq_all}" if g.last_seq_all is not None else "") + "</h4>"
                   + f'<table class="grid"><thead><tr><th></th>{head}</tr></thead>'
                   + f'<tbody>{"".join(body)}</tbody></table>'
                   + (note(f"{more} more members (--json has them all)") if more > 0 else ""))
    hidden = len(h.all_groups) - len(groups)
    if hidden > 0:
        out.append(note(f"{hidden} more complete groups (--json has them all)"))
    return "".join(out)


def dumps_header(report: Analysis) -> str:
    """The page's header when Flight Recorder dumps came alone: its title and the input warnings."""
    lines = [f"skipped {p.file}: {p.problem}" for p in report.inputs.skipped]
    lines += [f"{p.file}: {p.problem}" for p in report.inputs.warnings]
    items = "".join(f"<li>{escaped(line)}</li>" for line in lines)
    return ('<header id="job"><h1>rankscope report: Flight Recorder dumps</h1>'
            + (f'<h3>Input warnings</h3><ul class="warnings">{items}</ul>' if lines else note("No input warnings."))
            + "</header>")
