#!/usr/bin/env python3
"""Two source trees give the same bytes: `validate --json` and `analyze --json` of each, cold (a fresh
cache folder) and then cached, on every set of the trace corpus, and the cache files the cold run
wrote. For a change that is meant to alter speed or memory only (benchmarks/README.md).

    python benchmarks/same_output.py BASE_TREE NEW_TREE [--python PY] [--corpus DIR] [--also DIR ...]

Each tree runs as `PY -m rankscope` with PYTHONPATH=TREE/src (its C parts built in place). Prints one
line per set and command, and exits 1 when any output, exit status or cache file differs.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def run(python: str, tree: str, command: str, target: Path, cache: Path) -> tuple[int, bytes, bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(tree) / "src")}
    p = subprocess.run([python, "-m", "rankscope", command, str(target), "--json", "--cache-dir", str(cache)],
                       capture_output=True, env=env, timeout=1800)
    return p.returncode, p.stdout, p.stderr


def files_of(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--corpus", default=os.environ.get("RANKSCOPE_CORPUS", ""))
    ap.add_argument("--also", nargs="*", default=[], help="more job folders (e.g. a benchmark set)")
    args = ap.parse_args(argv)
    sets = sorted(p for p in Path(args.corpus).iterdir() if p.is_dir()) if args.corpus else []
    sets += [Path(p) for p in args.also]
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"          # the same path for both trees: it may be named in the output
        for folder in sets:
            for command in ("validate", "analyze"):
                seen = []
                for tree in (args.base, args.new):
                    shutil.rmtree(cache, ignore_errors=True)
                    cold = run(args.python, tree, command, folder, cache)
                    seen.append((cold, files_of(cache), run(args.python, tree, command, folder, cache)))
                (cold, files, cached), (cold2, files2, cached2) = seen
                same = (cold == cold2, files == files2, cached == cached2)
                differ += not all(same)
                print(f"{'same' if all(same) else 'DIFFERENT'} {folder.name} {command}: exit {cold[0]}, "
                      f"{len(cold[1]):,} bytes of JSON, {len(files)} cache files"
                      + ("" if all(same) else f" (cold output, cache files, cached output same: {same})"))
    print(f"{2 * len(sets) - differ} of {2 * len(sets)} identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
