"""NCCL debug logs (`NCCL_DEBUG=INFO`, optionally `NCCL_DEBUG_SUBSYS=...,COLL`) -> NcclLog.

Line-oriented and streaming: one pass, one regex family per kind of line, memory bounded by what
the log describes (communicators, channels, peers), not by its length: per-op lines (COLL) are
counted per (collective, datatype, op, bytes), not kept one by one.

Tolerant of what real logs look like: lines of several ranks and threads interleaved, lines of
other programs in between, and stdout glued to NCCL's stderr mid-line (nccl-tests writes its
result table to stdout while NCCL logs to stderr, so a table row can be split over three lines
with NCCL lines in between: "   8388608   2097152  float  sum  -1mew0:64904:64904 [1] NCCL INFO
..."). The nccl-tests table is rebuilt from those fragments using its own header line.

Which communicator a line belongs to: lines that name a `comm 0x...` set it for their thread; other
lines (channels, rings, trees, transports) take their thread's, else the last communicator
initialised on their process and device. A comm is keyed by its `commId` (shared by its ranks).

Lines as launchers write them: the label each line carries is stripped first and kept as the
line's rank: srun's `--label` (`0: `), OpenMPI's `--tag-output` (`[1,0]<stdout>:`, job 1 rank 0)
and torchrun's (`[rank0]:`, `[default0]:`). NCCL WARN / ABORT lines, and lines that report an NCCL
error (`NCCL error`, `ncclSystemError`...), are kept with their host, pid, device and rank.

Logs of one communicator written per rank (`NCCL_DEBUG_FILE=nccl.%h.%p.log`) are one run:
`merge_runs` joins the logs that share a `commId` into one, each rank's settings kept as such.

Not a log (empty, binary, no NCCL line and no nccl-tests output) -> TraceError, one line.
"""
from __future__ import annotations

import gzip
import io
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rankscope.ingest.discover import open_regular
from rankscope.ingest.errors import TraceError

#: ncclDataType_t (nccl.h): name and size in bytes, by enum value.
NCCL_DATATYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
    6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8e4m3", 1),
    11: ("float8e5m2", 1),
}
#: ncclRedOp_t (nccl.h); values from 5 up are user-defined (ncclRedOpCreatePreMulSum).
NCCL_REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
#: NCCL graph search patterns (graph.h NCCL_TOPO_PATTERN_*).
GRAPH_PATTERNS = {1: "balanced_tree", 2: "split_tree", 3: "tree", 4: "ring", 5: "nvls", 6: "collnet_direct"}
MAX_WARNINGS = 20
#: A header line of more columns is not nccl-tests' (it has ~13): bounds the work per table cell.
MAX_TABLE_COLUMNS = 64
SNIFF_BYTES = 8192

# Every pattern runs in time linear in the line: a run of a character class starts where the run
# does (lookbehind), and no two quantifiers can share the same characters.
_PREFIX = re.compile(r"(?<![^\s:\[\]])(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL "
                     r"(?P<level>INFO|WARN|TRACE|ABORT)\b ?(?P<msg>.*)$")
#: Launchers' line labels: srun --label ("12: "), OpenMPI --tag-output ("[1,12]<stdout>:"), torchrun ("[rank12]:",
#: "[default12]:"); the number is the rank.
_LABEL = re.compile(r"^\s{0,8}(?:(?P<srun>\d{1,7}): |\[\d{1,7},(?P<mpi>\d{1,7})\]<(?:stdout|stderr)>: ?|"
                    r"\[(?:rank|default)(?P<torchrun>\d{1,7})\]: ?)")
#: Lines that report an NCCL error outside WARN lines (torch's "NCCL error in: ...", result codes).
_ERROR = re.compile(r"\bNCCL error\b|"
                    r"\bnccl(?:System|Internal|UnhandledCuda|Remote|InvalidUsage|InvalidArgument)Error\b")
_VERSION = re.compile(r"NCCL version (\S+)")
_DRIVER = re.compile(r"cudaDriverVersion (\d+)")
_ENV = re.compile(r"^(NCCL_\w+) set by environment to (.*)$")
_INIT = re.compile(r"(?:ncclCommInit\w*|comm) (?P<ptr>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
                   r"cudaDev (?P<cuda_dev>\d+)(?: nvmlDev (?P<nvml_dev>\d+))? busId (?P<bus_id>[0-9a-fA-F]+)"
                   r"(?: commId (?P<comm_id>0x[0-9a-f]+))?")
