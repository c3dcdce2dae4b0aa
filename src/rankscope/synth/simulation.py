"""The model of time: one rank's simulation (`_RankSim`: main and autograd threads, compute and NCCL
streams, seeded noise), the network that resolves each all-reduce across ranks (`_Network`), and the
two passes over a job: the timing of all ranks in lock step, then one rank at a time with events."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rankscope.synth.constants import (
    AUTOGRAD_GAP_US,
    BUS_BANDWIDTH_GBPS,
    COLLECTIVE_END_JITTER_NS,
    COMM_STREAM,
    COMPUTE_STREAM,
    CPU_OP_SIGMA,
    DATALOADER_US,
    DEVICE_MEM_BASE_ADDR,
    FIRST_STEP,
    GPUS_PER_NODE,
    KERNEL_LAUNCH_LATENCY_NS,
    LAUNCH_CALL_US,
    LAUNCH_LOOP_US,
    NCCL_BASE_LATENCY_US,
    NCCL_HOP_LATENCY_US,
    NONE,
    OPTIMIZER_GAP_US,
    PYTHON_GAP_US,
    RANK_CPU_SPEED_SIGMA,
    RANK_GPU_SPEED_SIGMA,
    RESERVE_GRANULE_BYTES,
    SCALAR,
    STEP_START_JITTER_US,
    TENSORS,
    TRACE_ORIGIN_NS,
    TRANSFER_SIGMA,
)
from rankscope.synth.faults import _JobFaults, _RankFaults
from rankscope.synth.events import _NULL_SINK, _EventSink, _NullSink
from rankscope.synth.model import _round_up
from rankscope.synth.program import SEQ_BWD, SEQ_BWD_INNER, SEQ_FWD, AllReduce, Kernel, Memcpy, Op, Program
from rankscope.synth.program_changes import _rank_programs


class _Noise:
    """Draws from a seeded Generator, fetched in blocks (fast scalar access): standard normals,
    and ready-made lognormal factors for host durations (the hot path)."""
    BLOCK = 1024

    def __init__(self, rng: np.random.Generator):
        self._rng = rng
        self._normal: list[float] = []
        self._cpu: list[float] = []

    def z(self) -> float:
        if not self._normal:
            self._normal = self._rng.standard_normal(self.BLOCK).tolist()[::-1]
        return self._normal.pop()

    def factor(self, sigma: float) -> float:
        return math.exp(sigma * self.z())

    def cpu(self) -> float:
        if not self._cpu:
            self._cpu = np.exp(CPU_OP_SIGMA * self._rng.standard_normal(self.BLOCK)).tolist()
        return self._cpu.pop()


@dataclass
class _PendingComm:
    op: AllReduce
    seq: int
    ext: int
    corr: int
    launch_tid: int
    launch_ts: int
    ready_ns: int            # earliest start on this rank: launched and its gradients computed


def _rank_pid(rank: int) -> int:
    return 2_910_249 + 7_919 * rank


@dataclass(frozen=True)
class Cycle:
    """Which profiler cycle of a run a simulation writes: its index (0: a job of one cycle), the number of
    its first ProfilerStep and how much later than the first cycle it starts (ns). A rank keeps its speed
    from cycle to cycle; the noise of each cycle is its own."""
    index: int = 0
    first_step: int = FIRST_STEP
    offset_ns: int = 0


class _RankSim:
    """One rank's main thread, autograd thread and two GPU streams on the job timeline."""

    def __init__(self, rank: int, world: int, program: Program, faults: _RankFaults, overlap_comm: bool,
                 seed: int, sink: _NullSink | _EventSink, cycle: Cycle = Cycle()):
        self.world, self.program, self.faults = world, program, faults
        self.overlap_comm = overlap_comm
        self._backward_nodes = program.backward if overlap_comm else tuple(map(_without_all_reduce, program.backward))
        self.sink = sink
        self.device = rank % GPUS_PER_NODE
        self.pid = _rank_pid(rank)
        self.main_tid, self.autograd_tid = self.pid, self.pid + 9_503
        self._noise = _Noise(np.random.default_rng([seed, rank]))
        self._cpu_ns_per_us = 1000 * self._noise.factor(RANK_CPU_SPEED_SIGMA)
        self._gpu_speed = self._noise.factor(RANK_GPU_SPEED_SIGMA)
        if cycle.index:
            self._noise = _Noise(np.random.default_rng([seed, rank, cycle.index]))
        self.first_step = cycle.first_step
        self._compute_scale = 1.0 + faults.gpu_compute_delay_ns / (program.compute_us_per_step * 1000)
        self._stream_free = {COMPUTE_STREAM: 0, COMM_STREAM: 0}
        self._ext = self._corr = 0
        self._seq_nr = 40_000 + 1_000 * cycle.first_step
        self._collective_seq = len(program.buckets) * cycle.first_step
        self._fwd_seqs: list[tuple[int, int, int]] = []     # (seq, tid, ts) of forward ops awaiting backward
        self._bwd_seq: tuple[int, int, int] = (0, 0, 0)
        self._allocated = program.static_bytes
        self._reserved = _round_up(self._allocated, RESERVE_GRANULE_BYTES)
        self._pending: list[_PendingComm] = []
        self._step_handle: Any = None       # the sink's handle of the step's annotation
        self._step_start = 0
        self.t_main = int(STEP_START_JITTER_US * 1000 * (0.5 + 0.5 * math.tanh(self._noise.z())))
        self.step_spans: list[tuple[int, int]] = []
        self.profile_start = self.t_main - 350_000
        self.last_activity = 0

    # ---- time helpers

    def _cpu_ns(self, us: float) -> int:
        return max(1, int(us * self._cpu_ns_per_us * self._noise.cpu()))

    def _kernel_ns(self, kernel: Kernel) -> int:
        speed = self._gpu_speed * self._compute_scale * self._noise.factor(kernel.sigma)
        return max(1_000, int(kernel.dur_us * 1000 * speed))

    def _next_ext(self) -> int:
        self._ext += 1
        return self._ext

    def _next_corr(self) -> int:
        self._corr += 1
        return self._corr

    # ---- ops

    def _run(self, item: Op | AllReduce, tid: int, t: int) -> int:
        """Run an op tree starting at t on thread tid; return when it ends."""
        if isinstance(item, AllReduce):
            return self._all_reduce(item, tid, t)
        op, ext = item, self._next_ext()
        handle = self.sink.begin(op, tid, t, ext, self._sequence_number(op, tid, t) if op.seq else None)
        half_self_ns = self._cpu_ns(op.self_us * 0.5)        # one draw: before and after the children
        t += half_self_ns
        if op.mem:
            self._memory(tid, t, *op.mem)
        for child in op.children:
            t = self._run(child, tid, t)
        launch = op.launch
        if launch is not None:
            t = self._launch_or_copy(launch, tid, t, ext)
            for _ in range(op.launches - 1):
                t = self._launch_or_copy(launch, tid, t + self._cpu_ns(LAUNCH_LOOP_US), ext)
        t += half_self_ns
        self.sink.end(handle, t)
        return t

    def _sequence_number(self, op: Op, tid: int, t: int) -> int | None:
        if op.seq == SEQ_FWD:
            self._seq_nr += 1
            self._fwd_seqs.append((self._seq_nr, tid, t))
            return self._seq_nr
        if op.seq == SEQ_BWD:
            self._bwd_seq = self._fwd_seqs.pop()
            return self._bwd_seq[0]
        if op.seq == SEQ_BWD_INNER:
            seq, fwd_tid, fwd_ts = self._bwd_seq
            self.sink.fwdbwd(fwd_tid, fwd_ts, tid, t)
            return seq
        return None

    def _launch_or_copy(self, launch: Kernel | Memcpy, tid: int, t: int, ext: int) -> int:
        return self._launch(launch, tid, t, ext) if isinstance(launch, Kernel) else self._memcpy(launch, tid, t, ext)

    def _launch(self, kernel: Kernel, tid: int, t: int, ext: int) -> int:
        corr, call_ns = self._next_corr(), self._cpu_ns(LAUNCH_CALL_US)
        start = max(t + KERNEL_LAUNCH_LATENCY_NS, self._stream_free[COMPUTE_STREAM])
        dur = self._kernel_ns(kernel)
        self._stream_free[COMPUTE_STREAM] = start + dur
        self.sink.runtime("cudaLaunchKernel", 211, tid, t, call_ns, ext, corr)
        self.sink.kernel(kernel.name, start, dur, COMPUTE_STREAM, ext, corr, kernel.static_args)
        self.sink.flow(corr, tid, t, COMPUTE_STREAM, start)
        return t + call_ns

    def _memcpy(self, copy: Memcpy, tid: int, t: int, ext: int) -> int:
        corr = self._next_corr()
        start = max(t + KERNEL_LAUNCH_LATENCY_NS, self._stream_free[COMPUTE_STREAM])
        dur = max(1_000, int((1_200 + copy.nbytes / copy.bandwidth_gbps) * self._noise.factor(0.05)))
        self._stream_free[COMPUTE_STREAM] = start + dur
        call_ns = start + dur + 3_000 - t if copy.blocking else self._cpu_ns(8.0)
        self.sink.runtime("cudaMemcpyAsync", 41, tid, t, call_ns, ext, corr)
        self.sink.memcpy(copy, start, dur, ext, corr)
        self.sink.flow(corr, tid, t, COMPUTE_STREAM, start)
        t += call_ns
        if copy.blocking:
            t = self._runtime_call("cudaStreamSynchronize", 131, tid, t, ext, 2.0)
        return t

    def _runtime_call(self, name: str, cbid: int, tid: int, t: int, ext: int, us: float) -> int:
        dur = self._cpu_ns(us)
        self.sink.runtime(name, cbid, tid, t, dur, ext, self._next_corr())
        return t + dur

    def _memory(self, tid: int, t: int, nbytes: int, addr_offset: int) -> None:
        self._allocated += nbytes
        self._reserved = max(self._reserved, _round_up(self._allocated, RESERVE_GRANULE_BYTES))
        self.sink.memory(tid, t, nbytes, self._allocated, self._reserved, DEVICE_MEM_BASE_ADDR + addr_offset)

    def _all_reduce(self, op: AllReduce, tid: int, t: int) -> int:
        """c10d::allreduce_ > record_param_comms > nccl:all_reduce > cudaLaunchKernelExC, as DDP records it.
        The NCCL kernel is written once the collective is resolved across ranks (finish_step)."""
        self._collective_seq += 1
        outer = self.sink.begin(_C10D_ALLREDUCE, tid, t, self._next_ext(), None)
        t += self._cpu_ns(_C10D_ALLREDUCE.self_us / 2)
        ext = self._next_ext()
        record = self.sink.begin(_RECORD_PARAM_COMMS, tid, t, ext, None,
                                 extra=self._collective_args(op, self._collective_seq))
        t += self._cpu_ns(_RECORD_PARAM_COMMS.self_us / 2)
        t = self._runtime_call("cudaEventRecord", 135, tid, t, ext, 2.0)
        t = self._runtime_call("cudaStreamWaitEvent", 147, tid, t, ext, 1.8)
        annotation = self.sink.annotation("nccl:all_reduce", tid, t, self._next_ext())
        t += self._cpu_ns(12.0)
        corr, call_ns = self._next_corr(), self._cpu_ns(12.0)
        ready = max(t + KERNEL_LAUNCH_LATENCY_NS, self._stream_free[COMPUTE_STREAM])
        self.sink.runtime("cudaLaunchKernelExC", 430, tid, t, call_ns, ext, corr)
        self._pending.append(_PendingComm(op, self._collective_seq, ext, corr, tid, t, ready))
        t += call_ns + self._cpu_ns(8.0)
        self.sink.end(annotation, t)
        t = self._runtime_call("cudaEventRecord", 135, tid, t, ext, 1.0)
        t += self._cpu_ns(_RECORD_PARAM_COMMS.self_us / 2)
        self.sink.end(record, t)
        t += self._cpu_ns(_C10D_ALLREDUCE.self_us / 2)
        self.sink.end(outer, t)
        return t

    def _collective_args(self, op: AllReduce, seq: int) -> dict:
        return {"Collective name": "allreduce", "In msg nelems": op.nelems, "Out msg nelems": op.nelems,
                "Group size": self.world, "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]",
                "Process Group Name": "0", "Process Group Description": "default_pg",
                "Process Group Ranks": _ranks_string(self.world), "Seq": seq}

    # ---- a step, in two halves around the cross-rank collectives

    def run_until_collectives(self, step_index: int) -> list[int]:
        """Host work of a step up to the end of backward; returns each all-reduce's ready time (ns)."""
        self._pending = []
        t = self._step_start = self.t_main
        step_name = f"ProfilerStep#{self.first_step + step_index}"
        self._step_handle = self.sink.annotation(step_name, self.main_tid, t, self._next_ext())
        t += self._cpu_ns(20.0)
        t = self._timed_annotation("Optimizer.zero_grad#AdamW.zero_grad", t, self._cpu_ns(45.0))
        t += self._cpu_ns(15.0)
        loader_ns = self._cpu_ns(DATALOADER_US) + self.faults.dataloader_delay_ns
        t = self._timed_annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t, loader_ns)
        for op in self.program.inputs:
            t = self._run(op, self.main_tid, t + self._cpu_ns(PYTHON_GAP_US))
        t = self._forward(t)
        t += self.faults.host_idle_ns                      # busy outside any profiled op
        t = self._run(self.program.backward_seed, self.main_tid, t + self._cpu_ns(PYTHON_GAP_US))
        t = self._backward(t + self._cpu_ns(25.0)) + self._cpu_ns(20.0)
        if not self.overlap_comm:
            for bucket in self.program.buckets:
                t = self._all_reduce(bucket, self.main_tid, t + self._cpu_ns(PYTHON_GAP_US))
            t = self._wait_for_collectives(self.main_tid, t)
        self.t_main = t
        return [p.ready_ns for p in self._pending]

    def finish_step(self, spans_ns: list[tuple[int, int]]) -> None:
        """Write the step's NCCL kernels (start, end given by the network), then optimizer and sync."""
        for pending, (start, end) in zip(self._pending, spans_ns):
            self._write_nccl_kernel(pending, start, end)
            self._stream_free[COMPUTE_STREAM] = max(self._stream_free[COMPUTE_STREAM], end)
            self._stream_free[COMM_STREAM] = end
        t = self.t_main + self._cpu_ns(PYTHON_GAP_US)
        optimizer = self.sink.annotation("Optimizer.step#AdamW.step", self.main_tid, t, self._next_ext())
        t += self._cpu_ns(30.0)
        for op in self.program.optimizer:
            t = self._run(op, self.main_tid, t) + self._cpu_ns(OPTIMIZER_GAP_US)
        self.sink.end(optimizer, t)
        t = self._run(self.program.sync, self.main_tid, t + self._cpu_ns(PYTHON_GAP_US))
        t += self._cpu_ns(30.0)
        self.sink.end(self._step_handle, t)
        self.step_spans.append((self._step_start, t))
        self.last_activity = max(t, self._stream_free[COMPUTE_STREAM])
        self.t_main = t + self._cpu_ns(12.0)

    def _timed_annotation(self, name: str, t: int, dur: int) -> int:
        handle = self.sink.annotation(name, self.main_tid, t, self._next_ext())
        self.sink.end(handle, t + dur)
        return t + dur

    def _forward(self, t: int) -> int:
        t += self._cpu_ns(PYTHON_GAP_US)
        ddp = self.sink.annotation("DistributedDataParallel.forward", self.main_tid, t, self._next_ext())
        t += self._cpu_ns(40.0)
        for op in self.program.forward:
            t = self._run(op, self.main_tid, t) + self._cpu_ns(PYTHON_GAP_US)
        self.sink.end(ddp, t)
        for op in self.program.loss:
            t = self._run(op, self.main_tid, t + self._cpu_ns(PYTHON_GAP_US))
        return t

    def _backward(self, t: int) -> int:
        """The autograd thread runs the backward nodes; DDP's all-reduces launch from inside them
        (overlap) or are left for the main thread after backward (no_overlap). Returns its end."""
        tid = self.autograd_tid
        for node in self._backward_nodes:
            t = self._run(node, tid, t) + self._cpu_ns(AUTOGRAD_GAP_US)
        return self._wait_for_collectives(tid, t) if self.overlap_comm else t

    def _wait_for_collectives(self, tid: int, t: int) -> int:
        """work.wait() per bucket: the compute stream waits on the NCCL stream (no host block)."""
        for pending in self._pending:
            t = self._runtime_call("cudaStreamWaitEvent", 147, tid, t, pending.ext, 1.5)
        return t

    def _write_nccl_kernel(self, pending: _PendingComm, start: int, end: int) -> None:
        op = pending.op
        self.sink.kernel(op.kernel_name, start, end - start, COMM_STREAM, pending.ext, pending.corr, _NCCL_STATIC_ARGS,
                         extra=self._collective_args(op, pending.seq))
        self.sink.flow(pending.corr, pending.launch_tid, pending.launch_ts, COMM_STREAM, start)


