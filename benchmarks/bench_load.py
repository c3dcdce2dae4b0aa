#!/usr/bin/env python3
"""Load benchmark: rankscope (cold and cached) vs Holistic Trace Analysis on generated multi-rank sets.

For each size (``--mb``, default 50 and 200 MB per rank) the scale set of ``--ranks`` (default 8) ranks is
built or reused (``make_scale_set.py``), then, side by side in this one run, each in a fresh subprocess
right after the set's files are read (twice) so that every tool sees a warm page cache:

* ``rankscope cold``  : ``rankscope analyze DIR --json --cache-dir <fresh empty dir>`` (stdout -> /dev/null)
* ``rankscope cached``: the same command again on the now warm cache dir
* ``HTA``             : ``TraceAnalysis(trace_dir=DIR)`` in ``benchmarks/.venv-hta`` (created here if missing)
* ``HTA + analyses``  : with ``--hta-analyses``, the same load followed by HTA's temporal, idle-time,
                        communication/computation overlap and kernel breakdowns (what ``rankscope analyze``
                        is compared with)

Measured per run: wall time, CPU time of the whole process tree (getrusage of reaped children), peak RSS of
the whole process tree (RSS of the process + all descendants summed, polled every ``--interval`` s).
Prints a table, writes the same as JSON to ``benchmarks/results/``. See benchmarks/README.md.

Run with the project venv: ``.venv/bin/python benchmarks/bench_load.py [--mb 50 200] [--ranks 8]``
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import make_scale_set  # noqa: E402

HTA_VENV = HERE / ".venv-hta"
HTA_REQUIREMENT = "holistictraceanalysis>=0.5,<0.6"
RESULTS_DIR = HERE / "results"
MB = make_scale_set.MB

# Targets from the issue (printed next to the numbers, never asserted).
TARGET_COLD_SPEEDUP = 30.0  # cold load >= 30x faster than HTA on 8 x 200 MB
AIM_COLD_SPEEDUP = 50.0
TARGET_RSS_PER_LARGEST_FILE = 1.5  # peak RSS <= 1.5 x the largest rank file
TARGET_CACHED_S = 1.0  # cached load <= 1 s
# analyses (every per-rank and cross-rank analysis on top of the load)
TARGET_ANALYZE_PER_VALIDATE = 1.5         # analyze cold <= 1.5 x validate cold on 8 x 200 MB
TARGET_ANALYZE_PER_VALIDATE_ONE_RANK = 2.0  # one 1 GB rank: analyze cold <= 2 x its validate cold
TARGET_ANALYZE_SPEEDUP = 30.0             # analyze cold >= 30x HTA load + analyses (aim 50x)
TARGET_ANALYZE_CACHED_S = 0.5             # cached analyze <= 0.5 s on 8 x 200 MB

HTA_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
import hta.version
t1 = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
if sys.argv[2:] == ["analyses"]:
    a.get_temporal_breakdown(visualize=False)
    a.get_idle_time_breakdown(visualize=False)
    a.get_comm_comp_overlap(visualize=False)
    a.get_gpu_kernel_breakdown(visualize=False)
t3 = time.perf_counter()
traces = a.t.traces
print(json.dumps({"hta_version": ".".join(map(str, getattr(hta.version, "__version_tuple__", ()))) or "?", "import_s": t1 - t0,
                  "load_s": t2 - t1, "analyses_s": t3 - t2, "ranks": sorted(int(r) for r in traces),
                  "rows_per_rank": {str(r): int(len(df)) for r, df in traces.items()}}))
"""


# ----------------------------------------------------------------------------------------------- memory
try:
    import psutil  # type: ignore
except ImportError:  # fall back to reading /proc directly (Linux)
    psutil = None

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


HAVE_PSS = os.path.exists("/proc/self/smaps_rollup")


