"""Synthetic jobs of a parallel layout (pipeline x data x expert x tensor parallel) with ground truth:
`generate_layout_job(out, spec)`, `rankscope synth OUT --layout SPEC` (grammar: `LAYOUT_HELP`).

Every rank writes what torch.profiler writes on an H100 with NCCL, in the current Kineto format:
ProfilerStep#N, cpu_op / user_annotation / cuda_runtime / kernel events with correlation ids and
ac2g flows, compute kernels on stream 7, each process group's NCCL kernels on its own stream,
record_param_comms host ops and NCCL kernel args with the process-group fields (Collective name,
In / Out msg nelems, Group size, dtype, In / Out split size, Process Group Name / Description /
Ranks, Seq), and distributedInfo with pg_config listing every group the rank belongs to.

The model of time (int ns on one job timeline), simple but causal:
- the host issues a step's work ahead of the GPU (a few µs per op) and blocks only at the step's end
  (`loss.item()`), so the next step starts when this rank's GPU is done;
- a kernel starts at max(its launch + latency, its stream free, the ends of what it waits on); as in
  ProcessGroupNCCL, every NCCL op first waits on the compute stream's work issued before it;
- a collective's kernels end on every member at max(members' arrival) + transfer (+ a few µs):
  the early members wait inside their NCCL kernel; a recv and its send both end at the later of
  their starts + transfer. Point-to-point ops use one NCCL stream per peer pair (ProcessGroupNCCL's
  p2p communicators); 1F1B and interleaved schedules batch a send with the next recv from the same
  peer (torch.distributed.pipelining's fused fwd_sends + bwd_recvs, Megatron's
  send_forward_recv_backward): batched ops start together on that stream; Megatron's interleaved
  schedule batches each iteration's sends and recvs to both neighbours, modelled as one stream per
  (peer, direction, activation or gradient);
- compute: per microbatch and model chunk, `LAYERS_PER_CHUNK` transformer layers (attention and
  MLP halves; MoE layers with ep >= 2), an embedding on the first virtual stage and the output head
  and loss on the last; backward twice the forward; tensor parallel divides the compute by tp;
- tensor parallel: an all_reduce after each half, in forward and backward; healthy, the compute goes
  on beside it (the wait comes one half later); `exposed_tp`: 4x larger and waited on at once;
- data parallel: DDP all_reduces each layer's gradients in the last backward of its chunk (beside
  the rest of backward); FSDP (`fsdp=1`) all_gathers each layer's parameters before each use,
  prefetched one use ahead (healthy) or issued when needed (`no_prefetch`), and reduce_scatters
  the gradients in the last backward; the optimizer waits for them;
- expert parallel: dispatch and combine all_to_all around the experts (and their backward), with
  per-peer split sizes; the experts compute in proportion to the tokens a rank receives;
- noise: per rank a GPU speed (1%), per kernel 2%, per transfer 3%, per host op 10% (drawn from --seed); faults
  never draw from them, so a faulty job is draw for draw its healthy twin plus the fault.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any
from operator import itemgetter
from pathlib import Path
from statistics import NormalDist

import msgspec
import numpy as np

from rankscope.files import atomic_write_bytes
from rankscope.synth.constants import (
    BASE_TIME_NS,
    COLLECTIVE_END_JITTER_NS,
    COMPUTE_STREAM,
    FIRST_STEP,
    GENERATOR,
    GENERATOR_VERSION,
    GPUS_PER_NODE,
    GROUND_TRUTH_FILE,
    GROUND_TRUTH_SCHEMA,
    KERNEL_LAUNCH_LATENCY_NS,
    TRACE_ORIGIN_NS,
)
from rankscope.synth.job import _clear_earlier_job, _gc_paused
from rankscope.synth.kernels import (
    _FLASH_BWD,
    _FLASH_FWD,
    _FUSED_ADAMW,
    _GELU,
    _GELU_BWD,
    _GEMM_NN,
    _GEMM_NT,
    _GEMM_TN,
    _LOG_SOFTMAX,
    _LOG_SOFTMAX_BWD,
    _NLL_BWD,
    _NLL_FWD,
    _ew,
    _gemm,
)
from rankscope.synth.kineto import _DEVICE_PROPERTIES, _encode_trace, _gzip_bytes, _profiler_span_events, _trace_id
from rankscope.synth.layouts_spec import (
    FAULT_KEYS,
    LAYOUT_HELP,
    Action,
    LayoutSpec,
    ProcessGroup,
    parse_layout,
    process_groups,
    rank_process_groups,
    schedule_actions,
)
from rankscope.synth.simulation import _Noise, _rank_pid

__all__ = ["generate_layout_job", "parse_layout", "LayoutSpec", "LAYOUT_HELP", "LAYOUT_FINDINGS",
           "layout_expected_findings"]

# ---- the model and the machine
HIDDEN = 4096
MB_TOKENS = 2048                 # tokens per microbatch (sequence 2048 x micro-batch size 1)
TOPK = 2                         # experts per token (MoE layers)
LAYERS_PER_CHUNK = 2             # transformer layers per model chunk
LAYER_FWD_US = 2000.0            # a layer's forward per microbatch, tp = 1 (24 s h^2 FLOPs at ~400 TFLOPS)
BWD_FACTOR = 2.0
HEAD_SHARE = 0.3                 # output head + loss, in layers
EMBED_SHARE = 0.03
ACT_NELEMS = MB_TOKENS * HIDDEN  # activations sent between stages / all-reduced by tensor parallel
LAYER_PARAMS = 12 * HIDDEN * HIDDEN
P2P_GBPS = 50.0                  # between pipeline stages (across nodes)
TP_BUSBW_GBPS = 200.0            # NVLink
EP_BUSBW_GBPS = 150.0
DP_BUSBW_GBPS = 200.0
NCCL_LATENCY_US = 12.0
EXPOSED_TP_SCALE = 4             # exposed_tp: all_reduces this many times larger
ADAM_BYTES_PER_PARAM = 16
HBM_GBPS = 2000.0
GPU_SPEED_SIGMA, KERNEL_SIGMA, TRANSFER_SIGMA = 0.01, 0.02, 0.03
TP_STREAM, EP_STREAM, DP_STREAM, P2P_STREAM0 = 20, 24, 28, 32

#: The layout findings (docs/findings.md) the generator's faults stand for.
LAYOUT_FINDINGS = ("pipeline_stage_imbalance", "pipeline_bubble", "fsdp_exposed_gather", "tp_comm_exposed",
                   "expert_imbalance")
_FINDING_OF_FAULT = {"slow_stage": "pipeline_stage_imbalance", "no_prefetch": "fsdp_exposed_gather",
                     "exposed_tp": "tp_comm_exposed", "expert_skew": "expert_imbalance"}
#: What the same fault may cause downstream (a correct analysis may add these).
_SIDE_FINDINGS = {
    "slow_stage": ("straggler_rank", "load_imbalance", "exposed_communication", "low_overlap", "comm_bound",
                   "gpu_idle_host_bound", "pipeline_bubble"),
    "no_prefetch": ("exposed_communication", "low_overlap", "comm_bound", "pipeline_bubble"),
    "exposed_tp": ("exposed_communication", "low_overlap", "comm_bound", "pipeline_bubble"),
    "expert_skew": ("straggler_rank", "load_imbalance", "exposed_communication", "low_overlap", "comm_bound",
                    "pipeline_stage_imbalance", "pipeline_bubble"),
}

_NCCL_STATIC = _ew("nccl", 0.0).__class__("nccl", 0.0, grid=(24, 1, 1), block=(640, 1, 1), registers=96,
                                           shared_mem=103_808).static_args
_EMBED = ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, "
          "true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<"
          "c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, "
          "unsigned int, unsigned int, long)")
_EMBED_BWD = ("void at::native::(anonymous namespace)::embedding_backward_feature_kernel<c10::BFloat16, float, long>"
              "(long const*, c10::BFloat16 const*, c10::BFloat16*, int, long, int, int)")
_KERNEL_ARGS: dict[str, dict] = {}


def _static_args(name: str) -> dict:
    if name not in _KERNEL_ARGS:
        gemm = "gemm" in name or "flash" in name
        _KERNEL_ARGS[name] = (_gemm(name, 0.0) if gemm else _ew(name, 0.0)).static_args
    return _KERNEL_ARGS[name]


# (kernel, host op, share of the half layer)
_ATT_FWD = ((_GEMM_TN, "aten::mm", 0.35), (_FLASH_FWD, "aten::_flash_attention_forward", 0.30),
            (_GEMM_TN, "aten::mm", 0.35))
_MLP_FWD = ((_GEMM_TN, "aten::mm", 0.45), (_GELU, "aten::gelu", 0.10), (_GEMM_TN, "aten::mm", 0.45))
_ATT_BWD = ((_GEMM_NN, "aten::mm", 0.35), (_FLASH_BWD, "aten::_flash_attention_backward", 0.30),
            (_GEMM_NT, "aten::mm", 0.35))
_MLP_BWD = ((_GEMM_NN, "aten::mm", 0.45), (_GELU_BWD, "aten::gelu_backward", 0.10), (_GEMM_NT, "aten::mm", 0.45))
_ROUTER = (_GEMM_TN, "aten::mm", 0.05)
_HEAD_FWD = ((_GEMM_TN, "aten::mm", 0.8), (_LOG_SOFTMAX, "aten::_log_softmax", 0.12),
             (_NLL_FWD, "aten::nll_loss_forward", 0.08))
_HEAD_BWD = ((_NLL_BWD, "aten::nll_loss_backward", 0.08), (_LOG_SOFTMAX_BWD, "aten::_log_softmax_backward_data", 0.12),
             (_GEMM_NN, "aten::mm", 0.8))

# NCCL ops: (c10d op, nccl annotation, Collective name, kernel)
_AR = ("c10d::allreduce_", "nccl:all_reduce", "allreduce",
       "ncclDevKernel_AllReduce_Sum_bf16_RING_LL128(ncclDevKernelArgsStorage<4096ul>)")
_AG = ("c10d::_allgather_base_", "nccl:_all_gather_base", "_allgather_base",
       "ncclDevKernel_AllGather_RING_LL128(ncclDevKernelArgsStorage<4096ul>)")
_RS = ("c10d::_reduce_scatter_base_", "nccl:_reduce_scatter_base", "_reduce_scatter_base",
       "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL128(ncclDevKernelArgsStorage<4096ul>)")
_A2A = ("c10d::alltoall_base_", "nccl:all_to_all", "all_to_allv",
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")
_SEND = ("c10d::send", "nccl:send", "send", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")
_RECV = ("c10d::recv_", "nccl:recv", "recv", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")


class _Task:
    """One GPU activity of a step: a compute kernel ("k"), a collective's kernel ("c"), a send or recv
    ("p") or the step's final device-to-host copy ("m"), with what the host did to launch it."""
    __slots__ = ("stream", "kind", "dur", "deps", "launch", "key", "members", "transfer", "start", "end",
                 "name", "host", "args", "ext", "corr", "batch")

    def __init__(self, stream, kind, dur, deps, launch, name, host, ext, corr, key=None, members=1, transfer=0,
                 args=None):
        self.stream, self.kind, self.dur, self.deps, self.launch = stream, kind, dur, deps, launch
        self.name, self.host, self.ext, self.corr = name, host, ext, corr
        self.key, self.members, self.transfer, self.args = key, members, transfer, args
        self.start = self.end = None
        self.batch = None          # p2p ops batched together (batch_isend_irecv): they start together


