"""Numbers for output, shared by analyses (their one-line texts), findings (evidence) and render."""
from __future__ import annotations


def rounded(x: float | None, digits: int) -> float | None:
    """`x` as a float rounded to `digits` decimals; None stays None."""
    return None if x is None else round(float(x), digits)


def ranges(values: list[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2, 5, 7-8' (sorted input)"""
    if not values:
        return "-"
    out, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if v is not None:
            start = prev = v
    return ", ".join(out)
