"""Alpha-beta (latency-bandwidth) model of collectives, fitted from the trace itself.

Fit: for each (collective type, group size) with at least `MIN_SAMPLES` matched collectives of
known size spanning at least `MIN_DISTINCT_SIZES` distinct sizes, ordinary least squares of
    T = alpha + S / beta
on the collectives' transfer times T (min duration across members, docs/concepts.md) against
their nccl-tests size S (bytes, collectives.nccl_tests_bytes). Reported: alpha (µs), beta (GB/s:
the asymptotic algorithm bandwidth), the matching bus bandwidth (beta x nccl-tests factor), R², and
predicted vs actual per distinct size.

Predictor (`LinkModel`, `predict_us`): per-hop latency a (µs) and per-rank link bandwidth B (GB/s,
which is what nccl-tests' busbw measures), n ranks, S bytes. Formulas (Thakur, Rabenseifner & Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 2005; ring bandwidth terms
match nccl-tests doc/PERFORMANCE.md):
    ring all_reduce      2(n-1) a + 2(n-1)/n * S/B
    tree all_reduce      2 ceil(log2 n) a + 2(n-1)/n * S/B   (pipelined double binary tree as in
                         NCCL >= 2.4: logarithmic latency, same bandwidth term as the ring)
    ring all_gather      (n-1) a + (n-1)/n * S/B             (S = total output)
    ring reduce_scatter  (n-1) a + (n-1)/n * S/B             (S = total input)
    all_to_all           (n-1) a + (n-1)/n * S/B             (pairwise exchange, S = total send buffer)
    broadcast / reduce   ceil(log2 n) a + S/B                (pipelined tree: the root's link carries S)
`LinkModel.from_fit` inverts a fit of a ring collective: a = alpha / hops, B = busbw.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from rankscope.analyses.job.matching import CollectiveTable
from rankscope.analyses.rank.collectives import busbw_factor
from rankscope.results.collectives import AlphaBetaFit, AlphaBetaPoint

#: Fewest collectives, and fewest distinct sizes, for a fit: two points define a line, a third is
#: the least that tests it (R²).
MIN_SAMPLES = 5
MIN_DISTINCT_SIZES = 3
FITTED_TYPES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")


def fit_predict_us(fit: AlphaBetaFit, nbytes: float) -> float:
    """The time (µs) the fit predicts for a collective of `nbytes`."""
    slope = 0.0 if not fit.beta_gbps else 1.0 / (fit.beta_gbps * 1e3)   # µs per byte
    return fit.alpha_us + nbytes * slope


def fit_alpha_beta(table: CollectiveTable, min_samples: int = MIN_SAMPLES,
                   min_distinct_sizes: int = MIN_DISTINCT_SIZES) -> list[AlphaBetaFit]:
    c = table.collectives
    if c.is_empty():
        return []
    c = c.filter((pl.col("bytes") > 0) & (pl.col("transfer_ns") > 0) & pl.col("type").is_in(FITTED_TYPES))
    fits = []
    for (ctype, n), grp in c.group_by(["type", "group_size"], maintain_order=True):
        x = grp["bytes"].to_numpy().astype(np.float64)
        y = grp["transfer_ns"].to_numpy().astype(np.float64) / 1e3     # µs
        sizes = np.unique(x)
        if len(x) < min_samples or len(sizes) < min_distinct_sizes:
            continue
        fits.append(_fit(str(ctype), int(n), x, y, sizes))
    fits.sort(key=lambda f: (f.type, f.group_size))
    return fits


def _fit(ctype: str, n: int, x: np.ndarray, y: np.ndarray, sizes: np.ndarray) -> AlphaBetaFit:
    A = np.column_stack([np.ones_like(x), x])
    (alpha, slope), *_ = np.linalg.lstsq(A, y, rcond=None)
    pred = alpha + slope * x
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else None
    beta = float(1.0 / (slope * 1e3)) if slope > 0 else None     # bytes/µs -> GB/s: bytes per ns
    factor = busbw_factor(ctype, n)
    points = [AlphaBetaPoint(bytes=int(s), actual_us=float(np.median(y[x == s])),
                             predicted_us=float(alpha + slope * s), samples=int((x == s).sum())) for s in sizes]
    return AlphaBetaFit(type=ctype, group_size=n, samples=len(x), distinct_sizes=len(sizes), alpha_us=float(alpha),
                        beta_gbps=beta, busbw_gbps=(beta * factor if beta and factor else None), r2=r2, points=points)


# ----------------------------------------------------------------------------------------------
@dataclass
class LinkModel:
    """Per-hop latency (µs) and per-rank link (bus) bandwidth (GB/s)."""
    hop_latency_us: float
    bus_bandwidth_gbps: float

    @classmethod
    def from_fit(cls, fit: AlphaBetaFit, algorithm: str = "ring") -> "LinkModel":
        """Invert a fit: hops of the fitted collective under `algorithm`; B = the fit's busbw."""
        if not fit.busbw_gbps:
            raise ValueError(f"fit of {fit.type} (n={fit.group_size}) has no positive bandwidth")
        hops = _hops(fit.type, algorithm, fit.group_size)
        return cls(max(fit.alpha_us, 0.0) / hops if hops else 0.0, fit.busbw_gbps)

    def predict_us(self, ctype: str, nbytes: float, n: int, algorithm: str = "ring") -> float:
        return predict_us(ctype, nbytes, n, self.hop_latency_us, self.bus_bandwidth_gbps, algorithm)


def _hops(ctype: str, algorithm: str, n: int) -> float:
    log_n = math.ceil(math.log2(n)) if n > 1 else 0
    if ctype == "all_reduce":
        return 2 * log_n if algorithm == "tree" else 2 * (n - 1)
    if ctype in ("all_gather", "reduce_scatter", "all_to_all"):
        return n - 1
    if ctype in ("broadcast", "reduce"):
        return log_n
    raise ValueError(f"no model for collective type {ctype!r}")


def predict_us(ctype: str, nbytes: float, n: int, hop_latency_us: float, bus_bandwidth_gbps: float,
               algorithm: str = "ring") -> float:
    """Predicted time (µs) of a collective of `nbytes` (nccl-tests size S) on `n` ranks (module
    docstring formulas). `algorithm`: "ring" or "tree" (tree: all_reduce only differs)."""
    if algorithm not in ("ring", "tree"):
        raise ValueError(f"algorithm must be 'ring' or 'tree', got {algorithm!r}")
    if n < 2:
        return 0.0
    hops = _hops(ctype, algorithm, n)                 # raises for a type the model does not cover
    factor = busbw_factor(ctype, n)
    assert factor is not None                 # every type `_hops` covers has one
    bw_term_us = factor * nbytes / (bus_bandwidth_gbps * 1e3)   # GB/s = 1e3 bytes/µs
    return hops * hop_latency_us + bw_term_us