def _hash_normal(*key) -> float:
    u = (zlib.crc32(repr(key).encode()) + 0.5) / 2 ** 32
    return NormalDist().inv_cdf(u)


def _hash_uniform(*key) -> float:
    return (zlib.crc32(repr(key).encode()) + 0.5) / 2 ** 32


def _nccl_latency_ns(n: int) -> int:
    return int((NCCL_LATENCY_US + 1.5 * math.log2(max(n, 2))) * 1000)


def _split_tokens(total: int, n: int, hot: int | None, factor: float) -> list[int]:
    """Tokens a rank sends to each of the n members of its expert group: even, or `factor` x as
    many to member `hot`; they sum to `total`."""
    if hot is None:
        out = [total // n] * n
    else:
        other = int(round(total / (n - 1 + factor)))
        out = [other] * n
        out[hot] = 0
    out[hot if hot is not None else n - 1] += total - sum(out)
    return out


@dataclass
class _Group:
    pg: ProcessGroup
    local: int                     # this rank's index in the group

    @property
    def size(self) -> int:
        return len(self.pg.ranks)


class _RankBuilder:
    """One rank: issues each step's host work and GPU tasks (`build_step`); after the job's timing is
    solved, turns them into Kineto events (`events`)."""
    # the step being built (`build_step`)
    pending_waits: list[int]
    last_compute: int | None
    last_p2p: tuple[int, int, bool] | None
    last_compute_at_p2p: int | None

    def __init__(self, spec: LayoutSpec, rank: int, groups: list[ProcessGroup], seed: int):
        self.spec, self.rank, self.seed = spec, rank, seed
        self.coords = spec.coords(rank)
        self.stage = self.coords["pp"]
        self.device = rank % GPUS_PER_NODE
        self.pid = _rank_pid(rank)
        self.main_tid, self.autograd_tid = self.pid, self.pid + 9_503
        self.groups = rank_process_groups(groups, rank)
        by_dim = {g.dim: g for g in self.groups if g.dim}
        self.dim_group = {d: _Group(g, g.ranks.index(rank)) for d, g in by_dim.items()}
        self.noise = _Noise(np.random.default_rng([seed, rank]))
        self.gpu_speed = self.noise.factor(GPU_SPEED_SIGMA)
        self.actions = schedule_actions(spec, self.stage)
        self.pg_seq: dict[str, int] = {}
        self.p2p_seq: dict[str, int] = {}
        self.p2p_streams: dict[tuple | int, int] = {}
        self.ext = self.corr = 0
        self.t = int(150_000 * _hash_uniform(seed, "start", rank))
        self.profile_start = self.t - 350_000
        self.steps: list[dict] = []           # per step: tasks, host spans, start, end
        slow = spec.slow_stage is not None and spec.slow_stage == self.stage
        self.compute_scale = (spec.factor if slow else 1.0) / spec.tp
        self.expert_scale, self.hot_local = 1.0, None
        if spec.ep >= 2 and spec.expert_skew is not None:
            ep = self.dim_group["ep"].pg.ranks
            if spec.expert_skew in ep:
                self.hot_local = ep.index(spec.expert_skew)
                n, f = spec.ep, spec.factor
                self.expert_scale = n * f / (n - 1 + f) if rank == spec.expert_skew else n / (n - 1 + f)

    # ---- host helpers

    def _cpu(self, us: float) -> int:
        return max(1, int(us * 1000 * self.noise.cpu()))

    def _next_ext(self) -> int:
        self.ext += 1
        return self.ext

    def _next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def _span(self, cat: str, name: str, tid: int, t0: int, t1: int, args: dict | None = None) -> None:
        self.spans.append((cat, name, tid, t0, t1, self._next_ext(), args))

    # ---- GPU work, issued by the host at self.t

    def _compute(self, kernel: str, op: str, us: float, tid: int) -> int:
        dur = max(1_000, int(us * 1000 * self.gpu_speed * self.noise.factor(KERNEL_SIGMA)))
        waits = self.pending_waits
        self.pending_waits = []
        runtimes = []
        t = self.t
        for w in waits:
            call = self._cpu(1.5)
            runtimes.append(("cudaStreamWaitEvent", 147, t, call, self._next_corr()))
            t += call
        t0 = t
        t += self._cpu(4.0)
        launch, call = t, self._cpu(5.0)
        t += call + self._cpu(3.0)
        ext, corr = self._next_ext(), self._next_corr()
        runtimes.append(("cudaLaunchKernel", 211, launch, call, corr))
        idx = len(self.tasks)
        self.tasks.append(_Task(COMPUTE_STREAM, "k", dur, list(waits) + self._last(), launch, kernel,
                                ("op", op, tid, t0, t, runtimes), ext, corr))
        self.last_compute = idx
        self.t = t + self._cpu(2.0)
        return idx

    def _last(self) -> list[int]:
        return [self.last_compute] if self.last_compute is not None else []

    def _comm(self, names: tuple, group: _Group, stream: int, in_nelems: int, out_nelems: int, transfer_ns: int,
              tid: int, key, members: int, extra_args: dict | None = None, in_split: list | None = None,
              out_split: list | None = None, p2p: bool = False) -> int:
        """A c10d op with record_param_comms, its nccl annotation and the NCCL kernel's launch."""
        op_name, ann_name, coll_name, kernel = names
        pg = group.pg
        if p2p:
            self.p2p_seq[pg.pg_name] = seq = self.p2p_seq.get(pg.pg_name, 0) + 1
        else:
            self.pg_seq[pg.pg_name] = seq = self.pg_seq.get(pg.pg_name, 0) + 1
        args = {"Collective name": coll_name, "In msg nelems": in_nelems, "Out msg nelems": out_nelems,
                "Group size": group.size, "dtype": "BFloat16",
                "In split size": str(in_split or []), "Out split size": str(out_split or []),
                "Process Group Name": pg.pg_name, "Process Group Description": pg.desc,
                "Process Group Ranks": str(list(pg.ranks)), "Rank": group.local}
        if extra_args:
            args.update(extra_args)
        args["Seq"] = seq
        t = self.t
        t0 = t
        t += self._cpu(6.0)
        rpc0 = t
        t += self._cpu(10.0)
        runtimes = [("cudaEventRecord", 135, t, self._cpu(2.0), self._next_corr())]
        t += runtimes[-1][3]
        runtimes.append(("cudaStreamWaitEvent", 147, t, self._cpu(1.8), self._next_corr()))
        t += runtimes[-1][3]
        ann0 = t
        t += self._cpu(8.0)
        launch, call = t, self._cpu(10.0)
        corr = self._next_corr()
        runtimes.append(("cudaLaunchKernelExC", 430, launch, call, corr))
        t += call + self._cpu(5.0)
        ann1 = t
        runtimes.append(("cudaEventRecord", 135, t, self._cpu(1.0), self._next_corr()))
        t += runtimes[-1][3] + self._cpu(8.0)
        rpc1 = t
        t += self._cpu(6.0)
        op_ext, rpc_ext, ann_ext = self._next_ext(), self._next_ext(), self._next_ext()
        idx = len(self.tasks)
        host = ("comm", op_name, ann_name, tid, (t0, t), (rpc0, rpc1), (ann0, ann1), runtimes, (op_ext, ann_ext))
        self.tasks.append(_Task(stream, "p" if p2p else "c", 0, self._last(), launch, kernel, host, rpc_ext, corr,
                                key=key, members=members, transfer=transfer_ns, args=args))
        self.t = t + self._cpu(3.0)
        return idx

    def _collective(self, dim: str, names: tuple, in_nelems: int, out_nelems: int, nbytes_factor: float,
                    busbw: float, tid: int, in_split=None, out_split=None, transfer_bytes: int | None = None) -> int:
        group = self.dim_group[dim]
        n = group.size
        nbytes = (transfer_bytes if transfer_bytes is not None else max(in_nelems, out_nelems) * 2)
        transfer = _nccl_latency_ns(n) + int(nbytes * nbytes_factor / busbw)
        seq_key = self.pg_seq.get(group.pg.pg_name, 0) + 1
        stream = {"tp": TP_STREAM, "ep": EP_STREAM, "dp": DP_STREAM}[dim]
        return self._comm(names, group, stream, in_nelems, out_nelems, transfer, tid, ("c", group.pg.pg_name, seq_key),
                          n, in_split=in_split, out_split=out_split)

    def _p2p(self, send: bool, peer_stage: int, what: str, vstage: int, mb: int) -> int:
        group = self.dim_group["pp"]
        peer = group.pg.ranks[peer_stage]
        src, dst = (self.rank, peer) if send else (peer, self.rank)
        src_vstage = vstage if send else (vstage - 1 if what == "act" else vstage + 1)
        key = ("p", src, dst, what, src_vstage, mb)
        # ProcessGroupNCCL: one communicator and stream per peer pair; the interleaved schedule batches
        # all of an iteration's sends and recvs (both neighbours, both directions) into one group,
        # modelled as independent streams
        skey = (peer, send, what) if self.spec.chunks > 1 else peer
        if skey not in self.p2p_streams:
            self.p2p_streams[skey] = P2P_STREAM0 + 4 * len(self.p2p_streams)
        transfer = _nccl_latency_ns(2) + int(ACT_NELEMS * 2 / P2P_GBPS)
        extra = {"Dst Rank": peer} if send else {"Src Rank": peer}
        extra["Rank"] = peer_stage
        idx = self._comm(_SEND if send else _RECV, group, self.p2p_streams[skey], ACT_NELEMS, ACT_NELEMS, transfer,
                         self.main_tid, key, 2, extra_args=extra, p2p=True)
        # 1F1B schedules batch a send and the next recv with the same peer (torch's fwd_sends + bwd_recvs,
        # Megatron's send_forward_recv_backward): one NCCL group, so neither waits for the other
        prev = self.last_p2p
        if (self.spec.schedule != "gpipe" and prev is not None and prev[1] == peer and prev[2]
                and not send and prev[0] == idx - 1 and self.last_compute_at_p2p == self.last_compute):
            self.tasks[prev[0]].batch = self.tasks[idx].batch = prev[0]
        self.last_p2p = (idx, peer, send)
        self.last_compute_at_p2p = self.last_compute
        return idx

    # ---- a step

    def build_step(self, step_index: int) -> None:
        spec = self.spec
        self.tasks: list[_Task] = []
        self.spans: list[tuple] = []
        self.pending_waits = []
        self.tp_pending: list[int] = []
        self.last_compute = None
        self.last_p2p = self.last_compute_at_p2p = None
        self.dp_tasks: list[int] = []
        start = self.t
        step_ext_slot = len(self.spans)
        self._span("user_annotation", f"ProfilerStep#{FIRST_STEP + step_index}", self.main_tid, start, start)
        t = start + self._cpu(20.0)
        z = self._cpu(40.0)
        self._span("user_annotation", "Optimizer.zero_grad#AdamW.zero_grad", self.main_tid, t, t + z)
        t += z + self._cpu(15.0)
        d = self._cpu(1_200.0)
        self._span("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", self.main_tid,
                   t, t + d)
        self.t = t + d + self._cpu(30.0)

        uses = self._layer_uses()
        self.use_index = 0
        self.uses = uses
        self.gathers: dict[int, int] = {}
        last_bwd = {}
        for i, a in enumerate(self.actions):
            if a.kind == "B":
                last_bwd[a.chunk] = i
        for i, a in enumerate(self.actions):
            self._action(a, last_bwd.get(a.chunk) == i)
        # optimizer: waits on the gradient communication, then steps
        self.t += self._cpu(30.0)
        o0 = self.t
        self.pending_waits += self.tp_pending + self.dp_tasks
        self.tp_pending = []
        params = spec.chunks * LAYERS_PER_CHUNK * LAYER_PARAMS / spec.tp / (spec.dp if spec.fsdp else 1)
        adam_us = params * ADAM_BYTES_PER_PARAM / (HBM_GBPS * 1e3)
        for _ in range(2):
            self._compute(_FUSED_ADAMW, "aten::_fused_adamw_", adam_us / 2, self.main_tid)
        self.t += self._cpu(20.0)
        self._span("user_annotation", "Optimizer.step#AdamW.step", self.main_tid, o0, self.t)
        # loss.item(): a blocking device-to-host copy after all of the step's GPU work
        self.t += self._cpu(25.0)
        item0 = self.t
        launch = self.t + self._cpu(6.0)
        corr = self._next_corr()
        ext = self._next_ext()
        self.tasks.append(_Task(COMPUTE_STREAM, "m", 1_500, list(range(len(self.tasks))), launch,
                                "Memcpy DtoH (Device -> Pageable)", ("item", item0, launch, corr), ext, corr))
        self.steps.append({"tasks": self.tasks, "spans": self.spans, "start": start, "step_slot": step_ext_slot,
                           "end": None})

    def finish_step(self) -> None:
        """After the job's timing is solved: the host's blocking copy returns, the step ends."""
        step = self.steps[-1]
        item = step["tasks"][-1]
        end_item = item.end + self._cpu(4.0)
        step["item_end"] = end_item
        end = end_item + self._cpu(30.0)
        step["end"] = end
        self.t = end + self._cpu(15.0)

    def _layer_uses(self) -> list[tuple[int, int, str]]:
        """(chunk, layer, phase) of every layer use of the step, in issue order (for FSDP's gathers)."""
        out = []
        for a in self.actions:
            layers = range(LAYERS_PER_CHUNK) if a.kind == "F" else reversed(range(LAYERS_PER_CHUNK))
            out += [(a.chunk, layer, a.kind) for layer in layers]
        return out

    def _action(self, a: Action, last_backward: bool) -> None:
        spec = self.spec
        p = spec.pp
        vstage = a.chunk * p + self.stage
        last_vstage = spec.chunks * p - 1
        tid = self.main_tid if a.kind == "F" else self.autograd_tid
        a0 = self.t
        if a.kind == "F":
            if vstage > 0:
                self.pending_waits.append(self._p2p(False, (vstage - 1) % p, "act", vstage, a.mb))
            if vstage == 0:
                self._compute(_EMBED, "aten::embedding", LAYER_FWD_US * EMBED_SHARE * self.compute_scale * spec.tp,
                              tid)
            for layer in range(LAYERS_PER_CHUNK):
                self._layer(a, layer, "F", tid, last_backward)
            if vstage == last_vstage:
                for k, op, share in _HEAD_FWD:
                    self._compute(k, op, LAYER_FWD_US * HEAD_SHARE * share * self.compute_scale, tid)
            else:
                self._flush_tp()
                self._p2p(True, (vstage + 1) % p, "act", vstage, a.mb)
        else:
            if vstage < last_vstage:
                self.pending_waits.append(self._p2p(False, (vstage + 1) % p, "grad", vstage, a.mb))
            else:
                for k, op, share in _HEAD_BWD:
                    self._compute(k, op, LAYER_FWD_US * HEAD_SHARE * BWD_FACTOR * share * self.compute_scale, tid)
            for layer in reversed(range(LAYERS_PER_CHUNK)):
                self._layer(a, layer, "B", tid, last_backward)
            if vstage == 0:
                self._compute(_EMBED_BWD, "aten::embedding_dense_backward",
                              LAYER_FWD_US * EMBED_SHARE * BWD_FACTOR * self.compute_scale * spec.tp, tid)
            else:
                self._flush_tp()
                self._p2p(True, (vstage - 1) % p, "grad", vstage, a.mb)
        if spec.with_marks and p >= 2:
            name = (f"PP:{vstage}{a.kind}{a.mb}" if spec.chunks > 1
                    else f"{'Forward' if a.kind == 'F' else 'Backward'} {a.mb}")
            self._span("user_annotation", name, self.main_tid, a0, self.t)
        self.t += self._cpu(15.0)

    def _flush_tp(self) -> None:
        """The activations leave the stage: the residual add waits on every tensor-parallel all_reduce
        in flight."""
        if self.tp_pending or self.pending_waits:
            self.pending_waits += self.tp_pending
            self.tp_pending = []
            self._compute(_ADD_NAME, "aten::add_", 8.0, self.main_tid)

    def _gather(self, use: int, tid: int) -> None:
        spec = self.spec
        if use in self.gathers or use >= len(self.uses):
            return
        dp = spec.dp
        full = LAYER_PARAMS // spec.tp
        self.gathers[use] = self._collective("dp", _AG, full // dp, full, (dp - 1) / dp, DP_BUSBW_GBPS, tid)

    def _layer(self, a: Action, layer: int, phase: str, tid: int, last_backward: bool) -> None:
        spec = self.spec
        use = self.use_index
        self.use_index += 1
        fsdp = spec.fsdp and spec.dp >= 2
        if fsdp:
            if spec.no_prefetch:
                self._gather(use, tid)
            else:
                self._gather(use, tid)          # the first use of the step (else already prefetched)
                self._gather(use + 1, tid)      # prefetch the next layer's parameters
            self.pending_waits.append(self.gathers[use])
        half_us = LAYER_FWD_US / 2 * self.compute_scale * (1.0 if phase == "F" else BWD_FACTOR)
        halves = ("att", "mlp") if phase == "F" else ("mlp", "att")
        for half in halves:
            if half == "att":
                for k, op, share in (_ATT_FWD if phase == "F" else _ATT_BWD):
                    self._compute(k, op, half_us * share, tid)
            elif spec.ep >= 2:
                self._moe(half_us, phase, tid)
            else:
                for k, op, share in (_MLP_FWD if phase == "F" else _MLP_BWD):
                    self._compute(k, op, half_us * share, tid)
            if spec.tp >= 2:
                self._tp_all_reduce(tid)
        if phase == "B" and last_backward and spec.dp >= 2:
            full = LAYER_PARAMS // spec.tp
            if fsdp:
                rs = self._collective("dp", _RS, full, full // spec.dp, (spec.dp - 1) / spec.dp, DP_BUSBW_GBPS, tid)
            else:
                rs = self._collective("dp", _AR, full, full, 2 * (spec.dp - 1) / spec.dp, DP_BUSBW_GBPS, tid)
            self.dp_tasks.append(rs)

    def _tp_all_reduce(self, tid: int) -> None:
        spec = self.spec
        n = spec.tp
        nelems = ACT_NELEMS * (EXPOSED_TP_SCALE if spec.exposed_tp else 1)
        idx = self._collective("tp", _AR, nelems, nelems, 2 * (n - 1) / n, TP_BUSBW_GBPS, tid)
        if spec.exposed_tp:
            self.pending_waits.append(idx)           # the next kernel needs it now
        else:
            self.tp_pending.append(idx)              # overlapped: waited on one half later
            if len(self.tp_pending) > 1:
                self.pending_waits.append(self.tp_pending.pop(0))

    def _moe(self, half_us: float, phase: str, tid: int) -> None:
        spec = self.spec
        group = self.dim_group["ep"]
        n, me = group.size, group.local
        total = MB_TOKENS * TOPK
        # tokens member i sends member j (the same table on every member)
        send = [_split_tokens(total, n, self.hot_local, spec.factor) for _ in range(n)]
        dispatch_in, dispatch_out = send[me], [send[j][me] for j in range(n)]
        self._compute(*_ROUTER[:2], half_us * _ROUTER[2], tid)
        # forward: dispatch (tokens to the experts), combine (back); backward: combine's backward
        # (gradients to the experts: the dispatch's pattern), then dispatch's backward
        for k, (ins, outs) in enumerate(((dispatch_in, dispatch_out), (dispatch_out, dispatch_in))):
            in_n, out_n = sum(ins) * HIDDEN, sum(outs) * HIDDEN
            recv_bytes = max(sum(send[j][i] for j in range(n)) for i in range(n)) * HIDDEN * 2
            a2a = self._collective("ep", _A2A, in_n, out_n, (n - 1) / n, EP_BUSBW_GBPS, tid, in_split=ins,
                                   out_split=outs, transfer_bytes=recv_bytes)
            self.pending_waits.append(a2a)
            if k == 0:
                for kern, op, share in (_MLP_FWD if phase == "F" else _MLP_BWD):
                    self._compute(kern, op, half_us * share * self.expert_scale, tid)

    # ---- events

    def events(self) -> tuple[list[dict], int]:
        """The rank's Kineto events (file order) and its last activity (ns)."""
        origin = TRACE_ORIGIN_NS
        cpu, device, flows = [], [], []

        def us(ns: int) -> float:
            return (ns + origin) / 1000

        def rt(name, cbid, tid, ts, dur, ext, corr):
            device.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": self.pid, "tid": tid, "ts": us(ts),
                           "dur": dur / 1000, "args": {"External id": ext, "cbid": cbid, "correlation": corr}})

        def op(name, tid, t0, t1, ext, cat="cpu_op", args=None):
            a = {"External id": ext, "Record function id": 0}
            if args:
                a.update(args)
            cpu.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid, "ts": us(t0),
                        "dur": (t1 - t0) / 1000, "args": a})

        def flow(corr, tid, t_launch, stream, t_kernel):
            flows.append({"ph": "f", "id": corr, "pid": self.device, "tid": stream, "ts": us(t_kernel),
                          "cat": "ac2g", "name": "ac2g", "bp": "e"})
            flows.append({"ph": "s", "id": corr, "pid": self.pid, "tid": tid, "ts": us(t_launch),
                          "cat": "ac2g", "name": "ac2g"})

        last = 0
        streams = {COMPUTE_STREAM}
        for step in self.steps:
            for i, (cat, name, tid, t0, t1, ext, args) in enumerate(step["spans"]):
                if i == step["step_slot"]:
                    t1 = step["end"]
                op(name, tid, t0, t1, ext, cat, args)
            for task in step["tasks"]:
                last = max(last, task.end)
                streams.add(task.stream)
                h = task.host
                if h[0] == "op":
                    _, name, tid, t0, t1, runtimes = h
                    op(name, tid, t0, t1, task.ext)
                    for rname, cbid, ts, dur, corr in runtimes:
                        rt(rname, cbid, tid, ts, dur, task.ext, corr)
                    kargs = _static_args(task.name)
                elif h[0] == "comm":
                    _, op_name, ann_name, tid, (t0, t1), (r0, r1), (a0, a1), runtimes, (op_ext, ann_ext) = h
                    op(op_name, tid, t0, t1, op_ext)
                    op("record_param_comms", tid, r0, r1, task.ext, args=task.args)
                    op(ann_name, tid, a0, a1, ann_ext, cat="user_annotation")
                    for rname, cbid, ts, dur, corr in runtimes:
                        rt(rname, cbid, tid, ts, dur, task.ext, corr)
                    kargs = {**_NCCL_STATIC, **task.args}
                    kargs.pop("Rank", None)
                else:                                   # the loss.item() copy
                    _, t0, launch, corr = h
                    end = step["item_end"]
                    op("aten::item", self.main_tid, t0, end, task.ext)
                    op("aten::_local_scalar_dense", self.main_tid, t0 + 1_000, end - 1_000, self._next_ext())
                    rt("cudaMemcpyAsync", 41, self.main_tid, launch, task.end + 2_000 - launch, task.ext, corr)
                    rt("cudaStreamSynchronize", 131, self.main_tid, task.end + 2_000, 1_500, task.ext,
                       self._next_corr())
                    device.append({"ph": "X", "cat": "gpu_memcpy", "name": task.name, "pid": self.device,
                                   "tid": COMPUTE_STREAM, "ts": us(task.start), "dur": (task.end - task.start) / 1000,
                                   "args": {"External id": task.ext, "device": self.device, "context": 1,
                                            "stream": COMPUTE_STREAM, "correlation": corr, "bytes": 4,
                                            "memory bandwidth (GB/s)": 0.003}})
                    flow(corr, self.main_tid, launch, COMPUTE_STREAM, task.start)
                    continue
                device.append({"ph": "X", "cat": "kernel", "name": task.name, "pid": self.device, "tid": task.stream,
                               "ts": us(task.start), "dur": (task.end - task.start) / 1000,
                               "args": {"External id": task.ext, "queued": 0, "device": self.device, "context": 1,
                                        "stream": task.stream, "correlation": task.corr, **kargs}})
                flow(task.corr, tid, task.launch, task.stream, task.start)
            last = max(last, step["end"])
        by_ts = itemgetter("ts")
        cpu.sort(key=by_ts)
        device.sort(key=by_ts)
        for i, e in enumerate(cpu):
            e["args"]["Ev Idx"] = i
        start, end = us(self.profile_start), us(last + 200_000)
        return [*self._metadata(start, sorted(streams)), *cpu, *device, *flows,
                *_profiler_span_events(start, end)], last

    def _metadata(self, ts: float, streams: list[int]) -> list[dict]:
        pid, device = self.pid, self.device
        rows = [("process_name", pid, 0, {"name": "python"}), ("process_labels", pid, 0, {"labels": "CPU"}),
                ("process_sort_index", pid, 0, {"sort_index": pid}),
                ("process_name", device, 0, {"name": "python"}),
                ("process_labels", device, 0, {"labels": f"GPU {device}"}),
                ("process_sort_index", device, 0, {"sort_index": 16_777_216 + device})]
        for stream in streams:
            rows += [("thread_name", device, stream, {"name": f"stream {stream} "}),
                     ("thread_sort_index", device, stream, {"sort_index": stream})]
        for tid, name in ((self.main_tid, "pt_main_thread"), (self.autograd_tid, f"pt_autograd_{device}")):
            rows += [("thread_name", pid, tid, {"name": f"thread {tid} ({name})"}),
                     ("thread_sort_index", pid, tid, {"sort_index": tid})]
        return [{"ph": "M", "name": n, "ts": ts, "pid": p, "tid": tid, "args": a} for n, p, tid, a in rows]

    def header(self, world: int) -> dict:
        pgs = [{"pg_name": g.pg_name, "pg_desc": g.desc, "backend_config": "cuda:nccl", "pg_size": len(g.ranks),
                "ranks": list(g.ranks)} for g in self.groups]
        return {"schemaVersion": 1, "deviceProperties": _DEVICE_PROPERTIES,
                "trace_id": _trace_id(self.rank, world, self.seed), "profile_memory": 0, "record_shapes": 1,
                "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": world, "pg_count": len(pgs),
                                    "pg_config": pgs, "nccl_version": "2.21.5"},
                "host_name": f"node{self.rank // GPUS_PER_NODE:03d}", "displayTimeUnit": "ms",
                "baseTimeNanoseconds": BASE_TIME_NS}


