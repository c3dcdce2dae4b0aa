"""What the subcommands share: their common options (each declared here once, composed per command),
the progress bar, stderr lines, JSON on stdout and the exit code.

Exit codes: 0 ok; 1 the command ran but some inputs were skipped (stderr says which), or (`analyze`)
the input was partial: a trace cut short, values dropped, kernels launched but none captured, files
of different jobs (stderr says why, the report's capture line what is missing); 2 nothing usable,
or bad arguments.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import sys
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence, TypeVar

import click
import msgspec

from rankscope.engine import ENGINES, EngineError
from rankscope.files import atomic_write_text, check_target, write_all
from rankscope.ingest.cache import NotACache, default_cache_dir
from rankscope.pipelines import ArgumentError
from rankscope.render.base import TextRenderer, render, renderer
from rankscope.render.format import json_bytes, printable, utf8_text
from rankscope.results import Analysis

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.model import InputProblem
    from rankscope.results import Result, ThresholdList

R = TypeVar("R", bound="Result")

EXIT_OK, EXIT_SKIPPED, EXIT_NOTHING = 0, 1, 2


def refuse_overwriting_an_input(target: str | None, inputs: Sequence[str], what: str) -> None:
    """An output `target` that is one of the files the command reads (the same file, whatever path
    names it; in a folder, the traces and Flight Recorder dumps it would read) would be destroyed by
    writing it: one line, exit 2, before any work."""
    if not target:
        return
    try:
        st = os.stat(target)
    except OSError:                    # nothing there yet, or not readable: the write says what is wrong
        return
    from rankscope.ingest.discover import discover
    found = discover(list(inputs))
    candidates: list[str | os.PathLike[str]] = [*inputs, *found.traces, *found.fr_dumps]
    for path in candidates:
        try:
            other = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(other.st_mode) and (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            err(f"{what} {target}: that is {path}, an input of this command; give another path")
            sys.exit(EXIT_NOTHING)


def options(*decorators: Callable) -> Callable:
    """One decorator of several options, listed in `--help` in the order given."""
    def apply(f):
        for decorator in reversed(decorators):
            f = decorator(f)
        return f
    return apply


def cache_options(no_cache_help: str = "Parse every file; neither read nor write the cache.") -> Callable:
    """--cache-dir and --no-cache (what no cache means differs by command)."""
    return options(
        click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                     help=f"Where parsed ranks are kept (default {default_cache_dir()}; env RANKSCOPE_CACHE_DIR)."),
        click.option("--no-cache", is_flag=True, help=no_cache_help))


engine_options = options(
    click.option("--engine", type=click.Choice(ENGINES), default="auto", show_default=True,
                 help="Per-rank work: local thread pool, worker processes, one by one in this process, "
                      "Ray tasks (pip install 'rankscope[ray]'), or auto by input size."),
    click.option("--address", default=None, metavar="ADDR",
                 help="Ray cluster to run on (implies --engine ray): 'auto', 'HOST:6379' or 'ray://HOST:10001'. "
                      "Without it, --engine ray starts a local Ray runtime of --workers CPUs."),
    click.option("--workers", type=click.IntRange(min=1), default=None,
                 help="Parallel ranks for the local/processes engines, CPUs of a local Ray runtime "
                      "(default: usable CPU cores)."))

quiet_option = click.option("-q", "--quiet", is_flag=True, help="No progress bar.")

threshold_option = click.option("--threshold", "thresholds", multiple=True, metavar="NAME=VALUE",
                                help="Override a threshold (repeatable); `rankscope thresholds` lists them.")


def threshold_overrides(texts: Sequence[str]) -> dict[str, float]:
    """The overrides of --threshold NAME=VALUE options; a malformed one is a usage error."""
    from rankscope.thresholds import parse_override
    try:
        return dict(parse_override(t) for t in texts)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def json_option(schema: str | None = None, text: str | None = None) -> Callable:
    """--json: print one JSON object of `schema` (or what `text` says)."""
    return click.option("--json", "as_json", is_flag=True, help=text or f"Print one JSON object (schema {schema}).")


def err(message: str) -> None:
    """One line on stderr, control characters of names written as escapes."""
    click.echo(f"rankscope: {printable(message)}", err=True)


def print_json(obj) -> None:
    """A plain JSON object on stdout (UTF-8), indented by one space."""
    emit(msgspec.json.format(json_bytes(obj), indent=1) + b"\n")


def emit(data: bytes) -> None:
    """`data` on stdout in one checked write (`files.write_all`): when it fails (a full disk, a
    closed pipe), one line on stderr and exit 2, never part of the output with exit 0 (as with
    PYTHONUNBUFFERED=1, whose stdout took what fitted and went on) nor a traceback at exit."""
    try:
        sys.stdout.flush()
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, io.UnsupportedOperation, ValueError):   # a stream without a file (tests)
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return
        write_all(fd, data)
    except OSError as exc:
        err(f"cannot write to standard output: {exc.strerror or exc}")
        sys.exit(EXIT_NOTHING)


def say(line: str) -> None:
    """One line on stdout (`emit`)."""
    emit(f"{line}\n".encode(sys.stdout.encoding or "utf-8", sys.stdout.errors or "strict"))


#: A control character, or (group 1) a style sequence of rich's own.
_CONTROL_OR_STYLE = re.compile(r"(\x1b\[[0-9;]*m)|[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def show(result: Result | ThresholdList, as_json: bool, **terminal_options) -> None:
    """The result on stdout: one JSON object (UTF-8 whatever the locale), or the terminal report. The
    report keeps no control character but rich's styles (a name missed by `printable` still cannot
    drive the terminal), and when stdout is no terminal (a pipe, a file) no line ends in spaces."""
    if as_json:
        emit(_text(result, "json").encode())
        return
    from rich.console import Console              # not imported for JSON: ~35 ms of a cached run
    console = Console(highlight=False)
    with console.capture() as captured:
        render(result, "terminal", console, **terminal_options)
    text = _CONTROL_OR_STYLE.sub(lambda m: m.group(1) or printable(m.group()), captured.get())
    if not console.is_terminal:
        text = "".join(line.rstrip() + "\n" for line in text.splitlines())
    emit(text.encode(sys.stdout.encoding or "utf-8", sys.stdout.errors or "strict"))


def html_page(result: Result) -> str:
    """The result's self-contained HTML page (a file name's bytes that are not UTF-8 as escapes)."""
    return utf8_text(_text(result, "html"))


def check_html_report(path: str) -> None:
    """Whether the HTML report may be written to `path` (checked before the work: a target never
    written to fails at once); if not, one line and exit 2."""
    try:
        check_target(path)
    except OSError as exc:
        _cannot_write_html(path, exc)


def write_html_report(result: Analysis, path: str) -> None:
    """The report's HTML page to `path` (atomically), and one stderr line saying so; if it cannot be
    written, one line and exit 2."""
    try:
        atomic_write_text(path, html_page(result))
    except OSError as exc:
        _cannot_write_html(path, exc)
    click.echo(f"wrote HTML report to {printable(path)}", err=True)


def _cannot_write_html(path: str, exc: OSError) -> None:
    err(f"cannot write the HTML report {path}: {exc.strerror or exc}")
    sys.exit(EXIT_NOTHING)


def _text(result: Result | ThresholdList, fmt: str) -> str:
    """The whole output of `result` in a text format ("json", "html")."""
    out = renderer(type(result), fmt)
    assert isinstance(out, TextRenderer)
    return out.text(result)


def with_progress(run: Callable[[Callable[[int, int, str], None]], R], quiet: bool, label: str) -> R:
    """Call run(on_progress) with a progress bar on stderr (when it is a terminal), then print its
    input problems. A wrong argument is a usage error; an engine that cannot run, or a cache folder
    that is no cache, exits 2 (one line)."""
    with _progress_bar(label, quiet) as progress:
        try:
            result = run(progress)
        except ArgumentError as exc:
            raise click.UsageError(str(exc)) from None
        except (EngineError, NotACache) as exc:
            err(str(exc))
            sys.exit(EXIT_NOTHING)
    print_problems(result.problems)
    return result


@contextlib.contextmanager
def _progress_bar(label: str, quiet: bool) -> Iterator[Callable[[int, int, str], None]]:
    """A progress callback drawing a bar on stderr when it is a terminal (as rich decides: a tty,
    or one of the variables that force it), else one that does nothing (rich not even imported)."""
    if quiet or not (sys.stderr.isatty() or any(os.environ.get(v) for v in _FORCE_TERMINAL)):
        yield lambda done, total, file: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    stderr = Console(stderr=True)
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr, transient=True, disable=not stderr.is_terminal) as bar:
        task = bar.add_task(printable(label), total=None)       # (the label names the inputs: plain text)
        yield lambda done, total, file: bar.update(task, completed=done, total=total)


#: Environment variables with which rich treats a stream as a terminal.
_FORCE_TERMINAL = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def print_problems(problems: Iterable[InputProblem]) -> None:
    """Input problems, one stderr line each (a warning when the file was still used)."""
    for p in problems:
        err(str(p) if p.fatal else f"warning: {p}")


def say_jobs(jobs: list, picked: int | None) -> None:
    """The jobs inputs hold, one stderr line each, after why none was analysed."""
    from rankscope.render.jobs import job_line
    why = (f"--job {picked}: the inputs hold {len(jobs)} job{'s' if len(jobs) != 1 else ''}" if picked else
           f"the inputs hold {len(jobs)} jobs (their files differ in world size, layout or time, and share no "
           f"process): pick one with --job N")
    err(why)
    for j in jobs:
        err(job_line(j))


def no_trace(result: Result) -> str:
    """What the trace commands say when no file was usable."""
    return "no usable trace found" + ("" if result.problems else " (give a folder of *.pt.trace.json[.gz] files)")


def exit_code(result: Result, nothing: str | None = None) -> int:
    """EXIT_NOTHING when nothing was usable (`nothing` then says so on stderr), EXIT_SKIPPED when an
    input was skipped or an analysis's input was partial (its capture quality; one stderr line says
    why), else EXIT_OK."""
    if not result.usable:
        if nothing:
            err(nothing)
        return EXIT_NOTHING
    from rankscope.analyses.job.capture import partial_reason
    capture = result.job.capture if isinstance(result, Analysis) else None
    partial = partial_reason(capture) if capture is not None else None
    if partial:
        err(partial)
    return EXIT_SKIPPED if result.skipped or partial else EXIT_OK

