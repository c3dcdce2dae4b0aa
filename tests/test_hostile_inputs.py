"""Hostile inputs, third round (issue 34): bounded work on every input, no crash, correct or refused.

Each input is built here (or is a real OS object: a FIFO, a folder tree, an address-space limit), and
the expected values come from the input itself (what the test wrote or injected, counted by hand)
or from an independent reference named in the test. Times are measured in
benchmarks/bench_bounded.py; a test bounds the wall time only with the subprocess timeout that
stands for "does not hang".
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import assert_no_traceback, corpus_files, raw_text, run_cli
from rankscope import model
from rankscope.analyses.rank import breakdown, collectives, flops, grad_sync, kernels
from tracebuilder import TraceBuilder

MB = 1 << 20


# ---------------------------------------------------------------------------------------------
# 1. Kernel-name classification: linear time, a cap on what is matched
def _builtin_patterns() -> list[str]:
    parts = [p for p, _ in model.KERNEL_CLASS_PATTERNS]
    for rx, _, _ in kernels.TENSOR_CORE_RULES:
        parts += [rx] if isinstance(rx, str) else list(rx)
    return parts + [model.HOST_COMM_PATTERN, model.PROFILER_STEP_PATTERN, model.DATALOADER_PATTERN,
                    model.BLOCKING_SYNC_PATTERN, kernels.GEMM_LIKE_PATTERN, kernels.GEMM_LIKE_EXCLUDE,
                    kernels.GENERATED_KERNEL_PATTERN, breakdown.HOST_COLLECTIVE_PATTERN,
                    breakdown.PYTHON_WAIT_PATTERN, flops.UNCOUNTED_PATTERN, grad_sync.BACKWARD_PATTERN,
                    grad_sync.C10D_GRAD_COLLECTIVE_PATTERN, grad_sync.NCCL_GRAD_COLLECTIVE_PATTERN]


@pytest.mark.parametrize("pattern", _builtin_patterns())
def test_name_patterns_run_in_a_linear_time_engine(pattern: str):
    """Every built-in name pattern compiles in polars' regex engine (finite automata: no
    look-around, no backtracking), so matching costs time linear in the name. The GEMM patterns
    had look-arounds: `cutlass_` repeated over 10 MB took ~40 min in Python's `re`."""
    rx = re.compile(pattern, re.IGNORECASE)
    automaton = model._automaton_pattern(rx)
    assert automaton is not None
    pl.Series(["x"]).str.contains(automaton)          # raises where the engine refuses the pattern


#: The GEMM rules as they were written with look-arounds (the reference the rewrite must agree with).
_OLD_LOW = (r"(bf16|bfloat16|(?<![a-z])f16|fp16|half|tf32|tfloat32|fp8|e4m3|e5m2|e2m1|fp4|int8"
            r"|(?<![a-z])i8(?![0-9]))")
_OLD_FAMILY = r"((?<!fb)gemm|bmm|xmma|cutlass_|cutlass3x|fmha|flash_?(fwd|bwd|attn))"
_OLD_GEMM_LIKE = (r"(?<!fb)gemm|gemv|bmm_|xmma|nvjet|_tensorop_|mmatensorop|hmma|wgmma|cijk_|scudnn|winograd|wgrad_alg"
                  r"|dgrad_engine|dot_kernel|implicitgemm|implicit_gemm|conv_(fwd|bwd)|igemm_|fmha"
                  r"|flash_?(fwd|bwd|attn)|triton_tem_|(cutlass_|cutlass3x)(?!.*(reduction|reducesplitk))")
_OLD_RULES = {"gemm_low_precision": rf"^(?=.*{_OLD_FAMILY})(?=.*{_OLD_LOW})",
              "gemm_fp32_only": rf"^(?=.*{_OLD_FAMILY})(?=.*(f32|float|f64|double))"}
