"""What `rankscope nccl` finds in NCCL_DEBUG=INFO logs (docs/inputs.md): per run its communicators,
transports and links, bus bandwidth, the NCCL_* environment against the reference run, and the
comparisons that judge it. Made by analyses/inputs/nccl.py."""
from __future__ import annotations

from typing import Any, Literal

import msgspec

from rankscope.ingest.nccl_log import NcclLog, TopoLink


class CommSummary(msgspec.Struct):
    comm_id: str
    nranks: int
    nnodes: int | None
    coll_channels: int | None
    p2p_channels: int | None
    nvls_channels: int | None
    collnet_channels: int | None
    ring_channels: int
    tree_channels: int


class PeerLink(msgspec.Struct):
    """How one rank sends to another in a communicator, over all its channels."""
    comm_id: str
    src: int
    dst: int
    same_host: bool | None
    via: str                      # the most common transport string on its channels
    kind: str                     # P2P, SHM, NET/IB, ...
    channels: int


class EnvDifference(msgspec.Struct):
    """An NCCL_* variable that differs between a run and the reference run (None: not set)."""
    name: str
    value: str | None
    reference_value: str | None
    reference_from: str                    # the reference run's file
    diagnostic: bool                       # only changes NCCL's logging / dumps (DIAGNOSTIC_ENV_PATTERN)
    change: Literal["set_only_here", "unset_only_here", "different_value"]


class NcclRun(msgspec.Struct):
    file: str
    nccl_version: str | None
    hosts: list[str]
    devices: list[str]
    comms: list[CommSummary]
    peers: list[PeerLink]
    gpu_links: list[TopoLink]
    bus_to_rank: dict[str, int]
    avg_busbw_gbps: float | None           # nccl-tests "Avg bus bandwidth" (else mean of the rows)
    peak_busbw_gbps: float | None          # best out-of-place row
    nvls: bool
    collnet: bool
    log: NcclLog
    env_vs_reference: list[EnvDifference] = []   # vs the reference run's NCCL_* env


class Comparison(msgspec.Struct):
    """One quantity of one run set against its best peer: `pct` = 100 * value / reference."""
    file: str
    kind: str                  # channels | link | transport | busbw
    subject: str               # what is compared, in words ("comm 0x.. (2 ranks)", "GPU/0-65000 -> GPU/0-17000")
    ranks: list[int]
    value: float
    reference: float
    reference_from: str        # the file (or "this run") the reference comes from
    pct: float
    detail: dict[str, Any] = {}


class NcclReport(msgspec.Struct):
    runs: list[NcclRun]
    best_run: str | None                   # highest bus bandwidth
    comparisons: list[Comparison]
