"""What `rankscope mfu` finds (docs/nsys-and-mfu.md): model and hardware FLOPs utilization against the
devices' peak, per rank and for the job, and communication efficiency (bus bandwidth over the link
peak). Made by analyses/job/mfu.py."""
from __future__ import annotations

import msgspec


class ModelFlops(msgspec.Struct):
    """FLOPs of one training step of the whole job (all GPUs)."""
    model_flops_per_step: float
    hardware_flops_per_step: float
    recompute: str
    params: float | None = None          # N of the 6·N·tokens rule (transformer dims only)
    tokens: float | None = None


class RankMfu(msgspec.Struct):
    rank: int
    device: str | None
    device_model: str | None            # hardware.PEAK_TFLOPS key
    peak_tflops: float | None
    steps: int
    step_ms: float | None               # mean
    model_tflop_per_step: float | None  # this GPU's share of the model FLOPs (model) or traced / factor
    achieved_tflops: float | None       # model FLOPs per second on this GPU
    mfu_pct: float | None
    hfu_pct: float | None


class CommEfficiency(msgspec.Struct):
    type: str
    group_size: int
    count: int
    busbw_gbps: float
    link_peak_gbps: float | None
    efficiency_pct: float | None


class MfuReport(msgspec.Struct):
    source: str                         # "model" | "flops_args" | "gemm_shapes" | "none"
    dtype: str
    dtype_source: str                   # "option" | "trace" | "default"
    recompute: str
    recompute_factor: float
    world_size: int
    model: ModelFlops | None
    step_ms: float | None               # mean over ranks of their mean step
    achieved_tflops_per_gpu: float | None
    mfu_pct: float | None
    hfu_pct: float | None
    ranks: list[RankMfu]
    comm: list[CommEfficiency]
    notes: list[str]
