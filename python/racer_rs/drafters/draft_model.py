"""The ``draft_model`` method: a small causal LM sharing the target's tokenizer drafts a chain.

Each step the draft model proposes ``canvas`` tokens autoregressively from its own KV cache. The
cache is kept across steps: tokens the target rejected are cropped away, and only the tokens
committed since the last step are fed (one forward for all of them), then one forward per
drafted token.

* Greedy requests draft the argmax chain; the engine's greedy walk accepts its longest prefix
  that matches the target's argmax, so the output equals plain greedy decoding.
* Sampling requests sample the chain from the draft's processed distribution ``q`` (same
  temperature / top-k / top-p as the target) and return ``q`` as ``Proposal.draft_probs``, so
  the engine applies standard speculative sampling, which keeps the target distribution exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from racer_rs import _validate as rules
from racer_rs._native import DraftTree
from racer_rs.drafters.base import Drafter, Proposal, RequestStart
from racer_rs.errors import InvalidArgumentError, InvalidTypeError
from racer_rs.target.sampling import SamplingConfig, process_logits
from racer_rs.target.verifier import vocab_size


def check_draft_model(draft_model: Any) -> None:
    """Raise a clear error unless ``draft_model`` is a decoder-only transformers causal LM.

    Raises:
        TypeError: if it is missing or not a causal LM with an LM head.
    """
    from transformers import PreTrainedModel

    if draft_model is None:
        raise InvalidTypeError("draft_model is required: pass draft_model=<a transformers causal LM>")
    if not isinstance(draft_model, PreTrainedModel):
        raise InvalidTypeError(f"draft_model must be a transformers PreTrainedModel, got {type(draft_model).__name__}")
    if draft_model.config.is_encoder_decoder or draft_model.get_output_embeddings() is None:
        raise InvalidTypeError(f"draft_model must be a decoder-only causal LM, got {type(draft_model).__name__}")


class DraftModelDrafter(Drafter):
    """Chain drafting with a standalone draft LM (see the module docstring).

    Args:
        model: the target model (unused beyond the engine's checks; kept for the factory contract).
        draft_model: the draft causal LM; it must use the target's tokenizer.
        canvas: tokens drafted per step (the chain has ``canvas + 1`` nodes with the root),
            capped by the engine's capacity.
    """

    name = "draft_model"

    def __init__(self, model: Any = None, *, draft_model: Any = None, canvas: int = 8) -> None:
        check_draft_model(draft_model)
        self.canvas = rules.integer("canvas", canvas, minimum=1)
        self.draft = draft_model
        if model is not None and hasattr(model, "get_output_embeddings"):
            self._check_vocabulary_of(model)
        self._device = next(draft_model.parameters()).device
        self._sampling = SamplingConfig()
        self._generator: torch.Generator | None = None
        self._vocab_size = vocab_size(draft_model)
        self._cache: Any = None
        self._cached_ids = np.empty(0, dtype=np.int32)
        # Drafting steps whose distribution was not finite (a diverged or damaged draft), counted
        # on the device so that checking costs no synchronisation; read by stats().
        self._nonfinite: torch.Tensor | None = None

    # --- Drafter hooks -------------------------------------------------------------------------

    def begin(self, request: RequestStart) -> None:
        """Reset the draft's cache and take the request's sampling settings.

        Raises:
            RuntimeError: the drafter is serving a request in another thread (its cache
                belongs to that request).
        """
        self._claim()
        self._sampling = SamplingConfig(request.temperature, request.top_p, request.top_k)
        generator = request.generator
        self._generator = generator if generator is not None and generator.device == self._device else None
        self._vocab_size = int(request.vocab_size)
        self._check_vocabulary(request.vocab_size)
        self._nonfinite = torch.zeros((), dtype=torch.int64, device=self._device)
        self._reset_cache()

    def propose(self, context: np.ndarray, next_token: int, capacity: int) -> Proposal:
        """Draft ``min(canvas, capacity - 1)`` tokens after ``next_token``."""
        length = min(self.canvas, capacity - 1)
        tokens, probs = self.draft_chain(context, next_token, length, sample=not self._sampling.greedy)
        tree = DraftTree.chain(np.concatenate([np.array([next_token], dtype=np.int32), tokens]))
        return Proposal(tree=tree, draft_probs=probs if len(tokens) else None)

    def stats(self) -> dict[str, Any]:
        """Drafting steps whose distribution was not finite (they drafted from a uniform one)."""
        return {"draft_nonfinite_steps": int(self._nonfinite) if self._nonfinite is not None else 0}

    def end(self) -> None:
        """Drop the draft's cache (unless it belongs to a request in another thread)."""
        if self._held_elsewhere():
            return
        try:
            self._reset_cache()
        finally:
            self._release()

    # --- drafting ------------------------------------------------------------------------------

    def draft_chain(
        self, context: np.ndarray, next_token: int, length: int, *, sample: bool = False
    ) -> tuple[np.ndarray, torch.Tensor | None]:
        """Draft ``length`` tokens after ``context + [next_token]``.

        Args:
            context: committed tokens (``int32``), ``next_token`` excluded.
            next_token: the root of the chain.
            length: tokens to draft (0 allowed).
            sample: sample from the processed draft distribution instead of taking the argmax.

        Returns:
            ``(tokens int32[length], probs [length, V] or None)``; ``probs`` (only when
            sampling) holds the distribution each token was drawn from.
        """
        if length <= 0:
            return np.empty(0, dtype=np.int32), None
        with torch.no_grad():
            logits = self._sync(context, next_token)
            position = len(context) + 1
            drafted: list[torch.Tensor] = []
            probs: list[torch.Tensor] = []
            for i in range(length):
                token, prob = self._pick(logits, sample)
                drafted.append(token)
                if prob is not None:
                    probs.append(prob)
                if i + 1 < length:
                    logits = self._forward(token.view(1, 1), position + i)
            tokens = torch.stack(drafted).to(torch.int32).cpu().numpy()  # the one host transfer
        # The cache now holds the root and every drafted token but the last one.
        self._cached_ids = np.concatenate([self._cached_ids, tokens[:-1]])
        return tokens, torch.stack(probs) if probs else None

    def _sync(self, context: np.ndarray, next_token: int) -> torch.Tensor:
        """Bring the draft's cache to ``context + [next_token]``; return the last position's logits."""
        full = np.concatenate([np.asarray(context, dtype=np.int32), np.array([next_token], dtype=np.int32)])
        limit = min(len(self._cached_ids), len(full) - 1)
        mismatch = np.flatnonzero(self._cached_ids[:limit] != full[:limit])
        keep = int(mismatch[0]) if mismatch.size else limit
        if self._cache is not None and keep < self._cache.get_seq_length():
            self._cache.crop(keep - self._cache.get_seq_length())  # roll back rejected drafts
        new_ids = torch.as_tensor(full[keep:], dtype=torch.long, device=self._device).unsqueeze(0)
        self._cached_ids = full
        return self._forward(new_ids, keep)

    def _forward(self, input_ids: torch.Tensor, start: int) -> torch.Tensor:
        """Feed ``input_ids`` ``[1, n]`` at positions ``start..``; return the last row's logits ``[V]``."""
        from transformers import DynamicCache

        if self._cache is None:
            self._cache = DynamicCache(config=self.draft.config)
        positions = torch.arange(start, start + input_ids.shape[1], device=self._device).unsqueeze(0)
        out = self.draft(
            input_ids=input_ids, cache=self._cache, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        return self._fit_vocab(out.logits[0, -1])

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Cut or pad (with ``-inf``) the draft's logits to the target's vocabulary width."""
        width = logits.shape[-1]
        if width == self._vocab_size:
            return logits
        if width > self._vocab_size:
            return logits[..., : self._vocab_size]
        pad = logits.new_full((*logits.shape[:-1], self._vocab_size - width), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def _pick(self, logits: torch.Tensor, sample: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next drafted token (a 0-d device tensor) and, when sampling, its distribution.

        A draft whose logits are not finite (its weights diverged or are damaged) drafts from a
        uniform distribution instead: the target decides what is committed, so a broken draft
        costs acceptance, never the request. Such steps are counted (``stats()``).
        """
        # -inf marks tokens outside a reduced vocabulary; NaN, +inf or nothing finite is broken.
        finite = ~(torch.isnan(logits).any() | torch.isposinf(logits).any() | torch.isneginf(logits).all())
        if self._nonfinite is not None:
            self._nonfinite += (~finite).long()
        if not sample:
            return torch.where(finite, logits.argmax(), 0), None
        safe = torch.where(finite, logits, torch.zeros_like(logits))
        q = process_logits(safe.unsqueeze(0), self._sampling).softmax(dim=-1)[0]
        usable = finite & torch.isfinite(q).all()
        q = torch.where(usable, q, torch.full_like(q, 1.0 / q.numel()))
        return torch.multinomial(q, 1, generator=self._generator)[0], q

    def _check_vocabulary_of(self, target: Any) -> None:
        self._check_vocabulary(vocab_size(target))

    def _check_vocabulary(self, target_vocab: int) -> None:
        """A draft must read every token the target can produce: its embedding needs a row for
        each of the target's ids (a draft of another tokenizer fails here, before any work)."""
        rows = int(self.draft.get_input_embeddings().weight.shape[0])
        if rows < target_vocab:
            raise InvalidArgumentError(
                f"draft_model has a vocabulary of {rows} tokens, the target {target_vocab}: it cannot read the "
                "target's tokens; a draft model must share the target's tokenizer"
            )

    def _reset_cache(self) -> None:
        self._cache = None
        self._cached_ids = np.empty(0, dtype=np.int32)


make_drafter = DraftModelDrafter
"""Registry factory of the ``draft_model`` method (the class itself, so unknown options are reported)."""
