"""`StragglerMonitor`: find the slow rank while the job runs, not afterwards.

    monitor = StragglerMonitor(every=50)
    for batch in loader:
        with monitor.timed():          # this rank's own work: no collective inside
            x, y = to_device(batch)
            loss = loss_fn(model(x), y)
        loss.backward(); opt.step()    # DDP's all-reduce: fast ranks wait here for the slow one
        monitor.step()

Every `every` steps each rank's mean step time over those steps is all-gathered (one tensor of one
float64; works on gloo and NCCL) and every rank gets the same `StragglerReport`; rank 0 logs one
line naming the slow rank(s). Rule (docs/concepts.md, Straggler): a rank is slow when its mean
is > `z` standard deviations (population, across ranks) or > `pct` % over the mean of all ranks; by
default the cross-rank analysis' `straggler_step_z` and `straggler_step_pct` (rankscope.thresholds).
With fewer than 6 ranks a single outlier cannot reach z > 2 (the largest z is sqrt(n - 1)), so
there the % rule decides.

What to time: in synchronous training every rank's full step lasts the same (the fast ranks wait in
the gradient all-reduce for the slow one), so a full-step time hides the straggler. Time the part a
rank does on its own: `with monitor.timed():` around it (several blocks per step add up) and
`monitor.step()`, or pass your own figure, `monitor.step(seconds)`. `timed()` synchronizes the CUDA
device at the end of the block when CUDA is in use, so the time covers the kernels it launched.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

from rankscope.capture._torch import (
    CaptureError,
    all_gather_float,
    import_torch,
    require_process_group,
    synchronize,
)
from rankscope.thresholds import THRESHOLDS

LOG = logging.getLogger("rankscope.capture")
#: The registry's defaults of the rule's two bars.
STEP_Z = THRESHOLDS["straggler_step_z"].value
STEP_PCT = THRESHOLDS["straggler_step_pct"].value


@dataclass
class StragglerReport:
    step: int                          # steps counted when the report was made
    window_steps: int                  # steps averaged on each rank
    step_time_s: list[float]           # per rank (index = rank): mean over the window
    mean_s: float                      # mean over ranks
    std_s: float                       # population standard deviation over ranks
    z: list[float]                     # per rank; 0 when all ranks are equal
    pct_over_mean: list[float]         # per rank
    slow_ranks: list[int]              # ranks over either threshold, slowest first

    def line(self) -> str:
        head = f"rankscope straggler monitor, steps {self.step - self.window_steps + 1}-{self.step}: "
        if not self.slow_ranks:
            return head + f"no slow rank (mean {self.mean_s * 1e3:.1f} ms over {len(self.step_time_s)} ranks)"
        return head + "; ".join(
            f"rank {r} is slow: {self.step_time_s[r] * 1e3:.1f} ms vs mean {self.mean_s * 1e3:.1f} ms "
            f"(+{self.pct_over_mean[r]:.1f}%, z = {self.z[r]:.2f})" for r in self.slow_ranks)


def straggler_report(times_s: list[float], step: int, window_steps: int, z: float = STEP_Z,
                     pct: float = STEP_PCT) -> StragglerReport:
    """The report for one mean step time per rank (module docstring's rule)."""
    n = len(times_s)
    mean = sum(times_s) / n
    std = (sum((t - mean) ** 2 for t in times_s) / n) ** 0.5
    zs = [(t - mean) / std if std > 0 else 0.0 for t in times_s]
    pcts = [100.0 * (t - mean) / mean if mean > 0 else 0.0 for t in times_s]
    slow = sorted((r for r in range(n) if zs[r] > z or pcts[r] > pct), key=lambda r: (-times_s[r], r))
    return StragglerReport(step=step, window_steps=window_steps, step_time_s=list(times_s), mean_s=mean, std_s=std,
                           z=zs, pct_over_mean=pcts, slow_ranks=slow)


class StragglerMonitor:
    """Collective: every rank of the default process group must call `step()` the same number of
    times. `step()` returns the report on every rank each `every` steps, None in between."""

    def __init__(self, every: int = 50, z: float = STEP_Z, pct: float = STEP_PCT,
                 logger: logging.Logger | None = None):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.z, self.pct = every, z, pct
        self.logger = logger or LOG
        self.steps = 0
        self.last_report: StragglerReport | None = None
        self._window: list[float] = []
        self._timed_s = 0.0
        self._timed_blocks = 0

    @contextlib.contextmanager
    def timed(self):
        """Time the block (added to this step's time; see the module docstring for what to time)."""
        torch = import_torch()
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        start = time.perf_counter()
        try:
            yield
        finally:
            if cuda:
                synchronize(torch, torch.device("cuda", torch.cuda.current_device()))
            self._timed_s += time.perf_counter() - start
            self._timed_blocks += 1

    def step(self, step_time_s: float | None = None) -> StragglerReport | None:
        """Count one step of `step_time_s` seconds (default: the time of this step's `timed()` blocks)."""
        if step_time_s is None:
            if not self._timed_blocks:
                raise CaptureError("StragglerMonitor.step() without a time needs a `with monitor.timed():` block")
            step_time_s = self._timed_s
        self._timed_s, self._timed_blocks = 0.0, 0
        self.steps += 1
        self._window.append(float(step_time_s))
        if self.steps % self.every:
            return None
        torch = import_torch()
        require_process_group(torch, "StragglerMonitor")
        times = all_gather_float(torch, sum(self._window) / len(self._window))
        report = straggler_report(times, self.steps, len(self._window), self.z, self.pct)
        self._window.clear()
        self.last_report = report
        if torch.distributed.get_rank() == 0:
            self.logger.log(logging.WARNING if report.slow_ranks else logging.INFO, report.line())
        return report
