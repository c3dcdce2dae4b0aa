"""A/B comparison of two analysed jobs (issue 6): what one change (workers, bucket size,
precision, torch.compile, ...) did to the step and to each part of it, beyond noise.

`diff_analyses(before, after, labels) -> Diff` compares two jobs' analyses (per-rank
summaries, no event frames). Pure: no printing, no file I/O.

What is compared with what (`Compared` says it, with a warning for each mismatch)
  * ranks by rank id: the ranks both sides have. When they share none (two single-rank traces of
    different ranks, e.g. HTA's trace_diff pair), ranks are paired in sorted order.
  * steps by order on each rank pair, up to the shorter side: step i of BEFORE with step i of AFTER.

Metrics with per-step samples, job-wide (the compared steps of every compared rank: steps x
ranks) and per rank pair (its steps):
  step_time_ms              step duration (docs/concepts.md "Step")
  gpu_idle_ms, gpu_idle_pct step duration minus device busy time (union of device activity in the
                            step), and its share of the step; only when both sides have device events
  dataloader_share_pct      DataLoader time / step duration (analyses/rank/dataloader.py)
  breakdown_ms.<category>   the eight parts of docs/concepts.md "Step breakdown"
Collective metrics, when both jobs have matched collectives (samples: every matched collective of
the job, every member for the wait): collective_skew_ms (arrival skew), collective_transfer_ms,
collective_wait_ms (own start -> last arriver's start), collective_busbw_gbps.

Statistics, per metric (`Comparison`)
  before / after: sample means; delta = after - before; delta_pct = 100 delta / before.
  p_value: Welch's unequal-variance t-test, two-sided (B. L. Welch, Biometrika 34, 1947):
      t = (mean_after - mean_before) / sqrt(v_b/n_b + v_a/n_a), sample variances (ddof 1),
      df = (v_b/n_b + v_a/n_a)^2 / ((v_b/n_b)^2/(n_b-1) + (v_a/n_a)^2/(n_a-1)) (Welch-Satterthwaite),
      p = I_{df/(df+t^2)}(df/2, 1/2) (Student-t tail via the regularized incomplete beta function,
      evaluated by its continued fraction: Numerical Recipes 3rd ed. section 6.4).
      No test (None) with fewer than 2 samples on a side; both sides constant: p = 1 if equal, else 0.
  ci: percentile bootstrap interval of mean(after) - mean(before) at level 1 - ALPHA (Efron &
      Tibshirani, An Introduction to the Bootstrap, 1993, ch. 13): each side resampled with
      replacement BOOTSTRAP_RESAMPLES times from a fixed seed, so the output is deterministic.
  significant = p_value < ALPHA and the CI excludes 0.
  Caveat: the steps of one rank, and the ranks of one synchronous step, are not independent; the
  test treats the steps x ranks samples as independent (as issue 6 asks), which overstates the
  evidence when ranks move together: the per-rank rows (steps only) are the conservative reading.

Ops and kernels (after HTA's TraceDiff `compare_traces`): per name, summed over the compared ranks
of each side (`RankSummary.name_totals`: every name, whole trace): calls, total time, time per
call; kernels = every device activity (kernels, memcpy, memset), ops = host ops. Status: added
(only AFTER) | removed (only BEFORE) | slower | faster (time per call, Welch's test over the calls
from their count, sum and sum of squares, p < ALPHA) | same. Sorted by impact: |change of time per
step| (total over the profiled steps of the compared ranks), fair when step counts differ.

Stragglers (docs/concepts.md "Straggler") by rank, findings by (id, ranks) when the analyses carry
`findings`: resolved | introduced | persisting (BEFORE ranks renamed by the pairing).
The headline (`Diff.headline`) is the conclusion a user reads first: the step-time change and the
significant changes that explain it.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import polars as pl

from rankscope.analyses.rank.breakdown import CATEGORIES
from rankscope.units import NS_PER_US, NS_PER_MS
from rankscope.results.diff import (ChangeStatus, ALPHA, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, Compared, Comparison,
                                    Diff, FindingChange, NameDiff, RankDiff, StragglerChange)

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results.rank import NameTotals

#: Elements gathered at once by the bootstrap (memory bound, not a statistical choice).
_BOOTSTRAP_CHUNK = 1 << 22
_BETACF_MAX_ITER = 300
_BETACF_EPS = 1e-15
_TINY = 1e-300

STEP_METRICS = ("step_time_ms", "gpu_idle_ms", "gpu_idle_pct", "dataloader_share_pct",
                *(f"breakdown_ms.{c}" for c in CATEGORIES))
COLLECTIVE_METRICS = ("collective_skew_ms", "collective_transfer_ms", "collective_wait_ms", "collective_busbw_gbps")
NAME_STATUSES = ("added", "removed", "slower", "faster", "same")
#: The per-name diff's columns (one row per op / kernel name).
NAME_COLUMNS = {"name": pl.String, "status": pl.String, "calls_before": pl.Int64, "calls_after": pl.Int64,
                "total_ms_before": pl.Float64, "total_ms_after": pl.Float64, "per_call_us_before": pl.Float64,
                "per_call_us_after": pl.Float64, "per_call_delta_pct": pl.Float64, "ms_per_step_before": pl.Float64,
                "ms_per_step_after": pl.Float64, "impact_ms_per_step": pl.Float64, "p_value": pl.Float64}


# ----------------------------------------------------------------------------------------------
# Statistics
def betainc(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Regularized incomplete beta I_x(a, b), elementwise (a, b > 0, 0 <= x <= 1)."""
    a, b, x = (np.asarray(v, dtype=np.float64) for v in np.broadcast_arrays(a, b, x))
    out = np.where(x <= 0, 0.0, 1.0)
    inner = (x > 0) & (x < 1)
    if not inner.any():
        return out
    a, b, x = a[inner], b[inner], x[inner]
    lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
    front = np.exp(lgamma(a + b) - lgamma(a) - lgamma(b) + a * np.log(x) + b * np.log1p(-x))
    swap = x >= (a + 1) / (a + b + 2)          # the continued fraction converges fast below this point
    cf = _betacf(np.where(swap, b, a), np.where(swap, a, b), np.where(swap, 1 - x, x))
    out[inner] = np.where(swap, 1 - front * cf / b, front * cf / a)
    return out


