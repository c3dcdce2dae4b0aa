"""Traced FLOPs of one rank per step (the per-rank side of MFU; `analyses/job/mfu.py` has the rest).

Traced FLOPs: per-op `flops` args (profiler `with_flops=True`), else the GEMMs' recorded shapes
(`record_shapes=True`) with torch's with_flops formulas: mm/addmm 2·M·K·N, bmm/baddbmm 2·b·M·K·N;
convolutions then go uncounted (reported). An op counts in the step its host call starts in.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Any

import msgspec
import numpy as np
import polars as pl

from rankscope.analyses.rank import views
from rankscope.analyses.rank.steps import step_windows
from rankscope.model import Kind, RankTrace
from rankscope.units import NS_PER_MS

#: GEMM ops -> positions of the two matrices in `Input Dims` (torch's with_flops: mat1, mat2).
GEMM_INPUTS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
UNCOUNTED_PATTERN = r"^aten::(conv|cudnn_conv|miopen_conv|_convolution)"
#: Profiler input type -> peak table dtype.
TORCH_DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8",
                "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}


class RankFlops(msgspec.Struct):
    """One rank's steps, device and traced FLOPs (the per-rank map step; small)."""
    rank: int
    device: str | None                  # name of the device that ran the rank's kernels
    device_props: dict[str, Any] | None
    steps: list[int]
    step_ms: list[float]
    flops: list[float] = []             # traced FLOPs per step ([] when none)
    source: str = "none"                # "flops_args" | "gemm_shapes" | "none"
    dtype: str | None = None            # the GEMMs' dtype, FLOPs-weighted (None: not recorded)
    ops: int = 0                        # ops whose FLOPs were counted
    uncounted_ops: int = 0              # convolutions without flops args (gemm_shapes only)


def rank_flops(trace: RankTrace) -> RankFlops:
    """Steps, device and per-step traced FLOPs of one rank (see module docstring)."""
    wf = step_windows(trace).frame
    out = rank_steps(trace.meta.rank, trace.meta.devices, _kernel_device(trace), wf["step"].to_list(),
                      (wf["duration_ns"].to_numpy() / NS_PER_MS).tolist())
    ops = views.with_rows(trace, [Kind.CPU_OP]).select("row", "name", "ts_ns")
    args = trace.op_args.select("row", "flops", "input_dims", "input_types")
    as_text = pl.col("input_dims", "input_types").cast(pl.String)      # on the few rows kept, not on all
    with_flops = ops.join(args.filter(pl.col("flops").is_not_nan() & (pl.col("flops") > 0)), on="row")
    if with_flops.height:
        out.source, ts, flops = "flops_args", with_flops["ts_ns"].to_numpy(), with_flops["flops"].to_numpy()
        gemms = with_flops.filter(pl.col("name").is_in(list(GEMM_INPUTS))).with_columns(as_text)
    else:
        gemms = ops.filter(pl.col("name").is_in(list(GEMM_INPUTS))).join(args, on="row").with_columns(as_text)
        gemms = gemms.with_columns(pl.Series("flops", [_gemm_flops(n, d) for n, d in
                                                       zip(gemms["name"].cast(pl.String), gemms["input_dims"])],
                                             dtype=pl.Float64)).filter(pl.col("flops") > 0)
        if gemms.is_empty():
            return out
        out.source, ts, flops = "gemm_shapes", gemms["ts_ns"].to_numpy(), gemms["flops"].to_numpy()
        out.uncounted_ops = ops.filter(pl.col("name").cast(pl.String).str.contains(UNCOUNTED_PATTERN)).height
    starts, ends = wf["start_ns"].to_numpy(), wf["end_ns"].to_numpy()
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = (k >= 0) & (ts < ends[np.maximum(k, 0)])
    out.flops = np.bincount(k[inside], weights=flops[inside], minlength=len(starts)).tolist()
    out.ops = int(inside.sum())
    out.dtype = _dtype_of(gemms)
    return out


def rank_steps(rank: int, devices: list[dict], device_id: int | None, steps: list[int],
                step_ms: list[float]) -> RankFlops:
    """`devices`: deviceProperties; the one with `device_id` (else the first) is the rank's."""
    props = next((d for d in devices if d.get("id") == device_id), None) or next(iter(devices), None)
    return RankFlops(rank=rank, device=props.get("name") if props else None, device_props=props, steps=steps,
                     step_ms=step_ms)


def _kernel_device(trace: RankTrace) -> int | None:
    dev = views.device_events(trace).filter(pl.col("device") >= 0)["device"]
    return int(dev.mode().sort()[0]) if len(dev) else None


def _gemm_flops(name: str, dims_json: str | None) -> float | None:
    try:
        dims = json.loads(dims_json) if dims_json else None
        a, b = (dims[i] for i in GEMM_INPUTS[name])
    except (ValueError, TypeError, IndexError):
        return None
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 2.0 * a[0] * a[1] * b[1]
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    return None


def _dtype_of(gemms: pl.DataFrame) -> str | None:
    """The dtype carrying most of the GEMM FLOPs (first input's recorded type)."""
    weight: Counter = Counter()
    for types, flops in zip(gemms["input_types"], gemms["flops"]):
        try:
            first = [t for t in json.loads(types) if t not in ("", "Scalar")][0] if types else None
        except (ValueError, TypeError, IndexError):
            first = None
        if first in TORCH_DTYPES:
            weight[TORCH_DTYPES[first]] += flops
    return weight.most_common(1)[0][0] if weight else None


# ----------------------------------------------------------------------------------------------
