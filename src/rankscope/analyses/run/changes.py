"""Changes over a run (docs/runs.md "Changes"): when and where a job got slower or faster, judged
against the run's own noise; stragglers that appear or go away; findings that start.

Step time, per rank and for the job (per step, the median over the ranks), is a series over the run's
profiled steps in order, taken as logarithms (a change is a ratio; noise on step times is proportional).
A change at step k compares the steps before and after it, each side at most `WINDOW_STEPS` long and
never across another change of the same series:

- noise, the run's own, of two kinds, each pooled over every rank: from one profiled step to the next
  inside a cycle (`noise_pct`; robust: 1.4826 x the median absolute difference / sqrt(2), so one jump in
  a series is one difference of many), and from one cycle's median step to the next cycle's
  (`cycle_noise_pct`: a machine busier in one cycle than the next; the larger of that robust estimate and
  the root mean square, since the ranks of one pair of cycles share its load and few pairs make the
  robust one swing), leaving out the differences across the change being tested and across changes
  already found; with fewer than MIN_CYCLE_PAIRS pairs of cycles left, the step noise alone judges;
- move: the median log step after minus the median before; its standard error is the larger of the
  step noise x 1.2533 x sqrt(1/steps_before + 1/steps_after) (1.2533: a median's standard error over a
  mean's) and the cycle noise x sqrt(1/cycles_before + 1/cycles_after); z = move / standard error;
- a change: |z| >= the critical z, the step moves by >= `run_change_min_pct` %, each side holds at
  least `run_change_min_steps` steps and every step of at least one cycle (a change lasts a cycle), and
  it holds: at least 75% of the steps after it are `run_change_min_pct` % beyond the median before, and
  75% of those before it as far short of the median after (one odd step is an outlier, not a change);
- the critical z makes a false alarm anywhere in a healthy run about `run_change_false_alarm_pct` %
  likely if the noise were independent and normal: a Bonferroni bound over every split of every series;
  benchmarks/bench_runs.py measures the real rate on healthy synthetic runs (docs/runs.md);
- where: among the splits that pass near the strongest, the one that leaves the least absolute deviation
  from the two sides' medians (the change's most likely step); then each side again (binary
  segmentation), so a run may have several changes.

Cause: the step breakdown category whose median moved most. In a synchronised job every rank's step
moves when one rank slows (the others wait for it in communication), so a change names the ranks
whose own work moved (a category other than communication by at least half the series' move) when
they are at most half the ranks and the others' waits explain theirs (together >= 75% of the ranks):
one change per such rank; else one change of the job (rank None), from the category most of the ranks
whose own work moved share, or (none) the one that moved most in the median over the ranks. A rank's
own series that changed without the job's: that rank.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from statistics import NormalDist, median
from typing import TYPE_CHECKING, Literal, Sequence

import numpy as np

from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.analyses.run.cycles import TrendPoint
from rankscope.results.run import RunChange, RunCycle

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.thresholds import Thresholds


#: Steps on each side of a split that its test looks at, at most.
WINDOW_STEPS = 8
#: Share of the steps on each side that must lie the minimum move beyond the other side's median.
CONSISTENT_SHARE = 0.75
#: The standard error of a median of normal values over that of their mean.
MEDIAN_SE = math.sqrt(math.pi / 2)
#: The noise is never taken below this share of the step (a generator's or a cached run's steps can
#: repeat exactly; a zero noise would make every difference a change).
NOISE_FLOOR = 0.005
#: Where a rank's waits for the other ranks land in the step breakdown: not its own work.
WAIT_CATEGORIES = ("comm_exposed", "comm_overlapped")
#: Pairs of consecutive cycles (pooled over the ranks) the cycle noise needs; with fewer, the step noise
#: alone judges a change (ranks of one cycle pair share its machine's load: one pair is one sample).
MIN_CYCLE_PAIRS = 2
#: A single cycle's straggler verdict counts for the run when it costs the others this many times the run's noise.
STRAGGLER_NOISES = 2.0
#: Findings whose onset another change already says (the straggler verdict; this module's own).
NOT_AS_FINDING_ONSET = ("straggler_rank", "slowdown_onset")


@dataclass(frozen=True)
class FoundChanges:
    changes: list[RunChange]
    noise_pct: float | None        # step to step inside a cycle, % of a step (a standard deviation)
    cycle_noise_pct: float | None  # cycle median to the next, % of a step (a standard deviation)
    z_critical: float


@dataclass(frozen=True)
class _Split:
    series: int | None             # a rank, or None for the job's median
    k: int                         # first index (of the run's steps) after the change
    lo: int                        # the windows: [lo, k) before, [k, hi) after
    hi: int
    z: float
    before: float                  # median step, ms
    after: float


class _Noise:
    """The run's noise (log units): step to step inside cycles, and cycle to cycle without the
    differences across given cuts (see the module's text)."""

    def __init__(self, series: dict[int, list[tuple[int, float]]], cycle_of: list[int]):
        within, prev_c, next_c, diffs = [], [], [], []
        for points in series.values():
            medians: dict[int, list[float]] = {}
            for (i, y), (j, y2) in zip(points, points[1:]):
                if cycle_of[i] == cycle_of[j]:
                    within.append(abs(y2 - y))
            for i, y in points:
                medians.setdefault(cycle_of[i], []).append(y)
            cs = sorted(medians)
            for a, b in zip(cs, cs[1:]):
                prev_c.append(a)
                next_c.append(b)
                diffs.append(abs(median(medians[b]) - median(medians[a])))
        self.step = _robust_sd(np.asarray(within)) if within else None
        self._a, self._b, self._d = np.asarray(prev_c), np.asarray(next_c), np.asarray(diffs)
        self._cycle_of = cycle_of

    def cycle(self, cuts: list[int]) -> float | None:
        """Cycle to cycle, without the differences across a cut (a change's first index) of `cuts`."""
        keep = np.ones(len(self._d), dtype=bool)
        for k in cuts:
            c = self._cycle_of[k]
            at_start = k == 0 or self._cycle_of[k - 1] != c
            keep &= ~((self._a < c) & (c <= self._b) if at_start else (self._a <= c) & (c <= self._b))
        pairs = len(set(zip(self._a[keep].tolist(), self._b[keep].tolist())))
        if pairs < MIN_CYCLE_PAIRS:
            return None
        d = self._d[keep]
        return max(_robust_sd(d), math.sqrt(float(np.mean(d * d)) / 2.0))


def _robust_sd(abs_diffs: np.ndarray) -> float:
    """The standard deviation of values whose absolute differences these are (1.4826 x MAD / sqrt 2)."""
    return max(NOISE_FLOOR, 1.4826 * float(np.median(abs_diffs)) / math.sqrt(2.0))


def find_changes(trend: list[TrendPoint], cycles: list[RunCycle], finding_costs: list[dict[str, float | None]],
                 t: Thresholds) -> FoundChanges:
    """The run's changes (slowdowns and speedups, straggler onsets and ends, finding onsets), in order
    of their first step. `finding_costs[i]`: cycle i+1's finding ids and what each costs per step."""
    keys = sorted({(p.cycle, p.step) for p in trend})
    at = {key: i for i, key in enumerate(keys)}
    cycle_of = [c for c, _ in keys]
    ranks = sorted({p.rank for p in trend})
    series: dict[int, list[tuple[int, float]]] = {r: [] for r in ranks}       # (index, log step ms)
    parts: dict[int, dict[int, Sequence[float]]] = {r: {} for r in ranks}
    for p in trend:
        if p.step_ms > 0:
            i = at[(p.cycle, p.step)]
            series[p.rank].append((i, math.log(p.step_ms)))
            parts[p.rank][i] = p.breakdown_ms
    per_step: list[list[float]] = [[] for _ in keys]
    for r in ranks:
        series[r].sort()
        for i, y in series[r]:
            per_step[i].append(y)
    job = [(i, median(v)) for i, v in enumerate(per_step) if v]
    noise = _Noise(series, cycle_of)
    min_steps = max(1, int(t["run_change_min_steps"]))
    tests = (len(ranks) + 1) * max(1, len(keys) - 2 * min_steps + 1)
    alpha = t["run_change_false_alarm_pct"] / 100.0
    z_crit = NormalDist().inv_cdf(1.0 - alpha / (2.0 * tests)) if 0 < alpha < 1 else math.inf
    test = _Test(noise, cycle_of, z_crit, math.log1p(t["run_change_min_pct"] / 100.0), min_steps, Counter(cycle_of))
    splits: list[_Split] = []
    if noise.step is not None:
        for name, s in [(None, job)] + [(r, series[r]) for r in ranks]:
            idx, ys = [i for i, _ in s], [y for _, y in s]
            for f in test.segment(idx, ys, 0, len(ys), []):
                splits.append(_Split(name, idx[f.k], idx[f.lo], idx[f.hi - 1] + 1, f.z, math.exp(f.before),
                                     math.exp(f.after)))
    step_noise = noise.step or 0.0
    changes = _attributed(splits, keys, ranks, series, parts, step_noise)
    cycle_noise = noise.cycle([s.k for s in splits])
    changes += _straggler_changes(cycles, t["run_change_min_pct"], 100.0 * max(step_noise, cycle_noise or 0.0))
    changes += _finding_onsets(cycles, finding_costs)
    kinds = ("slowdown", "speedup", "straggler_onset", "straggler_end", "finding_onset")
    changes.sort(key=lambda c: (c.first_cycle, c.first_step, kinds.index(c.kind), -1 if c.rank is None else c.rank))
    return FoundChanges(changes, _pct(noise.step), _pct(cycle_noise), z_crit)


def _pct(log_sd: float | None) -> float | None:
    return round(100.0 * math.expm1(log_sd), 2) if log_sd is not None else None


@dataclass(frozen=True)
class _Found:
    k: int                          # positions in the series
    lo: int
    hi: int
    z: float
    before: float                   # median log step
    after: float


@dataclass(frozen=True)
class _Test:
    noise: _Noise
    cycle_of: list[int]
    z_crit: float
    min_log_move: float
    min_steps: int
    cycle_size: dict[int, int]      # profiled steps per cycle

    def segment(self, idx: list[int], ys: list[float], lo: int, hi: int, cuts: list[int]) -> list[_Found]:
        """The changes in ys[lo:hi] (`idx`: their indices among the run's steps; `cuts`: changes found
        already): the most likely split near the strongest that passes, then each side again."""
        passing = [f for k in range(lo + self.min_steps, hi - self.min_steps + 1)
                   if (f := self.split(idx, ys, lo, hi, k, cuts)) is not None]
        if not passing:
            return []
        strongest = max(passing, key=lambda f: abs(f.z))
        near = [f for f in passing if (f.z > 0) == (strongest.z > 0) and abs(f.k - strongest.k) <= WINDOW_STEPS]
        a, b = max(lo, min(f.k for f in near) - WINDOW_STEPS), min(hi, max(f.k for f in near) + WINDOW_STEPS)
        best = min(near, key=lambda f: (_deviation(ys[a:f.k]) + _deviation(ys[f.k:b]), f.k))
        cuts = cuts + [idx[best.k]]
        return self.segment(idx, ys, lo, best.k, cuts) + [best] + self.segment(idx, ys, best.k, hi, cuts)

    def split(self, idx: list[int], ys: list[float], lo: int, hi: int, k: int, cuts: list[int]) -> _Found | None:
        """The test of a change at position k of ys[lo:hi] (the module's text); None when it fails."""
        b0, a1 = max(lo, k - WINDOW_STEPS), min(hi, k + WINDOW_STEPS)
        if not (self._whole_cycle(idx, lo, k) and self._whole_cycle(idx, k, hi)):
            return None
        before, after = ys[b0:k], ys[k:a1]
        mb, ma = median(before), median(after)
        move = ma - mb
        if abs(move) < self.min_log_move or not _holds(before, after, mb, ma, self.min_log_move):
            return None
        step_noise = self.noise.step
        assert step_noise is not None             # changes are tested only where the run has step noise
        var = (MEDIAN_SE * step_noise) ** 2 * (1 / len(before) + 1 / len(after))
        cycle = self.noise.cycle(cuts + [idx[k]])
        if cycle is not None:
            c = self.cycle_of
            var = max(var, cycle ** 2 * (1 / (c[idx[k - 1]] - c[idx[b0]] + 1) + 1 / (c[idx[a1 - 1]] - c[idx[k]] + 1)))
        z = move / math.sqrt(var)
        return _Found(k, b0, a1, z, mb, ma) if abs(z) >= self.z_crit else None


    def _whole_cycle(self, idx: list[int], lo: int, hi: int) -> bool:
        """Whether positions [lo, hi) of a series hold every profiled step of some cycle."""
        c, size = self.cycle_of, self.cycle_size
        run_start, n = 0, 0
        for j in range(lo, hi):
            i = idx[j]
            if j == lo or c[i] != c[idx[j - 1]]:
                run_start, n = i, 0
            n += 1
            if n == size[c[i]] and (i - run_start + 1) == n:
                return True
        return False


def _deviation(ys: list[float]) -> float:
    m = median(ys)
    return sum(abs(y - m) for y in ys)


def _holds(before: list[float], after: list[float], mb: float, ma: float, min_move: float) -> bool:
    """At least CONSISTENT_SHARE of the steps after the split lie `min_move` (log) beyond the median before,
    and as many before it `min_move` short of the median after (one odd step does not make a change)."""
    up = 1.0 if ma > mb else -1.0
    beyond = sum(up * (x - mb) >= min_move for x in after) / len(after)
    short = sum(up * (ma - x) >= min_move for x in before) / len(before)
    return beyond >= CONSISTENT_SHARE and short >= CONSISTENT_SHARE


def _attributed(splits: list[_Split], keys: list[tuple[int, int]], ranks: list[int],
                series: dict[int, list[tuple[int, float]]], parts: dict[int, dict[int, Sequence[float]]],
                noise: float) -> list[RunChange]:
    """One change per group of splits in one cycle and direction, attributed to the ranks whose own
    work moved (see the module's text)."""
    groups: dict[tuple[int, bool], list[_Split]] = {}
    for sp in sorted(splits, key=lambda s: -abs(s.z)):
        groups.setdefault((keys[sp.k][0], sp.z > 0), []).append(sp)
    out = []
    for (_, up), group in groups.items():
        by_series = {s.series: s for s in group}
        lead = by_series.get(None, group[0])
        sign = 1.0 if up else -1.0
        moved: dict[int, str] = {}                 # rank -> the category of its own work that moved
        for r in ranks:
            own = _category_moves(parts[r], lead)
            if own is None:
                continue
            cat, mv = max(((c, sign * v) for c, v in own.items() if c not in WAIT_CATEGORIES), key=lambda cv: cv[1])
            if mv > 0 and mv >= 0.5 * abs(lead.after - lead.before):
                moved[r] = cat
        first_step, first_cycle = keys[lead.k][1], keys[lead.k][0]
        kind: Literal["slowdown", "speedup"] = "slowdown" if up else "speedup"
        waiting = {r for r in ranks if r not in moved and _waited(parts[r], lead, sign)}
        if None in by_series and (len(moved) > len(ranks) / 2 or len(moved) + len(waiting) < 0.75 * len(ranks)):
            causes = Counter(moved.values())
            cause = max(causes, key=causes.__getitem__) if moved else _job_cause(ranks, parts, lead, sign)
            out.append(RunChange(kind, None, first_step, first_cycle, round(lead.before, 3), round(lead.after, 3),
                                 cause, ranks=sorted(moved), z=round(lead.z, 2),
                                 noise_ms=round(noise * lead.before, 3)))
            continue
        chosen = moved or {s.series: _top_category(parts[s.series], s, sign) for s in group if s.series is not None}
        for r, cat in sorted(chosen.items()):
            split = by_series.get(r, lead)
            step = _window_medians(series[r], split)
            if step is None:
                continue
            before, after = math.exp(step[0]), math.exp(step[1])
            out.append(RunChange(kind, r, first_step, first_cycle, round(before, 3), round(after, 3), cat,
                                 ranks=[r], z=round(split.z, 2), noise_ms=round(noise * before, 3)))
    return out


def _waited(rank_parts: dict[int, Sequence[float]], sp: _Split, sign: float) -> bool:
    """Whether the rank's waits (WAIT_CATEGORIES) moved by at least half the series' move."""
    moves = _category_moves(rank_parts, sp)
    return moves is not None and sign * sum(moves[c] for c in WAIT_CATEGORIES) >= 0.5 * abs(sp.after - sp.before)


def _window_medians(points: list[tuple[int, float]], sp: _Split) -> tuple[float, float] | None:
    before = [v for i, v in points if sp.lo <= i < sp.k]
    after = [v for i, v in points if sp.k <= i < sp.hi]
    return (median(before), median(after)) if before and after else None


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


def _straggler_changes(cycles: list[RunCycle], min_pct: float, noise_pct: float) -> list[RunChange]:
    """A rank that becomes the cycles' straggler (onset) and stops being it (end). A streak of cycles
    naming one rank their straggler counts when it starts with a cost to the others of at least `min_pct`
    % of the cycle's median step and either lasts two cycles or more or starts with a cost of at least
    STRAGGLER_NOISES times the run's noise (`noise_pct`): a single cycle's verdict below that comes and
    goes with the noise. Its onset is its first cycle (not the run's first), its end the cycle after it."""
    def cost_pct(c: RunCycle) -> float:
        s = c.straggler
        return 100.0 * s.cost_ms_per_step / c.step_ms_median if s is not None and c.step_ms_median else 0.0

    out = []
    i = 0
    while i < len(cycles):
        start = cycles[i].straggler
        if start is None or cost_pct(cycles[i]) < min_pct:
            i += 1
            continue
        j = i + 1
        while j < len(cycles) and (s := cycles[j].straggler) is not None and s.rank == start.rank:
            j += 1
        if j - i >= 2 or cost_pct(cycles[i]) >= max(min_pct, STRAGGLER_NOISES * noise_pct):
            first = cycles[i]
            if i > 0:
                out.append(RunChange("straggler_onset", start.rank, min(first.steps, default=0), first.cycle, 0.0,
                                     start.cost_ms_per_step, start.cause, ranks=[start.rank]))
            if j < len(cycles):
                last, after = cycles[j - 1].straggler, cycles[j]
                assert last is not None           # cycles i .. j - 1 have the straggler
                out.append(RunChange("straggler_end", last.rank, min(after.steps, default=0), after.cycle,
                                     last.cost_ms_per_step, 0.0, last.cause, ranks=[last.rank]))
        i = j
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
