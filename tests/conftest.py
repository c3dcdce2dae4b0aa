"""Shared fixtures and the *independent* reference readers for the ingest tests.

Expected numbers in these tests never come from rankscope itself: they come from the trace files
read here with nothing but the standard library (`gzip`, `zlib`, `json`), from a file's own
`distributedInfo`, or from a hand count stated in the test.

The corpus (real profiler output, see ../shared/corpus/MANIFEST.md) is found at
`$RANKSCOPE_CORPUS`, default `<repo>/../shared/corpus`. A missing corpus is a test FAILURE, never
a skip: a green run without data would prove nothing.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "corpus"

#: Folders of the corpus used by several test modules (names from MANIFEST.md).
DLRM = "param-dlrm-8rank"
GLOO_HEALTHY = "cpu-gloo-4rank-healthy"
MEMORY_TIMELINE = "hta-memory-timeline"


def corpus_root() -> Path:
    return Path(os.environ.get("RANKSCOPE_CORPUS", str(DEFAULT_CORPUS)))


def corpus_missing_message() -> str:
    return (f"trace corpus not found at {corpus_root()} (set RANKSCOPE_CORPUS to the folder that holds "
            f"MANIFEST.md and the trace sets). A missing corpus fails the suite: it is never skipped.")


@pytest.fixture(scope="session")
def corpus() -> Path:
    root = corpus_root()
    if not root.is_dir() or not any(root.rglob("*.json.gz")):
        pytest.fail(corpus_missing_message(), pytrace=False)
    return root


def corpus_trace_params() -> list:
    """Every trace file of the corpus (all *.json.gz except the HTA memory timeline, which is not
    a trace), as pytest params with the path relative to the corpus as id. Computed at collection
    time; when the corpus is missing, one param that makes the test fail through `corpus`."""
    root = corpus_root()
    files = sorted(p for p in root.rglob("*.json.gz") if MEMORY_TIMELINE not in p.parts) if root.is_dir() else []
    if not files:
        return [pytest.param("<corpus missing>", id="corpus-missing")]
    return [pytest.param(str(p.relative_to(root)), id=str(p.relative_to(root))) for p in files]


def corpus_files(corpus: Path, folder: str) -> list[Path]:
    files = sorted((corpus / folder).glob("*.json.gz"))
    assert files, f"no *.json.gz in {corpus / folder}"
    return files


# ----------------------------------------------------------------------------------------------
# Independent reference: plain gzip + json
def raw_text(path: str | Path) -> bytes:
    """The file's JSON text (gunzipped with the standard library when it is gzip)."""
    data = Path(path).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


@lru_cache(maxsize=4)
def _load_json_cached(path: str, exact: bool):
    return json.loads(raw_text(path), parse_float=Decimal if exact else float)


def load_json(path: str | Path, exact: bool = False):
    """json.loads of the whole file. `exact=True` keeps floats as Decimal (their exact text), for
    comparisons of nanosecond timestamps. The result is cached: treat it as read-only, deep-copy
    (`fresh_json`) before editing."""
    return _load_json_cached(str(path), exact)


def fresh_json(path: str | Path):
    """A private, editable copy of the parsed file."""
    return json.loads(raw_text(path))


def report_json(report) -> dict:
    """A typed report (`rankscope.analyze`'s `Analysis`) as `--json` prints it, read back by the
    standard library's JSON reader: the plain data a consumer of the JSON sees."""
    import msgspec
    return json.loads(msgspec.json.encode(report))


def as_report(doc: dict):
    """The typed report of a `rankscope.analysis/1` document (plain JSON data, as `--json` printed it
    and a test may have changed it), read back as `Analysis.load` reads a saved report."""
    import msgspec
    from rankscope.results import Analysis
    return msgspec.json.decode(json.dumps(doc), type=Analysis)


def x_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]


def moved_copy(source: Path, target: Path, rank: int, days: int) -> Path:
    """`source` (a Kineto trace timed in epoch µs) written to `target` as rank `rank`, every event's
    ts moved `days` days later: the same processes (pids) recorded again, so that ingest/jobs.py keeps
    it and its source one job (a schedule's cycles: apart in time, the same processes)."""
    doc = fresh_json(source)
    doc["distributedInfo"]["rank"] = rank
    for e in doc["traceEvents"]:
        if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)):
            e["ts"] += days * 86_400 * 10**6
    return write_trace(target, doc)


def columns_frame(columns):
    """A result's column Struct (one list per column) as a polars frame, to query it."""
    import msgspec
    import polars as pl
    return pl.DataFrame(msgspec.to_builtins(columns))


def write_trace(path: Path, doc, gz: bool | None = None) -> Path:
    """Write `doc` as JSON (gzip when the name ends in .gz, unless `gz` says otherwise)."""
    text = json.dumps(doc).encode()
    if gz is None:
        gz = path.name.endswith(".gz")
    path.write_bytes(gzip.compress(text, compresslevel=1) if gz else text)
    return path


