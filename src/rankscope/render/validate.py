"""`rankscope validate`: one row per input file (what was found, what is wrong). `validation_rows`
builds the rows from an Ingest; the renderers print them as a table or one JSON object. The table
names each file by its path below the folder common to all (in the title), on one line: shortened
in the middle to the room the other columns leave."""
from __future__ import annotations

import os
from typing import Any, TypedDict

from rich import box
from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rankscope.render.base import JsonRenderer, TerminalRenderer
from rankscope.render.format import distinct_shortened, literal, natural_width, printable
from rankscope.results import Ingest

SCHEMA = "rankscope.validate/1"


class ValidationRow(TypedDict):
    """One file's entry of `files[]` in `rankscope.validate/1`."""
    file: str
    ok: bool | None
    rank: int | None
    rank_source: str | None
    format: str | None
    events: int
    device_events: int
    steps: int
    salvaged: bool
    problems: list[str]


def validation_rows(found: Ingest) -> list[ValidationRow]:
    """Per file: rank, where the rank came from, format, events, steps, problems; `ok` is False for
    a skipped file and None for an ignored one (not a trace)."""
    rows: list[ValidationRow] = []
    notes: dict[str, list[str]] = {}
    for p in found.problems:
        notes.setdefault(p.file, []).append(p.problem)
    for m in found.ranks:
        rows.append({"file": m.file, "ok": True, "rank": m.rank, "rank_source": m.rank_source,
                     "format": m.format, "events": m.events_total, "device_events": m.device_events,
                     "steps": m.profiler_steps, "salvaged": m.salvaged, "problems": notes.pop(m.file, [])})
    for p in found.problems:
        if p.file in notes and p.fatal:
            rows.append({"file": p.file, "ok": False, "rank": None, "rank_source": None, "format": None,
                         "events": 0, "device_events": 0, "steps": 0, "salvaged": False,
                         "problems": notes.pop(p.file)})
    for file, problems in notes.items():      # ignored non-trace files
        rows.append({"file": file, "ok": None, "rank": None, "rank_source": None, "format": None,
                     "events": 0, "device_events": 0, "steps": 0, "salvaged": False, "problems": problems})
    return rows


class ValidationJson(JsonRenderer):
    """`validate --json`: the `rankscope.validate/1` object."""

    def to_dict(self, result: Ingest) -> dict[str, Any]:
        return {"schema": SCHEMA, "files": validation_rows(result), "job_warnings": result.warnings}


class ValidationTerminal(TerminalRenderer):
    """`validate`: a table of the files, then every problem and the job's warnings."""

    def render(self, result: Ingest, out: Console) -> None:
        _print_rows(validation_rows(result), result.warnings, out)


_SOURCE: dict[str | None, str] = {"distributedInfo": "trace", "filename": "name", "order": "order"}


def _status(row: ValidationRow) -> str:
    if row["ok"] is None:
        return "[dim]ignored[/]"
    if not row["ok"]:
        return "[red]skipped[/]"
    if row["salvaged"]:
        return "[yellow]salvaged[/]"
    return "[yellow]warning[/]" if row["problems"] else "[green]ok[/]"


#: The narrowest the file column gets: below it the table is let wider than the console.
MIN_NAME_WIDTH = 12


def _print_rows(rows: list[ValidationRow], job_warnings: list[str], console: Console) -> None:
    folder, names = _relative([r["file"] for r in rows])
    cells = [["-" if r["rank"] is None else str(r["rank"]), _SOURCE.get(r["rank_source"], "-"), r["format"] or "-",
              f"{r['events']:,}", f"{r['device_events']:,}", str(r["steps"]), _status(r)] for r in rows]
    title = f"Files in {literal(folder)}" if folder else None
    others = natural_width(console, _table(title, [""] * len(rows), cells))     # the file column as wide as "file"
    room = max(console.width - others + len("file"), MIN_NAME_WIDTH)
    console.print(_table(title, [escape(n) for n in distinct_shortened(names, room)], cells))
    for r, name in zip(rows, names):
        for p in r["problems"]:
            console.print(Text(f"{printable(name)}: {printable(p)}"))
    for w in job_warnings:
        console.print(Text.assemble(("warning:", "yellow"), f" {printable(w)}"))


#: The table's columns and how each is justified.
_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("file", "left"), ("rank", "right"), ("from", "left"), ("format", "left"), ("events", "right"),
    ("GPU ev.", "right"), ("steps", "right"), ("status", "left"))


def _table(title: str | None, names: list[str], cells: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1, 0, 0))
    for col, just in _COLUMNS:
        table.add_column(col, justify=just, no_wrap=col != "file", overflow="fold")   # a name past the room folds
    for name, row in zip(names, cells):
        table.add_row(name, *row)
    return table


def _relative(files: list[str]) -> tuple[str, list[str]]:
    """The folder that holds every file ('' when none does), and each file's path below it."""
    try:
        folder = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
    except ValueError:                 # no files, or on different drives
        return "", files
    return folder, [os.path.relpath(os.path.abspath(f), folder) for f in files]
