"""Terminal output (rich): job header, per-rank table, input problems. Readable at 80 columns."""
from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from rankscope.analyses.overview import step_time_stats
from rankscope.api import Analysis


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}%"


def render_analysis(a: Analysis, console: Console) -> None:
    j = a.job
    ranks_text = _ranges(j.ranks)
    world = f"{len(j.ranks)} of {j.world_size}" if j.world_size and j.world_size != len(j.ranks) else f"{len(j.ranks)}"
    steps_text = (_ranges(j.steps) if j.steps else "none (one step = whole trace)")
    console.print(f"[bold]rankscope[/] job: {world} ranks ({ranks_text}), backend {j.backend or 'unknown'}")
    console.print(f"  devices: {', '.join(j.devices) or 'none (CPU only)'}")
    console.print(f"  steps profiled: {steps_text}   time span: {_ms(j.span_ms)} ms"
                  + (f"   hosts: {', '.join(j.hosts)}" if j.hosts else ""))
    total_events = sum(s.meta.events_total for s in a.ranks)
    cached = sum(s.from_cache for s in a.ranks)
    console.print(f"  events: {total_events:,} ({total_events // max(len(a.ranks), 1):,} per rank)"
                  f"   cache: {cached}/{len(a.ranks)} ranks   engine: {a.engine}")

    table = Table(title="Step time per rank", title_justify="left", header_style="bold")
    table.add_column("rank", justify="right")
    table.add_column("events", justify="right")
    table.add_column("steps", justify="right")
    table.add_column("mean ms", justify="right")
    table.add_column("median ms", justify="right")
    table.add_column("max ms", justify="right")
    table.add_column("GPU busy", justify="right")
    for s in a.ranks:
        st = step_time_stats(s)
        table.add_row(str(s.rank), f"{s.meta.events_total:,}", str(len(s.steps)), _ms(st.mean_ms),
                      _ms(st.median_ms), _ms(st.max_ms), _pct(st.device_busy_pct))
    console.print(table)
    _breakdown_table(a, console)

    for w in j.warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
    for p in a.problems:
        tag = "[red]skipped:[/]" if p.fatal else "[yellow]warning:[/]"
        console.print(f"{tag} {Path(p.file).name}: {p.problem}", highlight=False)


_BREAKDOWN_HEADERS = (("compute", "comp"), ("comm_overlapped", "c.ovl"), ("comm_exposed", "c.exp"),
                      ("memcpy", "mcpy"), ("dataloader", "data"), ("sync", "sync"), ("host", "host"),
                      ("idle_other", "idle"))
_BREAKDOWN_LEGEND = ("comp compute · c.ovl comm overlapped with compute · c.exp comm exposed · mcpy memcpy only · "
                     "data DataLoader · sync host synchronize · host CPU ops/launches · idle other · "
                     "eff overlap efficiency")


def _breakdown_table(a: Analysis, console: Console) -> None:
    ranks = [s for s in a.ranks if s.steps]
    if not ranks:
        return
    cpu_only = all(s.breakdown_mode == "cpu_only" for s in ranks)
    title = "Where step time went, mean ms per step (parts sum to the step)"
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=_BREAKDOWN_LEGEND + ("; CPU-only job: the training thread plays the device" if cpu_only else ""),
                  caption_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("step", justify="right")
    for _, header in _BREAKDOWN_HEADERS:
        table.add_column(header, justify="right")
    table.add_column("eff", justify="right")
    for s in ranks:
        st = step_time_stats(s)
        eff = "-" if s.overlap_efficiency is None else f"{s.overlap_efficiency:.2f}"
        table.add_row(str(s.rank), _ms(st.mean_ms), *(_ms(s.breakdown_mean_ms[k]) for k, _ in _BREAKDOWN_HEADERS), eff)
    console.print(table)


def _ranges(values: list[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2, 5, 7-8'"""
    if not values:
        return "-"
    out, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if v is not None:
            start = prev = v
    return ", ".join(out)
