"""NCCL logs compared: each log is one run (e.g. nccl-tests before and after a hardware change).

Contract: `compare_nccl_logs(logs) -> NcclReport`, pure (no I/O, no thresholds). Per run: its
communicators (channel counts), its peers (transport per rank pair, summed over channels), NCCL's
own GPU-to-GPU link bandwidths, and the nccl-tests bus bandwidth. Across runs and within a run,
each of these is set against its best peer, as a percentage, for `findings.nccl_findings` to judge:

- channels: a communicator's collective channels vs the most any communicator of the same size
  (ranks, nodes) has in any run on the same devices;
- links: a GPU->GPU path's bandwidth (NCCL's topology, GB/s) vs the same GPU pair in the other
  runs and vs the reverse direction in its own run (a physical link is symmetric; paths of one
  type may differ between pairs by design, e.g. 1 vs 2 NVLinks on a DGX-1);
- transports: a rank pair's transport family vs the fastest family any other pair on one host
  uses (P2P > SHM > NET/IB > COLLNET > NET/Socket), in its run and for the same pair in other runs;
- bus bandwidth: nccl-tests busbw (out-of-place) vs the best run at the same test and message
  size, median over the sizes both ran (the best run: highest "Avg bus bandwidth").

Environment: each run's NCCL_* variables (the log's "NCCL_X set by environment to Y" lines) against
the reference run's (the best run; without bus bandwidth, the first log): the variables set only
in one of the two, or set to different values (`NcclRun.env_vs_reference`). Variables that only
change what NCCL writes (`NCCL_DEBUG*`, `NCCL_*DUMP_FILE`) are marked `diagnostic`; a degraded
run's findings name the others as a likely cause.
"""
from __future__ import annotations

import re
from collections import Counter
from statistics import median
from typing import Sequence, cast

from rankscope.ingest.nccl_log import NcclLog
from rankscope.results.nccl import CommSummary, PeerLink, EnvDifference, NcclRun, Comparison, NcclReport

#: Transport families, fastest first (NCCL's own preference order on one host, then the network).
TRANSPORT_ORDER = ("P2P", "SHM", "NET/IB", "COLLNET", "NET/Socket")


def transport_speed_rank(kind: str) -> int:
    return TRANSPORT_ORDER.index(kind) if kind in TRANSPORT_ORDER else len(TRANSPORT_ORDER)


#: NCCL variables that change only what NCCL logs or dumps, never how it communicates.
DIAGNOSTIC_ENV_PATTERN = re.compile(r"^NCCL_(DEBUG\w*|\w*DUMP\w*)$")


def summarize_log(log: NcclLog) -> NcclRun:
    bus_to_rank: dict[str, int] = {}
    host_of: dict[tuple[str, int], str] = {}
    comms, peers = [], []
    for comm in log.comms.values():
        for r in comm.ranks.values():
            bus_to_rank.setdefault(_bus_key(r.bus_id), r.rank)
            host_of[(comm.comm_id, r.rank)] = r.host
        comms.append(CommSummary(comm.comm_id, comm.nranks, comm.nnodes, comm.coll_channels, comm.p2p_channels,
                                 comm.nvls_channels, comm.collnet_channels, len(comm.rings), len(comm.trees)))
        by_pair: dict[tuple[int, int], Counter] = {}
        for t in comm.transports.values():
            by_pair.setdefault((t.src, t.dst), Counter())[(t.via, t.kind)] += 1
        for (src, dst), vias in sorted(by_pair.items()):
            (via, kind), _ = vias.most_common(1)[0]
            hosts = host_of.get((comm.comm_id, src)), host_of.get((comm.comm_id, dst))
            same = None if None in hosts else hosts[0] == hosts[1]
            peers.append(PeerLink(comm.comm_id, src, dst, same, via, kind, sum(vias.values())))
    rows = [row for test in log.perf for row in test.rows]
    avgs = [t.avg_busbw_gbps for t in log.perf if t.avg_busbw_gbps is not None]
    busbws = [b for row in rows
              for b in (row.out_of_place.busbw_gbps, row.in_place.busbw_gbps if row.in_place else None)
              if b is not None]
    return NcclRun(
        file=log.file, nccl_version=log.nccl_version, hosts=log.hosts,
        devices=sorted(set(log.devices.values())), comms=comms, peers=peers,
        gpu_links=[link for link in log.topology.values() if link.dst.startswith("GPU/")],
        bus_to_rank=bus_to_rank,
        avg_busbw_gbps=(sum(avgs) / len(avgs)) if avgs else (sum(busbws) / len(busbws) if busbws else None),
        peak_busbw_gbps=max((r.out_of_place.busbw_gbps for r in rows if r.out_of_place.busbw_gbps is not None),
                            default=None),
        nvls=any((c.nvls_channels or 0) > 0 for c in comms),
        collnet=any((c.collnet_channels or 0) > 0 and (c.nnodes or 1) > 1 for c in comms),
        log=log)


