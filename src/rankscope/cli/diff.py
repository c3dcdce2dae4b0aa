"""`rankscope diff`: an A/B comparison of two runs (`api.diff_runs`)."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from rankscope.api import diff_runs
from rankscope.cli.common import (
    EXIT_NOTHING,
    cache_options,
    err,
    exit_code,
    html_page,
    json_option,
    quiet_option,
    refuse_overwriting_an_input,
    show,
    with_progress,
)
from rankscope.files import atomic_write_text, check_target
from rankscope.results import DiffResult


@click.command("diff")
@click.argument("before", type=click.Path(exists=True))
@click.argument("after", type=click.Path(exists=True))
@json_option("rankscope.diff/1")
@cache_options()
@quiet_option
@click.option("--html", "html_path", type=click.Path(), default=None, metavar="PATH",
              help="Also write the comparison as a self-contained HTML page to PATH.")
def command(before, after, as_json, cache_dir, no_cache, quiet, html_path) -> None:
    """A/B comparison of two runs (trace folders or single traces): what changed, beyond noise."""
    if html_path:
        _write_html(html_path, None)       # checked before the work: a target never written to fails at once
        refuse_overwriting_an_input(html_path, [before, after], "cannot write the HTML page")
    result = with_progress(lambda progress: diff_runs(before, after, cache_dir=cache_dir, use_cache=not no_cache,
                                                      on_progress=progress),
                           quiet, f"analysing {Path(before).name} and {Path(after).name}")
    code = exit_code(result, f"{result.empty_run}: no usable trace found "
                             "(give a folder of *.pt.trace.json[.gz] files, or one file)")
    if not result.usable:
        sys.exit(code)
    if html_path:
        _write_html(html_path, result)
    show(result, as_json)
    sys.exit(code)


def _write_html(path: str, result: DiffResult | None) -> None:
    """The page of `result` to `path`; without a result, only whether `path` may be written."""
    try:
        if result is None:
            check_target(path)
        else:
            atomic_write_text(path, html_page(result))
    except OSError as exc:
        err(f"{path}: cannot write the HTML page: {exc.strerror or exc}")
        sys.exit(EXIT_NOTHING)