_INIT_DONE = re.compile(r" - Init (?:START|COMPLETE)")
_COMM_SIZE = re.compile(r"comm (?P<ptr>0x[0-9a-f]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+)")
_COMM_PTR = re.compile(r"\bcomm (0x[0-9a-f]+)")
_CHANNEL_COUNTS = re.compile(r"(?<!\d)(?P<coll>\d+) coll channels, (?:(?P<collnet>\d+) collnet channels, )?"
                             r"(?:(?P<nvls>\d+) nvls channels, )?(?P<p2p>\d+) p2p channels")
_RING = re.compile(r"^Channel (?P<channel>\d+)/(?P<of>\d+) :(?P<ranks>(?: +\d+)+)\s*$")
_TRANSPORT = re.compile(r"^Channel (?P<channel>\d+)(?:/\d+)? : (?P<src>\d+)\[[0-9a-fx]+\] -> (?P<dst>\d+)\[[0-9a-fx]+\]"
                        r"(?: \[(?P<direction>send|receive)\])? via (?P<via>.*\S)\s*$")
_TREES = re.compile(r"\[(\d+)\] (-?\d+)/(-?\d+)/(-?\d+)->(-?\d+)->(-?\d+)")
_PATTERN = re.compile(r"^Pattern (?P<pattern>\d+), crossNic \d+, nChannels (?P<nch>\d+), "
                      r"bw (?P<intra>[\d.]+)/(?P<inter>[\d.]+), type (?P<type>[^\s,]+)")
_PATHS = re.compile(r"^(?P<src>GPU/[\w-]+) :(?P<rest>.*)$")
_PATH_ENTRY = re.compile(r"(?<![A-Z])(?P<dst>[A-Z]+/[\w-]+) \((?P<hops>\d+)/(?P<bw>[\d.]+)/(?P<type>\w+)\)")
_OP = re.compile(r"^(?P<coll>\w+): opCount (?P<opcount>[0-9a-f]+) sendbuff \S+ recvbuff \S+ count (?P<count>\d+) "
                 r"datatype (?P<dtype>\d+) op (?P<op>\d+) root (?P<root>-?\d+) comm (?P<ptr>0x[0-9a-f]+)")
_ALGO = re.compile(r"^(?P<coll>\w+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\S+) proto (?P<proto>\S+)"
                   r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?")
# nccl-tests (stdout)
_TEST_START = re.compile(r"^# Collective test starting: (\S+)")
_TEST_DEVICE = re.compile(r"^#\s+Rank\s+(?P<rank>\d+) Group\s+\d+ Pid\s+(?P<pid>\d+) on\s+(?P<host>\S+) "
                          r"device\s+(?P<dev>\d+) \[(?P<bus>[0-9a-fA-Fx:.]+)\] (?P<name>.*\S)\s*$")
_AVG_BUSBW = re.compile(r"^# Avg bus bandwidth\s*:\s*([\d.]+)")
#: A number of more digits than any NCCL log line holds (int64 has 19): the line is no NCCL line.
_LONG_NUMBER = re.compile(r"\d{19}")
_LEADING_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?=[A-Za-z])")


@dataclass
class NcclRank:
    rank: int
    nranks: int
    comm_id: str
    cuda_dev: int
    nvml_dev: int | None
    bus_id: str
    host: str
    pid: int


@dataclass
class NcclTransport:
    """One 'Channel C : src[..] -> dst[..] via X' line: how `src` sends to `dst` on channel C."""
    channel: int
    src: int
    dst: int
    via: str                      # as NCCL writes it: P2P/CUMEM/read, P2P/IPC, SHM/direct/direct, NET/IB/0/GDRDMA
    direction: str | None         # send / receive (NET lines), None for P2P / SHM

    @property
    def kind(self) -> str:
        """The transport family: P2P, SHM, NET/IB, NET/Socket, COLLNET, ..."""
        parts = self.via.split("/")
        return "/".join(parts[:2]) if parts[0] == "NET" and len(parts) > 1 else parts[0]


@dataclass
class NcclComm:
    comm_id: str
    nranks: int
    nnodes: int | None = None
    ranks: dict[int, NcclRank] = field(default_factory=dict)
    coll_channels: int | None = None
    collnet_channels: int | None = None
    nvls_channels: int | None = None
    p2p_channels: int | None = None
    rings: dict[int, list[int]] = field(default_factory=dict)                 # channel -> rank order
    trees: dict[int, dict[int, dict]] = field(default_factory=dict)           # channel -> rank -> parent/children
    transports: dict[tuple[int, int, int], NcclTransport] = field(default_factory=dict)  # (channel, src, dst)


@dataclass(frozen=True)
class TopoLink:
    """A path of NCCL's topology (the 'GPU/.. :GPU/.. (hops/bw/type)' lines): GB/s NCCL assumes."""
    src: str
    dst: str
    hops: int
    bw_gbps: float
    type: str                     # LOC, NVL, NVB, PIX, PXB, PHB, SYS, NET


@dataclass(frozen=True)
class GraphSearch:
    """One result of NCCL's graph search ('Pattern 4, ... nChannels 12, bw 20/20, type NVL/PIX')."""
    pattern: str
    nchannels: int
    bw_intra_gbps: float
    bw_inter_gbps: float
    type: str


@dataclass
class PerfResult:
    time_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    wrong: int | None


@dataclass
class PerfRow:
    size_bytes: int
    count: int
    type: str
    redop: str
    root: int | None
    out_of_place: PerfResult
    in_place: PerfResult | None


@dataclass
class PerfTest:
    name: str                          # all_reduce_perf, ...
    rows: list[PerfRow] = field(default_factory=list)
    avg_busbw_gbps: float | None = None


@dataclass(frozen=True)
class NcclWarning:
    """An NCCL WARN / ABORT line, or a line reporting an NCCL error: where it comes from."""
    level: str                    # WARN | ABORT | ERROR (a line that reports an NCCL error)
    text: str
    host: str | None
    pid: int | None
    device: int | None
    rank: int | None              # the launcher's label, else the rank of the thread's communicator
    file: str


@dataclass
class NcclLog:
    file: str
    nccl_version: str | None = None
    cuda_driver_version: int | None = None
    hosts: list[str] = field(default_factory=list)
    devices: dict[int, str] = field(default_factory=dict)       # nccl-tests rank -> device name
    env: dict[str, str] = field(default_factory=dict)           # "NCCL_X set by environment to Y"
    comms: dict[str, NcclComm] = field(default_factory=dict)
    topology: dict[tuple[str, str], TopoLink] = field(default_factory=dict)
    graphs: list[GraphSearch] = field(default_factory=list)
    #: (collective, datatype, op, bytes, comm_id) -> calls (NCCL_DEBUG_SUBSYS=COLL lines)
    ops: Counter = field(default_factory=Counter)
    #: (collective, bytes, algorithm, protocol, channels) -> calls
    algorithms: Counter = field(default_factory=Counter)
    perf: list[PerfTest] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    warning_count: int = 0
    warning_lines: list[NcclWarning] = field(default_factory=list)      # the first MAX_WARNINGS, with their origin
    files: list[str] = field(default_factory=list)                      # the logs of this run (several: merge_runs)
    env_by_rank: dict[str, dict[int, str]] = field(default_factory=dict)   # a variable set differently per rank
    lines: int = 0
    nccl_lines: int = 0


def read_nccl_log(path: str | Path) -> NcclLog:
    """Parse one NCCL debug log (plain text or .gz). Raises TraceError (one line, no file name)."""
    path = Path(path)
    try:
        raw = open_regular(path)             # a FIFO or device is never waited on
        head = raw.read(SNIFF_BYTES)
        raw.seek(0)
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    with raw:
        if not head:
            raise TraceError("empty file")
        gz = head[:2] == b"\x1f\x8b"
        if not gz and b"\x00" in head:
            raise TraceError("binary file, not a text log (NCCL_DEBUG=INFO writes text)")
        try:
            with io.TextIOWrapper(gzip.GzipFile(fileobj=raw) if gz else raw, encoding="utf-8",
                                  errors="replace") as text:
                log = _Parser(str(path)).parse(text)
        except (OSError, EOFError) as exc:
            raise TraceError(f"cannot decompress: {exc}") from exc
    if not log.nccl_lines and not log.perf:
        raise TraceError(f"no NCCL_DEBUG line and no nccl-tests output in {log.lines} lines: not an NCCL log")
    return log