def compare_nccl_logs(logs: list[NcclLog]) -> NcclReport:
    runs = [summarize_log(log) for log in logs]
    with_busbw = [r for r in runs if r.avg_busbw_gbps is not None]
    best = max(with_busbw, key=lambda r: cast(float, r.avg_busbw_gbps)) if with_busbw else None
    comparisons = (_channels(runs) + _links(runs) + _transports(runs) + (_busbw(runs, best) if best else []))
    reference = best or (runs[0] if runs else None)
    for run in runs:
        if reference is not None and run is not reference:
            run.env_vs_reference = env_differences(run.log.env, reference.log.env, reference.file)
    return NcclReport(runs=runs, best_run=best.file if best else None, comparisons=comparisons)


def env_differences(env: dict[str, str], reference: dict[str, str], reference_from: str) -> list[EnvDifference]:
    """The NCCL_* variables set in only one of `env` and `reference`, or to different values."""
    return [EnvDifference(name, env.get(name), reference.get(name), reference_from,
                          bool(DIAGNOSTIC_ENV_PATTERN.match(name)),
                          "set_only_here" if reference.get(name) is None else
                          "unset_only_here" if env.get(name) is None else "different_value")
            for name in sorted(set(env) | set(reference)) if env.get(name) != reference.get(name)]


def _bus_key(bus: str) -> str:
    """'17000', '0000:17:00.0', 'GPU/0-17000' -> one spelling (hex, no leading zeros)."""
    bus = bus.split("-")[-1].split("/")[-1]
    if ":" in bus:                            # domain:bus:device.function
        parts = bus.replace(".", ":").split(":")
        bus = f"{int(parts[1], 16):x}{int(parts[2], 16):02x}0" if len(parts) >= 3 else bus
    try:
        return f"{int(bus, 16):x}"
    except ValueError:
        return bus


def _pct(value: float, reference: float) -> float:
    return 100.0 * value / reference if reference > 0 else 100.0


def _best(candidates: Sequence[tuple[float, str]]) -> tuple[float, str]:
    """The largest value and where it is from (the value compared is among the candidates)."""
    return max(candidates, key=lambda c: c[0])


def _channels(runs: list[NcclRun]) -> list[Comparison]:
    out = []
    for run in runs:
        for c in run.comms:
            if c.coll_channels is None:
                continue
            peers = [(float(o.coll_channels), other.file) for other in runs if _same_devices(run, other)
                     for o in other.comms if o.coll_channels is not None and (o.nranks, o.nnodes) == (c.nranks, c.nnodes)]
            ref, origin = _best(peers)
            out.append(Comparison(run.file, "channels", f"comm {c.comm_id} ({c.nranks} ranks)",
                                  [], float(c.coll_channels), ref, _origin(origin, run), _pct(c.coll_channels, ref),
                                  {"p2p_channels": c.p2p_channels, "nvls_channels": c.nvls_channels}))
    return out


