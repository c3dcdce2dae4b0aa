"""Command line: `rankscope COMMAND`. One module per subcommand, each a click command named
`command` that parses its arguments, calls one pipeline (through `rankscope.api`), picks a renderer
and sets the exit code; nothing is computed here. What they share (options, progress bar, exit
codes: 0 ok, 1 inputs skipped, 2 nothing usable or bad arguments) is in common.py.
"""
from __future__ import annotations

import errno
import gc
import sys

import click

from rankscope import limits
from rankscope.ingest import reuse
from rankscope.interrupt import exit_interrupted
from rankscope.version import __version__
from rankscope.cli import analyze, calibrate, diff, export, memory, mfu, nccl, synth, thresholds, validate
from rankscope.cli import report, watch


class _Main(click.Group):
    """Ctrl-C in any command: one line `rankscope: interrupted`, exit code 130, no traceback (not
    click's "Aborted!" and exit 1, also while the command line is parsed)."""

    def make_context(self, *args, **kwargs) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            exit_interrupted()

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            pass
        except MemoryError:
            _out_of_memory()
        except OSError as exc:             # e.g. the import of a module whose folder listing cannot be allocated
            if exc.errno == errno.ENOMEM:
                _out_of_memory()
            raise
        except BaseException as exc:       # polars (Rust) panics when it cannot start a thread or allocate
            if type(exc).__name__ == "PanicException" and limits.address_space_limit() is not None:
                _out_of_memory()
            raise
        gc.collect()       # what the interrupted command held, now out of the traceback (process pools' semaphores)
        exit_interrupted()


def _out_of_memory() -> None:
    """Memory ran out outside a rank's own work (a rank's is its one line): one line, exit 2."""
    click.echo(f"rankscope: {limits.exhausted()}", err=True)
    sys.exit(2)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rankscope")
def main() -> None:
    """rankscope: where every millisecond of every step went on every rank."""
    # The objects of the imports (numpy, polars: ~10^5, loaded by the subcommands' module-level
    # `rankscope.api` import) live as long as the process: out of the cyclic collector's sight,
    # its full passes during a parse no longer walk them all.
    gc.freeze()
    reuse.own_process()      # the heap kept between ranks (`rankscope.ingest.reuse`)


for _subcommand in (analyze, validate, synth, thresholds, export, diff, nccl, memory, mfu, calibrate, watch, report):
    main.add_command(_subcommand.command)
