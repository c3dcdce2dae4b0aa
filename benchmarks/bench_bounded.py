#!/usr/bin/env python3
"""Bounded parsing (issue 16 D/E): time against input size for the inputs that used to be quadratic,
and the cost of a cache key.

* Kineto JSON with one whitespace run of N MB between two events (``--ws-mb``, default 4 16 64):
  read_kineto time; the 16/4 ratio is at most ~4 for a linear reader (it was ~9 when each chunk
  searched the whole buffer for the last event boundary).
* An NCCL log of one line of N bytes (``--line-kb``, default 200 2000), plain and behind an NCCL
  prefix: read_nccl_log time (a 200 KB line took 202 s with the backtracking host pattern).
* ``content_key`` of a ``--key-mb`` (default 200) MB file: best of 20 (the key reads 2 MiB).

Files are written to a temporary folder and removed. Run with the project venv:
``.venv/bin/python benchmarks/bench_bounded.py [--ws-mb 4 16 64 128] [--line-kb 200 2000]``
"""
from __future__ import annotations

import argparse
import json
import os
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ws-mb", type=int, nargs="*", default=[4, 16, 64])
    ap.add_argument("--line-kb", type=int, nargs="*", default=[200, 2000])
    ap.add_argument("--key-mb", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as d:
        tmp = Path(d)
        ws = whitespace(tmp, args.ws_mb)
        if 4 in ws and 16 in ws:
            print(f"whitespace time ratio 16 MB / 4 MB: {ws[16] / ws[4]:.1f} (linear: ~4)")
        nccl_line(tmp, args.line_kb)
        key_cost(tmp, args.key_mb)


if __name__ == "__main__":
    main()