def _links(runs: list[NcclRun]) -> list[Comparison]:
    out = []
    for run in runs:
        for link in run.gpu_links:
            pair = (_bus_key(link.src), _bus_key(link.dst))
            peers = [(link.bw_gbps, run.file)]
            peers += [(o.bw_gbps, run.file) for o in run.gpu_links
                      if (_bus_key(o.dst), _bus_key(o.src)) == pair and o.type == link.type]
            peers += [(o.bw_gbps, other.file) for other in runs if other is not run for o in other.gpu_links
                      if (_bus_key(o.src), _bus_key(o.dst)) == pair]
            ref, origin = _best(peers)
            ranks = [r for r in (run.bus_to_rank.get(_bus_key(link.src)), run.bus_to_rank.get(_bus_key(link.dst)))
                     if r is not None]
            out.append(Comparison(run.file, "link", f"{link.src} -> {link.dst}", ranks, link.bw_gbps, ref,
                                  _origin(origin, run), _pct(link.bw_gbps, ref),
                                  {"type": link.type, "hops": link.hops}))
    return out


def _transports(runs: list[NcclRun]) -> list[Comparison]:
    """value / reference are speed ranks counted from the slow end, so pct < 100 means slower."""
    out = []
    slowest = len(TRANSPORT_ORDER) + 1
    for run in runs:
        for p in run.peers:
            if p.same_host is False:
                continue                       # across hosts the network is the expected transport
            peers = [(slowest - transport_speed_rank(o.kind), run.file) for o in run.peers if o.same_host is not False]
            peers += [(slowest - transport_speed_rank(o.kind), other.file) for other in runs if other is not run
                      for o in other.peers if (o.src, o.dst, o.same_host) == (p.src, p.dst, p.same_host)]
            ref, origin = _best(peers)
            mine = slowest - transport_speed_rank(p.kind)
            best_kind = TRANSPORT_ORDER[slowest - int(ref)] if slowest - int(ref) < len(TRANSPORT_ORDER) else "?"
            out.append(Comparison(run.file, "transport", f"rank {p.src} -> rank {p.dst} via {p.via}",
                                  [p.src, p.dst], float(mine), float(ref), _origin(origin, run), _pct(mine, ref),
                                  {"via": p.via, "kind": p.kind, "best_kind": best_kind, "channels": p.channels}))
    return out


def _busbw(runs: list[NcclRun], best: NcclRun) -> list[Comparison]:
    best_busbw = best.avg_busbw_gbps
    assert best_busbw is not None             # the run of the highest bus bandwidth
    ref_rows = {(t.name, row.size_bytes): row.out_of_place.busbw_gbps for t in best.log.perf for row in t.rows
                if row.out_of_place.busbw_gbps is not None}
    out = []
    for run in runs:
        if run.avg_busbw_gbps is None:
            continue
        ratios = [row.out_of_place.busbw_gbps / ref_rows[(t.name, row.size_bytes)]
                  for t in run.log.perf for row in t.rows
                  if ref_rows.get((t.name, row.size_bytes)) and row.out_of_place.busbw_gbps is not None]
        pct = 100.0 * median(ratios) if ratios else _pct(run.avg_busbw_gbps, best_busbw)
        ranks = sorted({r for c in run.log.comms.values() for r in c.ranks})
        out.append(Comparison(run.file, "busbw", "nccl-tests bus bandwidth", ranks, run.avg_busbw_gbps,
                              best_busbw, _origin(best.file, run), pct,
                              {"sizes_compared": len(ratios), "peak_busbw_gbps": run.peak_busbw_gbps,
                               "reference_peak_busbw_gbps": best.peak_busbw_gbps,
                               "tests": [t.name for t in run.log.perf]}))
    return out


def _same_devices(run: NcclRun, other: NcclRun) -> bool:
    return not run.devices or not other.devices or run.devices == other.devices


def _origin(file: str, run: NcclRun) -> str:
    return "this run" if file == run.file else file
