"""`rankscope report saved.json [--html out.html]`: a report saved with `analyze --json`, shown again:
the terminal report as `analyze` printed it, and the HTML page as `analyze --html` wrote it, from
the saved file alone (no trace is read). Exit 2 when the file is no such report."""
from __future__ import annotations

import sys

import click
import msgspec

from rankscope.cli.common import (EXIT_NOTHING, EXIT_OK, check_html_report, err, refuse_overwriting_an_input, show,
                                  write_html_report)
from rankscope.results import Analysis


@click.command("report")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--html", "html_path", type=click.Path(), default=None, metavar="PATH",
              help="Also write the self-contained HTML report to PATH.")
@click.option("-q", "--quiet", is_flag=True, help="The job header and the findings only (as analyze -q).")
def command(path: str, html_path: str | None, quiet: bool) -> None:
    """Show a report saved with `analyze --json` (terminal, and --html)."""
    if html_path:
        check_html_report(html_path)             # before the work: a target never written to fails at once
        refuse_overwriting_an_input(html_path, [path], "cannot write the HTML report")
    try:
        report = Analysis.load(path)
    except OSError as exc:
        err(f"cannot read {path}: {exc.strerror or exc}")
        sys.exit(EXIT_NOTHING)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        err(f"{path}: not a rankscope.analysis/1 report (as analyze --json writes): {exc}")
        sys.exit(EXIT_NOTHING)
    show(report, as_json=False, brief=quiet)
    if html_path:
        write_html_report(report, html_path)
    sys.exit(EXIT_OK)
