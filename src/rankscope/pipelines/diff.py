"""`diff_runs`: an A/B comparison of two runs, each analysed (job.py), then set side by side
(`analyses.job.diff.diff_analyses`)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from rankscope.model import InputProblem
from rankscope.pipelines.job import analyze_job
from rankscope.pipelines.report import JobAnalysis
from rankscope.results import DiffResult


def diff_runs(before: str | Path, after: str | Path, cache_dir: str | Path | None = None, use_cache: bool = True,
              on_progress: Callable[[int, int, str], None] | None = None) -> DiffResult:
    """What changed from run `before` to run `after` (trace folders or single traces), beyond noise.
    `on_progress(done, total, file)` is called as each run's ranks finish. A run without a usable
    trace ends it (the next run is not read): `DiffResult.empty_run` names it."""
    from rankscope.analyses.job.diff import diff_analyses
    runs: list[JobAnalysis] = []
    problems: list[InputProblem] = []
    for run in (before, after):
        analysis = analyze_job([run], cache_dir=cache_dir, use_cache=use_cache, on_progress=on_progress)
        problems += analysis.problems
        if not analysis.summaries:
            return DiffResult(None, problems, empty_run=str(run))
        runs.append(analysis)
    return DiffResult(diff_analyses(runs[0], runs[1], labels=(str(before), str(after))), problems)
