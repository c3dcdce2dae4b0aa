"""MFU report output: JSON (schema rankscope.mfu/1) and the terminal view of an MfuResult.
Nothing is computed here: the numbers come from analyses/job/mfu.py."""
from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from rankscope.render.base import JsonRenderer, TerminalRenderer
from rankscope.render.format import literal, number, percent, print_table
from rankscope.results import MfuResult, to_plain

SCHEMA = "rankscope.mfu/1"
SOURCES = {"model": "model FLOPs given", "flops_args": "per-op FLOPs in the traces (with_flops)",
           "gemm_shapes": "GEMM shapes recorded in the traces", "none": "no FLOPs"}


class MfuJson(JsonRenderer):
    """`mfu --json`: the `rankscope.mfu/1` object."""

    def to_dict(self, result: MfuResult) -> dict[str, Any]:
        # The CLI writes only a usable result, which has a report.
        assert result.report is not None
        d: dict[str, Any] = to_plain(result.report)
        d["comm_efficiency"] = d.pop("comm")
        return {"schema": SCHEMA, **d}


def _small(x: float | None, unit: str = "") -> str:
    """One decimal, or three significant digits below 1 (small models run at a fraction of a percent)."""
    return "n/a" if x is None else f"{x:,.1f}{unit}" if abs(x) >= 1 else f"{x:.3g}{unit}"


class MfuTerminal(TerminalRenderer):
    """`mfu`: MFU / HFU of the job, per rank, and the collectives' bus bandwidth against the link peak."""

    def render(self, result: MfuResult, out: Console) -> None:
        r = result.report
        # The CLI prints only a usable result, which has a report.
        assert r is not None
        out.print(f"[bold]rankscope mfu[/]: {len(r.ranks)} of {r.world_size} ranks, FLOPs from "
                  f"{SOURCES.get(r.source, r.source)}, peak for {r.dtype} ({r.dtype_source}), "
                  f"recompute {r.recompute} (x{r.recompute_factor:.3f})", highlight=False)
        devices = sorted({x.device for x in r.ranks if x.device})
        out.print(f"  devices: {literal(', '.join(devices) or 'unknown')}", highlight=False)
        if r.model is not None:
            out.print(f"  model: {r.model.model_flops_per_step / 1e12:,.1f} TFLOP per step "
                      f"(hardware {r.model.hardware_flops_per_step / 1e12:,.1f})"
                      + (f", {r.model.params / 1e9:,.2f} B parameters, {r.model.tokens:,.0f} tokens per step"
                         if r.model.params else ""), highlight=False)
        out.print(f"  MFU {_small(r.mfu_pct, '%')}   HFU {_small(r.hfu_pct, '%')}   "
                  f"achieved {_small(r.achieved_tflops_per_gpu)} TFLOPS per GPU   "
                  f"step {number(r.step_ms, missing='n/a')} ms", highlight=False)
        table = Table(header_style="bold", box=box.SIMPLE_HEAD)
        hfu = r.recompute_factor != 1.0
        for col in ("rank", "device", "peak\nTFLOPS", "steps", "step\nms", "TFLOP\nper step", "TFLOPS", "MFU") + (
                ("HFU",) if hfu else ()):
            table.add_column(col, justify="left" if col == "device" else "right")
        for x in r.ranks:
            table.add_row(str(x.rank), literal(x.device_model or x.device or "-"), number(x.peak_tflops, missing="n/a"),
                          str(x.steps), number(x.step_ms, missing="n/a"), _small(x.model_tflop_per_step),
                          _small(x.achieved_tflops), _small(x.mfu_pct, "%"),
                          *((_small(x.hfu_pct, "%"),) if hfu else ()))
        print_table(out, table)
        if r.comm:
            comm = Table(title="Communication efficiency (bus bandwidth / link peak)", title_justify="left",
                         header_style="bold", box=box.SIMPLE_HEAD)
            for col in ("collective", "ranks", "count", "busbw GB/s", "link peak GB/s", "efficiency"):
                comm.add_column(col, justify="left" if col == "collective" else "right")
            for c in r.comm:
                comm.add_row(literal(c.type), str(c.group_size), str(c.count), number(c.busbw_gbps, missing="n/a"),
                             number(c.link_peak_gbps, ",.0f", missing="n/a"), percent(c.efficiency_pct))
            print_table(out, comm)
        for note in r.notes:
            out.print(f"[yellow]note:[/] {literal(note)}", highlight=False)


