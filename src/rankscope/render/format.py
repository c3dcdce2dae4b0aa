"""Formatting shared by the renderers: rounding for JSON (`rounded`, from rankscope.numbers, which
findings' evidence uses too) and the input problems as JSON lists them; numbers, percents and
p-values as text, rank lists as ranges, long names shortened, and HTML escaping. Each renderer
keeps its own layout."""
from __future__ import annotations

import html
import math

from rankscope.model import InputProblem
from rankscope.numbers import rounded

__all__ = ["escaped", "number", "p_value_text", "percent", "problem_list", "ranges", "rounded", "shortened",
           "value_text"]


def problem_list(problems: list[InputProblem]) -> list[dict]:
    """Input problems as the JSON outputs list them: {"file", "problem"} each."""
    return [{"file": p.file, "problem": p.problem} for p in problems]


def number(x: float | None, spec: str = ",.1f", unit: str = "", missing: str = "-") -> str:
    """`x` in the format `spec`, then `unit`; `missing` when x is None."""
    return missing if x is None else f"{x:{spec}}{unit}"


def percent(x: float | None) -> str:
    """A percent with one decimal ('12.3%'); 'n/a' when x is None."""
    return number(x, ".1f", "%", "n/a")


def p_value_text(p: float | None) -> str:
    """A p-value with three decimals, '<0.001' below; 'n/a' when p is None."""
    return "n/a" if p is None else ("<0.001" if p < 0.001 else f"{p:.3f}")


def ranges(values: list[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2, 5, 7-8'"""
    if not values:
        return "-"
    out, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def shortened(name: str, width: int = 48) -> str:
    """A kernel or op name without its leading 'void ', cut to `width` characters with an ellipsis."""
    name = name.removeprefix("void ")
    return name if len(name) <= width else name[:width - 1] + "…"


def escaped(value) -> str:
    """`value` as text, safe inside HTML elements and attribute values."""
    return html.escape(str(value))


def value_text(value, digits: int = 2) -> str:
    """A value as the HTML report shows it: None as '–', ints with thousands separators, floats with
    `digits` decimals (two significant digits below 0.01), dicts and lists item by item."""
    if value is None:
        return "–"
    if isinstance(value, dict):
        return ", ".join(f"{k} {value_text(v, digits)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(v, digits) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    return f"{value:,.{digits}f}" if value == 0 or abs(value) >= 0.01 else f"{value:.2g}"
