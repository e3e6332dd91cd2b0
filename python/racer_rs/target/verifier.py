"""Tree verification for stock transformers causal LMs (no patched modeling code).

The target scores a whole draft tree in one forward pass over its ``n`` nodes: each node sits
at position ``L + depth`` and attends to the whole prefix plus its own ancestors, through an
additive 4D attention mask ``[1, 1, n, L + n]``. The prefix lives in a ``DynamicCache``; after
acceptance the accepted nodes' K/V rows of every layer are gathered into place and the cache
is cropped, so the prefix is never recomputed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from racer_rs.errors import InvalidTypeError, UnsupportedError
from racer_rs.target.sampling import logits_summary

PREFILL_CHUNK = 512
"""Prompt positions per LM-head chunk when computing the prompt's top-k ids."""
PROMPT_LOGITS_BUDGET = 1 << 25
"""Most prompt logits (rows x vocabulary) a prefill keeps in one forward; a longer prompt runs its
LM head in chunks over the decoder's hidden states instead (and its last token in a forward of its
own)."""


def check_model(model: Any) -> None:
    """Raise a clear error unless ``model`` is a decoder-only transformers causal LM.

    Raises:
        TypeError: if ``model`` is not a ``PreTrainedModel`` with an LM head.
        NotImplementedError: for encoder-decoder models, or models whose cache is not a plain
            per-layer key/value cache (sliding-window, linear-attention or state-space layers
            cannot be compacted by row gathering).
    """
    if not isinstance(model, PreTrainedModel):
        raise InvalidTypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    if model.config.is_encoder_decoder:
        raise UnsupportedError(f"model: encoder-decoder models ({type(model).__name__}) are not supported")
    if not model.can_generate() or model.get_output_embeddings() is None:
        raise InvalidTypeError(
            f"model must be a causal LM with an LM head (e.g. *ForCausalLM), got {type(model).__name__}"
        )
    unsupported = _unsupported_cache_layers(DynamicCache(config=model.config))
    if unsupported:
        raise UnsupportedError(
            f"model: {type(model).__name__} uses {', '.join(sorted(unsupported))} cache layers; "
            "tree verification needs full-attention key/value caches"
        )


def _unsupported_cache_layers(cache: DynamicCache) -> set[str]:
    return {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}


class GrowableLayer(DynamicLayer):
    """A full-attention layer cache that appends in place.

    ``DynamicLayer`` re-concatenates its whole cache on every forward, an O(L) copy per step
    that costs as much as the tree's own compute on long prompts. This layer writes new rows
    into a buffer grown geometrically; ``keys``/``values`` stay views of its first rows, so
    every ``DynamicLayer`` operation (length, crop, in-place row writes) works unchanged.
    """

    _key_buffer: torch.Tensor
    _value_buffer: torch.Tensor

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = key_states.new_empty((*key_states.shape[:-2], 0, key_states.shape[-1]))
        self._value_buffer = value_states.new_empty((*value_states.shape[:-2], 0, value_states.shape[-1]))

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new rows and return all cached keys and values."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            self._key_buffer = self._grown(self._key_buffer, start, end)
            self._value_buffer = self._grown(self._value_buffer, start, end)
        rows = key_states.shape[0]  # the buffer may hold spare rows (a batch's)
        self._key_buffer[:rows, ..., start:end, :] = key_states
        self._value_buffer[:rows, ..., start:end, :] = value_states
        self._view(end)
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def _view(self, columns: int) -> None:
        """Point ``keys``/``values`` at the buffers' first ``columns`` columns."""
        self.keys = self._key_buffer[..., :columns, :]
        self.values = self._value_buffer[..., :columns, :]

    @staticmethod
    def _grown(buffer: torch.Tensor, used: int, needed: int) -> torch.Tensor:
        rows = max(2 * needed, 256)
        grown = buffer.new_empty((*buffer.shape[:-2], rows, buffer.shape[-1]))
        grown[..., :used, :] = buffer[..., :used, :]
        return grown


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """A ``DynamicCache`` for ``model`` whose layers append in place (:class:`GrowableLayer`)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [GrowableLayer() for _ in cache.layers]  # type: ignore[no-untyped-call]  # transformers' __init__
    return cache


def vocab_size(model: Any) -> int:
    """The width of the model's logits: the rows of its LM head."""
    return int(model.get_output_embeddings().weight.shape[0])