class _Parser:
    def __init__(self, file: str) -> None:
        self.log = NcclLog(file=file)
        self.hosts: dict[str, None] = {}
        self.host_lengths: set[int] = set()
        self.thread_comm: dict[tuple, str] = {}       # (host, pid, tid) -> comm pointer
        self.device_comm: dict[tuple, str] = {}       # (host, pid, dev) -> comm pointer last initialised there
        self.ptr_comm: dict[str, str] = {}            # comm pointer -> comm key
        self.ptr_rank: dict[str, int] = {}
        self.table: list[str] | None = None           # nccl-tests header columns while inside its table
        self.cells: list[str] = []
        self.label: int | None = None                 # the launcher's rank label of the line being read

    def parse(self, lines: Iterable[str]) -> NcclLog:
        for line in lines:
            self.log.lines += 1
            if _LONG_NUMBER.search(line):           # no NCCL or nccl-tests line has one
                continue
            line = line.rstrip("\r\n")
            label = _LABEL.match(line)
            self.label = None
            if label:
                self.label = int(label["srun"] or label["mpi"] or label["torchrun"])
                line = line[label.end():]
            m = _PREFIX.search(line)
            stdout_part = line
            if m:
                host, head = self._host(m["host"], m.start() == 0)
                stdout_part = line[:m.start()] + head
                self.log.nccl_lines += 1
                key = (host, int(m["pid"]), int(m["tid"]))
                self._nccl(key, int(m["dev"]), m["level"], m["msg"].strip())
            elif _ERROR.search(line):
                self._warn("ERROR", line.strip(), None, None, None)
            if stdout_part.strip():
                self._stdout(stdout_part.strip())
        self.log.hosts = list(self.hosts)
        self.log.files = [self.log.file]
        return self.log

    def _warn(self, level: str, text: str, thread: tuple | None, dev: int | None, rank: int | None) -> None:
        log = self.log
        log.warning_count += 1
        if len(log.warnings) < MAX_WARNINGS:
            log.warnings.append(text)
            rank = self.label if self.label is not None else rank
            log.warning_lines.append(NcclWarning(level, text, thread[0] if thread else None,
                                                 thread[1] if thread else None, dev, rank, log.file))

    def _host(self, host: str, at_line_start: bool) -> tuple[str, str]:
        """(host, stdout text glued before it). A line that starts with the prefix names a host
        as is; mid-line, the host is a known host's suffix, else the text after a leading number."""
        if at_line_start:
            self._add_host(host)
            return host, ""
        for n in sorted(self.host_lengths, reverse=True):      # the longest known host first
            if n <= len(host) and host[len(host) - n:] in self.hosts:
                return host[len(host) - n:], host[:len(host) - n]
        glued = _LEADING_NUMBER.match(host)
        if glued:
            host = host[glued.end():]
        self._add_host(host)
        return host, glued.group() if glued else ""

    def _add_host(self, host: str) -> None:
        self.hosts.setdefault(host)
        self.host_lengths.add(len(host))

    # ---- NCCL lines
    def _nccl(self, thread: tuple, dev: int, level: str, msg: str) -> None:
        log = self.log
        if level in ("WARN", "ABORT"):
            ptr = self.thread_comm.get(thread)
            self._warn(level, msg, thread, dev, None if ptr is None else self.ptr_rank.get(ptr))
            return
        where = (thread[0], thread[1], dev)
        if (m := _COMM_PTR.search(msg)) and m[1] in self.ptr_comm:
            self.thread_comm[thread] = m[1]
        if m := _OP.match(msg):
            name, size = NCCL_DATATYPES.get(int(m["dtype"]), (f"datatype{m['dtype']}", 0))
            op = NCCL_REDOPS.get(int(m["op"]), f"op{m['op']}")
            log.ops[(m["coll"], name, op, int(m["count"]) * size, self.ptr_comm.get(m["ptr"], m["ptr"]))] += 1
        elif m := _ALGO.match(msg):
            channels = int(m["hi"]) - int(m["lo"]) + 1 if m["lo"] is not None else None
            log.algorithms[(m["coll"], int(m["bytes"]), m["algo"], m["proto"], channels)] += 1
        elif m := _TRANSPORT.match(msg):
            if comm := self._comm(thread, where):
                t = NcclTransport(int(m["channel"]), int(m["src"]), int(m["dst"]), m["via"], m["direction"])
                comm.transports.setdefault((t.channel, t.src, t.dst), t)
        elif m := _RING.match(msg):
            if comm := self._comm(thread, where):
                comm.rings[int(m["channel"])] = [int(r) for r in m["ranks"].split()]
                comm.coll_channels = comm.coll_channels or int(m["of"])
        elif msg.startswith("Trees "):
            if (comm := self._comm(thread, where)) is not None:
                for ch, c1, c2, c3, rank, parent in _TREES.findall(msg):
                    comm.trees.setdefault(int(ch), {})[int(rank)] = {
                        "parent": int(parent), "children": [int(c) for c in (c1, c2, c3) if int(c) >= 0]}
        elif (m := _INIT.search(msg)) and _INIT_DONE.search(msg, m.end()):
            self._init(m, thread, where)
        elif m := _COMM_SIZE.match(msg):
            if comm := self._by_ptr(m["ptr"]):
                comm.nnodes = int(m["nnodes"])
        elif m := _CHANNEL_COUNTS.search(msg):
            if comm := self._comm(thread, where):
                comm.coll_channels = int(m["coll"])
                comm.p2p_channels = int(m["p2p"])
                comm.collnet_channels = int(m["collnet"]) if m["collnet"] else None
                comm.nvls_channels = int(m["nvls"]) if m["nvls"] else None
        elif m := _PATHS.match(msg):
            for e in _PATH_ENTRY.finditer(m["rest"]):
                if e["type"] == "LOC":
                    continue
                link = TopoLink(m["src"], e["dst"], int(e["hops"]), float(e["bw"]), e["type"])
                old = log.topology.get((link.src, link.dst))
                if old is None or link.bw_gbps < old.bw_gbps:
                    log.topology[(link.src, link.dst)] = link
        elif m := _PATTERN.match(msg):
            p = int(m["pattern"])
            g = GraphSearch(GRAPH_PATTERNS.get(p, f"pattern{p}"), int(m["nch"]), float(m["intra"]),
                            float(m["inter"]), m["type"])
            if g not in log.graphs:
                log.graphs.append(g)
        elif m := _ENV.match(msg):
            log.env.setdefault(m[1], m[2].rstrip())
        elif m := _VERSION.search(msg):
            log.nccl_version = log.nccl_version or m[1]
        elif m := _DRIVER.search(msg):
            log.cuda_driver_version = log.cuda_driver_version or int(m[1])

    def _init(self, m: re.Match, thread: tuple, where: tuple) -> None:
        ptr, nranks = m["ptr"], int(m["nranks"])
        key = m["comm_id"] or self.ptr_comm.get(ptr) or f"nranks={nranks}"
        comm = self.log.comms.setdefault(key, NcclComm(comm_id=key, nranks=nranks))
        rank = int(m["rank"])
        comm.ranks[rank] = NcclRank(rank, nranks, key, int(m["cuda_dev"]),
                                    int(m["nvml_dev"]) if m["nvml_dev"] else None, m["bus_id"], thread[0], thread[1])
        self.ptr_comm[ptr], self.ptr_rank[ptr] = key, rank
        self.thread_comm[thread] = ptr
        self.device_comm[where] = ptr

    def _by_ptr(self, ptr: str | None) -> NcclComm | None:
        key = self.ptr_comm.get(ptr) if ptr else None
        return self.log.comms.get(key) if key else None

    def _comm(self, thread: tuple, where: tuple) -> NcclComm | None:
        return self._by_ptr(self.thread_comm.get(thread)) or self._by_ptr(self.device_comm.get(where))

    # ---- nccl-tests stdout
    def _stdout(self, text: str) -> None:
        log = self.log
        if text.startswith("#"):
            if m := _TEST_START.match(text):
                log.perf.append(PerfTest(m[1]))
            elif m := _TEST_DEVICE.match(text):
                log.devices[int(m["rank"])] = m["name"]
                self._add_host(m["host"])
            elif "size" in text and "busbw" in text:
                columns = text.lstrip("#").split()
                if "size" in columns and len(columns) <= MAX_TABLE_COLUMNS:
                    self.table, self.cells = columns, []
                    if not log.perf:
                        log.perf.append(PerfTest("nccl-tests"))
            elif m := _AVG_BUSBW.match(text):
                if log.perf:
                    log.perf[-1].avg_busbw_gbps = float(m[1])
                self.table = None
            elif text.startswith("# Out of bounds"):
                self.table = None
            return
        if self.table is None:
            return
        self.cells.extend(text.split())
        width, size = len(self.table), self.table.index("size")
        at = 0
        while len(self.cells) - at >= width:
            row = _perf_row(self.table, self.cells[at:at + width]) if self.cells[at + size].isdigit() else None
            if row is None:
                at += 1                  # not a row (another program's output): resynchronise
                continue
            log.perf[-1].rows.append(row)
            at += width
        del self.cells[:at]


def _num(text: str, kind=float):
    try:
        return kind(text)
    except ValueError:
        return None


def _perf_row(columns: list[str], cells: list[str]) -> PerfRow | None:
    """One nccl-tests result row by its header: key columns up to the first 'time', then groups of
    (time, algbw, busbw, #wrong) for out-of-place and in-place."""
    try:
        first = columns.index("time")
    except ValueError:
        return None
    keys = dict(zip(columns[:first], cells[:first]))
    size, count = _num(keys.get("size", ""), int), _num(keys.get("count", ""), int)
    if size is None or count is None or not keys.get("type", "x").isidentifier():
        return None
    groups = []
    for i in range(first, len(columns) - 3, 4):
        time_us, algbw, busbw, wrong = cells[i:i + 4]
        groups.append(PerfResult(_num(time_us), _num(algbw), _num(busbw), _num(wrong, int)))
    if not groups or groups[0].busbw_gbps is None:
        return None
    return PerfRow(size, count, keys.get("type", ""), keys.get("redop", ""), _num(keys.get("root", ""), int),
                   groups[0], groups[1] if len(groups) > 1 else None)


def merge_runs(logs: list[NcclLog]) -> list[NcclLog]:
    """The logs as runs: logs that hold other ranks of one communicator (`commId`) are one run,
    merged in the order given (per-rank files of one job); the others stay one run each. A variable set differently on
    the ranks of one run is kept per rank (`env_by_rank`), not taken for a difference between runs."""
    groups: list[list[NcclLog]] = []
    for log in logs:
        joined = [g for g in groups if _other_ranks_of_one_comm(log, g)]
        for g in joined[1:]:
            joined[0].extend(g)
            groups.remove(g)
        if joined:
            joined[0].append(log)
        else:
            groups.append([log])
    return [g[0] if len(g) == 1 else _merged(g) for g in groups]


def _other_ranks_of_one_comm(log: NcclLog, group: list[NcclLog]) -> bool:
    """Whether `log` shares a communicator with the logs of `group` and holds other ranks of it (a
    log and its copy, or two runs of one job, hold the same ranks: not one run)."""
    shared = False
    for key, comm in log.comms.items():
        if not key.startswith("0x"):
            continue
        theirs = {r for other in group if key in other.comms for r in other.comms[key].ranks}
        if theirs:
            if theirs & set(comm.ranks):
                return False
            shared = True
    return shared


def _merged(logs: list[NcclLog]) -> NcclLog:
    out = NcclLog(file=" + ".join(log.file for log in logs), files=[log.file for log in logs])
    out.nccl_version = next((log.nccl_version for log in logs if log.nccl_version), None)
    out.cuda_driver_version = next((log.cuda_driver_version for log in logs if log.cuda_driver_version), None)
    out.hosts = list(dict.fromkeys(h for log in logs for h in log.hosts))
    for log in logs:
        out.devices.update(log.devices)
        out.topology.update({k: v for k, v in log.topology.items() if k not in out.topology})
        out.graphs += [g for g in log.graphs if g not in out.graphs]
        out.ops.update(log.ops)
        out.algorithms.update(log.algorithms)
        out.perf += log.perf
        out.warnings += log.warnings[:MAX_WARNINGS - len(out.warnings)]
        out.warning_lines += log.warning_lines[:MAX_WARNINGS - len(out.warning_lines)]
        out.warning_count += log.warning_count
        out.lines += log.lines
        out.nccl_lines += log.nccl_lines
        for key, comm in log.comms.items():
            mine = out.comms.setdefault(key, NcclComm(comm_id=key, nranks=comm.nranks))
            mine.ranks.update(comm.ranks)
            for name in ("nnodes", "coll_channels", "collnet_channels", "nvls_channels", "p2p_channels"):
                if getattr(mine, name) is None:
                    setattr(mine, name, getattr(comm, name))
            for part in ("rings", "trees", "transports"):
                getattr(mine, part).update({k: v for k, v in getattr(comm, part).items()
                                            if k not in getattr(mine, part)})
    by_name: dict[str, dict[int, str]] = {}
    for log in logs:
        ranks = sorted({r for c in log.comms.values() for r in c.ranks}) or [-1]
        for name, value in log.env.items():
            by_name.setdefault(name, {})[ranks[0]] = value
    for name, values in by_name.items():
        if len(set(values.values())) == 1:          # one value (NCCL may print it on one rank only)
            out.env[name] = next(iter(values.values()))
        else:
            out.env_by_rank[name] = dict(sorted(values.items()))
    return out
