"""Every file rankscope writes goes through here: atomic, regular files only, never through a link.

The content goes to a temporary file in the destination's own folder (same file system, so the
final `os.replace` is a rename), which replaces the destination only once it is fully written. A
failed write (disk full, quota, read-only) removes the temporary file and leaves the previous
file untouched.

What is already at the destination is checked first (`check_target`), without following a
link: only a regular file is replaced. A device, FIFO, socket or folder is refused, and so is a
symbolic link: following it would replace whatever it points to (a link planted in a shared
/tmp would lead to a file of the user's, where the sticky bit protects nothing since the
rename happens in the target's folder), and replacing the link itself would turn the user's
link (or /dev/stdout) into a plain file. The rename replaces a directory entry and never follows
a link, so a link that appears between the check and the rename is replaced, never its target.

Standard output is written the same way it is checked (`write_all`): every byte in as many
write calls as it takes, the failure raised, and when it is a regular file, what was appended
before the failure cut off again (no half JSON on a full disk).

Imports nothing of rankscope: every layer may use it.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

#: Prefix of the temporary files: a leftover (the writer was killed) can be recognised and removed.
TEMP_PREFIX = ".tmp-"

_KINDS = ((stat.S_ISDIR, errno.EISDIR, "is a folder"), (stat.S_ISLNK, errno.ELOOP, "is a symbolic link"),
          (stat.S_ISFIFO, errno.EINVAL, "is a FIFO"), (stat.S_ISSOCK, errno.EINVAL, "is a socket"),
          (stat.S_ISCHR, errno.EINVAL, "is a device"), (stat.S_ISBLK, errno.EINVAL, "is a device"))


class RefusedTarget(OSError):
    """The destination is no regular file (or a link): rankscope does not write there."""


def temp_name(name: str) -> str:
    """A unique hidden name beside `name` for its temporary copy."""
    return f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{name}"


def check_target(path: str | Path) -> os.stat_result | None:
    """What is at `path` (not following a link): None when nothing, its stat when a regular file,
    else RefusedTarget, whose strerror says what is there and that it is left alone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    for is_kind, code, what in _KINDS:
        if is_kind(st.st_mode):
            raise RefusedTarget(code, f"{what}; rankscope writes only regular files and leaves it as it is"
                                + (" (give the path of the file itself)" if code == errno.ELOOP else ""), str(path))
    return st


class AtomicFile:
    """A binary file written under a temporary name beside `path` (`file`), which replaces `path`
    at `commit` (keeping the mode of the file it replaces), or is removed by `abort`. Raises
    RefusedTarget when `path` holds anything but a regular file, OSError when the folder cannot
    be written."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        check_target(self.path)
        self._tmp = self.path.with_name(temp_name(self.path.name))
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
        self.file: BinaryIO = open(fd, "wb", closefd=True)

    def commit(self, fsync: bool = False) -> None:
        """Close the file and rename it into place. Raises OSError (the temporary file removed)."""
        try:
            if fsync:
                self.file.flush()
                os.fsync(self.file.fileno())
            self.file.close()
            previous = check_target(self.path)
            if previous is not None:
                os.chmod(self._tmp, stat.S_IMODE(previous.st_mode))
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        if fsync:
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def abort(self) -> None:
        """Drop the temporary file (also after a `commit` that failed)."""
        try:
            self.file.close()
        except OSError:
            pass
        finally:
            try:
                os.unlink(self._tmp)
            except OSError:
                pass


def atomic_write_bytes(path: str | Path, data: bytes | memoryview, fsync: bool = False) -> None:
    """Write `data` to `path` atomically (`AtomicFile`): a regular file or nothing there before, a
    link never followed; the mode of a replaced file is kept, a new file gets the default mode
    (umask). `fsync`: flush the file and the folder to disk before returning (survives a power
    cut). Raises OSError (RefusedTarget for a target that is no regular file)."""
    out = AtomicFile(path)
    try:
        out.file.write(data)
    except BaseException:
        out.abort()
        raise
    out.commit(fsync=fsync)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8", fsync: bool = False) -> None:
    """`atomic_write_bytes` of `text` encoded."""
    atomic_write_bytes(path, text.encode(encoding), fsync=fsync)


def output_folder(path: str | Path) -> Path:
    """`path` as a folder to write files into: made (with its parents) when missing, RefusedTarget
    when something else is there. A link to a folder is that folder: only the files written into
    it are never written through a link."""
    path = Path(path)
    if path.is_dir():
        return path
    if check_target(path) is not None:
        raise RefusedTarget(errno.ENOTDIR, "is a file, not a folder; rankscope leaves it as it is", str(path))
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_all(fd: int, data: bytes) -> None:
    """Every byte of `data` to the open file `fd` (as many writes as it takes: one call may write
    part of it). Raises OSError on the first failed write; when `fd` is a regular file written at
    its end, what this call appended before the failure is cut off again."""
    try:
        import fcntl                       # POSIX
        st = os.fstat(fd)
        appending = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND
        start = st.st_size if appending else os.lseek(fd, 0, os.SEEK_CUR)
        at_end = stat.S_ISREG(st.st_mode) and start >= st.st_size
    except (OSError, ImportError):     # a pipe or terminal (no offset)
        at_end = False
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        if at_end:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
        raise
