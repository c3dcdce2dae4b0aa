"""Terminal output (rich): job header, per-rank tables, stragglers, the worst GPU idle gaps, top
kernels and operators, then the findings with their fixes. Readable at 80 columns. Input
problems go to stderr (cli.py), not here. `brief`: the job header and the findings only."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.text import Text
from rich.table import Table

from rankscope.render.base import TerminalRenderer
from rankscope.render.format import number, percent, ranges, shortened
from rankscope.results import Analysis


class AnalysisTerminal(TerminalRenderer):
    """`analyze`: the job header, the tables, then the findings; `brief`: the header and the findings only."""

    def __init__(self, brief: bool = False) -> None:
        self.brief = brief

    def render(self, result: Analysis, out: Console) -> None:
        _header(result, out)
        if not self.brief:
            _tables(result, out)
        _findings(result, out, self.brief)
        for w in result.job.warnings:
            out.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)


def _header(a: Analysis, console: Console) -> None:
    j = a.job
    ranks_text = ranges(j.ranks)
    world = f"{len(j.ranks)} of {j.world_size}" if j.world_size and j.world_size != len(j.ranks) else f"{len(j.ranks)}"
    steps_text = (ranges(j.steps) if j.steps else "none (one step = whole trace)")
    noun = "rank" if len(j.ranks) == 1 and not (j.world_size or 0) > 1 else "ranks"
    console.print(f"[bold]rankscope[/] job: {world} {noun} ({ranks_text}), backend {j.backend or 'unknown'}")
    console.print(f"  devices: {', '.join(j.devices) or 'none (CPU only)'}")
    console.print(f"  steps profiled: {steps_text}   time span: {number(j.span_ms)} ms"
                  + (f"   hosts: {', '.join(j.hosts)}" if j.hosts else ""))
    total_events = sum(s.meta.events_total for s in a.ranks)
    cached = sum(s.from_cache for s in a.ranks)
    console.print(f"  events: {total_events:,} ({total_events // max(len(a.ranks), 1):,} per rank)"
                  f"   cache: {cached}/{len(a.ranks)} ranks   engine: {a.engine}")


def _tables(a: Analysis, console: Console) -> None:
    table = Table(title="Step time per rank", title_justify="left", header_style="bold")
    table.add_column("rank", justify="right")
    table.add_column("events", justify="right")
    table.add_column("steps", justify="right")
    table.add_column("mean ms", justify="right")
    table.add_column("median ms", justify="right")
    table.add_column("max ms", justify="right")
    table.add_column("GPU busy", justify="right")
    shown = _shown(a)
    for s in shown:
        st = s.step_time
        table.add_row(str(s.rank), f"{s.meta.events_total:,}", str(len(s.steps)), number(st.mean_ms),
                      number(st.median_ms), number(st.max_ms), percent(st.device_busy_pct))
    console.print(table)
    _more(a, shown, console)
    _breakdown_table(a, shown, console)
    _details_table(shown, console)
    _cross_section(a, console)
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
        text.append(f" ({'rank' if len(f.ranks) == 1 else 'ranks'} {ranges(f.ranks) if f.ranks else '-'}): {f.summary}")
        if not brief:
            text.append(f"\nwhy: {f.explanation}", style="dim")
        text.append("\nfix: ", style="green")
        text.append(f.fix)
        grid.add_row(f"{i}.", text)
    console.print(grid)
    if not brief:
        console.print("More: --json (evidence and thresholds per finding), --html report.html (charts), "
                      "`rankscope export perfetto DIR -o job.json.gz` (all ranks on one timeline)", style="dim")


#: Ranks listed in the per-rank tables; with more, the slowest are shown (all are in --json).
MAX_RANK_ROWS = 16


def _shown(a: Analysis) -> list:
    if len(a.ranks) <= MAX_RANK_ROWS:
        return a.ranks
    slowest = sorted(a.ranks, key=lambda s: -(s.step_time.mean_ms or 0.0))[:MAX_RANK_ROWS]
    return sorted(slowest, key=lambda s: s.rank)


def _more(a: Analysis, shown: list, console: Console) -> None:
    if len(shown) < len(a.ranks):
        console.print(f"  ({len(a.ranks) - len(shown)} more ranks not listed: the {len(shown)} slowest are; "
                      f"--json has all)", highlight=False)


def _details_table(shown: list, console: Console) -> None:
    ranks = [s for s in shown if s.hta]           # GPU ranks: CPU-only jobs have none of these figures
    if not ranks:
        return
    table = Table(title="Per rank: GPU use, HTA figures, data loading, precision", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="busy/idle: HTA temporal breakdown · ovl: comm-comp overlap · wait host/kern: idle "
                          "waiting for the host / between kernels (ms) · data: DataLoader share of step · "
                          "fp32: FP32 share of GEMM time · TC: Tensor Core share of kernel time",
                  caption_justify="left")
    for col in ("rank", "busy", "idle", "ovl", "wait host", "wait kern", "data", "fp32", "TC", "peak MB"):
        table.add_column(col, justify="right")
    for s in ranks:
        t, idle = s.hta.temporal, s.hta.idle.idle_ms
        k = s.kernels.stats if s.kernels else None
        peak = max((d.peak_allocated_mb for d in (s.memory.devices if s.memory else []) if d.device != "cpu"),
                   default=None)
        busy = None if t.compute_pct is None else t.compute_pct + t.non_compute_pct
        table.add_row(str(s.rank), percent(busy), percent(t.idle_pct), percent(s.hta.overlap.overlap_pct),
                      number(idle.get("host_wait")), number(idle.get("kernel_wait")),
                      percent(s.dataloader.share_pct if s.dataloader else None),
                      percent(k.fp32_gemm_share_pct if k else None), percent(k.tensor_core_pct if k else None),
                      number(peak))
    console.print(table)


def _cross_section(a: Analysis, console: Console) -> None:
    if a.cross is None or len(a.ranks) < 2:
        return
    d = a.cross.as_dict()
    console.print(f"[bold]Across ranks:[/] {d['straggler_verdict']}", highlight=False)
    if d["stragglers"]:
        table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        for col, just in (("rank", "right"), ("cause", "left"), ("cost ms/step", "right"), ("last at", "right"),
                          ("others wait ms/step", "right")):
            table.add_column(col, justify=just)
        for st in d["stragglers"]:
            table.add_row(str(st["rank"]), st["cause"], number(st["cost_ms_per_step"]), percent(st["last_arrival_pct"]),
                          number(st["wait_imposed_ms_per_step"]))
        console.print(table)
        for st in d["stragglers"]:
            console.print(f"  rank {st['rank']}: {st['evidence']}", highlight=False)
    c = d["collectives"]
    types = "; ".join(f"{t['type']} x{t['count']} (skew mean {t['skew_mean_ms']:,.2f} / max {t['skew_max_ms']:,.2f} ms"
                      + (f", busbw {t['busbw_mean_gbps']:,.1f} GB/s" if t.get("busbw_mean_gbps") else "") + ")"
                      for t in c["by_type"][:4])
    console.print(f"  collectives: {c['count']} matched across ranks ({c['complete']} on every member)"
                  + (f": {types}" if types else ""), highlight=False)
    if d["load_balance"]:
        console.print(f"  load balance: {d['load_balance']['summary']}", highlight=False)
    if d["clock"]:
        console.print(f"  clocks: {d['clock']['note']}", highlight=False)


def _highlights(a: Analysis, console: Console) -> None:
    """The rank with the most GPU idle-gap time: its longest gaps, top kernels and ops."""
    with_gaps = [s for s in a.ranks if s.gaps and s.gaps.gaps]
    if with_gaps:
        s = max(with_gaps, key=lambda r: r.gaps.gap_ms)
        by = ", ".join(f"{k} {v:,.1f}" for k, v in s.gaps.gap_ms_by_host_activity.items() if v > 0)
        console.print(f"[bold]GPU idle gaps[/] (>= {s.gaps.gap_min_us:.0f} µs), rank {s.rank}: {s.gaps.gaps} gaps, "
                      f"{s.gaps.gap_ms:,.1f} ms; host meanwhile (ms): {by}", highlight=False)
        for g in s.gaps.top[:3]:
            console.print(f"  step {g.step} +{g.start_in_step_ms:,.1f} ms: {g.duration_ms:,.2f} ms idle, host "
                          f"{_HOST_ACTIVITY[g.host_activity]}" + (f" ({g.busy_host_op})" if g.busy_host_op else "")
                          + f"; ended by {shortened(g.next_device_op)}"
                          + (f" launched from {g.launched_by}" if g.launched_by else ""), highlight=False)
    ranked = [s for s in a.ranks if s.kernels and s.kernels.stats.kernels.name]
    if ranked:
        s = ranked[0]
        k = s.kernels.stats.kernels
        top = ", ".join(f"{shortened(n)} {ms:,.1f} ms" for n, ms in list(zip(k.name, k.total_ms))[:3])
        console.print(f"[bold]Top kernels[/] (rank {s.rank}): {top}", highlight=False)
    ops = [s for s in a.ranks if s.has_device and s.operators and s.operators.by_self_device.name]
    if ops:
        s = ops[0]
        o = s.operators.by_self_device
        top = ", ".join(f"{shortened(n)} {ms:,.1f} ms" for n, ms in list(zip(o.name, o.self_device_ms))[:3])
        console.print(f"[bold]Top ops by self GPU time[/] (rank {s.rank}): {top}", highlight=False)


_HOST_ACTIVITY = {"dataloader": "in the DataLoader", "sync": "blocked in a synchronize", "host": "busy in CPU ops",
                  "idle_other": "outside any op"}


_BREAKDOWN_HEADERS = (("compute", "comp"), ("comm_overlapped", "c.ovl"), ("comm_exposed", "c.exp"),
                      ("memcpy", "mcpy"), ("dataloader", "data"), ("sync", "sync"), ("host", "host"),
                      ("idle_other", "idle"))
_BREAKDOWN_LEGEND = ("comp compute · c.ovl comm overlapped with compute · c.exp comm exposed · mcpy memcpy only · "
                     "data DataLoader · sync host synchronize · host CPU ops/launches · idle other · "
                     "eff overlap efficiency")


def _breakdown_table(a: Analysis, shown: list, console: Console) -> None:
    ranks = [s for s in shown if s.steps]
    if not ranks:
        return
    cpu_only = all(s.breakdown_mode == "cpu_only" for s in ranks)
    title = "Where step time went, mean ms per step (parts sum to the step)"
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=_BREAKDOWN_LEGEND
                  + ("; CPU-only job: the training thread plays the device" if cpu_only else ""),
                  caption_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("step", justify="right")
    for _, header in _BREAKDOWN_HEADERS:
        table.add_column(header, justify="right")
    table.add_column("eff", justify="right")
    for s in ranks:
        st = s.step_time
        eff = "-" if s.overlap_efficiency is None else f"{s.overlap_efficiency:.2f}"
        table.add_row(str(s.rank), number(st.mean_ms), *(number(s.breakdown_mean_ms[k]) for k, _ in _BREAKDOWN_HEADERS),
                      eff)
    console.print(table)
