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
killed are removed by a later write beside them once they are `STALE_TEMP_S` old.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import platformdirs
import polars as pl

from rankscope.files import TEMP_PREFIX, atomic_write_bytes, temp_name
from rankscope.ingest.discover import open_regular
from rankscope.model import FRAME_NAMES, HOST_COMM_PATTERN, KERNEL_CLASS_PATTERNS, RankMeta, RankTrace

#: Bump when the parser's output changes: old entries are then ignored.
PARSER_VERSION = "7"
_EDGE_BYTES = 1 << 20
#: A temporary file or folder this old (seconds since its last change) belongs to a dead writer.
STALE_TEMP_S = 600
_COMPARE_BYTES = 1 << 20


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


def _read_meta(entry: Path) -> RankMeta | None:
    try:
        meta = RankMeta.from_dict(json.loads((entry / "meta.json").read_text()))
    except Exception:    # absent or damaged: a miss, rewritten by put()
        return None
    return meta if all((entry / f"{name}.parquet").exists() for name in FRAME_NAMES) else None


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

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def _failed(self, exc: Exception) -> None:
        if self.write_error is None:
            self.write_error = f"cannot write the cache at {self.root}: {_why(exc)}"

    def get_meta(self, key: str, file: str) -> RankMeta | None:
        """Only the metadata of a cached rank (no frames read). `file`: where this content lives
        now (a copy of a cached file is checked against it, then shares its entry)."""
        found = self._locate(key, file)
        return found[1] if found else None

    def get(self, key: str, file: str) -> RankTrace | None:
        found = self._locate(key, file)
        if found is None:
            return None
        entry, meta = found
        try:
            frames = {name: pl.read_parquet(entry / f"{name}.parquet") for name in FRAME_NAMES}
        except Exception:    # a damaged frame is a miss; it gets rewritten
            return None
        return RankTrace(meta=meta, **frames)

    def _locate(self, key: str, file: str) -> tuple[Path, RankMeta] | None:
        """The entry that holds `file`'s rank and its metadata (`file` as its name): the key's own,
        else that of an equal file with the same content part (then linked under `key`)."""
        entry = self._entry(key)
        meta = _read_meta(entry)
        if meta is None:
            entry = self._adopt(key, file)
            meta = _read_meta(entry) if entry else None
        if meta is None:
            return None
        meta.file = file
        return entry, meta

    def _adopt(self, key: str, file: str) -> Path | None:
        content = key.rpartition("-")[0]
        try:
            siblings = [e for e in (self.root / key[:2]).iterdir() if e.name.rpartition("-")[0] == content]
        except OSError:
            return None
        for sibling in siblings:
            meta = _read_meta(sibling)
            if meta is None or os.path.realpath(meta.file) == os.path.realpath(file):
                continue
            try:
                if (content_key(meta.file) == sibling.name and _same_bytes(meta.file, file)
                        and content_key(meta.file) == sibling.name):       # unchanged while compared
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
        """A small derived result stored beside the frames (e.g. a per-rank summary)."""
        try:
            return (self._entry(key) / name).read_bytes()
        except OSError:
            return None

    def put_blob(self, key: str, name: str, data: bytes) -> None:
        entry = self._entry(key)
        try:
            entry.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(entry / name, data)
        except Exception as exc:
            self._failed(exc)

    def put(self, key: str, trace: RankTrace) -> None:
        entry = self._entry(key)
        tmp = entry.with_name(temp_name(key[:8]))
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_temps(entry.parent)
            tmp.mkdir()
            for name, frame in trace.frames().items():
                # uncompressed: 3x faster to read back than lz4, at ~12% of the trace's size on disk
                frame.write_parquet(tmp / f"{name}.parquet", compression="uncompressed", statistics=False)
            meta = trace.meta.to_dict()
            meta["file"] = os.path.abspath(meta["file"])      # where a copy is compared with
            (tmp / "meta.json").write_text(json.dumps(meta))
            if entry.exists():       # a damaged entry (get() missed on it), or only blobs
                shutil.rmtree(entry, ignore_errors=True)
            try:
                os.replace(tmp, entry)
            except OSError:          # another process wrote the same entry first
                pass
        except Exception as exc:     # disk full, read-only, quota: polars raises its own errors too
            self._failed(exc)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale_temps(folder: Path) -> None:
    """Remove what killed writers left in `folder`: hidden (temporary) entries STALE_TEMP_S old."""
    now = time.time()
    for path in folder.glob(".*"):
        try:
            if now - path.lstat().st_mtime <= STALE_TEMP_S:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            pass
