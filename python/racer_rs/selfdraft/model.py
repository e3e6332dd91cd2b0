"""A self-draft: a draft model made of the target's own first decoder layers.

A model with no smaller sibling can still be sped up by drafting with a truncated copy of
itself: the target's first ``K`` decoder layers (copied, so they can be trained) and its final
norm (copied), with the target's token embedding and LM head shared as they are (frozen: training
them would change the target). The result is a genuine transformers ``PreTrainedModel`` of the
target's class with ``num_hidden_layers = K`` and its own KV cache, so ``draft_model``, ``tts``,
``racer_tts`` and transformers' assisted generation use it unchanged.

With a reduced draft vocabulary (FR-Spec: keep the most frequent tokens), the LM head is
computed over the kept rows only, which is where the saving is: SmolLM2's tied 49,152-row head
costs as much as about eight of its decoder layers. The logits stay full width, ``-inf``
outside the kept ids, so every consumer sees an ordinary distribution with zeros there; the
target verifies every drafted token, so decoding stays lossless.

Only Llama-style layouts are supported (``model.embed_tokens``, ``model.layers``,
``model.norm``, ``lm_head``: Llama, Qwen2/3, Mistral, ...).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from racer_rs.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["ReducedHead", "check_self_draft_target", "draft_vocabulary", "self_draft"]

_LAYOUT = ("model.embed_tokens", "model.layers", "model.norm", "lm_head")


class ReducedHead(nn.Module):
    """An LM head that computes only the rows of ``kept_ids`` and returns full-width logits.

    Args:
        head: the target's LM head (kept as a submodule, so its weight stays shared).
        kept_ids: the token ids the draft may propose (sorted, distinct).

    The kept rows are copied once into a buffer (not a parameter: it is never trained) so that
    each forward reads ``len(kept_ids)`` rows instead of the whole vocabulary.
    """

    kept_ids: torch.Tensor
    kept_weight: torch.Tensor
    kept_bias: torch.Tensor | None

    def __init__(self, head: nn.Module, kept_ids: torch.Tensor) -> None:
        super().__init__()
        self.head = head
        weight: torch.Tensor = head.weight  # type: ignore[assignment]
        self.vocab_size = int(weight.shape[0])
        self.register_buffer("kept_ids", kept_ids.to(device=weight.device, dtype=torch.long))
        self.register_buffer("kept_weight", weight.detach()[self.kept_ids].clone(), persistent=False)
        bias: torch.Tensor | None = getattr(head, "bias", None)
        kept_bias = bias.detach()[self.kept_ids].clone() if bias is not None else None
        self.register_buffer("kept_bias", kept_bias, persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        """The full (shared) head weight: its row count is the logits width."""
        weight: torch.Tensor = self.head.weight  # type: ignore[assignment]
        return weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kept = nn.functional.linear(hidden, self.kept_weight, self.kept_bias)
        full = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy(-1, self.kept_ids, kept)

    def extra_repr(self) -> str:
        return f"kept={self.kept_ids.numel()}, vocab={self.vocab_size}"


def check_self_draft_target(target: Any) -> None:
    """Raise a clear error unless ``target`` has the layout a self-draft is cut from.

    Raises:
        TypeError: ``target`` is not a transformers ``PreTrainedModel`` with the Llama-style
            layout (``model.embed_tokens``, ``model.layers``, ``model.norm``, ``lm_head``).
    """
    from transformers import PreTrainedModel

    if not isinstance(target, PreTrainedModel):
        raise InvalidTypeError(f"a self-draft is cut from a transformers PreTrainedModel, got {type(target).__name__}")
    missing = [path for path in _LAYOUT if _lookup(target, path) is None]
    if missing or not isinstance(target.model.layers, nn.ModuleList):
        raise InvalidTypeError(
            f"self-draft supports Llama-style models (model.embed_tokens, model.layers, model.norm, "
            f"lm_head); {type(target).__name__} lacks {', '.join(missing) or 'a model.layers list'}"
        )


def draft_vocabulary(kept: Sequence[int] | torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Validate a reduced draft vocabulary; return its ids sorted (``int64``).

    Raises:
        TypeError: ``kept`` is not a sequence of ints.
        ValueError: it is empty, repeats an id or holds an id outside ``[0, vocab_size)``.
    """
    if isinstance(kept, (str, bytes)) or not isinstance(kept, (Sequence, torch.Tensor)):
        raise InvalidTypeError(f"vocab must be a sequence of token ids or None, got {type(kept).__name__}")
    if isinstance(kept, torch.Tensor):
        if kept.dtype.is_floating_point or kept.dtype == torch.bool or kept.dim() != 1:
            raise InvalidTypeError("vocab must be a 1-D integer tensor of token ids")
        ids = kept.to(torch.long).cpu()
    else:
        if any(isinstance(i, bool) or not isinstance(i, int) for i in kept):
            raise InvalidTypeError("vocab must hold int token ids")
        ids = torch.tensor(list(kept), dtype=torch.long)
    if ids.numel() == 0:
        raise InvalidArgumentError("vocab must keep at least one token id")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise InvalidArgumentError(f"vocab holds ids outside [0, {vocab_size}) (the target's vocabulary)")
    ids = ids.sort().values
    if bool((ids[1:] == ids[:-1]).any()):
        raise InvalidArgumentError("vocab repeats a token id")
    return ids


