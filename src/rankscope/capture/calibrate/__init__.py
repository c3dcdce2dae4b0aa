"""`calibrate`: measure collective latency (alpha) and bandwidth (beta) of the running job's fabric.

    torchrun --nproc-per-node 4 --no-python rankscope calibrate [--sizes 1K,1M,64M] [--json]
    torchrun --nproc-per-node 4 -m rankscope.capture.calibrate          (the same command)

Per collective and message size S (nccl-tests' S: the whole array, i.e. all_reduce's tensor,
all_gather's output, reduce_scatter's input; float32, rounded down to a multiple of 4 x ranks
bytes), after `warmup` untimed calls, each of `iters` calls is timed on its own (device synchronized
around it) and the time taken is the maximum over ranks, as nccl-tests reports. The times are
fitted with `analyses.alphabeta` (T = alpha + S / beta, the fit `rankscope analyze` applies to a
trace's collectives), so the two compare directly: a trace's fit well under the calibrated one
means the job did not get the fabric's bandwidth.
"""
from __future__ import annotations

import os

import polars as pl

from rankscope.analyses.job.alphabeta import (
    MIN_DISTINCT_SIZES,
    fit_alpha_beta,
)
from rankscope.analyses.job.matching import CollectiveTable
from rankscope.capture._torch import (
    CaptureError,
    comm_device,
    finish_process_group,
    import_torch,
    require_process_group,
    timed_calls_ns,
)
from rankscope.results import to_plain
from rankscope.results.collectives import AlphaBetaFit

OPS = ("all_reduce", "all_gather", "reduce_scatter")
DEFAULT_SIZES = tuple(1024 * 4 ** k for k in range(9))          # 1 KiB .. 64 MiB, x4
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
HOW_TO_RUN = ("torchrun --nproc-per-node 4 --no-python rankscope calibrate "
              "(or torchrun --nproc-per-node 4 -m rankscope.capture.calibrate)")
SCHEMA = "rankscope.calibrate/1"


def calibrate(sizes=DEFAULT_SIZES, iters: int = 10, ops=OPS, warmup: int = 2) -> list[AlphaBetaFit]:
    """Time `ops` at every size of `sizes` (bytes) in the initialized default process group and fit
    alpha/beta per op (module docstring). Collective: every rank must call it with the same
    arguments. Returns one `AlphaBetaFit` per op (with `points`: median time per size), on every rank."""
    _check_arguments(sizes, iters, ops, warmup)
    torch = import_torch()
    dist = require_process_group(torch, "calibrate")
    n, device = dist.get_world_size(), comm_device(torch)
    rows = []
    for op in ops:
        for size in sorted(set(sizes)):
            call, nbytes = _collective(torch, dist, op, size, n, device)
            for _ in range(warmup):
                call()
            rows += [{"type": op, "group_size": n, "bytes": nbytes, "transfer_ns": t}
                     for t in _timed_max_over_ranks(torch, dist, call, iters, device)]
    table = CollectiveTable(collectives=pl.DataFrame(rows), members=pl.DataFrame(), offsets_ns={}, unmatched=0)
    fits = {f.type: f for f in fit_alpha_beta(table, min_samples=1)}
    return [fits[op] for op in ops]


def _check_arguments(sizes, iters: int, ops, warmup: int = 0) -> None:
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(f"unknown collective {unknown[0]!r}: choose from {', '.join(OPS)}")
    if len(set(sizes)) < MIN_DISTINCT_SIZES or min(sizes) <= 0:
        raise ValueError(f"give at least {MIN_DISTINCT_SIZES} distinct positive sizes")
    if iters < 1 or warmup < 0:
        raise ValueError("iters must be >= 1 and warmup >= 0")


def _collective(torch, dist, op: str, size: int, n: int, device):
    """A no-argument call running `op` on S = `size` bytes of float32, and the S it really moves."""
    chunk = max(1, size // (4 * n))                        # float32 elements per rank's share
    if op == "all_reduce":
        buf = torch.ones(chunk * n, dtype=torch.float32, device=device)
        return (lambda: dist.all_reduce(buf)), 4 * chunk * n
    whole = torch.ones(chunk * n, dtype=torch.float32, device=device)
    part = torch.ones(chunk, dtype=torch.float32, device=device)
    if op == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return (lambda: gather(whole, part)), 4 * chunk * n
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return (lambda: scatter(part, whole)), 4 * chunk * n


def _timed_max_over_ranks(torch, dist, call, iters: int, device) -> list[int]:
    dist.barrier()
    times = timed_calls_ns(torch, device, call, iters)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return [int(t) for t in slowest.tolist()]


def calibrate_under_torchrun(sizes=DEFAULT_SIZES, iters: int = 10, ops=OPS, backend: str | None = None) -> dict | None:
    """What `rankscope calibrate` runs in each torchrun process: start the process group from
    torchrun's environment, calibrate, stop it. Returns the JSON document (schema
    rankscope.calibrate/1) on rank 0 and None on the others."""
    _check_arguments(sizes, iters, ops)
    missing = [v for v in TORCHRUN_ENV if v not in os.environ]
    if missing:
        raise CaptureError(f"calibrate must run under torchrun (no {'/'.join(missing)} in the environment): "
                           f"{HOW_TO_RUN}")
    torch = import_torch()
    dist = torch.distributed
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        fits = calibrate(sizes, iters, ops)
        doc = {"schema": SCHEMA, "backend": backend, "world_size": dist.get_world_size(), "iters": iters,
               "dtype": "float32", "time": "max over ranks per call", "fits": to_plain(fits)}
        rank = dist.get_rank()
    except BaseException:
        dist.destroy_process_group()
        raise
    finish_process_group(torch)
    return doc if rank == 0 else None


def parse_sizes(text: str) -> tuple[int, ...]:
    """'1K,64K,1M' -> bytes (K, M, G are powers of 1024; an optional 'iB' or 'B' follows)."""
    sizes = []
    for item in text.split(","):
        token = item.strip().upper().removesuffix("B").removesuffix("I")
        scale = 1 << (10 * "KMG".index(token[-1]) + 10) if token and token[-1] in "KMG" else 1
        number = token[:-1] if scale > 1 else token
        if not number.isdigit() or int(number) == 0:
            raise ValueError(f"not a size in bytes: {item.strip()!r} (examples: 4096, 64K, 1M)")
        sizes.append(int(number) * scale)
    return tuple(sizes)


def format_table(doc: dict) -> list[str]:
    """Plain text lines for the terminal."""
    lines = [(f"collective calibration: backend {doc['backend']}, {doc['world_size']} ranks, {doc['iters']} timed "
              f"calls per size ({doc['dtype']}, {doc['time']})"),
             f"{'collective':<16}{'alpha us':>10}{'beta GB/s':>11}{'busbw GB/s':>12}{'R2':>7}"]
    for f in doc["fits"]:
        lines.append(f"{f['type']:<16}{f['alpha_us']:>10.1f}{_num(f['beta_gbps'], 3):>11}"
                     f"{_num(f['busbw_gbps'], 3):>12}{_num(f['r2'], 3):>7}")
        lines += [f"  {_size(p['bytes']):>10}  {p['actual_us']:>12.1f} us measured  "
                  f"{p['predicted_us']:>12.1f} us fitted" for p in f["points"]]
    return lines


def _num(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes} B"
