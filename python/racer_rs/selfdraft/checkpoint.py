"""Saving and loading a distilled self-draft.

A checkpoint is a folder holding only what the target does not already hold:

* ``draft-<hash>.safetensors``: the draft's own tensors (its decoder layers and final norm), the
  kept-vocabulary ids (when the vocabulary is reduced) and a probe of the target's weights;
* ``manifest.json``: the format, the target it was distilled from (name and architecture), the
  number of layers, the weights file with its size and SHA-256, and the distillation's statistics.

Saving is atomic: the weights go to a temporary file renamed into place, then the manifest
(written the same way) is switched to point at them, so an interrupted save leaves either the old
checkpoint or the new one, never a mix; loading checks the file's checksum, so a truncated or
edited file is refused rather than loaded. Loading also checks that the target matches the one
the draft was distilled from: its architecture exactly, its weights through the probe (a strided
sample of every tensor of the copied layers and the embedding, compared with a tolerance, so a
bfloat16 copy of the same target still matches).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from racer_rs._io import file_digest, replace, staged_file, write_text_atomically
from racer_rs.errors import InvalidArgumentError
from racer_rs.selfdraft.model import self_draft

__all__ = [
    "MANIFEST",
    "DraftCheckpointError",
    "is_checkpoint",
    "load_self_draft",
    "save_self_draft",
    "target_architecture",
]

FORMAT = "racer-self-draft"
VERSION = 1
MANIFEST = "manifest.json"
#: Config fields that must match between the target a draft was distilled from and the one it serves.
ARCHITECTURE_FIELDS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
PROBE_PER_TENSOR = 64
PROBE_RTOL = 2e-2
PROBE_ATOL = 1e-3


class DraftCheckpointError(InvalidArgumentError):
    """A self-draft checkpoint is missing, incomplete, corrupt, or made for another target."""


def target_architecture(target: Any) -> dict[str, Any]:
    """The target's class and the config fields a checkpoint must match."""
    config = target.config
    return {"class": type(target).__name__} | {field: getattr(config, field, None) for field in ARCHITECTURE_FIELDS}


