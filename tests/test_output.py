"""Output for people: every command's terminal output as a pipe or a file gets it (80 columns), names
from hostile inputs, and user docs that stand alone.

- piped at 80 columns (COLUMNS=80, what rich uses when stdout is no terminal): no number cut with
  "…" (an ellipsis beside a digit), no line wider than 80 cells, no trailing spaces;
- a trace, a kernel, an op and a file named with terminal escape sequences (and rich markup): no raw
  ESC byte reaches stdout or stderr, the names show as `\\x1b` text;
- no user doc (README.md, docs/*.md) and no string constant of the package points at a design
  document that is not shipped, or at the "seed" notes it came from.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from rich.cells import cell_len

from conftest import DLRM, REPO, assert_no_traceback, run_cli, shared_cache_dir
from tracebuilder import TraceBuilder

from rankscope.render.format import distinct_shortened, printable, shortened

ANALYZED = [DLRM, "hta-sampled-2rank", "cpu-gloo-4rank-straggler", "kineto-resnet50-workers0", "tracelens-b200-rank0",
            "big-mi300-xdit", "cpu-gloo-3d-pp2dp2tp2"]
CUT_NUMBER = re.compile(r"\d…|…\d")


def _other_commands(corpus: Path) -> dict[str, list]:
    nccl, memory = corpus / "nccl-logs-2xA100", corpus / "memory-snapshot-1gpu"
    cache = ["--cache-dir", shared_cache_dir()]
    return {"validate": ["validate", corpus / DLRM, corpus / "hta-trace-diff", *cache],
            "diff": ["diff", corpus / "hta-trace-diff" / "control", corpus / "hta-trace-diff" / "test", *cache],
            "nccl": ["nccl", nccl / "nccl.log", nccl / "nccl-fault.log"],
            "memory": ["memory", *sorted(memory.iterdir()), "--params", "124000000"],
            "mfu": ["mfu", corpus / DLRM, *cache],
            "thresholds": ["thresholds"]}


def _assert_fits_80_columns(text: str, what: str) -> None:
    assert text.strip(), f"{what}: no output"
    for line in text.splitlines():
        assert not CUT_NUMBER.search(line), f"{what}: a number cut: {line!r}"
        assert cell_len(line) <= 80, f"{what}: {cell_len(line)} columns: {line!r}"
        assert line == line.rstrip(), f"{what}: trailing spaces: {line!r}"


@pytest.mark.parametrize("folder", ANALYZED)
def test_analyze_piped_fits_80_columns(corpus: Path, tmp_path: Path, folder: str):
    proc = run_cli(["analyze", corpus / folder, "--cache-dir", shared_cache_dir()], tmp_path, env={"COLUMNS": "80"})
    assert_no_traceback(proc)
    assert proc.returncode in (0, 1), proc.stderr
    _assert_fits_80_columns(proc.stdout, folder)


@pytest.mark.parametrize("command", ["validate", "diff", "nccl", "memory", "mfu", "thresholds"])
def test_other_commands_piped_fit_80_columns(corpus: Path, tmp_path: Path, command: str):
    proc = run_cli(_other_commands(corpus)[command], tmp_path, env={"COLUMNS": "80"})
    assert_no_traceback(proc)
    assert proc.returncode in (0, 1), proc.stderr
    _assert_fits_80_columns(proc.stdout, command)


def test_warnings_are_in_the_report(corpus: Path, tmp_path: Path):
    """Skipped files and job warnings under the header of the terminal report, and in the HTML page."""
    job = tmp_path / "job"
    job.mkdir()
    for f in sorted((corpus / "cpu-gloo-4rank-healthy").iterdir())[:2]:
        (job / f.name).write_bytes(f.read_bytes())
    (job / "rank3.pt.trace.json").write_text("")
    page = tmp_path / "report.html"
    proc = run_cli(["analyze", job, "--no-cache", "--html", page], tmp_path, env={"COLUMNS": "80"})
    assert proc.returncode == 1
    report = "".join(proc.stdout.split("Step time per rank")[0].split())     # the block below the header
    # the missing ranks are said once, in the capture lines (issue 33), not again among the warnings
    assert "Warnings(2):" in report and f"skipped{job / 'rank3.pt.trace.json'}:emptyfile" in report
    assert "capture:2of4rankspresent:" in report and "2of4rankspresent;missing:2,3" in report
    page_text = page.read_text(encoding="utf-8")
    html = page_text.split("<h3>Input warnings</h3>")[1].split("</ul>")[0]
    assert f"skipped {job / 'rank3.pt.trace.json'}: empty file" in html
    assert "2 of 4 ranks present; missing: 2, 3" in page_text.split("<h3>Input warnings</h3>")[0]


def test_validate_names_files_below_their_common_folder(corpus: Path, tmp_path: Path):
    proc = run_cli(["validate", corpus / DLRM, "--cache-dir", shared_cache_dir()], tmp_path, env={"COLUMNS": "80"})
    lines = proc.stdout.splitlines()
    assert lines[0] == f"Files in {(corpus / DLRM).resolve()}"      # files are named by their real path
    rows = [line for line in lines if re.match(r" worker\d", line)]
    assert len(rows) == 8 and len({row.split()[0] for row in rows}) == 8      # one line per file, told apart


def test_diff_names_take_the_width_and_stay_distinct(corpus: Path, tmp_path: Path):
    control, test = corpus / "hta-trace-diff" / "control", corpus / "hta-trace-diff" / "test"
    wide = run_cli(["diff", control, test, "--cache-dir", shared_cache_dir()], tmp_path, env={"COLUMNS": "200"})
    assert "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)" in wide.stdout      # 52 characters, whole
    rows = [re.match(r" (\S.*?)\s{2,}(added|removed|slower|faster|same)\s", line) for line in wide.stdout.splitlines()]
    names = [m.group(1) for m in rows if m]
    assert len(names) == 20 and len(set(names)) == 20, names


def test_shortened_names_keep_their_end_and_differ():
    assert shortened("void " + "k" * 60, 10) == "kkkkkk…kkk" and shortened("gemm") == "gemm"
    a, b = (f"split_embedding_backward_{n}ul_" + "x" * 60 for n in (5, 2))     # they differ in the middle
    assert shortened(a, 30) == shortened(b, 30)
    cut = distinct_shortened([a, b, "gemm"], 30)
    assert len(set(cut)) == 3 and all(len(c) <= 30 and "…" in c for c in cut[:2]) and cut[2] == "gemm", cut
    assert not any(CUT_NUMBER.search(shortened(f"kernel_MT128x128x64_MI16x16x1_{i}", w)) for i in range(3)
                   for w in range(5, 30))


def test_printable_escapes_control_characters():
    assert printable("a\x1b[2Jb\x07\n\x9b") == "a\\x1b[2Jb\\x07\\x0a\\x9b"


HOSTILE = "\x1b[2J\x1b]0;pwned\x07[bold]x[/]"
IN_FILE_NAMES = HOSTILE.replace("/", "i")


def _hostile_job(folder: Path) -> Path:
    folder.mkdir()
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world_size=2).step(1, 0, 1000).step(2, 1000, 1000)
        for start in (0, 1000):
            b.op(f"aten::evil{HOSTILE}", start + 10, 300)
            b.kernel(f"kernel{HOSTILE}", start + 20, start + 30, 400)
        b.write(folder / f"rank{rank}{IN_FILE_NAMES}.pt.trace.json")
    (folder / f"notes{IN_FILE_NAMES}.txt").write_text("not a trace")
    return folder


@pytest.mark.parametrize("command", ["analyze", "validate", "diff"])
def test_escape_sequences_in_names_never_reach_the_terminal(tmp_path: Path, command: str):
    job = _hostile_job(tmp_path / "job")
    args = [command, job, job] if command == "diff" else [command, job]
    proc = run_cli([*args, "--no-cache"], tmp_path, env={"COLUMNS": "80"})
    assert_no_traceback(proc)
    assert proc.stdout.strip()
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout and "\x1b" not in proc.stderr
    assert "\\x1b[2J" in proc.stdout


# ---------------------------------------------------------------------------------------------
# user docs stand alone
NOT_SHIPPED = re.compile(r"DESIGN\.md|\.\./shared")
SEED = re.compile(r"\bseed\b", re.IGNORECASE)
#: "seed" in the sense of a random generator's (synth, the bootstrap), not of the notes docs came from.
RANDOM_SEED = re.compile(r"--seed|bootstrap|resampl|fixed seed|random|^seed$|\bseed\s*[,=]", re.IGNORECASE)


def _points_elsewhere(line: str) -> bool:
    return bool(NOT_SHIPPED.search(line) or (SEED.search(line) and not RANDOM_SEED.search(line)))


def test_user_docs_and_strings_point_at_shipped_docs():
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            assert not _points_elsewhere(line), f"{doc.name}:{n}: {line}"
    for source in sorted((REPO / "src" / "rankscope").rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for line in node.value.splitlines():
                    assert not _points_elsewhere(line), f"{source.relative_to(REPO)}:{node.lineno}: {line}"


def test_concepts_defines_the_figures_the_outputs_show():
    text = (REPO / "docs" / "concepts.md").read_text(encoding="utf-8").lower()
    for term in ("step", "step breakdown", "temporal breakdown", "comm-comp overlap", "overlap efficiency",
                 "summed over", "device busy", "collective", "arrival skew", "wait", "busbw", "algbw", "straggler",
                 "cost", "load balance", "mfu", "hfu"):
        assert term in text, term
