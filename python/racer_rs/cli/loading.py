"""Loading a model and its tokenizer for the command line, with one-line errors.

Model specs are resolved by :mod:`racer_rs.loading.models` (short names, checkpoint folders,
``.gguf`` files); this module names the option in their errors. torch and transformers are
imported inside functions, so that ``racer --help`` and input validation stay fast.
"""

from __future__ import annotations

from typing import Any

from racer_rs.cli.errors import CLIError
from racer_rs.errors import error_context
from racer_rs.loading.models import DTYPES, ModelSource

__all__ = ["DTYPES", "check_model", "eos_token_ids", "load_model", "resolve_device", "resolve_dtype"]


def check_model(spec: str, what: str = "--model") -> ModelSource:
    """Resolve a model spec and check the packages loading it needs, before any work starts.

    Raises:
        ModelSpecError: the spec names nothing loadable.
        MissingDependencyError: a package or extra is missing.
    """
    from racer_rs.loading import models as model_loading

    with error_context(what):
        source = model_loading.resolve_model(spec)
        model_loading.check_dependencies(source)
    return source


def resolve_device(device: str) -> str:
    """Map ``"auto"`` to ``"cuda"`` when available, else ``"cpu"``; validate other names."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        raise CLIError(f"--device: unknown device {device!r}") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {device}: CUDA is not available")
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


def load_model(spec: str, dtype: str, device: str, what: str = "--model") -> tuple[Any, Any]:
    """Load a causal LM (eval mode, on ``device``) and its tokenizer.

    Args:
        spec: A short name, checkpoint folder, ``.gguf`` file or hub id.
        dtype: One of :data:`DTYPES`.
        device: A torch device string (already resolved).
        what: The option the spec came from, for error messages.

    Raises:
        RacerError: The model cannot be loaded (its message names ``what``).
    """
    import sys

    from transformers.utils import logging as hf_logging

    from racer_rs.loading import gguf_cache
    from racer_rs.loading import models as model_loading

    source = check_model(spec, what)
    if source.kind == "gguf" and gguf_cache.cached_entry(source.location) is None:
        print(
            f"racer: converting {source.location} to float weights once "
            f"(cached in {gguf_cache.cache_root()}; later loads take seconds)",
            file=sys.stderr,
        )
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    with error_context(what):
        return model_loading.load_model(spec, dtype=dtype, device=device)


def eos_token_ids(model: Any, tokenizer: Any) -> list[int] | None:
    """Collect the end-of-sequence ids from the generation config and the tokenizer."""
    ids: list[int] = []
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (config_eos, getattr(tokenizer, "eos_token_id", None)):
        if value is None:
            continue
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if int(token) not in ids:
                ids.append(int(token))
    return ids or None
