#!/usr/bin/env python3
"""Build a multi-rank scale set for load benchmarks by time-replicating one real Kineto rank.

Input: one real rank trace (default: the A100 rank 0 of ``hta-negative-queue`` in the shared corpus,
25.8 MB uncompressed, ~109k events, ProfilerStep#550..554). The corpus file is only read, never written.

Output: ``rank{r}.pt.trace.json`` for r in 0..ranks-1 (uncompressed JSON, as torch's
``tensorboard_trace_handler`` writes by default) in ``--out`` (default ``benchmarks/data/{ranks}x{mb}MB``).

How a rank file is made
-----------------------
* The base trace's events are copied ``n`` times end to end in time. ``n`` is the whole number of copies
  closest to ``--mb`` (at least 1), so the real size is ``n`` x base size (e.g. 50 -> 2 copies = 51.5 MB,
  200 -> 8 copies = 206 MB); the real sizes are printed and written to the stamp file.
* Copy ``k`` shifts every ``"ts"`` by ``k * (span + GAP_US) + jitter(rank, k)``; ``span`` is the base trace's
  first ts .. last (ts + dur). ``jitter`` is a deterministic 0..JITTER_MAX_US us per (rank, copy), so
  ranks are not byte-identical and look like ranks with a small arrival skew. A whole copy moves by one
  shift, so nesting, ordering and CPU->GPU flows inside a copy are untouched.
* Every numeric id that links events (``id`` of flow events, args ``External id``, ``correlation``,
  ``Ev Idx``, ``Sequence number``, ``Record function id``, ``Python id`` / ``Python parent id``, ...)
  is offset by ``k * id_stride`` (one stride for all of them, so equalities between fields such as
  flow ``id`` == ``correlation`` survive).
* ``ProfilerStep#N`` becomes ``ProfilerStep#(N + k * steps_per_copy)``: step numbers keep increasing.
  With ``--keep-step-numbers`` every copy keeps the base's numbers (ProfilerStep#550..554 again and
  again): the same events in fewer, longer steps, so that a cost per step shows against a cost per
  event (folder suffix ``-samesteps``).
* Trace-level events appear once: metadata (``ph: M``), the ``Iteration Start`` instant and the
  ``cat: Trace`` span (its ``dur`` stretched over all copies) come from copy 0; ``Record Window End`` is
  moved after the last copy.
* ``distributedInfo.rank = r`` and ``world_size = ranks`` (added if the base has no distributedInfo).

The base file's own text layout (Kineto's indented one-key-group-per-line style) is kept byte for
byte: events are spliced as text and only the numbers above are rewritten. Each copy is produced with
numpy and one ``str.join`` and streamed to disk, so memory stays at ~2 copies of the base text.

Regeneration is skipped when ``<out>.stamp.json`` (next to the folder, so the folder holds only traces)
matches the parameters and every file has the recorded size.

Run with the project venv (needs numpy): ``.venv/bin/python benchmarks/make_scale_set.py --mb 200 --ranks 8``
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GENERATOR_VERSION = 1
GAP_US = 1000  # idle gap between two copies, microseconds
JITTER_MAX_US = 100  # per (rank, copy) extra shift, microseconds; must stay < GAP_US
MB = 1_000_000  # corpus MANIFEST sizes are decimal MB

# Top-level event keys and args keys whose integer values are ids linking events together.
ID_KEYS = (
    "id",  # flow events (ph s/f/t): same value as the launch's correlation
    "External id",
    "correlation",
    "Ev Idx",
    "Sequence number",
    "Record function id",
    "Python id",
    "Python parent id",
    "Python module id",
)
SPECIAL_FIRST = {"Iteration Start: PyTorch Profiler"}
SPECIAL_LAST = {"Record Window End"}


def default_corpus() -> Path:
    env = os.environ.get("RANKSCOPE_CORPUS")
    base = Path(env) if env else ROOT.parent / "shared" / "corpus"
    if not base.exists():
        base = Path("/work/shared/corpus")
    return base / "hta-negative-queue" / "rank0.json.gz"


def set_name(ranks: int, mb: float, keep_step_numbers: bool = False) -> str:
    return f"{ranks}x{mb:g}MB" + ("-samesteps" if keep_step_numbers else "")


def default_out(ranks: int, mb: float, keep_step_numbers: bool = False) -> Path:
    return HERE / "data" / set_name(ranks, mb, keep_step_numbers)


def stamp_path(out: Path) -> Path:
    return out.parent / (out.name + ".stamp.json")


def read_text(path: Path) -> str:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8")


class Base:
    """The base trace split into header / events (as text spans) / tail, plus what replication needs."""

    def __init__(self, path: Path):
        self.path = path
        text = read_text(path)
        self.size = len(text.encode("utf-8"))
        m = re.search(r'"traceEvents"\s*:\s*\[', text)
        if not m:
            raise SystemExit(f"{path}: no traceEvents array: not a Kineto trace")
        dec = json.JSONDecoder()
        ws = re.compile(r"[ \t\r\n]*")
        i = ws.match(text, m.end()).end()
        spans: list[tuple[int, int, dict]] = []
        while text[i] != "]":
            obj, j = dec.raw_decode(text, i)
            spans.append((i, j, obj))
            i = ws.match(text, j).end()
            if text[i] == ",":
                i = ws.match(text, i + 1).end()
        if not spans:
            raise SystemExit(f"{path}: empty traceEvents")
        self.sep = text[spans[0][1]:spans[1][0]] if len(spans) > 1 else ",\n  "
        self.head = text[: spans[0][0]]
        self.tail = text[spans[-1][1]:]

        rep, first, last = [], [], []
        for s, e, obj in spans:
            t = text[s:e]
            name = obj.get("name")
            if obj.get("ph") == "M" or name in SPECIAL_FIRST or obj.get("cat") == "Trace":
                first.append((t, obj))
            elif name in SPECIAL_LAST:
                last.append((t, obj))
            else:
                rep.append((t, obj))
        self.first, self.last = first, last
        self.n_events = len(spans)

        tss = [o["ts"] for _, _, o in spans if isinstance(o.get("ts"), (int, float)) and o.get("ph") != "M"]
        ends = [o["ts"] + o.get("dur", 0) for _, _, o in spans
                if isinstance(o.get("ts"), (int, float)) and isinstance(o.get("dur", 0), (int, float))]
        self.t0 = min(tss)
        self.span_us = int(max(ends) - self.t0) + 1

        steps = sorted(int(o["name"][len("ProfilerStep#"):]) for _, o in rep
                       if str(o.get("name", "")).startswith("ProfilerStep#")
                       and o["name"][len("ProfilerStep#"):].isdigit())
        self.steps = steps
        self.steps_per_copy = (steps[-1] - steps[0] + 1) if steps else 0

        # Template of one copy: static chunks interleaved with integer slots.
        body = self.sep.join(t for t, _ in rep)
        keys = "|".join(re.escape(k) for k in ID_KEYS)
        slot_re = re.compile(r'(?<!\\)"(?:(ts)|(' + keys + r'))"(\s*:\s*)(-?\d+)(?![.\deE])'
                             r'|(?<!\\)"ProfilerStep#(\d+)"')
        chunks: list[str] = []
        vals: list[int] = []
        kinds: list[int] = []  # 0 ts, 1 id, 2 step
        pos = 0
        for mm in slot_re.finditer(body):
            if mm.group(5) is not None:
                start = mm.start(5)
                chunks.append(body[pos:start])
                vals.append(int(mm.group(5)))
                kinds.append(2)
                pos = mm.end(5)
            else:
                start = mm.start(4)
                chunks.append(body[pos:start])
                vals.append(int(mm.group(4)))
                kinds.append(0 if mm.group(1) else 1)
                pos = mm.end(4)
        chunks.append(body[pos:])
        self.chunks = chunks
        self.vals = np.array(vals, dtype=np.int64)
        k = np.array(kinds, dtype=np.int8)
        self.is_ts = (k == 0).astype(np.int64)
        self.is_id = (k == 1).astype(np.int64)
        self.is_step = (k == 2).astype(np.int64)
        ids = self.vals[k == 1]
        self.id_stride = int(ids.max()) + 1 if ids.size else 1

        # Cross-check the text scan against the decoded events (a wrong template = silently wrong set).
        exp_ts = exp_id = exp_step = 0
        for _, o in rep:
            if isinstance(o.get("ts"), int):
                exp_ts += 1
            exp_id += isinstance(o.get("id"), int)
            args = o.get("args") or {}
            exp_id += sum(1 for key in ID_KEYS if key != "id" and isinstance(args.get(key), int)
                          and not isinstance(args.get(key), bool))
            exp_step += str(o.get("name", "")).startswith("ProfilerStep#")
        if any(isinstance(o.get("ts"), float) for _, o in rep):
            raise SystemExit(f"{path}: float timestamps are not supported by this generator yet")
        got = (int(self.is_ts.sum()), int(self.is_id.sum()), int(self.is_step.sum()))
        if got != (exp_ts, exp_id, exp_step):
            raise SystemExit(f"{path}: template scan found (ts, ids, steps) = {got}, decoded events have "
                             f"{(exp_ts, exp_id, exp_step)}; refusing to write a wrong scale set")

        self.dist_info = None
        dm = re.search(r'"distributedInfo"\s*:\s*', self.head)
        if dm:
            obj, end = dec.raw_decode(self.head, dm.end())
            self.dist_info = (dm.end(), end, obj)

    def copies_for(self, mb: float) -> int:
        return max(1, round(mb * MB / self.size))

    def header(self, rank: int, world: int) -> str:
        if self.dist_info:
            s, e, obj = self.dist_info
            info = dict(obj)
            info["rank"] = rank
            info["world_size"] = world
            return self.head[:s] + json.dumps(info) + self.head[e:]
        m = re.search(r'"traceEvents"\s*:', self.head)
        info = json.dumps({"backend": "nccl", "rank": rank, "world_size": world})
        return self.head[: m.start()] + f'"distributedInfo": {info},\n  ' + self.head[m.start():]


def shifts_for(rank: int, copies: int, base: Base, seed: int) -> list[int]:
    rng = random.Random(f"{seed}:{rank}")
    period = base.span_us + GAP_US
    return [k * period + rng.randint(0, JITTER_MAX_US) for k in range(copies)]


def shift_event_text(text: str, obj: dict, ts_shift: int, dur_add: int = 0) -> str:
    if ts_shift and isinstance(obj.get("ts"), int):
        text = re.sub(r'("ts"\s*:\s*)(-?\d+)', lambda m: m.group(1) + str(int(m.group(2)) + ts_shift), text, count=1)
    if dur_add and isinstance(obj.get("dur"), int):
        text = re.sub(r'("dur"\s*:\s*)(\d+)', lambda m: m.group(1) + str(int(m.group(2)) + dur_add), text, count=1)
    return text


def write_rank(base: Base, path: Path, rank: int, world: int, copies: int, seed: int,
               keep_step_numbers: bool = False) -> int:
    shifts = shifts_for(rank, copies, base, seed)
    n_slots = len(base.vals)
    parts: list[str] = [None] * (2 * n_slots + 1)  # type: ignore[list-item]
    parts[0::2] = base.chunks
    tmp = path.with_name(path.name + ".tmp")
    written = 0
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        def put(s: str) -> None:
            nonlocal written
            f.write(s)
            written += len(s)  # ASCII in practice; exact byte size is taken from the file below

        put(base.header(rank, world))
        for k, shift in enumerate(shifts):
            if k:
                put(base.sep)
            new = base.vals + shift * base.is_ts + (k * base.id_stride) * base.is_id \
                + (0 if keep_step_numbers else k * base.steps_per_copy) * base.is_step
            parts[1::2] = list(map(str, new.tolist()))
            put("".join(parts))
        last_shift = shifts[-1]
        for t, o in base.first:
            # the whole-trace span ('cat: Trace') is stretched to cover every copy
            put(base.sep + shift_event_text(t, o, 0, last_shift if o.get("cat") == "Trace" else 0))
        for t, o in base.last:
            put(base.sep + shift_event_text(t, o, last_shift))
        put(base.tail)
    os.replace(tmp, path)
    return path.stat().st_size


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def build(mb: float, ranks: int, out: Path | None = None, base_path: Path | None = None,
          seed: int = 0, force: bool = False, quiet: bool = False, keep_step_numbers: bool = False) -> dict:
    """Make (or reuse) the set; returns the stamp dict (params, files, sizes)."""
    base_path = Path(base_path or default_corpus())
    out = Path(out or default_out(ranks, mb, keep_step_numbers))
    if not base_path.exists():
        raise SystemExit(f"base trace not found: {base_path} (set RANKSCOPE_CORPUS or --base)")
    params = {"generator_version": GENERATOR_VERSION, "base_sha256": file_digest(base_path),
              "mb": mb, "ranks": ranks, "seed": seed, "gap_us": GAP_US, "jitter_max_us": JITTER_MAX_US}
    if keep_step_numbers:
        params["keep_step_numbers"] = True
    sp = stamp_path(out)
    if not force and sp.exists():
        try:
            stamp = json.loads(sp.read_text())
        except ValueError:
            stamp = {}
        if stamp.get("params") == params and all(
                (out / f).is_file() and (out / f).stat().st_size == size for f, size in stamp.get("files", {}).items()
        ) and len(stamp.get("files", {})) == ranks:
            if not quiet:
                print(f"scale set {out}: up to date ({ranks} x {stamp['mb_per_rank']:.1f} MB), skipping", file=sys.stderr)
            return stamp

    t_start = time.perf_counter()
    base = Base(base_path)
    copies = base.copies_for(mb)
    out.mkdir(parents=True, exist_ok=True)
    if sp.exists():
        sp.unlink()
    for old in out.glob("rank*.pt.trace.json*"):
        old.unlink()
    files = {}
    for r in range(ranks):
        p = out / f"rank{r}.pt.trace.json"
        files[p.name] = write_rank(base, p, r, ranks, copies, seed, keep_step_numbers)
        if not quiet:
            print(f"  wrote {p} ({files[p.name] / MB:.1f} MB)", file=sys.stderr)
    stamp = {
        "params": params,
        "base": str(base_path),
        "copies": copies,
        "base_bytes": base.size,
        "base_events": base.n_events,
        "events_per_rank": len(base.first) + len(base.last) + copies * (base.n_events - len(base.first) - len(base.last)),
        "steps_per_rank": ([base.steps[0], base.steps[-1] if keep_step_numbers else
                            base.steps[0] + copies * base.steps_per_copy - 1] if base.steps else []),
        "id_stride": base.id_stride,
        "files": files,
        "total_bytes": sum(files.values()),
        "mb_per_rank": max(files.values()) / MB,
        "seconds": round(time.perf_counter() - t_start, 2),
    }
    sp.write_text(json.dumps(stamp, indent=1) + "\n")
    if not quiet:
        print(f"scale set {out}: {ranks} ranks x {copies} copies = {stamp['mb_per_rank']:.1f} MB/rank, "
              f"{stamp['total_bytes'] / MB:.0f} MB total, {stamp['seconds']} s", file=sys.stderr)
    return stamp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, nargs="+", default=[50.0, 200.0],
                    help="target uncompressed MB per rank (rounded to whole copies of the base); default 50 200")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (only with one --mb); default benchmarks/data/{ranks}x{mb}MB")
    ap.add_argument("--base", type=Path, default=None, help="base rank trace (.json or .json.gz)")
    ap.add_argument("--seed", type=int, default=0, help="jitter seed")
    ap.add_argument("--force", action="store_true", help="regenerate even if the stamp matches")
    ap.add_argument("--keep-step-numbers", action="store_true",
                    help="every copy keeps the base's step numbers (fewer, longer steps); folder suffix -samesteps")
    a = ap.parse_args(argv)
    if a.out and len(a.mb) > 1:
        ap.error("--out takes a single --mb")
    if a.ranks < 1:
        ap.error("--ranks must be >= 1")
    for mb in a.mb:
        build(mb, a.ranks, a.out, a.base, a.seed, a.force, keep_step_numbers=a.keep_step_numbers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