def _betacf(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Continued fraction of the incomplete beta function (modified Lentz), vectorized."""
    def tiny(v):
        return np.where(np.abs(v) < _TINY, _TINY, v)
    c = np.ones_like(x)
    d = 1 / tiny(1 - (a + b) * x / (a + 1))
    h = d.copy()
    for m in range(1, _BETACF_MAX_ITER + 1):
        for aa in (m * (b - m) * x / ((a - 1 + 2 * m) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1 + 2 * m))):
            d = 1 / tiny(1 + aa * d)
            c = tiny(1 + aa / c)
            step = d * c
            h = h * step
        if np.all(np.abs(step - 1) < _BETACF_EPS):
            break
    return h


def student_t_p_two_sided(t: np.ndarray, df: np.ndarray) -> np.ndarray:
    """P(|T| >= |t|) for Student's t with df degrees of freedom (df may be fractional)."""
    t, df = np.asarray(t, dtype=np.float64), np.asarray(df, dtype=np.float64)
    return betainc(df / 2, np.full_like(df, 0.5), df / (df + t * t))


def welch(n_b, mean_b, var_b, n_a, mean_a, var_a) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Welch's t-test from each side's count, mean and sample variance (arrays, elementwise):
    (t, df, two-sided p), NaN where a side has fewer than 2 samples (see the module docstring)."""
    n_b, mean_b, var_b, n_a, mean_a, var_a = (np.asarray(v, dtype=np.float64)
                                              for v in (n_b, mean_b, var_b, n_a, mean_a, var_a))
    testable = (n_b >= 2) & (n_a >= 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        sb, sa = var_b / n_b, var_a / n_a
        se2 = sb + sa
        delta = mean_a - mean_b
        t = delta / np.sqrt(se2)
        df = se2 * se2 / (sb * sb / (n_b - 1) + sa * sa / (n_a - 1))
    varied = testable & (se2 > 0)
    p = np.full(t.shape, np.nan)
    if varied.any():
        p[varied] = student_t_p_two_sided(t[varied], df[varied])
    constant = testable & (se2 <= 0)
    p[constant] = np.where(delta[constant] == 0, 1.0, 0.0)
    t = np.where(constant, np.where(delta > 0, np.inf, np.where(delta < 0, -np.inf, 0.0)), t)
    return np.where(testable, t, np.nan), np.where(varied, df, np.nan), p


def bootstrap_means(x: np.ndarray, seed: int) -> np.ndarray:
    """(rows, n) samples -> (rows, BOOTSTRAP_RESAMPLES) means of resamples drawn with replacement.
    The resample indices depend only on n and the seed: a row's result never depends on the others.
    Each chunk of resamples becomes a (resamples, n) matrix of how often each sample was drawn, so
    the means of every row are one matrix product."""
    rows, n = x.shape
    rng = np.random.default_rng(seed)
    out = np.empty((rows, BOOTSTRAP_RESAMPLES))
    per = max(1, min(BOOTSTRAP_RESAMPLES, _BOOTSTRAP_CHUNK // n))
    for i in range(0, BOOTSTRAP_RESAMPLES, per):
        m = min(per, BOOTSTRAP_RESAMPLES - i)
        idx = rng.integers(0, n, size=(m, n)) + n * np.arange(m)[:, None]
        counts = np.bincount(idx.ravel(), minlength=m * n).reshape(m, n).astype(np.float64)
        out[:, i:i + m] = x @ counts.T / n
    return out


def bootstrap_ci(before: np.ndarray, after: np.ndarray) -> list[tuple[float, float]]:
    """Per row of (rows, n) samples: the percentile bootstrap CI of mean(after) - mean(before) at
    level 1 - ALPHA, in blocks of rows (memory bound)."""
    block = max(1, _BOOTSTRAP_CHUNK // BOOTSTRAP_RESAMPLES)
    out: list[tuple[float, float]] = []
    for r in range(0, len(before), block):
        diffs = (bootstrap_means(after[r:r + block], BOOTSTRAP_SEED + 1)
                 - bootstrap_means(before[r:r + block], BOOTSTRAP_SEED))
        lo, hi = np.quantile(diffs, [ALPHA / 2, 1 - ALPHA / 2], axis=1)
        out += zip(lo.tolist(), hi.tolist())
    return out


def _opt(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def compare_samples(items: Sequence[tuple[Any, str, np.ndarray, np.ndarray]]) -> dict[Any, Comparison]:
    """Compare many (key, metric, before samples, after samples) at once: Welch's test and the
    bootstrap CI, vectorized over the items that share the sample sizes."""
    groups: dict[tuple[int, int], list] = {}
    for item in items:
        groups.setdefault((len(item[2]), len(item[3])), []).append(item)
    out: dict[Any, Comparison] = {}
    for (nb, na), group in groups.items():
        b = np.array([g[2] for g in group], dtype=np.float64).reshape(len(group), nb)
        a = np.array([g[3] for g in group], dtype=np.float64).reshape(len(group), na)
        if nb == 0 or na == 0:
            mb = b.mean(axis=1) if nb else np.full(len(group), np.nan)
            ma = a.mean(axis=1) if na else np.full(len(group), np.nan)
            ci: Sequence[tuple[float, float] | None] = [None] * len(group)
            t = df = p = np.full(len(group), np.nan)
        else:
            mb, ma = b.mean(axis=1), a.mean(axis=1)
            vb = b.var(axis=1, ddof=1) if nb > 1 else np.zeros(len(group))
            va = a.var(axis=1, ddof=1) if na > 1 else np.zeros(len(group))
            t, df, p = welch(nb, mb, vb, na, ma, va)
            ci = bootstrap_ci(b, a)
        for i, (key, metric, _, _) in enumerate(group):
            out[key] = _comparison(metric, mb[i], ma[i], p[i], ci[i], nb, na, t[i], df[i])
    return out


def _comparison(metric, mb, ma, p, ci, nb, na, t, df) -> Comparison:
    before, after, p = _opt(mb), _opt(ma), _opt(p)
    delta = after - before if before is not None and after is not None else None
    pct = 100.0 * delta / before if delta is not None and before else None
    significant = bool(p is not None and p < ALPHA and ci is not None and (ci[0] > 0 or ci[1] < 0))
    return Comparison(metric, before, after, delta, pct, p, ci, significant, nb, na, _opt(t), _opt(df))


def verdict_text(c: Comparison) -> str:
    """'significant, p<0.001' / 'not significant, p=0.41' / 'not tested: ...'."""
    if c.p_value is None:
        return "not tested: fewer than 2 samples a side"
    p = "p<0.001" if c.p_value < 0.001 else f"p={c.p_value:.3f}"
    return f"{'significant' if c.significant else 'not significant'}, {p}"


def diff_analyses(before, after, labels: tuple[str, str] = ("BEFORE", "AFTER")) -> Diff:
    """Compare two jobs' analyses (`pipelines.job.analyze_job`: their per-rank summaries, cross-rank
    results, matched collectives and findings; module docstring). ValueError when a side has no rank."""
    for side, label in zip((before, after), labels):
        if not side.summaries:
            raise ValueError(f"{label}: no usable rank to compare")
    pairs, rank_match, warnings = _pair_ranks(before.summaries, after.summaries, labels)
    device = all(s.has_device for pair in pairs for s in pair)
    n_steps = [min(len(b.steps), len(a.steps)) for b, a in pairs]
    warnings += _step_warnings(pairs, n_steps, labels)

    items: list[tuple[tuple[int | str, str], str, np.ndarray, np.ndarray]] = []
    job_b: dict[str, list[np.ndarray]] = {}
    job_a: dict[str, list[np.ndarray]] = {}
    for i, ((b, a), n) in enumerate(zip(pairs, n_steps)):
        sb, sa = _step_samples(b, n, device), _step_samples(a, n, device)
        for metric in sb:
            items.append(((i, metric), metric, sb[metric], sa[metric]))
            job_b.setdefault(metric, []).append(sb[metric])
            job_a.setdefault(metric, []).append(sa[metric])
    items += [(("job", m), m, np.concatenate(job_b[m]), np.concatenate(job_a[m])) for m in job_b]
    items += _collective_samples(before, after)
    result = compare_samples(items)

    job = {m: result[("job", m)] for m in STEP_METRICS if ("job", m) in result}
    per_rank = [{m: result[(i, m)] for m in STEP_METRICS if (i, m) in result} for i in range(len(pairs))]
    ranks = [RankDiff(b.rank, a.rank, len(b.steps), len(a.steps), n, metrics,
                      next(iter(largest_moves(metrics, 1)), None))
             for (b, a), n, metrics in zip(pairs, n_steps, per_rank)]
    rename = {b.rank: a.rank for b, a in pairs}
    steps = (sum(len(b.steps) for b, _ in pairs), sum(len(a.steps) for _, a in pairs))
    compared = Compared(
        labels=(labels[0], labels[1]), rank_match=rank_match, rank_pairs=[(b.rank, a.rank) for b, a in pairs],
        ranks_before=[s.rank for s in before.summaries], ranks_after=[s.rank for s in after.summaries],
        steps_before=steps[0], steps_after=steps[1], samples=sum(n_steps),
        formats_before=sorted({s.meta.format for s in before.summaries}),
        formats_after=sorted({s.meta.format for s in after.summaries}), warnings=warnings)
    stragglers = _straggler_changes(before, after, rename)
    totals_b = [b.name_totals for b, _ in pairs if b.name_totals]
    totals_a = [a.name_totals for _, a in pairs if a.name_totals]
    return Diff(
        headline=headline(job, stragglers), compared=compared, job=job, ranks=ranks,
        collectives={m: result[("coll", m)] for m in COLLECTIVE_METRICS if ("coll", m) in result},
        straggler_verdicts=(_verdict(before), _verdict(after)), stragglers=stragglers,
        findings=_finding_changes(before, after, rename),
        kernels=name_diff([t.kernels for t in totals_b], [t.kernels for t in totals_a], steps),
        ops=name_diff([t.ops for t in totals_b], [t.ops for t in totals_a], steps))


def _rank_list(ranks: Sequence[int]) -> str:
    ranks = list(ranks)
    return ", ".join(map(str, ranks[:8])) + (f" ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")


def _pair_ranks(before: list, after: list, labels: tuple[str, str]) -> tuple[list, str, list[str]]:
    b = {s.rank: s for s in before}
    a = {s.rank: s for s in after}
    common = sorted(b.keys() & a.keys())
    if not common:
        n = min(len(b), len(a))
        pairs = [(b[rb], a[ra]) for rb, ra in zip(sorted(b)[:n], sorted(a)[:n])]
        return pairs, "order", [f"no rank id in common ({labels[0]}: {_rank_list(sorted(b))}; {labels[1]}: "
                                f"{_rank_list(sorted(a))}): paired {n} rank(s) in sorted order"]
    warnings = []
    for label, only in ((labels[0], sorted(b.keys() - a.keys())), (labels[1], sorted(a.keys() - b.keys()))):
        if only:
            warnings.append(f"rank(s) only in {label}: {_rank_list(only)}: compared the {len(common)} common ranks")
    return [(b[r], a[r]) for r in common], "rank_id", warnings


def _step_warnings(pairs: list, n_steps: list[int], labels: tuple[str, str]) -> list[str]:
    uneven = [(b, a, n) for (b, a), n in zip(pairs, n_steps) if len(b.steps) != len(a.steps)]
    warnings = []
    if uneven:
        b, a, n = uneven[0]
        warnings.append(f"step counts differ on {len(uneven)} rank pair(s) (e.g. rank {b.rank}: {len(b.steps)} in "
                        f"{labels[0]}, {len(a.steps)} in {labels[1]}): compared steps by order up to the shorter "
                        f"side ({n} there)")
    sources = {s.steps_source for pair in pairs for s in pair}
    if "whole_trace" in sources and len(sources) > 1:
        warnings.append("one side has no ProfilerStep marks (one step = whole trace): its 'step' is not a "
                        "training step")
    return warnings


def _step_samples(s, n: int, device: bool) -> dict[str, np.ndarray]:
    """Per metric of STEP_METRICS, the first n steps' values of one rank."""
    steps = s.steps[:n]
    dur = np.array([x.duration_ms for x in steps], dtype=np.float64)
    loader = dict(zip(s.dataloader.steps.step, s.dataloader.steps.dataloader_ms)) if s.dataloader else {}

    def share(part: np.ndarray) -> np.ndarray:
        return np.divide(100.0 * part, dur, out=np.zeros_like(dur), where=dur > 0)

    out = {"step_time_ms": dur}
    if device:
        idle = np.maximum(dur - np.array([x.device_busy_ms for x in steps], dtype=np.float64), 0.0)
        out["gpu_idle_ms"], out["gpu_idle_pct"] = idle, share(idle)
    out["dataloader_share_pct"] = share(np.array([loader.get(x.step, 0.0) for x in steps], dtype=np.float64))
    for c in CATEGORIES:
        out[f"breakdown_ms.{c}"] = np.array([x.breakdown_ms[c] for x in steps], dtype=np.float64)
    return out