def gunzip_prefix(data: bytes) -> bytes:
    """Everything zlib can decompress from a (possibly cut or damaged) gzip stream, fed in small
    pieces so that output before a failure is kept."""
    d = zlib.decompressobj(wbits=31)
    out = []
    for i in range(0, len(data), 512):
        try:
            out.append(d.decompress(data[i:i + 512]))
        except zlib.error:
            break
    return b"".join(out)


_EVENTS_KEY = re.compile(r'"traceEvents"\s*:\s*\[')


def complete_events(text: bytes | str) -> tuple[list, int]:
    """The complete trace events a (possibly truncated) JSON trace text holds before its end: the
    elements of the "traceEvents" array that `json.JSONDecoder.raw_decode` can read whole, and the
    byte offset just after the last of them (after the array's '[' when there is none; 0 without
    the array). Independent of rankscope (standard library only)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    m = _EVENTS_KEY.search(text)
    if not m:
        return [], 0
    dec = json.JSONDecoder()
    i = end = m.end()
    events = []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            break
        try:
            e, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        events.append(e)
        end = i
    return events, len(text[:end].encode())


def complete_events_in_prefix(text: bytes | str) -> int:
    """How many complete trace events a (possibly truncated) JSON trace text holds (`complete_events`)."""
    return len(complete_events(text)[0])


def sha256_tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------------------
# A parse/summary cache shared by the tests whose subject is not the cache: the good ranks copied
# with their mtime (copy_files) are then parsed once per session, only the damaged file each time.
_SHARED: dict[str, Path] = {}


@pytest.fixture(scope="session", autouse=True)
def _shared_cache(tmp_path_factory):
    _SHARED["cache"] = tmp_path_factory.mktemp("shared-cache")


def shared_cache_dir() -> Path:
    return _SHARED["cache"]


# ----------------------------------------------------------------------------------------------
# Folders of good ranks
def copy_files(files: list[Path], dest: Path, names: list[str] | None = None) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for i, f in enumerate(files):
        target = dest / (names[i] if names else f.name)
        shutil.copy2(f, target)          # keeps the mtime: copies share cache entries (shared_cache_dir)
        out.append(target)
    return out


@pytest.fixture
def dlrm_dir(corpus: Path, tmp_path: Path) -> Path:
    """A private copy of the complete 8-rank param-dlrm set (ranks 0..7, world_size 8 per the
    files' distributedInfo)."""
    d = tmp_path / "job"
    copy_files(corpus_files(corpus, DLRM), d)
    return d


# ----------------------------------------------------------------------------------------------
# The command line, as a user runs it
def rankscope_cmd() -> list[str]:
    script = Path(sys.executable).with_name("rankscope")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rankscope"]


def run_cli(args: list[str], tmp_path: Path, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run `rankscope ARGS` in a subprocess. The default cache folder is pointed into tmp_path so
    tests never touch the user's cache; COLUMNS is wide so tables are not folded."""
    full_env = dict(os.environ)
    full_env.setdefault("RANKSCOPE_CACHE_DIR", str(tmp_path / "default-cache"))
    full_env["XDG_CACHE_HOME"] = str(tmp_path / "xdg-cache")
    full_env["COLUMNS"] = "250"
    if env:
        full_env.update(env)
    return subprocess.run(rankscope_cmd() + [str(a) for a in args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def assert_no_traceback(proc: subprocess.CompletedProcess) -> None:
    for stream, text in (("stderr", proc.stderr), ("stdout", proc.stdout)):
        assert "Traceback" not in text, f"traceback on {stream}:\n{text}"


# ----------------------------------------------------------------------------------------------
# The command line as a running process (Ctrl-C, its worker processes)
def linked_job(out: Path, copies: int) -> Path:
    """A folder of 4 generated plain-JSON ranks of ~8 MB, each hard-linked `copies` times (the links
    are read like any file, then skipped as ranks claimed twice): seconds of work, little disk."""
    from rankscope.synth import generate_job
    generate_job(out / "gen", ranks=4, steps=6, gzip=False, scale=2)
    job = out / "job"
    job.mkdir()
    for i, src in enumerate(sorted((out / "gen").glob("*.pt.trace.json")) * copies):
        os.link(src, job / f"rank{i}.pt.trace.json")
    return job


def start_cli(args: list, env: dict | None = None) -> subprocess.Popen:
    """The CLI in its own process group, so that a Ctrl-C (`ctrl_c`) reaches it and its workers."""
    return subprocess.Popen(rankscope_cmd() + [str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)


def ctrl_c(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it; then the outcome."""
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_for(proc: subprocess.Popen, ready, poll_s: float = 0.02) -> bool:
    """Until `ready()`, or the process ends, or 60 s pass (`ready()` asked every `poll_s`): whether
    it became ready."""
    deadline = time.monotonic() + 60
    while not (done := ready()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(poll_s)
    return done


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, `pid` first (read from /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def reading(pids: list[int], folder: Path) -> bool:
    """Whether one of `pids` has a file of `folder` open."""
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd).startswith(str(folder)):
                    return True
            except OSError:
                pass
    return False
