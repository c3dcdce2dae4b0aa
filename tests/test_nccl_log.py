"""NCCL debug logs (issue 8 item 1): `rankscope nccl LOG...` and `analyze --nccl-log`.

Independent sources of the expected answers:
- the corpus logs themselves, read here line by line with plain `str` methods and small regexes
  written in this file: the "via P2P" lines, the "N coll channels" line, the "NCCL version" line,
  the "opCount" lines, NCCL's topology path line for GPU 65000, the nccl-tests "Avg bus bandwidth"
  line and the table fragments (size/count rows at line start, result groups of 4 numbers);
- the corpus MANIFEST.md: `nccl.log` is healthy (~178 GB/s busbw), `nccl-fault.log` has NVLink cut
  12 -> 1 (~28 GB/s): the fault must be found against the healthy run, and nothing on healthy vs itself;
- a small log written in the test (4 ranks, one pair on SHM, lines of another program inside the
  nccl-tests table), where the answer is known by construction.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from statistics import median

import pytest
from rich.console import Console

from rankscope.analyses.inputs.nccl import compare_nccl_logs
from rankscope.findings import nccl_findings
from rankscope.ingest import TraceError
from rankscope.ingest.nccl_log import read_nccl_log
from rankscope.render.base import render
from rankscope.render.nccl import NcclJson
from rankscope.results import NcclResult

from conftest import assert_no_traceback, run_cli

SET = "nccl-logs-2xA100"


@pytest.fixture(scope="module")
def healthy_path(corpus: Path) -> Path:
    return corpus / SET / "nccl.log"


@pytest.fixture(scope="module")
def fault_path(corpus: Path) -> Path:
    return corpus / SET / "nccl-fault.log"


@pytest.fixture(scope="module")
def logs(healthy_path, fault_path):
    return read_nccl_log(healthy_path), read_nccl_log(fault_path)


# ---------------------------------------------------------------------------------------------
# independent readers (plain text, nothing from rankscope)
def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


def _table_from_text(path: Path) -> dict[int, tuple[float, float]]:
    """size -> (out-of-place busbw, in-place busbw). In these files stdout is glued to NCCL lines:
    the row's key columns start a line, its out-of-place group of 4 numbers starts the next
    fragment line (NCCL text glued after it), its in-place group is a line of its own."""
    sizes, groups = [], []
    for line in _lines(path):
        if re.match(r"^\s+\d+\s+\d+\s+float\s+sum\s+-1", line):
            sizes.append(int(line.split()[0]))
        m = re.match(r"^\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)(?:\s*$|[a-z])", line)
        if m:
            groups.append(float(m[3]))
    assert len(groups) == 2 * len(sizes)
    return {size: (groups[2 * i], groups[2 * i + 1]) for i, size in enumerate(sizes)}


def _avg_busbw_line(path: Path) -> float:
    line = next(x for x in _lines(path) if x.startswith("# Avg bus bandwidth"))
    return float(line.split(":")[1])


# ---------------------------------------------------------------------------------------------
def test_parse_matches_the_raw_lines(logs, healthy_path, fault_path):
    for log, path in zip(logs, (healthy_path, fault_path)):
        lines = _lines(path)
        via_p2p = sum(" via P2P" in x for x in lines)
        coll_line = next(x for x in lines if " coll channels, " in x)
        coll_channels = int(coll_line.split(" coll channels")[0].split()[-1])
        version = next(x for x in lines if "NCCL version " in x).split("NCCL version ")[1].split()[0]
        op_lines = sum("opCount " in x for x in lines)
        (comm,) = log.comms.values()
        assert sum(t.via.startswith("P2P") for t in comm.transports.values()) == via_p2p
        assert comm.coll_channels == coll_channels
        assert log.nccl_version == version == "2.27.7+cuda13.0"
        assert sum(log.ops.values()) == op_lines
        assert log.hosts == ["mew0"] and comm.nranks == 2 and sorted(comm.ranks) == [0, 1]
        assert {r.bus_id for r in comm.ranks.values()} == {"17000", "65000"}
        assert log.devices == {0: "NVIDIA A100 80GB PCIe", 1: "NVIDIA A100 80GB PCIe"}
    # the counts themselves (hand count, grep -c "via P2P"): 24 channels x 2 directions vs 2 x 2
    assert sum(" via P2P" in x for x in _lines(healthy_path)) == 48
    assert sum(" via P2P" in x for x in _lines(fault_path)) == 4


def test_nccl_tests_table_rebuilt_from_split_lines(logs, healthy_path, fault_path):
    for log, path in zip(logs, (healthy_path, fault_path)):
        (test,) = log.perf
        expected = _table_from_text(path)
        assert test.name == "all_reduce_perf"
        assert len(test.rows) == len(expected) == 11
        assert {r.size_bytes: (r.out_of_place.busbw_gbps, r.in_place.busbw_gbps) for r in test.rows} == expected
        assert test.avg_busbw_gbps == _avg_busbw_line(path)
        assert all(r.count * 4 == r.size_bytes and r.type == "float" and r.redop == "sum" for r in test.rows)
    assert logs[0].perf[0].avg_busbw_gbps == 178.078 and logs[1].perf[0].avg_busbw_gbps == 28.2632


def test_topology_shows_the_cut_nvlink(logs, fault_path):
    # the path line of GPU 65000, read here: "GPU/0-65000 :GPU/0-17000 (1/20.0/NVL) ..."
    line = next(x for x in _lines(fault_path) if "GPU/0-65000 :GPU/0-17000" in x)
    bw = float(line.split("GPU/0-65000 :GPU/0-17000 (")[1].split("/")[1])
    healthy, fault = logs
    assert fault.topology[("GPU/0-65000", "GPU/0-17000")].bw_gbps == bw == 20.0
    assert healthy.topology[("GPU/0-65000", "GPU/0-17000")].bw_gbps == 240.0
    assert fault.env["NCCL_TOPO_FILE"].endswith("topo_fail.xml")


def test_fault_found_against_healthy(logs, healthy_path, fault_path):
    report = compare_nccl_logs(list(logs))
    assert report.best_run == str(healthy_path)
    found = nccl_findings(report)
    assert {f.id for f in found} == {"low_bus_bandwidth", "degraded_nccl_link"}
    assert all(f.evidence["file"] == str(fault_path) for f in found)
    low = next(f for f in found if f.id == "low_bus_bandwidth")
    healthy_rows, fault_rows = _table_from_text(healthy_path), _table_from_text(fault_path)
    expected_pct = 100 * median(fault_rows[s][0] / healthy_rows[s][0] for s in fault_rows)
    assert low.evidence["pct_of_best"] == pytest.approx(expected_pct, abs=0.05)
    assert low.evidence["channels"] == {next(iter(logs[1].comms)): 2}
    assert low.evidence["best_run_channels"] == {next(iter(logs[0].comms)): 24}
    assert low.evidence["transport"] == {"0->1": "P2P/direct pointer/read (2 channels)",
                                         "1->0": "P2P/direct pointer/read (2 channels)"}
    degraded = next(f for f in found if f.id == "degraded_nccl_link")
    kinds = {(i["kind"], i["value"], i["reference"]) for i in degraded.evidence["issues"]}
    assert kinds == {("channels", 2.0, 24.0), ("link", 20.0, 240.0)}
    assert "2 collective channels" in degraded.summary and "20 GB/s" in degraded.summary


def test_healthy_against_itself_finds_nothing(healthy_path):
    log = read_nccl_log(healthy_path)
    assert nccl_findings(compare_nccl_logs([log, read_nccl_log(healthy_path)])) == []
    assert nccl_findings(compare_nccl_logs([log])) == []


def test_fault_alone_is_still_found(fault_path):
    """Without a healthy run: the NVLink at 20 of its peer's 240 GB/s, and busbw far below the A100 link peak."""
    found = nccl_findings(compare_nccl_logs([read_nccl_log(fault_path)]))
    assert {f.id for f in found} == {"low_bus_bandwidth", "degraded_nccl_link"}
    low = next(f for f in found if f.id == "low_bus_bandwidth")
    assert low.evidence["pct_of_link_peak"] < 25 and low.evidence["pct_of_best"] == 100.0


