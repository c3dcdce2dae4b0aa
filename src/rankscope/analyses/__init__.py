"""Pure analysis functions: (RankTrace or summaries, options) -> frames/dataclasses.
No printing, no plotting, no file I/O. One module per question."""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the analysis code and the data model: cached per-rank summaries carry it, so a
    changed analysis never serves an old result."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.glob("*.py")) + [root.parent / "model.py"]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
