"""Parsed ranks stored as Parquet, keyed by file content.

Key = sha256(parser version, file size, mtime_ns, first and last 1 MiB of the file). Any change
to the file that touches its size, its mtime or its ends changes the key, so a changed file is
never served stale; `full_hash=True` hashes the whole file for paranoid users (slower).
Entries are written to a temporary folder and renamed into place, so a reader never sees half
an entry, and an unreadable entry is treated as a miss and rewritten.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import platformdirs
import polars as pl

from rankscope.model import FRAME_NAMES, RankMeta, RankTrace

#: Bump when the parser's output changes: old entries are then ignored.
PARSER_VERSION = "4"
_EDGE_BYTES = 1 << 20


def default_cache_dir() -> Path:
    env = os.environ.get("RANKSCOPE_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("rankscope"))


def content_key(path: str | Path, full_hash: bool = False) -> str:
    p = Path(path)
    st = p.stat()
    h = hashlib.sha256()
    h.update(f"rankscope-parser-{PARSER_VERSION}|{st.st_size}|{st.st_mtime_ns}|".encode())
    with open(p, "rb") as f:
        if full_hash or st.st_size <= 2 * _EDGE_BYTES:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        else:
            h.update(f.read(_EDGE_BYTES))
            f.seek(st.st_size - _EDGE_BYTES)
            h.update(f.read(_EDGE_BYTES))
    return h.hexdigest()


class Cache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get_meta(self, key: str, file: str) -> RankMeta | None:
        """Only the metadata of a cached rank (no frames read). `file`: where this content lives
        now (the same content may have been cached under another name)."""
        entry = self._entry(key)
        try:
            meta = RankMeta.from_dict(json.loads((entry / "meta.json").read_text()))
        except Exception:    # absent or damaged: a miss, rewritten by put()
            return None
        if not all((entry / f"{name}.parquet").exists() for name in FRAME_NAMES):
            return None
        meta.file = file
        return meta

    def get(self, key: str, file: str) -> RankTrace | None:
        meta = self.get_meta(key, file)
        if meta is None:
            return None
        try:
            frames = {name: pl.read_parquet(self._entry(key) / f"{name}.parquet") for name in FRAME_NAMES}
        except Exception:    # a damaged frame is a miss; it gets rewritten
            return None
        return RankTrace(meta=meta, **frames)

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
            tmp = entry / f".{name}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, entry / name)
        except OSError:
            pass

    def put(self, key: str, trace: RankTrace) -> None:
        entry = self._entry(key)
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
            for name, frame in trace.frames().items():
                # uncompressed: 3x faster to read back than lz4, at ~12% of the trace's size on disk
                frame.write_parquet(tmp / f"{name}.parquet", compression="uncompressed", statistics=False)
            (tmp / "meta.json").write_text(json.dumps(trace.meta.to_dict()))
            if entry.exists():       # a damaged entry (get() missed on it), or only blobs
                shutil.rmtree(entry, ignore_errors=True)
            try:
                os.replace(tmp, entry)
            except OSError:          # another process wrote the same entry first
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass                     # a read-only or full cache never fails the analysis
