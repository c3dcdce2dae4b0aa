"""The job: `generate_job` (simulate every rank, write its trace file, then ground_truth.json), the
ground truth (true per-rank values, stragglers and their cost, `expected_findings`), and `demo_job_dir`."""
from __future__ import annotations

import errno
import gc
import os
import re
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path

import msgspec
import numpy as np

from rankscope.files import RefusedTarget, atomic_write_bytes, output_folder
from rankscope.synth.constants import (
    BASE_TIME_NS,
    BUS_BANDWIDTH_GBPS,
    DEFAULT_LAYERS,
    GENERATOR,
    GENERATOR_VERSION,
    GROUND_TRUTH_FILE,
    GROUND_TRUTH_SCHEMA,
    TRACE_ORIGIN_NS,
)
from rankscope.synth.faults import (
    _STRAGGLER_CAUSE_BY_KIND,
    Injection,
    _JobFaults,
    _makes_straggler,
    _normalized,
    _plan_faults,
    _RankFaults,
)
from rankscope.synth.kineto import _encode_trace, _gzip_bytes, _trace_events, _trace_header, _trace_id
from rankscope.synth.model import build_program
from rankscope.synth.program import Program
from rankscope.synth.program_changes import _rank_programs
from rankscope.synth.simulation import Cycle, _RankSim, _simulate_rank, _simulate_timing, _Timeline


_TRACE_FILE = re.compile(r"^rank\d+\.\d+\.pt\.trace\.json(\.gz)?$")


def generate_job(out_dir: str | Path, ranks: int = 8, steps: int = 6, seed: int = 0,
                 injections: list[Injection] | None = None, gzip: bool = True, scale: float = 1.0,
                 cycle: Cycle = Cycle()) -> dict:
    """Write one trace file per rank + ground_truth.json into out_dir; return the ground-truth dict.

    `scale` multiplies the model's layers (events per step; 12 gives ~50 MB ranks) for benchmarks.
    Trace files of an earlier job in out_dir (rank*.pt.trace.json[.gz]) are replaced.

    Ground truth (schema rankscope.ground_truth/1): seed, world_size, steps, injections (with
    defaults filled), model (layers, parameters, allreduce_nelems, bus_bandwidth_gbps) and
    expected: stragglers [{rank, cause, injection (its kind), delay_ms_per_step (injected; null but
    for the straggler kind), cost_ms_per_step (what the other ranks lost, per step)}], findings
    (docs/findings.md ids a correct analysis must emit), possible_findings (ids the same faults may cause
    downstream), comm_overlap, collectives_per_step, clock_offsets_ms {rank: ms}, truncated_ranks,
    and per_rank {rank: file, device, pid, step_time_ms, kernel_count, nccl_kernel_count,
    collective_count, memcpy_count, pageable_memcpy_count, events, clock_offset_ms, truncated}.
    Counts are of the events complete in the file. `cycle`: which profiler cycle of a run this job is
    (`rankscope.synth.runs`); its files join those of the other cycles in out_dir."""
    if ranks < 1 or steps < 1 or scale <= 0:
        raise ValueError(f"need ranks >= 1, steps >= 1, scale > 0; got ranks={ranks}, steps={steps}, scale={scale}")
    injections = [_normalized(inj, ranks) for inj in injections or []]
    faults = _plan_faults(injections, ranks)
    with _gc_paused():
        return _generate(Path(out_dir), ranks, steps, seed, injections, faults, gzip, scale, cycle)


