"""Choosing the device and dtype a model runs in: ``"auto"`` resolved from what the hardware does well.

torch is imported inside functions, so that command-line validation stays fast.
"""

from __future__ import annotations

from racer_rs.errors import InvalidArgumentError

__all__ = ["cpu_has_native_bfloat16", "resolve_device", "resolve_dtype"]


def resolve_device(device: str) -> str:
    """Map ``"auto"`` to ``"cuda"`` when available, else ``"cpu"``; validate other names."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        raise InvalidArgumentError(f"--device: unknown device {device!r}") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidArgumentError(f"--device {device}: CUDA is not available")
    return device


def cpu_has_native_bfloat16() -> bool:
    """True when the CPU computes bfloat16 natively (AVX-512 BF16 or AMX; read on Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = handle.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: str, device: str) -> str:
    """Map ``"auto"`` to bfloat16 where the device computes it natively (a CUDA GPU that supports
    it, a CPU with AVX-512 BF16 or AMX), float16 on an older CUDA GPU, else float32."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if device == "cpu" and cpu_has_native_bfloat16() else "float32"
