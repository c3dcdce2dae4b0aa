"""Pure analysis functions: (RankTrace or summaries, options) -> msgspec Structs, dataclasses, frames.
No printing, no plotting, no file I/O. One module per question:

  rank/     per-rank analyses (the map over ranks)
  job/      cross-rank analyses (the reduce over the per-rank results)
  inputs/   inputs other than profiler traces (NCCL logs, memory snapshots)
  intervals.py  interval arithmetic shared by all of them
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the analysis code, the typed results and the data model: cached per-rank summaries
    carry it, so a changed analysis never serves an old result."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in (sorted(root.rglob("*.py")) + sorted((root.parent / "results").glob("*.py"))
                 + [root.parent / "model.py"]):
        h.update(str(path.relative_to(root.parent)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
