"""Terminal output (rich): job header, per-rank tables, stragglers, the worst GPU idle gaps, top
kernels and operators, then the findings with their fixes. Readable at 80 columns. Input
problems go to stderr (cli.py), not here. `brief`: the job header and the findings only. With
Flight Recorder dumps, their verdict comes first (render/hang_terminal.py)."""
from __future__ import annotations

from collections import Counter
from typing import Callable

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.text import Text
from rich.table import Table

from rankscope.render.base import TerminalRenderer
from rankscope.render.figures import (BREAKDOWN, COMM_BY_DIM, COMM_BY_DIM_NOTE, DETAILS, PIPELINE_STAGE, STEP_TIME,
                                      STRAGGLER, legend)
from rankscope.render.format import (GAP_POSITIONS, distinct_shortened, literal, no_device_words, number, percent,
                                     print_table, printable, ranges, shortened)
from rankscope.render.hang_terminal import hang_section
from rankscope.render.rank_rows import host_list, named_ranks, pick, rank_list, rest_line
from rankscope.render.run_terminal import run_header, run_section
from rankscope.render.step_spread import spread_text
from rankscope.results import Analysis
from rankscope.results.analysis import RankReport
from rankscope.results.rank import BREAKDOWN_CATEGORIES as CATEGORIES


class AnalysisTerminal(TerminalRenderer):
    """`analyze`: the job header, the tables, then the findings; `brief`: the header and the findings only."""

    def __init__(self, brief: bool = False) -> None:
        self.brief = brief

    def render(self, result: Analysis, out: Console) -> None:
        if result.hang is not None:              # Flight Recorder dumps: the verdict first
            hang_section(result.hang, out, self.brief)
        if result.ranks:
            _header(result, out)
            if result.run is not None:
                run_header(result.run, out)
            _capture(result, out)
        _warnings(result, out)
        if result.run is not None:
            run_section(result.run, out)
        if not self.brief and result.ranks:
            _tables(result, out)
        _findings(result, out, self.brief)


def _header(a: Analysis, console: Console) -> None:
    j = a.job
    ranks_text = ranges(j.ranks)
    world = f"{len(j.ranks)} of {j.world_size}" if j.world_size and j.world_size != len(j.ranks) else f"{len(j.ranks)}"
    steps_text = f"{len(j.steps)} (#{ranges(j.steps)})" if j.steps else "none (one step = whole trace)"
    noun = "rank" if len(j.ranks) == 1 and not (j.world_size or 0) > 1 else "ranks"
    console.print(f"[bold]rankscope[/] job: {world} {noun} ({ranks_text}), backend "
                  f"{literal(j.backend or 'unknown')}")
    console.print(f"  devices: {literal(', '.join(j.devices) or 'none (CPU only)')}")
    console.print(f"  steps profiled: {steps_text}   time span: {number(j.span_ms)} ms"
                  + (f"   hosts: {literal(host_list(j.hosts))}" if j.hosts else ""))
    layout = a.parallelism
    if layout.dims:
        console.print(f"  layout: {layout.layout}" + ("" if all(d.source == "pg_desc" for d in layout.dims) else
                                                     " (dimensions without group names inferred from the collectives)"),
                      highlight=False)
    total_events = sum(s.events for s in a.ranks)
    cached = sum(s.from_cache for s in a.ranks)
    console.print(f"  events: {total_events:,} ({total_events // max(len(a.ranks), 1):,} per rank)"
                  f"   cache: {cached}/{len(a.ranks)} ranks   engine: {a.engine}")


def _capture(a: Analysis, console: Console) -> None:
    """The header's capture line (docs/concepts.md "Capture quality"), then one line per issue."""
    c = a.job.capture
    if c is None:
        return
    line = Text("capture: ")
    head, _, rest = c.headline.partition(" ")
    line.append(head, style="bold red" if c.partial else "bold yellow" if not c.complete else "")
    line.append(" " + rest)
    console.print(Padding(line, (0, 0, 0, 2)))
    for issue in c.issues:
        console.print(Padding(Text(printable(f"{issue.kind}: {issue.detail}")), (0, 0, 0, 4)))


def _present(a: Analysis) -> str:
    """"2 of 128 ranks present: " before a verdict across ranks, when ranks are missing."""
    return f"{a.job.capture.coverage}: " if a.job.capture and a.job.capture.coverage else ""


