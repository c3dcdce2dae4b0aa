"""`rankscope validate`: one row per input file (what was found, what is wrong)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from rankscope.api import Analysis


def validation_rows(a: Analysis) -> list[dict]:
    rows = []
    notes: dict[str, list[str]] = {}
    for p in a.problems:
        notes.setdefault(p.file, []).append(p.problem)
    for s in a.ranks:
        rows.append({"file": s.meta.file, "ok": True, "rank": s.rank, "rank_source": s.meta.rank_source,
                     "format": s.meta.format, "events": s.meta.events_total, "device_events": s.device_events,
                     "steps": len(s.steps) if s.steps_source == "profiler_step" else 0,
                     "salvaged": s.meta.salvaged, "problems": notes.pop(s.meta.file, [])})
    for p in a.problems:
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
