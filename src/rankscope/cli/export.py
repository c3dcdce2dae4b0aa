"""`rankscope export perfetto`: a job in another tool's format (`api.export_perfetto`)."""
from __future__ import annotations

import sys

import click

from rankscope.api import export_perfetto
from rankscope.cli.common import (EXIT_NOTHING, cache_options, err, exit_code, no_trace, quiet_option,
                                  refuse_overwriting_an_input, say, with_progress)
from rankscope.pipelines.export import parse_selection
from rankscope.render.format import printable


#: From this size on, the export says how large it will be and how to write less.
LARGE_EXPORT_BYTES = 200_000_000


def _selection(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_selection(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group("export")
def command() -> None:
    """Write a job in another tool's format."""


@command.command("perfetto")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", "out", required=True, type=click.Path(),
              help="The file to write: Chrome-trace JSON, gzipped when the name ends in .gz (job.json.gz).")
@click.option("--ranks", "rank_spec", callback=_selection, metavar="LIST",
              help="Only these ranks, e.g. 0-7,77 (clocks and waits still come from every rank).")
@click.option("--steps", "step_spec", callback=_selection, metavar="LIST",
              help="Only what overlaps these profiler steps, e.g. 5-7.")
@cache_options(no_cache_help="Use no cache: a scratch one lives for this export only (each file is parsed once).")
@quiet_option
def perfetto(paths, out, rank_spec, step_spec, cache_dir, no_cache, quiet) -> None:
    """All ranks in one timeline for ui.perfetto.dev / chrome://tracing: clocks aligned, one process
    per rank, with overlay tracks (idle gaps, exposed communication, straggler waits, steps) and
    counters (launch queue, memcpy bandwidth, allocated memory)."""
    def estimate(size: int, ranks: int) -> None:
        if not quiet and size >= LARGE_EXPORT_BYTES:
            err(f"{out}: about {size / 1e6:,.0f} MB of JSON for {ranks} ranks (gzipped about a tenth); "
                f"--ranks 0-7,77 and --steps 5-7 write less")
    refuse_overwriting_an_input(out, list(paths), "cannot write")
    try:
        result = with_progress(lambda progress: export_perfetto(list(paths), out, cache_dir=cache_dir,
                                                                use_cache=not no_cache, on_progress=progress,
                                                                ranks=rank_spec, steps=step_spec,
                                                                on_estimate=estimate),
                               quiet, "exporting ranks")
    except OSError as exc:
        err(f"{out}: cannot write: {exc.strerror or exc}")
        sys.exit(EXIT_NOTHING)
    code = exit_code(result, no_trace(result))
    if result.usable:
        say(f"wrote {len(result.ranks)} ranks, {result.events} events to {printable(out)} "
            f"({result.size_bytes / 1e6:.1f} MB); open it in https://ui.perfetto.dev")
    sys.exit(code)
