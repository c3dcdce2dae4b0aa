"""The whole run's figures under one name in every output (terminal, HTML, watch), their definitions,
and one sentence per change. Formatting only."""
from __future__ import annotations

from rankscope.render.figures import BREAKDOWN, Figure
from rankscope.render.format import ranges
from rankscope.results.run import Run, RunChange, RunCycle

#: One row per profiler cycle (`run.cycles[]`).
RUN_CYCLE = {
    "steps": Figure("steps", "steps", "steps", "the cycle's profiled steps (the profiler's step numbers)"),
    "ranks": Figure("ranks", "ranks", "ranks", "ranks with a file in the cycle"),
    "median": Figure("median ms", "step_ms_median", "median step ms",
                     "median step time over the cycle's ranks and steps"),
    "slowest": Figure("slowest ms", "step_ms_max", "slowest rank ms", "the slowest rank's median step in the cycle"),
    "straggler": Figure("straggler", "straggler", "straggler",
                        "the rank the others waited for most, its cause and its cost: how much shorter the other "
                        "ranks' steps would be if it ran like the median rank (ms per step)"),
    "findings": Figure("findings", "findings", "findings", "findings raised on the cycle alone"),
}

CHANGE_KINDS = {"slowdown": "slower", "speedup": "faster", "straggler_onset": "straggler from",
                "straggler_end": "no longer a straggler from", "finding_onset": "finding raised from"}


def run_steps(run: Run) -> list[int]:
    """Every profiled step of the run's cycles, in order."""
    return sorted({s for c in run.cycles for s in c.steps})


def straggler_text(c: RunCycle) -> str:
    s = c.straggler
    return f"rank {s.rank} {s.cause} {s.cost_ms_per_step:.1f}" if s else "-"


def change_text(c: RunChange) -> str:
    """One sentence: who, what, from when, before -> after, why."""
    when = f"step {c.first_step} (cycle {c.first_cycle})"
    if c.kind in ("slowdown", "speedup"):
        who = f"rank {c.rank}" if c.rank is not None else (
            f"the job (ranks {ranges(c.ranks)})" if c.ranks else "the job")
        # a slowdown / speedup always has both medians (analyses/run/changes.py); only other kinds leave them None
        assert c.before_ms is not None and c.after_ms is not None
        grew = 100.0 * (c.after_ms - c.before_ms) / c.before_ms if c.before_ms else 0.0
        part = BREAKDOWN.get(c.cause or "")
        cause = f"{c.cause} ({part.definition})" if part else str(c.cause)
        return (f"{c.kind}: {who} {CHANGE_KINDS[c.kind]} from {when}: median step {c.before_ms:.2f} -> "
                f"{c.after_ms:.2f} ms ({grew:+.0f}%, z {c.z:.1f}); moved most: {cause}")
    if c.kind == "straggler_onset":
        return (f"straggler_onset: rank {c.rank} is the straggler from {when}: {c.cause}, costs the others "
                f"{c.after_ms:.2f} ms per step")
    if c.kind == "straggler_end":
        return f"straggler_end: rank {c.rank} ({c.cause}) is no longer the straggler from {when}"
    cost = f", costs {c.after_ms:.2f} ms per step" if c.after_ms is not None else ""
    return f"finding_onset: {c.finding} raised from {when} on, in every cycle since{cost}"


def noise_text(noise_pct: float | None, cycle_noise_pct: float | None, z_critical: float) -> str:
    """How a change is judged, in the run's own numbers."""
    step = f"{noise_pct:.1f}%" if noise_pct is not None else "unknown (fewer than two steps in a cycle)"
    cycle = (f"{cycle_noise_pct:.1f}%" if cycle_noise_pct is not None
             else "not known (too few cycles: the step noise alone judges)")
    return (f"run noise, as standard deviations of a step: {step} from one profiled step to the next in a cycle, "
            f"{cycle} from one cycle's median step to the next; a slowdown or speedup moves the median step by "
            f">= {z_critical:.2f} times its standard error from that noise (z), by >= the minimum share "
            f"(run_change_min_pct), and holds on both sides")
