"""The JSON `run` object of `rankscope.analysis/1` (docs/json-schema.md "run"): every profiler cycle, the
step-time trend per rank and step, the changes; null when the files hold one cycle."""
from __future__ import annotations

from typing import Any

from rankscope.results import to_plain
from rankscope.results.run import Run, RunChange


def run_to_dict(run: Run | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {"cycles": to_plain(run.cycles),
            "trend": [{"rank": p.rank, "step": p.step, "cycle": p.cycle, "step_ms": p.step_ms} for p in run.trend],
            "changes": [change_to_dict(c) for c in run.changes],
            "detailed_cycle": run.detailed_cycle, "noise_pct": run.noise_pct,
            "cycle_noise_pct": run.cycle_noise_pct, "z_critical": run.z_critical}


def change_to_dict(c: RunChange) -> dict[str, Any]:
    return to_plain(c)
