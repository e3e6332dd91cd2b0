"""Loading a model and its tokenizer for the command line, with one-line errors.

torch and transformers are imported here, inside functions, so that ``racer --help`` and input
validation stay fast and ``import racer_rs.cli`` does not pull them in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from racer_rs.cli.errors import CLIError, one_line

DTYPES = ("float32", "bfloat16", "float16")
# "org/name" or "name": what a hub id looks like; anything else is treated as a local path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_model_path(path: str, what: str = "--model") -> None:
    """Fail fast on a local model path that does not exist (before importing torch).

    A string that looks like a hub id (``org/name``) and is not a local folder is left for
    transformers to fetch when the user has network.

    Raises:
        CLIError: ``path`` names a local location that does not exist or is not a folder.
    """
    local = Path(path).expanduser()
    if local.exists():
        if not local.is_dir():
            raise CLIError(f"{what} {path!r} is not a model folder")
        return
    # "models/typo" next to an existing "models/" folder is a local path, not a hub id.
    parent = Path(path).parent
    looks_local = path.startswith((".", "/", "~")) or (parent != Path(".") and parent.is_dir())
    if looks_local or not _HUB_ID.match(path):
        raise CLIError(f"{what} path not found: {path}")


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


def load_model(path: str, dtype: str, device: str, what: str = "--model") -> Any:
    """Load a causal LM in eval mode on ``device``.

    Args:
        path: Local folder or hub id.
        dtype: One of :data:`DTYPES`.
        device: A torch device string (already resolved).
        what: The option the path came from, for error messages.

    Raises:
        CLIError: The model cannot be loaded.
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    check_model_path(path, what)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except (OSError, ValueError, KeyError) as exc:
        raise CLIError(f"cannot load model {path!r} ({what}): {one_line(exc)}") from None
    return model.to(device).eval()


def load_tokenizer(path: str) -> Any:
    """Load the tokenizer stored with a model.

    Raises:
        CLIError: The tokenizer cannot be loaded.
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        raise CLIError(f"cannot load the tokenizer of {path!r}: {one_line(exc)}") from None


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
