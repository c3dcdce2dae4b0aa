"""Parsed ranks stored as Parquet, keyed by file content and file identity.

Key = sha256(parser version, file size, mtime_ns, first and last 1 MiB of the file) + "-" + a
hash of the file's identity (inode, ctime_ns). ctime changes whenever the file's content is written
or a file is renamed into its place, and no tool can set it back (`touch -d`, `cp -p`, `rsync -a`
and `tar` set the mtime only), so a file replaced in place with the same size and mtime gets a new
key: never served stale, without reading more than its two ends. `full_hash=True` hashes the whole
file instead of its ends.

A copy of a cached file (same content part, another identity) misses its own key once: it is then
compared byte for byte with the file the entry was parsed from, when that file is still there and
unchanged, and shares the entry (hard links) when they are equal.

The cache is an optimisation and never changes a result: an entry is written to a temporary
folder and renamed into place (a reader never sees half an entry), an unreadable entry is a miss
and is rewritten, and a write that fails (disk full, quota, read-only) is skipped: the caller
goes on with what it parsed and `write_error` says why. Temporary files of a writer that was
killed are removed by a later write beside them once they are `STALE_TEMP_S` old: only those, by
their names (`files.temp_name`), never another hidden entry.

The cache owns only what it made. Its root holds a marker, `CACHEDIR.TAG` (the Cache Directory
Tagging Specification's tag, which backup tools such as `tar --exclude-caches`, borg and restic
skip, with a line naming rankscope); a folder that is neither empty nor marked (nor a cache of an
earlier rankscope version: only two-hex-digit folders of entries) is refused as a root
(`NotACache`), before anything in it is read, written or removed.

What is read is checked. Every file of an entry carries the layout version `CACHE_FORMAT` and a
CRC-32 (ISA-L's: 0.7 ms for the 20 MB of a 200 MB rank's frames here): the metadata and the summaries are sealed (`_seal`: a header with
the format, the checksum of the content part of the key and the bytes, and their length), and the
metadata holds each frame's size and checksum. A file of another format, with a flipped byte, of
another entry (a frame or summary swapped for another rank's) or that is no regular file (a FIFO,
a link to /dev/zero: opened without following a link and without blocking, then checked) is a
miss: the entry is rebuilt, and `damaged` says so in one line per run.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import struct
import time
from pathlib import Path
from typing import Any

import platformdirs
import polars as pl

from rankscope.files import TEMP_PREFIX, atomic_write_bytes, temp_name
from rankscope.ingest.discover import open_regular
from rankscope.model import FRAME_NAMES, HOST_COMM_PATTERN, KERNEL_CLASS_PATTERNS, RankMeta, RankTrace

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib's is 3x slower
    from zlib import crc32

#: Bump when the parser's output changes: old entries are then ignored.
PARSER_VERSION = "7"
#: Bump when the layout of the cached files changes: files of another layout are misses.
CACHE_FORMAT = 1
_EDGE_BYTES = 1 << 20
#: A temporary file or folder this old (seconds since its last change) belongs to a dead writer.
STALE_TEMP_S = 600
_COMPARE_BYTES = 1 << 20
#: The marker of a cache root (see the module's text).
MARKER = "CACHEDIR.TAG"
_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"
_MARKER_TEXT = (_SIGNATURE + b"\n"
                b"# This file is a cache directory tag created by rankscope (parsed traces).\n"
                b"# For information about cache directory tags, see https://bford.info/cachedir/\n")
_META = "meta.bin"
#: The header of a sealed file: magic, CACHE_FORMAT, CRC-32 (content key part + bytes), length of the bytes.
_SEAL = struct.Struct("<8sHIQ")
_MAGIC = b"rkscope\x00"
#: What a cache of an earlier version holds in its root, and in its two-hex-digit folders.
_OLD_ROOT_ENTRY = re.compile(r"[0-9a-f]{2}|demo-job-v\d+(\.tmp\d+)?")
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}-[0-9a-f]{16}")
#: Temporary entries of this cache's writers: `files.temp_name`, and mkdtemp's of earlier versions.
_OWN_TEMP = re.compile(rf"{re.escape(TEMP_PREFIX)}\d+-[0-9a-f]{{8}}-.+|\.[0-9a-f]{{8}}-[a-z0-9_]{{1,16}}")


class NotACache(ValueError):
    """A cache root that rankscope did not make: refused, nothing in it touched (one line)."""


def default_cache_dir() -> Path:
    env = os.environ.get("RANKSCOPE_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("rankscope"))


def content_key(path: str | Path, full_hash: bool = False) -> str:
    with open_regular(path) as f:
        st = os.fstat(f.fileno())
        h = hashlib.sha256()
        # the kernel-class table decides each event's class at parse time: a pattern a user adds
        # (model.register_kernel_pattern) makes a new key
        h.update(f"rankscope-parser-{PARSER_VERSION}|{KERNEL_CLASS_PATTERNS}|{HOST_COMM_PATTERN}|"
                 f"{st.st_size}|{st.st_mtime_ns}|".encode())
        if full_hash or st.st_size <= 2 * _EDGE_BYTES:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        else:
            h.update(f.read(_EDGE_BYTES))
            f.seek(st.st_size - _EDGE_BYTES)
            h.update(f.read(_EDGE_BYTES))
    return f"{h.hexdigest()}-{_identity(st)}"


def _identity(st: os.stat_result) -> str:
    return hashlib.sha256(f"{st.st_ino}|{st.st_ctime_ns}".encode()).hexdigest()[:16]


def _same_bytes(a: str | Path, b: str | Path) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            block = fa.read(_COMPARE_BYTES)
            if block != fb.read(_COMPARE_BYTES):
                return False
            if not block:
                return True


def claim_root(root: str | Path) -> None:
    """Make `root` a cache: marked when missing or empty (or of an earlier version); NotACache when
    it holds anything else. A root that cannot be made or marked (read-only, under a file) is left
    to the writes, which fail and say so."""
    root = Path(root)
    if _marked(root):
        return
    try:
        names = [n for n in os.listdir(root) if not _OWN_TEMP.fullmatch(n)]
    except FileNotFoundError:
        names = []
    except OSError:
        return
    if names and not _earlier_cache(root, names):
        raise NotACache(f"{root} is not a rankscope cache (a folder that is not empty and has no {MARKER} of "
                        "rankscope): nothing in it was touched; give a new or empty folder as the cache")
    try:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(root / MARKER, _MARKER_TEXT)
    except OSError:
        pass


def _marked(root: Path) -> bool:
    data = _read_regular(root / MARKER)
    return data is not None and data.startswith(_SIGNATURE) and b"rankscope" in data


def _earlier_cache(root: Path, names: list[str]) -> bool:
    """Whether `names` (in `root`) are those of a cache of an earlier rankscope version."""
    try:
        return all(_OLD_ROOT_ENTRY.fullmatch(n) and (root / n).is_dir() and not (root / n).is_symlink()
                   and (len(n) > 2 or all(_ENTRY_NAME.fullmatch(e) or _OWN_TEMP.fullmatch(e)
                                          for e in os.listdir(root / n)))
                   for n in names)
    except OSError:
        return False


def _read_regular(path: Path, size: int | None = None) -> bytes | None:
    """The bytes of `path` when it is a regular file (of `size` bytes, when given), else None. Opened
    without following a link at its name and without blocking (a FIFO is never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
            return None
        with open(fd, "rb", closefd=False) as f:
            data = f.read()
        return data if size is None or len(data) == size else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _content(key: str) -> bytes:
    """The content part of a key (a copy of a file shares its entry under another identity)."""
    return key.rpartition("-")[0].encode()


def _seal(key: str, data: bytes) -> bytes:
    return _SEAL.pack(_MAGIC, CACHE_FORMAT, crc32(data, crc32(_content(key))), len(data)) + data


def _unseal(key: str, sealed: bytes | None) -> bytes | None:
    """What `_seal(key, ...)` sealed; None for anything else (damaged, of another format or entry)."""
    if sealed is None or len(sealed) < _SEAL.size:
        return None
    magic, fmt, checksum, size = _SEAL.unpack_from(sealed)
    data = sealed[_SEAL.size:]
    if magic != _MAGIC or fmt != CACHE_FORMAT or size != len(data) or checksum != crc32(data, crc32(_content(key))):
        return None
    return data


def _read_meta(entry: Path) -> tuple[RankMeta, dict] | None:
    """An entry's metadata and its frames' {name: [size, checksum]}: None when there is none,
    _Damaged when it is not sealed for this entry or a frame is missing, of another size or no
    regular file."""
    sealed = _read_regular(entry / _META)
    if sealed is None:
        if os.path.lexists(entry / _META):
            raise _Damaged
        return None
    unsealed = _unseal(entry.name, sealed)
    if unsealed is None:         # not sealed for this entry
        raise _Damaged
    try:
        data = json.loads(unsealed)
        meta, frames = RankMeta.from_dict(data["meta"]), data["frames"]
        sizes = [(os.lstat(entry / f"{name}.parquet"), frames[name][0]) for name in FRAME_NAMES]
    except Exception:            # a field or a frame missing
        raise _Damaged from None
    if not all(stat.S_ISREG(st.st_mode) and st.st_size == size for st, size in sizes):
        raise _Damaged
    return meta, frames


class _Damaged(Exception):
    """A file of an entry is there but unusable: a miss, rebuilt, and said once (`Cache.damaged`)."""


def _why(exc: Exception) -> str:
    """One line for a failed write: the OS's reason (polars reports it at the end of its message)."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    lines = str(exc).strip().splitlines()
    return lines[-1].rsplit("IO error: ", 1)[-1] if lines else type(exc).__name__


class Cache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        #: Why the first write of this object that failed did (one line); None while all succeeded.
        self.write_error: str | None = None
        #: One line when an entry was found damaged (and rebuilt); None while none was.
        self.damaged: str | None = None
        self._owned: bool | None = None

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def _failed(self, exc: Exception) -> None:
        if self.write_error is None:
            self.write_error = f"cannot write the cache at {self.root}: {_why(exc)}"

    def _note_damaged(self) -> None:
        self.damaged = (f"the cache at {self.root} held damaged entries (a checksum, format or file type that "
                        "did not match): they were read again from the traces")

    def owned(self) -> bool:
        """Whether the root is a cache (`claim_root`, asked once): else nothing is read or written
        there, and `write_error` says why."""
        if self._owned is None:
            try:
                claim_root(self.root)
                self._owned = True
            except NotACache as exc:
                self._owned = False
                self.write_error = str(exc)
        return self._owned

    def problem(self) -> str | None:
        """What a run is to say once about this cache: a failed write, or damaged entries."""
        return self.write_error or self.damaged

    def get_meta(self, key: str, file: str) -> RankMeta | None:
        """Only the metadata of a cached rank (no frames read). `file`: where this content lives
        now (a copy of a cached file is checked against it, then shares its entry)."""
        found = self._locate(key, file)
        return found[1] if found else None

    def get(self, key: str, file: str) -> RankTrace | None:
        found = self._locate(key, file)
        if found is None:
            return None
        entry, meta, sums = found
        frames: dict[str, Any] = {}          # by name: RankTrace's frames
        for name in FRAME_NAMES:
            size, checksum = sums[name]
            data = _read_regular(entry / f"{name}.parquet", size)
            if data is None or crc32(data) != checksum:
                self._note_damaged()
                return None
            try:
                frames[name] = pl.read_parquet(io.BytesIO(data))
            except Exception:    # unreadable although its checksum matched (written by another polars)
                self._note_damaged()
                return None
        return RankTrace(meta=meta, **frames)

    def _locate(self, key: str, file: str) -> tuple[Path, RankMeta, dict] | None:
        """The entry that holds `file`'s rank, its metadata (`file` as its name) and its frames'
        sizes and checksums: the key's own, else that of an equal file with the same content part
        (then linked under `key`)."""
        if not self.owned():
            return None
        entry = self._entry(key)
        found = self._meta(entry)
        if found is None:
            adopted = self._adopt(key, file)
            if adopted is None:
                return None
            entry, found = adopted, self._meta(adopted)
        if found is None:
            return None
        found[0].file = file
        return entry, *found

    def _meta(self, entry: Path) -> tuple[RankMeta, dict] | None:
        try:
            return _read_meta(entry)
        except _Damaged:
            self._note_damaged()
            return None

    def _adopt(self, key: str, file: str) -> Path | None:
        content = key.rpartition("-")[0]
        try:
            siblings = [e for e in (self.root / key[:2]).iterdir() if e.name.rpartition("-")[0] == content]
        except OSError:
            return None
        for sibling in siblings:
            found = self._meta(sibling)
            if found is None or os.path.realpath(found[0].file) == os.path.realpath(file):
                continue
            original = found[0].file
            try:
                if (content_key(original) == sibling.name and _same_bytes(original, file)
                        and content_key(original) == sibling.name):       # unchanged while compared
                    return self._link(sibling, key)
            except OSError:
                continue
        return None

    def _link(self, sibling: Path, key: str) -> Path:
        """`sibling`'s files hard-linked as the entry of `key`; `sibling` itself where that fails."""
        entry = self._entry(key)
        tmp = entry.with_name(temp_name(key[:8]))
        try:
            tmp.mkdir()
            for f in sibling.iterdir():
                if not f.name.startswith(TEMP_PREFIX):
                    os.link(f, tmp / f.name)
            if entry.exists():       # damaged, or only blobs
                shutil.rmtree(entry, ignore_errors=True)
            os.replace(tmp, entry)
            return entry
        except OSError as exc:    # no hard links here, or a full disk
            shutil.rmtree(tmp, ignore_errors=True)
            self._failed(exc)
            return sibling

    def get_blob(self, key: str, name: str) -> bytes | None:
        """A small derived result stored beside the frames (e.g. a per-rank summary), as `put_blob`
        was given it; None when there is none, or it is damaged (then said once)."""
        if not self.owned():
            return None
        path = self._entry(key) / name
        sealed = _read_regular(path)
        data = _unseal(key, sealed)
        if data is None and (sealed is not None or os.path.lexists(path)):
            self._note_damaged()
        return data

    def put_blob(self, key: str, name: str, data: bytes) -> None:
        if not self.owned():
            return
        entry = self._entry(key)
        try:
            entry.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(entry / name) and not stat.S_ISREG(os.lstat(entry / name).st_mode):
                _remove_entry(entry / name)          # a FIFO or link in its place: the miss that brought us here
            atomic_write_bytes(entry / name, _seal(key, data))
        except Exception as exc:
            self._failed(exc)

    def put(self, key: str, trace: RankTrace) -> None:
        if not self.owned():
            return
        entry = self._entry(key)
        tmp = entry.with_name(temp_name(key[:8]))
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_temps(entry.parent)
            tmp.mkdir()
            sums = {}
            for name, frame in trace.frames().items():
                path = tmp / f"{name}.parquet"        # in this writer's own new folder
                # uncompressed: 3x faster to read back than lz4, at ~12% of the trace's size on disk
                frame.write_parquet(path, compression="uncompressed", statistics=False)
                sums[name] = _size_and_checksum(path)
            meta = trace.meta.to_dict()
            meta["file"] = os.path.abspath(meta["file"])      # where a copy is compared with
            atomic_write_bytes(tmp / _META, _seal(key, json.dumps({"meta": meta, "frames": sums}).encode()))
            if os.path.lexists(entry):       # a damaged entry (get() missed on it), or only blobs
                _remove_entry(entry)
            try:
                os.replace(tmp, entry)
            except OSError:          # another process wrote the same entry first
                pass
        except Exception as exc:     # disk full, read-only, quota: polars raises its own errors too
            self._failed(exc)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _size_and_checksum(path: Path) -> list[int]:
    """[length, CRC-32] of a file just written, read back in blocks from the page cache (~3 ms for
    the 23 MB of a 208 MB rank's frames). The frames are written by polars to their files (in Rust:
    to a Python file object it was ~15% slower) and never held whole in memory (as a BytesIO, ~17 MB
    more per 208 MB rank: 8 x 200 MB ranks read in two threads peaked ~30 MB higher)."""
    crc = size = 0
    block = bytearray(_CHECKSUM_BLOCK)
    with open(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)), "rb") as f, memoryview(block) as view:
        while n := f.readinto(block):
            crc = crc32(view[:n], crc)
            size += n
    return [size, crc]


_CHECKSUM_BLOCK = 256 << 10        # (1 MB blocks: 3.9 ms per 208 MB rank, these 3.1)


def _remove_entry(entry: Path) -> None:
    """An entry or a file of one: a folder with what it holds, anything else (a link, a FIFO) alone."""
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        try:
            entry.unlink()
        except OSError:
            pass


def _remove_stale_temps(folder: Path) -> None:
    """Remove what killed writers of this cache left in `folder`: its temporary entries (by their
    names: `_OWN_TEMP`) STALE_TEMP_S old. Nothing else, hidden or not, is touched."""
    now = time.time()
    for path in folder.iterdir():
        if not _OWN_TEMP.fullmatch(path.name):
            continue
        try:
            if now - path.lstat().st_mtime <= STALE_TEMP_S:
                continue
        except OSError:
            continue
        _remove_entry(path)