def _pss(pid: int) -> int:
    """Proportional set size (shared pages split between sharers), bytes; 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree_pids_proc(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, ()))
    return pids


def _tree_pids_psutil(root: int) -> list[int]:
    try:
        p = psutil.Process(root)
        return [root] + [q.pid for q in p.children(recursive=True)]
    except psutil.Error:
        return []


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return 0


def _tree_rss_psutil_one(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


_tree_pids = _tree_pids_psutil if psutil else _tree_pids_proc
# RSS straight from /proc/PID/statm (what psutil reads too, minus the object overhead); psutil elsewhere
_rss_one = _rss if os.path.exists("/proc/self/statm") else _tree_rss_psutil_one
RESCAN_EVERY = 5  # walk the process tree every 5th poll (a full /proc scan costs ~2 ms with 75 processes)
PSS_EVERY = 10  # smaps_rollup is costlier than statm; PSS is informative only
RSS_BACKEND = f"psutil {psutil.__version__}" if psutil else "/proc"


class PeakSampler(threading.Thread):
    def __init__(self, pid: int, interval: float, with_pss: bool):
        super().__init__(daemon=True)
        self.pid, self.interval, self.with_pss = pid, interval, with_pss
        self.peak = self.peak_pss = 0
        self.samples = 0
        self.cpu_s = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        t0 = time.thread_time()
        pids: list[int] = []
        n = 0
        while not self.stop.is_set():
            if n % RESCAN_EVERY == 0:
                pids = _tree_pids(self.pid) or pids
            self.peak = max(self.peak, sum(_rss_one(p) for p in pids))
            if self.with_pss and n % PSS_EVERY == 0:
                self.peak_pss = max(self.peak_pss, sum(_pss(p) for p in pids))
            n += 1
            self.stop.wait(self.interval)
        self.samples = n
        self.cpu_s = time.thread_time() - t0


def _become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux prctl PR_SET_CHILD_SUBREAPER).

    A tool whose helpers outlive their parent (multiprocessing's forkserver process is not waited for by
    Python 3.11, so its pool workers' CPU time would vanish with it) gets reparented to us; we reap it, and
    getrusage(RUSAGE_CHILDREN) then counts the CPU time of the whole tree.
    """
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER = 36
    except (OSError, AttributeError):
        return False


SUBREAPER = sys.platform.startswith("linux") and _become_subreaper()


def _reap_orphans(timeout: float = 30.0) -> None:
    """Wait for adopted descendants that are still exiting (so their CPU time is accounted)."""
    if not SUBREAPER:
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                print("warning: descendants still running after the tool exited; not waiting", file=sys.stderr)
                return
            time.sleep(0.005)


def _kill_tree(pid: int) -> None:
    if psutil is None:
        return
    try:
        for q in psutil.Process(pid).children(recursive=True):
            try:
                q.kill()
            except psutil.Error:
                pass
    except psutil.Error:
        pass


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def settle(seconds: float) -> None:
    """Before a timed run: write back what earlier runs left dirty in the page cache (rankscope's
    cache files), then wait, so that neither that writeback nor the exit of the previous tool
    (HTA frees ~4 GB) runs during the next measurement."""
    if seconds > 0:
        if hasattr(os, "sync"):
            os.sync()
        time.sleep(seconds)


def run_measured(cmd: list[str], *, env: dict | None, stdout, timeout: float, interval: float,
                 stderr_path: Path, with_pss: bool = HAVE_PSS, settle_s: float = 0.0,
                 warm: list[Path] | None = None) -> dict:
    """Run cmd in a fresh process (after `settle(settle_s)`, then `warm_page_cache(warm)`); wall, tree
    CPU seconds, tree peak RSS, rc."""
    settle(settle_s)
    if warm:
        warm_page_cache(warm)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cpu0 = _children_cpu()
    with open(stderr_path, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=err, env=env, cwd=str(ROOT))
        sampler = PeakSampler(proc.pid, interval, with_pss)
        sampler.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_tree(proc.pid)
            proc.kill()
            proc.wait()
        wall = time.perf_counter() - t0
        sampler.stop.set()
        sampler.join()
    _reap_orphans()
    cpu = _children_cpu() - cpu0
    err_text = stderr_path.read_text(errors="replace")
    return {"cmd": cmd, "rc": proc.returncode, "timed_out": timed_out, "wall_s": wall, "cpu_s": cpu,
            "peak_rss_bytes": sampler.peak, "peak_pss_bytes": sampler.peak_pss or None,
            "sampler": f"RSS every {interval} s, process tree rescanned every {RESCAN_EVERY} polls, "
                       f"PSS every {PSS_EVERY} polls" if with_pss else f"RSS every {interval} s",
            "rss_samples": sampler.samples, "sampler_cpu_s": round(sampler.cpu_s, 3),
            "traceback": "Traceback (most recent call last)" in err_text,
            "loadavg_1min_before": load_before,
            "stderr_tail": err_text.strip().splitlines()[-15:]}