# ---------------------------------------------------------------------------------------------
SYNTHETIC = """\
# Collective test starting: all_gather_perf
#  Rank  0 Group  0 Pid   1000 on      nodeA device  0 [0x1b] NVIDIA H100 80GB HBM3
nodeA:1000:1001 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
nodeA:1000:1001 [0] NCCL INFO ncclCommInitRank comm 0xa0 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 1b000 commId 0xc0ffee - Init START
nodeA:1000:1002 [1] NCCL INFO ncclCommInitRank comm 0xa1 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 2b000 commId 0xc0ffee - Init START
nodeA:1000:1003 [2] NCCL INFO ncclCommInitRank comm 0xa2 rank 2 nranks 4 cudaDev 2 nvmlDev 2 busId 3b000 commId 0xc0ffee - Init START
nodeA:1000:1004 [3] NCCL INFO ncclCommInitRank comm 0xa3 rank 3 nranks 4 cudaDev 3 nvmlDev 3 busId 4b000 commId 0xc0ffee - Init START
nodeA:1000:1001 [0] NCCL INFO Channel 00/02 :    0   1   2   3
nodeA:1000:1001 [0] NCCL INFO Channel 01/02 :    0   1   2   3
nodeA:1000:1001 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
nodeA:1000:1002 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[2] via P2P/CUMEM/read
nodeA:1000:1003 [2] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via SHM/direct/direct
nodeA:1000:1004 [3] NCCL INFO Channel 00/0 : 3[3] -> 0[0] via P2P/CUMEM/read
nodeA:1000:1003 [2] NCCL WARN Cuda failure 'peer access is not supported between these two devices'
nodeA:1000:1001 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        65536     float    none      -1    10.00  104.86   78.64      0     9.50  110.38   82.78      0
some other program: checkpoint saved
     2097152       131072     float    none      -1nodeA:1000:1001 [0] NCCL INFO AllGather: opCount 1a sendbuff 0x1 recvbuff 0x2 count 131072 datatype 7 op 0 root 0 comm 0xa0 [nranks=4] stream 0x3
    20.00  104.86   78.64      0    19.00  110.38   82.78    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 80.71
"""


def test_slower_transport_and_interleaved_table(tmp_path):
    path = tmp_path / "four.log"
    path.write_text(SYNTHETIC)
    log = read_nccl_log(path)
    (comm,) = log.comms.values()
    assert comm.comm_id == "0xc0ffee" and comm.nranks == 4 and comm.coll_channels == 2
    assert comm.rings == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}
    assert log.warning_count == 1 and "peer access" in log.warnings[0]
    # the foreign line is skipped; the second row is rebuilt across the glued NCCL line
    rows = log.perf[0].rows
    assert [r.size_bytes for r in rows] == [1048576, 2097152] and rows[1].in_place.wrong is None
    assert log.ops == {("AllGather", "float32", "sum", 131072 * 4, "0xc0ffee"): 1}
    found = nccl_findings(compare_nccl_logs([log]))
    degraded = next(f for f in found if f.id == "degraded_nccl_link")
    assert degraded.ranks == [2, 3] and "SHM" in degraded.summary and "P2P" in degraded.summary


def _topology_log(tmp_path: Path, bw_2b_to_1b: float) -> Path:
    """Four GPUs wired like a DGX-1 (pairs on 2 or 1 NVLinks: 50 or 25 GB/s, by design), one direction set."""
    paths = {"1b000": {"2b000": 50.0, "3b000": 25.0}, "2b000": {"1b000": bw_2b_to_1b, "3b000": 50.0},
             "3b000": {"1b000": 25.0, "2b000": 50.0}}
    lines = ["n:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4"]
    lines += [f"n:1:1 [0] NCCL INFO GPU/0-{src} :" + " ".join(f"GPU/0-{dst} (1/{bw}/NVL)" for dst, bw in to.items())
              for src, to in paths.items()]
    path = tmp_path / f"topo-{bw_2b_to_1b}.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_link_compared_with_its_reverse_direction_not_other_pairs(tmp_path):
    symmetric = read_nccl_log(_topology_log(tmp_path, 50.0))
    assert nccl_findings(compare_nccl_logs([symmetric])) == []          # 25 vs 50 GB/s pairs: by design
    one_way = read_nccl_log(_topology_log(tmp_path, 12.5))
    (f,) = nccl_findings(compare_nccl_logs([one_way]))
    assert f.id == "degraded_nccl_link" and "GPU/0-2b000 -> GPU/0-1b000" in f.summary
    assert "25% of the 50 GB/s of its reverse direction" in f.summary


def test_gzip_log_reads_the_same(tmp_path, fault_path):
    gz = tmp_path / "nccl-fault.log.gz"
    gz.write_bytes(gzip.compress(fault_path.read_bytes()))
    assert read_nccl_log(gz).perf[0].avg_busbw_gbps == _avg_busbw_line(fault_path)


@pytest.mark.parametrize("content, problem", [
    (b"", "empty file"),
    (b"\x00\x01\x02binary\x00" * 100, "binary file"),
    (b"hello\nthis is a README, not a log\n", "not an NCCL log"),
])
def test_bad_input_one_line_error(tmp_path, content, problem):
    path = tmp_path / "bad.log"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=problem):
        read_nccl_log(path)


# ---------------------------------------------------------------------------------------------
def test_cli_json_and_exit_codes(tmp_path, healthy_path, fault_path):
    ok = run_cli(["nccl", healthy_path, fault_path, "--json"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["schema"] == "rankscope.nccl/1" and len(out["runs"]) == 2
    assert out["runs"][1]["busbw_gbps"] == _avg_busbw_line(fault_path)
    assert out["runs"][1]["comms"][0]["coll_channels"] == 2
    assert {f["id"] for f in out["findings"]} == {"low_bus_bandwidth", "degraded_nccl_link"}

    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    some = run_cli(["nccl", fault_path, empty, "--json"], tmp_path)
    assert some.returncode == 1
    assert some.stderr.strip() == f"rankscope: {empty}: empty file"
    assert json.loads(some.stdout)["inputs"]["skipped"] == [{"file": str(empty), "problem": "empty file"}]

    none = run_cli(["nccl", empty, tmp_path / "missing.log"], tmp_path)
    assert none.returncode == 2 and len(none.stderr.strip().splitlines()) == 2
    assert "missing.log: cannot read" in none.stderr
    for proc in (ok, some, none):
        assert_no_traceback(proc)


def test_analyze_nccl_log_adds_the_findings(tmp_path, corpus, fault_path):
    from importlib.resources import files

    import jsonschema
    proc = run_cli(["analyze", corpus / "cpu-gloo-4rank-healthy", "--nccl-log", fault_path, "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "degraded_nccl_link" in {f["id"] for f in out["findings"]}
    schema = json.loads(files("rankscope").joinpath("schemas/analysis.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(out)
    bad = tmp_path / "bad.log"
    bad.write_text("not nccl\n")
    skipped = run_cli(["analyze", corpus / "cpu-gloo-4rank-healthy", "--nccl-log", bad, "-q"], tmp_path)
    assert skipped.returncode == 1 and f"{bad}: no NCCL_DEBUG line" in skipped.stderr
    assert_no_traceback(skipped)


def test_terminal_fits_80_columns(logs):
    report = compare_nccl_logs(list(logs))
    console = Console(width=80, record=True, color_system=None)
    render(NcclResult(report, nccl_findings(report), []), "terminal", console)
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    assert "HIGH degraded_nccl_link" in text and "216.6" in text and "28.6" in text
    json.dumps(NcclJson().to_dict(NcclResult(report, nccl_findings(report), [])))   # plain data all the way down
