"""`analyze --json`: the stable `rankscope.analysis/1` object (DESIGN.md "Output").

Fields that later analyses fill are present now as empty lists / nulls, so consumers can rely
on the shape. Extra fields (marked in docs/json-schema.md) are additions, never changes.
"""
from __future__ import annotations

from typing import Any

import msgspec

from rankscope.analyses.rank.breakdown import CATEGORIES as BREAKDOWN_CATEGORIES
from rankscope.analyses.rank.summary import as_plain, step_time_stats
from rankscope.results import Analysis

SCHEMA = "rankscope.analysis/1"


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _cross(a: Analysis) -> dict:
    """collectives and stragglers (stable), plus the clock alignment, load balance and per-rank
    straggler statistics (extras)."""
    if a.cross is None:
        return {"collectives": {"count": 0, "by_type": [], "alpha_beta": []}, "stragglers": [],
                "straggler_verdict": "no collectives in the trace: nothing to compare across ranks",
                "load_balance": None, "clock": None, "rank_stats": []}
    d = as_plain(a.cross.as_dict())
    return {"collectives": d["collectives"], "stragglers": d["stragglers"],
            "straggler_verdict": d["straggler_verdict"], "load_balance": d["load_balance"],
            "clock": d["clock"], "rank_stats": d["ranks"], "straggler_thresholds": d["thresholds"]}


def _temporal_pct(hta: dict | None) -> dict | None:
    if not hta:
        return None
    t = hta["temporal"]
    return {"compute": t["compute_pct"], "non_compute": t["non_compute_pct"], "idle": t["idle_pct"]}


def _pick(d: dict | None, *keys: str) -> dict | None:
    return None if d is None else {k: d.get(k) for k in keys}


def _rounded(parts: dict[str, float]) -> dict[str, float]:
    return {c: round(parts[c], 3) for c in BREAKDOWN_CATEGORIES}


def analysis_to_dict(a: Analysis) -> dict[str, Any]:
    j = a.job
    ranks = []
    steps = []
    for s in a.ranks:
        st = step_time_stats(s)
        ranks.append({
            "rank": s.rank,
            "file": s.meta.file,
            "rank_source": s.meta.rank_source,
            "format": s.meta.format,
            "events": s.meta.events_total,
            "device_events": s.device_events,
            "step_time_ms": {"mean": _r(st.mean_ms), "median": _r(st.median_ms), "max": _r(st.max_ms)},
            "gpu_busy_pct": _r(st.device_busy_pct, 2),
            "breakdown_ms": _rounded(s.breakdown_mean_ms) if s.steps else None,
            "breakdown_mode": s.breakdown_mode,
            "overlap_efficiency": _r(s.overlap_efficiency, 4),
            "temporal_pct": _temporal_pct(s.hta),
            "overlap_pct": s.hta["overlap"]["overlap_pct"] if s.hta else None,
            "idle_ms": s.hta["idle"]["idle_ms"] if s.hta else None,
            "hta": s.hta,
            "kernels": s.kernels,
            "operators": s.operators,
            "idle_gaps": msgspec.to_builtins(s.gaps) if s.gaps is not None else None,
            "dataloader": _pick(s.dataloader, "share_pct", "mean_step_share_pct", "max_step_share_pct",
                                "dataloader_ms", "num_workers", "multiprocessing", "iterators"),
            "memory": {"devices": s.memory["devices"], "timeline": s.memory.get("timeline")} if s.memory else None,
            "memcpy": _pick(s.memcpy, "pageable", "pageable_htod", "pageable_dtoh", "pinned",
                            "pinned_vs_pageable_bandwidth_ratio", "pageable_pct_of_host_copy_time"),
            "salvaged": s.meta.salvaged,
            "from_cache": s.from_cache,
        })
        for step in s.steps:
            steps.append({"rank": s.rank, "step": step["step"], "duration_ms": _r(step["duration_ms"]),
                          "gpu_busy_ms": _r(step["device_busy_ms"]) if s.has_device else None,
                          "breakdown_ms": _rounded(step["breakdown_ms"])})
    return {
        "schema": SCHEMA,
        "job": {
            "world_size": j.world_size, "ranks": j.ranks, "backend": j.backend, "steps": j.steps,
            "steps_source": j.steps_source, "devices": j.devices, "hosts": j.hosts,
            "span_ms": _r(j.span_ms), "missing_ranks": j.missing_ranks, "warnings": j.warnings,
        },
        "inputs": {
            "skipped": [{"file": p.file, "problem": p.problem} for p in a.problems if p.fatal],
            "warnings": [{"file": p.file, "problem": p.problem} for p in a.problems if not p.fatal],
        },
        "ranks": ranks,
        "steps": steps,
        **_cross(a),
        "findings": [f.as_dict() for f in a.findings],
    }
