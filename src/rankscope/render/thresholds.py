"""`rankscope thresholds`: every threshold, as a table (terminal) or one JSON object."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rankscope.render.base import JsonRenderer, TerminalRenderer
from rankscope.results import ThresholdList


class ThresholdsTerminal(TerminalRenderer):
    """Name, default value, what it decides, unit and source of each threshold."""

    def render(self, result: ThresholdList, out: Console) -> None:
        table = Table(title="Thresholds (override: analyze --threshold NAME=VALUE)", title_justify="left",
                      header_style="bold", box=box.SIMPLE_HEAD)
        table.add_column("name")
        table.add_column("value", justify="right")
        table.add_column("decides")
        table.add_column("unit / source", overflow="fold")
        for name, t in result.by_name.items():
            table.add_row(name, f"{t.value:g}", t.decides, escape(f"{t.unit}; {t.source}"))
        out.print(table)


class ThresholdsJson(JsonRenderer):
    """{name: {value, unit, source, decides}}."""

    def to_dict(self, result: ThresholdList) -> dict:
        return {name: {"value": t.value, "unit": t.unit, "source": t.source, "decides": t.decides}
                for name, t in result.by_name.items()}
