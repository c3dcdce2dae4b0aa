"""`rankscope analyze`: a job's analysis (`api.analyze`) on the terminal, as JSON, and as an HTML page."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from rankscope.api import analyze
from rankscope.cli.common import (
    EXIT_NOTHING,
    cache_options,
    engine_options,
    err,
    exit_code,
    html_page,
    json_option,
    no_trace,
    quiet_option,
    show,
    with_progress,
)
from rankscope.files import atomic_write_text
from rankscope.ingest.cache import default_cache_dir
from rankscope.render.format import printable
from rankscope.results import Analysis


@click.command("analyze")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--demo", is_flag=True, help="Analyse a generated demo job (8 ranks, one straggler).")
@click.option("--threshold", "thresholds", multiple=True, metavar="NAME=VALUE",
              help="Override a threshold (repeatable); `rankscope thresholds` lists them.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Also write a self-contained HTML report (findings and charts, works offline) to PATH.")
@click.option("--nccl-log", "nccl_logs", multiple=True, type=click.Path(), metavar="LOG",
              help="An NCCL_DEBUG=INFO log of the job (repeatable; several = runs to compare): its findings join.")
@click.option("--same-job", is_flag=True,
              help="The files are one job whatever their trace formats and recording dates say (else formats "
                   "years apart, or recordings over a day apart, make them different jobs).")
@cache_options()
@engine_options
@json_option("rankscope.analysis/1")
@quiet_option
def command(paths, demo, thresholds, cache_dir, no_cache, engine, address, workers, as_json, quiet,
            html_path, nccl_logs, same_job) -> None:
    """Analyse a job: a folder of per-rank traces (or files)."""
    from rankscope.thresholds import parse_override
    if demo:
        from rankscope.synth import demo_job_dir
        paths = (str(demo_job_dir(Path(cache_dir) if cache_dir else default_cache_dir())),) + tuple(paths)
    if not paths:
        raise click.UsageError("give a folder of traces (or files), or --demo")
    try:
        overrides = dict(parse_override(t) for t in thresholds)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    result = with_progress(lambda progress: analyze(list(paths), cache_dir=cache_dir, use_cache=not no_cache,
                                                    engine=engine, workers=workers, on_progress=progress,
                                                    address=address, thresholds=overrides,
                                                    nccl_logs=list(nccl_logs), same_job=same_job),
                           quiet, "analysing ranks")
    code = exit_code(result, no_trace(result))
    if result.usable:
        show(result, as_json, brief=quiet)
        if html_path:
            _write_html(result, html_path)
    sys.exit(code)


def _write_html(result: Analysis, path: str) -> None:
    try:
        atomic_write_text(path, html_page(result))
    except OSError as exc:
        err(f"cannot write the HTML report {path}: {exc.strerror or exc}")
        sys.exit(EXIT_NOTHING)
    click.echo(f"wrote HTML report to {printable(path)}", err=True)
