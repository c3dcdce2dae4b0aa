"""Which ranks a per-rank view shows, and lists of ranks and hosts in one line, at any job size.

A per-rank table of a large job shows, in this order: the ranks the report names (stragglers, the
ranks of findings about a few ranks, the critical path's owner and the ranks holding most of it),
then the outliers of the table's own column (farthest from its median), up to `MAX_RANK_ROWS`; the
rest is one line: how many, and their column's min / median / max. In a synchronous job every
rank's step lasts as long as the slowest one's, so "the slowest ranks" would list ranks equal by
construction and miss the one that holds the others back: the named ranks come first.

Lists of ranks and hosts are compressed: ranges (`0-127`), a stride (`0-4088/8`: every 8th), host
names sharing a prefix as `node[000-031]`; a list that still does not fit says how many and its
first and last.
"""
from __future__ import annotations

import re
from statistics import median
from typing import Callable, Sequence

from rankscope.numbers import LIST_WIDTH
from rankscope.numbers import rank_list as rank_list  # re-exported: the renderers take it from here
from rankscope.results import Analysis

#: Rows of a per-rank table; with more ranks, the named ones and the outliers (`pick`).
MAX_RANK_ROWS = 16
#: A finding about at most this many ranks names them (one about more names most of the job).
FEW_RANKS = 8


def named_ranks(a: Analysis) -> list[int]:
    """The ranks the report names, most important first: stragglers, the ranks of findings about a
    few ranks, the critical path's owner and the ranks holding most of the path."""
    out: list[int] = [s.rank for s in a.stragglers]
    for f in a.findings:
        if len(f.ranks) <= FEW_RANKS:
            out += f.ranks
    cp = a.critical_path
    if cp is not None:
        if cp.owner is not None:
            out.append(cp.owner)
        out += [x.rank for x in cp.by_rank_category[:4]]
    present = {s.rank for s in a.ranks}
    return list(dict.fromkeys(r for r in out if r in present))


def pick(ranks: Sequence[int], value: Callable[[int], float | None], named: Sequence[int],
         limit: int = MAX_RANK_ROWS) -> tuple[list[int], list[int]]:
    """(shown, rest): all of `ranks` when they fit in `limit`, else the `named` ones, then those whose
    `value` lies farthest from the median of the values, up to `limit` rows."""
    if len(ranks) <= limit:
        return list(ranks), []
    present = set(ranks)
    shown = [r for r in named if r in present][:limit]
    values = {r: value(r) for r in ranks}
    known = [v for v in values.values() if v is not None]
    mid = median(known) if known else 0.0

    def farthest_first(r: int) -> tuple[float, int]:
        v = values[r]
        return (-abs(v - mid) if v is not None else 0.0, r)

    others = sorted((r for r in ranks if r not in shown), key=farthest_first)
    shown += others[:limit - len(shown)]
    rest = sorted(set(ranks) - set(shown))
    return shown, rest


def rest_line(rest: Sequence[int], value: Callable[[int], float | None], what: str, unit: str = "ms") -> str:
    """One line for the ranks a table leaves out: how many, their `what` min / median / max."""
    vals = sorted(v for v in (value(r) for r in rest) if v is not None)
    if not rest:
        return ""
    figures = (f": {what} min {vals[0]:,.1f} / median {median(vals):,.1f} / max {vals[-1]:,.1f} {unit}"
               if vals else "")
    return f"  {len(rest):,} more{figures} (all in --json)"


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def host_list(hosts: Sequence[str], width: int = LIST_WIDTH) -> str:
    """Host names in one line: those sharing a prefix and a number of one width as `node[000-031]`."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain = []
    for h in sorted(set(hosts)):
        m = _NUMBERED.match(h)
        if m:
            groups.setdefault((m[1], len(m[2])), []).append(int(m[2]))
        else:
            plain.append(h)
    parts = plain + [f"{prefix}[{_padded(nums, w)}]" if len(nums) > 1 else f"{prefix}{nums[0]:0{w}d}"
                     for (prefix, w), nums in sorted(groups.items())]
    text = ", ".join(parts)
    if len(text) <= width:
        return text
    return f"{len(set(hosts)):,} hosts: {', '.join(parts[:2])}, ..."


def _padded(nums: list[int], w: int) -> str:
    return ",".join(f"{a:0{w}d}-{b:0{w}d}" if b > a else f"{a:0{w}d}" for a, b in _runs(nums))


def _runs(nums: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for n in sorted(nums):
        if out and n == out[-1][1] + 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out
