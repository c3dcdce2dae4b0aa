"""rankscope.capture on real multi-process jobs: torchrun + gloo on CPU, real torch, no mocks.

Each test launches `python -m torch.distributed.run --nproc-per-node N this_file.py WORKER OUT` (the
`__main__` block at the bottom is the training script) and checks what the ranks wrote. Expected
values come from the job the test itself launched (world size, the rank it made slow), the
profiler schedule (wait 1 + warmup 1 + active 3: ProfilerStep#2..#4), a plain `json` reading of
the written traces, and a hand count of the model's parameters: three Linear(512, 512) layers,
3 x (512 x 512 + 512) = 787,968 float32 gradients all-reduced per step.

torch comes from `.ci/run`'s pinned `torch==2.13.0` line (a CPU wheel). Missing torch fails the run
in CI (env CI=true) and skips it, with the install line, on a developer machine.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    import torch
except ImportError:
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail("torch is missing in CI: .ci/run must `pip install torch==2.13.0`", pytrace=False)
    pytest.skip("rankscope.capture tests need torch: pip install torch==2.13.0", allow_module_level=True)

from conftest import assert_no_traceback, rankscope_cmd, x_events

from rankscope.capture._torch import finish_process_group
from rankscope.pipelines.job import analyze_job

HIDDEN = 512
PARAMS_PER_STEP = 3 * (HIDDEN * HIDDEN + HIDDEN)      # hand count, module docstring
PROFILED_STEPS = [2, 3, 4]                            # schedule(wait=1, warmup=1, active=3)
SLOW_RANK, SLEEP_S = 1, 0.05


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, *args, timeout: int = 60) -> subprocess.CompletedProcess:
    """Launch `args` (a script and its arguments, or -m module ...) on `nproc` gloo ranks."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _worker(nproc: int, name: str, out: Path) -> list[dict]:
    """Run WORKERS[name] on `nproc` ranks; each rank's JSON result, by rank."""
    _torchrun(nproc, __file__, name, out)
    return [json.loads((out / f"result.rank{r}.json").read_text()) for r in range(nproc)]