def model_window(model: PreTrainedModel) -> int | None:
    """The model's context window (``max_position_embeddings``), or ``None`` if it has none."""
    window = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    return int(window) if window else None


@dataclass
class PrefillOutput:
    """What the prompt's forward pass yields.

    Attributes:
        last_logits: ``[V]`` raw logits at the last prompt position.
        prompt_topk: ``int32[m, k]`` top-k ids at the prompt positions ``prompt_topk_positions``,
            or ``None`` (k = 0).
        prompt_topk_positions: ``int64[m]`` ascending positions of those rows: the last
            occurrence of every distinct prompt token (the last position included).
        prompt_topk_probs: ``float32[m, k]`` their probabilities, when asked for.
    """

    last_logits: torch.Tensor
    prompt_topk: np.ndarray | None
    prompt_topk_positions: np.ndarray | None = None
    prompt_topk_probs: np.ndarray | None = None


def last_occurrences(tokens: np.ndarray) -> np.ndarray:
    """Ascending positions of the last occurrence of every distinct token in ``tokens``."""
    _, first_from_end = np.unique(tokens[::-1], return_index=True)
    return np.sort(len(tokens) - 1 - first_from_end)


def topk_with_probs(logits: torch.Tensor, k: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids of ``[..., V]`` logits and their probabilities under ``softmax(logits / T)``.

    Args:
        logits: raw logits.
        k: ids per row.
        temperature: the sampling temperature (0, greedy, counts as 1).

    Returns:
        ``(ids, probs)``, each ``[..., k]``; probs are float32 (see :func:`logits_summary`: one
        pass of the Rust kernel on the CPU).
    """
    ids, probs, _ = logits_summary(logits, k, temperature)
    return ids, probs


class TreeVerifier:
    """Owns one request's KV cache and runs the target over the prompt and draft trees.

    Attributes:
        model: the target.
        device: where the target's parameters live.
        dtype: the target's parameter dtype (the attention mask uses it).
        length: number of committed tokens whose K/V rows are in the cache.
        cache: the request's KV cache.
        model_seconds: wall time spent inside the target's forward calls of decode steps.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        check_model(model)
        self.model = model
        parameter = next(model.parameters())
        self.device = parameter.device
        self.dtype = parameter.dtype
        self._mask_min = torch.finfo(self.dtype).min
        self.length = 0
        self.cache = new_cache(model)
        self.model_seconds = 0.0

    @torch.inference_mode()
    def prefill(
        self,
        prompt_ids: np.ndarray,
        topk: int = 0,
        chunk: int = PREFILL_CHUNK,
        probs_temperature: float | None = None,
    ) -> PrefillOutput:
        """Run the prompt through the target and fill the cache.

        With ``topk > 0`` the LM head runs only at the last occurrence of each distinct token:
        the tables that consume these rows keep only a token's latest occurrence, so earlier
        rows would be overwritten anyway. Up to :data:`PROMPT_LOGITS_BUDGET` kept logits, one
        forward returns those rows' logits (``logits_to_keep``); beyond it the prompt positions
        but the last go through the decoder alone and the LM head runs in chunks of ``chunk``
        rows keeping only top-k ids, so an ``L x V`` logits tensor never exists, and the last
        position goes through the full model. Either way the last position's logits include any
        output scaling the model applies.

        Args:
            prompt_ids: ``int32[L]`` prompt, ``L >= 1``.
            topk: number of top ids to keep per prompt position (0: none).
            chunk: LM-head rows per chunk.
            probs_temperature: if not ``None``, also return the top-k ids' probabilities
                under this temperature (see :func:`topk_with_probs`).

        Returns:
            The last position's logits and, if asked, the prompt's top-k ids (and probs).
        """
        self.cache = new_cache(self.model)
        ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=self.device).unsqueeze(0)
        rows: list[tuple[torch.Tensor, torch.Tensor]] = []
        temperature = 1.0 if probs_temperature is None else probs_temperature
        positions = last_occurrences(np.asarray(prompt_ids))
        if topk > 0 and ids.shape[1] > 1 and len(positions) * vocab_size(self.model) <= PROMPT_LOGITS_BUDGET:
            # One forward keeps the logits of the rows the tables read (the last among them): a
            # second forward for the last token alone costs a decode step's weight reads.
            kept = torch.from_numpy(positions).to(self.device)
            logits = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=kept).logits[0]
            # The logits exist whole already: one top-k call (it blocks its normaliser itself).
            rows.append(topk_with_probs(logits[:-1], topk, temperature))
            last = logits[-1]
        elif topk > 0 and ids.shape[1] > 1:
            # The LM head is a monotone map away from the logits for every supported family
            # (at most a positive scale or soft-cap follows it), so top-k ids are exact.
            hidden = self.model.base_model(input_ids=ids[:, :-1], cache=self.cache, use_cache=True).last_hidden_state[0]
            hidden = hidden[torch.from_numpy(positions[:-1]).to(self.device)]
            lm_head = self.model.get_output_embeddings()
            for start in range(0, hidden.shape[0], chunk):
                rows.append(topk_with_probs(lm_head(hidden[start : start + chunk]), topk, temperature))
            last = self.model(input_ids=ids[:, -1:], cache=self.cache, use_cache=True).logits[0, -1]
        else:
            last = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        output = PrefillOutput(last_logits=last, prompt_topk=None)
        if topk > 0:
            rows.append(topk_with_probs(last.unsqueeze(0), topk, temperature))
            output.prompt_topk = torch.cat([r[0] for r in rows]).to(device="cpu", dtype=torch.int32).numpy()
            output.prompt_topk_positions = positions
            if probs_temperature is not None:
                output.prompt_topk_probs = torch.cat([r[1] for r in rows]).cpu().numpy()
        self.length = int(ids.shape[1])
        return output

    def tree_mask(self, ancestors: np.ndarray) -> torch.Tensor:
        """The additive 4D mask ``[1, 1, n, L + n]``: 0 where attention is allowed.

        Args:
            ancestors: ``bool[n, n]``, row ``i`` marks the ancestors of node ``i`` and itself.
        """
        n = ancestors.shape[0]
        mask = torch.zeros((1, 1, n, self.length + n), dtype=self.dtype, device=self.device)
        blocked = torch.from_numpy(~ancestors).to(self.device)
        mask[0, 0, :, self.length :].masked_fill_(blocked, self._mask_min)
        return mask

    @torch.inference_mode()
    def forward_tree(self, tokens: np.ndarray, depths: np.ndarray, ancestors: np.ndarray | None) -> torch.Tensor:
        """Score every node of a draft tree in one forward pass.

        Appends the ``n`` nodes' K/V rows to the cache (they stay there until :meth:`commit`).

        Args:
            tokens: ``int32[n]`` node tokens in BFS order (root first).
            depths: ``int32[n]`` node depths (root 0).
            ancestors: ``bool[n, n]`` ancestor-or-self matrix (may be ``None`` for a lone root).

        Returns:
            ``[n, V]`` raw logits; row ``i`` predicts the token after node ``i``.
        """
        ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64)).to(self.device).unsqueeze(0)
        if ancestors is None or ids.shape[1] == 1:
            # A lone root is plain decoding: let the model build its own (causal) mask.
            inputs: dict[str, Any] = {"input_ids": ids}
        else:
            positions = np.asarray(depths, dtype=np.int64) + self.length
            inputs = {
                "input_ids": ids,
                "position_ids": torch.from_numpy(positions).to(self.device).unsqueeze(0),
                "attention_mask": self.tree_mask(ancestors),
            }
        start = time.perf_counter()
        logits: torch.Tensor = self.model(**inputs, cache=self.cache, use_cache=True).logits[0]
        self.model_seconds += time.perf_counter() - start
        return logits

    @torch.inference_mode()
    def commit(self, path: np.ndarray) -> None:
        """Keep the accepted nodes' K/V rows after the prefix and drop the rest.

        Args:
            path: accepted node indices, ascending and starting with the root (0).
        """
        accepted = len(path)
        start = self.length
        if int(path[-1]) != accepted - 1:  # not already contiguous after the prefix
            rows = torch.from_numpy(np.asarray(path, dtype=np.int64) + start).to(self.device)
            for layer in self.cache.layers:
                assert isinstance(layer, GrowableLayer) and layer.keys is not None and layer.values is not None
                layer.keys[:, :, start : start + accepted] = layer.keys.index_select(2, rows)
                layer.values[:, :, start : start + accepted] = layer.values.index_select(2, rows)
        self.length = start + accepted
        self.discard_uncommitted()

    def discard_uncommitted(self) -> None:
        """Drop every cached row after the committed prefix (e.g. an unused tree's)."""
        surplus = self.cache.get_seq_length() - self.length
        if surplus > 0:
            self.cache.crop(-surplus)
