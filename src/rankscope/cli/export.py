"""`rankscope export perfetto`: a job in another tool's format (`api.export_perfetto`)."""
from __future__ import annotations

import sys

import click

from rankscope.api import export_perfetto
from rankscope.cli.common import EXIT_NOTHING, cache_options, err, exit_code, no_trace, quiet_option, with_progress
from rankscope.render.format import printable


@click.group("export")
def command() -> None:
    """Write a job in another tool's format."""


@command.command("perfetto")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="The file to write: Chrome-trace JSON, gzipped when the name ends in .gz (job.json.gz).")
@cache_options(no_cache_help="Use no cache: a scratch one lives for this export only (each file is parsed once).")
@quiet_option
def perfetto(paths, out, cache_dir, no_cache, quiet) -> None:
    """All ranks in one timeline for ui.perfetto.dev / chrome://tracing: clocks aligned, one process
    per rank, with overlay tracks (idle gaps, exposed communication, straggler waits, steps) and
    counters (launch queue, memcpy bandwidth, allocated memory)."""
    try:
        result = with_progress(lambda progress: export_perfetto(list(paths), out, cache_dir=cache_dir,
                                                                use_cache=not no_cache, on_progress=progress),
                               quiet, "exporting ranks")
    except OSError as exc:
        err(f"{out}: cannot write: {exc.strerror or exc}")
        sys.exit(EXIT_NOTHING)
    code = exit_code(result, no_trace(result))
    if result.usable:
        click.echo(f"wrote {len(result.ranks)} ranks, {result.events} events to {printable(out)} "
                   f"({result.size_bytes / 1e6:.1f} MB); open it in https://ui.perfetto.dev")
    sys.exit(code)
