"""Issue 33: NCCL logs as clusters write them: launcher labels (srun --label, OpenMPI --tag-output,
torchrun), per-rank NCCL_DEBUG_FILE logs of one communicator, WARN and error lines with their rank.

The logs are the corpus's real nccl-tests log (nccl-logs-2xA100/nccl.log), wrapped here line by
line as each launcher writes it. Expected values are read from the unwrapped text with plain
regular expressions in this file (its "# Avg bus bandwidth" line, its result rows, its commId),
or are what the test inserted.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import assert_no_traceback, run_cli
from rankscope.analyses.inputs.nccl import compare_nccl_logs
from rankscope.ingest.nccl_log import merge_runs, read_nccl_log

LOG = "nccl-logs-2xA100/nccl.log"
WRAPPINGS = {"srun --label": lambda i: f"{i % 2}: ",
             "OpenMPI --tag-output": lambda i: f"[1,{i % 2}]<stdout>:",
             "torchrun": lambda i: f"[rank{i % 2}]:"}


def _facts(text: str) -> tuple[float, int, set[str]]:
    """From the unwrapped text: the average bus bandwidth line, the result rows (lines that start
    with a size and a count), the commIds."""
    avg = float(re.search(r"^# Avg bus bandwidth\s*:\s*([\d.]+)", text, re.M)[1])
    rows = len(re.findall(r"^\s+\d+\s+\d+\s+float\s", text, re.M))
    return avg, rows, set(re.findall(r"commId (0x[0-9a-f]+)", text))


@pytest.mark.parametrize("launcher", sorted(WRAPPINGS))
def test_launcher_labels_are_stripped(corpus: Path, tmp_path: Path, launcher: str):
    text = (corpus / LOG).read_text()
    avg, rows, comm_ids = _facts(text)
    label = WRAPPINGS[launcher]
    wrapped = tmp_path / "job.out"
    wrapped.write_text("".join(label(i) + line for i, line in enumerate(text.splitlines(keepends=True))))
    log = read_nccl_log(wrapped)
    assert [t.avg_busbw_gbps for t in log.perf] == [avg]
    assert sum(len(t.rows) for t in log.perf) == rows
    assert set(log.comms) == comm_ids and log.hosts == ["mew0"]


def _per_rank_files(corpus: Path, tmp_path: Path) -> list[Path]:
    """The log split as NCCL_DEBUG_FILE writes it per rank: the NCCL lines of device [r] to rank r's
    file (the nccl-tests output with rank 0's), each rank with its own NCCL_SOCKET_IFNAME."""
    out = []
    lines = (corpus / LOG).read_text().splitlines(keepends=True)
    for rank in (0, 1):
        mine = [ln for ln in lines if f"[{rank}] NCCL " in ln or (rank == 0 and " NCCL " not in ln)]
        mine.insert(7, f"mew0:64904:64904 [{rank}] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth{rank}\n")
        path = tmp_path / f"nccl.mew0.{rank}.log"
        path.write_text("".join(mine))
        out.append(path)
    return out


def test_per_rank_logs_of_one_communicator_are_one_run(corpus: Path, tmp_path: Path):
    """Two per-rank files sharing the log's commId: one run, both ranks in its communicator, each
    rank's NCCL_SOCKET_IFNAME kept per rank (not an environment difference between runs)."""
    _, _, comm_ids = _facts((corpus / LOG).read_text())
    files = _per_rank_files(corpus, tmp_path)
    logs = [read_nccl_log(f) for f in files]
    assert [set(log.comms) for log in logs] == [comm_ids, comm_ids]
    (run,) = merge_runs(logs)
    assert run.files == [str(f) for f in files]
    assert {c: sorted(run.comms[c].ranks) for c in comm_ids} == {c: [0, 1] for c in comm_ids}
    assert run.env_by_rank == {"NCCL_SOCKET_IFNAME": {0: "eth0", 1: "eth1"}}
    assert "NCCL_SOCKET_IFNAME" not in run.env
    report = compare_nccl_logs([run])
    assert len(report.runs) == 1 and report.runs[0].env_vs_reference == []
    proc = run_cli(["nccl", *files, "--json"], tmp_path)
    assert_no_traceback(proc)
    out = json.loads(proc.stdout)
    assert len(out["runs"]) == 1 and out["runs"][0]["env_by_rank"] == {"NCCL_SOCKET_IFNAME": {"0": "eth0", "1": "eth1"}}


def test_runs_of_other_communicators_stay_apart(corpus: Path):
    """The healthy and the faulty run have different commIds: two runs, as before."""
    logs = [read_nccl_log(corpus / "nccl-logs-2xA100" / n) for n in ("nccl.log", "nccl-fault.log")]
    assert not set(logs[0].comms) & set(logs[1].comms)
    assert len(merge_runs(logs)) == 2


def test_warn_and_error_lines_with_rank_and_host(corpus: Path, tmp_path: Path):
    """Inserted here: an NCCL WARN of device 1 under srun's label 1, and a torch NCCL error under
    torchrun's label rank1. Both listed with their rank; the WARN with its host."""
    lines = (corpus / LOG).read_text().splitlines(keepends=True)
    warn = "mew0:64904:64921 [1] NCCL WARN NET/IB : Got completion from peer 192.168.0.4 with status=12\n"
    error = ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
             "(run with NCCL_DEBUG=INFO)\n")
    text = "".join(f"0: {ln}" for ln in lines[:40]) + f"1: {warn}" + "".join(f"0: {ln}" for ln in lines[40:])
    (tmp_path / "srun.out").write_text(text)
    (tmp_path / "torchrun.out").write_text("".join(lines) + f"[rank1]:{error}")
    srun, torchrun = read_nccl_log(tmp_path / "srun.out"), read_nccl_log(tmp_path / "torchrun.out")
    assert [(w.level, w.rank, w.host, w.device, w.text) for w in srun.warning_lines] == \
        [("WARN", 1, "mew0", 1, warn.split("NCCL WARN ")[1].strip())]
    assert [(w.level, w.rank, w.text) for w in torchrun.warning_lines] == [("ERROR", 1, error.strip())]
    proc = run_cli(["nccl", tmp_path / "srun.out"], tmp_path)
    assert_no_traceback(proc)
    assert "WARN (rank 1, host mew0): NET/IB : Got completion from peer" in " ".join(proc.stdout.split())