def _plain(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _allreduce_elements(doc: dict) -> list[int]:
    """Elements of every DDP gradient all-reduce (`c10d::allreduce_`, its 'Input Dims'), in order."""
    return [e["args"]["Input Dims"][0][0][0] for e in x_events(doc) if e["name"] == "c10d::allreduce_"]


# ----------------------------------------------------------------------------------------------
def test_rank_profiler_traces_load_back_with_their_ranks(tmp_path):
    import rankscope

    results = _worker(2, "profile", tmp_path)
    traces = tmp_path / "traces"
    files = sorted(traces.iterdir())
    # one file per rank, named by the rank and pid each worker reported
    assert [f.name for f in files] == [f"rank{r['rank']}.{r['pid']}.pt.trace.json.gz" for r in results]
    docs = [_plain(f) for f in files]
    for rank, doc in enumerate(docs):
        assert doc["distributedInfo"]["rank"] == rank and doc["distributedInfo"]["world_size"] == 2
        steps = sorted(int(e["name"].split("#")[1]) for e in x_events(doc) if e["name"].startswith("ProfilerStep#"))
        assert steps == PROFILED_STEPS                      # the same steps on every rank
        assert sum(_allreduce_elements(doc)) == PARAMS_PER_STEP * len(PROFILED_STEPS)

    analysis = analyze_job(traces, use_cache=False)
    assert analysis.job.ranks == [0, 1] and analysis.job.world_size == 2 and analysis.job.backend == "gloo"
    assert [s.meta.rank_source for s in analysis.summaries] == ["distributedInfo"] * 2
    assert analysis.job.steps == PROFILED_STEPS
    assert [[s.step for s in r.steps] for r in analysis.summaries] == [PROFILED_STEPS] * 2
    coll = analysis.table.collectives
    assert coll.height == len(_allreduce_elements(docs[0])) == len(_allreduce_elements(docs[1]))
    assert coll["complete"].all() and (coll["n_ranks"] == 2).all() and set(coll["type"]) == {"all_reduce"}
    assert coll["bytes"].sum() == 4 * PARAMS_PER_STEP * len(PROFILED_STEPS)


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")    # torch's note for repeat > 1: wanted here
def test_rank_profiler_without_process_group_takes_env_rank_and_a_folder_per_cycle(tmp_path, monkeypatch):
    import rankscope
    from rankscope.capture import rank_profiler

    monkeypatch.setenv("RANK", "3")
    with rank_profiler(tmp_path, wait=0, warmup=1, active=2, repeat=2) as prof:
        for _ in range(8):
            torch.randn(64, 64) @ torch.randn(64, 64)
            prof.step()
    name = f"rank3.{os.getpid()}.pt.trace.json.gz"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.gz")) == \
        [f"cycle1/{name}", f"cycle2/{name}"]
    # cycles of 3 steps (warmup 1, active 2) from step 0: cycle k records steps 3k-2 and 3k-1
    for k in (1, 2):
        steps = sorted(int(e["name"].split("#")[1]) for e in x_events(_plain(tmp_path / f"cycle{k}" / name))
                       if e["name"].startswith("ProfilerStep#"))
        assert steps == [3 * k - 2, 3 * k - 1]
    analysis = rankscope.analyze(tmp_path / "cycle2", use_cache=False)
    assert analysis.job.ranks == [3] and analysis.job.steps == [4, 5]


def test_straggler_monitor_names_the_rank_that_sleeps(tmp_path):
    results = _worker(3, "monitor", tmp_path)
    reports = [r["reports"] for r in results]
    assert len(reports[0]) == 2                             # every=4, 8 steps
    assert reports[1] == reports[0] and reports[2] == reports[0]   # the same report on every rank
    for rep in reports[0]:
        assert rep["slow_ranks"] == [SLOW_RANK]             # the rank this test made sleep
        assert rep["step_time_s"][SLOW_RANK] >= SLEEP_S     # it slept that long inside its timed block
        assert rep["window_steps"] == 4
    assert [r["log"] for r in results[1:]] == [[], []]      # only rank 0 logs
    assert len(results[0]["log"]) == 2
    assert all(f"rank {SLOW_RANK} is slow" in line for line in results[0]["log"])


def test_straggler_report_rule_by_hand():
    from rankscope.capture.monitor import straggler_report

    # 3 ranks, one 20% slower: mean 1.0667, +12.5% over it (> 10%), z = sqrt(2) = 1.41 (< 2)
    rep = straggler_report([1.0, 1.0, 1.2], step=10, window_steps=10)
    assert rep.slow_ranks == [2] and rep.pct_over_mean[2] == pytest.approx(12.5)
    assert rep.z[2] == pytest.approx(2 ** 0.5)
    # 10 ranks, one 9% slower: mean 1.009, +8.03% (< 10%), std 0.027, z = 0.081 / 0.027 = 3 (> 2)
    rep = straggler_report([1.0] * 9 + [1.09], step=10, window_steps=10)
    assert rep.slow_ranks == [9] and rep.z[9] == pytest.approx(3.0)
    assert rep.pct_over_mean[9] == pytest.approx(100 * 0.081 / 1.009)
    assert straggler_report([1.0] * 4, 10, 10).slow_ranks == []


def test_calibrate_under_torchrun_fits_a_positive_bandwidth(tmp_path):
    sizes = [4 << 10, 8 << 20, 64 << 20]                   # multiples of 4 bytes x 2 ranks: sent as given
    proc = _torchrun(2, "-m", "rankscope.capture.calibrate", "--sizes", "4K,8M,64M", "--iters", "5", "--json",
                     timeout=120)
    doc = json.loads(proc.stdout)                           # rank 0 alone prints
    assert doc["schema"] == "rankscope.calibrate/1" and doc["world_size"] == 2 and doc["backend"] == "gloo"
    assert [f["type"] for f in doc["fits"]] == ["all_reduce", "all_gather", "reduce_scatter"]
    for fit in doc["fits"]:
        assert fit["beta_gbps"] > 0 and fit["samples"] == 5 * len(sizes)
        assert [p["bytes"] for p in fit["points"]] == sizes
        times = [p["actual_us"] for p in fit["points"]]
        # the largest message (8x the middle one) takes the longest; 4 KB and 8 MB may swap on a
        # loaded machine (CI saw all_gather at 3,973 us for 4 KB and 3,950 us for 8 MB)
        assert times[-1] == max(times) and times[0] < times[-1], fit


def test_calibrate_cli_outside_torchrun_says_how_to_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    proc = subprocess.run(rankscope_cmd() + ["calibrate"], capture_output=True, text=True, env=env, timeout=60,
                          check=False)
    assert proc.returncode == 2
    assert_no_traceback(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "torchrun --nproc-per-node 4" in lines[0] and "rankscope calibrate" in lines[0]


def test_ddp_bucket_sweep_runs_every_setting(tmp_path):
    results = _worker(2, "sweep", tmp_path)
    settings = results[0]["settings"]
    assert results[1]["settings"] == settings               # the same answer on both ranks
    assert [s["bucket_cap_mb"] for s in settings] == [1, 25]
    per_step = {}
    for s in settings:
        assert s["step_time_ms_mean"] > 0 and len(s["step_time_ms_per_rank"]) == 2
        files = sorted(Path(s["trace_dir"]).iterdir())
        assert [re.match(r"rank(\d)\.\d+\.pt\.trace\.json\.gz$", f.name).group(1) for f in files] == ["0", "1"]
        elements = _allreduce_elements(_plain(files[0]))
        assert sum(elements) == PARAMS_PER_STEP * len(PROFILED_STEPS)
        per_step[s["bucket_cap_mb"]] = len(elements) / len(PROFILED_STEPS)
    # 1 MB buckets hold one 1 MiB layer each; 25 MB buckets hold the rest after DDP's 1 MiB first one
    assert per_step[1] > per_step[25]


def test_import_needs_no_torch_and_helpers_say_how_to_install(tmp_path):
    code = ("import sys; import rankscope, rankscope.capture, rankscope.cli; assert 'torch' not in sys.modules; "
            "sys.modules['torch'] = None\n"
            "from rankscope.capture import CaptureError, rank_profiler\n"
            "try:\n    rank_profiler('x')\nexcept CaptureError as e:\n    print(e)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'rankscope[torch]'" in proc.stdout


# ----------------------------------------------------------------------------------------------
# The training script each rank runs (python this_file.py WORKER OUT under torchrun)
def _mlp():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
              torch.nn.Linear(HIDDEN, HIDDEN)]
    return torch.nn.Sequential(*layers)


def _batch():
    x = torch.randn(32, HIDDEN)
    return x, x


def _train_step(model, optimizer) -> None:
    x, y = _batch()
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def _ddp():
    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def _profile_worker(out: Path) -> dict:
    from rankscope.capture import rank_profiler
    model, optimizer = _ddp()
    with rank_profiler(out / "traces") as prof:
        for _ in range(6):
            _train_step(model, optimizer)
            prof.step()
    return {"rank": torch.distributed.get_rank(), "pid": os.getpid()}


def _monitor_worker(out: Path) -> dict:
    import logging
    from dataclasses import asdict

    from rankscope.capture import StragglerMonitor
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger(f"capture-test-{os.getpid()}")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    monitor = StragglerMonitor(every=4, logger=logger)
    model, optimizer = _ddp()
    reports = []
    for _ in range(8):
        with monitor.timed():                       # this rank's own work: data + forward
            x, y = _batch()
            if torch.distributed.get_rank() == SLOW_RANK:
                time.sleep(SLEEP_S)
            loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()                             # DDP all-reduce: the others wait here
        optimizer.step()
        report = monitor.step()
        if report is not None:
            reports.append(asdict(report))
    return {"reports": reports, "log": lines}


def _sweep_worker(out: Path) -> dict:
    from rankscope.capture import ddp_bucket_sweep
    settings = ddp_bucket_sweep(_mlp, _batch, bucket_caps_mb=(1, 25), steps=3, out_dir=out / "sweep")
    return {"settings": [{**s.__dict__, "trace_dir": str(s.trace_dir)} for s in settings]}


WORKERS = {"profile": _profile_worker, "monitor": _monitor_worker, "sweep": _sweep_worker}

if __name__ == "__main__":
    name, out = sys.argv[1], Path(sys.argv[2])
    torch.distributed.init_process_group("gloo")
    try:
        result = WORKERS[name](out)
        (out / f"result.rank{torch.distributed.get_rank()}.json").write_text(json.dumps(result))
    except BaseException:
        torch.distributed.destroy_process_group()
        raise
    finish_process_group(torch)
