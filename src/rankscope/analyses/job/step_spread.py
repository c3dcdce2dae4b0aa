"""Step-time spread across ranks (docs/concepts.md "Step-time spread"): per step that two ranks or
more profiled, the slowest rank's step duration minus the fastest's. In synchronous training every
rank's step lasts as long as the slowest rank's (each waits at the step's collectives), so the spread
stays near zero; a spread of a good share of the step says the ranks do not step together (steps
that start apart, a rank whose step window holds work the others do outside theirs)."""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from rankscope.results.collectives import Collectives
from rankscope.results.step_spread import StepSpread, StepSpreadRow
from rankscope.units import NS_PER_MS


def step_spread(ranks: Sequence[Collectives], median_step_ms: float | None) -> StepSpread | None:
    """The spread of every step common to two ranks or more; None when there is no such step."""
    by_step: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for rc in ranks:
        for step, start, end in zip(rc.steps, rc.step_start_ns, rc.step_end_ns):
            by_step[int(step)].append(((end - start) / NS_PER_MS, rc.rank))
    rows = []
    for step, durations in sorted(by_step.items()):
        if len(durations) >= 2:
            slowest_ms, slowest_rank = max(durations, key=lambda d: (d[0], -d[1]))    # ties: the lower rank
            rows.append(StepSpreadRow(step, round(min(d for d, _ in durations), 3), round(slowest_ms, 3), slowest_rank))
    if not rows:
        return None
    spread = sum(r.slowest_ms - r.fastest_ms for r in rows) / len(rows)     # of the rounded rows: as shown
    return StepSpread(rows, round(spread, 3), round(100.0 * spread / median_step_ms, 2) if median_step_ms else None)
