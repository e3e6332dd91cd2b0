"""Pure-Python restatements of what the serving engines do with a proposer's output, written
from the engines' documented semantics (not from our code), for the integration tests.

SGLang 0.5.23:

- ``reconstruct_indices_from_tree_mask`` (sglang/kernels/ops/speculative/reconstruct_tree.py,
  its docstring): per request ``b`` and node ``t`` of ``n``, ``ancestors[i, j] = mask[b, i, j]
  and j < i``; ``positions = #ancestors + seq_len``; ``retrieve_index = b * n + t``;
  ``parent = max{j < t: ancestors[t, j]}`` else -1; ``retrieve_next_token[t] = min{k > t:
  ancestors[k, t]}`` else -1; ``retrieve_next_sibling[t] = min{k > t: parent[k] == parent[t]}``
  else -1, and -1 when ``parent[t] < 0``.
- ``VerifyTreeGreedy`` (sgl_kernel/speculative/eagle.cuh): from node 0, each level goes to the
  first child and scans siblings in increasing index for the target's argmax after the last
  accepted node; it stops at the first level with no match; the bonus is the argmax after the
  last accepted node.

vLLM 0.33.0: a request with ``n`` tokens (prompt and outputs) gets at most
``min(num_speculative_tokens, max_model_len - n - 1)`` draft tokens scheduled
(core/sched/scheduler.py: ``num_new_tokens <= max_model_len - num_computed_tokens - 1`` with
``num_computed_tokens = n - 1``, drafts cut to ``num_new_tokens - 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Links:
    positions: np.ndarray  # int64 [bs * n]
    retrieve_index: np.ndarray  # int64 [bs, n]
    next_token: np.ndarray  # int64 [bs, n]
    next_sibling: np.ndarray  # int64 [bs, n]
    parents: np.ndarray  # int64 [bs, n]


def sglang_links(mask: np.ndarray, bs: int, n: int, seq_lens: list[int]) -> Links:
    """SGLang's link reconstruction from a flat ``[bs * n * n]`` mask, literally."""
    tree = np.asarray(mask).reshape(bs, n, n).astype(bool)
    positions = np.zeros(bs * n, dtype=np.int64)
    retrieve_index = np.zeros((bs, n), dtype=np.int64)
    next_token = np.full((bs, n), -1, dtype=np.int64)
    next_sibling = np.full((bs, n), -1, dtype=np.int64)
    parents = np.full((bs, n), -1, dtype=np.int64)
    for b in range(bs):

        def ancestor(i: int, j: int, b: int = b) -> bool:
            return bool(tree[b, i, j]) and j < i

        for t in range(n):
            count = sum(ancestor(t, j) for j in range(n))
            positions[b * n + t] = count + seq_lens[b]
            retrieve_index[b, t] = b * n + t
            strict = [j for j in range(n) if ancestor(t, j)]
            parents[b, t] = max(strict) if strict else -1
        for t in range(n):
            below = [k for k in range(t + 1, n) if ancestor(k, t)]
            next_token[b, t] = min(below) if below else -1
            if parents[b, t] >= 0:
                same = [k for k in range(t + 1, n) if parents[b, k] == parents[b, t]]
                next_sibling[b, t] = min(same) if same else -1
    return Links(positions, retrieve_index, next_token, next_sibling, parents)


def verify_tree_greedy(
    candidates: np.ndarray, links: Links, target_predict: np.ndarray, b: int, n: int
) -> tuple[list[int], int]:
    """SGLang's greedy tree verification of request ``b``.

    Args:
        candidates: ``[bs, n]`` draft tokens.
        links: from :func:`sglang_links`.
        target_predict: ``[bs, n]`` target argmax after every node.
        b: the request.
        n: nodes per request (SGLang's ``num_speculative_tokens`` for NGRAM is ``n`` too).

    Returns:
        ``(accept_index, bonus)``: accepted flat rows ``b * n + t`` starting with the root, and
        the target's token after the last accepted node.
    """
    last = int(links.retrieve_index[b, 0])
    accept = [last]
    cur = 0
    for _ in range(1, n):
        cur = int(links.next_token[b, cur])
        while cur != -1:
            draft_index = int(links.retrieve_index[b, cur])
            if int(candidates[b, cur]) == int(target_predict.reshape(-1)[last]):
                accept.append(draft_index)
                last = draft_index
                break
            cur = int(links.next_sibling[b, cur])
        if cur == -1:
            break
    return accept, int(target_predict.reshape(-1)[last])


def vllm_draft_bound(k: int, max_model_len: int, num_tokens: int) -> int:
    """Most draft tokens vLLM schedules for a request of ``num_tokens`` tokens (at least 0)."""
    return max(0, min(k, max_model_len - num_tokens - 1))


def check_sglang_tree_rows(mask: np.ndarray, bs: int, n: int) -> None:
    """Every request's mask is a tree in SGLang's sense: the root on every row's first column,
    each row its parent's row plus its own diagonal, parents before children."""
    tree = np.asarray(mask).reshape(bs, n, n).astype(bool)
    for b in range(bs):
        assert tree[b, :, 0].all(), f"request {b}: a node without the root as ancestor"
        assert tree[b].diagonal().all(), f"request {b}: a node that is not its own ancestor"
        assert not np.triu(tree[b], 1).any(), f"request {b}: an ancestor after its descendant"
        for i in range(1, n):
            strict = np.flatnonzero(tree[b, i, :i])
            parent = strict.max()
            expected = tree[b, parent].copy()
            expected[i] = True
            assert (tree[b, i] == expected).all(), f"request {b}: row {i} is not its parent's row plus itself"