_ADD_NAME = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
             "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)")


# ---- the job's timing

def _solve_step(builders: list[_RankBuilder], seed: int, step: int) -> None:
    """Start and end of every task of the step on every rank (module docstring). Raises RuntimeError
    on a deadlock (a schedule the generator got wrong)."""
    queues: list[list[list[Any]]] = []          # per rank, per stream: [its tasks, the next one's place]
    for b in builders:
        by_stream: dict[int, list[int]] = {}
        for i, task in enumerate(b.tasks):
            by_stream.setdefault(task.stream, []).append(i)
        queues.append([[lst, 0] for lst in by_stream.values()])
    free: list[dict[int, int]] = [{} for _ in builders]
    arrived: dict[tuple, list[_Task]] = {}
    remaining = sum(len(b.tasks) for b in builders)
    while remaining:
        progress = False
        for r, b in enumerate(builders):
            tasks = b.tasks
            for q in queues[r]:
                lst = q[0]
                while q[1] < len(lst):
                    task = tasks[lst[q[1]]]
                    if task.start is not None and task.end is None and task.batch is not None:
                        # the head's batch mates start beside it
                        j = q[1] + 1
                        while j < len(lst) and tasks[lst[j]].batch == task.batch:
                            progress |= _start(tasks[lst[j]], tasks, free[r], arrived, seed, step)
                            j += 1
                    if task.start is None:
                        deps = [tasks[d].end for d in task.deps]
                        if any(e is None for e in deps):
                            break
                        task.start = max([task.launch + KERNEL_LAUNCH_LATENCY_NS, free[r].get(task.stream, 0), *deps])
                        progress = True
                        if task.kind in "km":
                            task.end = task.start + task.dur
                        else:
                            members = arrived.setdefault(task.key, [])
                            members.append(task)
                            if len(members) == task.members:
                                _resolve(members, seed, step)
                                del arrived[task.key]
                    if task.end is None:
                        break
                    free[r][task.stream] = max(task.end, free[r].get(task.stream, 0))
                    q[1] += 1
                    remaining -= 1
                    progress = True
        if not progress:
            stuck = {k: len(v) for k, v in list(arrived.items())[:5]}
            raise RuntimeError(f"layout simulation deadlocked in step {step}: {remaining} tasks left; waiting: {stuck}")


