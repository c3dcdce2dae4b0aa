"""What a Ctrl-C ends with, wherever it comes: one line `rankscope: interrupted`, exit code 130,
no traceback."""
from __future__ import annotations

import os
import shutil
import sys
from typing import NoReturn

INTERRUPTED_EXIT_CODE = 130


def exit_interrupted() -> NoReturn:
    """Say so in one line and leave at once (os._exit: worker threads still parsing are not
    waited for)."""
    _remove_multiprocessing_temp_dir()
    try:
        sys.stderr.write("rankscope: interrupted\n")
        sys.stderr.flush()
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    os._exit(INTERRUPTED_EXIT_CODE)


def _remove_multiprocessing_temp_dir() -> None:
    """The folder multiprocessing made for the worker processes' server socket (/tmp/pymp-*) is
    removed at a normal exit; os._exit skips that, and each Ctrl-C left one behind."""
    process = sys.modules.get("multiprocessing.process")
    tempdir = process.current_process()._config.get("tempdir") if process else None
    if tempdir:
        shutil.rmtree(tempdir, ignore_errors=True)
