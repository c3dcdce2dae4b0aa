"""`rankscope nccl`: NCCL_DEBUG=INFO logs compared as runs (`api.analyze_nccl_logs`)."""
from __future__ import annotations

import sys

import click
from rich.console import Console

from rankscope.api import analyze_nccl_logs
from rankscope.cli.common import exit_code, json_option, print_json, print_problems, skipped_files


@click.command("nccl")
@click.argument("logs", nargs=-1, required=True, type=click.Path())
@json_option("rankscope.nccl/1")
def command(logs, as_json) -> None:
    """NCCL_DEBUG=INFO logs (each one run, e.g. healthy vs slow): version, ranks, channels, rings and trees,
    transport per peer, NCCL's link bandwidths, nccl-tests bus bandwidth; what is slower than its peers."""
    result = analyze_nccl_logs(list(logs))
    print_problems(result)
    if result.usable:
        from rankscope.render.nccl import nccl_to_dict, render_nccl
        if as_json:
            doc = nccl_to_dict(result.report, result.findings, [])
            doc["inputs"]["skipped"] = skipped_files(result)    # until render/nccl.py lists result.skipped itself
            print_json(doc)
        else:
            render_nccl(result.report, result.findings, Console(highlight=False))
    sys.exit(exit_code(result))