def _start(task: _Task, tasks: list[_Task], free: dict, arrived: dict, seed: int, step: int) -> bool:
    """Start a batched p2p task beside its batch's head, if its dependencies are done."""
    if task.start is not None:
        return False
    deps = [tasks[d].end for d in task.deps]
    if any(e is None for e in deps):
        return False
    task.start = max([task.launch + KERNEL_LAUNCH_LATENCY_NS, free.get(task.stream, 0), *deps])
    members = arrived.setdefault(task.key, [])
    members.append(task)
    if len(members) == task.members:
        _resolve(members, seed, step)
        del arrived[task.key]
    return True


def _resolve(members: list[_Task], seed: int, step: int) -> None:
    key = members[0].key
    transfer = max(m.transfer for m in members) * math.exp(TRANSFER_SIGMA * _hash_normal(seed, step, key))
    end = max(m.start for m in members) + int(transfer)
    for i, m in enumerate(members):
        m.end = end + int(COLLECTIVE_END_JITTER_NS * _hash_uniform(seed, step, key, i))


# ---- the job

def generate_layout_job(out_dir: str | Path, spec: LayoutSpec | str, steps: int = 3, seed: int = 0,
                        gzip: bool = True) -> dict:
    """Write one trace per rank of the parallel layout `spec` (a LayoutSpec or its SPEC text, see
    `LAYOUT_HELP`) + ground_truth.json into out_dir; return the ground truth. Trace files of an
    earlier job in out_dir are replaced.

    Ground truth (schema rankscope.ground_truth/1, kind "layout"): spec, world_size, steps, faults,
    dims [{name, size, groups, pg_desc}] (every dimension of two or more ranks, outer to inner; a
    sharded dp is named dp_shard), pipeline {schedule, microbatches, stages_per_rank, num_stages,
    stage_ranks, compute_ms_per_step_by_stage (compute kernels' time per step, mean over the stage's
    ranks), bottleneck_stage, slow_stage} or null, experts {hot_rank, group, received_tokens_per_mb,
    imbalance_pct_over_mean} or null, and expected: layout {dimension name as docs/concepts.md
    "Parallel layout" defines it for these names: groups}, findings (ids a correct analysis must
    emit), finding_ranks {id: ranks}, possible_findings (ids the faults may cause downstream),
    absent_high_findings (layout finding ids that must not be high), per_rank {rank: file, stage,
    coords, step_time_ms, compute_ms_per_step}."""
    if isinstance(spec, str):
        spec = parse_layout(spec)
    if steps < 1:
        raise ValueError(f"need steps >= 1, got {steps}")
    with _gc_paused():
        return _generate(Path(out_dir), spec, steps, seed, gzip)


