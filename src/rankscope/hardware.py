"""Accelerator datasheet numbers: dense peak FLOPs by device and dtype, peer link bandwidth.

Devices are found by keyword in the device name (Kineto `deviceProperties[].name`, nsys
TARGET_INFO_GPU.name), case-insensitive, first match wins: specific names come before general
ones ("H100 PCIe" before "H100"). ROCm names some parts "AMD Radeon Graphics"; those are told
apart by compute units (`numSms`). MI250/MI250X figures are per GCD: ROCm shows each of the
card's two dies as one device.
"""
from __future__ import annotations

#: Dense peak TFLOPS per device and dtype (Tensor Core / Matrix Core; no 2:4 sparsity: NVIDIA's
#: "with sparsity" datasheet figures are halved). fp32 is the non-tensor rate on NVIDIA, the
#: matrix-core rate on AMD. A dtype a device lacks is absent.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    # NVIDIA HGX B200 datasheet (per GPU: FP8 9 PF, FP16/BF16 4.5 PF, TF32 2.25 PF sparse; FP32 75 TF)
    ("B200", {"fp8": 4500.0, "bf16": 2250.0, "fp16": 2250.0, "tf32": 1125.0, "fp32": 75.0}),
    # NVIDIA H200 NVL datasheet (FP8 3,341, BF16 1,671, TF32 835 TF sparse; FP32 60 TF)
    ("H200 NVL", {"fp8": 1670.5, "bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    # NVIDIA H200 SXM datasheet (FP8 3,958, BF16 1,979, TF32 989 TF sparse; FP32 67 TF)
    ("H200", {"fp8": 1979.0, "bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0}),
    # NVIDIA H100 NVL datasheet (FP8 3,341, BF16 1,671, TF32 835 TF sparse; FP32 60 TF)
    ("H100 NVL", {"fp8": 1670.5, "bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    # NVIDIA H100 PCIe datasheet (FP8 3,026, BF16 1,513, TF32 756 TF sparse; FP32 51 TF)
    ("H100 PCIe", {"fp8": 1513.0, "bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0}),
    # NVIDIA H100 SXM datasheet (FP8 3,958, BF16 1,979, TF32 989 TF sparse; FP32 67 TF);
    # "NVIDIA H100 80GB HBM3" is the SXM part
    ("H100", {"fp8": 1979.0, "bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0}),
    # NVIDIA A100 datasheet, SXM4 and PCIe alike (BF16/FP16 312, TF32 156 TF dense; FP32 19.5 TF)
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    # NVIDIA V100S PCIe datasheet (Tensor 130 TF, FP32 16.4 TF)
    ("V100S", {"fp16": 130.0, "fp32": 16.4}),
    # NVIDIA V100 datasheet, PCIe (Tensor 112 TF, FP32 14 TF)
    ("V100-PCIE", {"fp16": 112.0, "fp32": 14.0}),
    # NVIDIA V100 datasheet, SXM2 (Tensor 125 TF, FP32 15.7 TF); DGX Station (V100-DGXS) alike
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    # AMD Instinct MI325X / MI300X datasheets (FP8 2,614.9, FP16/BF16 1,307.4, TF32 653.7, FP32 163.4 TF dense)
    ("MI325X", {"fp8": 2614.9, "bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
    ("MI300X", {"fp8": 2614.9, "bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
    # AMD Instinct MI300A datasheet (FP8 1,961.2, FP16/BF16 980.6, TF32 490.3, FP32 122.6 TF dense)
    ("MI300A", {"fp8": 1961.2, "bf16": 980.6, "fp16": 980.6, "tf32": 490.3, "fp32": 122.6}),
    # AMD Instinct MI250X datasheet (FP16/BF16 383, FP32 matrix 95.7 TF per card), per GCD
    ("MI250X", {"bf16": 191.5, "fp16": 191.5, "fp32": 47.85}),
    # AMD Instinct MI250 datasheet (FP16/BF16 362.1, FP32 matrix 90.5 TF per card), per GCD; the
    # single-GCD MI210 datasheet (181.0 / 45.3 TF) gives the same figures
    ("MI250", {"bf16": 181.05, "fp16": 181.05, "fp32": 45.25}),
    ("MI210", {"bf16": 181.0, "fp16": 181.0, "fp32": 45.3}),
]

#: ROCm devices reported as "AMD Radeon Graphics": compute units -> the model (gfx90a: 104 CUs is
#: an MI210 or one MI250 GCD, same peaks; 110 one MI250X GCD; gfx942: 304 MI300X, 228 MI300A).
AMD_BY_COMPUTE_UNITS = {104: "MI250", 110: "MI250X", 304: "MI300X", 228: "MI300A"}

#: Nominal per-GPU peer link bandwidth per direction (GB/s), by device name keyword: the ceiling of
#: nccl-tests bus bandwidth on one host (NVLink / Infinity Fabric datasheets).
LINK_PEAK_GBPS: list[tuple[str, float]] = [
    ("B200", 900.0), ("H200", 450.0), ("H100", 450.0), ("A100", 300.0), ("V100", 150.0),
    ("MI300", 448.0), ("MI250", 200.0),
]

DTYPES = ("fp8", "bf16", "fp16", "tf32", "fp32")


def device_model(name: str | None, props: dict | None = None) -> str | None:
    """The PEAK_TFLOPS key of a device, from its name (or, for a generic ROCm name, its compute
    units); None when the table does not know it."""
    text = (name or "").lower()
    for key, _ in PEAK_TFLOPS:
        if key.lower() in text:
            return key
    if "amd" in text and props and "numSms" in props:
        return AMD_BY_COMPUTE_UNITS.get(props["numSms"])
    return None


def peak_tflops(model: str | None, dtype: str) -> float | None:
    """Dense peak TFLOPS of a device model (`device_model`) in `dtype`; None when unknown."""
    return next((peaks.get(dtype) for key, peaks in PEAK_TFLOPS if key == model), None)


def link_peak_gbps(model: str | None) -> float | None:
    return devices_link_peak_gbps([model] if model else [])


def devices_link_peak_gbps(devices: list[str]) -> float | None:
    """The link peak of the first table row that names one of `devices` (None: unknown)."""
    return next((p for key, p in LINK_PEAK_GBPS if any(key in d for d in devices)), None)
