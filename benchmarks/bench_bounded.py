#!/usr/bin/env python3
"""Bounded parsing (issue 16 D/E): time against input size for the inputs that used to be quadratic,
and the cost of a cache key.

* Kineto JSON with one whitespace run of N MB between two events (``--ws-mb``, default 4 16 64):
  read_kineto time; the 16/4 ratio is at most ~4 for a linear reader (it was ~9 when each chunk
  searched the whole buffer for the last event boundary).
* An NCCL log of one line of N bytes (``--line-kb``, default 200 2000), plain and behind an NCCL
  prefix: read_nccl_log time (a 200 KB line took 202 s with the backtracking host pattern).
* ``content_key`` of a ``--key-mb`` (default 200) MB file: best of 20 (the key reads 2 MiB).

Issue 34, the hostile inputs (``--hostile``, before / after in one run): the code of ``--before``
(default: the git ref ``prep``) is checked out in a temporary git worktree beside this one (the built
C extensions copied in when its C sources are the same), and each case runs in a fresh interpreter on
each side, timed, with its peak RSS (VmHWM) and a limit of ``--timeout`` s (a case past it is
stopped and shown as "> T"):

* a kernel name of ``cutlass_`` repeated to 320 KB / 10 MB then ``_reduction``: its Tensor Core
  rule (`tensor_core_rule`);
* 100,000 and 300,000 distinct kernel names (a kernel each): `analyze` of the one-rank trace;
* a gzip file whose one kernel name has 100 MB: `read_kineto` (refused after, at the 16 MiB event cap);
* an Nsight Systems export of 500,000 kernels and their launches (``benchmarks/make_nsys_set.py``),
  and of 5,000,000 after only (``--nsys-kernels``): `read_nsys_sqlite`, peak RSS as a multiple of the
  file's size.

Files are written to a temporary folder and removed. Run with the project venv:
``.venv/bin/python benchmarks/bench_bounded.py [--ws-mb 4 16 64 128] [--line-kb 200 2000]``
``.venv/bin/python benchmarks/bench_bounded.py --hostile [--before prep] [--timeout 300]``
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from rankscope.ingest.cache import content_key
from rankscope.ingest.kineto import read_kineto
from rankscope.ingest.nccl_log import read_nccl_log


def _event(i: int) -> bytes:
    return json.dumps({"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10 * i,
                       "dur": 5}).encode()


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def whitespace(tmp: Path, sizes: list[int]) -> dict[int, float]:
    out = {}
    for mb in sizes:
        path = tmp / f"ws{mb}.json"
        with open(path, "wb") as f:
            f.write(b'{"traceEvents": [' + _event(0) + b",")
            for _ in range(mb):
                f.write(b" \n" * (1 << 19))
            f.write(_event(1) + b"]}")
        out[mb] = _timed(lambda: read_kineto(path))
        assert len(read_kineto(path)[0].events) == 2
        path.unlink()
        print(f"kineto, {mb:5d} MB of whitespace between two events: {out[mb]:7.2f} s")
    return out


def nccl_line(tmp: Path, sizes_kb: list[int]) -> None:
    header = "mew0:64904:64904 [0] NCCL INFO NCCL version 2.27.7+cuda13.0\n"
    for kb in sizes_kb:
        for kind, line in (("plain", "a" * (kb * 1000)), ("NCCL", "mew0:1:1 [0] NCCL INFO " + "1" * (kb * 1000))):
            path = tmp / "nccl.log"
            path.write_text(header + line + "\n")
            print(f"nccl log, one {kind} line of {kb:5d} KB: {_timed(lambda: read_nccl_log(path)):7.3f} s")
            path.unlink()


def key_cost(tmp: Path, mb: int) -> None:
    path = tmp / "big.bin"
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(os.urandom(1 << 20))
    best = min(_timed(lambda: content_key(path)) for _ in range(20))
    print(f"content_key of a {mb} MB file: {best * 1000:.2f} ms (best of 20)")
    path.unlink()


# ---------------------------------------------------------------------------------------------
# Issue 34: before / after in one run
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: Each case: (label, snippet run in a fresh interpreter on FILE, whose result line it prints).
_CUTLASS = "from rankscope.analyses.rank.kernels import tensor_core_rule\nr = tensor_core_rule(open(FILE).read())"
_ANALYZE = "from rankscope import api\nr = api.analyze(FILE, engine='inprocess', use_cache=False).usable"
_READ_KINETO = ("from rankscope.ingest.kineto import read_kineto\nfrom rankscope.ingest import TraceError\n"
                "try:\n    r = read_kineto(FILE)[0].events.height\nexcept TraceError as exc:\n    r = str(exc)[:60]")
_READ_NSYS = "from rankscope.ingest.nsys_sqlite import read_nsys_sqlite\nr = read_nsys_sqlite(FILE)[0].events.height"
_RUNNER = """
import re, sys, time
FILE = sys.argv[1]
start = time.perf_counter()
{snippet}
elapsed = time.perf_counter() - start
peak = int(re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10
print(elapsed, peak, repr(r)[:60])
"""


def _tree(ref: str, tmp: Path) -> Path:
    """The code of git ref `ref` in a temporary worktree (removed at the end of the run); the C
    extensions built here are copied in when the C sources did not change since `ref`."""
    import shutil
    import subprocess
    tree = tmp / f"before-{ref}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), ref], check=True,
                   capture_output=True)
    changed = subprocess.run(["git", "-C", str(ROOT), "diff", "--name-only", ref, "--", "src/*.c", "src/*.h"],
                             capture_output=True, text=True, check=True).stdout.split()
    if changed:
        print(f"warning: C sources changed since {ref} ({', '.join(changed)}): its pure-Python fallbacks run")
    else:
        for built in (ROOT / "src").rglob("*.so"):
            shutil.copy(built, tree / built.relative_to(ROOT))
    return tree


def _remove_tree(tree: Path) -> None:
    import subprocess
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def _run_case(src: Path, snippet: str, path: Path, timeout: float) -> tuple[float | None, int | None, str]:
    """(seconds, peak RSS bytes, result) of `snippet` on `path` in a fresh interpreter running the
    code in `src`; (None, None, why) past `timeout` or on a failure."""
    import subprocess
    env = {**os.environ, "PYTHONPATH": str(src), "RANKSCOPE_CACHE_DIR": str(path.parent / "cache")}
    try:
        proc = subprocess.run([sys.executable, "-c", _RUNNER.format(snippet=snippet), str(path)], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=path.parent)
    except subprocess.TimeoutExpired:
        return None, None, f"> {timeout:g} s (stopped)"
    if proc.returncode != 0:
        return None, None, (proc.stderr.strip().splitlines() or ["failed"])[-1][:70]
    seconds, peak, result = proc.stdout.split(" ", 2)
    return float(seconds), int(peak), result.strip()


def _cutlass_name(path: Path, n_bytes: int) -> None:
    path.write_text("cutlass_" * (n_bytes // 8) + "_reduction")


def _distinct_names_trace(path: Path, n: int) -> None:
    """One rank: a step, then n kernels of n distinct names, each with its launch."""
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU", "numSms": 100}], '
                '"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": [')
        f.write('{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, '
                f'"dur": {10 * n + 100}}}')
        for i in range(n):
            f.write(f', {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
                    f'"ts": {10 * i + 1}, "dur": 1, "args": {{"correlation": {i + 1}}}}}, {{"ph": "X", "cat": '
                    f'"kernel", "name": "void gemm_kernel_{i}<float, 128>(Params)", "pid": 0, "tid": 7, '
                    f'"ts": {10 * i + 3}, "dur": 5, "args": {{"device": 0, "stream": 7, "correlation": {i + 1}}}}}')
        f.write("]}")


def _long_name_gzip(path: Path, name_mb: int) -> None:
    import zlib
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(z.compress(b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "'))
        for _ in range(name_mb):
            f.write(z.compress(b"a" * (1 << 20)))
        f.write(z.compress(b'", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]}') + z.flush())


def hostile(tmp: Path, before_ref: str, timeout: float, nsys_kernels: list[int], nsys_before_max: int) -> None:
    sys_path = ROOT / "src"
    before = _tree(before_ref, tmp)
    cases: list[tuple[str, str, object, bool]] = []        # (label, snippet, make(path), run before)
    for kb in (320, 10 * 1024):
        cases.append((f"cutlass_ name, {kb:,} KB", _CUTLASS, lambda p, kb=kb: _cutlass_name(p, kb << 10), True))
    for n in (100_000, 300_000):
        cases.append((f"{n:,} distinct kernel names", _ANALYZE, lambda p, n=n: _distinct_names_trace(p, n), True))
    cases.append(("gzip file, one 100 MB name", _READ_KINETO, lambda p: _long_name_gzip(p, 100), True))
    sys.path.insert(0, str(HERE))
    from make_nsys_set import corpus_dir, make_nsys_set
    for n in nsys_kernels:
        cases.append((f"Nsight export, {n:,} kernels", _READ_NSYS,
                      lambda p, n=n: make_nsys_set(p, n, corpus_dir()), n <= nsys_before_max))
    print(f"{'case':34s} {'before (' + before_ref + ')':>24s} {'after':>24s}  ratio  result after")
    try:
        for label, snippet, make, run_before in cases:
            path = tmp / ("case.sqlite" if "Nsight" in label else "case.json.gz" if "gzip" in label else "case.json")
            make(path)
            old = _run_case(before / "src", snippet, path, timeout) if run_before else (None, None, "not run")
            new = _run_case(sys_path, snippet, path, timeout)
            size = path.stat().st_size
            path.unlink()

            def shown(r) -> str:
                seconds, peak, result = r
                if seconds is None:
                    return result[:24]
                return f"{seconds:7.2f} s {peak / 2**20:7,.0f} MiB" + (f" {peak / size:4.1f}x" if "Nsight" in label else "")
            ratio = f"{old[0] / new[0]:6.1f}x" if old[0] and new[0] else "     -"
            print(f"{label:34s} {shown(old):>24s} {shown(new):>24s} {ratio}  {new[2][:40]}", flush=True)
    finally:
        _remove_tree(before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ws-mb", type=int, nargs="*", default=[4, 16, 64])
    ap.add_argument("--line-kb", type=int, nargs="*", default=[200, 2000])
    ap.add_argument("--key-mb", type=int, default=200)
    ap.add_argument("--hostile", action="store_true", help="the issue-34 cases, before and after (only those)")
    ap.add_argument("--before", default="prep", help="git ref of the code to compare with (--hostile)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a case may run on one side (--hostile)")
    ap.add_argument("--nsys-kernels", type=int, nargs="*", default=[500_000, 5_000_000])
    ap.add_argument("--nsys-before-max", type=int, default=1_000_000,
                    help="larger Nsight exports run after only (before: ~2 GB of RSS per 1M kernels)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as d:
        tmp = Path(d)
        if args.hostile:
            hostile(tmp, args.before, args.timeout, args.nsys_kernels, args.nsys_before_max)
            return
        ws = whitespace(tmp, args.ws_mb)
        if 4 in ws and 16 in ws:
            print(f"whitespace time ratio 16 MB / 4 MB: {ws[16] / ws[4]:.1f} (linear: ~4)")
        nccl_line(tmp, args.line_kb)
        key_cost(tmp, args.key_mb)


if __name__ == "__main__":
    main()