EDGE_NAMES = ["fbgemm_x", "xFbGEMM_bf16", "bgemm_f16", "Fgemm_float", "gemm", "ab_gemm_i8", "gemm_i80", "xi8_gemm",
              "gemm_i8", "_f16_bmm", "af16_bmm", "cutlass_80_tensorop_s1688gemm_reduction", "reduction_cutlass_x",
              "cutlass_a_reduction_cutlass3x_b", "cutlass3x_a_ReduceSplitK", "cutlass::reduction::x<cutlass_y>",
              "CUTLASS3X_float", "triton_poi_fused_gemm", "fbgemm_gpu::gemm", "flash_fwd_float", "xmma_f64"]


def _corpus_kernel_names(corpus: Path) -> list[str]:
    names = set()
    for folder in ("hta-negative-queue", "tracelens-b200-rank0", "tracelens-mi300-resnet-rank0", "big-mi300-xdit",
                   "kineto-resnet50-workers0", "hta-critical-path-alexnet", "param-dlrm-8rank"):
        doc = json.loads(raw_text(corpus_files(corpus, folder)[0]))
        names |= {e["name"] for e in doc["traceEvents"] if e.get("cat") in ("kernel", "Kernel")}
    return sorted(names)


def test_rewritten_gemm_rules_agree_with_the_look_around_forms(corpus: Path):
    """Reference: Python's `re` with the rules' former look-around forms (above), on every kernel name
    of seven corpus traces and on names crafted around each rewritten piece (fbgemm, i8, f16, a
    CUTLASS name with a reduction before or after it)."""
    names = _corpus_kernel_names(corpus) + EDGE_NAMES
    assert len(names) > 400
    tc, rule, gemm = kernels.tensor_core_rules(names)
    for i, name in enumerate(names):
        assert bool(gemm[i]) == (re.search(_OLD_GEMM_LIKE, name, re.I) is not None
                                 and re.search(kernels.GEMM_LIKE_EXCLUDE, name, re.I) is None), name
        for old_rule, rx in _OLD_RULES.items():
            earlier = kernels.TENSOR_CORE_RULES[:[r for _, _, r in kernels.TENSOR_CORE_RULES].index(old_rule)]
            if not any(r == rule[i] for _, _, r in earlier):
                assert (rule[i] == old_rule) == (re.search(rx, name, re.I) is not None), (name, rule[i])


def test_a_name_is_matched_in_its_first_16k_characters():
    """The cap: what follows the first MATCHED_NAME_CHARS characters of a name is never matched (a
    COMM pattern placed after the cap does not make the kernel COMM; placed before it, it does)."""
    cap = model.MATCHED_NAME_CHARS
    names = ["x" * (cap - 4) + "nccl" + "y" * MB, "x" * (cap - 3) + "nccl" + "y" * MB]
    classes = model.classify_names(names, np.ones(2, bool))
    assert classes.tolist() == [model.KernelClass.COMM, model.KernelClass.COMP]


def test_10mb_cutlass_name_is_classified(tmp_path: Path):
    """A kernel named `cutlass_` repeated to 10 MB then `_reduction`, beside a normal CUTLASS Tensor Core
    GEMM kernel (50 µs each): the analysis ends within the subprocess timeout (the look-ahead of the
    former GEMM pattern rescanned the rest of the name at each `cutlass_`: 320 KB took 2.4 s, 10 MB
    ~40 min). By the rules on the names' first 16K characters, both are GEMM-like (CUTLASS, no
    reduction after it there), the second uses Tensor Cores (`_tensorop_`), the long one is unknown."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("cutlass_" * (10 * MB // 8) + "_reduction", 10, 20, 50)
    b.kernel("void cutlass_80_tensorop_s1688gemm_bf16", 100, 120, 50)
    path = b.write(tmp_path / "rank0.pt.trace.json")
    proc = run_cli(["analyze", path, "--json", "--no-cache"], tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    rank = doc["ranks"][0]
    assert rank["events"] == 5                      # step + 2 x (launch + kernel)
    stats = rank["kernels"]["stats"]
    assert (stats["kernel_count"], stats["gemm_ms"], stats["gemm_tensor_core_ms"], stats["gemm_unknown_ms"]) == \
        (2, 0.1, 0.05, 0.05)