def _no_device_words(a: Analysis) -> str:
    return no_device_words(i.kind for i in a.job.capture.issues) if a.job.capture else no_device_words(())


#: Warnings listed in the report (all are on stderr and in --json).
MAX_WARNINGS = 10


def _warnings(a: Analysis, console: Console) -> None:
    """The job's warnings and the input problems (files skipped, salvaged, the cache), as stderr has them;
    those a capture issue says already are not repeated."""
    said = set(a.job.capture.restated_warnings) if a.job.capture else set()
    lines = [w for w in a.job.warnings if w not in said]
    lines += [f"skipped {p}" if p.fatal else str(p) for p in a.problems if p.fatal or str(p) not in said]
    if not lines:
        return
    console.print(f"[bold yellow]Warnings[/] ({len(lines)}):")
    for line in lines[:MAX_WARNINGS]:
        console.print(Padding(Text(printable(line)), (0, 0, 0, 2)))
    if len(lines) > MAX_WARNINGS:
        console.print(f"  ... and {len(lines) - MAX_WARNINGS} more (stderr and --json have all)")


#: A per-rank figure of a table (None: the rank has none).
RankValue = Callable[[RankReport], float | None]


def _tables(a: Analysis, console: Console) -> None:
    table = Table(title="Step time per rank", title_justify="left", header_style="bold",
                  caption=STEP_TIME["gpu_busy"].legend(), caption_justify="left")
    table.add_column("rank", justify="right")
    for f in STEP_TIME.values():
        table.add_column(f.terminal_header(), justify="right")
    mean_step: RankValue = lambda s: s.step_time_ms.mean
    shown = _shown(a, mean_step)
    steps = Counter(x.rank for x in a.steps)
    for s in shown:
        st = s.step_time_ms
        table.add_row(str(s.rank), f"{s.events:,}", str(steps[s.rank]), number(st.mean), number(st.median),
                      number(st.max), percent(s.gpu_busy_pct))
    print_table(console, table)
    _more(a, shown, console, mean_step, "mean step")
    # the breakdown's outliers: device idle (what a late rank does more of)
    idle: RankValue = lambda s: sum(getattr(s.breakdown_ms, c) if s.breakdown_ms else 0.0
                                    for c in ("dataloader", "sync", "host", "idle_other"))
    idle_rows = _shown(a, idle)
    _breakdown_table(a, idle_rows, console)
    _more(a, idle_rows, console, idle, "device idle")
    _parallel_section(a, idle_rows, console)
    wait: RankValue = lambda s: s.hta.idle.idle_ms.get("host_wait") if s.hta else None
    wait_rows = _shown(a, wait)
    _details_table(wait_rows, console)
    if any(s.hta for s in wait_rows):
        _more(a, wait_rows, console, wait, "host wait")
    _cross_section(a, console)
    _critical_path(a, console)
    _highlights(a, console)


SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}


def _findings(a: Analysis, console: Console, brief: bool) -> None:
    if not a.findings:
        console.print("[bold]Findings:[/] none: no threshold crossed (`rankscope thresholds` lists them)")
        return
    counts = ", ".join(f"{n} {sev}" for sev in SEVERITY_STYLE
                       if (n := sum(f.severity == sev for f in a.findings)))
    console.print(f"[bold]Findings[/] ({counts}), most urgent first:")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column()
    for i, f in enumerate(a.findings, 1):
        text = Text()
        text.append(f.severity.upper(), style=SEVERITY_STYLE[f.severity])
        text.append(f" {f.id}", style="bold")
        text.append(f" ({'rank' if len(f.ranks) == 1 else 'ranks'} {rank_list(f.ranks) if f.ranks else '-'}): "
                    f"{printable(f.summary)}")
        if not brief:
            text.append(f"\nwhy: {f.explanation}", style="dim")
        text.append("\nfix: ", style="green")
        text.append(f.fix)
        grid.add_row(f"{i}.", text)
    console.print(grid)
    if not brief:
        console.print("More: --json (evidence and thresholds per finding), --html report.html (charts), "
                      "`rankscope export perfetto DIR -o job.json.gz` (all ranks on one timeline)", style="dim")


