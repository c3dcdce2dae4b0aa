"""`rankscope nccl`: NCCL_DEBUG=INFO logs compared as runs (`api.analyze_nccl_logs`)."""
from __future__ import annotations

import sys

import click

from rankscope.api import analyze_nccl_logs
from rankscope.cli.common import exit_code, json_option, print_problems, show


@click.command("nccl")
@click.argument("logs", nargs=-1, required=True, type=click.Path())
@json_option("rankscope.nccl/1")
def command(logs, as_json) -> None:
    """NCCL_DEBUG=INFO logs (each one run, e.g. healthy vs slow): version, ranks, channels, rings and trees,
    transport per peer, NCCL's link bandwidths, nccl-tests bus bandwidth; what is slower than its peers."""
    result = analyze_nccl_logs(list(logs))
    print_problems(result.problems)
    if result.usable:
        show(result, as_json)
    sys.exit(exit_code(result))