def _collective_samples(before, after) -> list:
    """(key, metric, before, after) items of COLLECTIVE_METRICS when both jobs matched collectives."""
    tables = [a.table for a in (before, after)]
    if any(t is None or t.count == 0 for t in tables):
        return []

    def samples(t) -> dict[str, np.ndarray]:
        c = t.collectives.filter(pl.col("n_ranks") >= 2)
        bw = c["busbw_gbps"].to_numpy().astype(np.float64)
        return {"collective_skew_ms": c["skew_ns"].to_numpy() / NS_PER_MS,
                "collective_transfer_ms": c["transfer_ns"].to_numpy() / NS_PER_MS,
                "collective_wait_ms": t.members["wait_ns"].drop_nulls().to_numpy() / NS_PER_MS,
                "collective_busbw_gbps": bw[np.isfinite(bw)]}
    sb, sa = samples(tables[0]), samples(tables[1])
    return [(("coll", m), m, sb[m], sa[m]) for m in COLLECTIVE_METRICS]


def _verdict(a) -> str | None:
    return a.cross.straggler_verdict if a.cross is not None else None


def _straggler_changes(before, after, rename: dict[int, int]) -> list[StragglerChange]:
    def by_rank(a, ren) -> dict[int, Any]:
        return {ren.get(s.rank, s.rank): s for s in a.cross.stragglers} if a.cross is not None else {}
    b, a = by_rank(before, rename), by_rank(after, {})
    out = []
    for r in sorted(b.keys() | a.keys()):
        sb, sa = b.get(r), a.get(r)
        out.append(StragglerChange(r, _status(sb, sa), getattr(sb, "cause", None), getattr(sa, "cause", None),
                                   getattr(sb, "cost_ms_per_step", None), getattr(sa, "cost_ms_per_step", None)))
    return out


