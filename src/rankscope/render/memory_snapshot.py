"""CUDA memory snapshots: JSON (`rankscope.memory_snapshot/1`, docs/inputs.md) and the terminal
view (rich, 80 columns) of a MemoryResult. Nothing is computed here beyond units (bytes -> MB =
MiB, as elsewhere)."""
from __future__ import annotations

from pathlib import PurePath
from typing import Any

from rich.console import Console
from rich.table import Table

from rankscope.units import BYTES_PER_MB
from rankscope.results.memory import CATEGORIES, DeviceMemory, MemoryReport
from rankscope.ingest.memory_snapshot import Frame
from rankscope.render.base import JsonRenderer, TerminalRenderer
from rankscope.render.format import literal, number, print_table, problem_list, rounded
from rankscope.results import MemoryResult, to_plain
from rankscope.results.findings import Finding

SCHEMA = "rankscope.memory_snapshot/1"


def _mb(n: float | None) -> float | None:
    return rounded(None if n is None else n / BYTES_PER_MB, 3)


def _mb_dict(d: dict[str, int]) -> dict[str, float | None]:
    return {k: _mb(v) for k, v in d.items()}


def _frame(f: Frame | None) -> dict[str, str | int] | None:
    return None if f is None else {"name": f[0], "file": f[1], "line": f[2]}


def _device_dict(d: DeviceMemory) -> dict[str, Any]:
    r = d.replay
    return {
        "device": d.device, "segments": d.segments, "reserved_mb": _mb(d.reserved), "allocated_mb": _mb(d.allocated),
        "free_cached_mb": _mb(d.free_cached), "largest_free_block_mb": _mb(d.largest_free_block),
        "free_blocks": d.free_blocks, "fragmentation_pct": round(d.fragmentation_pct, 2), "live_blocks": d.live_blocks,
        "fragmentation_judged": None if d.judged is None else {
            "at": d.judged.at, "reserved_mb": _mb(d.judged.reserved), "allocated_mb": _mb(d.judged.allocated),
            "free_cached_mb": _mb(d.judged.free_cached), "pct_of_reserved": round(d.judged.pct_of_reserved, 2)},
        "live_by_category_mb": _mb_dict(d.live_by_category),
        "trace": None if r is None else {
            "events": r.events, "actions": r.actions, "window_start_us": r.window_start_us, "window_s": r.window_s,
            "allocated_before_window_mb": _mb(r.allocated_before_window),
            "peak_allocated_mb": _mb(r.peak_allocated), "peak_time_us": r.peak_time_us,
            "peak_by_category_mb": _mb_dict(r.peak_by_category), "peak_reserved_mb": _mb(r.peak_reserved)},
    }


def _report_dict(report: MemoryReport) -> dict[str, Any]:
    t = report.theoretical
    return {
        "file": report.file,
        "devices": [_device_dict(d) for d in report.devices],
        "largest_blocks": [{"device": b.device, "address": hex(b.address), "size_mb": _mb(b.size),
                            "requested_mb": _mb(b.requested_size), "category": b.category,
                            "user_frame": _frame(b.user_frame), "frames": [_frame(f) for f in b.frames]}
                           for b in report.largest_blocks],
        "ooms": [{"device": o.device, "time_us": o.time_us, "requested_mb": _mb(o.requested),
                  "device_free_mb": _mb(o.device_free), "allocated_at_oom_mb": _mb(o.allocated_at_oom),
                  "events_before": [{**{k: v for k, v in e.items() if k != "size"}, "size_mb": _mb(e["size"]),
                                     "addr": hex(e["addr"])} for e in o.events_before]} for o in report.ooms],
        "theoretical": None if t is None else {
            "params": t.params, "param_bytes": t.param_bytes, "static_mb": _mb(t.static),
            "measured_peak_mb": _mb(t.measured_peak),
            "rows": [{"category": c, "theoretical_mb": _mb(t.by_category.get(c)),
                      "measured_at_peak_mb": _mb(report.peak_by_category[c]),
                      "measured_at_snapshot_mb": _mb(report.live_by_category[c])} for c in CATEGORIES]},
        "allocator_settings": report.allocator_settings,
    }


class MemoryJson(JsonRenderer):
    """`memory --json`: the `rankscope.memory_snapshot/1` object."""

    def to_dict(self, result: MemoryResult) -> dict[str, Any]:
        out = {"schema": SCHEMA, "snapshots": [_report_dict(r) for r in result.reports],
               "inputs": {"skipped": problem_list(result.skipped)}}
        if hasattr(result, "findings"):
            out["findings"] = to_plain(_findings_of(result))
        return out


def _findings_of(result: MemoryResult) -> list[Finding]:
    """The result's findings (`memory_fragmentation`), when the pipeline judged the snapshots."""
    return list(getattr(result, "findings", None) or [])


# ---------------------------------------------------------------------------------------------
def _mb_text(n: float | None) -> str:
    return number(None if n is None else n / BYTES_PER_MB)