def run_ok(kind: str, r: dict) -> bool:
    """rankscope: exit 0, or 1 = 'ran, some inputs skipped' (but not a Python crash, which also exits 1)."""
    if r.get("error") or r["timed_out"]:
        return False
    if kind.startswith("hta"):
        return r["rc"] == 0
    return r["rc"] == 0 or (r["rc"] == 1 and not r["traceback"])


# ----------------------------------------------------------------------------------------------- tools
def rankscope_cmd(override: str | None) -> tuple[list[str], dict]:
    env = dict(os.environ)
    if override:
        return shlex.split(override), env
    exe = ROOT / ".venv" / "bin" / "rankscope"
    if exe.exists():
        return [str(exe)], env
    found = shutil.which("rankscope")
    if found:
        return [found], env
    py = ROOT / ".venv" / "bin" / "python"
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return [str(py if py.exists() else sys.executable), "-m", "rankscope"], env


def compile_rankscope() -> None:
    """Byte-compile the rankscope package, as `pip install` does for HTA: an editable install
    (src/) under PYTHONDONTWRITEBYTECODE=1 would otherwise compile its sources on every run
    (~40 ms here), which no installed copy pays."""
    py = ROOT / ".venv" / "bin" / "python"
    code = "import compileall, os, rankscope; compileall.compile_dir(os.path.dirname(rankscope.__file__), quiet=1)"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([str(py if py.exists() else sys.executable), "-c", code], env=env, check=False)


def ensure_hta_venv() -> Path:
    """benchmarks/.venv-hta with holistictraceanalysis from PyPI; created on first use."""
    py = HTA_VENV / "bin" / "python"
    ok = py.exists() and subprocess.run([str(py), "-c", "import hta.trace_analysis"],
                                        capture_output=True).returncode == 0
    if ok:
        return py
    log = HERE / "results" / "hta-venv-install.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"creating {HTA_VENV} and installing {HTA_REQUIREMENT} (log: {log}) ...", file=sys.stderr, flush=True)
    base_python = shutil.which("python3") or sys.executable
    with open(log, "wb") as f:
        if not py.exists():
            subprocess.run([base_python, "-m", "venv", str(HTA_VENV)], stdout=f, stderr=f, check=True)
        r = subprocess.run([str(py), "-m", "pip", "install", HTA_REQUIREMENT], stdout=f, stderr=f)
    if r.returncode != 0 or subprocess.run([str(py), "-c", "import hta.trace_analysis"]).returncode != 0:
        raise SystemExit(f"could not install HTA into {HTA_VENV}; see {log}")
    return py


def warm_page_cache(files: list[Path]) -> None:
    """Read every file twice: into the page cache, and (the second access) onto the kernel's
    active list. With one read, the first rankscope run of an invocation was 0.2-0.4 s slower than
    the next two in 4 invocations of 4; with two, in none of 3. `bench_size` does it before every
    timed run: on this virtual machine the page cache loses pages of files not read for a while,
    with 16 GB free (2026-11-27: half the pages of 4 of the 8 ranks of 8 x 200 MB were gone after an
    HTA run; reading one such rank took 163 ms instead of 25 ms)."""
    buf = bytearray(1 << 22)
    for _ in range(2):
        for p in files:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