_C10D_ALLREDUCE = Op("c10d::allreduce_", 50.0, inputs=(TENSORS, ([], "__torch__.torch.classes.c10d.ProcessGroup"),
                                                        ([], "__torch__.torch.classes.c10d.ReduceOp"), NONE, SCALAR))
_RECORD_PARAM_COMMS = Op("record_param_comms", 66.0)
_NCCL_STATIC_ARGS = Kernel("nccl", 0.0, grid=(24, 1, 1), block=(640, 1, 1), registers=96,
                           shared_mem=103_808).static_args


def _without_all_reduce(op: Op) -> Op:
    if not any(isinstance(c, AllReduce) for c in op.children):
        return op
    return replace(op, children=tuple(c for c in op.children if not isinstance(c, AllReduce)))


_RANKS_STRINGS: dict[int, str] = {}


def _ranks_string(world: int) -> str:
    if world not in _RANKS_STRINGS:
        _RANKS_STRINGS[world] = str(list(range(world)))
    return _RANKS_STRINGS[world]


# ---- The job's timeline: collectives across ranks, the two passes

class _Network:
    """Resolves each all-reduce across ranks: it ends everywhere at max(ready) + transfer time."""

    def __init__(self, world: int, seed: int, buckets: tuple[AllReduce, ...], cycle: int = 0):
        self._rng = np.random.default_rng([seed, 1 << 32] + ([cycle] if cycle else []))   # a stream no rank uses
        latency_us = NCCL_BASE_LATENCY_US + NCCL_HOP_LATENCY_US * math.log2(max(world, 2))
        bus_factor = 2 * (world - 1) / world                      # ring all-reduce: busbw = algbw * 2(n-1)/n
        self._transfer_ns = np.array([latency_us * 1000 + b.nbytes * bus_factor / BUS_BANDWIDTH_GBPS for b in buckets])

    def resolve(self, ready_ns: np.ndarray) -> np.ndarray:
        """ready_ns: (ranks, collectives) earliest starts. Returns (ranks, collectives, 2): start, end."""
        world, count = ready_ns.shape
        transfer = (self._transfer_ns * np.exp(TRANSFER_SIGMA * self._rng.standard_normal(count))).astype(np.int64)
        jitter = self._rng.integers(0, COLLECTIVE_END_JITTER_NS, size=(world, count))
        spans = np.empty((world, count, 2), dtype=np.int64)
        stream_free = np.zeros(world, dtype=np.int64)
        for c in range(count):
            start = np.maximum(ready_ns[:, c], stream_free)
            stream_free = start.max() + transfer[c] + jitter[:, c]
            spans[:, c, 0], spans[:, c, 1] = start, stream_free
        return spans