def _generate(out: Path, spec: LayoutSpec, steps: int, seed: int, gzip: bool) -> dict:
    groups = process_groups(spec)
    builders = [_RankBuilder(spec, r, groups, seed) for r in range(spec.world)]
    for step in range(steps):
        for b in builders:
            b.build_step(step)
        _solve_step(builders, seed, step)
        for b in builders:
            b.finish_step()
    _clear_earlier_job(out)
    per_rank = {}
    for b in builders:
        events, last = b.events()
        written_ns = BASE_TIME_NS + TRACE_ORIGIN_NS + last + 250_000_000
        path = out / f"rank{b.rank}.{written_ns + 1_009 * b.rank}.pt.trace.json{'.gz' if gzip else ''}"
        trace_name = f"/tmp/tmp{_trace_id(b.rank, spec.world, seed)[:8].lower()}.json"
        text, _ = _encode_trace(b.header(spec.world), events, trace_name, False)
        atomic_write_bytes(path, _gzip_bytes(text, complete=True) if gzip else text)
        per_rank[str(b.rank)] = _rank_truth(b, path)
        b.steps = []
    truth = _ground_truth(spec, steps, seed, groups, per_rank)
    atomic_write_bytes(out / GROUND_TRUTH_FILE, msgspec.json.format(msgspec.json.encode(truth), indent=1) + b"\n")
    return truth


