"""`rankscope diff --json`: the `rankscope.diff/1` object (docs/diff-schema.md).

Every compared metric carries before, after, delta, delta_pct, p_value, ci, significant (and the
sample sizes, t, df). Metric names carry their unit; the step breakdown nests under
`breakdown_ms`.
"""
from __future__ import annotations

from typing import Any

from rankscope.results.diff import ALPHA, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, Comparison, Diff, NameDiff
from rankscope.render.base import JsonRenderer
from rankscope.render.format import rounded
from rankscope.results import DiffResult, to_plain

SCHEMA = "rankscope.diff/1"


def _p(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.4g}")


def comparison_dict(c: Comparison) -> dict[str, Any]:
    return {"before": rounded(c.before, 4), "after": rounded(c.after, 4), "delta": rounded(c.delta, 4),
            "delta_pct": rounded(c.delta_pct, 2),
            "p_value": _p(c.p_value), "ci": None if c.ci is None else [rounded(c.ci[0], 4), rounded(c.ci[1], 4)],
            "significant": c.significant, "n_before": c.n_before, "n_after": c.n_after,
            "t": rounded(c.t, 4), "df": rounded(c.df, 2)}


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


class DiffJson(JsonRenderer):
    """`diff --json`: the `rankscope.diff/1` object."""

    def to_dict(self, result: DiffResult) -> dict[str, Any]:
        # The CLI writes only a usable result, which has a diff.
        assert result.diff is not None
        return diff_to_dict(result.diff)


def diff_to_dict(d: Diff) -> dict[str, Any]:
    """The `rankscope.diff/1` object of a Diff (also what the HTML page lays out)."""
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
                       "changes": [_rounded(to_plain(s)) for s in d.stragglers]},
        "findings": None if d.findings is None else to_plain(d.findings),
        "kernels": _names(d.kernels),
        "ops": _names(d.ops),
    }


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (_p(v) if k == "p_value" else rounded(v, 4)) if isinstance(v, float) else v for k, v in row.items()}
