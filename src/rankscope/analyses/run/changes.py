"""Changes over a run (docs/runs.md "Changes"): when and where a job got slower or faster, judged
against the run's own noise; stragglers that appear or go away; findings that start.

Step time, per rank and for the job (per step, the median over the ranks), is a series over the run's
profiled steps in order. A change at step k compares the steps before and after it, each side at most
`WINDOW_STEPS` long and never across another change:

- noise: the run's own, from how much a rank's step time moves from one profiled step to its next
  (relative to its median step), pooled over all ranks: 1.4826 x the median absolute relative
  difference / sqrt(2) (a robust standard deviation; one jump in a series is one difference of many, so
  a change barely moves it);
- move: the median step after minus the median before; z = move / (noise x level x 1.2533 x
  sqrt(1/n_before + 1/n_after)) (1.2533: the standard error of a median over that of a mean);
- a change: |z| >= the critical z, the move >= `run_change_min_pct` of the step before, both sides at
  least `run_change_min_steps` steps, and it holds: at least 75% of the steps on each side lie on
  their side of the midpoint between the two medians (one slow step is an outlier, not a change);
- the critical z makes a false alarm anywhere in a healthy run about `run_change_false_alarm_pct` %
  likely if steps were independent and normal: a Bonferroni bound over every split of every series;
  benchmarks/bench_runs.py measures the real rate on healthy synthetic runs (docs/runs.md);
- several changes per series: binary segmentation (the strongest change, then each side again).

Cause: the step breakdown category whose median moved most. In a synchronised job every rank's step
moves when one rank slows (the others wait for it in communication), so a change names the ranks
whose own work moved (a category other than communication by at least half the job's move): all of
them (more than half the ranks) -> one change of the job (rank None); a few -> one change per rank;
none -> the job, from the category that moved most in its median breakdown.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from statistics import NormalDist, median
from typing import TYPE_CHECKING, Sequence

from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.results.run import RunChange, RunCycle, TrendPoint

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.thresholds import Thresholds

#: Steps on each side of a split that its test looks at, at most.
WINDOW_STEPS = 8
#: Share of the steps on each side that must lie on their side of the midpoint.
CONSISTENT_SHARE = 0.75
#: The standard error of a median of normal values over that of their mean.
MEDIAN_SE = math.sqrt(math.pi / 2)
#: The noise is never taken below this share of the step (a generator's or a cached run's steps can
#: repeat exactly; a zero noise would make every difference a change).
NOISE_FLOOR = 0.005
#: Where a rank's waits for the other ranks land in the step breakdown: not its own work.
WAIT_CATEGORIES = ("comm_exposed", "comm_overlapped")
#: A cycle's straggler counts for the run when it costs the other ranks this many times the run's noise.
STRAGGLER_NOISES = 2.0
#: Findings whose onset another change already says (the straggler verdict; this module's own).
NOT_AS_FINDING_ONSET = ("straggler_rank", "slowdown_onset")


@dataclass(frozen=True)
class FoundChanges:
    changes: list[RunChange]
    noise_pct: float | None        # the run's step-to-step noise, % of the median step
    z_critical: float


@dataclass(frozen=True)
class _Split:
    series: int | None             # a rank, or None for the job's median
    k: int                         # first index after the change
    lo: int                        # the windows: [lo, k) before, [k, hi) after
    hi: int
    z: float
    before: float
    after: float


def find_changes(trend: list[TrendPoint], cycles: list[RunCycle], finding_costs: list[dict[str, float | None]],
                 t: Thresholds) -> FoundChanges:
    """The run's changes (slowdowns and speedups, straggler onsets and ends, finding onsets), in order
    of their first step. `finding_costs[i]`: cycle i+1's finding ids and what each costs per step."""
    keys = sorted({(p.cycle, p.step) for p in trend})
    at = {key: i for i, key in enumerate(keys)}
    ranks = sorted({p.rank for p in trend})
    series: dict[int, list[tuple[int, float]]] = {r: [] for r in ranks}
    parts: dict[int, dict[int, Sequence[float]]] = {r: {} for r in ranks}
    for p in trend:
        i = at[(p.cycle, p.step)]
        series[p.rank].append((i, p.step_ms))
        parts[p.rank][i] = p.breakdown_ms
    per_step: list[list[float]] = [[] for _ in keys]
    for r in ranks:
        series[r].sort()
        for i, ms in series[r]:
            per_step[i].append(ms)
    job = [(i, median(v)) for i, v in enumerate(per_step) if v]
    noise = _noise([[ms for _, ms in s] for s in series.values()])
    min_steps = max(1, int(t["run_change_min_steps"]))
    tests = (len(ranks) + 1) * max(1, len(keys) - 2 * min_steps + 1)
    alpha = t["run_change_false_alarm_pct"] / 100.0
    z_crit = NormalDist().inv_cdf(1.0 - alpha / (2.0 * tests)) if 0 < alpha < 1 else math.inf
    splits: list[_Split] = []
    if noise is not None:
        for name, s in [(None, job)] + [(r, series[r]) for r in ranks]:
            xs = [ms for _, ms in s]
            idx = [i for i, _ in s]
            for sp in _segment(xs, 0, len(xs), noise, z_crit, t["run_change_min_pct"], min_steps):
                splits.append(_Split(name, idx[sp.k], idx[sp.lo], idx[sp.hi - 1] + 1, sp.z, sp.before, sp.after))
    changes = _attributed(splits, keys, ranks, series, parts, job, noise or 0.0)
    changes += _straggler_changes(cycles, max(t["run_change_min_pct"], STRAGGLER_NOISES * 100.0 * (noise or 0.0)))
    changes += _finding_onsets(cycles, finding_costs)
    kinds = ("slowdown", "speedup", "straggler_onset", "straggler_end", "finding_onset")
    changes.sort(key=lambda c: (c.first_cycle, c.first_step, kinds.index(c.kind), -1 if c.rank is None else c.rank))
    return FoundChanges(changes, round(100.0 * noise, 2) if noise is not None else None, z_crit)


