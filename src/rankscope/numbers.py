"""Numbers for output, shared by findings (evidence) and render (JSON)."""
from __future__ import annotations


def rounded(x: float | None, digits: int) -> float | None:
    """`x` as a float rounded to `digits` decimals; None stays None."""
    return None if x is None else round(float(x), digits)
