"""The target's forward cost t(n) for draft trees of n nodes, measured on its own device.

Speculative decoding pays off only when the tokens a tree adds are worth what verifying it costs,
and that cost depends on the hardware: nearly flat up to 64 nodes on a datacenter GPU, steep on a
CPU. :func:`measure_forward_cost` times the real verification path (:class:`TreeVerifier`: tree
mask, position ids, KV cache) at a given context length, interleaving the sizes over several rounds
so that machine noise hits every size alike, and reports the median per size.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from racer_rs._native import DraftTree
from racer_rs.verify import TreeVerifier

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64)


def synthetic_tree(size: int, vocab: int, branching: int = 4) -> DraftTree:
    """A tree of ``size`` nodes, each node's parent ``(i - 1) // branching`` (distinct tokens)."""
    parents = np.asarray([-1] + [(i - 1) // branching for i in range(1, size)], dtype=np.int32)
    tokens = (np.arange(size, dtype=np.int64) * 7919 % vocab).astype(np.int32)
    return DraftTree(tokens, parents)


def measure_forward_cost(
    model: Any,
    sizes: Sequence[int] = DEFAULT_SIZES,
    context: int = 500,
    rounds: int = 5,
    seed: int = 0,
) -> dict[int, float]:
    """Median seconds of one tree forward per tree size, at a ``context``-token prefix.

    Args:
        model: the target (as given to :func:`racer_rs.generate`).
        sizes: tree sizes to time (nodes, root included).
        context: tokens already in the KV cache.
        rounds: timed passes over every size (one untimed pass warms up first).
        seed: seeds the random prefix.

    Returns:
        ``{size: median seconds}``.
    """
    if not sizes or any(int(n) < 1 for n in sizes):
        raise ValueError(f"sizes must be positive tree sizes, got {list(sizes)}")
    if context < 1 or rounds < 1:
        raise ValueError("context and rounds must be >= 1")
    verifier = TreeVerifier(model)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    prompt = np.random.default_rng(seed).integers(0, vocab, size=context, dtype=np.int64).astype(np.int32)
    verifier.prefill(prompt)
    trees = {int(n): synthetic_tree(int(n), vocab) for n in sizes}
    synchronize = torch.cuda.synchronize if verifier.device.type == "cuda" else (lambda: None)
    samples: dict[int, list[float]] = {n: [] for n in trees}
    order = list(trees)
    for round_index in range(rounds + 1):
        for n in order[round_index % len(order) :] + order[: round_index % len(order)]:
            tree = trees[n]
            synchronize()
            start = time.perf_counter()
            verifier.forward_tree(tree.tokens, tree.depths, tree.attention_mask() if n > 1 else None)
            synchronize()
            elapsed = time.perf_counter() - start
            verifier.discard_uncommitted()  # the prefix stays put
            if round_index > 0:
                samples[n].append(elapsed)
    return {n: float(np.median(times)) for n, times in samples.items()}