# ----------------------------------------------------------------------------------------------- runs
def bench_size(mb: float, args, rs_cmd, rs_env, hta_py) -> dict:
    name = make_scale_set.set_name(args.ranks, mb, args.keep_step_numbers)
    data_dir = Path(args.data_dir) / name if args.data_dir else make_scale_set.default_out(args.ranks, mb, args.keep_step_numbers)
    stamp = make_scale_set.build(mb, args.ranks, data_dir, keep_step_numbers=args.keep_step_numbers)
    files = sorted(data_dir / f for f in stamp["files"])
    total_bytes = sum(p.stat().st_size for p in files)
    largest = max(p.stat().st_size for p in files)
    logdir = Path(tempfile.mkdtemp(prefix="bench-load-logs-"))
    res = {"set": name, "mb_target": mb, "ranks": args.ranks, "data_dir": str(data_dir), "files": len(files),
           "total_bytes": total_bytes, "largest_file_bytes": largest, "copies_of_base": stamp.get("copies"),
           "events_per_rank": stamp.get("events_per_rank"), "runs": {"rankscope_cold": [], "rankscope_cached": [], "rankscope_analyze_cold": [],
                    "rankscope_analyze_cached": [], "hta": [], "hta_analyses": []}}
    label = name
    for rep in range(args.repeat):
        if not args.skip_rankscope:
            # load = read every rank into the cache (`validate`: parse, no analyses), as HTA's
            # TraceAnalysis(trace_dir) loads; analyze = load + every per-rank and cross-rank analysis
            caches = []
            variants = [("", rs_cmd, rs_env)] + ([("baseline_", *rankscope_cmd(args.baseline))] if args.baseline else [])
            for verb, kinds in (("validate", ("rankscope_cold", "rankscope_cached")),
                                ("analyze", ("rankscope_analyze_cold", "rankscope_analyze_cached"))):
                for prefix, command, env in variants:      # the baseline right after, under the same load
                    cache = Path(tempfile.mkdtemp(prefix="rankscope-bench-cache-"))
                    caches.append(cache)
                    cmd = command + [verb, str(data_dir), "--json", "--cache-dir", str(cache)]
                    for kind in (prefix + k for k in kinds):
                        print(f"[{label} #{rep + 1}] {kind}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
                        with open(os.devnull, "wb") as devnull:
                            r = run_measured(cmd, env=env, stdout=devnull, timeout=args.timeout,
                                             interval=args.interval, stderr_path=logdir / f"{kind}-{rep}.err",
                                             with_pss=args.pss, settle_s=args.settle, warm=files)
                        _report_run(kind, r)
                        res["runs"].setdefault(kind, []).append(r)
            cmd = rs_cmd + ["analyze", str(data_dir), "--json", "--cache-dir", str(caches[-len(variants)])]
            if not args.no_verify and run_ok("rankscope_analyze_cached", res["runs"]["rankscope_analyze_cached"][-1]):
                chk = res["rankscope_check"] = verify_rankscope(cmd, rs_env, args.timeout)
                if chk.get("error") or chk.get("n_rank_rows") != args.ranks:
                    why = chk.get("error") or f"output has {chk.get('n_rank_rows')} of {args.ranks} ranks"
                    for kind in res["runs"]:
                        if kind.startswith("rankscope") and res["runs"][kind]:
                            res["runs"][kind][-1]["error"] = f"output check: {why}"
            for cache in caches:
                shutil.rmtree(cache, ignore_errors=True)
        for kind in (["hta", "hta_analyses"] if args.hta_analyses else ["hta"]) if hta_py is not None else []:
            extra = ["analyses"] if kind == "hta_analyses" else []
            cmd = [str(hta_py), "-c", HTA_SCRIPT, str(data_dir)] + extra
            print(f"[{label} #{rep + 1}] {kind}: TraceAnalysis(trace_dir={str(data_dir)!r})"
                  + (" + temporal, idle, overlap, kernel breakdowns" if extra else ""), file=sys.stderr, flush=True)
            out_path = logdir / f"{kind}-{rep}.out"
            with open(out_path, "wb") as out:
                r = run_measured(cmd, env=dict(os.environ), stdout=out, timeout=args.timeout,
                                 interval=args.interval, stderr_path=logdir / f"{kind}-{rep}.err", with_pss=args.pss,
                                 settle_s=args.settle, warm=files)
            r["cmd"] = [str(hta_py), "-c", "<HTA_SCRIPT>", str(data_dir)] + extra
            try:
                r["hta"] = json.loads(out_path.read_text().strip().splitlines()[-1])
            except (ValueError, IndexError):
                r["hta"] = None
            if r["rc"] == 0 and (not r["hta"] or len(r["hta"]["ranks"]) != args.ranks):
                r["error"] = f"HTA parsed {len((r['hta'] or {}).get('ranks', []))} of {args.ranks} ranks"
            _report_run(kind, r)
            res["runs"][kind].append(r)
    shutil.rmtree(logdir, ignore_errors=True)
    return res


def verify_rankscope(cmd: list[str], env: dict, timeout: float) -> dict:
    """One extra, untimed cached run whose stdout is kept, to check that every rank was loaded."""
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, timeout=timeout, cwd=str(ROOT))
        _reap_orphans()
        doc = json.loads(p.stdout)
        job = doc.get("job", {})
        return {"rc": p.returncode, "schema": doc.get("schema"), "world_size": job.get("world_size"),
                "ranks": job.get("ranks"), "n_rank_rows": len(doc.get("ranks", [])),
                "warnings": job.get("warnings", [])[:5]}
    except Exception as e:  # noqa: BLE001 - a check, report whatever went wrong
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def _report_run(kind: str, r: dict) -> None:
    status = "ok" if run_ok(kind, r) else f"FAILED rc={r['rc']}"
    print(f"    -> {status}: wall {r['wall_s']:.2f} s, cpu {r['cpu_s']:.1f} s, "
          f"peak tree RSS {r['peak_rss_bytes'] / MB:.0f} MB"
          + (f", PSS {r['peak_pss_bytes'] / MB:.0f} MB" if r.get("peak_pss_bytes") else ""), file=sys.stderr, flush=True)
    if status != "ok":
        for line in r["stderr_tail"][-5:]:
            print(f"       | {line[:200]}", file=sys.stderr)
        if r.get("error"):
            print(f"       | {r['error']}", file=sys.stderr)


