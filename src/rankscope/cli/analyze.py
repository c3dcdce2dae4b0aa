"""`rankscope analyze`: a job's analysis (`api.analyze`) on the terminal, as JSON, and as an HTML page.
Exit code 1 also when Flight Recorder dumps show that the job stopped (a hang or a desync)."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from rankscope.api import analyze
from rankscope.cli.common import (
    EXIT_NOTHING,
    EXIT_SKIPPED,
    cache_options,
    check_html_report,
    engine_options,
    err,
    exit_code,
    json_option,
    no_trace,
    quiet_option,
    refuse_overwriting_an_input,
    say_jobs,
    show,
    threshold_option,
    threshold_overrides,
    with_progress,
    write_html_report,
)
from rankscope.ingest.cache import NotACache, claim_root, default_cache_dir


@click.command("analyze")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--demo", is_flag=True, help="Analyse a generated demo job (8 ranks, one straggler).")
@threshold_option
@click.option("--html", "html_path", type=click.Path(), default=None, metavar="PATH",
              help="Also write a self-contained HTML report (findings and charts, works offline) to PATH.")
@click.option("--nccl-log", "nccl_logs", multiple=True, type=click.Path(), metavar="LOG",
              help="An NCCL_DEBUG=INFO log of the job (repeatable; several = runs to compare): its findings join.")
@click.option("--job", "job", type=click.IntRange(min=1), default=None, metavar="N",
              help="When the inputs hold several jobs (listed without it), analyse job N (1 = the earliest).")
@click.option("--same-job", is_flag=True,
              help="The files are one job whatever their trace formats and recording dates say (else formats "
                   "years apart, or recordings over a day apart, make them different jobs).")
@cache_options()
@engine_options
@json_option("rankscope.analysis/1")
@quiet_option
def command(paths, demo, thresholds, cache_dir, no_cache, engine, address, workers, as_json, quiet,
            html_path, nccl_logs, job, same_job) -> None:
    """Analyse a job: a folder of per-rank traces (or files), and Flight Recorder dumps (hangs)."""
    if demo:
        from rankscope.synth import demo_job_dir
        root = Path(cache_dir) if cache_dir else default_cache_dir()
        try:
            claim_root(root)               # the demo job is written there
        except NotACache as exc:
            err(str(exc))
            sys.exit(EXIT_NOTHING)
        paths = (str(demo_job_dir(root)),) + tuple(paths)
    if not paths:
        raise click.UsageError("give a folder of traces (or files), or --demo")
    overrides = threshold_overrides(thresholds)
    if html_path:
        check_html_report(html_path)             # before the work: a target never written to fails at once
        refuse_overwriting_an_input(html_path, [*paths, *nccl_logs], "cannot write the HTML report")
    result = with_progress(lambda progress: analyze(list(paths), cache_dir=cache_dir, use_cache=not no_cache,
                                                    engine=engine, workers=workers, on_progress=progress,
                                                    address=address, thresholds=overrides,
                                                    nccl_logs=list(nccl_logs), job=job, same_job=same_job),
                           quiet, "analysing ranks")
    if result.jobs and not result.usable:
        say_jobs(result.jobs, job)
        sys.exit(EXIT_NOTHING)
    code = exit_code(result, no_trace(result))
    if result.hang is not None and result.hang.status in ("hang", "desync"):     # the job stopped: exit 1, one line why
        err(f"Flight Recorder dumps: the job stopped ({result.hang.status}): {result.hang.verdict}")
        code = max(code, EXIT_SKIPPED)
    if result.usable:
        show(result, as_json, brief=quiet)
        if html_path:
            write_html_report(result, html_path)
    sys.exit(code)

