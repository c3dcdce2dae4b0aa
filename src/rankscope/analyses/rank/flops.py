"""Traced FLOPs of one rank per step (the per-rank side of MFU; `analyses/job/mfu.py` has the rest).

Traced FLOPs: per-op `flops` args (profiler `with_flops=True`), else the GEMMs' recorded shapes
(`record_shapes=True`) with torch's with_flops formulas: mm/addmm 2·M·K·N, bmm/baddbmm 2·b·M·K·N;
convolutions then go uncounted (reported). An op counts in the step its host call starts in.
"""
from __future__ import annotations

import json
from typing import Any
from collections import Counter

import numpy as np
import polars as pl

from rankscope.analyses.rank.steps import step_windows
from rankscope.analyses.rank.views import column, kind_mask, name_mask, named_mask
from rankscope.model import DEVICE_KINDS, Kind, RankTrace
from rankscope.units import NS_PER_MS
from rankscope.results.rank import RankFlops

#: GEMM ops -> positions of the two matrices in `Input Dims` (torch's with_flops: mat1, mat2).
GEMM_INPUTS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
UNCOUNTED_PATTERN = r"^aten::(conv|cudnn_conv|miopen_conv|_convolution)"
#: Profiler input type -> peak table dtype.
TORCH_DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8",
                "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}


def rank_flops(trace: RankTrace) -> RankFlops:
    """Steps, device and per-step traced FLOPs of one rank (see module docstring)."""
    wf = step_windows(trace).frame
    out = rank_steps(trace.meta.rank, trace.meta.devices, _kernel_device(trace), wf["step"].to_list(),
                      (wf["duration_ns"].to_numpy() / NS_PER_MS).tolist())
    args = trace.op_args
    rows = args["row"].to_numpy()
    cpu_op = trace.events["kind"].to_numpy()[rows] == int(Kind.CPU_OP)     # args of CPU ops only
    names = trace.events["name"].gather(rows)
    gemm = cpu_op & named_mask(trace, GEMM_INPUTS)[rows]
    flops = args["flops"].to_numpy()                                       # null: NaN
    counted = cpu_op & (flops > 0)
    if counted.any():
        out.source = "flops_args"
        gemm &= counted
    else:
        flops = np.full(len(rows), np.nan)
        flops[gemm] = np.array([_gemm_flops(n, d) for n, d in zip(names.filter(gemm).cast(pl.String),
                                                                  args["input_dims"].filter(gemm).cast(pl.String))],
                               dtype=np.float64)
        gemm &= flops > 0
        if not gemm.any():
            return out
        out.source, counted = "gemm_shapes", gemm
        out.uncounted_ops = int((kind_mask(trace, [Kind.CPU_OP]) & name_mask(trace, UNCOUNTED_PATTERN)).sum())
    ts = trace.events["ts_ns"].to_numpy()[rows[counted]]
    starts, ends = wf["start_ns"].to_numpy(), wf["end_ns"].to_numpy()
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = (k >= 0) & (ts < ends[np.maximum(k, 0)])
    out.flops = np.bincount(k[inside], weights=flops[counted][inside], minlength=len(starts)).tolist()
    out.ops = int(inside.sum())
    out.dtype = _dtype_of(args["input_types"].filter(gemm).cast(pl.String).to_list(), flops[gemm].tolist())
    return out


def rank_steps(rank: int, devices: list[dict], device_id: int | None, steps: list[int],
                step_ms: list[float]) -> RankFlops:
    """`devices`: deviceProperties; the one with `device_id` (else the first) is the rank's."""
    props = next((d for d in devices if d.get("id") == device_id), None) or next(iter(devices), None)
    return RankFlops(rank=rank, device=props.get("name") if props else None, device_props=props, steps=steps,
                     step_ms=step_ms)


def _kernel_device(trace: RankTrace) -> int | None:
    """The device that ran most of the rank's device events (the lowest id on a tie)."""
    device = column(trace, DEVICE_KINDS, "device")
    device = device[device >= 0]
    return int(np.bincount(device).argmax()) if len(device) else None


def _gemm_flops(name: str, dims_json: str | None) -> float | None:
    if not dims_json:
        return None
    try:
        dims = json.loads(dims_json)
        a, b = (dims[i] for i in GEMM_INPUTS[name])
    except (ValueError, TypeError, IndexError):
        return None
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 2.0 * a[0] * a[1] * b[1]
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    return None


def _dtype_of(input_types: list[str | None], flops: list[float]) -> str | None:
    """The dtype carrying most of the GEMM FLOPs (first input's recorded type)."""
    weight: dict[str, float] = {}
    for types, op_flops in zip(input_types, flops):
        try:
            first = [t for t in json.loads(types) if t not in ("", "Scalar")][0] if types else None
        except (ValueError, TypeError, IndexError):
            first = None
        if first in TORCH_DTYPES:
            dtype = TORCH_DTYPES[first]
            weight[dtype] = weight.get(dtype, 0) + op_flops
    return max(weight, key=weight.__getitem__) if weight else None


# ----------------------------------------------------------------------------------------------
