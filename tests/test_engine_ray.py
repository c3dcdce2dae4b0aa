"""The Ray engine, run for real on a local Ray runtime of 2 CPUs (one per module, shared by the tests).

Expected results: the local (thread pool) engine's analysis of the same files, the corpus MANIFEST
(cpu-gloo-4rank-straggler: rank 2 is the straggler) and the synth generator's ground_truth.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray          # in the test extra: a missing ray fails this module, it is never skipped

from conftest import assert_no_traceback, copy_files, corpus_files, report_json, run_cli
from rankscope.api import analyze
from rankscope.engine import RAY_MISSING, EngineError, map_ranks
from rankscope.synth import generate_job, parse_injection

STRAGGLER_SET = "cpu-gloo-4rank-straggler"


@pytest.fixture(scope="module")
def ray_runtime():
    """One local Ray runtime for the module; the engine uses it (and leaves it running) because this
    process is already connected. Yields the GCS address other drivers can connect to."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def synth_32(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synth32")
    truth = generate_job(out, ranks=32, steps=3, scale=0.2,
                         injections=[parse_injection("straggler:rank=5,cause=dataloader,delay_ms=40")])
    return out, truth


def _comparable(a) -> dict:
    """The JSON dict without what depends on how the ranks were mapped; floats to 9 significant
    digits (polars' parallel sums may differ in the last bits)."""
    d = report_json(a)
    d.pop("engine")
    for r in d["ranks"]:
        r.pop("from_cache")
    return json.loads(json.dumps(d), parse_float=lambda s: float(f"{float(s):.9g}"))


def _local_and_ray(folder: Path):
    local = analyze(folder, use_cache=False, engine="local", workers=2)
    on_ray = analyze(folder, use_cache=False, engine="ray")
    assert local.engine == "local" and on_ray.engine == "ray"
    return _comparable(local), _comparable(on_ray)


def test_ray_equals_local_on_corpus_set(ray_runtime, corpus):
    local, on_ray = _local_and_ray(corpus / STRAGGLER_SET)
    assert on_ray == local
    assert on_ray["job"]["ranks"] == [0, 1, 2, 3]
    assert [s["rank"] for s in on_ray["stragglers"]] == [2]          # MANIFEST: rank 2 sleeps 40 ms


def test_ray_equals_local_on_generated_32_ranks(ray_runtime, synth_32):
    folder, truth = synth_32
    local, on_ray = _local_and_ray(folder)
    assert on_ray == local
    assert on_ray["job"]["ranks"] == list(range(truth["world_size"])) == list(range(32))
    expected = [(s["rank"], s["cause"]) for s in truth["expected"]["stragglers"]]
    assert [(s["rank"], s["cause"]) for s in on_ray["stragglers"]] == expected == [(5, "dataloader")]


def test_bad_file_is_one_line_and_other_ranks_still_analysed(ray_runtime, corpus, tmp_path):
    """Through the CLI, as a second driver on the module's runtime (--address)."""
    job = tmp_path / "job"
    copy_files(corpus_files(corpus, STRAGGLER_SET), job)
    (job / "broken.pt.trace.json").write_text('{"traceEvents": [')
    proc = run_cli(["analyze", job, "--json", "--no-cache", "--address", ray_runtime], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 1, proc.stderr                          # ran, one input skipped
    assert [r["rank"] for r in json.loads(proc.stdout)["ranks"]] == [0, 1, 2, 3]
    lines = [ln for ln in proc.stderr.splitlines() if "broken.pt.trace.json" in ln]
    assert len(lines) == 1 and lines[0].startswith("rankscope: "), proc.stderr


def test_a_dead_worker_loses_only_its_item(ray_runtime):
    items = [1, 2, 3, 4]
    results = map_ranks(lambda x: os._exit(3) if x == 3 else x * 10, items, engine="ray",
                        on_lost=lambda item, why: f"lost {item}: {why}")
    assert results[:2] == [10, 20] and results[3] == 40
    assert results[2].startswith("lost 3: lost on Ray: ") and "\n" not in results[2]
    with pytest.raises(EngineError, match="lost on Ray"):
        map_ranks(lambda x: os._exit(3) if x == 3 else x, items, engine="ray")


def test_progress_reports_every_item_once(ray_runtime):
    seen = []
    results = map_ranks(lambda x: x + 1, range(20), engine="ray", on_done=lambda i, r: seen.append((i, r)))
    assert results == list(range(1, 21))
    assert sorted(seen) == [(i, i + 1) for i in range(20)]


def test_without_ray_installed_one_line_error(corpus, tmp_path):
    """ray's import blocked in a fresh interpreter: the CLI says what to install, exit 2."""
    code = "import sys; sys.modules['ray'] = None; from rankscope.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "analyze", str(corpus / STRAGGLER_SET), "--engine", "ray",
                           "--no-cache"], capture_output=True, text=True, timeout=120)
    assert_no_traceback(proc)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"rankscope: {RAY_MISSING}"]
    assert RAY_MISSING == "engine ray needs `pip install 'rankscope[ray]'`"


def test_unreachable_address_one_line_error(corpus, tmp_path):
    proc = run_cli(["analyze", corpus / STRAGGLER_SET, "--no-cache", "--address", "127.0.0.1:1"], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["rankscope: cannot reach the Ray cluster at 127.0.0.1:1: "
                                                "Connection refused"]
