"""Formatting shared by the renderers: rounding for JSON (`rounded`, from rankscope.numbers, which
findings' evidence uses too) and the input problems as JSON lists them; numbers, percents and
p-values as text, rank lists as ranges, names from the inputs made printable and shortened in the
middle, HTML escaping, and terminal tables printed without cutting a cell. Each renderer keeps its
own layout."""
from __future__ import annotations

import copy
import dataclasses
import html
import math
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rankscope.model import InputProblem
from rankscope.numbers import ranges, rounded  # noqa: F401  (ranges: the renderers take it from here)

if TYPE_CHECKING:         # rich is imported where a terminal table is drawn (JSON output never needs it)
    from rich.console import Console
    from rich.table import Column, Table
    from rich.text import TextType

__all__ = ["distinct_shortened", "escaped", "literal", "natural_width", "number", "p_value_text", "percent",
           "print_table", "printable", "problem_list", "json_bytes", "ranges", "rounded", "shortened", "utf8_data",
           "utf8_text",
           "value_text"]


def problem_list(problems: list[InputProblem]) -> list[dict[str, str]]:
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




_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    """A control character as '\\xNN'; a byte of a file name that is not UTF-8 (Python holds it as the
    surrogate U+DC80-U+DCFF) as that byte, '\\xNN'; any other lone surrogate as '\\uNNNN'."""
    c = ord(m.group())
    return f"\\x{c - 0xDC00 if 0xDC80 <= c <= 0xDCFF else c:02x}" if c < 0xD800 or 0xDC80 <= c <= 0xDCFF \
        else f"\\u{c:04x}"


def printable(text: object) -> str:
    """`text` with every control character written as its escape (ESC as '\\x1b'): a name read from an
    input cannot move the cursor, clear the screen or retitle the terminal. A file name's bytes that
    are not UTF-8 are written as escapes too ('\\xff')."""
    return _CONTROL.sub(_escape, str(text))


def utf8_text(text: str) -> str:
    """`text` that can be written as UTF-8: a file name's bytes that are not UTF-8 as escapes ('\\xff')."""
    return _SURROGATE.sub(_escape, text)


def json_bytes(data: object) -> bytes:
    """Plain data (or msgspec Structs) as compact JSON; a file name's bytes that are not UTF-8 as
    escapes ('\\xff', `utf8_data`: only where encoding as is fails)."""
    import msgspec
    try:
        return msgspec.json.encode(data)
    except UnicodeEncodeError:
        return msgspec.json.encode(utf8_data(msgspec.to_builtins(data)))