def _shown(a: Analysis, value: RankValue) -> list[RankReport]:
    """The ranks of a per-rank table (rank_rows.pick: the named ranks, then the outliers of `value`)."""
    by_rank = {s.rank: s for s in a.ranks}
    shown, _ = pick(list(by_rank), lambda r: value(by_rank[r]), named_ranks(a))
    return [by_rank[r] for r in shown]


def _more(a: Analysis, shown: list[RankReport], console: Console, value: RankValue, what: str) -> None:
    """One line for the ranks a table leaves out."""
    if len(shown) < len(a.ranks):
        by_rank = {s.rank: s for s in a.ranks}
        rest = sorted(set(by_rank) - {s.rank for s in shown})
        console.print(rest_line(rest, lambda r: value(by_rank[r]), what), highlight=False)


def _details_table(shown: list[RankReport], console: Console) -> None:
    ranks = [(s, s.hta) for s in shown if s.hta]  # GPU ranks: CPU-only jobs have none of these figures
    if not ranks:
        return
    table = Table(title="Per rank: comm overlap, device idle by cause, data loading, precision", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, caption=legend(DETAILS),
                  caption_justify="left")
    table.add_column("rank", justify="right")
    for f in DETAILS.values():
        if f.terminal:
            table.add_column(f.terminal, justify="right")
    for s, hta in ranks:
        idle = hta.idle.idle_ms
        k = s.kernels.stats if s.kernels else None
        peak = max((d.peak_allocated_mb for d in (s.memory.devices if s.memory else []) if d.device != "cpu"),
                   default=None)
        table.add_row(str(s.rank), percent(hta.overlap.overlap_pct), number(idle.get("host_wait")),
                      number(idle.get("kernel_wait")), str(len(hta.idle.streams)),
                      percent(s.dataloader.share_pct if s.dataloader else None),
                      percent(k.fp32_gemm_share_pct if k else None), percent(k.tensor_core_pct if k else None),
                      number(peak))
    print_table(console, table)


def _cross_section(a: Analysis, console: Console) -> None:
    clock = a.clock
    if clock is None or len(a.ranks) < 2:             # no cross-rank result
        return
    c = a
    console.print(f"[bold]Across ranks:[/] {_present(a)}{literal(c.straggler_verdict)}", highlight=False)
    if c.stragglers:
        table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, caption=legend(STRAGGLER),
                      caption_justify="left")
        table.add_column("rank", justify="right")
        table.add_column("cause")
        for f in STRAGGLER.values():
            if f.terminal:
                table.add_column(f.terminal, justify="right")
        for st in c.stragglers:
            table.add_row(str(st.rank), st.cause, number(st.cost_ms_per_step), percent(st.last_arrival_pct),
                          number(st.wait_imposed_ms_per_step))
        print_table(console, table)
        for st in c.stragglers:
            console.print(f"  rank {st.rank}: {literal(st.evidence)}", highlight=False)
    coll = c.collectives
    types = "; ".join(f"{literal(t.type)} x{t.count} (skew mean {t.skew_mean_ms:,.2f} / max "
                      f"{t.skew_max_ms:,.2f} ms"
                      + (f", busbw {t.busbw_mean_gbps:,.1f} GB/s" if t.busbw_mean_gbps else "") + ")"
                      for t in coll.by_type[:4])
    console.print(f"  collectives: {coll.count} matched across ranks ({coll.complete} on every member)"
                  + (f": {types}" if types else ""), highlight=False)
    if c.load_balance is not None:
        console.print(f"  load balance: {literal(c.load_balance.summary)}", highlight=False)
    if c.step_spread is not None:
        console.print(f"  {spread_text(c.step_spread)}", highlight=False)
    console.print(f"  clocks: {literal(clock.note)}", highlight=False)


