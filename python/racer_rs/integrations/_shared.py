"""Pieces both engine integrations use: token arrays from engine containers, the copy-logit
write order, and top-k rows of verify logits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from racer_rs import _validate as rules

#: Largest token id + 1 the Rust core stores.
_INT32_LIMIT = 2**31


def int64_tokens(values: Any, name: str = "tokens") -> np.ndarray:
    """``values`` (a list, an ``array.array`` slice, a numpy array) as a 1-D ``int64`` array,
    by the package's one rule for ids (:func:`racer_rs._validate.id_array`: ints only, never a
    float or a bool; the range is the caller's business).

    Callers pass slices: an ``array.array`` slice is a copy, so no buffer of the engine's own
    (growing) arrays is held, which would stop them from being resized.
    """
    return rules.id_array(name, values)


def in_vocab(tokens: np.ndarray, vocab_size: int) -> bool:
    """Whether every token id is in ``[0, vocab_size)``."""
    return tokens.size == 0 or (int(tokens.min()) >= 0 and int(tokens.max()) < min(vocab_size, _INT32_LIMIT))


def list_in_vocab(tokens: list[int], vocab_size: int) -> bool:
    """:func:`in_vocab` for a short list of ints (a step's sampled tokens), without numpy."""
    return not tokens or (min(tokens) >= 0 and max(tokens) < min(vocab_size, _INT32_LIMIT))


def rows_in_vocab(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """Per row of a 2-D id array, whether every id is in ``[0, vocab_size)`` (as :func:`in_vocab`)."""
    if ids.shape[1] == 0:
        return np.ones(len(ids), dtype=bool)
    fits: np.ndarray = (ids.min(axis=1) >= 0) & (ids.max(axis=1) < min(vocab_size, _INT32_LIMIT))
    return fits


def copy_logit_order(nodes: int, path: Sequence[int]) -> np.ndarray:
    """Node indices in the order a request's copy-logit rows are written after a verify step:
    the rejected nodes (``0..nodes`` not on ``path``) first, then the accepted path, so the
    accepted context's rows win (as :meth:`racer_rs.drafters.racer.RacerDrafter.observe`).

    ``path`` may hold indices ``>= nodes`` (SGLang's padding nodes, accepted when the target
    predicts token 0 after the root).
    """
    if isinstance(path, range) and path.start == 0 and path.step == 1 and path.stop <= nodes:
        # A chain's accepted prefix (vLLM's every step): its rejected tail, then the prefix.
        return np.concatenate([np.arange(path.stop, nodes), np.arange(path.stop)])
    on_path = np.zeros(max(nodes, 1), dtype=bool)
    accepted = np.asarray(path, dtype=np.int64)
    on_path[accepted[accepted < nodes]] = True
    return np.concatenate([np.flatnonzero(~on_path[:nodes]), accepted])


def topk_rows(logits: Any, k: int, with_probs: bool) -> tuple[Any, Any]:
    """Top-``k`` ids of ``[rows, vocab]`` logits (a torch tensor, left on its device) and, when
    asked, their probabilities under ``softmax(logits)`` (float32), else ``None``.

    On the CPU one pass of the Rust kernel per row, equal logits ordered by id (a CPU server's
    proposer spent 0.4-1.2 ms a step in torch's ``topk`` and ``logsumexp`` at 1-8 requests):
    :func:`racer_rs.target.sampling.logits_summary` with probabilities,
    :func:`racer_rs.target.sampling.topk_ids` (no exponentials) without.
    """
    from racer_rs.target.sampling import logits_summary, topk_ids

    if with_probs:
        ids, probs, _ = logits_summary(logits, k, 1.0)
        return ids, probs
    return topk_ids(logits, k), None
