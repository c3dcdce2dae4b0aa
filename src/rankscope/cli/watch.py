"""`rankscope watch DIR`: follow a running job's profiler folder (`pipelines/watch.RunWatch`), show each
cycle as it is analysed (a live view on a terminal, a line per cycle otherwise, a JSON line per cycle with
--json, the HTML report rewritten with --html), and end with the run report: after --stop-after-idle
seconds without a new file, or at Ctrl-C."""
from __future__ import annotations

import io
import sys
import time

import click

from rankscope.cli.common import (EXIT_NOTHING, cache_options, err, exit_code, html_page, json_option,
                                  print_problems, refuse_overwriting_an_input, show,
                                  threshold_option, threshold_overrides)
from rankscope.engine import ENGINES
from rankscope.files import atomic_write_text
from rankscope.pipelines.watch import CycleDone, RunWatch
from rankscope.render.base import JsonRenderer, renderer
from rankscope.render.format import json_bytes, printable


@click.command("watch")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--settle", "settle_s", type=click.FloatRange(min=0), default=30.0, show_default=True, metavar="S",
              help="Analyse a cycle with ranks missing once S seconds pass without a new file of it (the missing "
                   "ranks are named); a cycle with every rank's file is analysed at once.")
@click.option("--stable", "stable_s", type=click.FloatRange(min=0), default=2.0, show_default=True, metavar="S",
              help="A file counts as complete when unchanged for S seconds (plain JSON whose text closes: sooner).")
@click.option("--stop-after-idle", "idle_s", type=click.FloatRange(min=0), default=None, metavar="S",
              help="End after S seconds without a new trace file (default: run until Ctrl-C).")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              metavar="S", help="Look at the folder every S seconds.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Rewrite the HTML report at PATH (atomically) after each cycle.")
@threshold_option
@cache_options()
@click.option("--engine", type=click.Choice([e for e in ENGINES if e != "ray"]), default="auto", show_default=True,
              help="Where each new cycle's files are read: local thread pool, worker processes, one by one here.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Parallel files (default: CPU cores).")
@json_option(text="One JSON line per analysed cycle ({\"cycle\": its run.cycles row, \"changes\": the changes so "
                  "far}), then the run report (rankscope.analysis/1) as one line.")
def command(folder, settle_s, stable_s, idle_s, interval_s, html_path, thresholds, cache_dir, no_cache, engine,
            workers, as_json) -> None:
    """Follow a running job's profiler folder: analyse each profiler cycle as its files land."""
    from rankscope.thresholds import resolve
    overrides = threshold_overrides(thresholds)
    try:
        values = resolve(overrides)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    refuse_overwriting_an_input(html_path, [folder], "cannot write the HTML report")
    watch = RunWatch(folder, values, cache_dir=cache_dir, use_cache=not no_cache, engine=engine, workers=workers,
                     settle_s=settle_s, stable_s=stable_s)
    live = _live() if not as_json and sys.stdout.isatty() else None
    told = 0
    try:
        while True:
            stop = idle_s is not None and watch.idle_s() >= idle_s
            for done in watch.poll(flush=stop):
                _cycle_done(done, as_json, live, html_path)
            told = _tell_problems(watch, told)
            if live is not None:
                from rankscope.render.watch_terminal import live_view
                report = watch.result()
                live.update(live_view(watch.status(), report.run if report else None), refresh=True)
            if stop:
                break
            time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
        watch.close()
    _tell_problems(watch, told)
    _final(watch, as_json, html_path)


def _live():
    from rich.console import Console
    from rich.live import Live
    live = Live(console=Console(highlight=False), auto_refresh=False, transient=True)
    live.start()
    return live


def _cycle_done(done: CycleDone, as_json: bool, live, html_path: str | None) -> None:
    run = done.report.run
    assert run is not None                # a watched cycle's report has its run
    row = next(c for c in run.cycles if set(c.files) == set(done.files))
    if as_json:
        line = {"cycle": row, "changes": run.changes}
        sys.stdout.buffer.write(json_bytes(line) + b"\n")          # (a file name need not be UTF-8)
        sys.stdout.flush()
    elif live is None:
        from rankscope.render.watch_terminal import cycle_line
        click.echo(cycle_line(row, run))
        sys.stdout.flush()
    if html_path:
        _write_html(done.report, html_path)


def _tell_problems(watch: RunWatch, told: int) -> int:
    """The input problems met since the last call, one stderr line each."""
    print_problems(watch.run.problems[told:])
    return len(watch.run.problems)


def _write_html(result, path: str) -> None:
    try:
        atomic_write_text(path, html_page(result))
    except OSError as exc:
        err(f"cannot write the HTML report {path}: {exc.strerror or exc}")


def _final(watch: RunWatch, as_json: bool, html_path: str | None) -> None:
    result = watch.result()
    if result is None:
        err(f"no profiler cycle analysed in {watch.folder}")
        sys.exit(EXIT_NOTHING)
    if as_json:
        if isinstance(sys.stdout, io.TextIOWrapper):
            sys.stdout.reconfigure(encoding="utf-8")
        json_out = renderer(type(result), "json")
        assert isinstance(json_out, JsonRenderer)
        sys.stdout.buffer.write(json_bytes(json_out.to_dict(result)) + b"\n")
        sys.stdout.flush()
    else:
        show(result, False)
    if html_path:
        _write_html(result, html_path)
        click.echo(f"wrote HTML report to {printable(html_path)}", err=True)
    sys.exit(exit_code(result))
