"""Alpha-beta model: fit T = alpha + S / beta per (type, group size), and the predictor (issue 4, item 5).

Expected values: exact lines built in the test, the synthetic generator's network constants
(synth.BUS_BANDWIDTH_GBPS, NCCL_BASE_LATENCY_US, NCCL_HOP_LATENCY_US), and the formulas of the
module docstring computed by hand.
"""
from __future__ import annotations

import math

import pytest

from rankscope.analyses.job.alphabeta import LinkModel, fit_alpha_beta, fit_predict_us, predict_us
from rankscope.results.collectives import AlphaBetaFit
from rankscope.analyses.rank.collectives import RankCollectives, rank_collectives
from rankscope.analyses.job.matching import match_collectives
from rankscope.ingest.kineto import read_kineto
from rankscope.synth import BUS_BANDWIDTH_GBPS, NCCL_BASE_LATENCY_US, NCCL_HOP_LATENCY_US, generate_job


def _ranks_with_times(sizes: list[int], times_ns: list[int], n: int = 4, ctype: str = "all_reduce"):
    """n ranks that each ran the given collectives (same durations on every rank)."""
    out = []
    for r in range(n):
        starts = [i * 10_000_000 for i in range(len(sizes))]
        k = len(sizes)
        out.append(RankCollectives(
            rank=r, source="device", pg=["0"] * k, seq=list(range(k)), type=[ctype] * k, start_ns=starts,
            end_ns=[s + t for s, t in zip(starts, times_ns)], in_bytes=sizes, out_bytes=sizes, group_size=[n] * k,
            dtype=["Float"] * k, step=[0] * k, window_start_ns=starts, pre_ns=[[0] * 8] * k, since_step_ns=[[0] * 8] * k))
    return out


def test_exact_line_is_recovered():
    alpha_us, beta_gbps = 20.0, 50.0                           # T[µs] = 20 + S / (50e3 bytes/µs)
    sizes = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 4 << 20]
    times = [round(1000 * (alpha_us + s / (beta_gbps * 1e3))) for s in sizes]
    (fit,) = fit_alpha_beta(match_collectives(_ranks_with_times(sizes, times)))
    assert (fit.type, fit.group_size, fit.samples, fit.distinct_sizes) == ("all_reduce", 4, 5, 4)
    assert fit.alpha_us == pytest.approx(alpha_us, abs=0.01)
    assert fit.beta_gbps == pytest.approx(beta_gbps, rel=1e-4)
    assert fit.busbw_gbps == pytest.approx(beta_gbps * 2 * 3 / 4, rel=1e-4)    # nccl-tests all_reduce factor
    assert fit.r2 == pytest.approx(1.0)
    for p in fit.points:
        assert p.predicted_us == pytest.approx(p.actual_us, abs=0.01)
    assert fit_predict_us(fit, 8 << 20) == pytest.approx(alpha_us + (8 << 20) / 50e3, rel=1e-4)


def test_not_enough_samples_or_sizes_no_fit():
    sizes = [1 << 20] * 6                                       # one size only
    assert fit_alpha_beta(match_collectives(_ranks_with_times(sizes, [100_000] * 6))) == []
    sizes = [1 << 20, 2 << 20, 4 << 20]                        # three samples < 5
    assert fit_alpha_beta(match_collectives(_ranks_with_times(sizes, [1, 2, 3]))) == []


def test_fit_recovers_the_generator_network(tmp_path):
    """synth.simulation._Network: transfer = latency + S x 2(n-1)/n / BUS_BANDWIDTH_GBPS, latency =
    NCCL_BASE_LATENCY_US + NCCL_HOP_LATENCY_US x log2(n), x lognormal(3 %) noise, + 0-3 µs end jitter.
    The fitted busbw is that bandwidth and alpha that latency, within the noise."""
    n = 8
    generate_job(tmp_path / "job", ranks=n, steps=2, seed=5, gzip=False)
    ranks = [rank_collectives(read_kineto(p)[0]) for p in sorted((tmp_path / "job").glob("rank*.json"))]
    fits = fit_alpha_beta(match_collectives(ranks))
    (fit,) = [f for f in fits if f.type == "all_reduce" and f.group_size == n]
    assert fit.distinct_sizes == 3 and fit.samples == 48
    assert fit.busbw_gbps == pytest.approx(BUS_BANDWIDTH_GBPS, rel=0.1)
    latency_us = NCCL_BASE_LATENCY_US + NCCL_HOP_LATENCY_US * math.log2(n)
    assert fit.alpha_us == pytest.approx(latency_us, abs=15.0)
    assert fit.r2 > 0.95
    link = LinkModel.from_fit(fit)                              # ring all-reduce: 2(n-1) hops
    assert link.bus_bandwidth_gbps == pytest.approx(fit.busbw_gbps)
    assert link.predict_us("all_reduce", 32 << 20, n) == pytest.approx(fit_predict_us(fit, 32 << 20), rel=1e-6)


def test_predictor_formulas_by_hand():
    a, B, n, S = 5.0, 100.0, 8, 1e8                             # µs per hop, GB/s, ranks, bytes
    bw = S / (B * 1e3)                                          # 1000 µs
    assert predict_us("all_reduce", S, n, a, B) == pytest.approx(2 * 7 * a + 2 * 7 / 8 * bw)         # 1820
    assert predict_us("all_reduce", S, n, a, B, "tree") == pytest.approx(2 * 3 * a + 2 * 7 / 8 * bw)  # 1780
    assert predict_us("all_gather", S, n, a, B) == pytest.approx(7 * a + 7 / 8 * bw)
    assert predict_us("reduce_scatter", S, n, a, B) == pytest.approx(7 * a + 7 / 8 * bw)
    assert predict_us("all_to_all", S, n, a, B) == pytest.approx(7 * a + 7 / 8 * bw)
    assert predict_us("broadcast", S, n, a, B) == pytest.approx(3 * a + bw)
    assert predict_us("all_reduce", S, 1, a, B) == 0.0
    with pytest.raises(ValueError):
        predict_us("all_reduce", S, n, a, B, "butterfly")
    with pytest.raises(ValueError):
        predict_us("gather", S, n, a, B)
    # inverting a ring all-reduce fit gives back the link
    fit = AlphaBetaFit("all_reduce", n, 10, 5, alpha_us=2 * 7 * a, beta_gbps=B / (2 * 7 / 8),
                       busbw_gbps=B, r2=1.0)
    link = LinkModel.from_fit(fit)
    assert link.hop_latency_us == pytest.approx(a) and link.bus_bandwidth_gbps == pytest.approx(B)
    assert link.predict_us("all_gather", S, 16) == pytest.approx(15 * a + 15 / 16 * bw)
