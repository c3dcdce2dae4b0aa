"""`rankscope calibrate`: collective latency and bandwidth of this job's fabric, measured under torchrun
(`capture.calibrate.calibrate_under_torchrun`)."""
from __future__ import annotations

import sys

import click

from rankscope.cli.common import EXIT_NOTHING, err, json_option, print_json


def _sizes(_ctx, _param, value):
    from rankscope.capture.calibrate import parse_sizes
    try:
        return parse_sizes(value) if value else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("calibrate")
@click.option("--sizes", callback=_sizes, default=None, metavar="S,S,...",
              help="Message sizes in bytes, nccl-tests' S (K/M/G = KiB/MiB/GiB); default 1K,4K,...,64M.")
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True, help="Timed calls per size.")
@click.option("--ops", default="all_reduce,all_gather,reduce_scatter", show_default=True, metavar="OP,OP,...",
              help="Collectives to time.")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=None,
              help="Process group backend (default: nccl when CUDA is available, else gloo).")
@json_option("rankscope.calibrate/1")
def command(sizes, iters, ops, backend, as_json) -> None:
    """Measure collective latency (alpha) and bandwidth (beta) across message sizes on this job's
    fabric. Run it under torchrun: torchrun --nproc-per-node 4 --no-python rankscope calibrate."""
    from rankscope.capture._torch import CaptureError
    from rankscope.capture.calibrate import DEFAULT_SIZES, calibrate_under_torchrun, format_table
    try:
        doc = calibrate_under_torchrun(sizes or DEFAULT_SIZES, iters, tuple(ops.split(",")), backend)
    except (CaptureError, ValueError) as exc:
        err(str(exc))
        sys.exit(EXIT_NOTHING)
    if doc is None:                  # ranks other than 0 print nothing
        return
    if as_json:
        print_json(doc)
    else:
        click.echo("\n".join(format_table(doc)))
