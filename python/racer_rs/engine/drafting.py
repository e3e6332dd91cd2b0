"""Drafting for a batch: one proposal per live row per step.

- :class:`PoolDrafting` (``racer``, ``racer_scored``, ``racer_retrieval``, ``racer_logits``):
  every row's RACER state lives in one :class:`racer_rs.DraftPool`, and a step drafts every row's
  tree in ONE :meth:`~racer_rs.DraftPool.propose` call (one GIL release); the pool is driven as
  :class:`racer_rs.drafters.racer.RacerDrafter` drives its automaton and table, so row ``b`` gets
  the tree its own drafter would have proposed.
- :class:`RowDrafting` (``ar``, ``pld``, ``token_recycling``, ``suffix``, ...): one drafter per
  row, called row by row.

Draft-model methods (``draft_model``, ``tts``, ``racer_tts``) keep a draft model's KV cache per
request and stay batch-1 (:data:`UNBATCHED_METHODS`).
"""

from __future__ import annotations

import inspect
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from racer_rs._native import DraftPool
from racer_rs.drafters import make_drafter
from racer_rs.drafters.base import Drafter, Proposal, RequestStart, StepOutcome
from racer_rs.drafters.racer import RacerDrafter
from racer_rs.errors import InvalidTypeError, UnsupportedError

#: Methods that draft with a draft model (one KV cache per request): not batched.
UNBATCHED_METHODS = frozenset({"draft_model", "tts", "racer_tts"})
#: Methods drafted for the whole batch by one DraftPool call per step.
POOL_METHODS = frozenset({"racer", "racer_scored", "racer_retrieval", "racer_logits"})


class BatchDrafting(ABC):
    """Drafts for the rows of a batch (rows are the batch's original row indices).

    Attributes:
        name: the method's name.
        needs_topk, needs_topk_probs, needs_logits: what the drafter needs of the target (as
            :class:`racer_rs.drafters.base.Drafter`'s attributes of the same names).
    """

    name: str
    needs_topk: int = 0
    needs_topk_probs: bool = False
    needs_logits: bool = False

    @abstractmethod
    def begin(self, row: int, request: RequestStart) -> None:
        """Start row ``row``'s request."""

    @abstractmethod
    def propose(
        self,
        rows: Sequence[int],
        contexts: Sequence[np.ndarray],
        next_tokens: Sequence[int],
        capacities: Sequence[int],
        edge_calibration: np.ndarray | None,
    ) -> list[Proposal]:
        """One proposal per row, rooted at its ``next_tokens`` entry, of at most its capacity."""

    @abstractmethod
    def observe(self, rows: Sequence[int], outcomes: Sequence[StepOutcome]) -> None:
        """Learn from every row's verified step."""

    @abstractmethod
    def end(self, row: int) -> None:
        """Row ``row``'s request finished (normally or not)."""

    @abstractmethod
    def stats(self, row: int) -> dict[str, Any]:
        """Row ``row``'s method-specific statistics (its result's ``extras``)."""