def target_probe(target: Any, layers: int) -> torch.Tensor:
    """A strided sample (float32, CPU) of the embedding and of every tensor of the first ``layers`` layers."""
    tensors = [target.model.embed_tokens.weight]
    for layer in target.model.layers[:layers]:
        tensors += [param for _, param in sorted(layer.named_parameters())]
    samples = []
    for tensor in tensors:
        flat = tensor.detach().reshape(-1)
        stride = max(1, flat.numel() // PROBE_PER_TENSOR)
        samples.append(flat[::stride][:PROBE_PER_TENSOR].float().cpu())
    return torch.cat(samples)


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a folder holding a self-draft manifest."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        return bool(json.loads(manifest.read_text(encoding="utf-8")).get("format") == FORMAT)
    except (OSError, ValueError, AttributeError):
        return True  # ours by name, unreadable: loading reports it


def save_self_draft(
    draft: Any, target: Any, folder: str | os.PathLike[str], *, target_name: str, stats: dict[str, Any] | None = None
) -> Path:
    """Save ``draft`` (a self-draft of ``target``) into ``folder``; return the manifest's path.

    Args:
        draft: the self-draft (see :func:`racer_rs.selfdraft.model.self_draft`).
        target: the target it was cut from.
        folder: the checkpoint folder (created if needed; an older checkpoint there is replaced).
        target_name: how the target was named (a model spec), recorded in the manifest.
        stats: statistics of the distillation, recorded in the manifest.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    layers = int(draft.config.num_hidden_layers)
    tensors = {
        f"model.{name}": tensor.detach().to("cpu").contiguous()
        for name, tensor in draft.model.state_dict().items()
        if name.startswith(("layers.", "norm."))
    }
    kept = getattr(draft.lm_head, "kept_ids", None)
    if kept is not None:
        tensors["kept_ids"] = kept.detach().to("cpu", torch.long).contiguous()
    tensors["target_probe"] = target_probe(target, layers)
    with staged_file(folder, ".draft-") as temporary:
        save_file(tensors, str(temporary))
        digest = file_digest(temporary)
        weights = folder / f"draft-{digest[:16]}.safetensors"
        replace(temporary, weights)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "target": {"name": target_name, **target_architecture(target)},
        "layers": layers,
        "vocab": None if kept is None else int(kept.numel()),
        "weights": {"file": weights.name, "bytes": weights.stat().st_size, "sha256": digest},
        "stats": stats or {},
    }
    path = folder / MANIFEST
    write_text_atomically(path, json.dumps(manifest, indent=2) + "\n")
    for old in folder.glob("draft-*.safetensors"):
        if old != weights:
            old.unlink(missing_ok=True)  # the manifest no longer names it
    return path


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's manifest, validated.

    Raises:
        DraftCheckpointError: the folder or its manifest is missing or malformed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DraftCheckpointError(f"self-draft checkpoint {folder} not found (not a folder)")
    path = folder / MANIFEST
    if not path.is_file():
        hint = (
            " (an unfinished distillation: rerun racer distill-draft to finish it)"
            if (folder / "work").is_dir()
            else ""
        )
        raise DraftCheckpointError(f"{folder} is not a self-draft checkpoint: no {MANIFEST}{hint}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftCheckpointError(f"{path} is unreadable ({exc}); the checkpoint is corrupt") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DraftCheckpointError(f"{path} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise DraftCheckpointError(
            f"{path}: unsupported checkpoint version {manifest.get('version')!r} (expected {VERSION})"
        )
    weights = manifest.get("weights")
    if (
        not isinstance(weights, dict)
        or not isinstance(weights.get("file"), str)
        or not isinstance(manifest.get("layers"), int)
        or not isinstance(manifest.get("target"), dict)
    ):
        raise DraftCheckpointError(f"{path} is malformed (weights, layers or target missing)")
    return manifest


def load_self_draft(target: Any, folder: str | os.PathLike[str]) -> Any:
    """Rebuild the self-draft saved in ``folder`` on ``target`` (its device and dtype).

    Raises:
        DraftCheckpointError: the checkpoint is missing, incomplete or corrupt, or ``target`` is
            not the model it was distilled from.
        TypeError: ``target`` is not a Llama-style transformers model.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    manifest = read_manifest(folder)
    weights = manifest["weights"]
    path = folder / weights["file"]
    if not path.is_file():
        raise DraftCheckpointError(f"{path} is missing; the checkpoint is incomplete")
    if path.stat().st_size != weights.get("bytes") or file_digest(path) != weights.get("sha256"):
        raise DraftCheckpointError(f"{path} does not match its checksum; the checkpoint is truncated or corrupt")
    _check_target(target, manifest, folder)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise DraftCheckpointError(f"{path} is unreadable ({exc})") from None
    probe = tensors.pop("target_probe", None)
    current = target_probe(target, manifest["layers"])
    if probe is None or probe.shape != current.shape or not torch.allclose(current, probe, PROBE_RTOL, PROBE_ATOL):
        raise DraftCheckpointError(
            f"{folder} was distilled from another {manifest['target'].get('name')!r}: the target's weights differ "
            "from the ones it was distilled from"
        )
    draft = self_draft(target, manifest["layers"], vocab=tensors.pop("kept_ids", None))
    reference = next(target.parameters())
    expected = {f"model.{name}" for name in draft.model.state_dict() if name.startswith(("layers.", "norm."))}
    if set(tensors) != expected:
        raise DraftCheckpointError(f"{path} does not hold the tensors of a {manifest['layers']}-layer self-draft")
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name in tensors:
                param.copy_(tensors[name].to(device=reference.device, dtype=param.dtype))
    return draft


def _check_target(target: Any, manifest: dict[str, Any], folder: Path) -> None:
    from racer_rs.selfdraft.model import check_self_draft_target

    check_self_draft_target(target)
    recorded = manifest["target"]
    current = target_architecture(target)
    for field, value in current.items():
        if recorded.get(field) != value:
            raise DraftCheckpointError(
                f"{folder} was distilled from {recorded.get('name')!r} ({field}={recorded.get(field)!r}); "
                f"the target has {field}={value!r}"
            )
    if not 1 <= manifest["layers"] <= int(target.config.num_hidden_layers):
        raise DraftCheckpointError(f"{folder}: layers={manifest['layers']} does not fit the target")
