"""`rankscope memory`: CUDA memory snapshots (`api.analyze_memory_snapshots`)."""
from __future__ import annotations

import sys

import click

from rankscope.api import analyze_memory_snapshots
from rankscope.cli.common import (exit_code, json_option, print_problems, show, threshold_option,
                                  threshold_overrides)


@click.command("memory")
@click.argument("snapshots", nargs=-1, required=True, type=click.Path())
@json_option("rankscope.memory_snapshot/1")
@click.option("--params", type=click.IntRange(min=1), default=None, metavar="N",
              help="Model parameters: adds the theoretical breakdown (params + grads + Adam states + activations).")
@click.option("--param-bytes", type=click.IntRange(min=1), default=4, show_default=True,
              help="Bytes per parameter and gradient (2 for bf16/fp16: an fp32 master copy is then counted).")
@threshold_option
def command(snapshots, as_json, params, param_bytes, thresholds) -> None:
    """CUDA memory snapshots (torch.cuda.memory._dump_snapshot pickles, read without running any code):
    peak, fragmentation, largest live blocks and their stacks, the events before an OOM, memory by category."""
    overrides = threshold_overrides(thresholds)
    try:
        result = analyze_memory_snapshots(list(snapshots), params=params, param_bytes=param_bytes,
                                          thresholds=overrides)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    print_problems(result.problems)
    if result.usable:
        show(result, as_json)
    sys.exit(exit_code(result))
