"""`analyze --json`: the stable `rankscope.analysis/1` object (docs/json-schema.md).

Fields that later analyses fill are present now as empty lists / nulls, so consumers can rely
on the shape. Extra fields (marked in docs/json-schema.md) are additions, never changes.
"""
from __future__ import annotations

from typing import Any

from rankscope.analyses.rank.breakdown import CATEGORIES as BREAKDOWN_CATEGORIES
from rankscope.results.rank import DataLoaderShare
from rankscope.results.rank import MemcpyReport
from rankscope.results.rank import HtaParity
from rankscope.render.base import JsonRenderer
from rankscope.render.format import rounded
from rankscope.render.run_json import run_to_dict
from rankscope.results import Analysis, to_plain

SCHEMA = "rankscope.analysis/1"


def _cross(d: dict | None) -> dict:
    """collectives and stragglers (stable), plus the clock alignment, load balance, per-rank
    straggler statistics, parallel layout and critical path (extras), from the cross-rank result's
    plain data (None: no cross-rank result)."""
    if d is None:
        return {"collectives": {"count": 0, "by_type": [], "alpha_beta": []}, "stragglers": [],
                "straggler_verdict": "no collectives in the trace: nothing to compare across ranks",
                "load_balance": None, "clock": None, "rank_stats": [],
                "parallelism": {"layout": "", "dims": []}, "pipeline": None, "experts": None, "critical_path": None,
                "median_step_ms": None}
    return {"collectives": d["collectives"], "stragglers": d["stragglers"],
            "straggler_verdict": d["straggler_verdict"], "load_balance": d["load_balance"],
            "clock": d["clock"], "rank_stats": d["ranks"], "straggler_thresholds": d["thresholds"],
            "parallelism": d["parallelism"], "pipeline": d["pipeline"], "experts": d["experts"],
            "critical_path": d["critical_path"], "median_step_ms": d["median_step_ms"]}


def _temporal_pct(hta: HtaParity | None) -> dict | None:
    if not hta:
        return None
    t = hta.temporal
    return {"compute": t.compute_pct, "non_compute": t.non_compute_pct, "idle": t.idle_pct}


def _dataloader(d: DataLoaderShare | None) -> dict | None:
    if d is None:
        return None
    return {"share_pct": d.share_pct, "mean_step_share_pct": d.mean_step_share_pct,
            "max_step_share_pct": d.max_step_share_pct, "dataloader_ms": d.dataloader_ms,
            "num_workers": d.num_workers, "multiprocessing": d.multiprocessing, "iterators": d.iterators}


def _memcpy(m: MemcpyReport | None) -> dict | None:
    if m is None:
        return None
    return {"pageable": to_plain(m.pageable), "pageable_htod": to_plain(m.pageable_htod),
            "pageable_dtoh": to_plain(m.pageable_dtoh), "pinned": to_plain(m.pinned),
            "pinned_vs_pageable_bandwidth_ratio": m.pinned_vs_pageable_bandwidth_ratio,
            "pageable_pct_of_host_copy_time": m.pageable_pct_of_host_copy_time}


def _rounded(parts: dict[str, float]) -> dict[str, float]:
    return {c: round(parts[c], 3) for c in BREAKDOWN_CATEGORIES}


class AnalysisJson(JsonRenderer):
    """`analyze --json`: the `rankscope.analysis/1` object."""

    def to_dict(self, result: Analysis) -> dict[str, Any]:
        return analysis_to_dict(result)


def analysis_to_dict(a: Analysis) -> dict[str, Any]:
    """The `rankscope.analysis/1` object of an Analysis (also what the HTML report lays out)."""
    j = a.job
    cross = to_plain(a.cross.as_dict()) if a.cross is not None else None
    comm_by_dim = cross["comm_by_dim_ms"] if cross else {}           # rank (a string key) -> dimensions
    ranks = []
    steps = []
    for s in a.ranks:
        st = s.step_time
        ranks.append({
            "rank": s.rank,
            "file": s.meta.file,
            "rank_source": s.meta.rank_source,
            "format": s.meta.format,
            "events": s.meta.events_total,
            "device_events": s.device_events,
            "step_time_ms": {"mean": rounded(st.mean_ms, 3), "median": rounded(st.median_ms, 3),
                             "max": rounded(st.max_ms, 3)},
            "gpu_busy_pct": rounded(st.device_busy_pct, 2),
            "breakdown_ms": _rounded(s.breakdown_mean_ms) if s.steps else None,
            "breakdown_mode": s.breakdown_mode,
            "comm_by_dim_ms": comm_by_dim.get(str(s.rank)),
            "overlap_efficiency": rounded(s.overlap_efficiency, 4),
            "temporal_pct": _temporal_pct(s.hta),
            "overlap_pct": s.hta.overlap.overlap_pct if s.hta else None,
            "idle_ms": s.hta.idle.idle_ms if s.hta else None,
            "idle_ms_summed_over_streams": s.hta.idle.idle_ms if s.hta else None,
            "idle_streams": len(s.hta.idle.streams) if s.hta else None,
            "hta": to_plain(s.hta),
            "kernels": to_plain(s.kernels),
            "operators": to_plain(s.operators),
            "idle_gaps": to_plain(s.gaps),
            "dataloader": _dataloader(s.dataloader),
            "memory": ({"devices": to_plain(s.memory.devices), "timeline": to_plain(s.memory.timeline)}
                       if s.memory else None),
            "memcpy": _memcpy(s.memcpy),
            "salvaged": s.meta.salvaged,
            "from_cache": s.from_cache,
        })
        for step in s.steps:
            steps.append({"rank": s.rank, "step": step.step, "duration_ms": rounded(step.duration_ms, 3),
                          "gpu_busy_ms": rounded(step.device_busy_ms, 3) if s.has_device else None,
                          "breakdown_ms": _rounded(step.breakdown_ms)})
    return {
        "schema": SCHEMA,
        "job": {
            "world_size": j.world_size, "ranks": j.ranks, "backend": j.backend, "steps": j.steps,
            "steps_source": j.steps_source, "devices": j.devices, "hosts": j.hosts,
            "span_ms": rounded(j.span_ms, 3), "missing_ranks": j.missing_ranks, "warnings": j.warnings,
            "capture": {**to_plain(j.capture), "headline": j.capture.headline} if j.capture else None,
        },
        "inputs": {
            "skipped": [{"file": p.file, "problem": p.problem} for p in a.problems if p.fatal],
            "warnings": [{"file": p.file, "problem": p.problem} for p in a.problems if not p.fatal],
        },
        "ranks": ranks,
        "steps": steps,
        **_cross(cross),
        "hang": to_plain(a.hang) if a.hang is not None else None,
        "findings": [f.as_dict() for f in a.findings],
        "run": run_to_dict(a.run),
    }
