"""`rankscope thresholds`: the findings' thresholds (`findings.THRESHOLDS`)."""
from __future__ import annotations

import click
from rich.console import Console

from rankscope.cli.common import json_option, print_json


@click.command("thresholds")
@json_option(text="Print them as one JSON object.")
def command(as_json) -> None:
    """List the findings' thresholds: name, default value, unit and source (override with
    `analyze --threshold NAME=VALUE`)."""
    from rankscope.findings import THRESHOLDS
    if as_json:
        print_json({name: {"value": t.value, "unit": t.unit, "source": t.source} for name, t in THRESHOLDS.items()})
        return
    from rankscope.render.terminal import render_thresholds
    render_thresholds(THRESHOLDS, Console(highlight=False))
