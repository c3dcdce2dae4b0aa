"""`rankscope thresholds`: every threshold, as a table (terminal) or one JSON object."""
from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from rankscope.render.base import JsonRenderer, TerminalRenderer
from rankscope.render.format import literal
from rankscope.results import ThresholdList


def _value(value: float) -> str:
    """Whole numbers with thousands separators, others as short as they go."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


class ThresholdsTerminal(TerminalRenderer):
    """Name and default value of each threshold; what it decides, its unit and its source beside them,
    folded into the room left."""

    def render(self, result: ThresholdList, out: Console) -> None:
        table = Table(title="Thresholds (override: analyze --threshold NAME=VALUE)", title_justify="left",
                      header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("name", no_wrap=True)
        table.add_column("value", justify="right", no_wrap=True)
        table.add_column("range", justify="right", no_wrap=True)
        table.add_column("decides (unit): source", overflow="fold")
        for name, t in result.by_name.items():
            lo, hi = t.limits
            table.add_row(name, _value(t.value), f"{_value(lo)}-{_value(hi) if hi < float('inf') else '∞'}",
                          literal(f"{t.decides} ({t.unit}): {t.source}"))
        out.print(table)
        out.print("range: the values an override may take (a finite number; a whole one for ranks and rounds)")


class ThresholdsJson(JsonRenderer):
    """{name: {value, unit, source, decides, range: [lowest, highest or null: unbounded]}}."""

    def to_dict(self, result: ThresholdList) -> dict[str, Any]:
        return {name: {"value": t.value, "unit": t.unit, "source": t.source, "decides": t.decides,
                       "range": [t.limits[0], t.limits[1] if t.limits[1] < float("inf") else None]}
                for name, t in result.by_name.items()}
