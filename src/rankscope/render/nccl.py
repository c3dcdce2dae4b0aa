"""NCCL logs: JSON (`rankscope.nccl/1`, docs/inputs.md) and the terminal view (rich, 80 columns) of
an NcclResult. Nothing is computed here: the numbers come from analyses/inputs/nccl.py and
findings.nccl_findings."""
from __future__ import annotations

import dataclasses
from pathlib import PurePath
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rankscope.results.nccl import NcclReport, NcclRun
from rankscope.render.base import JsonRenderer, TerminalRenderer
from rankscope.render.format import literal, number, print_table, printable, problem_list, rounded, shortened
from rankscope.render.terminal import SEVERITY_STYLE
from rankscope.results import Finding, NcclResult, to_plain

SCHEMA = "rankscope.nccl/1"
MAX_RUN_COLUMNS = 4              # runs side by side in the bus bandwidth table
MAX_WARNING_LINES = 5            # NCCL warning / error lines shown per run (the JSON has up to 20)


def _run_dict(run: NcclRun) -> dict[str, Any]:
    log = run.log
    peers: dict[str, list[dict[str, Any]]] = {}
    for p in run.peers:
        peers.setdefault(p.comm_id, []).append({"src": p.src, "dst": p.dst, "same_host": p.same_host, "via": p.via,
                                                "kind": p.kind, "channels": p.channels})
    return {
        "file": run.file, "nccl_version": run.nccl_version, "cuda_driver_version": log.cuda_driver_version,
        "hosts": run.hosts, "env": log.env,
        "env_vs_reference": [{"name": d.name, "change": d.change, "value": d.value,
                              "reference_value": d.reference_value, "reference_from": d.reference_from,
                              "diagnostic": d.diagnostic} for d in run.env_vs_reference],
        "devices": {str(rank): name for rank, name in sorted(log.devices.items())},
        "comms": [{"comm_id": c.comm_id, "nranks": c.nranks, "nnodes": c.nnodes,
                   "coll_channels": c.coll_channels, "p2p_channels": c.p2p_channels,
                   "nvls_channels": c.nvls_channels, "collnet_channels": c.collnet_channels,
                   "ranks": [dataclasses.asdict(r) for r in sorted(log.comms[c.comm_id].ranks.values(),
                                                                   key=lambda r: r.rank)],
                   "rings": {str(ch): order for ch, order in sorted(log.comms[c.comm_id].rings.items())},
                   "trees": {str(ch): {str(r): node for r, node in sorted(nodes.items())}
                             for ch, nodes in sorted(log.comms[c.comm_id].trees.items())},
                   "peers": peers.get(c.comm_id, [])} for c in run.comms],
        "topology": [dataclasses.asdict(link) for link in log.topology.values()],
        "graphs": [dataclasses.asdict(g) for g in log.graphs],
        "nvls": run.nvls, "collnet": run.collnet,
        "ops": [{"collective": c, "datatype": d, "op": op, "bytes": b, "comm_id": comm, "calls": n}
                for (c, d, op, b, comm), n in log.ops.items()],
        "algorithms": [{"collective": c, "bytes": b, "algorithm": a, "protocol": p, "channels": ch, "calls": n}
                       for (c, b, a, p, ch), n in log.algorithms.items()],
        "perf": [{"test": t.name, "avg_busbw_gbps": t.avg_busbw_gbps,
                  "rows": [dataclasses.asdict(row) for row in t.rows]} for t in log.perf],
        "busbw_gbps": rounded(run.avg_busbw_gbps, 4), "peak_busbw_gbps": rounded(run.peak_busbw_gbps, 4),
        "warnings": log.warnings, "warning_count": log.warning_count,
        "warning_lines": [dataclasses.asdict(w) for w in log.warning_lines],
        "files": log.files, "env_by_rank": {k: {str(r): v for r, v in vs.items()} for k, vs in log.env_by_rank.items()},
        "lines": log.lines, "nccl_lines": log.nccl_lines,
    }


class NcclJson(JsonRenderer):
    """`nccl --json`: the `rankscope.nccl/1` object."""

    def to_dict(self, result: NcclResult) -> dict[str, Any]:
        report = _report(result)
        return {
            "schema": SCHEMA,
            "runs": [_run_dict(run) for run in report.runs],
            "best_run": report.best_run,
            "comparisons": [{"file": c.file, "kind": c.kind, "subject": c.subject, "ranks": c.ranks,
                             "value": rounded(c.value, 3), "reference": rounded(c.reference, 3),
                             "reference_from": c.reference_from, "pct": rounded(c.pct, 1), **c.detail}
                            for c in report.comparisons],
            "findings": to_plain(result.findings),
            "inputs": {"skipped": problem_list(result.skipped)},
        }


def _report(result: NcclResult) -> NcclReport:
    """The runs of a usable result: only those are rendered (cli/nccl.py shows a result when
    `result.usable`, i.e. some log could be read and `report` is not None)."""
    assert result.report is not None, "an NcclResult without a readable log has nothing to render"
    return result.report


# ---------------------------------------------------------------------------------------------
def _name(file: str) -> str:
    return PurePath(file).name


class NcclTerminal(TerminalRenderer):
    """`nccl`: per log its version, env, devices, comms, transports and links; the nccl-tests bus
    bandwidth side by side; the findings."""

    def render(self, result: NcclResult, out: Console) -> None:
        report = _report(result)
        best = (f"; best bus bandwidth: {literal(_name(report.best_run))}" if report.best_run and len(report.runs) > 1
                else "")
        out.print(f"[bold]rankscope nccl[/]: {len(report.runs)} log{'s' if len(report.runs) != 1 else ''}{best}")
        for run in report.runs:
            _run(run, out)
        _busbw_table(report, out)
        _findings(result.findings, out)


