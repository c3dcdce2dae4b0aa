"""Atomic file writes: the new content appears whole under its name, or not at all.

The text goes to a temporary file in the destination's own folder (same file system, so the
final `os.replace` is a rename), which replaces the destination only once it is fully written. A
failed write (disk full, quota, read-only) removes the temporary file and leaves the previous
file untouched. Imports nothing of rankscope: every layer may use it.
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

#: Prefix of the temporary files: a leftover (the writer was killed) can be recognised and removed.
TEMP_PREFIX = ".tmp-"


def temp_name(name: str) -> str:
    """A unique hidden name beside `name` for its temporary copy."""
    return f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{name}"


def atomic_write_bytes(path: str | Path, data: bytes, fsync: bool = False) -> None:
    """Write `data` to `path` atomically. A symlink is followed (its target is replaced); the mode
    of a replaced file is kept, a new file gets the default mode (umask). `fsync`: flush the file
    and the folder to disk before returning (survives a power cut). Raises OSError."""
    target = Path(os.path.realpath(path))
    tmp = target.with_name(temp_name(target.name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, "wb", closefd=True) as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        try:
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        except FileNotFoundError:
            pass
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8", fsync: bool = False) -> None:
    """`atomic_write_bytes` of `text` encoded."""
    atomic_write_bytes(path, text.encode(encoding), fsync=fsync)
