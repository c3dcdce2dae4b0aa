"""MFU report output: `mfu_to_dict` (JSON, schema rankscope.mfu/1) and `render_mfu` (terminal).
Nothing is computed here: the numbers come from analyses.mfu.MfuReport."""
from __future__ import annotations

import dataclasses

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rankscope.analyses.job.mfu import MfuReport

SCHEMA = "rankscope.mfu/1"
SOURCES = {"model": "model FLOPs given", "flops_args": "per-op FLOPs in the traces (with_flops)",
           "gemm_shapes": "GEMM shapes recorded in the traces", "none": "no FLOPs"}


def mfu_to_dict(report: MfuReport) -> dict:
    d = dataclasses.asdict(report)
    d["comm_efficiency"] = d.pop("comm")
    return {"schema": SCHEMA, **d}


def _num(x: float | None, fmt: str = ",.1f", unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{fmt}}{unit}"


def _small(x: float | None, unit: str = "") -> str:
    """One decimal, or three significant digits below 1 (small models run at a fraction of a percent)."""
    return "n/a" if x is None else f"{x:,.1f}{unit}" if abs(x) >= 1 else f"{x:.3g}{unit}"


def render_mfu(report: MfuReport, console: Console) -> None:
    r = report
    console.print(f"[bold]rankscope mfu[/]: {len(r.ranks)} of {r.world_size} ranks, FLOPs from "
                  f"{SOURCES.get(r.source, r.source)}, peak for {r.dtype} ({r.dtype_source}), "
                  f"recompute {r.recompute} (x{r.recompute_factor:.3f})", highlight=False)
    devices = sorted({x.device for x in r.ranks if x.device})
    console.print(f"  devices: {escape(', '.join(devices) or 'unknown')}", highlight=False)
    if r.model is not None:
        console.print(f"  model: {r.model.model_flops_per_step / 1e12:,.1f} TFLOP per step "
                      f"(hardware {r.model.hardware_flops_per_step / 1e12:,.1f})"
                      + (f", {r.model.params / 1e9:,.2f} B parameters, {r.model.tokens:,.0f} tokens per step"
                         if r.model.params else ""), highlight=False)
    console.print(f"  MFU {_small(r.mfu_pct, '%')}   HFU {_small(r.hfu_pct, '%')}   "
                  f"achieved {_small(r.achieved_tflops_per_gpu)} TFLOPS per GPU   "
                  f"step {_num(r.step_ms)} ms", highlight=False)
    table = Table(header_style="bold", box=box.SIMPLE_HEAD)
    hfu = r.recompute_factor != 1.0
    for col in ("rank", "device", "peak\nTFLOPS", "steps", "step\nms", "TFLOP\nper step", "TFLOPS", "MFU") + (
            ("HFU",) if hfu else ()):
        table.add_column(col, justify="left" if col == "device" else "right")
    for x in r.ranks:
        table.add_row(str(x.rank), escape(x.device_model or x.device or "-"), _num(x.peak_tflops), str(x.steps),
                      _num(x.step_ms), _small(x.model_tflop_per_step), _small(x.achieved_tflops),
                      _small(x.mfu_pct, "%"), *((_small(x.hfu_pct, "%"),) if hfu else ()))
    console.print(table)
    if r.comm:
        comm = Table(title="Communication efficiency (bus bandwidth / link peak)", title_justify="left",
                     header_style="bold", box=box.SIMPLE_HEAD)
        for col in ("collective", "ranks", "count", "busbw GB/s", "link peak GB/s", "efficiency"):
            comm.add_column(col, justify="left" if col == "collective" else "right")
        for c in r.comm:
            comm.add_row(escape(c.type), str(c.group_size), str(c.count), _num(c.busbw_gbps),
                         _num(c.link_peak_gbps, ",.0f"), _num(c.efficiency_pct, ".1f", "%"))
        console.print(comm)
    for note in r.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