def _highlights(a: Analysis, console: Console) -> None:
    """The rank with the most GPU idle-gap time: its longest gaps, top kernels and ops."""
    with_gaps = [(s, s.idle_gaps) for s in a.ranks if s.idle_gaps and s.idle_gaps.gaps]
    if with_gaps:
        s, gaps = max(with_gaps, key=lambda r: r[1].gap_ms)
        by = ", ".join(f"{k} {v:,.1f}" for k, v in gaps.gap_ms_by_host_activity.items() if v > 0)
        device = "Training-thread" if s.breakdown_mode == "cpu_only" else "GPU"
        console.print(f"[bold]{device} idle gaps[/] (>= {gaps.gap_min_us:.0f} µs), rank {s.rank}: {gaps.gaps} "
                      f"gaps, {gaps.gap_ms:,.1f} ms; host meanwhile (ms): {by}", highlight=False)
        for g in gaps.top[:3]:
            console.print(f"  step {g.step} +{g.start_in_step_ms:,.1f} ms: {g.duration_ms:,.2f} ms idle"
                          f"{GAP_POSITIONS[g.position]}, host {_HOST_ACTIVITY[g.host_activity]}"
                          + (f" ({'an op open for part of it: ' if g.host_activity == 'idle_other' else ''}"
                             f"{literal(g.busy_host_op)})" if g.busy_host_op else "")
                          + (f"; ended by {escape(shortened(g.next_device_op))}" if g.next_device_op else "")
                          + (f" launched from {literal(g.launched_by)}" if g.launched_by else ""), highlight=False)
    ranked = [(s, s.kernels.stats.kernels) for s in a.ranks if s.kernels and s.kernels.stats.kernels.name]
    if ranked:
        s, k = ranked[0]
        top = ", ".join(f"{escape(n)} {ms:,.1f} ms" for n, ms in zip(_names(k.name), k.total_ms))
        console.print(f"[bold]Top kernels[/] (rank {s.rank}): {top}", highlight=False)
    ops = [(s, s.operators.by_self_device.name, s.operators.by_self_device.self_device_ms) for s in a.ranks
           if s.device_events > 0 and s.operators and s.operators.by_self_device.name]
    if ops:
        s, op_names, self_device_ms = ops[0]
        top = ", ".join(f"{escape(n)} {ms:,.1f} ms" for n, ms in zip(_names(op_names), self_device_ms))
        console.print(f"[bold]Top ops by self GPU time[/] (rank {s.rank}): {top}", highlight=False)


def _names(names: list[str]) -> list[str]:
    """The first three names, shortened so that different names look different."""
    return distinct_shortened(list(names[:3]), 48)


_HOST_ACTIVITY = {"dataloader": "in the DataLoader", "sync": "blocked in a synchronize",
                  "host": "busy in CPU ops or Python", "idle_other": "outside any op"}


def _breakdown_table(a: Analysis, shown: list[RankReport], console: Console) -> None:
    ranks = [s for s in shown if s.breakdown_ms is not None]
    if not ranks:
        return
    cpu_only = all(s.breakdown_mode == "cpu_only" for s in ranks)
    title = "Where step time went, mean ms per step (parts sum to the step)"
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=legend(BREAKDOWN)
                  + (f"; {_no_device_words(a)}: the training thread plays the device" if cpu_only else ""),
                  caption_justify="left")
    table.add_column("rank", justify="right")
    for f in BREAKDOWN.values():
        table.add_column(f.terminal_header(), justify="right")
    for s in ranks:
        eff = "-" if s.overlap_efficiency is None else f"{s.overlap_efficiency:.2f}"
        table.add_row(str(s.rank), number(s.step_time_ms.mean),
                      *(number(getattr(s.breakdown_ms, c)) for c in CATEGORIES), eff)
    print_table(console, table)


