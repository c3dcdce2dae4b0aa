"""`rankscope ...` and `python -m rankscope ...`: the command line.

Importing the commands (numpy, polars) takes most of a second; a Ctrl-C in that time ends as one
during a command does (`rankscope.interrupt`)."""
from __future__ import annotations

import os
import sys

from rankscope import limits, prefork
from rankscope.interrupt import exit_interrupted


def run() -> None:
    # under an address-space limit (ulimit -v), reserve fewer addresses: before polars and numpy
    # start their allocators and threads (`rankscope.limits`)
    limits.bound_memory()
    # numpy's OpenBLAS starts a thread per core that spins ~0.1 s of CPU after it starts; the
    # analyses multiply no matrix large enough to need more than one (before numpy is imported;
    # a value the user set is kept)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # the local engine's worker process: forked now, while this process has one thread and has
    # not imported polars (`rankscope.prefork`)
    prefork.start(sys.argv[1:])
    try:
        from rankscope.cli import main
    except KeyboardInterrupt:
        exit_interrupted()
    main()


if __name__ == "__main__":
    run()
