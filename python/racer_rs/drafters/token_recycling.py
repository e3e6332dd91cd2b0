"""``token_recycling``: Token Recycling (Luo et al., ACL 2025), a training-free tree drafter.

An adjacency table keeps, for every token, the target's top-k next tokens from the latest
logits computed at one of its occurrences (prompt positions and ALL verified tree nodes,
accepted or not). The draft fills a static tree template from the table: node ``i`` of the
template is rank ``ranks[i]`` of its parent's row.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from racer_rs._native import LogitsTable
from racer_rs.drafters.base import Drafter, Proposal, RequestStart, StepOutcome
from racer_rs.errors import InvalidArgumentError

# The paper's 80-node, depth-6 template (plus the root) for k = 8, as parent indices in BFS
# order; a node's rank is its position among its parent's children.
TEMPLATE_PARENTS: tuple[int, ...] = (
    (-1,)
    + (0,) * 8
    + (1,) * 8 + (2,) * 4 + (3,) * 3 + (4,) * 2 + (5, 6, 7, 8)
    + (9,) * 8 + (10,) * 3 + (11,) * 2 + (12, 13, 14, 15, 16, 17, 17, 18, 21, 24, 26, 27)
    + (30,) * 5 + (31,) * 2 + (32, 33, 34, 38, 41, 48, 51, 52)
    + (55,) * 3 + (56, 57, 60, 65, 67)
    + (70, 70, 73)
)  # fmt: skip


def _ranks(parents: tuple[int, ...]) -> np.ndarray:
    ranks = np.zeros(len(parents), dtype=np.int32)
    seen: dict[int, int] = {}
    for node, parent in enumerate(parents[1:], start=1):
        ranks[node] = seen.get(parent, 0)
        seen[parent] = ranks[node] + 1
    return ranks


@cache
def template(capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """The template cut to ``capacity`` nodes: ``(parents, ranks)`` in BFS order.

    Nodes are kept in order of the sum of ranks along their path (ties: BFS order), so a
    small budget keeps the likeliest deep chains rather than only the first levels; a
    parent always precedes its children in that order, so the cut is a valid tree.
    """
    parents = TEMPLATE_PARENTS
    ranks = _ranks(parents)
    path_rank = ranks.copy()
    for node in range(1, len(parents)):
        path_rank[node] += path_rank[parents[node]]
    keep = np.sort(np.lexsort((np.arange(len(parents)), path_rank))[:capacity])
    new_index = {int(old): new for new, old in enumerate(keep)}
    kept_parents = np.array([-1] + [new_index[parents[int(old)]] for old in keep[1:]], dtype=np.int32)
    return kept_parents, ranks[keep]


class TokenRecyclingDrafter(Drafter):
    """Token Recycling with the paper's static tree.

    Args:
        model: unused.
        breadth: ids kept per table row, the target's top-k (the template needs 8).
        persistent: keep the table across requests (the official code does); default is
            per-request state.
    """

    name = "token_recycling"

    def __init__(self, model: Any = None, breadth: int = 8, persistent: bool = False) -> None:
        del model
        if breadth < 1:
            raise InvalidArgumentError(f"breadth must be >= 1, got {breadth}")
        self.needs_topk = breadth
        self.persistent = persistent
        self.table: LogitsTable | None = None

    def begin(self, request: RequestStart) -> None:
        """Reset (unless persistent) and seed the table with the prompt's top-k."""
        if self.table is None or self.table.vocab_size != request.vocab_size:
            self.table = LogitsTable(request.vocab_size, self.needs_topk)
        elif not self.persistent:
            self.table.clear()
        tokens = request.prompt_topk_tokens
        if tokens is not None and request.prompt_topk is not None:
            self.table.update(tokens, request.prompt_topk)

    def propose(self, context: np.ndarray, next_token: int, capacity: int) -> Proposal:
        """Fill the template from the table, rooted at ``next_token``."""
        assert self.table is not None, "begin() must be called first"
        parents, ranks = template(min(capacity, len(TEMPLATE_PARENTS)))
        return Proposal(self.table.expand_static(next_token, parents, ranks))

    def observe(self, outcome: StepOutcome) -> None:
        """Recycle the top-k of every verified node, in BFS order as in the paper."""
        if self.table is not None and outcome.topk_ids is not None:
            self.table.update(outcome.tree.tokens, outcome.topk_ids)

    def stats(self) -> dict[str, Any]:
        """Table fill and state mode."""
        return {"persistent": self.persistent, "table_rows": len(self.table) if self.table is not None else 0}
