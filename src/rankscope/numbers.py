"""Numbers for output, shared by analyses (their one-line texts), findings (evidence) and render."""
from __future__ import annotations

from typing import Sequence


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


#: Characters a list of ranks may take in a line of text.
LIST_WIDTH = 48


def rank_list(ranks: Sequence[int], width: int = LIST_WIDTH) -> str:
    """Ranks in one line: ranges, else one stride, else how many and their first and last."""
    ranks = sorted(set(ranks))
    text = ranges(ranks)
    if len(text) <= width or len(ranks) < 3:
        return text
    step = ranks[1] - ranks[0]
    if step > 1 and all(b - a == step for a, b in zip(ranks, ranks[1:])):
        return f"{ranks[0]}-{ranks[-1]}/{step}"
    head = ranges(ranks[:4])
    return f"{len(ranks):,} ranks: {head}, ... {ranks[-1]}"
