"""Capture quality (docs/concepts.md "Capture quality"): the report says when its input is partial,
findings drawn from partial data say so, and `analyze` exits 1.

Expected values come from outside rankscope: a cut point and file size this test chooses and
measures (`json.JSONDecoder.raw_decode` over the cut text finds where the last complete event
ends), times read from the files with `json`, ranks from the files' own distributedInfo, and
counts of events this test writes itself (hand counts, stated where used).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.cells import cell_len

from conftest import (DLRM, GLOO_HEALTHY, assert_no_traceback, complete_events, complete_events_in_prefix, copy_files,
                      corpus_files, fresh_json, moved_copy, raw_text, run_cli, shared_cache_dir, write_trace,
                      x_events)
from tracebuilder import TraceBuilder

from rankscope import api
from rankscope.analyses.job.capture import MAX_RANK_ISSUES, job_capture
from rankscope.cli.common import EXIT_OK, EXIT_SKIPPED, exit_code
from rankscope.model import RankMeta
from rankscope.pipelines.run import analyze_cycles

CUT_NUMBER = re.compile(r"\d…|…\d")
#: Where rank 3's JSON text is cut: this share of its bytes (mid-file, inside an event).
CUT_SHARE = 0.6


def _fits_80_columns(text: str) -> None:
    for line in text.splitlines():
        assert not CUT_NUMBER.search(line), f"a number cut: {line!r}"
        assert cell_len(line) <= 80, f"{cell_len(line)} columns: {line!r}"
        assert line == line.rstrip(), f"trailing spaces: {line!r}"


def _complete_x_events(text: bytes) -> list[dict]:
    """The complete 'X' events of a cut trace text (`complete_events`: json.raw_decode, one by one)."""
    return [e for e in complete_events(text)[0] if isinstance(e, dict) and e.get("ph") == "X"]


def _capture_lines(stdout: str) -> list[str]:
    """The header's capture line (its wrapped rest joined to it), then the issue lines (indented
    by four, wrapped lines joined into one text): what follows the header starts at column 0."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("  capture: "))
    head, issues = [lines[start]], []
    for ln in lines[start + 1:]:
        if not ln.startswith("  "):
            break
        (issues if ln.startswith("    ") else head).append(ln.strip())
    return [" ".join(head)] + ([" ".join(issues)] if issues else [])


# ----------------------------------------------------------------------------------------------
@pytest.fixture
def cut_job(corpus: Path, tmp_path: Path) -> dict:
    """cpu-gloo-4rank-healthy with rank 3 (distributedInfo.rank 3) gunzipped and cut at 60% of
    its JSON text, as a plain .json file. Returns the folder and what the cut left, measured here."""
    job = tmp_path / "job"
    files = copy_files(corpus_files(corpus, GLOO_HEALTHY), job)
    (rank3,) = [f for f in files if fresh_json(f)["distributedInfo"]["rank"] == 3]
    text = raw_text(rank3)
    prefix = text[:int(len(text) * CUT_SHARE)]
    rank3.unlink()
    cut_file = job / rank3.name.removesuffix(".gz")
    cut_file.write_bytes(prefix)
    others = [x_events(fresh_json(f)) for f in files if f != rank3]
    mine = _complete_x_events(prefix)
    return {"dir": job, "file": cut_file, "size": len(prefix), "cut": complete_events(prefix)[1],
            "events": complete_events_in_prefix(prefix),
            "others_end_us": max(e["ts"] + e["dur"] for ev in others for e in ev),
            "start_us": min(e["ts"] for ev in others + [mine] for e in ev),
            "mine_end_us": max(e["ts"] + e["dur"] for e in mine)}


