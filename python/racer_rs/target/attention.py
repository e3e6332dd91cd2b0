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

**Flat verification** (:func:`flat_layout`): a batch whose rows verify trees of different sizes
runs its forward over the real nodes only, ``[1, K]`` tokens for ``K`` nodes in all, instead of
``[B, n_max]`` with padding, so the projections, the MLP, the norms and the LM head cost what the
rows drafted (at 16 rows of SmolLM2 on this CPU, about three quarters of what more nodes per row
cost at a short context, half at a 1,024-token one). Only attention needs the rows apart: each
row attends to its own KV cache.
:class:`racer_rs.target.batch_verifier.BatchLayer` writes the flat keys and values into their
rows' tree columns, and :func:`packed_gqa_attention` scatters the flat queries into the padded
``[B, heads, n_max, D]`` layout of the step's 4D mask, attends, and gathers the real nodes'
outputs back.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
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
    transformers' own SDPA attention unchanged (inside :func:`flat_layout`, such a call raises
    :class:`FlatLayoutUnsupported` instead: the caller verifies padded).
    """
    groups = int(getattr(module, "num_key_value_groups", 1))
    n = query.shape[2]
    plain = not any(kwargs.get(name) is not None for name in ("position_bias", "softcap", "s_aux", "sinks"))
    layout = _FLAT.get()
    if layout is not None:
        if not plain or attention_mask is None or attention_mask.shape[1] != 1 or dropout:
            raise FlatLayoutUnsupported(f"{type(module).__name__} is not a plain SDPA attention call")
        layout.calls += 1
        return _flat_attention(layout, query, key, value, attention_mask, groups, scaling), None
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


class FlatLayoutUnsupported(RuntimeError):
    """A flat forward met an attention call it cannot lay out (the caller verifies padded)."""


@dataclass
class FlatLayout:
    """Where each of a flat forward's ``K`` nodes sits in the padded ``[B, n_max]`` layout.

    Attributes:
        rows: ``int64[K]`` the node's batch row; ``nodes`` its index in its row's tree.
        batch: ``B``; ``width``: ``n_max``, the largest tree.
        calls: attention calls made under this layout (every layer must make one).
    """

    rows: torch.Tensor
    nodes: torch.Tensor
    batch: int
    width: int
    calls: int = 0


#: The flat layout of the forward running in this context, if any.
_FLAT: contextvars.ContextVar[FlatLayout | None] = contextvars.ContextVar("racer_flat_layout", default=None)


def current_flat_layout() -> FlatLayout | None:
    """The flat layout of the forward running now (``None``: a padded forward)."""
    return _FLAT.get()


@contextlib.contextmanager
def flat_layout(layout: FlatLayout) -> Iterator[FlatLayout]:
    """Run the block's forward flat: ``[1, K]`` inputs laid out by ``layout``."""
    token = _FLAT.set(layout)
    try:
        yield layout
    finally:
        _FLAT.reset(token)


def _flat_attention(
    layout: FlatLayout,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    groups: int,
    scaling: float | None,
) -> torch.Tensor:
    """Attention for flat queries ``[1, heads, K, D]`` against the batch's keys and values
    ``[B, kv_heads, P + n_max, D]``: scattered into the padded layout (padding queries are zeros
    and attend to themselves only), folded per key/value head, gathered back to ``[1, K, heads, D]``."""
    heads, dim = query.shape[1], query.shape[3]
    if key.shape[0] != layout.batch or mask.shape[0] != layout.batch or mask.shape[2] != layout.width:
        raise FlatLayoutUnsupported("the keys or the mask are not laid out per batch row")
    padded = query.new_zeros((layout.batch, layout.width, heads, dim))
    padded[layout.rows, layout.nodes] = query[0].transpose(0, 1)
    kv_heads = key.shape[1]
    # [B, n, heads, D] -> [B, kv_heads, groups * n, D]: head h = k * groups + r, as repeat_kv.
    folded = padded.view(layout.batch, layout.width, kv_heads, groups, dim).permute(0, 2, 3, 1, 4)
    folded = folded.reshape(layout.batch, kv_heads, groups * layout.width, dim)
    repeated = _repeated_mask(mask, groups) if groups > 1 else mask
    output = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=repeated, scale=scaling)
    output = output.view(layout.batch, kv_heads, groups, layout.width, value.shape[-1]).permute(0, 3, 1, 2, 4)
    return output[layout.rows, layout.nodes].reshape(1, -1, heads, value.shape[-1])  # [1, K, heads, D]


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