def _rank_truth(b: _RankBuilder, path: Path) -> dict:
    compute = [sum(t.end - t.start for t in s["tasks"] if t.kind == "k") / 1e6 for s in b.steps]
    return {"file": path.name, "stage": b.stage, "coords": b.coords, "device": b.device, "pid": b.pid,
            "step_time_ms": [round((s["end"] - s["start"]) / 1e6, 6) for s in b.steps],
            "compute_ms_per_step": round(sum(compute) / len(compute), 6)}


def layout_expected_findings(spec: LayoutSpec) -> list[str]:
    return sorted({_FINDING_OF_FAULT[k] for k in spec.faults})


def _expected_layout(spec: LayoutSpec) -> dict[str, list[list[int]]]:
    """The dimensions a correct analysis names (docs/concepts.md "Parallel layout"): a group's name
    decides; unnamed groups take their collectives' role, so a sharded dp is dp_shard."""
    out = {}
    for dim in ("pp", "dp", "ep", "tp"):
        if spec.size(dim) < 2:
            continue
        name = "dp_shard" if dim == "dp" and spec.fsdp and spec.names == "none" else dim
        out[name] = [list(g) for g in spec.groups(dim)]
    return out


def _ground_truth(spec: LayoutSpec, steps: int, random_seed: int, groups: list[ProcessGroup],
                  per_rank: dict) -> dict:
    dims = []
    for dim in ("pp", "dp", "ep", "tp"):
        if spec.size(dim) >= 2:
            desc = next(g.desc for g in groups if g.dim == dim)
            dims.append({"name": "dp_shard" if dim == "dp" and spec.fsdp else dim, "size": spec.size(dim),
                         "groups": [list(g) for g in spec.groups(dim)], "pg_desc": desc})
    pipeline = None
    if spec.pp >= 2:
        by_stage = [round(float(np.mean([per_rank[str(r)]["compute_ms_per_step"] for r in spec.stage_ranks(s)])), 6)
                    for s in range(spec.pp)]
        pipeline = {"schedule": spec.schedule, "microbatches": spec.microbatches, "stages_per_rank": spec.chunks,
                    "num_stages": spec.pp * spec.chunks, "stage_ranks": [spec.stage_ranks(s) for s in range(spec.pp)],
                    "compute_ms_per_step_by_stage": by_stage,
                    "bottleneck_stage": int(np.argmax(by_stage)), "slow_stage": spec.slow_stage,
                    "marks": spec.with_marks}
    experts = None
    if spec.ep >= 2:
        hot = spec.expert_skew
        group = list(spec.group("ep", hot if hot is not None else 0))
        n = len(group)
        hot_local = group.index(hot) if hot is not None else None
        send = _split_tokens(MB_TOKENS * TOPK, n, hot_local, spec.factor)
        received = {r: n * send[i] for i, r in enumerate(group)}
        mean = sum(received.values()) / n
        experts = {"hot_rank": hot, "group": group, "received_tokens_per_mb": received,
                   "imbalance_pct_over_mean": round(100.0 * (max(received.values()) / mean - 1.0), 3)}
    expected = layout_expected_findings(spec)
    ranks = {}
    if spec.slow_stage is not None:
        ranks["pipeline_stage_imbalance"] = spec.stage_ranks(spec.slow_stage)
    if spec.expert_skew is not None:
        ranks["expert_imbalance"] = [spec.expert_skew]
    possible = sorted({f for k in spec.faults for f in _SIDE_FINDINGS[k]} - set(expected))
    absent_high = sorted(set(LAYOUT_FINDINGS) - set(expected) - set(possible))
    return {
        "schema": GROUND_TRUTH_SCHEMA, "generator": GENERATOR, "generator_version": GENERATOR_VERSION,
        "kind": "layout", "random_seed": random_seed, "spec": spec.text, "world_size": spec.world,
        "steps": [FIRST_STEP + i for i in range(steps)],
        "faults": spec.faults, "names": spec.names, "fsdp": spec.fsdp,
        "dims": dims, "pipeline": pipeline, "experts": experts,
        "expected": {"layout": _expected_layout(spec), "findings": expected, "finding_ranks": ranks,
                     "possible_findings": possible, "absent_high_findings": absent_high, "per_rank": per_rank},
    }


assert set(FAULT_KEYS) == set(_FINDING_OF_FAULT)
