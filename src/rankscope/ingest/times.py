"""Event times a reader cannot use, judged the same way for every format (the Kineto reader and the
Nsight Systems reader): each event gets the first reason that applies (TIME_REASONS, code i + 1;
0 = usable), the reader drops the events with one and reports how many per reason.

The order is the order of the checks: the start (absent, not a number, out of range), then the
duration (absent, not a number, negative, over a day), then, once the other events' values are
known, a start over a day away from the largest run of the others. "Absent" (no ts / no dur, codes
7 and 8: added last, checked first) is for a format whose events may lack the field (Kineto's
JSON); a reader without that distinction (the Nsight reader's NULL cells) passes none and its
missing values are "not a number"."""
from __future__ import annotations

from typing import Iterable

import numpy as np

#: The longest plausible duration of an event, and gap between a file's events; beyond: dropped.
MAX_DUR_NS = 86_400 * 10**9
#: |ts| from this on (146 years from the clock's zero) is no profiler time: dropped.
MAX_TS_NS = 2**62
#: Why an event's times are unusable (code i + 1), in the order checked (the span of the other
#: events is known once their values are), a missing ts or dur (codes 7, 8) first.
TIME_REASONS = ("ts not a number", "ts out of range", "dur not a number", "dur negative", "dur over 1 day",
                "ts over 1 day away from the other events", "no ts", "no dur")
NO_TS, NO_DUR = TIME_REASONS.index("no ts") + 1, TIME_REASONS.index("no dur") + 1


def start_reasons(ts: np.ndarray, not_a_number: np.ndarray, absent: np.ndarray | None = None) -> np.ndarray:
    """The reason codes of events whose start `ts` (ns) is absent (`absent`, when the format tells),
    not a number (`not_a_number`) or out of range; 0 for the others."""
    reasons = np.zeros(len(ts), np.uint8)
    if absent is not None:
        mark(reasons, absent, NO_TS)
    mark(reasons, not_a_number, 1)
    mark(reasons, out_of_range(ts), 2)
    return reasons


def out_of_range(ts: np.ndarray) -> np.ndarray:
    """Where a time (ns) is no profiler time."""
    return (ts >= MAX_TS_NS) | (ts <= -MAX_TS_NS)


def mark_durations(reasons: np.ndarray, dur: np.ndarray, not_a_number: np.ndarray,
                   absent: np.ndarray | None = None) -> None:
    """Give the events without a reason yet the reason of their duration `dur` (ns), if any: absent
    (`absent`, when the format tells), not a number (`not_a_number`), negative, over a day."""
    if absent is not None:
        mark(reasons, absent, NO_DUR)
    mark(reasons, not_a_number, 3)
    mark(reasons, dur < 0, 4)
    mark(reasons, dur > MAX_DUR_NS, 5)


def mark_far_from_the_others(starts: list[np.ndarray], reasons: list[np.ndarray]) -> None:
    """Over groups of events (`starts[i]` and their `reasons[i]`, judged together): when the usable
    starts span over a day, those outside the largest run without a day's gap get the last reason."""
    usable = [r == 0 if r.any() else None for r in reasons]       # None: all
    far, near = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    ends = [(int(ts.min()), int(ts.max())) if u is None    # (no copy of the starts)
            else (int(ts.min(where=u, initial=far)), int(ts.max(where=u, initial=near)))
            for ts, u in zip(starts, usable) if len(ts) and (u is None or u.any())]
    if ends and max(b for _, b in ends) - min(a for a, _ in ends) > MAX_DUR_NS:
        lo, hi = main_run(np.concatenate([ts if u is None else ts[u] for ts, u in zip(starts, usable)]))
        for ts, r in zip(starts, reasons):
            mark(r, (ts < lo) | (ts > hi), 6)


def reason_counts(reasons: Iterable[np.ndarray]) -> dict[str, int]:
    """How many events have each reason (the reasons with none left out), over every group."""
    counts = np.zeros(len(TIME_REASONS) + 1, np.int64)
    for r in reasons:
        if r.any():
            counts += np.bincount(r, minlength=len(counts))
    return {reason: int(n) for reason, n in zip(TIME_REASONS, counts[1:]) if n}


def mark(reasons: np.ndarray, where: np.ndarray, code: int) -> None:
    """Give `code` to the rows where `where` holds that have no reason yet."""
    if where.any():
        reasons[(reasons == 0) & where] = code


def main_run(ts: np.ndarray) -> tuple[int, int]:
    """First and last time of the largest run of sorted `ts` without a gap over MAX_DUR_NS."""
    s = np.sort(ts)
    cuts = np.flatnonzero(np.diff(s) > MAX_DUR_NS) + 1
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(s)]
    i = int(np.argmax(ends - starts))
    return int(s[starts[i]]), int(s[ends[i] - 1])