class PoolDrafting(BatchDrafting):
    """Every row's RACER automaton and copy-logit table in one :class:`racer_rs.DraftPool`.

    Args:
        drafter: a :class:`RacerDrafter` built with the request's options (it validates them
            and names the sources and tree kind; it drafts nothing itself).
        vocab: the target's vocabulary size.
    """

    def __init__(self, drafter: RacerDrafter, vocab: int) -> None:
        if drafter.persistent:
            raise UnsupportedError(
                f"method {drafter.name!r}: persistent=True is not supported by generate_batch (every row keeps "
                "its own RACER state in a DraftPool for the call)"
            )
        options = drafter.options
        self.name = drafter.name
        self.scored = drafter.scored
        self.use_retrieval = drafter.use_retrieval
        self.use_logits = drafter.use_logits
        self.needs_topk = drafter.needs_topk
        self.needs_topk_probs = drafter.needs_topk_probs
        self.pool = DraftPool(
            vocab,
            ngram=options.ngram,
            max_nodes=options.max_nodes,
            breadth=options.breadth,
            min_depth=options.min_depth,
            exempt_depth=options.exempt_depth,
            tree="scored" if drafter.scored else "halving",
            min_score=options.min_score,
            use_retrieval=drafter.use_retrieval,
            use_logits=drafter.use_logits,
            threads=max(1, min(8, os.cpu_count() or 1)),  # the pool uses them only for big batches
        )

    def begin(self, row: int, request: RequestStart) -> None:
        """``RacerDrafter.begin``: index the prompt and seed the row's table with its top-k."""
        self.pool.add(row, request.prompt_ids)
        tokens = request.prompt_topk_tokens
        if self.use_logits and tokens is not None and request.prompt_topk is not None:
            self.pool.update_topk(row, tokens, request.prompt_topk, request.prompt_topk_probs)

    def propose(
        self,
        rows: Sequence[int],
        contexts: Sequence[np.ndarray],
        next_tokens: Sequence[int],
        capacities: Sequence[int],
        edge_calibration: np.ndarray | None,
    ) -> list[Proposal]:
        """Every row's tree in one :meth:`DraftPool.propose` call."""
        draft = self.pool.propose(
            list(rows),
            np.asarray(next_tokens, dtype=np.int32),
            np.asarray(capacities, dtype=np.int64),
            calibration=edge_calibration if self.scored else None,
        )
        return [Proposal(draft.tree(i)) for i in range(len(rows))]

    def observe(self, rows: Sequence[int], outcomes: Sequence[StepOutcome]) -> None:
        """``RacerDrafter.observe`` for every row: copy-logit rows (rejected nodes first, the
        accepted path last), then the committed tokens extend every row's automaton at once."""
        for row, outcome in zip(rows, outcomes, strict=True):
            if self.use_logits and outcome.topk_ids is not None:
                tokens = outcome.tree.tokens
                rejected = np.ones(len(tokens), dtype=bool)
                rejected[outcome.path] = False
                order = np.concatenate([np.flatnonzero(rejected), np.asarray(outcome.path, dtype=np.int64)])
                probs = outcome.topk_probs[order] if outcome.topk_probs is not None else None
                self.pool.update_topk(row, tokens[order], outcome.topk_ids[order], probs)
        if rows:
            self.pool.extend(list(rows), [np.asarray(o.committed, dtype=np.int32) for o in outcomes])

    def end(self, row: int) -> None:
        """Free the row's automaton and table."""
        if row in self.pool:
            self.pool.remove(row)

    def stats(self, row: int) -> dict[str, Any]:
        """State mode (the pool keeps per-request state only)."""
        return {"persistent": False, "draft_pool": True}


class RowDrafting(BatchDrafting):
    """One drafter per row, each driven as the decode loop drives a request's drafter.

    Args:
        drafters: one drafter per row of the batch (distinct objects).
    """

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        first = drafters[0]
        self.drafters = list(drafters)
        self.name = first.name
        self.needs_topk = first.needs_topk
        self.needs_topk_probs = first.needs_topk_probs
        self.needs_logits = first.needs_logits
        self._takes_calibration = "edge_calibration" in inspect.signature(first.propose).parameters

    def begin(self, row: int, request: RequestStart) -> None:
        self.drafters[row].begin(request)

    def propose(
        self,
        rows: Sequence[int],
        contexts: Sequence[np.ndarray],
        next_tokens: Sequence[int],
        capacities: Sequence[int],
        edge_calibration: np.ndarray | None,
    ) -> list[Proposal]:
        proposals = []
        for row, context, token, capacity in zip(rows, contexts, next_tokens, capacities, strict=True):
            drafter = self.drafters[row]
            if self._takes_calibration:
                propose: Any = drafter.propose  # its signature takes the optional calibration
                proposals.append(propose(context, token, capacity, edge_calibration=edge_calibration))
            else:
                proposals.append(drafter.propose(context, token, capacity))
        return proposals

    def observe(self, rows: Sequence[int], outcomes: Sequence[StepOutcome]) -> None:
        for row, outcome in zip(rows, outcomes, strict=True):
            self.drafters[row].observe(outcome)

    def end(self, row: int) -> None:
        self.drafters[row].end()

    def stats(self, row: int) -> dict[str, Any]:
        return dict(self.drafters[row].stats())


def make_batch_drafting(method: str, model: Any, rows: int, vocab: int, options: dict[str, Any]) -> BatchDrafting:
    """The batch drafting of ``method`` for ``rows`` rows (options checked by the method's factory).

    Raises:
        UnsupportedError: a draft-model method, or an option the batch cannot honour.
        InvalidArgumentError, InvalidTypeError: bad method or options (as ``make_drafter``).
    """
    if isinstance(method, str) and method in UNBATCHED_METHODS:
        raise UnsupportedError(
            f"method {method!r} drafts with a draft model (one KV cache per request) and is not supported by "
            "generate_batch; use racer_rs.generate for each prompt"
        )
    first = make_drafter(method, model, **options)
    if method in POOL_METHODS:
        if not isinstance(first, RacerDrafter):
            raise InvalidTypeError(f"method {method!r} did not build a RacerDrafter")
        return PoolDrafting(first, vocab)
    return RowDrafting([first] + [make_drafter(method, model, **options) for _ in range(rows - 1)])
