"""Findings of the inputs beside the traces.

NCCL debug logs compared as runs (`rankscope nccl LOG...`, `analyze --nccl-log LOG`;
analyses/inputs/nccl.py, each log one run): `low_bus_bandwidth` and `degraded_nccl_link`. Their
rules read an `NcclView`: the report and the run judged.

CUDA memory snapshots (`rankscope memory SNAPSHOT`; analyses/inputs/memory_snapshot.py):
`memory_fragmentation`, read from a `MemorySnapshotView` (one snapshot's report);
`memory_snapshot_findings(reports, thresholds)` runs it on each snapshot.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Iterable

from rankscope.units import BYTES_PER_MB
from rankscope.findings.registry import NcclView, ordered, rule, run as run_rules
from rankscope.hardware import devices_link_peak_gbps
from rankscope.numbers import rounded
from rankscope.results import Finding
from rankscope.thresholds import Thresholds, resolve

if TYPE_CHECKING:  # pragma: no cover
    from rankscope.results.memory import MemoryReport
    from rankscope.results.nccl import EnvDifference, NcclRun


def _log_name(file: str) -> str:
    return PurePath(file).name


def _env_changes(run: NcclRun) -> list[EnvDifference]:
    """The NCCL_* variables of a degraded run that differ from the reference run's and can change how
    NCCL communicates (not its logging)."""
    return [d for d in run.env_vs_reference if not d.diagnostic]


def _env_text(run: NcclRun) -> str:
    """The env differences in words, for a degraded run's summary and fix ("" when none)."""
    texts = []
    for d in _env_changes(run):
        ref = _log_name(d.reference_from)
        if d.change == "set_only_here":
            texts.append(f"{d.name} is set only in the degraded run ({_log_name(run.file)}: {d.name}={d.value}; "
                         f"not set in {ref}): check or unset it")
        elif d.change == "unset_only_here":
            texts.append(f"{d.name} is set in {ref} ({d.name}={d.reference_value}) but not in the degraded run "
                         f"({_log_name(run.file)}): check whether it needs it")
        else:
            texts.append(f"{d.name} differs: {d.value} in the degraded run ({_log_name(run.file)}), "
                         f"{d.reference_value} in {ref}: check it")
    return "; ".join(texts)


def _env_evidence(run: NcclRun) -> list[dict[str, Any]]:
    return [{"name": d.name, "change": d.change, "value": d.value, "reference_value": d.reference_value,
             "reference_from": d.reference_from} for d in _env_changes(run)]


def _channels_and_transports(run: NcclRun) -> dict[str, Any]:
    return {"channels": {c.comm_id: c.coll_channels for c in run.comms},
            "transport": {f"{p.src}->{p.dst}": f"{p.via} ({p.channels} channels)" for p in run.peers},
            "nccl_env": run.log.env}


@rule("low_bus_bandwidth", reads=("nccl_busbw_pct_of_best", "busbw_low_pct_of_peak", "nccl_busbw_high_pct_of_best"),
      view=NcclView)
def low_bus_bandwidth(view: NcclView) -> Iterable[Finding]:
    """A run whose nccl-tests bus bandwidth is < `nccl_busbw_pct_of_best` of the best run's at the same
    sizes (high below `nccl_busbw_high_pct_of_best`), or whose best row is < `busbw_low_pct_of_peak` of
    the device's link peak (one host)."""
    report, run, t = view.report, view.run, view.thresholds
    vs_best = next((c for c in report.comparisons if c.kind == "busbw" and c.file == run.file), None)
    peak = devices_link_peak_gbps(run.devices)
    of_peak = (100.0 * run.peak_busbw_gbps / peak if peak and run.peak_busbw_gbps is not None and len(run.hosts) <= 1
               else None)
    low_vs_best = vs_best is not None and vs_best.pct < t["nccl_busbw_pct_of_best"]
    low_vs_peak = of_peak is not None and of_peak < t["busbw_low_pct_of_peak"]
    if not (low_vs_best or low_vs_peak):
        return
    best = next((r for r in report.runs if r.file == report.best_run), None)
    parts = []
    if low_vs_best:
        # a busbw comparison is made only against the best run, one of the runs (analyses/inputs/nccl.py)
        assert vs_best is not None and best is not None
        parts.append(f"{vs_best.pct:.0f}% of {_log_name(best.file)} ({vs_best.reference:.1f} GB/s) at the same sizes")
    if low_vs_peak:
        parts.append(f"best row {run.peak_busbw_gbps:.1f} GB/s = {of_peak:.0f}% of the {peak:.0f} GB/s link peak")
    env = _env_text(run)
    yield Finding(
        id="low_bus_bandwidth",
        severity=("high" if low_vs_best and vs_best is not None and vs_best.pct < t["nccl_busbw_high_pct_of_best"]
                  else "medium"),
        ranks=vs_best.ranks if vs_best else [], steps=[],
        summary=(f"{_log_name(run.file)}: bus bandwidth {run.avg_busbw_gbps:.1f} GB/s, " + "; ".join(parts)
                 + (f"; environment differs: {', '.join(d.name for d in _env_changes(run))}" if env else "")),
        evidence={"file": run.file, "busbw_gbps": rounded(run.avg_busbw_gbps, 2),
                  "peak_busbw_gbps": rounded(run.peak_busbw_gbps, 2),
                  "best_run": report.best_run, "best_busbw_gbps": rounded(best.avg_busbw_gbps, 2) if best else None,
                  "pct_of_best": rounded(vs_best.pct, 1) if vs_best else None,
                  "device": run.devices[0] if run.devices else None,
                  "link_peak_gbps": peak, "pct_of_link_peak": rounded(of_peak, 1),
                  **_channels_and_transports(run),
                  "best_run_channels": _channels_and_transports(best)["channels"] if best else None,
                  "env_differences": _env_evidence(run)},
        explanation=("Bus bandwidth (nccl-tests) normalizes a collective's speed to the links; a run far below "
                     "another on the same machines, or far below the link peak, has lost links, channels or "
                     "its transport."),
        fix=((f"{env}; then " if env else "")
             + "compare the transports and channel counts of the two logs (`rankscope nccl HEALTHY.log SLOW.log`); "
             "check `nvidia-smi nvlink --status` / `nvidia-smi topo -m` for down NVLinks, a NCCL_TOPO_FILE or "
             "NCCL_P2P_DISABLE / NCCL_MAX_NCHANNELS left in the environment"),
        threshold={k: t[k] for k in ("nccl_busbw_pct_of_best", "busbw_low_pct_of_peak")})


@rule("degraded_nccl_link", reads=("nccl_degraded_pct_of_peers", "nccl_degraded_high_pct_of_peers"), view=NcclView)
def degraded_nccl_link(view: NcclView) -> Iterable[Finding]:
    """A communicator with fewer collective channels, or a GPU->GPU link NCCL sees slower, than
    `nccl_degraded_pct_of_peers` of its best peer (high below `nccl_degraded_high_pct_of_peers`), or a
    rank pair on a slower transport than its peers."""
    report, run, t = view.report, view.run, view.thresholds
    limit = t["nccl_degraded_pct_of_peers"]
    mine = [c for c in report.comparisons if c.file == run.file]
    issues = ([c for c in mine if c.kind in ("channels", "link") and c.pct < limit]
              + [c for c in mine if c.kind == "transport" and c.value < c.reference])
    if not issues:
        return
    texts = []
    for c in issues:
        if c.kind == "channels":
            texts.append(f"{c.subject} has {c.value:.0f} collective channels, {c.pct:.0f}% of the "
                         f"{c.reference:.0f} in {_log_name(c.reference_from)}")
        elif c.kind == "link":
            where = ("its reverse direction" if c.reference_from == "this run"
                     else f"the same pair in {_log_name(c.reference_from)}")
            texts.append(f"NCCL sees {c.subject} ({c.detail['type']}) at {c.value:g} GB/s, {c.pct:.0f}% of "
                         f"the {c.reference:g} GB/s of {where}")
        else:
            texts.append(f"{c.subject} ({c.detail['kind']}) where peers in {_log_name(c.reference_from)} use "
                         f"{c.detail['best_kind']}")
    ranks = sorted({r for c in issues for r in c.ranks})
    comm_ranks = sorted({r for comm in run.log.comms.values() for r in comm.ranks})
    env = _env_text(run)
    if env:
        texts.append(f"environment differs: {', '.join(d.name for d in _env_changes(run))}")
    yield Finding(
        id="degraded_nccl_link",
        severity="high" if min(c.pct for c in issues) < t["nccl_degraded_high_pct_of_peers"] else "medium",
        ranks=ranks or comm_ranks, steps=[],
        summary=f"{_log_name(run.file)}: " + "; ".join(texts),
        evidence={"file": run.file, **_channels_and_transports(run),
                  "issues": [{"kind": c.kind, "subject": c.subject, "value": rounded(c.value, 2),
                              "reference": rounded(c.reference, 2), "reference_from": c.reference_from,
                              "pct": rounded(c.pct, 1), **c.detail} for c in issues],
                  "env_differences": _env_evidence(run)},
        explanation=("NCCL sizes its channels to the link bandwidth it detects: a link it sees slower (a down "
                     "NVLink, a PCIe fallback) or a slower transport (SHM or the network instead of P2P) than its "
                     "peers caps every collective that crosses it."),
        fix=((f"{env}; then " if env else "")
             + "`nvidia-smi nvlink --status` and `nvidia-smi topo -m` on that host (reseat / replace the bridge, "
             "reset the GPU); unset NCCL_TOPO_FILE, NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, NCCL_MIN/MAX_NCHANNELS "
             "unless meant; check ACS / IOMMU settings that block P2P"),
        threshold={"nccl_degraded_pct_of_peers": limit})