def _noise(series: list[list[float]]) -> float | None:
    """The run's step-to-step noise as a share of the step (see the module's text); None without two
    steps on any rank."""
    rel = []
    for xs in series:
        level = median(xs) if xs else 0.0
        if len(xs) >= 2 and level > 0:
            rel += [abs(b - a) / level for a, b in zip(xs, xs[1:])]
    if not rel:
        return None
    return max(NOISE_FLOOR, 1.4826 * median(rel) / math.sqrt(2.0))


@dataclass(frozen=True)
class _Found:
    k: int
    lo: int
    hi: int
    z: float
    before: float
    after: float


def _segment(xs: list[float], lo: int, hi: int, noise: float, z_crit: float, min_pct: float,
             min_steps: int) -> list[_Found]:
    """The changes in xs[lo:hi]: the strongest split that passes the test, then each side again."""
    best: _Found | None = None
    for k in range(lo + min_steps, hi - min_steps + 1):
        b0, a1 = max(lo, k - WINDOW_STEPS), min(hi, k + WINDOW_STEPS)
        before, after = xs[b0:k], xs[k:a1]
        mb, ma = median(before), median(after)
        if mb <= 0:
            continue
        z = (ma - mb) / (noise * mb * MEDIAN_SE * math.sqrt(1 / len(before) + 1 / len(after)))
        if abs(z) < z_crit or 100.0 * abs(ma - mb) / mb < min_pct or not _holds(before, after, mb, ma):
            continue
        if best is None or abs(z) > abs(best.z):
            best = _Found(k, b0, a1, z, mb, ma)
    if best is None:
        return []
    return (_segment(xs, lo, best.k, noise, z_crit, min_pct, min_steps) + [best]
            + _segment(xs, best.k, hi, noise, z_crit, min_pct, min_steps))


def _holds(before: list[float], after: list[float], mb: float, ma: float) -> bool:
    """At least CONSISTENT_SHARE of each side lies on its side of the midpoint of the two medians."""
    mid, up = (mb + ma) / 2, ma > mb
    below = sum((x < mid) if up else (x > mid) for x in before) / len(before)
    above = sum((x > mid) if up else (x < mid) for x in after) / len(after)
    return below >= CONSISTENT_SHARE and above >= CONSISTENT_SHARE


def _attributed(splits: list[_Split], keys: list[tuple[int, int]], ranks: list[int],
                series: dict[int, list[tuple[int, float]]], parts: dict[int, dict[int, Sequence[float]]],
                job: list[tuple[int, float]], noise: float) -> list[RunChange]:
    """One change per group of splits in one cycle and direction, attributed to the ranks whose own
    work moved (see the module's text)."""
    groups: dict[tuple[int, bool], list[_Split]] = {}
    for sp in sorted(splits, key=lambda s: -abs(s.z)):
        groups.setdefault((keys[sp.k][0], sp.z > 0), []).append(sp)
    out = []
    for (_, up), group in groups.items():
        lead = next((s for s in group if s.series is None), group[0])
        sign = 1.0 if up else -1.0
        job_move = abs(lead.after - lead.before) if lead.series is None else abs(_move(job, lead) or 0.0)
        moved: dict[int, tuple[str, float, float, float]] = {}      # rank -> (category, move, before, after)
        for r in ranks:
            own = _category_moves(parts[r], lead)
            step = _window_medians(series[r], lead)
            if own is None or step is None:
                continue
            cat, mv = max(((c, sign * v) for c, v in own.items() if c not in WAIT_CATEGORIES), key=lambda cv: cv[1])
            if mv >= 0.5 * job_move and mv > 0:
                moved[r] = (cat, mv, *step)
        first_step, first_cycle = keys[lead.k][1], keys[lead.k][0]
        kind = "slowdown" if up else "speedup"
        by_series = {s.series: s for s in group}
        if len(moved) > len(ranks) / 2 or (not moved and None in by_series):
            if moved:
                causes = Counter(c for c, *_ in moved.values())
                cause = max(causes, key=lambda c: (causes[c], sum(m for cc, m, *_ in moved.values() if cc == c)))
            else:
                cause = _job_cause(ranks, parts, lead, sign)
            jb = _window_medians(job, lead) or (lead.before, lead.after)
            z = by_series[None].z if None in by_series else lead.z
            out.append(RunChange(kind, None, first_step, first_cycle, round(jb[0], 3), round(jb[1], 3), cause,
                                 ranks=sorted(moved), z=round(z, 2), noise_ms=round(noise * jb[0], 3)))
            continue
        chosen = moved or {s.series: (_top_category(parts[s.series], s, sign), 0.0, s.before, s.after)
                           for s in group if s.series is not None}
        for r, (cat, _, before, after) in sorted(chosen.items()):
            z = by_series[r].z if r in by_series else lead.z
            out.append(RunChange(kind, r, first_step, first_cycle, round(before, 3), round(after, 3), cat,
                                 ranks=[r], z=round(z, 2), noise_ms=round(noise * before, 3)))
    return out