def _where(f: Frame | None) -> str:
    if f is None:
        return "(no stack recorded)"
    return f"{f[0]} {PurePath(f[1].replace(chr(92), '/')).name}:{f[2]}"


class MemoryTerminal(TerminalRenderer):
    """`memory`: per snapshot its devices, memory by category, the largest live blocks and the OOMs."""

    def render(self, result: MemoryResult, out: Console) -> None:
        for report in result.reports:
            _report(report, out)
        if hasattr(result, "findings"):
            _findings(_findings_of(result), out)


def _findings(findings: list[Finding], console: Console) -> None:
    if not findings:
        console.print("Findings: none: no threshold crossed (`rankscope thresholds` lists them)")
        return
    console.print(f"[bold]Findings[/] ({len(findings)}):")
    for i, f in enumerate(findings, 1):
        console.print(f"{i}. [bold]{f.severity.upper()}[/] {f.id}: {literal(f.summary)}")
        console.print(f"   why: {literal(f.explanation)}")
        console.print(f"   fix: {literal(f.fix)}")


def _report(report: MemoryReport, console: Console) -> None:
    console.print(f"[bold]rankscope memory[/]: {literal(PurePath(report.file).name)}")
    for d in report.devices:
        console.print(f"  cuda:{d.device} reserved [bold]{_mb_text(d.reserved)} MB[/] in {d.segments} segments; "
                      f"allocated [bold]{_mb_text(d.allocated)} MB[/]")
        console.print(f"    free cached {_mb_text(d.free_cached)} MB in {d.free_blocks} blocks, largest "
                      f"{_mb_text(d.largest_free_block)} MB: scattered {d.fragmentation_pct:.1f}% (free memory "
                      "outside the largest free block)")
        r = d.replay
        if r:
            at = (f" at +{(r.peak_time_us - r.window_start_us) / 1e6:.3f} s"
                  if r.peak_time_us is not None and r.window_start_us is not None else "")
            console.print(f"    recorded: {r.events:,} events" + (f" over {r.window_s:.3f} s" if r.window_s else "")
                          + f"; peak allocated [bold]{_mb_text(r.peak_allocated)} MB[/]{at}")
            console.print(f"    peak reserved {_mb_text(r.peak_reserved)} MB; {_mb_text(r.allocated_before_window)} MB "
                          "allocated before the recording")
        else:
            console.print("    no allocation history (torch.cuda.memory._record_memory_history() was off)")
        j = d.judged
        if j is not None:
            when = "at peak allocated" if j.at == "peak_allocated" else "at the snapshot (peak unknown)"
            console.print(f"    fragmentation {when}: [bold]{_mb_text(j.free_cached)} MB[/] cached but not "
                          f"allocated, {j.pct_of_reserved:.1f}% of the {_mb_text(j.reserved)} MB reserved then "
                          "(reserved - allocated)")
    _categories(report, console)
    _blocks(report, console)
    _ooms(report, console)


def _categories(report: MemoryReport, console: Console) -> None:
    theo = report.theoretical
    table = Table(title="Memory by category (MB; from allocation stacks)", title_justify="left", header_style="bold")
    table.add_column("category")
    table.add_column("at peak", justify="right")
    table.add_column("at snapshot", justify="right")
    if theo:
        table.add_column(f"theory ({theo.params:,} params)", justify="right")
    for c in CATEGORIES:
        cells = [c, _mb_text(report.peak_by_category[c]), _mb_text(report.live_by_category[c])]
        if theo:
            cells.append(_mb_text(theo.by_category.get(c)))
        table.add_row(*cells)
    print_table(console, table)
    if theo:
        console.print(f"  theory: params, grads {theo.param_bytes} B each; Adam 2 fp32 states; "
                      "activations = peak - static (docs/concepts.md)", style="dim")


def _blocks(report: MemoryReport, console: Console) -> None:
    if not report.largest_blocks:
        return
    table = Table(title="Largest live blocks", title_justify="left", header_style="bold")
    table.add_column("MB", justify="right")
    table.add_column("category")
    table.add_column("allocated at (innermost user frame)", overflow="fold")
    for b in report.largest_blocks:
        table.add_row(_mb_text(b.size), b.category, literal(_where(b.user_frame)))
    print_table(console, table)


def _ooms(report: MemoryReport, console: Console) -> None:
    if not report.ooms:
        console.print("  OOM: none recorded in the trace")
        return
    for o in report.ooms:
        console.print(f"[bold red]OOM[/] on cuda:{o.device}: asked {_mb_text(o.requested)} MB with "
                      f"{_mb_text(o.allocated_at_oom)} MB allocated, {_mb_text(o.device_free)} MB free on the device; "
                      "the events before it:")
        table = Table(header_style="bold")
        table.add_column("action")
        table.add_column("MB", justify="right")
        table.add_column("category")
        table.add_column("where", overflow="fold")
        for e in o.events_before:
            table.add_row(literal(e["action"]), _mb_text(e["size"]), e["category"] or "", literal(e["frame"] or ""))
        print_table(console, table)
