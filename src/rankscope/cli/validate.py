"""`rankscope validate`: what each trace file holds (`api.ingest`), before it is shared."""
from __future__ import annotations

import sys

import click

from rankscope.api import ingest
from rankscope.cli.common import (
    cache_options,
    engine_options,
    exit_code,
    json_option,
    no_trace,
    quiet_option,
    show,
    with_progress,
)


@click.command("validate")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@cache_options()
@engine_options
@json_option("rankscope.validate/1")
@quiet_option
def command(paths, cache_dir, no_cache, engine, address, workers, as_json, quiet) -> None:
    """Check trace files before sharing them: rank, format, events, steps, problems per file."""
    result = with_progress(lambda progress: ingest(list(paths), cache_dir=cache_dir, use_cache=not no_cache,
                                                   engine=engine, workers=workers, on_progress=progress,
                                                   address=address),
                           quiet, "reading ranks")
    show(result, as_json)
    sys.exit(exit_code(result, no_trace(result)))
