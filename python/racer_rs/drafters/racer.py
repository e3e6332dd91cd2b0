"""``racer``: RACER (retrieval-augmented contextual rapid speculative decoding).

The draft tree merges two sources, both built in the Rust core:

- retrieval: continuations of the context's longest indexed suffixes, from an automaton over
  every n-gram (n <= ``ngram``) of the context, ranked by frequency;
- copy-logit: a table holding, for every token, the target's top-k next tokens at its latest
  verified occurrence, expanded breadth-first with halving breadth.

After each step the table is written with the tree's top-k ids, rejected nodes first and the
accepted path last (so the accepted context wins), and the automaton is extended with the
committed tokens. ``racer_retrieval`` and ``racer_logits`` are the one-source ablations.

``tree="scored"`` (the ``racer_scored`` method) keeps the same two sources but stores the
target's top-k probabilities too and grows the tree best first by estimated path probability
(copy-logit probabilities, smoothed retrieval frequencies) instead of "retrieval first, then
breadth halving".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from racer_rs._native import Automaton, LogitsTable, build_draft_tree
from racer_rs.drafters.base import Drafter, Proposal, RequestStart, StepOutcome
from racer_rs.errors import InvalidArgumentError


class RacerDrafter(Drafter):
    """RACER's drafter.

    Args:
        model: unused.
        ngram: longest n-gram the automaton indexes.
        max_nodes: automaton node budget (LRU eviction beyond it).
        top_k: ids per copy-logit row (the target's top-k), also the logits tree's root
            breadth (the reference's ``max_breadth``). Through :func:`racer_rs.generate` it is
            the ``breadth`` option, as ``top_k`` there is the sampling filter.
        min_depth: shortest context suffix a retrieval border may match.
        exempt_depth: depths (from the root) whose breadth is not halved in the logits tree.
        persistent: keep the automaton and table across requests (the reference code's
            behaviour); default is per-request state.
        use_retrieval: draft from the automaton.
        use_logits: draft from the copy-logit table.
        tree: ``"halving"`` (the paper's merge) or ``"scored"`` (best first by estimated
            path probability).
        min_score: scored trees only: leave out nodes whose estimated path probability is
            below this (0 keeps the tree at full capacity). On hardware where each extra node
            costs verification time (CPUs), a small threshold trades useless nodes for speed.
    """

    name = "racer"

    def __init__(
        self,
        model: Any = None,
        ngram: int = 10,
        max_nodes: int = 10_000,
        top_k: int = 8,
        min_depth: int = 2,
        exempt_depth: int = 1,
        persistent: bool = False,
        use_retrieval: bool = True,
        use_logits: bool = True,
        tree: str = "halving",
        min_score: float = 0.0,
    ) -> None:
        del model
        if tree not in ("halving", "scored"):
            raise InvalidArgumentError(f"tree must be 'halving' or 'scored', got {tree!r}")
        if not (use_retrieval or use_logits):
            raise InvalidArgumentError("use_retrieval and use_logits cannot both be False")
        if top_k < 1:
            raise InvalidArgumentError(f"breadth (top_k) must be >= 1, got {top_k}")
        self.use_retrieval = use_retrieval
        self.use_logits = use_logits
        self.persistent = persistent
        self.exempt_depth = exempt_depth
        self.top_k = top_k
        self.needs_topk = top_k if use_logits else 0
        if not 0.0 <= min_score <= 1.0:
            raise InvalidArgumentError(f"min_score must be in [0, 1], got {min_score}")
        self.scored = tree == "scored"
        self.min_score = float(min_score)
        self.needs_topk_probs = self.scored and use_logits
        self.automaton = Automaton(ngram=ngram, capacity=max_nodes, min_depth=min_depth)
        self.table: LogitsTable | None = None

    def begin(self, request: RequestStart) -> None:
        """Reset (unless persistent), then index the prompt and seed the table."""
        if self.table is None or self.table.vocab_size != request.vocab_size:
            self.table = LogitsTable(request.vocab_size, self.top_k)
        elif not self.persistent:
            self.table.clear()
        if not self.persistent:
            self.automaton.clear()
        self.automaton.new_sequence()
        if self.use_retrieval:
            self.automaton.extend(request.prompt_ids)
        if self.use_logits and request.prompt_topk is not None:
            self.table.update(request.prompt_topk_tokens, request.prompt_topk, request.prompt_topk_probs)

    def propose(
        self, context: np.ndarray, next_token: int, capacity: int, edge_calibration: np.ndarray | None = None
    ) -> Proposal:
        """Retrieval paths first, then the logits tree fills the remaining budget (scored trees:
        best first by estimated path probability, calibrated per edge cell when given)."""
        assert self.table is not None, "begin() must be called first"
        tree = build_draft_tree(
            self.automaton,
            self.table,
            next_token,
            capacity,
            use_retrieval=self.use_retrieval,
            use_logits=self.use_logits,
            exempt_depth=self.exempt_depth,
            scored=self.scored,
            min_score=self.min_score,
            calibration=edge_calibration if self.scored else None,
        )
        return Proposal(tree)

    def observe(self, outcome: StepOutcome) -> None:
        """Copy-logit update (rejected nodes, then the accepted path) and automaton extension."""
        if self.use_logits and self.table is not None and outcome.topk_ids is not None:
            tokens = outcome.tree.tokens
            rejected = np.ones(len(tokens), dtype=bool)
            rejected[outcome.path] = False
            order = np.concatenate([np.flatnonzero(rejected), np.asarray(outcome.path, dtype=np.int64)])
            probs = outcome.topk_probs[order] if outcome.topk_probs is not None else None
            self.table.update(tokens[order], outcome.topk_ids[order], probs)
        if self.use_retrieval:
            self.automaton.extend(outcome.committed)

    def stats(self) -> dict[str, Any]:
        """State mode and sizes."""
        return {
            "persistent": self.persistent,
            "automaton_nodes": len(self.automaton),
            "table_rows": len(self.table) if self.table is not None else 0,
        }


def racer(
    model: Any = None,
    ngram: int = 10,
    max_nodes: int = 10_000,
    breadth: int = 8,
    min_depth: int = 2,
    exempt_depth: int = 1,
    persistent: bool = False,
) -> RacerDrafter:
    """RACER with both sources (the registry's ``racer``); ``breadth`` is the table's top-k."""
    return RacerDrafter(model, ngram, max_nodes, breadth, min_depth, exempt_depth, persistent)


def racer_scored(
    model: Any = None,
    ngram: int = 10,
    max_nodes: int = 10_000,
    breadth: int = 8,
    min_depth: int = 2,
    persistent: bool = False,
    min_score: float = 0.0,
) -> RacerDrafter:
    """RACER's two sources in a probability-scored tree (best first by estimated path
    probability); ``breadth`` is the table's top-k; ``min_score`` prunes unlikely nodes."""
    drafter = RacerDrafter(
        model, ngram, max_nodes, breadth, min_depth, persistent=persistent, tree="scored", min_score=min_score
    )
    drafter.name = "racer_scored"
    return drafter


def racer_retrieval(
    model: Any = None,
    ngram: int = 10,
    max_nodes: int = 10_000,
    min_depth: int = 2,
    persistent: bool = False,
) -> RacerDrafter:
    """RACER ablation that drafts from the automaton only."""
    drafter = RacerDrafter(model, ngram, max_nodes, min_depth=min_depth, persistent=persistent, use_logits=False)
    drafter.name = "racer_retrieval"
    return drafter


def racer_logits(
    model: Any = None, breadth: int = 8, exempt_depth: int = 1, persistent: bool = False
) -> RacerDrafter:
    """RACER ablation that drafts from the copy-logit table only."""
    drafter = RacerDrafter(model, top_k=breadth, exempt_depth=exempt_depth, persistent=persistent, use_retrieval=False)
    drafter.name = "racer_logits"
    return drafter