def _in_window(points: list[tuple[int, float]], sp: _Split) -> tuple[list[float], list[float]]:
    return ([v for i, v in points if sp.lo <= i < sp.k], [v for i, v in points if sp.k <= i < sp.hi])


def _window_medians(points: list[tuple[int, float]], sp: _Split) -> tuple[float, float] | None:
    before, after = _in_window(points, sp)
    return (median(before), median(after)) if before and after else None


def _move(points: list[tuple[int, float]], sp: _Split) -> float | None:
    m = _window_medians(points, sp)
    return m[1] - m[0] if m else None


def _category_moves(rank_parts: dict[int, Sequence[float]], sp: _Split) -> dict[str, float] | None:
    """Per breakdown category, its median after the split minus its median before (ms per step)."""
    before = [v for i, v in rank_parts.items() if sp.lo <= i < sp.k]
    after = [v for i, v in rank_parts.items() if sp.k <= i < sp.hi]
    if not before or not after:
        return None
    return {c: median(a[j] for a in after) - median(b[j] for b in before) for j, c in enumerate(CATEGORIES)}


def _top_category(rank_parts: dict[int, Sequence[float]], sp: _Split, sign: float) -> str:
    moves = _category_moves(rank_parts, sp) or {}
    return max(moves, key=lambda c: sign * moves[c]) if moves else "unknown"


def _job_cause(ranks: list[int], parts: dict[int, dict[int, Sequence[float]]], sp: _Split, sign: float) -> str:
    """The category that moved most in the median over ranks of each category's move."""
    moves = [m for r in ranks if (m := _category_moves(parts[r], sp)) is not None]
    if not moves:
        return "unknown"
    return max(CATEGORIES, key=lambda c: sign * median(m[c] for m in moves))


def _straggler_changes(cycles: list[RunCycle], min_pct: float) -> list[RunChange]:
    """A rank that becomes the cycle's straggler (onset), or stops being it (end), from one cycle to the
    next. A cycle's straggler counts when it costs the others at least `min_pct` % of the cycle's median
    step (the larger of `run_change_min_pct` and STRAGGLER_NOISES times the run's noise): below, a verdict
    that comes and goes with the noise."""
    def costly(c: RunCycle):
        s = c.straggler
        return s if s is not None and c.step_ms_median and 100.0 * s.cost_ms_per_step >= min_pct * c.step_ms_median \
            else None

    out = []
    for prev, cur in zip(cycles, cycles[1:]):
        was, now = costly(prev), costly(cur)
        first = min(cur.steps, default=0)
        if was is not None and (now is None or now.rank != was.rank):
            out.append(RunChange("straggler_end", was.rank, first, cur.cycle, was.cost_ms_per_step, 0.0, was.cause,
                                 ranks=[was.rank]))
        if now is not None and (was is None or was.rank != now.rank):
            out.append(RunChange("straggler_onset", now.rank, first, cur.cycle, 0.0, now.cost_ms_per_step, now.cause,
                                 ranks=[now.rank]))
    return out


def _finding_onsets(cycles: list[RunCycle], costs: list[dict[str, float | None]]) -> list[RunChange]:
    """A finding absent from every cycle before one and raised in that cycle and every later one."""
    out = []
    seen: set[str] = set(cycles[0].findings) if cycles else set()
    for i, cur in enumerate(cycles[1:], start=1):
        for fid in cur.findings:
            if fid in seen or fid in NOT_AS_FINDING_ONSET:
                continue
            if all(fid in later.findings for later in cycles[i:]):
                cost = costs[i].get(fid)
                out.append(RunChange("finding_onset", None, min(cur.steps, default=0), cur.cycle, None,
                                     round(cost, 3) if cost is not None else None, fid, finding=fid))
        seen.update(cur.findings)
    return out