@dataclass(frozen=True)
class _Timeline:
    comm_spans: np.ndarray                    # (steps, ranks, collectives, 2) ns
    step_spans: list[list[tuple[int, int]]]   # per rank, per step: (start, end) ns


def _simulate_timing(program: Program, world: int, steps: int, seed: int, faults: _JobFaults,
                     cycle: Cycle = Cycle()) -> _Timeline:
    """All ranks in lock step, no events: where every collective starts and ends on every rank."""
    programs = _rank_programs(program, faults)
    sims = [_RankSim(r, world, programs[r], faults.ranks[r], faults.overlap_comm, seed, _NULL_SINK, cycle)
            for r in range(world)]
    network = _Network(world, seed, program.buckets, cycle.index)
    comm_spans = np.empty((steps, world, len(program.buckets), 2), dtype=np.int64)
    for step in range(steps):
        ready = np.array([sim.run_until_collectives(step) for sim in sims], dtype=np.int64)
        comm_spans[step] = network.resolve(ready)
        for sim, spans in zip(sims, comm_spans[step].tolist()):
            sim.finish_step(spans)
    return _Timeline(comm_spans, [sim.step_spans for sim in sims])


def _simulate_rank(rank: int, world: int, program: Program, faults: _JobFaults, seed: int,
                   timeline: _Timeline, cycle: Cycle = Cycle()) -> tuple[_RankSim, _EventSink]:
    """Replay one rank with events; its collectives take their times from the timing pass."""
    sink = _EventSink(_rank_pid(rank), rank % GPUS_PER_NODE,
                      TRACE_ORIGIN_NS + cycle.offset_ns + faults.ranks[rank].clock_offset_ns)
    sim = _RankSim(rank, world, program, faults.ranks[rank], faults.overlap_comm, seed, sink, cycle)
    for step in range(len(timeline.comm_spans)):
        sim.run_until_collectives(step)
        sim.finish_step(timeline.comm_spans[step, rank].tolist())
    return sim, sink
