"""`rankscope validate`: one row per input file (what was found, what is wrong). `validation_rows`
builds the rows from an Ingest; the renderers print them as a table or one JSON object."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from rankscope.render.base import JsonRenderer, TerminalRenderer
from rankscope.results import Ingest

SCHEMA = "rankscope.validate/1"


def validation_rows(found: Ingest) -> list[dict]:
    """Per file: rank, where the rank came from, format, events, steps, problems; `ok` is False for
    a skipped file and None for an ignored one (not a trace)."""
    rows = []
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

    def to_dict(self, result: Ingest) -> dict:
        return {"schema": SCHEMA, "files": validation_rows(result), "job_warnings": result.warnings}


class ValidationTerminal(TerminalRenderer):
    """`validate`: a table of the files, then every problem and the job's warnings."""

    def render(self, result: Ingest, out: Console) -> None:
        _print_rows(validation_rows(result), result.warnings, out)


_SOURCE = {"distributedInfo": "trace", "filename": "name", "order": "order"}


def _status(row: dict) -> str:
    if row["ok"] is None:
        return "[dim]ignored[/]"
    if not row["ok"]:
        return "[red]skipped[/]"
    if row["salvaged"]:
        return "[yellow]salvaged[/]"
    return "[yellow]warning[/]" if row["problems"] else "[green]ok[/]"


def _print_rows(rows: list[dict], job_warnings: list[str], console: Console) -> None:
    table = Table(header_style="bold")
    for col, just in (("file", "left"), ("rank", "right"), ("from", "left"), ("format", "left"),
                      ("events", "right"), ("GPU ev.", "right"), ("steps", "right"), ("status", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for r in rows:
        table.add_row(Path(r["file"]).name, "-" if r["rank"] is None else str(r["rank"]),
                      _SOURCE.get(r["rank_source"], "-"), r["format"] or "-", f"{r['events']:,}",
                      f"{r['device_events']:,}", str(r["steps"]), _status(r))
    console.print(table)
    for r in rows:
        for p in r["problems"]:
            console.print(f"{Path(r['file']).name}: {p}", highlight=False, soft_wrap=True)
    for w in job_warnings:
        console.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