@contextmanager
def _gc_paused():
    """The generator makes ~10^5 dicts per rank and no cycles: cyclic GC passes are pure cost."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _generate(out: Path, ranks: int, steps: int, seed: int, injections: list[Injection], faults: _JobFaults,
              gzip: bool, scale: float, cycle: Cycle) -> dict:
    program = build_program(max(1, round(DEFAULT_LAYERS * scale)))
    timeline = _simulate_timing(program, ranks, steps, seed, faults, cycle)
    healthy = [inj for inj in injections if not _makes_straggler(inj)]   # the counterfactual for straggler cost
    baseline = (_simulate_timing(program, ranks, steps, seed, _plan_faults(healthy, ranks), cycle)
                if len(healthy) < len(injections) else timeline)

    if cycle.index:                   # a later cycle of a run: beside the earlier cycles' files
        output_folder(out)
    else:
        _clear_earlier_job(out)
    per_rank = {}
    programs = _rank_programs(program, faults)
    for rank in range(ranks):
        per_rank[str(rank)] = _write_rank(out, rank, ranks, programs[rank], faults, seed, timeline, gzip, cycle)
    truth = _ground_truth(seed, ranks, steps, injections, faults, program, timeline, baseline, per_rank, cycle)
    atomic_write_bytes(out / GROUND_TRUTH_FILE, msgspec.json.format(msgspec.json.encode(truth), indent=1) + b"\n")
    return truth


def _clear_earlier_job(out: Path) -> None:
    """`out` made ready for a job (`files.output_folder`): the trace files of an earlier synthetic
    job there are removed (the new one may have fewer ranks). Trace files without the ground truth
    of this generator beside them are someone's: the folder is refused (RefusedTarget), nothing
    removed."""
    output_folder(out)
    earlier = sorted(p for p in out.iterdir() if _TRACE_FILE.match(p.name))
    if earlier and not _synthetic(out / GROUND_TRUTH_FILE):
        raise RefusedTarget(errno.EEXIST, f"holds trace files that rankscope synth did not write ({earlier[0].name}); "
                            "give an empty or new folder", str(out))
    for old in earlier:
        old.unlink()


def _synthetic(truth: Path) -> bool:
    """Whether `truth` is a regular file of this generator's ground truth."""
    try:
        if not stat.S_ISREG(truth.lstat().st_mode):
            return False
        return msgspec.json.decode(truth.read_bytes()).get("generator") == GENERATOR
    except (OSError, msgspec.DecodeError, AttributeError):
        return False


def _write_rank(out: Path, rank: int, world: int, program: Program, faults: _JobFaults, seed: int,
                timeline: _Timeline, gzip: bool, cycle: Cycle) -> dict:
    sim, sink = _simulate_rank(rank, world, program, faults, seed, timeline, cycle)
    events = _trace_events(sim, sink)
    written_ns = (BASE_TIME_NS + TRACE_ORIGIN_NS + cycle.offset_ns + faults.ranks[rank].clock_offset_ns
                  + sim.last_activity + 250_000_000)
    path = out / f"rank{rank}.{written_ns + 1_009 * rank}.pt.trace.json{'.gz' if gzip else ''}"
    truncated = faults.ranks[rank].truncated
    # Kineto names the temporary file it first writes: "/tmp/tmpz2k7xkjt.json" in a real trace.
    trace_name = f"/tmp/tmp{_trace_id(rank, world, seed)[:8].lower()}.json"
    text, kept = _encode_trace(_trace_header(rank, world, seed), events, trace_name, truncated)
    atomic_write_bytes(path, _gzip_bytes(text, complete=not truncated) if gzip else text)
    return _rank_truth(path, sim, events[:kept], faults.ranks[rank])


def _rank_truth(path: Path, sim: _RankSim, events: list[dict], faults: _RankFaults) -> dict:
    """True values for one rank, counted from the events that are complete in its file."""
    kernels = nccl_kernels = collectives = memcpys = pageable = 0
    for event in events:
        cat = event.get("cat")
        if cat == "kernel":
            kernels += 1
            nccl_kernels += event["name"].startswith("ncclDevKernel_")
        elif cat == "gpu_memcpy":
            memcpys += 1
            pageable += "Pageable" in event["name"]
        elif cat == "cpu_op" and event["name"] == "record_param_comms":
            collectives += 1
    return {"file": path.name, "device": sim.device, "pid": sim.pid,
            "step_time_ms": [round((end - start) / 1e6, 6) for start, end in sim.step_spans],
            "kernel_count": kernels, "nccl_kernel_count": nccl_kernels, "collective_count": collectives,
            "memcpy_count": memcpys, "pageable_memcpy_count": pageable, "events": len(events),
            "clock_offset_ms": faults.clock_offset_ns / 1e6, "truncated": faults.truncated}


