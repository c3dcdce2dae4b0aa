"""MFU, HFU and communication efficiency (issue 8 item 4; docs/concepts.md "MFU and HFU"). Pure functions.

Definitions:
- Model FLOPs per step of a transformer (PaLM appendix B; Narayanan et al. 2021, eq. 3):
  6·N·tokens + 12·L·h·s·tokens, with N = 12·L·h² + V·h (per layer attention 4h² and MLP 8h²
  weights; the logit matmul), tokens = B·s (B the global batch in sequences). This equals
  Megatron's 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)).
- Hardware FLOPs add what recomputation runs again (Korthikanti et al. 2022): `full` activation
  recompute one more forward of every layer, 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)); `selective`
  (attention core only) 4·B·s²·h per layer. Given only a FLOPs count, `full` is 8/6 of it.
- Traced FLOPs: per-op `flops` args (profiler `with_flops=True`), else the GEMMs' recorded shapes
  (`record_shapes=True`) with torch's with_flops formulas: mm/addmm 2·M·K·N, bmm/baddbmm
  2·b·M·K·N; convolutions then go uncounted (reported). An op counts in the step its host call
  starts in. Traced FLOPs are what ran, recomputation included: hardware FLOPs, so HFU comes from
  them and MFU = HFU / recompute factor.
- MFU = model FLOPs per GPU per step / (peak × step time); HFU likewise with hardware FLOPs. The
  job's step time and achieved TFLOPS per GPU are means over ranks; its MFU is Σ achieved / Σ peak.
  Peak: hardware.PEAK_TFLOPS for the device that ran the rank's kernels, in the GEMMs' dtype.
- Communication efficiency = bus bandwidth of the job's collectives (nccl-tests definition, from
  the cross-rank matching) / the device's peer link peak (hardware.LINK_PEAK_GBPS).
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from rankscope.analyses.rank.flops import rank_steps
from rankscope.results.collectives import CollectiveGroupRow
from rankscope.results.rank import RankFlops
from rankscope.hardware import device_model, link_peak_gbps, peak_tflops
from rankscope.results.mfu import ModelFlops, RankMfu, CommEfficiency, MfuReport

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results.rank import RankSummary

RECOMPUTE = ("none", "selective", "full")
#: Hardware / model FLOPs of full activation recomputation when only a FLOPs count is known.
FULL_RECOMPUTE_FACTOR = 8 / 6
DEFAULT_DTYPE = "bf16"


def transformer_flops(layers: int, hidden: int, heads: int, vocab: int, seq: int, batch: int,
                      recompute: str = "none") -> ModelFlops:
    """Model and hardware FLOPs per step of a decoder transformer (module docstring)."""
    if min(layers, hidden, heads, vocab, seq, batch) <= 0:
        raise ValueError("transformer dims must be positive")
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}")
    tokens = float(batch) * seq
    params = 12.0 * layers * hidden ** 2 + float(vocab) * hidden
    attention = 12.0 * layers * hidden * seq * tokens
    model = 6.0 * params * tokens + attention
    layer_forward = 24.0 * tokens * hidden ** 2 * layers + attention / 3      # GEMMs + attention core
    extra = {"none": 0.0, "full": layer_forward, "selective": 4.0 * batch * seq ** 2 * hidden * layers}[recompute]
    return ModelFlops(model_flops_per_step=model, hardware_flops_per_step=model + extra, recompute=recompute,
                      params=params, tokens=tokens)


def recompute_factor(model: ModelFlops) -> float:
    """Hardware over model FLOPs: what activation recomputation adds."""
    return model.hardware_flops_per_step / model.model_flops_per_step


def given_flops(flops_per_step: float, recompute: str = "none") -> ModelFlops:
    """A model FLOPs count per step given by the user; `selective` needs the transformer dims."""
    if flops_per_step <= 0:
        raise ValueError("model FLOPs per step must be positive")
    if recompute == "selective":
        raise ValueError("selective recompute needs the transformer dims (--layers --hidden --heads --vocab "
                         "--seq --batch)")
    factor = FULL_RECOMPUTE_FACTOR if recompute == "full" else 1.0
    return ModelFlops(model_flops_per_step=flops_per_step, hardware_flops_per_step=flops_per_step * factor,
                      recompute=recompute)


def from_summary(summary: RankSummary, traced: bool = False) -> RankFlops:
    """A rank's steps and device from its summary; with `traced`, also the FLOPs its trace
    recorded (`RankSummary.flops`, computed by `rank_flops` in the per-rank map)."""
    if traced and summary.flops:
        return msgspec.structs.replace(summary.flops, rank=summary.rank)
    return rank_steps(summary.rank, summary.meta.devices, None, [s.step for s in summary.steps],
                       [s.duration_ms for s in summary.steps])


def mfu_report(ranks: list[RankFlops], world_size: int | None, model: ModelFlops | None = None,
               dtype: str | None = None, recompute: str = "none",
               collectives_by_type: list[CollectiveGroupRow] | None = None,
               hosts: int = 1) -> MfuReport:
    """MFU/HFU of a job from its ranks' steps (and traced FLOPs when `model` is None)."""
    notes: list[str] = []
    world = world_size or len(ranks)
    if model is not None:
        source, factor = "model", recompute_factor(model)
    else:
        sources = {r.source for r in ranks if r.source != "none"}
        source = "flops_args" if "flops_args" in sources else sources.pop() if sources else "none"
        factor = recompute_factor(given_flops(1.0, recompute))
        if source == "none":
            notes.append("no FLOPs in the traces (take them with with_flops=True or record_shapes=True) "
                         "and no model given (--model-flops-per-step or the transformer dims)")
        elif source == "gemm_shapes":
            notes.append("FLOPs from the GEMMs' recorded shapes (mm/addmm/bmm/baddbmm); other ops not counted")
            uncounted = sum(r.uncounted_ops for r in ranks)
            if uncounted:
                notes.append(f"{uncounted} convolution ops without FLOPs not counted: MFU is a lower bound")
    traced = Counter(r.dtype for r in ranks if r.dtype)
    dtype_source = "option" if dtype else "trace" if traced else "default"
    dtype = dtype or (traced.most_common(1)[0][0] if traced else DEFAULT_DTYPE)
    if dtype_source == "default":
        notes.append(f"dtype not recorded in the traces: peak FLOPs for {dtype} assumed (--dtype sets it)")
    rows = [_rank_mfu(r, world, model, factor, dtype, notes) for r in ranks]
    known = [r for r in rows if r.achieved_tflops is not None]
    steps = [r.step_ms for r in rows if r.step_ms]
    peaks = [(r.achieved_tflops, r.peak_tflops) for r in rows if r.achieved_tflops is not None and r.peak_tflops]
    mfu = 100.0 * sum(a for a, _ in peaks) / sum(p for _, p in peaks) if peaks else None
    return MfuReport(
        source=source, dtype=dtype, dtype_source=dtype_source, recompute=recompute, recompute_factor=factor,
        world_size=world, model=model, step_ms=float(np.mean(steps)) if steps else None,
        achieved_tflops_per_gpu=float(np.mean([r.achieved_tflops for r in known])) if known else None,
        mfu_pct=mfu, hfu_pct=mfu * factor if mfu is not None else None, ranks=rows,
        comm=comm_efficiency(collectives_by_type or [], [r.device_model for r in rows], hosts, notes), notes=notes)


