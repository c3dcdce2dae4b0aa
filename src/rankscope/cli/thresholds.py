"""`rankscope thresholds`: every value that decides a verdict (`rankscope.thresholds.THRESHOLDS`)."""
from __future__ import annotations

import click

from rankscope.cli.common import json_option, show


@click.command("thresholds")
@json_option(text="Print them as one JSON object.")
def command(as_json) -> None:
    """List the thresholds that decide the findings and the straggler / load-balance verdicts: name,
    default value, unit, source and what it decides (override with `analyze --threshold NAME=VALUE`)."""
    from rankscope.results import ThresholdList
    from rankscope.thresholds import THRESHOLDS
    show(ThresholdList(THRESHOLDS), as_json)