def _ground_truth(random_seed: int, world: int, steps: int, injections: list[Injection], faults: _JobFaults,
                  program: Program, timeline: _Timeline, baseline: _Timeline, per_rank: dict, cycle: Cycle) -> dict:
    return {
        "schema": GROUND_TRUTH_SCHEMA, "generator": GENERATOR, "generator_version": GENERATOR_VERSION,
        "random_seed": random_seed, "world_size": world, "steps": [cycle.first_step + i for i in range(steps)],
        "injections": [{"kind": inj.kind, "params": inj.params} for inj in injections],
        "model": {"layers": program.layers, "parameters": sum(b.nelems for b in program.buckets),
                  "dtype": "BFloat16", "allreduce_nelems": [b.nelems for b in program.buckets],
                  "bus_bandwidth_gbps": BUS_BANDWIDTH_GBPS},
        "expected": {
            "stragglers": [_straggler_truth(inj, timeline, baseline) for inj in injections if _makes_straggler(inj)],
            "findings": expected_findings(injections),
            "possible_findings": _possible_findings(injections),
            "comm_overlap": faults.overlap_comm,
            "collectives_per_step": len(program.buckets),
            "clock_offsets_ms": {str(r): f.clock_offset_ns / 1e6
                                 for r, f in enumerate(faults.ranks) if f.clock_offset_ns},
            "truncated_ranks": [r for r, f in enumerate(faults.ranks) if f.truncated],
            "per_rank": per_rank,
        },
    }


def _straggler_truth(inj: Injection, timeline: _Timeline, baseline: _Timeline) -> dict:
    """The late rank, its cause, the injected delay (straggler kind; null for the others) and what
    it really cost: per step, the median over the other ranks of their step-time increase against
    the same job without straggler-making injections (ms)."""
    rank = inj.params["rank"]
    others = [r for r in range(len(timeline.step_spans)) if r != rank] or [rank]
    cost_ms = []
    for step in range(len(timeline.comm_spans)):
        increases = [_span_ns(timeline.step_spans[r][step]) - _span_ns(baseline.step_spans[r][step]) for r in others]
        cost_ms.append(round(float(np.median(increases)) / 1e6, 3))
    cause = inj.params["cause"] if inj.kind == "straggler" else _STRAGGLER_CAUSE_BY_KIND[inj.kind]
    return {"rank": rank, "cause": cause, "injection": inj.kind, "delay_ms_per_step": inj.params.get("delay_ms"),
            "cost_ms_per_step": cost_ms}


def _span_ns(span: tuple[int, int]) -> int:
    return span[1] - span[0]


_FINDINGS_BY_KIND = {"no_overlap": ("exposed_communication", "low_overlap"), "fp32_gemm": ("tensor_cores_unused",)}
#: Findings the rules judge on the median rank: expected when every rank has the fault (rank="all").
_JOB_WIDE_FINDINGS = {"launch_bound": ("launch_overhead",), "pageable_memcpy": ("unpinned_memcpy",)}
_FINDINGS_BY_STRAGGLER_CAUSE = {"dataloader": ("dataloader_stall",)}
#: What the same fault causes downstream, so a correct analysis may add it. launch_bound: tiny
#: kernels can no longer hide the gradient all-reduces, and the GPU waits for the host.
_SIDE_FINDINGS = {"launch_bound": ("gpu_idle_host_bound", "exposed_communication", "low_overlap", "comm_bound",
                                   "load_imbalance")}


def expected_findings(injections: list[Injection]) -> list[str]:
    """Finding ids (docs/findings.md) a correct analysis must emit; it may add ones the same fault
    causes downstream (`_possible_findings`)."""
    found: set[str] = set()
    for inj in injections:
        found.update(_FINDINGS_BY_KIND.get(inj.kind, ()))
        if inj.params.get("rank") == "all":
            found.update(_JOB_WIDE_FINDINGS.get(inj.kind, ()))
        if _makes_straggler(inj):
            found.add("straggler_rank")
        if inj.kind == "straggler":
            found.update(_FINDINGS_BY_STRAGGLER_CAUSE.get(inj.params["cause"], ()))
    return sorted(found)


def _possible_findings(injections: list[Injection]) -> list[str]:
    """Finding ids the injected faults may cause downstream, beyond the expected ones."""
    expected = set(expected_findings(injections))
    return sorted({f for inj in injections for f in _SIDE_FINDINGS.get(inj.kind, ())} - expected)


DEMO_INJECTIONS = (Injection("straggler", {"rank": 5, "cause": "host_idle", "delay_ms": 40.0}),)


def demo_job_dir(cache_dir: Path) -> Path:
    """The demo job (8 ranks, rank 5 a host_idle straggler), generated once under cache_dir."""
    out = Path(cache_dir) / f"demo-job-v{GENERATOR_VERSION}"
    if (out / GROUND_TRUTH_FILE).exists():
        return out
    staging = out.with_name(f"{out.name}.tmp{os.getpid()}")
    generate_job(staging, ranks=8, steps=6, seed=0, injections=list(DEMO_INJECTIONS))
    try:
        staging.rename(out)
    except OSError:                 # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return out