def _status(before: object, after: object) -> ChangeStatus:
    return "persisting" if before is not None and after is not None else ("resolved" if after is None else "introduced")


def _field(obj, name: str):
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _finding_changes(before, after, rename: dict[int, int]) -> list[FindingChange] | None:
    """By (id, ranks); None when neither analysis carries `findings` (no findings engine)."""
    if not hasattr(before, "findings") and not hasattr(after, "findings"):
        return None

    def keyed(a, ren) -> dict[tuple, Any]:
        return {(_field(f, "id"), tuple(sorted(ren.get(r, r) for r in _field(f, "ranks") or ()))): f
                for f in getattr(a, "findings", None) or []}
    b, a = keyed(before, rename), keyed(after, {})
    out = [FindingChange(k[0], list(k[1]), _status(b.get(k), a.get(k)), _field(b.get(k), "severity"),
                         _field(a.get(k), "severity"), _field(a.get(k) or b.get(k), "summary"))
           for k in sorted(b.keys() | a.keys(), key=lambda k: (str(k[0]), k[1]))]
    return sorted(out, key=lambda f: _STATUS_ORDER.index(f.status))


_STATUS_ORDER = ("introduced", "resolved", "persisting")


_TOTALS_SCHEMA = {"name": pl.String, "count": pl.Int64, "total_ns": pl.Int64, "sumsq_ns2": pl.Float64}


def _name_totals(tables: list[NameTotals]) -> pl.DataFrame:
    """The ranks' per-name tables, summed over the ranks (one frame built from all)."""
    columns = {"name": [v for t in tables for v in t.name], "count": [v for t in tables for v in t.count],
               "total_ns": [v for t in tables for v in t.total_ns],
               "sumsq_ns2": [v for t in tables for v in t.sumsq_ns2]}
    return pl.DataFrame(columns, schema=_TOTALS_SCHEMA).group_by("name").agg(
        pl.col("count").sum(), pl.col("total_ns").sum(), pl.col("sumsq_ns2").sum())


def name_diff(before: list[NameTotals], after: list[NameTotals], steps: tuple[int, int]) -> NameDiff:
    """Per-name diff of one table (kernels or ops) of the compared ranks, their tables given (module docstring)."""
    j = _name_totals(before).join(_name_totals(after), on="name", how="full", coalesce=True,
                                  suffix="_a").fill_null(0)
    n_b, n_a = j["count"].to_numpy().astype(np.float64), j["count_a"].to_numpy().astype(np.float64)
    tot_b, tot_a = j["total_ns"].to_numpy().astype(np.float64), j["total_ns_a"].to_numpy().astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_b, mean_a = tot_b / n_b, tot_a / n_a
        var_b = np.maximum(j["sumsq_ns2"].to_numpy() - n_b * mean_b ** 2, 0) / (n_b - 1)
        var_a = np.maximum(j["sumsq_ns2_a"].to_numpy() - n_a * mean_a ** 2, 0) / (n_a - 1)
        _, _, p = welch(n_b, mean_b, var_b, n_a, mean_a, var_a)
        change = 100.0 * (mean_a - mean_b) / mean_b
    sig = p < ALPHA
    status = np.select([n_b == 0, n_a == 0, sig & (mean_a > mean_b), sig & (mean_a < mean_b)],
                       ["added", "removed", "slower", "faster"], "same")
    per_step_b, per_step_a = tot_b / NS_PER_MS / max(steps[0], 1), tot_a / NS_PER_MS / max(steps[1], 1)

    def col(x):
        return pl.Series(np.where(np.isfinite(x), x, np.nan)).fill_nan(None)
    rows = pl.DataFrame({
        "name": j["name"], "status": status, "calls_before": j["count"], "calls_after": j["count_a"],
        "total_ms_before": tot_b / NS_PER_MS, "total_ms_after": tot_a / NS_PER_MS,
        "per_call_us_before": col(mean_b / NS_PER_US), "per_call_us_after": col(mean_a / NS_PER_US),
        "per_call_delta_pct": col(change), "ms_per_step_before": per_step_b, "ms_per_step_after": per_step_a,
        "impact_ms_per_step": per_step_a - per_step_b, "p_value": col(p)}, schema=NAME_COLUMNS)
    rows = rows.sort([pl.col("impact_ms_per_step").abs(), "name"], descending=[True, False])
    return NameDiff(rows, {s: int((status == s).sum()) for s in NAME_STATUSES})


