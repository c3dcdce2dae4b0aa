"""What a trace's device activity ran on, and whether the trace is a profiler capture at all.

Device kind of a rank (docs/inputs.md "Devices"), first that applies:
  1. a category prefix of another accelerator's Kineto activity types (`mtia_ccp_events`,
     `xpu_runtime`, `hpu_op`, `privateuse1_runtime`, `mlu_*`, `gcu_*`): that kind;
  2. the model names of `deviceProperties` (`NVIDIA H100` -> cuda, `AMD Instinct MI300X` -> rocm,
     `Intel(R) Data Center GPU Max` -> xpu, `Gaudi` / `HL-` -> hpu, `MTIA` -> mtia);
  3. `hip_*` categories -> rocm, `cuda_*` -> cuda;
  4. device events without any of these: "gpu" (a device the trace does not name).
A rank without device activity has no device kind (None).

Not a profiler capture (`refusal`): a JSON of complete events of which (almost) none is in a
category a profiler writes (a Chrome-trace timeline of another tool) is refused with one line
naming what it holds; so is one without a single complete event.
"""
from __future__ import annotations

import re
from typing import Iterable

#: Device kind -> how reports name its devices.
DEVICE_KINDS = {"cuda": "GPU", "rocm": "GPU", "gpu": "GPU", "mtia": "MTIA", "xpu": "XPU", "hpu": "HPU",
                "privateuse1": "PrivateUse1 device", "mlu": "MLU", "gcu": "GCU", "npu": "NPU", "tpu": "TPU",
                "ipu": "IPU"}
#: Category prefixes that name an accelerator other than CUDA / ROCm GPUs (rule 1).
_OTHER_PREFIXES = ("mtia", "xpu", "hpu", "privateuse1", "mlu", "gcu", "npu", "tpu", "ipu")
#: deviceProperties model name (searched case-insensitively) -> kind (rule 2), first match wins.
_MODEL_KINDS = ((r"mtia", "mtia"), (r"gaudi|\bhl-\d", "hpu"), (r"\bintel\b|data center gpu max|\barc\b", "xpu"),
                (r"\bamd\b|instinct|radeon|\bmi\d{3}", "rocm"), (r"nvidia|tesla|geforce|quadro|rtx", "cuda"))
#: A file is a profiler capture when at least this share of its complete events is understood.
MIN_UNDERSTOOD_SHARE = 0.01
#: How a refusal starts (the pipeline lists the refused files in the capture quality).
NOT_A_CAPTURE = "not a profiler capture"
_SHOWN = 4


def device_kind(categories: Iterable[str], models: Iterable[str], has_device_events: bool) -> str | None:
    """The rank's device kind (module docstring); `categories`: the trace's categories, `models`: its
    deviceProperties names."""
    cats = [c.lower() for c in categories]
    for prefix in _OTHER_PREFIXES:
        if any(c.startswith(prefix + "_") for c in cats):
            return prefix
    for model in models:
        for pattern, kind in _MODEL_KINDS:
            if re.search(pattern, model, re.IGNORECASE):
                return kind
    if not has_device_events:
        return None
    if any(c.startswith("hip_") for c in cats):
        return "rocm"
    return "cuda" if any(c.startswith("cuda_") for c in cats) else "gpu"


def device_name(kind: str | None) -> str:
    """How reports name a device of this kind ("GPU" for CUDA / ROCm / unnamed devices)."""
    return DEVICE_KINDS.get(kind or "gpu", kind.upper() if kind else "GPU")


def device_other_line(n: int, kind: str | None, categories: list[str]) -> str:
    """The one line for device activity no analysis reads (its capture issue)."""
    cats = ", ".join(categories[:_SHOWN]) + (" ..." if len(categories) > _SHOWN else "")
    return (f"{n:,} event{'s' if n != 1 else ''} on device kind {kind or 'unknown'} "
            f"(categories {cats}), not analysed: the device figures leave them out")


def refusal(complete_events: int, unknown_events: int, device_events: int, categories: list[str],
            phases: dict[str, int]) -> str | None:
    """Why a file is no profiler capture, one line; None when it is one. `unknown_events`: its
    complete events in a category no profiler writes, `categories`: those categories; `phases`:
    events per phase. (Events without a category, as torch 1.x wrote them, are not judged.)"""
    if complete_events == 0:
        held = ", ".join(f"{n:,} '{ph}'" for ph, n in sorted(phases.items(), key=lambda kv: -kv[1])[:_SHOWN])
        return f"{NOT_A_CAPTURE}: no complete ('X') event, only {held or 'no'} events"
    understood = complete_events - unknown_events
    if device_events or not unknown_events or understood >= max(1, MIN_UNDERSTOOD_SHARE * complete_events):
        return None
    named = sorted(categories)
    shown = ", ".join(repr(c) for c in named[:_SHOWN]) + (f" and {len(named) - _SHOWN} more" if len(named) > _SHOWN
                                                        else "")
    return (f"{NOT_A_CAPTURE}: {complete_events:,} complete events in categories {shown}, {understood:,} of them "
            f"in a category the PyTorch profiler or Kineto writes (a timeline from another tool?)")
