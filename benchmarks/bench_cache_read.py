#!/usr/bin/env python3
"""Cached reads before and after the cache's checks (issue 34): what a hit costs once every cached
file is opened without following links or blocking and checked (format, CRC-32) on read.

One rank of ``--mb`` MB (default 200: the time-replicated real A100 rank of ``make_scale_set.py``)
and a copy of the 4-rank CPU gloo job of the corpus are parsed into a fresh cache by each version,
then read back from it, side by side in this one run, each version in its own fresh subprocess:

* ``frames``  : ``Cache.get`` of the big rank (its 6 parquet frames read, and after: checked);
* ``summary`` : ``Cache.get_blob`` + decode of the big rank's per-rank summary (what a cached
  ``analyze`` reads per rank);
* ``meta``    : ``Cache.get_meta`` of the big rank (what a cached ``validate`` reads per rank);
* ``analyze`` / ``validate``: the cached command line on the 4-rank job (wall, fresh process).

Best of ``--repeat`` (default 15) calls within each process; the command lines: median of
``--repeat`` runs (wall, and CPU time of the process tree, less sensitive to a busy machine), the two
versions' runs alternating. The "before" version is a source tree given with ``--before`` (e.g. made with
``mkdir /tmp/before && git archive prep | tar -x -C /tmp/before``; its C extensions are copied from
this tree where it has none: same C sources).
Also printed: the checksum's own speed on the big rank's frame bytes (ISA-L's CRC-32 against
zlib's CRC-32 and Adler-32).

Run with the project venv:
``.venv/bin/python benchmarks/bench_cache_read.py --before /tmp/before [--mb 200] [--repeat 15]``
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import make_scale_set  # noqa: E402

PROBE = r"""
import json, sys, time
from pathlib import Path
from rankscope.analyses import code_fingerprint
from rankscope.ingest import Cache, load_rank
from rankscope.ingest.cache import content_key
from rankscope.pipelines.job import _summary, _Task, decode_summary
rank, cache_dir, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
_summary(_Task(rank, cache_dir, True))           # parse, summarise and cache (not timed)
key = content_key(rank)
blob = f"summary-{code_fingerprint()}.msgpack"

def best(fn):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        assert fn() is not None
        times.append(time.perf_counter() - start)
    return min(times) * 1e3

print(json.dumps({"frames": best(lambda: Cache(cache_dir).get(key, rank)),
                  "summary": best(lambda: decode_summary(Cache(cache_dir).get_blob(key, blob))),
                  "meta": best(lambda: Cache(cache_dir).get_meta(key, rank))}))
"""


def _env(src: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if src is not None:
        env["PYTHONPATH"] = str(src / "src")
    env["RANKSCOPE_NO_WORKER_PROCESS"] = "1"
    return env


def _before_tree(before: Path) -> Path:
    """`before` with the C extensions of this tree copied in where it has none (same C sources)."""
    for so in (ROOT / "src").rglob("*.so"):
        there = before / so.relative_to(ROOT)
        if not there.exists() and there.with_suffix("").with_suffix(".c").exists():
            shutil.copy2(so, there)
    return before


def _probe(src: Path | None, rank: Path, cache: Path, repeat: int) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(rank), str(cache), str(repeat)], env=_env(src),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _run(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall, CPU of the process and its children) seconds of one run of `cmd`."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def _cli(versions: dict[str, Path | None], args: list[str], cache: Path, repeat: int) -> dict[str, tuple]:
    """(median wall, median CPU) ms of the cached command line, per version; the versions' runs
    alternate so that the load of the machine weighs on both alike."""
    cmds = {label: [sys.executable, "-m", "rankscope", *args, "--cache-dir", str(cache / label)] for label in versions}
    for label, src in versions.items():
        subprocess.run(cmds[label], env=_env(src), capture_output=True, check=True)      # fills the cache
    runs: dict[str, list] = {label: [] for label in versions}
    for _ in range(repeat):
        for label, src in versions.items():
            runs[label].append(_run(cmds[label], _env(src)))
    return {label: tuple(statistics.median(r[k] for r in rs) * 1e3 for k in (0, 1)) for label, rs in runs.items()}


def _checksums(cache: Path, repeat: int) -> dict:
    from isal import isal_zlib
    data = b"".join(p.read_bytes() for p in cache.rglob("*.parquet"))
    rows = {}
    for name, fn in (("isal crc32", isal_zlib.crc32), ("zlib crc32", zlib.crc32), ("zlib adler32", zlib.adler32)):
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn(data)
            times.append(time.perf_counter() - start)
        rows[name] = (min(times) * 1e3, len(data) / min(times) / 1e9)
    return {"bytes": len(data), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="source tree of the version to compare with")
    ap.add_argument("--mb", type=float, default=200.0)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    before = _before_tree(args.before.resolve())
    stamp = make_scale_set.build(args.mb, 1, quiet=True)
    rank = make_scale_set.default_out(1, args.mb) / next(iter(stamp["files"]))
    job = make_scale_set.default_corpus().parents[1] / "cpu-gloo-4rank-healthy"
    versions = {"before": before, "after": None}
    with tempfile.TemporaryDirectory(prefix="bench-cache-read-") as tmp:
        results = {label: _probe(src, rank, Path(tmp) / label, args.repeat) for label, src in versions.items()}
        for command in ("analyze", "validate"):
            for label, ms in _cli(versions, [command, str(job), "--json"], Path(tmp) / "job", args.repeat).items():
                results[label][command] = ms
        checks = _checksums(Path(tmp) / "after", args.repeat)
    size = rank.stat().st_size / 1e6
    print(f"cached reads of one {size:.0f} MB rank, best of {args.repeat} (ms)")
    print(f"{'what':<10} {'before':>9} {'after':>9} {'after/before':>13}")
    for what in ("frames", "summary", "meta"):
        b, a = results["before"][what], results["after"][what]
        print(f"{what:<10} {b:>9.2f} {a:>9.2f} {a / b:>13.2f}")
    print(f"cached command line on the 4-rank gloo job, median of {args.repeat} runs: wall (CPU), ms")
    for what in ("analyze", "validate"):
        (bm, bb), (am, ab) = results["before"][what], results["after"][what]
        print(f"{what:<10} {bm:>7.0f} ({bb:.0f}) {am:>7.0f} ({ab:.0f})  {am / bm:>5.2f} ({ab / bb:.2f})")
    print(f"checksum of the rank's {checks['bytes'] / 1e6:.1f} MB of frames:")
    for name, (ms, gbps) in checks["rows"].items():
        print(f"  {name:<13} {ms:>7.2f} ms  {gbps:>6.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
