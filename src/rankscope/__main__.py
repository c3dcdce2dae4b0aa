"""`rankscope ...` and `python -m rankscope ...`: the command line.

Importing the commands (numpy, polars) takes most of a second; a Ctrl-C in that time ends as one
during a command does (`rankscope.interrupt`)."""
from __future__ import annotations

from rankscope.interrupt import exit_interrupted


def run() -> None:
    try:
        from rankscope.cli import main
    except KeyboardInterrupt:
        exit_interrupted()
    main()


if __name__ == "__main__":
    run()