def _run(run: NcclRun, console: Console) -> None:
    log = run.log
    head = [f"NCCL {run.nccl_version}" if run.nccl_version else "NCCL version not logged"]
    if log.cuda_driver_version:
        head.append(f"CUDA driver {log.cuda_driver_version}")
    head.append(f"host{'s' if len(run.hosts) != 1 else ''} {', '.join(run.hosts) or '?'}")
    console.print(f"[bold]{literal(_name(run.file))}[/]: {literal(', '.join(head))}")
    differs = {d.name: d for d in run.env_vs_reference}
    for name, value in log.env.items():
        d = differs.get(name)
        note = ("" if d is None else f" (not set in {_name(d.reference_from)})" if d.change == "set_only_here"
                else f" ({_name(d.reference_from)}: {d.reference_value})")
        console.print(f"  env {literal(name)}={literal(value)}{literal(note)}")
    for d in run.env_vs_reference:
        if d.change == "unset_only_here":
            console.print(f"  env {literal(d.name)} not set ({literal(_name(d.reference_from))}: "
                          f"{literal(d.name)}={literal(d.reference_value or '')})")
    if log.devices:
        counts = ", ".join(f"{n} x{list(log.devices.values()).count(n)}" for n in run.devices)
        console.print(f"  devices: {literal(counts)}")
    for c in run.comms:
        extra = [f"{c.p2p_channels} p2p"] if c.p2p_channels is not None else []
        extra += [f"{c.nvls_channels} nvls"] if c.nvls_channels is not None else []
        console.print(f"  comm {c.comm_id}: {c.nranks} ranks on {c.nnodes or '?'} node"
                      f"{'s' if c.nnodes != 1 else ''}, [bold]{c.coll_channels if c.coll_channels is not None else '?'}"
                      "[/] coll channels" + (f" ({', '.join(extra)})" if extra else ""))
        for p in (p for p in run.peers if p.comm_id == c.comm_id):
            console.print(f"    rank {p.src} -> {p.dst}: {literal(p.via)} on {p.channels} channel(s)")
    for link in run.gpu_links:
        console.print(f"  NCCL link {literal(link.src)} -> {literal(link.dst)}: {literal(link.type)} "
                      f"{link.bw_gbps:g} GB/s")
    for t in log.perf:
        console.print(f"  nccl-tests {literal(t.name)}: {len(t.rows)} sizes, avg bus bandwidth "
                      f"{t.avg_busbw_gbps if t.avg_busbw_gbps is not None else '?'} GB/s")
    if log.ops:
        calls = sum(log.ops.values())
        algos = sorted({f"{a}/{p}" + (f" {ch} ch" if ch else "") for (_c, _b, a, p, ch) in log.algorithms})
        console.print(f"  ops traced (COLL): {calls:,}"
                      + (f"; algorithms {literal(', '.join(algos))}" if algos else ""))
    for name, by_rank in log.env_by_rank.items():
        console.print(f"  {literal(name)} per rank: " + ", ".join(f"rank {r} {literal(v)}" for r, v in by_rank.items()))
    if log.warning_count:
        shown = len(log.warning_lines)
        console.print(f"  [yellow]NCCL warnings and errors: {log.warning_count}[/]"
                      + (f" (the first {shown})" if shown < log.warning_count else ""))
        for w in log.warning_lines[:MAX_WARNING_LINES]:
            where = ", ".join(x for x in (f"rank {w.rank}" if w.rank is not None else None,
                                          f"host {w.host}" if w.host else None) if x)
            console.print(f"    {w.level} ({literal(where or 'origin unknown')}): {literal(w.text)}")


def _busbw_table(report: NcclReport, console: Console) -> None:
    runs = [r for r in report.runs if any(t.rows for t in r.log.perf)][:MAX_RUN_COLUMNS]
    if not runs:
        return
    table = Table(title="nccl-tests bus bandwidth, out-of-place (GB/s)", title_justify="left", header_style="bold")
    table.add_column("test")
    table.add_column("size", justify="right")
    for run in runs:
        table.add_column(escape(shortened(_name(run.file), 18)), justify="right")
    cells: dict[tuple[str, int], dict[str, float | None]] = {}
    for run in runs:
        for t in run.log.perf:
            for row in t.rows:
                cells.setdefault((t.name, row.size_bytes), {})[run.file] = row.out_of_place.busbw_gbps
    for (test, size), by_run in cells.items():
        table.add_row(literal(test), _size(size), *(number(by_run.get(run.file), ".1f") for run in runs))
    print_table(console, table, keep=2)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def _findings(findings: list[Finding], console: Console) -> None:
    if not findings:
        console.print("[bold]Findings:[/] none (no slower link, transport or channel count than its peers)")
        return
    console.print("[bold]Findings[/], most urgent first:")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column()
    for i, f in enumerate(findings, 1):
        text = Text()
        text.append(f.severity.upper(), style=SEVERITY_STYLE[f.severity])
        text.append(f" {f.id}", style="bold")
        text.append(f": {printable(f.summary)}")
        text.append("\nfix: ", style="green")
        text.append(f.fix)
        grid.add_row(f"{i}.", text)
    console.print(grid)