def summarize(res: dict, cores: dict) -> list[dict]:
    rows = []
    hta_wall = hta_rss = None
    by_kind = {}
    for kind, runs in res["runs"].items():
        good = [r for r in runs if run_ok(kind, r)]
        if not runs:
            continue
        row = {"tool": kind, "size": res["set"], "n": len(runs),
               "ok": len(good) == len(runs)}
        if good:
            walls = [r["wall_s"] for r in good]
            row["wall_s"] = statistics.median(walls)
            row["wall_min_s"] = min(walls)
            row["cpu_s"] = statistics.median(r["cpu_s"] for r in good)
            row["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in good)
            pss = [r["peak_pss_bytes"] for r in good if r.get("peak_pss_bytes")]
            row["peak_pss_bytes"] = max(pss) if pss else None
            c = cores["hta" if kind.startswith("hta") else "rankscope"]
            row["cores_assumed"] = c
            row["cores_busy"] = row["cpu_s"] / row["wall_s"]
            row["mb_per_s_per_core"] = res["total_bytes"] / MB / row["wall_s"] / c
            row["rss_per_largest_file"] = row["peak_rss_bytes"] / res["largest_file_bytes"]
            if any(r["rc"] == 1 for r in good):
                row["note"] = "rc=1 (some inputs skipped)"
        else:
            last = runs[-1]
            row["error"] = last.get("error") or (f"rc={last['rc']}" + (" (timed out)" if last["timed_out"] else "")
                                                 + ": " + (last["stderr_tail"][-1][:120] if last["stderr_tail"] else ""))
        by_kind[kind] = row
        rows.append(row)
    hta = by_kind.get("hta")
    if hta and "wall_s" in hta:
        hta_wall, hta_rss = hta["wall_s"], hta["peak_rss_bytes"]
        for row in rows:
            if "wall_s" in row:
                row["speedup_vs_hta"] = hta_wall / row["wall_s"]
                row["rss_vs_hta"] = row["peak_rss_bytes"] / hta_rss
    hta_an = by_kind.get("hta_analyses")
    if hta_an and "wall_s" in hta_an:
        for row in rows:
            if "wall_s" in row:
                row["speedup_vs_hta_analyses"] = hta_an["wall_s"] / row["wall_s"]
    return rows


def targets(results: list[dict]) -> list[str]:
    out = []
    for res in results:
        rows = {r["tool"]: r for r in res["summary"]}
        size = res["set"]
        if not rows:
            continue
        cold, cached = rows.get("rankscope_cold", {}), rows.get("rankscope_cached", {})
        tag = "" if res["mb_target"] >= 200 else "  (target is stated for 8x200 MB)"
        if "speedup_vs_hta" in cold:
            s = cold["speedup_vs_hta"]
            out.append(_verdict(f"{size}: cold load {s:.1f}x faster than HTA; target >= {TARGET_COLD_SPEEDUP:g}x "
                                f"(aim {AIM_COLD_SPEEDUP:g}x)", s >= TARGET_COLD_SPEEDUP) + tag)
        else:
            out.append(f"{size}: cold speedup vs HTA: n/a (target >= {TARGET_COLD_SPEEDUP:g}x, aim {AIM_COLD_SPEEDUP:g}x)")
        for name, row in (("cold", cold), ("cached", cached)):
            if "rss_per_largest_file" in row:
                v = row["rss_per_largest_file"]
                out.append(_verdict(f"{size}: {name} peak RSS = {v:.2f}x largest rank file; target <= "
                                    f"{TARGET_RSS_PER_LARGEST_FILE:g}x", v <= TARGET_RSS_PER_LARGEST_FILE))
        if "wall_s" in cached:
            w = cached["wall_s"]
            out.append(_verdict(f"{size}: cached load {w:.2f} s; target <= {TARGET_CACHED_S:g} s",
                                w <= TARGET_CACHED_S))
        elif cached or cold:
            out.append(f"{size}: rankscope rows failed; targets not evaluated")
        out += _analysis_targets(res, rows)
    return out


def _analysis_targets(res: dict, rows: dict) -> list[str]:
    """The targets of the fast-analysis issue: analyze against validate in the same run, against
    HTA's load + analyses, cached analyze; for one rank, analyze against its validate and memory."""
    out, size = [], res["set"]
    cold, an_cold, an_cached = (rows.get(k, {}) for k in ("rankscope_cold", "rankscope_analyze_cold",
                                                          "rankscope_analyze_cached"))
    if "wall_s" not in an_cold or "wall_s" not in cold:
        return out
    for kind in ("rankscope_cold", "rankscope_cached", "rankscope_analyze_cold", "rankscope_analyze_cached"):
        base = rows.get("baseline_" + kind, {})
        if "wall_s" in base and "wall_s" in rows.get(kind, {}):
            out.append(f"{size}: {kind} {rows[kind]['wall_s']:.2f} s against the baseline's {base['wall_s']:.2f} s "
                       f"({base['wall_s'] / rows[kind]['wall_s']:.2f}x)")
    base_cold, base_an = rows.get("baseline_rankscope_cold", {}), rows.get("baseline_rankscope_analyze_cold", {})
    if "wall_s" in base_cold and "wall_s" in base_an:
        out.append(f"{size}: baseline analyze cold = {base_an['wall_s'] / base_cold['wall_s']:.2f}x its validate cold")
    one_rank = res["ranks"] == 1
    limit = TARGET_ANALYZE_PER_VALIDATE_ONE_RANK if one_rank else TARGET_ANALYZE_PER_VALIDATE
    ratio = an_cold["wall_s"] / cold["wall_s"]
    out.append(_verdict(f"{size}: analyze cold = {ratio:.2f}x validate cold; target <= {limit:g}x", ratio <= limit))
    if one_rank:
        v = an_cold["rss_per_largest_file"]
        out.append(_verdict(f"{size}: analyze cold peak RSS = {v:.2f}x the file; target <= "
                            f"{TARGET_RSS_PER_LARGEST_FILE:g}x", v <= TARGET_RSS_PER_LARGEST_FILE))
        return out
    if "speedup_vs_hta_analyses" in an_cold:
        x = an_cold["speedup_vs_hta_analyses"]
        out.append(_verdict(f"{size}: analyze cold {x:.1f}x faster than HTA load + analyses; target >= "
                            f"{TARGET_ANALYZE_SPEEDUP:g}x (aim {AIM_COLD_SPEEDUP:g}x)", x >= TARGET_ANALYZE_SPEEDUP))
    if "wall_s" in an_cached:
        w = an_cached["wall_s"]
        out.append(_verdict(f"{size}: cached analyze {w:.2f} s; target <= {TARGET_ANALYZE_CACHED_S:g} s",
                            w <= TARGET_ANALYZE_CACHED_S))
    return out


def _verdict(what: str, met: bool) -> str:
    return f"{what}: {'PASS' if met else 'FAIL'}"


def _fmt(v, spec, missing="-"):
    return missing if v is None else format(v, spec)


def print_table(results: list[dict], tgt: list[str]) -> None:
    head = ["set", "tool", "wall s", "MB/s/core", "cores", "busy", "peak RSS MB", "RSS/file", "speedup", "RSS/HTA",
            "vs HTA+an", "(PSS MB)"]
    lines = []
    for res in results:
        for r in res["summary"]:
            if "wall_s" not in r:
                lines.append([r["size"], r["tool"], "FAILED", r.get("error", "")[:70], "", "", "", "", "", "", "", ""])
                continue
            lines.append([r["size"], r["tool"], _fmt(r["wall_s"], ".2f"), _fmt(r["mb_per_s_per_core"], ".1f"),
                          str(r["cores_assumed"]), _fmt(r["cores_busy"], ".2f"), _fmt(r["peak_rss_bytes"] / MB, ".0f"),
                          _fmt(r["rss_per_largest_file"], ".2f"), (_fmt(r.get("speedup_vs_hta"), ".1f") + "x" if r.get("speedup_vs_hta") else "-"),
                          _fmt(r.get("rss_vs_hta"), ".2f"),
                          (_fmt(r.get("speedup_vs_hta_analyses"), ".1f") + "x" if r.get("speedup_vs_hta_analyses") else "-"),
                          _fmt(r["peak_pss_bytes"] / MB if r.get("peak_pss_bytes") else None, ".0f")])
    widths = [max(len(h), *(len(l[i]) for l in lines if l[2] != "FAILED" or i < 3)) if lines else len(h)
              for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) if i >= 2 else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths))))
    print("  ".join("-" * w for w in widths))
    for l in lines:
        if l[2] == "FAILED":
            print("  ".join([l[0].ljust(widths[0]), l[1].ljust(widths[1]), "FAILED".rjust(widths[2]), " " + l[3]]))
        else:
            print("  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(l, widths))))
    for res in results:
        chk = res.get("rankscope_check")
        hta_runs = [r for r in res["runs"]["hta"] if r.get("hta")]
        size = res["set"]
        print(f"{size}: {res['files']} files, {res['total_bytes'] / MB:.0f} MB total, largest {res['largest_file_bytes'] / MB:.1f} MB, "
              f"{res['copies_of_base']} copies of the base ({res['events_per_rank']} events/rank)")
        if hta_runs:
            h = hta_runs[-1]["hta"]
            print(f"    HTA {h['hta_version']}: parsed ranks {h['ranks']}, import {h['import_s']:.1f} s, "
                  f"load {h['load_s']:.1f} s, rows/rank {sorted(set(h['rows_per_rank'].values()))}")
        for r in res["runs"]["hta_analyses"][-1:]:
            if r.get("hta"):
                print(f"    HTA + analyses: load {r['hta']['load_s']:.1f} s, analyses {r['hta']['analyses_s']:.1f} s")
        if chk:
            print(f"    rankscope check: {json.dumps(chk)[:200]}")
    print("targets (from the issue):")
    for t in tgt:
        print("    " + t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, nargs="+", default=[50.0, 200.0], help="MB per rank to run (default 50 200)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--keep-step-numbers", action="store_true",
                    help="the time-replicated copies keep the base's step numbers (fewer, longer steps)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool and size (table: median wall, max RSS)")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--hta-analyses", action="store_true",
                    help="also run HTA's load followed by its temporal, idle-time, overlap and kernel breakdowns")
    ap.add_argument("--skip-rankscope", action="store_true")
    ap.add_argument("--rankscope", default=None, help="command to run instead of the project's rankscope, e.g. 'rankscope'")
    ap.add_argument("--baseline", default=None, metavar="CMD",
                    help="another rankscope command (e.g. an older checkout: 'env PYTHONPATH=/path/to/old/src "
                         ".venv/bin/python -m rankscope') run right after each rankscope row, as baseline_* rows")
    ap.add_argument("--no-verify", action="store_true", help="skip the untimed rankscope run that checks all ranks loaded")
    ap.add_argument("--data-dir", default=None, help="where scale sets live (default benchmarks/data)")
    ap.add_argument("--interval", type=float, default=0.02, help="RSS polling interval, s (default 0.02)")
    ap.add_argument("--timeout", type=float, default=1800, help="per run, s")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="before each timed run: sync, then wait this long, s (default 2; 0: neither)")
    ap.add_argument("--no-pss", dest="pss", action="store_false",
                    help="do not also sample PSS (/proc/PID/smaps_rollup) next to RSS")
    ap.add_argument("--results", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)

    ncpu = os.cpu_count() or 1
    # rankscope: os.cpu_count() worker processes (at most one per rank); HTA 0.5: multiprocessing pool of
    # min(ranks, cpu_count) processes (hta/common/trace.py parse_multiple_ranks, ranks <= 8).
    cores = {"rankscope": min(ncpu, a.ranks), "hta": min(ncpu, a.ranks)}
    rs_cmd, rs_env = rankscope_cmd(a.rankscope)
    hta_py = None if a.skip_hta else ensure_hta_venv()
    if not a.skip_rankscope:
        compile_rankscope()

    results = []
    for mb in a.mb:
        res = bench_size(mb, a, rs_cmd, rs_env, hta_py)
        res["summary"] = summarize(res, cores)
        results.append(res)
    tgt = targets(results)
    print_table(results, tgt)

    a.results.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    git_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "src"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip())
    doc = {"benchmark": "load", "when": stamp, "git_rev": git_rev, "src_has_uncommitted_changes": dirty,
           "machine": {"cpu_count": ncpu, "platform": platform.platform(), "python": platform.python_version(),
                       "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
           "method": {"rss": f"sum of RSS over the process tree, polled every {a.interval} s ({RSS_BACKEND})",
                      "pss": "sum of PSS (smaps_rollup) over the same tree and polls, shared pages split between "
                             "sharers; informative only" if a.pss and HAVE_PSS else "not sampled",
                      "cpu": "getrusage(RUSAGE_CHILDREN) delta: user+sys of the process and its descendants"
                             + (" (this process is a child subreaper, so orphaned helpers are counted too)"
                                if SUBREAPER else " (waited-for descendants only)"),
                      "page_cache": "the set's files are read twice right before every timed run (warm page cache for every tool)",
                      "cores_assumed": cores, "mb": "1 MB = 1e6 bytes, uncompressed"},
           "rankscope_cmd": rs_cmd, "targets": tgt, "results": results}
    path = a.results / f"load-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    (a.results / "load-latest.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