def test_truncated_rank_is_a_capture_issue_its_findings_are_marked_and_exit_is_1(cut_job: dict, tmp_path: Path):
    """The cut rank 3: a truncated issue naming rank 3, with the byte where its complete events end
    (raw_decode) of the file's size (60% of the original text, measured) and that share rounded down
    to 0.1%; the time its last event falls short of the other ranks' last (json: max ts + dur, all
    four files share baseTimeNanoseconds). Every finding on rank 3 (or on no rank: the whole job)
    carries partial_input [3] and the note; the others none. Exit code 1, one stderr line why."""
    html = tmp_path / "report.html"
    proc = run_cli(["analyze", cut_job["dir"], "--json", "-q", "--html", html, "--cache-dir", shared_cache_dir()],
                   tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["inputs"]["skipped"] == []          # exit 1 from the partial input alone
    cap = out["job"]["capture"]
    assert cap["complete"] is False and cap["partial"] is True and cap["partial_ranks"] == [3]
    (issue,) = [i for i in cap["issues"] if i["kind"] == "truncated"]
    assert issue["ranks"] == [3]
    pct = math.floor(1000 * cut_job["cut"] / cut_job["size"]) / 10
    assert issue["detail"].startswith(f"rank 3: file ends mid-event at byte {cut_job['cut']:,} of "
                                      f"{cut_job['size']:,} ({pct:.1f}% of the file): the {cut_job['events']:,} "
                                      f"events before the cut are used, those after it are lost"), issue["detail"]
    short_ms = float(re.search(r"its last event comes ([\d,.]+) ms before", issue["detail"]).group(1).replace(",", ""))
    assert short_ms == pytest.approx((cut_job["others_end_us"] - cut_job["mine_end_us"]) / 1e3, abs=0.051)
    share = float(re.search(r"at ([\d.]+)% of the job's time span", issue["detail"]).group(1))
    expected_share = 100 * (cut_job["mine_end_us"] - cut_job["start_us"]) / (cut_job["others_end_us"] - cut_job["start_us"])
    assert share == pytest.approx(expected_share, abs=0.11)

    marked = 0
    for f in out["findings"]:
        if 3 in f["ranks"] or not f["ranks"]:
            assert f["evidence"]["partial_input"] == [3], f
            assert f["summary"].endswith(" (from partial data: rank 3)"), f["summary"]
            marked += 1
        else:
            assert "partial_input" not in f["evidence"] and "partial data" not in f["summary"], f
    assert marked, "the cut rank gains a finding (a straggler on the clean set's data it lacks) and it is marked"

    why = [ln for ln in proc.stderr.splitlines() if "partial input" in ln]
    assert why == [why[0]] and why[0].startswith("rankscope: partial input: truncated (rank 3): "), proc.stderr
    page = html.read_text(encoding="utf-8")
    assert "PARTIAL: 1 issue" in page and f"at byte {cut_job['cut']:,} of {cut_job['size']:,}" in page


def test_truncated_rank_in_the_terminal_header_at_80_columns(cut_job: dict, tmp_path: Path):
    """Piped at 80 columns: the capture line says PARTIAL with one issue and the cut byte unbroken;
    the salvage warning is not printed again in the Warnings block (stderr still has it)."""
    proc = run_cli(["analyze", cut_job["dir"], "--cache-dir", shared_cache_dir()], tmp_path, env={"COLUMNS": "80"})
    assert_no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    _fits_80_columns(proc.stdout)
    block = _capture_lines(proc.stdout)
    assert block[0].startswith("  capture: PARTIAL: 1 issue (")
    issue = block[1]
    assert issue.startswith(f"truncated: rank 3: file ends mid-event at byte {cut_job['cut']:,} of {cut_job['size']:,}")
    assert "salvaged" not in proc.stdout
    assert f"{cut_job['file']}: file ends mid-event (truncated) at byte {cut_job['cut']}" in proc.stderr
    assert "(from partial data: rank 3)" in " ".join(proc.stdout.split())


def test_nan_dur_is_dropped_values(corpus: Path, tmp_path: Path, capsys):
    """Rank 1 of cpu-gloo-4rank-healthy with dur NaN on its first two complete events (hand count:
    2): a dropped_values issue for rank 1 that says 2 events with dur not a number; exit code 1."""
    job = tmp_path / "job"
    files = copy_files(corpus_files(corpus, GLOO_HEALTHY), job)
    (rank1,) = [f for f in files if fresh_json(f)["distributedInfo"]["rank"] == 1]
    doc = fresh_json(rank1)
    for e in x_events(doc)[:2]:
        e["dur"] = float("nan")
    write_trace(rank1, doc)
    assert b"NaN" in raw_text(rank1)
    result = api.analyze(job, cache_dir=shared_cache_dir(), engine="inprocess")
    cap = result.job.capture
    (issue,) = [i for i in cap.issues if i.kind == "dropped_values"]
    assert issue.ranks == [1] and cap.partial_ranks == [1] and cap.partial
    assert issue.detail.startswith("rank 1: 2 events dropped (2 with dur not a number): "), issue.detail
    assert exit_code(result) == EXIT_SKIPPED
    assert "partial input: dropped values (rank 1)" in capsys.readouterr().err


def _launches_without_kernels(path: Path) -> int:
    """Three steps, each with two cudaLaunchKernel (runtime), one cuLaunchKernel (driver), one
    cudaMemcpyAsync and one cudaStreamSynchronize, and no device event: 3 x 3 = 9 kernel launches
    (the copy and the synchronize are no kernel launch)."""
    b = TraceBuilder()
    for n in range(3):
        t = n * 1000.0
        b.step(n + 1, t, 900)
        b.op("aten::mm", t + 10, 300)
        b.runtime("cudaLaunchKernel", t + 20, 5)
        b.runtime("cudaLaunchKernel", t + 100, 5)
        b.runtime("cudaMemcpyAsync", t + 200, 5)
        b.runtime("cudaStreamSynchronize", t + 300, 50)
        b.events.append({"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": b.pid, "tid": b.tid,
                         "ts": t + 400, "dur": 4, "args": {"correlation": -1}})
    b.write(path)
    return 9


def test_kernel_launches_without_device_events_are_not_a_cpu_job(tmp_path: Path):
    """Kernel launches and no kernel: kernels_not_captured with the hand count, never "CPU-only"
    (terminal, JSON, HTML, stderr); exit code 1."""
    job = tmp_path / "job"
    job.mkdir()
    n = _launches_without_kernels(job / "rank0.pt.trace.json")
    html = tmp_path / "report.html"
    term = run_cli(["analyze", job, "--no-cache", "--html", html], tmp_path, env={"COLUMNS": "80"})
    as_json = run_cli(["analyze", job, "--no-cache", "--json", "-q"], tmp_path)
    for proc in (term, as_json):
        assert_no_traceback(proc)
        assert proc.returncode == 1, proc.stderr
    out = json.loads(as_json.stdout)
    (issue,) = out["job"]["capture"]["issues"]
    said = (f"{n} kernel launches recorded but no GPU activity captured (CUPTI activity missing or disabled): "
            f"device figures are unavailable")
    assert issue == {"kind": "kernels_not_captured", "ranks": [0], "detail": f"rank 0: {said}"}
    assert said in out["job"]["warnings"]
    page = html.read_text(encoding="utf-8")
    for where, text in (("terminal", term.stdout), ("stderr", term.stderr + as_json.stderr),
                        ("json", as_json.stdout), ("html", page)):
        assert not re.search(r"CPU[- ]only", text, re.IGNORECASE), f"{where} calls it a CPU job"
    _fits_80_columns(term.stdout)
    assert said in " ".join(term.stdout.split())
    assert " ".join(term.stdout.split()).count("kernel launches recorded") == 1     # the warning is not repeated


def test_launches_with_their_kernels_and_a_job_without_launches(corpus: Path, tmp_path: Path):
    """A launch with its kernel (TraceBuilder.kernel) is captured; hta-rank-non-gpu (no launch, no
    GPU event per the corpus manifest) stays a CPU-only job, complete."""
    job = tmp_path / "job"
    job.mkdir()
    b = TraceBuilder().step(1, 0, 1000).kernel("sgemm", 10, 20, 100)
    b.write(job / "rank0.pt.trace.json")
    result = analyze_cycles(job, use_cache=False, engine="inprocess")
    assert result.summaries[0].kernel_launches == 1
    assert result.job.capture.complete and result.job.capture.issues == []
    cpu = api.analyze(corpus / "hta-rank-non-gpu", use_cache=False, engine="inprocess")
    assert cpu.job.capture.complete
    assert any("CPU-only job" in w for w in cpu.job.warnings)


def test_trace_without_profiler_steps_is_no_steps_and_exit_0(tmp_path: Path):
    """Two kernels and no ProfilerStep#N: a no_steps issue (not partial data: exit 0); the header
    says complete with one note (nothing was lost) and the no-steps warning is not listed again."""
    job = tmp_path / "job"
    job.mkdir()
    TraceBuilder().kernel("sgemm", 10, 20, 100).kernel("relu", 130, 140, 50).write(job / "rank0.pt.trace.json")
    proc = run_cli(["analyze", job, "--no-cache"], tmp_path, env={"COLUMNS": "80"})
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    block = _capture_lines(proc.stdout)
    assert block[0].startswith("  capture: complete, 1 note (nothing lost")
    assert block[1].startswith("no_steps: rank 0: no ProfilerStep#N marks")
    assert "have no ProfilerStep marks" not in proc.stdout and "partial input" not in proc.stderr
    result = api.analyze(job, use_cache=False, engine="inprocess")
    cap = result.job.capture
    assert [i.kind for i in cap.issues] == ["no_steps"] and not cap.complete and not cap.partial
    assert cap.partial_ranks == []


def test_two_jobs_in_one_folder(corpus: Path, tmp_path: Path):
    """param-dlrm-8rank ranks 2 and 3 (world size 8, 2023-09) with hta-sampled-2rank's ranks 0 and 1
    (world size 128, 2023-04), ranks and world sizes read from their distributedInfo; one sampled
    file renamed with markup in its name. Not merged (issue 33): without --job, exit 2 with the jobs
    listed one line each (the file names as they are); `--job 1` analyses the sampled pair, whose
    capture says 2 of 128 ranks present (no different_jobs issue)."""
    dlrm = [f for f in corpus_files(corpus, DLRM) if fresh_json(f)["distributedInfo"]["rank"] in (2, 3)]
    sampled = corpus_files(corpus, "hta-sampled-2rank")
    job = tmp_path / "mixed"
    copy_files(dlrm + sampled, job, [f.name for f in dlrm] + ["<i>" + sampled[0].name, sampled[1].name])
    infos = [fresh_json(f)["distributedInfo"] for f in dlrm + sampled]
    assert sorted(i["rank"] for i in infos) == [0, 1, 2, 3] and sorted({i["world_size"] for i in infos}) == [8, 128]
    proc = run_cli(["analyze", job, "--json", "-q", "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("rankscope: the inputs hold 2 jobs (") and lines[0].endswith("pick one with --job N")
    assert lines[1].startswith("rankscope: job 1: world size 128, ranks 0-1 (2 files: <i>sampled_rank-0.json.gz, ")
    assert lines[2].startswith("rankscope: job 2: world size 8, ranks 2-3 (2 files: ") and len(lines) == 3
    proc = run_cli(["analyze", job, "--json", "-q", "--job", "1", "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    cap = json.loads(proc.stdout)["job"]["capture"]
    assert [i["kind"] for i in cap["issues"]] == ["ranks_missing"] and cap["coverage"] == "2 of 128 ranks present"


def test_one_job_recorded_months_apart(corpus: Path, tmp_path: Path):
    """param-dlrm-8rank's ranks 2 and 3 (world size 8, 2023-09), rank 3 renamed with markup in its
    name, and rank 2 again as rank 4 with its events moved 150 days later (the same processes: one
    job to ingest/jobs.py). A different_jobs issue says they were recorded over a day apart, every
    finding is marked with the three ranks, exit code 1 with nothing skipped; the HTML report
    escapes the file name. With --same-job the dates are a note (clock_ranges_disjoint), exit 0."""
    dlrm = {fresh_json(f)["distributedInfo"]["rank"]: f for f in corpus_files(corpus, DLRM)}
    job = tmp_path / "job"
    copy_files([dlrm[2], dlrm[3]], job, [dlrm[2].name, "<i>" + dlrm[3].name])
    moved_copy(dlrm[2], job / "moved_rank4.pt.trace.json", rank=4, days=150)
    html = tmp_path / "report.html"
    proc = run_cli(["analyze", job, "--json", "-q", "--html", html, "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["inputs"]["skipped"] == [] and [r["rank"] for r in out["ranks"]] == [2, 3, 4]
    cap = out["job"]["capture"]
    (apart,) = [i for i in cap["issues"] if i["kind"] == "different_jobs"]
    assert cap["partial"] and "clock_ranges_disjoint" not in [i["kind"] for i in cap["issues"]]
    assert apart["ranks"] == [2, 3, 4] and apart["detail"].startswith("recorded over a day apart (")
    assert "<i>" + dlrm[3].name in apart["detail"]
    assert out["findings"], "the job has findings to mark"
    for f in out["findings"]:
        assert f["evidence"]["partial_input"] == [2, 3, 4]
        assert f["summary"].endswith(" (from partial data: ranks 2-4)")
    assert "rankscope: partial input: different jobs (ranks 2-4): " in proc.stderr
    page = html.read_text(encoding="utf-8")
    assert "&lt;i&gt;" + dlrm[3].name in page and "<i>worker" not in page
    assert '<code>different_jobs</code>' in page
    proc = run_cli(["analyze", job, "--json", "-q", "--same-job", "--cache-dir", shared_cache_dir()], tmp_path)
    assert_no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    kinds = [i["kind"] for i in json.loads(proc.stdout)["job"]["capture"]["issues"]]
    assert "clock_ranges_disjoint" in kinds and "different_jobs" not in kinds


def test_clean_set_is_complete_and_exits_0(corpus: Path, tmp_path: Path):
    """cpu-gloo-4rank-healthy (real, whole files, ProfilerStep marks, no GPU by design): complete,
    no finding marked, exit code 0."""
    term = run_cli(["analyze", corpus / GLOO_HEALTHY, "--cache-dir", shared_cache_dir()], tmp_path,
                   env={"COLUMNS": "80"})
    as_json = run_cli(["analyze", corpus / GLOO_HEALTHY, "--json", "-q", "--cache-dir", shared_cache_dir()], tmp_path)
    for proc in (term, as_json):
        assert_no_traceback(proc)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
    assert _capture_lines(term.stdout)[0].startswith("  capture: complete")
    _fits_80_columns(term.stdout)
    out = json.loads(as_json.stdout)
    capture = out["job"]["capture"]
    assert capture.pop("headline").startswith("complete (no trace cut")
    assert capture == {"complete": True, "partial": False, "issues": [], "partial_ranks": [], "restated_warnings": [],
                       "coverage": None}
    assert all("partial_input" not in f["evidence"] for f in out["findings"])


def test_many_cut_ranks_are_one_issue():
    """More than MAX_RANK_ISSUES cut ranks: one truncated issue over all of them (summaries built
    here: 6 ranks of 100 events each, hand count 600)."""
    def rank(r: int) -> SimpleNamespace:
        meta = RankMeta(file=f"/job/rank{r}.json", rank=r, rank_source="distributedInfo", format="kineto",
                        salvaged=True, cut_at_byte=1000, cut_reason="file ends mid-event (truncated)",
                        size_bytes=1010, events_total=100, span_ns=(0, 10**6))
        return SimpleNamespace(rank=r, meta=meta, device_events=1, kernel_launches=1, steps_source="profiler_step")
    ranks = [rank(r) for r in range(MAX_RANK_ISSUES + 2)]
    cap = job_capture(ranks)
    (issue,) = cap.issues
    assert issue.kind == "truncated" and issue.ranks == list(range(6)) and cap.partial_ranks == list(range(6))
    assert issue.detail.startswith("ranks 0-5: 6 files cut or corrupt: the 600 events before their cuts are used")


def test_exit_code_ok_for_a_complete_analysis(corpus: Path, capsys):
    result = api.analyze(corpus / GLOO_HEALTHY, cache_dir=shared_cache_dir(), engine="inprocess")
    assert exit_code(result) == EXIT_OK and capsys.readouterr().err == ""
