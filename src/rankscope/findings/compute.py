"""Compute findings: GEMMs that run in FP32 without Tensor Cores."""
from __future__ import annotations

from statistics import median
from typing import Iterable

from rankscope.findings.registry import NOT_RETIMED, JobView, rule
from rankscope.numbers import rounded
from rankscope.results import Finding

#: Devices with fp16 Tensor Cores but no bf16 / TF32 (Volta, Turing).
PRE_AMPERE = ("V100", "T4", "TITAN V", "RTX 20", "Quadro RTX")


@rule("tensor_cores_unused", reads=("gemm_share_pct", "fp32_gemm_pct", "gemm_share_high_pct"))
def tensor_cores_unused(job: JobView) -> Iterable[Finding]:
    """Ranks whose GEMMs are >= `gemm_share_pct` of kernel time with >= `fp32_gemm_pct` of GEMM time in
    FP32; high when GEMMs are >= `gemm_share_high_pct` of kernel time (median of those ranks)."""
    t = job.thresholds
    hits = {}
    for s in job.ranks:
        if s.kernels is None:
            continue
        st = s.kernels.stats
        kernel_ms, gemm_ms, fp32 = st.kernel_ms, st.gemm_ms, st.fp32_gemm_share_pct
        if kernel_ms > 0 and fp32 is not None and 100.0 * gemm_ms / kernel_ms >= t["gemm_share_pct"] \
                and fp32 >= t["fp32_gemm_pct"]:
            hits[s.rank] = (100.0 * gemm_ms / kernel_ms, fp32, st.gemm_fp32_ms)
    if not hits:
        return
    gemm_pct = median(v[0] for v in hits.values())
    pre_ampere = [d for d in job.devices if any(k in d for k in PRE_AMPERE)]
    yield Finding(
        id="tensor_cores_unused", severity="high" if gemm_pct >= t["gemm_share_high_pct"] else "medium",
        ranks=sorted(hits), steps=job.steps(),
        summary=(f"{median(v[1] for v in hits.values()):.0f}% of GEMM time runs in FP32 without Tensor Cores; "
                 f"GEMMs are {gemm_pct:.0f}% of kernel time"),
        evidence={"gemm_pct_of_kernel_time": {r: rounded(v[0], 1) for r, v in hits.items()},
                  "fp32_gemm_pct": {r: rounded(v[1], 1) for r, v in hits.items()},
                  "fp32_gemm_ms": {r: rounded(v[2], 3) for r, v in hits.items()},
                  "what_if": NOT_RETIMED.format(what="faster kernels")},
        explanation=("FP32 matrix multiplies run on the CUDA cores at a fraction (1/8-1/16) of the Tensor Core "
                     "throughput of bf16/fp16 or TF32 on Ampere and later."),
        fix=("run the model under torch.autocast(device_type='cuda', dtype=torch.float16) with "
             f"torch.amp.GradScaler ({pre_ampere[0]} has fp16 Tensor Cores, no bf16/TF32)" if pre_ampere else
             "run the model under torch.autocast(device_type='cuda', dtype=torch.bfloat16); at least allow TF32: "
             "torch.set_float32_matmul_precision('high')"),
        threshold={k: t[k] for k in ("gemm_share_pct", "fp32_gemm_pct")}, cost_ms_per_step=None)
