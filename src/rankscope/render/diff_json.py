"""`rankscope diff --json`: the `rankscope.diff/1` object (docs/diff-schema.md).

Every compared metric carries before, after, delta, delta_pct, p_value, ci, significant (and the
sample sizes, t, df). Metric names carry their unit; the step breakdown nests under
`breakdown_ms`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rankscope.analyses.job.diff import (ALPHA, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, Comparison, Diff, NameDiff)

SCHEMA = "rankscope.diff/1"


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def _p(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.4g}")


def comparison_dict(c: Comparison) -> dict[str, Any]:
    return {"before": _r(c.before), "after": _r(c.after), "delta": _r(c.delta), "delta_pct": _r(c.delta_pct, 2),
            "p_value": _p(c.p_value), "ci": None if c.ci is None else [_r(c.ci[0]), _r(c.ci[1])],
            "significant": c.significant, "n_before": c.n_before, "n_after": c.n_after,
            "t": _r(c.t), "df": _r(c.df, 2)}


def metrics_dict(metrics: dict[str, Comparison]) -> dict[str, Any]:
    """{metric: comparison}, the `breakdown_ms.<category>` metrics nested under `breakdown_ms`."""
    out: dict[str, Any] = {}
    for name, c in metrics.items():
        group, _, part = name.partition(".")
        if part:
            out.setdefault(group, {})[part] = comparison_dict(c)
        else:
            out[name] = comparison_dict(c)
    return out


def _names(d: NameDiff) -> dict[str, Any]:
    return {"counts": d.counts, "rows": [_rounded(r) for r in d.rows.to_dicts()]}


def diff_to_dict(d: Diff) -> dict[str, Any]:
    c = d.compared

    def side(i: int) -> dict[str, Any]:
        return {"input": c.labels[i], "ranks": [c.ranks_before, c.ranks_after][i],
                "steps": [c.steps_before, c.steps_after][i], "formats": [c.formats_before, c.formats_after][i]}

    return {
        "schema": SCHEMA,
        "headline": d.headline,
        "settings": {"alpha": ALPHA, "test": "welch_t_two_sided", "ci": "percentile_bootstrap",
                     "ci_level_pct": round(100 * (1 - ALPHA), 6), "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
                     "bootstrap_seed": BOOTSTRAP_SEED},
        "compared": {"before": side(0), "after": side(1), "rank_match": c.rank_match,
                     "rank_pairs": [list(p) for p in c.rank_pairs], "samples": c.samples, "warnings": c.warnings},
        "job": metrics_dict(d.job),
        "ranks": [{"rank_before": r.rank_before, "rank_after": r.rank_after, "steps_before": r.steps_before,
                   "steps_after": r.steps_after, "steps_compared": r.steps_compared,
                   "metrics": metrics_dict(r.metrics)} for r in d.ranks],
        "collectives": metrics_dict(d.collectives),
        "stragglers": {"verdict_before": d.straggler_verdicts[0], "verdict_after": d.straggler_verdicts[1],
                       "changes": [_rounded(dataclasses.asdict(s)) for s in d.stragglers]},
        "findings": None if d.findings is None else [dataclasses.asdict(f) for f in d.findings],
        "kernels": _names(d.kernels),
        "ops": _names(d.ops),
    }


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (_p(v) if k == "p_value" else _r(v)) if isinstance(v, float) else v for k, v in row.items()}