def headline(job: dict[str, Comparison], stragglers: Sequence[StragglerChange] = ()) -> str:
    """The conclusion: step time change and verdict, then the significant changes that explain it
    (DataLoader share and GPU idle first, then the two largest moves of the step breakdown, then
    stragglers introduced or resolved)."""
    st = job["step_time_ms"]
    if st.before is None or st.after is None:
        return "nothing compared: a side has no steps on the compared ranks"
    pct = f"{st.delta_pct:+.1f}%" if st.delta_pct is not None else f"{st.delta:+.1f} ms"
    head = f"step time {pct} ({st.before:.1f} -> {st.after:.1f} ms, {verdict_text(st)})"
    notes = [f"{label} {c.before:.0f}% -> {c.after:.0f}%"
             for key, label in (("dataloader_share_pct", "DataLoader share"), ("gpu_idle_pct", "GPU idle"))
             if (c := job.get(key)) is not None and c.significant]
    said = ("breakdown_ms.dataloader",) if notes and notes[0].startswith("DataLoader") else ()
    notes += [f"{c.metric.split('.', 1)[1]} {c.delta:+.1f} ms/step" for c in largest_moves(job, 2, said)]
    notes += [f"straggler {s.status}: rank {s.rank} ({s.cause_after or s.cause_before})"
              for s in stragglers if s.status != "persisting"]
    if notes:
        return f"{head}: {', '.join(notes)}"
    return head if st.significant else f"{head}; no metric changed significantly"


def largest_moves(metrics: dict[str, Comparison], k: int, skip: Sequence[str] = ()) -> list[Comparison]:
    """The k step-breakdown categories with the largest significant change, largest first."""
    moved = [(c.delta, c) for m, c in metrics.items()
             if m.startswith("breakdown_ms.") and c.significant and m not in skip and c.delta is not None]
    return [c for _, c in sorted(moved, key=lambda dc: -abs(dc[0]))][:k]