def _rank_mfu(r: RankFlops, world: int, model: ModelFlops | None, factor: float, dtype: str,
              notes: list[str]) -> RankMfu:
    key = device_model(r.device, r.device_props)
    peak = peak_tflops(key, dtype)
    if r.device and peak is None:
        note = f"no {dtype} peak FLOPs known for {r.device}"
        if note not in notes:
            notes.append(note)
    total_ms = float(sum(r.step_ms))
    if model is not None:
        per_step = model.model_flops_per_step / world
    elif r.flops:
        per_step = float(sum(r.flops)) / len(r.flops) / factor
    else:
        per_step = None
    achieved = per_step * len(r.step_ms) / (total_ms / 1e3) / 1e12 if per_step is not None and total_ms > 0 else None
    mfu = 100.0 * achieved / peak if achieved is not None and peak else None
    return RankMfu(rank=r.rank, device=r.device, device_model=key, peak_tflops=peak, steps=len(r.step_ms),
                   step_ms=total_ms / len(r.step_ms) if r.step_ms else None,
                   model_tflop_per_step=per_step / 1e12 if per_step is not None else None, achieved_tflops=achieved,
                   mfu_pct=mfu, hfu_pct=mfu * factor if mfu is not None else None)


def comm_efficiency(by_type: list[CollectiveGroupRow], models: list[str | None], hosts: int = 1,
                    notes: list[str] | None = None) -> list[CommEfficiency]:
    """Per collective type (cross-rank `collectives.by_type` rows): busbw / the link peak."""
    peak = next((p for p in (link_peak_gbps(m) for m in models) if p), None)
    out = []
    for row in by_type:
        busbw = row.busbw_mean_gbps
        if busbw is None or not isinstance(row.group_size, int) or row.group_size < 2:
            continue
        out.append(CommEfficiency(type=str(row.type), group_size=int(row.group_size),
                                  count=int(row.count or 0), busbw_gbps=float(busbw), link_peak_gbps=peak,
                                  efficiency_pct=100.0 * busbw / peak if peak else None))
    if out and hosts > 1 and notes is not None:
        notes.append(f"{hosts} hosts: collectives crossing hosts are bound by the network, not the "
                     f"per-GPU link peak used here")
    return out
