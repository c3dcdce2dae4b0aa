"""A finding: a diagnosis with the numbers that triggered it and a concrete fix (docs/findings.md).
Made by the rules of findings/."""
from __future__ import annotations

from typing import Any, Literal

import msgspec

Severity = Literal["high", "medium", "low"]
#: The stable finding ids (docs/findings.md), in the order their rules run.
FindingId = Literal["straggler_rank", "dataloader_stall", "exposed_communication", "low_overlap", "comm_bound",
                    "gpu_idle_host_bound", "launch_overhead", "sync_stall", "unpinned_memcpy", "memory_fragmentation",
                    "memory_pressure", "load_imbalance", "tensor_cores_unused", "low_bus_bandwidth",
                    "degraded_nccl_link", "pipeline_stage_imbalance", "pipeline_bubble", "fsdp_exposed_gather",
                    "tp_comm_exposed", "expert_imbalance", "collective_hang", "collective_desync", "slowdown_onset"]


class Finding(msgspec.Struct, kw_only=True):
    """`evidence`: the figures behind it (plain JSON data: a per-rank mapping has the ranks as string
    keys); `threshold`: the thresholds it compared against, by the names `--threshold` takes;
    `cost_ms_per_step`: what it costs each step (orders the findings; None when not a time)."""
    id: FindingId
    severity: Severity
    ranks: list[int]
    steps: list[int]
    summary: str
    evidence: dict[str, Any]
    explanation: str
    fix: str
    threshold: dict[str, float]
    cost_ms_per_step: float | None = None