def self_draft(target: Any, layers: int, vocab: Sequence[int] | torch.Tensor | None = None) -> Any:
    """Build a self-draft of ``target``: its first ``layers`` decoder layers as a standalone model.

    Args:
        target: the target, a Llama-style transformers causal LM (left unmodified, except that
            its shared embedding and LM head are frozen).
        layers: K, the number of leading decoder layers to copy (``1 <= K <= num_hidden_layers``).
        vocab: token ids the draft may propose (a reduced draft vocabulary), or ``None`` for the
            full vocabulary.

    Returns:
        A ``PreTrainedModel`` of the target's class, in eval mode, on the target's device and in
        its dtype. Its decoder layers and final norm are its own copies; its embedding and LM head
        are the target's modules. Its attribute ``self_draft_layers`` is K.

    Raises:
        TypeError: ``target`` lacks the layout, or ``layers`` / ``vocab`` have the wrong type.
        ValueError: ``layers`` is out of range or ``vocab`` is invalid.
    """
    check_self_draft_target(target)
    total = int(target.config.num_hidden_layers)
    if isinstance(layers, bool) or not isinstance(layers, int):
        raise InvalidTypeError(f"layers must be an int, got {type(layers).__name__}")
    if not 1 <= layers <= total:
        raise InvalidArgumentError(f"layers must be in 1..{total} (the target's decoder layers), got {layers}")
    head = target.get_output_embeddings()
    kept = None if vocab is None else draft_vocabulary(vocab, int(head.weight.shape[0]))

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:layers])
    reference = next(target.parameters())
    # Build on the meta device: every tensor is replaced below, so nothing needs initialising.
    with torch.device("meta"):
        draft = type(target)._from_config(config, dtype=reference.dtype)
    body = draft.model
    body.layers = nn.ModuleList(copy.deepcopy(target.model.layers[i]) for i in range(layers))
    body.norm = copy.deepcopy(target.model.norm)
    body.rotary_emb = copy.deepcopy(target.model.rotary_emb)
    body.embed_tokens = target.model.embed_tokens
    draft.lm_head = head if kept is None else ReducedHead(head, kept)
    if _on_meta(draft):
        raise InvalidTypeError(f"self-draft: {type(target).__name__} has parts outside the supported layout")
    for module in (target.model.embed_tokens, head):
        module.requires_grad_(False)
    draft.generation_config = copy.deepcopy(target.generation_config)
    draft.self_draft_layers = layers
    return draft.eval()


def _lookup(module: Any, path: str) -> Any:
    for name in path.split("."):
        module = getattr(module, name, None)
        if module is None:
            return None
    return module


def _on_meta(model: nn.Module) -> bool:
    tensors = [*model.parameters(), *model.buffers()]
    return any(t.is_meta for t in tensors)