def utf8_data(value: object) -> object:
    """Plain data (dicts, lists, strings, numbers) with every string `utf8_text`."""
    if isinstance(value, str):
        return utf8_text(value)
    if isinstance(value, dict):
        return {utf8_data(k): utf8_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [utf8_data(v) for v in value]
    return value


def literal(text: object) -> str:
    """Text read from an input (a name, a warning) as rich markup that prints it as it is: printable, its
    brackets escaped."""
    from rich.markup import escape
    return escape(printable(text))


def shortened(name: str, width: int = 48) -> str:
    """A kernel, op or file name, printable, without a leading 'void ', shortened in the middle to
    `width` characters (an ellipsis where it was cut: two thirds of the room for the start)."""
    name = printable(name).removeprefix("void ")
    return name if len(name) <= width else _cut(name, width, (width - 1) * 2 // 3)


def _cut(name: str, width: int, head: int) -> str:
    """The first `head` and the last `width - 1 - head` characters of `name` around an ellipsis, moved off
    digits: the end starts before a run of digits, the start drops its last ones (a cut name must not
    read as a cut number)."""
    end = len(name) - (width - 1 - head)
    moved = end
    while 0 < end < len(name) and name[end].isdigit():
        end -= 1
    if end == 0:                       # digits all the way: a plain cut
        end = moved
    return name[:max(0, head - (moved - end))].rstrip("0123456789") + "…" + name[end:]


def distinct_shortened(names: list[str], width: int) -> list[str]:
    """Each name `shortened` to `width`; different names that would look the same are cut elsewhere (more
    of the end), or longer, until they differ."""
    out = [shortened(n, width) for n in names]
    groups: dict[str, list[int]] = {}
    for i, text in enumerate(out):
        groups.setdefault(text, []).append(i)
    for rows in groups.values():
        full = [printable(names[i]).removeprefix("void ") for i in rows]
        if len(set(full)) > 1:
            for i, text in zip(rows, _told_apart(full, width)):
                out[i] = text
    return out


def _told_apart(names: list[str], width: int) -> list[str]:
    """`names` (different, all longer than `width`) cut at the narrowest width from `width` up at which one
    place of the ellipsis tells every two apart: the usual one, just past where two names part from the
    start (or a few characters later, past the digits a cut drops), just before they part from the end,
    or all end or all start."""
    starts = _longest_common(sorted(names)) + 1
    ends = _longest_common(sorted(n[::-1] for n in names)) + 1
    longest = max(map(len, names))
    while width < longest:
        for head in ((width - 1) * 2 // 3, *range(starts, starts + 4), width - 1 - ends, 0, width - 1):
            cut = [n if len(n) <= width else _cut(n, width, head) for n in names] if 0 <= head < width else []
            if len(set(cut)) == len(set(names)):
                return cut
        width += max(1, width // 8)
    return names


def _longest_common(ordered: list[str]) -> int:
    """The longest common prefix of two of `ordered` (sorted): two neighbours share the longest."""
    return max(len(os.path.commonprefix([a, b])) for a, b in zip(ordered, ordered[1:]))


def escaped(value: object) -> str:
    """`value` as text, safe inside HTML elements and attribute values."""
    return html.escape(str(value))


def value_text(value: object, digits: int = 2) -> str:
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


#: Far wider than any table: the width at which a table's natural width is measured.
_UNBOUNDED = 100_000


#: The least room a folding text column is given before a table is made narrower.
MIN_FOLD_WIDTH = 16


def print_table(console: Console, table: Table, keep: int = 1) -> None:
    """Print `table` without cutting a cell: as it is when its columns fit the console's width (text
    columns that fold counted at `MIN_FOLD_WIDTH`), else with narrower gaps, else with its columns split
    over several tables, one under the other, each repeating the first `keep` columns (the row's key);
    the title stays on the first part, the caption goes to the last."""
    width = console.width
    if _needed_width(console, table) <= width:
        console.print(table)
        return
    tight = copy.copy(table)
    tight.padding = (0, 1, 0, 0)
    if _needed_width(console, tight) <= width:
        console.print(tight)
        return
    key, rest, parts = table.columns[:keep], table.columns[keep:], []
    while rest:
        n = 1
        while n < len(rest) and _needed_width(console, _part(table, key + rest[:n + 1])) <= width:
            n += 1
        parts.append(key + rest[:n])
        rest = rest[n:]
    for i, columns in enumerate(parts):
        console.print(_part(table, columns, title=table.title if i == 0 else None,
                            caption=table.caption if i == len(parts) - 1 else None))


def natural_width(console: Console, table: Table) -> int:
    """The width `table` takes on `console` when nothing has to wrap."""
    from rich.measure import Measurement
    return Measurement.get(console, console.options.update_width(_UNBOUNDED), table).maximum


def _needed_width(console: Console, table: Table) -> int:
    """The natural width of `table` with its folding text columns at most `MIN_FOLD_WIDTH` wide."""
    folding = [c.overflow == "fold" and not c.no_wrap for c in table.columns]
    return natural_width(console, _part(table, [dataclasses.replace(c, max_width=MIN_FOLD_WIDTH) if fold else c
                                                for c, fold in zip(table.columns, folding)],
                                        table.title, table.caption))


def _part(table: Table, columns: list[Column], title: TextType | None = None,
          caption: TextType | None = None) -> Table:
    """A copy of `table` with only `columns` (their cells shared)."""
    part = copy.copy(table)
    part.columns = [dataclasses.replace(c, _index=i) for i, c in enumerate(columns)]
    part.title, part.caption = title, caption
    return part


def no_device_words(issue_kinds: Iterable[str]) -> str:
    """What a job without device events is, from its capture issues' kinds: CPU-only, unless kernels
    were launched and not captured, or its device activity is of a kind not analysed."""
    kinds = set(issue_kinds)
    if "device_not_analysed" in kinds:
        return "device activity not analysed"
    return "no GPU activity captured" if "kernels_not_captured" in kinds else "CPU-only job"


#: Where in its step a device idle gap lies (Gap.position), as the reports say it.
GAP_POSITIONS = {"between": "", "before_first": " before the step's first kernel",
                 "after_last": " after the step's last kernel"}
