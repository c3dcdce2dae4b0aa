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


def render_validation(rows: list[dict], job_warnings: list[str], console: Console) -> None:
    table = Table(header_style="bold")
    for col, just in (("file", "left"), ("rank", "right"), ("format", "left"), ("events", "right"),
                      ("GPU events", "right"), ("steps", "right"), ("status", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for r in rows:
        status = ("[green]ok[/]" if r["ok"] and not r["problems"] else
                  "[yellow]" + "; ".join(r["problems"]) + "[/]" if r["ok"] or r["ok"] is None else
                  "[red]" + "; ".join(r["problems"]) + "[/]")
        rank = "-" if r["rank"] is None else f"{r['rank']} ({r['rank_source']})"
        table.add_row(Path(r["file"]).name, rank, r["format"] or "-", f"{r['events']:,}",
                      f"{r['device_events']:,}", str(r["steps"]), status)
    console.print(table)
    for w in job_warnings:
        console.print(f"[yellow]warning:[/] {w}")
