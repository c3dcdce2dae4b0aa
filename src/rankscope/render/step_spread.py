"""The step-time spread across ranks (results/step_spread.py) in words, as the terminal and the HTML
report show it."""
from __future__ import annotations

from rankscope.results.step_spread import StepSpread


def spread_text(spread: StepSpread) -> str:
    """One line: the mean spread, its share of the median step, and the step where it was largest."""
    share = (f" ({spread.spread_pct_of_median_step:.1f}% of the median step)"
             if spread.spread_pct_of_median_step is not None else "")
    widest = max(spread.steps, key=lambda r: (r.slowest_ms - r.fastest_ms, -r.step))
    steps = "the one step" if len(spread.steps) == 1 else f"the {len(spread.steps)} steps"
    return (f"step-time spread {spread.spread_ms:,.2f} ms per step{share}: the slowest rank's step minus the "
            f"fastest's, mean over {steps} two ranks or more profiled (widest: step "
            f"{widest.step}, {widest.slowest_ms - widest.fastest_ms:,.2f} ms, rank {widest.slowest_rank} slowest)")
