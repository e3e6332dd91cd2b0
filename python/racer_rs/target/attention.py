"""Grouped-query attention for tree verification without copying the KV cache.

With grouped-query attention (several query heads per key/value head) and an explicit mask,
transformers' SDPA path repeats every cached key and value once per query head of its group
(``repeat_kv``) whenever more than one token is verified: a copy of the whole KV cache per layer
and step (``B x heads x P x head_dim`` twice), which on a CPU costs more than the attention itself
at long contexts. For one token it instead folds the group's query heads into the query length
(``pack_gqa``). :func:`packed_gqa_attention` does that for any number of tokens: the ``n`` queries
of the ``g`` heads sharing a key/value head become ``g x n`` queries of that head, the mask (one
for all heads) repeated ``g`` times along the query axis. The attention computed is the same, row
for row (only the kernel's rounding may differ).

:func:`gqa_attention` switches a model to it for the duration of a block (tree verification);
every other call keeps transformers' own implementation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

#: The attention implementation's registered name.
NAME = "racer_packed_gqa_sdpa"


def packed_gqa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention that folds each key/value head's query heads into the query length.

    Anything but a plain grouped-query call with one additive/boolean mask shared by every head
    (no mask, a per-head mask, a position bias, a softcap, attention sinks...) goes to
    transformers' own SDPA attention unchanged.
    """
    groups = int(getattr(module, "num_key_value_groups", 1))
    n = query.shape[2]
    plain = not any(kwargs.get(name) is not None for name in ("position_bias", "softcap", "s_aux", "sinks"))
    if groups == 1 or n == 1 or attention_mask is None or attention_mask.shape[1] != 1 or not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    # Heads are ordered kv head first (repeat_kv's order), so head h = k * groups + r.
    packed = query.reshape(batch, kv_heads, groups * n, dim)
    mask = _repeated_mask(attention_mask, groups)
    output = torch.nn.functional.scaled_dot_product_attention(
        packed, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    return output.reshape(batch, heads, n, value.shape[-1]).transpose(1, 2).contiguous(), None


#: The masks repeated for the folded query heads during the current forward:
#: ``(mask, groups, repeated)``, emptied when a :func:`gqa_attention` block starts and ends.
_REPEATED: list[tuple[torch.Tensor, int, torch.Tensor]] = []


def _repeated_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """``mask`` repeated ``groups`` times along the query axis, once per forward rather than once
    per layer: every layer of a forward gets the same mask object (30 repeats of SmolLM2-135M's
    cost 1.7 ms of a 45 ms 2-token step on this CPU), and nothing writes into it until the
    forward is over. The held reference keeps a remembered mask alive, so identity is enough."""
    for held, held_groups, repeated in _REPEATED:
        if held is mask and held_groups == groups:
            return repeated
    repeated = mask.repeat(1, 1, groups, 1)
    _REPEATED.append((mask, groups, repeated))
    return repeated


AttentionInterface.register(NAME, packed_gqa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


@contextlib.contextmanager
def gqa_attention(model: Any) -> Iterator[None]:
    """Run the block with :func:`packed_gqa_attention` if ``model`` uses SDPA attention (else
    as it is); the model's own implementation is restored afterwards.

    Another thread's forward on the same model during the block computes the same attention
    (by either implementation), so no lock is needed.
    """
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    config._attn_implementation = NAME
    _REPEATED.clear()
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
        _REPEATED.clear()
