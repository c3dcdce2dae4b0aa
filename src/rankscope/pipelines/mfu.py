"""`mfu`: model and hardware FLOPs utilization of a job: the model's FLOPs per step (given, or
counted in the traces), the job's analysis (job.py), then `analyses.job.mfu.mfu_report`."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rankscope.pipelines import checking_arguments
from rankscope.pipelines.job import analyze_job
from rankscope.results import MfuResult

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results.mfu import ModelFlops

TRANSFORMER_DIMS = ("layers", "hidden", "heads", "vocab", "seq", "batch")


def mfu(inputs: str | Path | list[str | Path], model_flops_per_step: float | None = None,
        dims: dict[str, int] | None = None, recompute: str = "none", dtype: str | None = None,
        cache_dir: str | Path | None = None,
        use_cache: bool = True, on_progress: Callable[[int, int, str], None] | None = None) -> MfuResult:
    """MFU / HFU against the devices' peak (at `dtype`, default the GEMMs' dtype in the traces) and
    communication efficiency. The model's FLOPs per step: `model_flops_per_step` (whole job), or a
    decoder transformer's `dims` (all of TRANSFORMER_DIMS), else those the traces recorded. Wrong
    model arguments raise ArgumentError before any file is read."""
    from rankscope.analyses.job.mfu import from_summary, mfu_report
    with checking_arguments():
        model = _model_flops(model_flops_per_step, dims or {}, recompute)
    analysis = analyze_job(inputs, cache_dir=cache_dir, use_cache=use_cache, on_progress=on_progress)
    if not analysis.summaries:
        return MfuResult(None, analysis.problems)
    ranks = [from_summary(s, traced=model is None) for s in analysis.summaries]
    by_type = analysis.cross.collectives.by_type if analysis.cross else []
    report = mfu_report(ranks, analysis.job.world_size, model, dtype, recompute, by_type, len(analysis.job.hosts))
    return MfuResult(report, analysis.problems)


def _model_flops(flops_per_step: float | None, dims: dict[str, int], recompute: str) -> ModelFlops | None:
    """The model's FLOPs per step from the user's numbers; None: count them in the traces."""
    from rankscope.analyses.job.mfu import given_flops, transformer_flops
    if dims and (set(dims) != set(TRANSFORMER_DIMS) or flops_per_step):
        raise ValueError("give all of --layers --hidden --heads --vocab --seq --batch, or --model-flops-per-step")
    if dims:
        return transformer_flops(**dims, recompute=recompute)
    if flops_per_step:
        return given_flops(flops_per_step, recompute)
    given_flops(1.0, recompute)      # selective recompute needs the model dims
    return None