def _parallel_section(a: Analysis, shown: list[RankReport], console: Console) -> None:
    """The parallel layout: its groups, communication per dimension per rank, the pipeline's stages."""
    # one dimension over the whole job (plain DDP / FSDP): the header's layout line says it all
    if not (len(a.parallelism.dims) > 1 or a.pipeline or a.experts):
        return
    groups = "; ".join(f"{d.name} {d.size}: {_groups_text(d.groups)}" for d in a.parallelism.dims)
    console.print(f"[bold]Parallel layout[/]: {groups}", highlight=False)
    dims = [d.name for d in a.parallelism.dims]
    if any("other" in (r.comm_by_dim_ms or {}) for r in a.ranks):
        dims.append("other")
    console.print("Communication per parallel dimension, mean ms per step", highlight=False)
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("rank", justify="right")
    for d in dims:
        for f in COMM_BY_DIM.values():
            table.add_column(f"{d}\n{f.terminal}", justify="right")
    for s in shown:
        c = s.comm_by_dim_ms
        if c is None:
            continue
        cells = []
        for d in dims:
            v = c.get(d)
            cells += [number(v.overlapped) if v else "-", number(v.exposed) if v else "-"]
        table.add_row(str(s.rank), *cells)
    print_table(console, table)
    console.print(legend(COMM_BY_DIM) + "; " + COMM_BY_DIM_NOTE, highlight=False)
    p = a.pipeline
    if p is None or not p.stages:
        return
    chunks = f", {p.stages_per_rank} model chunks per rank" if p.stages_per_rank > 1 else ""
    formula = "(p-1)/(v m+p-1)" if p.stages_per_rank > 1 else "(p-1)/(m+p-1)"
    theory = (f" against {p.bubble_pct_theory:.1f}% for {len(p.stages)} equal stages, {p.microbatches} "
              f"microbatches{chunks} ({formula})" if p.bubble_pct_theory is not None else "")
    console.print(f"[bold]Pipeline[/]: {p.schedule} schedule, "
                  f"{p.microbatches if p.microbatches else 'unknown'} microbatches, {len(p.stages)} stages; "
                  f"bubble {p.bubble_pct:.1f}% of the step (mean stage){theory}"
                  + (f"; bottleneck: stage {p.bottleneck_stage} ({p.imbalance_pct_over_mean:+.0f}% compute against the "
                     f"stages' mean)" if p.bottleneck_stage is not None else ""), highlight=False)
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("stage", justify="right")
    table.add_column("ranks")
    for f in PIPELINE_STAGE.values():
        table.add_column(f.terminal_header(), justify="right")
    for st in p.stages:
        table.add_row(str(st.stage), ranges(st.ranks), number(st.compute_ms_per_step), number(st.bubble_ms_per_step),
                      percent(st.bubble_pct))
    print_table(console, table)
    console.print(legend(PIPELINE_STAGE), highlight=False)


def _groups_text(groups: list[list[int]], limit: int = 4) -> str:
    shown = " ".join("[" + rank_list(g, 24).replace(", ", ",") + "]" for g in groups[:limit])
    return shown + (f" +{len(groups) - limit} more" if len(groups) > limit else "")


#: (rank, category) entries and what-ifs the terminal lists (--json has them all).
MAX_PATH_ENTRIES = 4


def _critical_path(a: Analysis, console: Console) -> None:
    """What set each step's end, across ranks: the largest (rank, category) parts of the path, its
    owner, the re-timed what-ifs."""
    cp = a.critical_path
    if cp is None or len(a.ranks) < 2:
        return
    parts = ", ".join(f"rank {x.rank} {x.category} {x.ms_per_step:,.1f} ms ({x.pct_of_step:.0f}%)"
                      for x in cp.by_rank_category[:MAX_PATH_ENTRIES])
    owner = (f"rank {cp.owner} holds {cp.owner_pct:.0f}% of it" if cp.owner is not None else
             f"no single rank holds it (at most {cp.owner_pct:.0f}% on one rank)")
    if _present(a):
        owner = f"{_present(a)}{owner.replace(' of it', ' of the path of the ranks present')}"
    console.print(f"[bold]Critical path[/] (the chain of work across ranks that set each step's end, through "
                  f"collectives to the last arriver; mean {cp.step_ms:,.1f} ms per step): {parts}; {owner}",
                  highlight=False)
    # the fixes the findings propose first (their savings are these), then the largest others
    named = {f.evidence.get("what_if_key") for f in a.findings}
    ranked = sorted(cp.what_if, key=lambda w: (w.key not in named, -w.step_ms_saved))
    ranked = ranked[:max(MAX_PATH_ENTRIES, sum(w.key in named for w in ranked))]
    if ranked:
        console.print("  what-if (the step re-timed through the same dependencies): "
                      + "; ".join(f"{literal(w.change)}: saves {w.step_ms_saved:,.1f} ms per step" for w in ranked),
                      highlight=False)
        console.print(f"  replay: re-timed with no change, the steps come out at {cp.replayed_step_ms:,.1f} ms "
                      f"against {cp.measured_step_ms:,.1f} ms measured (longest rank's step, mean): error "
                      f"{cp.replay_error_pct:.1f}% (worst step {cp.replay_error_max_pct:.1f}%), how far the model "
                      f"of dependencies holds the data", highlight=False)
