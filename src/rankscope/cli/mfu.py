"""`rankscope mfu`: model and hardware FLOPs utilization of a job (`api.mfu`)."""
from __future__ import annotations

import sys

import click

from rankscope.api import mfu
from rankscope.cli.common import (
    cache_options,
    exit_code,
    json_option,
    no_trace,
    quiet_option,
    show,
    with_progress,
)


@click.command("mfu")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--model-flops-per-step", type=click.FloatRange(min=0, min_open=True), default=None, metavar="F",
              help="Model FLOPs of one training step of the whole job (all GPUs).")
@click.option("--layers", type=click.IntRange(min=1), default=None, help="Transformer layers.")
@click.option("--hidden", type=click.IntRange(min=1), default=None, help="Hidden size.")
@click.option("--heads", type=click.IntRange(min=1), default=None, help="Attention heads.")
@click.option("--vocab", type=click.IntRange(min=1), default=None, help="Vocabulary size.")
@click.option("--seq", type=click.IntRange(min=1), default=None, help="Sequence length.")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Global batch per step, in sequences.")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="none", show_default=True,
              help="Activation recomputation (HFU counts the recomputed FLOPs).")
@click.option("--dtype", type=click.Choice(["fp8", "bf16", "fp16", "tf32", "fp32"]), default=None,
              help="Peak FLOPs dtype (default: the GEMMs' dtype recorded in the traces, else bf16).")
@cache_options()
@json_option("rankscope.mfu/1")
@quiet_option
def command(paths, model_flops_per_step, recompute, dtype, cache_dir, no_cache, as_json, quiet, **dims) -> None:
    """Model and hardware FLOPs utilization (MFU / HFU) against the devices' peak, and communication
    efficiency (bus bandwidth / link peak). FLOPs come from the model (--model-flops-per-step, or the
    transformer dims) or from the traces (with_flops=True per-op FLOPs, else recorded GEMM shapes)."""
    given = {name: value for name, value in dims.items() if value is not None}
    result = with_progress(lambda progress: mfu(list(paths), model_flops_per_step=model_flops_per_step, dims=given,
                                                recompute=recompute, dtype=dtype, cache_dir=cache_dir,
                                                use_cache=not no_cache, on_progress=progress),
                           quiet, "analysing ranks")
    code = exit_code(result, no_trace(result))
    if result.usable:
        show(result, as_json)
    sys.exit(code)