# ----------------------------------------------------------------------------------------------
# CUDA memory snapshots
@dataclass
class MemorySnapshotView:
    """What the memory-snapshot rules read: one snapshot's report and the thresholds in force."""
    report: MemoryReport
    thresholds: Thresholds


def memory_snapshot_findings(reports: list[MemoryReport], thresholds: Mapping[str, float] | None = None,
                             ) -> list[Finding]:
    """Findings of CUDA memory snapshots, each judged on its own, ordered by severity; `thresholds`:
    overrides by name or the resolved values in force, by default the defaults."""
    t = thresholds if isinstance(thresholds, Thresholds) else resolve(thresholds)
    return ordered([f for r in reports for f in run_rules(MemorySnapshotView(r, t))])


_JUDGED_AT = {"peak_allocated": "when allocated memory peaked (replayed from the allocation history)",
              "snapshot": "at the snapshot (no allocation history, so the peak is unknown)"}


@rule("memory_fragmentation", reads=("fragmentation_pct", "fragmentation_min_mb"), view=MemorySnapshotView)
def snapshot_fragmentation(view: MemorySnapshotView) -> Iterable[Finding]:
    """A device of a memory snapshot whose reserved but unallocated memory when allocated memory
    peaks (the allocation history's peak; without a history, the segments at the snapshot) is >=
    `fragmentation_pct` of the memory reserved then and >= `fragmentation_min_mb`."""
    t = view.thresholds
    hits = [(d, dj) for d in view.report.devices if (dj := d.judged) is not None
            and dj.pct_of_reserved >= t["fragmentation_pct"]
            and dj.free_cached / BYTES_PER_MB >= t["fragmentation_min_mb"]]
    if not hits:
        return
    worst, j = max(hits, key=lambda h: h[1].free_cached)
    name = PurePath(view.report.file).name
    expandable = str(view.report.allocator_settings.get("expandable_segments", "")).lower() in ("true", "1")
    yield Finding(
        id="memory_fragmentation", severity="medium", ranks=[], steps=[],
        summary=(f"{name}: {j.free_cached / BYTES_PER_MB:.0f} MB ({j.pct_of_reserved:.0f}%) of the "
                 f"{j.reserved / BYTES_PER_MB:.0f} MB reserved on cuda:{worst.device} is cached but not allocated "
                 f"{_JUDGED_AT[j.at]} (fragmentation: reserved - allocated then)"),
        evidence={"file": view.report.file,
                  "devices": {f"cuda:{d.device}": {
                      "judged_at": dj.at, "reserved_mb": rounded(dj.reserved / BYTES_PER_MB, 1),
                      "allocated_mb": rounded(dj.allocated / BYTES_PER_MB, 1),
                      "fragmentation_mb": rounded(dj.free_cached / BYTES_PER_MB, 1),
                      "fragmentation_pct_of_reserved": rounded(dj.pct_of_reserved, 1),
                      "largest_free_block_at_snapshot_mb": rounded(d.largest_free_block / BYTES_PER_MB, 1),
                      "free_blocks_at_snapshot": d.free_blocks} for d, dj in hits},
                  "allocator_settings": {k: view.report.allocator_settings[k] for k in
                                         ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments", "max_split_size")
                                         if k in view.report.allocator_settings}},
        explanation=("The caching allocator keeps freed blocks reserved; with varying tensor sizes they split into "
                     "pieces too small to reuse, so a large part of the pool sits cached and unusable while the job "
                     "needs the most memory, and the next larger request grows the pool or runs out of memory."),
        fix=(("expandable_segments is already on: keep shapes static (pad or bucket sequence lengths), allocate "
              "the largest buffers first and reuse them" if expandable else
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of splitting); "
              "keep shapes static (pad or bucket sequence lengths)")
             + "; call torch.cuda.empty_cache() only between phases (after evaluation, before a larger-batch "
               "phase), never inside the step; max_split_size_mb:<MB> keeps large cached blocks from being split"),
        threshold=dict(t), cost_ms_per_step=None)
