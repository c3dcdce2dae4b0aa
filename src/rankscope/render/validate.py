"""`rankscope validate`: one row per input file (what was found, what is wrong)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from rankscope.results import Ingest


def validation_rows(found: Ingest) -> list[dict]:
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


_SOURCE = {"distributedInfo": "trace", "filename": "name", "order": "order"}


def render_validation(rows: list[dict], job_warnings: list[str], console: Console) -> None:
    table = Table(header_style="bold")
    for col, just in (("file", "left"), ("rank", "right"), ("from", "left"), ("format", "left"),
                      ("events", "right"), ("GPU ev.", "right"), ("steps", "right"), ("status", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for r in rows:
        if r["ok"] is None:
            status = "[dim]ignored[/]"
        elif not r["ok"]:
            status = "[red]skipped[/]"
        elif r["salvaged"]:
            status = "[yellow]salvaged[/]"
        else:
            status = "[yellow]warning[/]" if r["problems"] else "[green]ok[/]"
        table.add_row(Path(r["file"]).name, "-" if r["rank"] is None else str(r["rank"]),
                      _SOURCE.get(r["rank_source"], "-"), r["format"] or "-", f"{r['events']:,}",
                      f"{r['device_events']:,}", str(r["steps"]), status)
    console.print(table)
    for r in rows:
        for p in r["problems"]:
            console.print(f"{Path(r['file']).name}: {p}", highlight=False, soft_wrap=True)
    for w in job_warnings:
        console.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
