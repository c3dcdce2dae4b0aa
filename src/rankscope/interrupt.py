"""What a Ctrl-C ends with, wherever it comes: one line `rankscope: interrupted`, exit code 130,
no traceback."""
from __future__ import annotations

import os
import sys

INTERRUPTED_EXIT_CODE = 130


def exit_interrupted() -> None:
    """Say so in one line and leave at once (os._exit: worker threads still parsing are not
    waited for)."""
    try:
        sys.stderr.write("rankscope: interrupted\n")
        sys.stderr.flush()
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    os._exit(INTERRUPTED_EXIT_CODE)
