"""The model builder: the op trees of one training step of a GPT-style bf16 transformer under DDP
(input copies, forward, loss, backward launching the buckets' all-reduces, clip_grad_norm_ + fused
AdamW, loss.item()), as `build_program` returns them."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rankscope.synth.constants import (
    BF16,
    BUCKETS_PER_BLOCK,
    DEFAULT_LAYERS,
    NONE,
    PARAM_TENSORS_PER_BLOCK,
    SCALAR,
    TENSORS,
)
from rankscope.synth.kernels import (
    _ADD,
    _CAT,
    _CLAMP,
    _FILL,
    _FLASH_BWD,
    _FLASH_BWD_DOT,
    _FLASH_BWD_DQ,
    _FLASH_FWD,
    _FOREACH_MUL,
    _FOREACH_NORM,
    _FOREACH_NORM_CLEANUP,
    _FUSED_ADAMW,
    _GELU,
    _GELU_BWD,
    _GEMM_NN,
    _GEMM_NT,
    _GEMM_TN,
    _LN_BWD_GAMMA,
    _LN_BWD_INPUT,
    _LN_FWD,
    _LOG_SOFTMAX,
    _LOG_SOFTMAX_BWD,
    _MUL_SCALAR,
    _NLL_BWD,
    _NLL_FWD,
    _REDUCE_NORM,
    _ew,
    _gemm,
)
from rankscope.synth.program import SEQ_BWD, SEQ_BWD_INNER, SEQ_FWD, AllReduce, Kernel, Memcpy, Op, Program


@dataclass(frozen=True)
class _Shape:
    """Sizes of the simulated model: a GPT-style block, bias-free linears, bf16, batch 4 x 2048."""
    batch: int = 4
    seq: int = 2048
    hidden: int = 2048
    ffn: int = 8192
    heads: int = 16

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def act(self, width: int) -> list:
        return [self.batch, self.seq, width]


def _as_strided(dims: list) -> Op:
    return Op("aten::as_strided", 1.0, inputs=((dims, BF16), ([], "ScalarList"), ([], "ScalarList"), NONE))


def _transpose(dims: list) -> Op:
    return Op("aten::transpose", 3.0, (_as_strided(dims),), inputs=((dims, BF16), SCALAR, SCALAR))


def _view(dims: list) -> Op:
    return Op("aten::view", 2.5, inputs=((dims, BF16), ([], "ScalarList")))


class _ModelBuilder:
    """Builds the op trees of one step; hands out activation addresses so frees match allocs."""

    def __init__(self, shape: _Shape):
        self.s = shape
        self._next_addr = 0

    def alloc(self, width: int) -> tuple[int, int]:
        """An activation of `width` bf16 values per token: (bytes, address offset)."""
        return self.alloc_bytes(self.s.tokens * width * 2)

    def alloc_bytes(self, nbytes: int) -> tuple[int, int]:
        addr, self._next_addr = self._next_addr, self._next_addr + _round_up(nbytes, 512)
        return nbytes, addr

    def linear(self, fin: int, fout: int, gemm_us: float) -> tuple[Op, tuple[int, int]]:
        s, mem = self.s, self.alloc(fout)
        x, w = s.act(fin), [fout, fin]
        mm = Op("aten::mm", 10.0, launch=_gemm(_GEMM_TN, gemm_us), mem=mem,
                inputs=(([s.tokens, fin], BF16), ([fin, fout], BF16)))
        matmul = Op("aten::matmul", 6.0, (_view(x), mm, Op("aten::_unsafe_view", 2.5)),
                    inputs=((x, BF16), ([fin, fout], BF16)))
        t = Op("aten::t", 2.5, (_transpose(w),), inputs=((w, BF16),))
        return Op("aten::linear", 7.0, (t, matmul), inputs=((x, BF16), (w, BF16)), seq=SEQ_FWD), mem

    def layer_norm(self) -> tuple[Op, tuple[int, int]]:
        h, mem = self.s.hidden, self.alloc(self.s.hidden)
        x = self.s.act(h)
        native = Op("aten::native_layer_norm", 12.0, (Op("aten::empty", 2.0), Op("aten::empty", 2.0)),
                    launch=_ew(_LN_FWD, 30.0), mem=mem, inputs=((x, BF16), ([h], ""), ([h], BF16), ([h], BF16), NONE))
        return Op("aten::layer_norm", 5.0, (native,), inputs=((x, BF16), ([h], ""), ([h], BF16), ([h], BF16),
                                                               SCALAR, SCALAR), seq=SEQ_FWD), mem

    def pointwise(self, name: str, kernel: Kernel, width: int, arity: int) -> tuple[Op, tuple[int, int]]:
        mem = self.alloc(width)
        x = self.s.act(width)
        return Op(name, 9.0, launch=kernel, mem=mem, inputs=((x, BF16),) * arity, seq=SEQ_FWD), mem

    def attention(self) -> tuple[list[Op], tuple[int, int]]:
        s = self.s
        qkv, head = s.act(3 * s.hidden), [s.batch, s.seq, s.heads, s.hidden // s.heads]
        bhsd = [s.batch, s.heads, s.seq, s.hidden // s.heads]
        split = Op("aten::split", 6.0, tuple(Op("aten::narrow", 2.5, (Op("aten::slice", 2.0, (_as_strided(qkv),)),))
                                             for _ in range(3)), inputs=((qkv, BF16), SCALAR, SCALAR),
                   seq=SEQ_FWD)
        mem = self.alloc(s.hidden)
        flash = Op("aten::_flash_attention_forward", 14.0, (Op("aten::empty", 2.0), Op("aten::empty", 2.0)),
                   launch=Kernel(_FLASH_FWD, 170.0, grid=(16, 64, 1), block=(128, 1, 1), registers=255,
                                 shared_mem=49_152, sigma=0.02), mem=mem, inputs=((bhsd, BF16),) * 3)
        sdpa_inner = Op("aten::_scaled_dot_product_flash_attention", 8.0,
                        (_transpose(head), _transpose(head), _transpose(head), flash, _transpose(bhsd)),
                        inputs=((bhsd, BF16),) * 3)
        sdpa = Op("aten::scaled_dot_product_attention", 6.0, (sdpa_inner,), inputs=((bhsd, BF16),) * 3, seq=SEQ_FWD)
        heads_view = [_view(head) for _ in range(3)] + [_transpose(head) for _ in range(3)]
        return [split, *heads_view, sdpa, _transpose(bhsd), _view(head)], mem

    def block(self, first_bucket: int) -> tuple[list[Op], list[Op], list[AllReduce], int]:
        """One transformer block: forward top-level ops, backward nodes, its buckets (numbered from
        `first_bucket` in the order DDP fires them), its parameter count."""
        s, h, f = self.s, self.s.hidden, self.s.ffn
        ln1, m_ln1 = self.layer_norm()
        qkv, m_qkv = self.linear(h, 3 * h, 345.0)
        attn_ops, m_attn = self.attention()
        out, m_out = self.linear(h, h, 120.0)
        add1, m_add1 = self.pointwise("aten::add", _ew(_ADD, 40.0), h, 2)
        ln2, m_ln2 = self.layer_norm()
        fc1, m_fc1 = self.linear(h, f, 460.0)
        gelu, m_gelu = self.pointwise("aten::gelu", _ew(_GELU, 95.0), f, 1)
        fc2, m_fc2 = self.linear(f, h, 460.0)
        add2, m_add2 = self.pointwise("aten::add", _ew(_ADD, 40.0), h, 2)
        forward = [ln1, qkv, *attn_ops, out, add1, ln2, fc1, gelu, fc2, add2]

        sizes = (f * h, h * f, h * h + 2 * h, 3 * h * h + 2 * h)      # fc2 | fc1 | ln2 + out | qkv + ln1
        buckets = [AllReduce(first_bucket + i, nelems) for i, nelems in enumerate(sizes)]
        b_fc2, b_fc1, b_attn, b_qkv = buckets
        backward: list[Op] = [
            _node("AddBackward0", (), m_add2),
            _mm_backward(s, f, h, 460.0, m_fc2), _accumulate_grad([f, h], b_fc2),
            _node("GeluBackward0", (Op("aten::gelu_backward", 10.0, launch=_ew(_GELU_BWD, 130.0),
                                       inputs=((s.act(f), BF16), (s.act(f), BF16), NONE)),), m_gelu),
            _mm_backward(s, h, f, 460.0, m_fc1), _accumulate_grad([h, f], b_fc1),
            _layer_norm_backward(s, m_ln2), _accumulate_grad([h]), _accumulate_grad([h]),
            _grad_add(s),
            _node("AddBackward0", (), m_add1),
            _mm_backward(s, h, h, 120.0, m_out), _accumulate_grad([h, h], b_attn),
            _flash_backward(s, m_attn),
            _node("SplitBackward0", (Op("aten::cat", 12.0, launch=_ew(_CAT, 60.0), inputs=(TENSORS, SCALAR)),),
                  None),
            _mm_backward(s, h, 3 * h, 345.0, m_qkv), _accumulate_grad([3 * h, h]),
            _layer_norm_backward(s, m_ln1), _accumulate_grad([h]), _accumulate_grad([h], b_qkv),
            _grad_add(s),
        ]
        params = sum(b.nelems for b in buckets)
        return forward, backward, buckets, params

    def loss(self) -> tuple[Op, list[Op]]:
        s, classes = self.s, self.s.hidden
        logits = [s.tokens, classes]
        m_lsm, m_nll = self.alloc(classes), self.alloc_bytes(4)
        labels = ([s.tokens], "long int")
        inner_log_softmax = Op("aten::_log_softmax", 9.0, launch=_ew(_LOG_SOFTMAX, 30.0), mem=m_lsm,
                               inputs=((logits, BF16), SCALAR, SCALAR))
        log_softmax = Op("aten::log_softmax", 5.0, (inner_log_softmax,), inputs=((logits, BF16), SCALAR, NONE),
                         seq=SEQ_FWD)
        nll_forward = Op("aten::nll_loss_forward", 10.0, launch=_ew(_NLL_FWD, 8.0), mem=m_nll)
        nll = Op("aten::nll_loss_nd", 5.0, (Op("aten::nll_loss", 4.0, (nll_forward,)),),
                 inputs=((logits, BF16), labels, NONE, SCALAR, SCALAR), seq=SEQ_FWD)
        loss = Op("aten::cross_entropy_loss", 6.0, (log_softmax, nll),
                  inputs=((logits, BF16), labels, NONE, SCALAR, SCALAR, SCALAR))
        nll_backward = Op("aten::nll_loss_backward", 8.0, (Op("aten::zero_", 4.0, launch=_ew(_FILL, 25.0)),),
                          launch=_ew(_NLL_BWD, 12.0))
        log_softmax_backward = Op("aten::_log_softmax_backward_data", 9.0, launch=_ew(_LOG_SOFTMAX_BWD, 45.0))
        backward = [_node("NllLossBackward0", (nll_backward,), m_nll),
                    _node("LogSoftmaxBackward0", (log_softmax_backward,), m_lsm)]
        return loss, backward


def _node(name: str, children: tuple, freed: tuple[int, int] | None) -> Op:
    """An autograd node as the engine records it; `freed` is the saved activation it releases."""
    inner = Op(name, 5.0, children, seq=SEQ_BWD_INNER)
    mem = (-freed[0], freed[1]) if freed else None
    return Op(f"autograd::engine::evaluate_function: {name}", 4.0, (inner,), seq=SEQ_BWD, mem=mem)


def _mm_backward(s: _Shape, fin: int, fout: int, gemm_us: float, freed: tuple[int, int]) -> Op:
    w, grad = [fout, fin], [s.tokens, fout]
    children = (Op("aten::t", 2.5, (_transpose(w),)),
                Op("aten::mm", 10.0, launch=_gemm(_GEMM_NN, gemm_us), inputs=((grad, BF16), (w, BF16))),
                Op("aten::t", 2.5, (_transpose(grad),)),
                Op("aten::mm", 10.0, launch=_gemm(_GEMM_NT, gemm_us),
                   inputs=(([fout, s.tokens], BF16), ([s.tokens, fin], BF16))),
                Op("aten::t", 2.5, (_transpose(w),)))
    return _node("MmBackward0", children, freed)


def _accumulate_grad(param_dims: list, bucket: AllReduce | None = None) -> Op:
    """AccumulateGrad + DDP's reducer hook: scale the gradient by 1/world, and launch the
    bucket's all-reduce when this was the bucket's last gradient."""
    scale_kernel_us = max(2.0, math.prod(param_dims) * 4 / 2.4e6)   # read+write bf16 at ~2.4 TB/s
    mul_out = Op("torch::distributed::reducer::mul_out", 6.0,
                 (Op("aten::mul", 9.0, launch=_ew(_MUL_SCALAR, scale_kernel_us), inputs=((param_dims, BF16), SCALAR)),))
    accumulate = Op("torch::autograd::AccumulateGrad", 5.0, (Op("aten::detach", 3.0, (Op("detach", 1.5),)),))
    children = (accumulate, mul_out) if bucket is None else (accumulate, mul_out, bucket)
    return Op(_ACCUMULATE_GRAD_NODE, 4.0, children)


_ACCUMULATE_GRAD_NODE = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


def _layer_norm_backward(s: _Shape, freed: tuple[int, int]) -> Op:
    h, x = s.hidden, s.act(s.hidden)
    native = Op("aten::native_layer_norm_backward", 14.0,
                (Op("aten::empty_like", 3.0, launch=_ew(_LN_BWD_INPUT, 45.0)),),
                launch=Kernel(_LN_BWD_GAMMA, 25.0, grid=(64, 1, 1), block=(32, 32, 1), registers=40, shared_mem=8_448),
                inputs=((x, BF16), (x, BF16), ([h], ""), ([s.batch, s.seq, 1], "float"), ([s.batch, s.seq, 1], "float"),
                        ([h], BF16), ([h], BF16), NONE))
    return _node("NativeLayerNormBackward0", (native,), freed)


def _grad_add(s: _Shape) -> Op:
    """The engine summing the two gradients that meet at a residual connection."""
    x = s.act(s.hidden)
    return Op("aten::add", 8.0, launch=_ew(_ADD, 40.0), inputs=((x, BF16), (x, BF16), SCALAR))


def _flash_backward(s: _Shape, freed: tuple[int, int]) -> Op:
    bhsd = [s.batch, s.heads, s.seq, s.hidden // s.heads]
    big: dict[str, Any] = dict(grid=(16, 64, 1), block=(256, 1, 1), registers=255, shared_mem=98_304, sigma=0.02)
    flash = Op("aten::_flash_attention_backward", 16.0,
               (Op("aten::empty_like", 3.0), Op("aten::empty", 2.0),
                Op("aten::zero_", 3.0, launch=_ew(_FILL, 12.0)),
                Op("aten::_launch_dot_do_o", 0.5, launch=Kernel(_FLASH_BWD_DOT, 20.0, grid=(16, 64, 1))),
                Op("aten::_launch_dq_dk_dv", 0.5, launch=Kernel(_FLASH_BWD, 380.0, **big))),
               launch=Kernel(_FLASH_BWD_DQ, 25.0, grid=(16, 64, 1)), inputs=((bhsd, BF16),) * 6)
    inner = Op("aten::_scaled_dot_product_flash_attention_backward", 8.0, (flash,), inputs=((bhsd, BF16),) * 6)
    return _node("ScaledDotProductFlashAttentionBackward0", (inner,), freed)


def _inputs_copy(s: _Shape) -> Op:
    """Token ids (or labels) to the GPU from pinned memory: DataLoader(pin_memory=True), non_blocking."""
    return _host_to_device([s.batch, s.seq], "long int", Memcpy("Memcpy HtoD (Pinned -> Device)", s.tokens * 8, 22.0))


def _host_to_device(dims: list, dtype: str, copy: Memcpy) -> Op:
    """tensor.to("cuda") as the profiler records it: aten::to > aten::_to_copy > aten::copy_ > memcpy."""
    copy_op = Op("aten::copy_", 9.0, launch=copy, inputs=((dims, dtype), (dims, dtype), SCALAR))
    to_copy = Op("aten::_to_copy", 6.0, (Op("aten::empty_strided", 3.0), copy_op),
                 inputs=((dims, dtype),) + (NONE,) * 6)
    return Op("aten::to", 4.0, (to_copy,), inputs=((dims, dtype),) + (NONE,) * 5)


def _optimizer_ops(params: int, tensors: int) -> tuple[Op, ...]:
    """clip_grad_norm_ (foreach) and a fused AdamW step over fp32 master weights."""
    adamw_us = params * 20 / 3.0e6          # ~20 bytes moved per parameter at ~3 TB/s
    adamw_launches = 3
    norm = Op("aten::_foreach_norm", 14.0, (Op("aten::empty", 2.0, launch=_ew(_FOREACH_NORM, 60.0)),),
              launch=_ew(_FOREACH_NORM_CLEANUP, 4.0), inputs=(TENSORS, SCALAR, NONE))
    total = Op("aten::linalg_vector_norm", 9.0, launch=_ew(_REDUCE_NORM, 5.0), inputs=(([tensors], "float"), SCALAR))
    clamp = Op("aten::clamp", 8.0, launch=_ew(_CLAMP, 2.5), inputs=(([], "float"), NONE, SCALAR))
    scale = Op("aten::_foreach_mul_", 12.0, launch=_ew(_FOREACH_MUL, 90.0), inputs=(TENSORS, ([], "float")))
    adamw = Op("aten::_fused_adamw_", 25.0,
               tuple(Op("aten::empty", 1.5, launch=_ew(_FUSED_ADAMW, adamw_us / adamw_launches))
                     for _ in range(adamw_launches)),
               inputs=(TENSORS,) * 6 + (SCALAR,) * 5)
    return (norm, Op("aten::stack", 10.0, (Op("aten::cat", 6.0, launch=_ew(_CAT, 3.0)),), inputs=(TENSORS, SCALAR)),
            total, clamp, scale, adamw)


def build_program(layers: int = DEFAULT_LAYERS) -> Program:
    """The step every rank runs: `layers` transformer blocks, DDP, clip + fused AdamW, loss.item()."""
    shape = _Shape()
    model = _ModelBuilder(shape)
    forward: list[Op] = []
    block_backward: list[list[Op]] = []
    buckets: list[AllReduce] = []
    params = 0
    for layer in range(layers):
        fwd, bwd, block_buckets, block_params = model.block(first_bucket=BUCKETS_PER_BLOCK * (layers - 1 - layer))
        forward += fwd
        block_backward.append(bwd)
        buckets += block_buckets
        params += block_params
    loss, loss_backward = model.loss()
    backward = loss_backward + [node for bwd in reversed(block_backward) for node in bwd]
    seed = Op("aten::ones_like", 4.0, (Op("aten::empty_like", 3.0), Op("aten::fill_", 6.0, launch=_ew(_FILL, 2.0))),
              inputs=(([], BF16), NONE, NONE, NONE, NONE, NONE))
    sync = Op("aten::item", 4.0, (Op("aten::_local_scalar_dense", 6.0,
                                     launch=Memcpy("Memcpy DtoH (Device -> Pageable)", 2, 5.0, blocking=True)),),
              inputs=(([], BF16),))
    return Program(layers=layers, inputs=(_inputs_copy(shape), _inputs_copy(shape)), forward=tuple(forward),
                   loss=(loss,), backward_seed=seed, backward=tuple(backward),
                   buckets=tuple(sorted(buckets, key=lambda b: b.bucket)),
                   optimizer=_optimizer_ops(params, tensors=layers * PARAM_TENSORS_PER_BLOCK), sync=sync,
                   static_bytes=params * (2 + 2 + 12))   # bf16 weights and grads; fp32 master, exp_avg, exp_avg_sq


def _round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule
