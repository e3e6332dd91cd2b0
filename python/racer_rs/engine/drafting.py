"""Drafting for the engine's live rows: one proposal per row per step.

- :class:`PoolDrafting` (``racer``, ``racer_scored``, ``racer_retrieval``, ``racer_logits`` in a
  batch): every row's RACER state lives in one :class:`racer_rs.DraftPool`, and a step drafts
  every row's tree in ONE :meth:`~racer_rs.DraftPool.propose` call (one GIL release); the pool is
  driven as :class:`racer_rs.drafters.racer.RacerDrafter` drives its automaton and table, so row
  ``b`` gets the tree its own drafter would have proposed.
- :class:`RowDrafting` (every other method, every method in a request of its own, and the
  racer methods with persistent state): one drafter per row, called row by
  row. The draft-model methods (``draft_model``, ``tts``, ``racer_tts``) run one draft model per
  row (its own KV cache, the draft's weights shared); a row's drafter is built when its request
  is admitted and dropped when it finishes (a persistent one is kept for the next request of its
  slot), so a long job's memory stays bounded.

Rows are keyed by their request's index. A row's own drafter failing is returned, not raised, so
the engine can end that row alone.
"""

from __future__ import annotations

import inspect
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from racer_rs._native import BatchDraft, DraftPool
from racer_rs.drafters import calibrated_options, make_drafter
from racer_rs.drafters.base import Drafter, Proposal, RequestStart, StepOutcome
from racer_rs.drafters.racer import INDEX_OPTIONS, RacerDrafter, foreign_index_error
from racer_rs.errors import InvalidArgumentError, InvalidTypeError, UnsupportedError

#: Methods drafted for the whole batch by one DraftPool call per step.
POOL_METHODS = frozenset({"racer", "racer_scored", "racer_retrieval", "racer_logits"})


class Drafting(ABC):
    """Drafts for the engine's live rows (a row's key is its request's index).

    Attributes:
        name: the method's name.
        needs_topk, needs_topk_probs, needs_logits, prompt_topk_optional: what the drafter
            needs of the target (as :class:`racer_rs.drafters.base.Drafter`'s attributes of the
            same names).
        never_drafts: every proposal is the lone root (as the drafter's attribute).
        skips_steps: a step may skip drafting for every row (a plain step: no proposals, no
            top-k; :meth:`observe` gets outcomes without top-k and learns the committed tokens).
    """

    name: str
    never_drafts: bool = False
    skips_steps: bool = False
    needs_topk: int = 0
    needs_topk_probs: bool = False
    needs_logits: bool = False
    prompt_topk_optional: bool = False

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
    ) -> list[Proposal | Exception]:
        """One proposal per row, rooted at its ``next_tokens`` entry, of at most its capacity (or
        the error the row's own drafter raised)."""

    @abstractmethod
    def observe(self, rows: Sequence[int], outcomes: Sequence[StepOutcome]) -> list[Exception | None]:
        """Learn from every row's verified step; per row, the error its own drafter raised."""

    @abstractmethod
    def end(self, row: int) -> None:
        """Row ``row``'s request finished (normally or not); a row never begun is ignored."""

    def release(self, row: int) -> None:  # noqa: B027  # most drafting holds nothing past end()
        """Free what the row held once its result is built (its statistics were read)."""

    @abstractmethod
    def stats(self, row: int) -> dict[str, Any]:
        """Row ``row``'s method-specific statistics (its result's ``extras``)."""


class PoolDrafting(Drafting):
    """Every row's RACER automaton and copy-logit table in one :class:`racer_rs.DraftPool`
    (a plain step extends the automata and writes its roots' top-k rows).

    Args:
        drafter: a :class:`RacerDrafter` built with the request's options (it validates them
            and names the sources and tree kind; it drafts nothing itself).
        vocab: the target's vocabulary size.
        calibrated: the policy passes an edge calibration (``capacity="auto"``): a
            ``tree="auto"`` drafter's pool builds scored trees.
    """

    def __init__(self, drafter: RacerDrafter, vocab: int, calibrated: bool = False) -> None:
        if drafter.persistent:
            raise UnsupportedError(
                f"method {drafter.name!r}: persistent=True is not supported by generate_batch (every row keeps "
                "its own RACER state in a DraftPool for the call)"
            )
        options = drafter.options
        self.name = drafter.name
        self.skips_steps = True
        self.scored = drafter.builds_scored(calibrated)
        self.use_retrieval = drafter.use_retrieval
        self.use_logits = drafter.use_logits
        self.needs_topk = drafter.needs_topk
        self.needs_topk_probs = drafter.needs_topk_probs
        self.prompt_topk_optional = drafter.prompt_topk_optional
        self.vocab = vocab
        # The shared index every row drafts from, and what each row will teach it at its end.
        self.index = drafter.index
        self.learning: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
        self.pool = DraftPool(
            vocab,
            ngram=options.ngram,
            max_nodes=options.max_nodes,
            breadth=options.breadth,
            min_depth=options.min_depth,
            exempt_depth=options.exempt_depth,
            tree="scored" if self.scored else "halving",
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
        if self.index is not None and self.index.learn:
            self.learning[row] = (np.asarray(request.prompt_ids, dtype=np.int32), [])

    def propose(
        self,
        rows: Sequence[int],
        contexts: Sequence[np.ndarray],
        next_tokens: Sequence[int],
        capacities: Sequence[int],
        edge_calibration: np.ndarray | None,
    ) -> list[Proposal | Exception]:
        """Every row's tree in one :meth:`DraftPool.propose` call (the shared index read by all).

        The pool refuses a batch in which the index hands a row a token beyond the vocabulary
        (an index of another tokenizer); the rows are then drafted one by one, so that only the
        rows it reached fail, with the error :func:`racer_rs.generate` gives."""
        calibration = edge_calibration if self.scored else None
        try:
            draft = self._pool_propose(rows, next_tokens, capacities, calibration)
        except InvalidArgumentError as error:
            if self.index is None or foreign_index_error(self.index.source, self.vocab, error) is None:
                raise
            return [self._propose_alone(*row, calibration) for row in zip(rows, next_tokens, capacities, strict=True)]
        proposals: list[Proposal | Exception] = [Proposal(draft.tree(i)) for i in range(len(rows))]
        return proposals

    def _pool_propose(
        self, rows: Sequence[int], next_tokens: Sequence[int], capacities: Sequence[int], calibration: np.ndarray | None
    ) -> BatchDraft:
        return self.pool.propose(
            list(rows),
            np.asarray(next_tokens, dtype=np.int32),
            np.asarray(capacities, dtype=np.int64),
            calibration=calibration,
            shared=self.index.automaton if self.index is not None else None,
        )

    def _propose_alone(
        self, row: int, next_token: int, capacity: int, calibration: np.ndarray | None
    ) -> Proposal | Exception:
        assert self.index is not None
        try:
            return Proposal(self._pool_propose([row], [next_token], [capacity], calibration).tree(0))
        except InvalidArgumentError as error:
            foreign = foreign_index_error(self.index.source, self.vocab, error)
            if foreign is None:
                raise
            return foreign  # that row's failure alone

    def observe(self, rows: Sequence[int], outcomes: Sequence[StepOutcome]) -> list[Exception | None]:
        """``RacerDrafter.observe`` for every row: copy-logit rows (rejected nodes first, the
        accepted path last) of every row in one pool call, then the committed tokens extend
        every row's automaton at once."""
        if self.use_logits:
            self._write_topk(rows, outcomes)
        if rows:
            committed = [np.asarray(o.committed, dtype=np.int32) for o in outcomes]
            self.pool.extend(list(rows), committed)
            for row, tokens in zip(rows, committed, strict=True):
                if row in self.learning:
                    self.learning[row][1].append(tokens)
        return [None] * len(rows)

    def _write_topk(self, rows: Sequence[int], outcomes: Sequence[StepOutcome]) -> None:
        """Every row's copy-logit rows in one :meth:`DraftPool.update_topk_many` call (a plain
        step's trees are their roots alone: their rows go as they are)."""
        written = [(row, o, o.topk_ids) for row, o in zip(rows, outcomes, strict=True) if o.topk_ids is not None]
        if not written:
            return
        plain = all(len(o.tree) == 1 for _, o, _ in written)
        orders = [None if plain else written_order(len(o.tree), o.path) for _, o, _ in written]

        def rows_of(arrays: Sequence[np.ndarray]) -> np.ndarray:
            return np.concatenate([a if order is None else a[order] for a, order in zip(arrays, orders, strict=True)])

        probs = [o.topk_probs for _, o, _ in written if o.topk_probs is not None]
        self.pool.update_topk_many(
            [row for row, _, _ in written],
            rows_of([o.tree.tokens for _, o, _ in written]),
            rows_of([ids for _, _, ids in written]),
            np.asarray([len(o.tree) for _, o, _ in written], dtype=np.int64),
            rows_of(probs) if len(probs) == len(written) else None,
        )

    def end(self, row: int) -> None:
        """Teach the shared index the row's response (``learn``), then free the row's state."""
        learned = self.learning.pop(row, None)
        if self.index is not None and learned is not None:
            self.index.learn_response(*learned)
        if row in self.pool:
            self.pool.remove(row)

    def stats(self, row: int) -> dict[str, Any]:
        """State mode (the pool keeps per-request state only) and the shared index's."""
        stats: dict[str, Any] = {"persistent": False, "draft_pool": True}
        stats.update(self.index.stats() if self.index is not None else {"index": None})
        return stats


class RowDrafting(Drafting):
    """One drafter per row, each driven as a single request's drafter.

    Args:
        build: makes a drafter for a new row (called when its request is admitted).
        slots: the most rows live at once; a persistent drafter is kept per slot and serves the
            slot's next request (its state carried across requests, as with one ``generate``
            call after another).
        first: an already built drafter (the method's, or the caller's ``drafter=``): the first
            slot's.
    """

    def __init__(self, build: Callable[[], Drafter], slots: int, first: Drafter) -> None:
        self.build = build
        self.name = first.name
        self.needs_topk = first.needs_topk
        self.needs_topk_probs = first.needs_topk_probs
        self.needs_logits = first.needs_logits
        self.prompt_topk_optional = first.prompt_topk_optional
        self.never_drafts = first.never_drafts
        self._takes_calibration = "edge_calibration" in inspect.signature(first.propose).parameters
        self.idle: list[Drafter] = [first]  # built, not serving a row
        self.drafters: dict[int, Drafter] = {}
        self.slots = slots

    def begin(self, row: int, request: RequestStart) -> None:
        drafter = self.idle.pop() if self.idle else self.build()
        self.drafters[row] = drafter
        drafter.begin(request)

    def propose(
        self,
        rows: Sequence[int],
        contexts: Sequence[np.ndarray],
        next_tokens: Sequence[int],
        capacities: Sequence[int],
        edge_calibration: np.ndarray | None,
    ) -> list[Proposal | Exception]:
        proposals: list[Proposal | Exception] = []
        for row, context, token, capacity in zip(rows, contexts, next_tokens, capacities, strict=True):
            drafter = self.drafters[row]
            try:
                if self._takes_calibration:
                    propose: Any = drafter.propose  # its signature takes the optional calibration
                    proposals.append(propose(context, token, capacity, edge_calibration=edge_calibration))
                else:
                    proposals.append(drafter.propose(context, token, capacity))
            except Exception as error:
                proposals.append(error)
        return proposals

    def observe(self, rows: Sequence[int], outcomes: Sequence[StepOutcome]) -> list[Exception | None]:
        failures: list[Exception | None] = []
        for row, outcome in zip(rows, outcomes, strict=True):
            try:
                self.drafters[row].observe(outcome)
                failures.append(None)
            except Exception as error:
                failures.append(error)
        return failures

    def end(self, row: int) -> None:
        drafter = self.drafters.get(row)
        if drafter is not None:
            drafter.end()

    def release(self, row: int) -> None:
        drafter = self.drafters.pop(row, None)
        # A persistent drafter carries its state to the slot's next request; others are dropped.
        if drafter is not None and getattr(drafter, "persistent", False) and len(self.idle) < self.slots:
            self.idle.append(drafter)

    def stats(self, row: int) -> dict[str, Any]:
        return dict(self.drafters[row].stats())


def racer_part(drafter: Drafter) -> RacerDrafter | None:
    """The RACER drafter inside ``drafter`` (itself, or ``racer_tts``'s), which holds the index."""
    if isinstance(drafter, RacerDrafter):
        return drafter
    inner = getattr(drafter, "racer", None)
    return inner if isinstance(inner, RacerDrafter) else None


def make_drafting(
    method: str,
    model: Any,
    rows: int,
    vocab: int,
    options: dict[str, Any],
    drafter: Drafter | None = None,
    calibrated: bool = False,
) -> Drafting:
    """The drafting of ``method`` for at most ``rows`` live rows (options checked by the method's
    factory), or of the caller's prebuilt ``drafter`` (one row at a time); ``calibrated``: the
    capacity policy passes edge calibrations (``capacity="auto"``).

    RACER's methods draft a batch in one :class:`DraftPool` when more than one row can be live and
    their state is the request's own (a shared index is read by the whole pool); a single row or
    persistent state keeps the method's own drafter per row (what one ``generate`` call uses).
    An index of scope ``"drafter"`` belongs to the call: all of its rows read and teach it.

    Raises:
        InvalidArgumentError, InvalidTypeError: bad method or options (as ``make_drafter``).
    """
    if drafter is not None:
        return RowDrafting(lambda: drafter, 1, drafter)
    if calibrated:
        options = calibrated_options(method, options)
    first = make_drafter(method, model, **options)
    if rows > 1 and method in POOL_METHODS and not getattr(first, "persistent", False):
        if not isinstance(first, RacerDrafter):
            raise InvalidTypeError(f"method {method!r} did not build a RacerDrafter")
        return PoolDrafting(first, vocab, calibrated)
    racer = racer_part(first)
    index = racer.index if racer is not None else None
    if index is None or index.scope != "drafter":
        return RowDrafting(lambda: make_drafter(method, model, **options), rows, first)
    # A drafter-scope index is the call's: every row's drafter reads and teaches first's.
    own = {key: value for key, value in options.items() if key not in INDEX_OPTIONS}
    own["index"] = None  # not an index of each row's own, which first's replaces at once

    def build() -> Drafter:
        drafter = make_drafter(method, model, **own)
        part = racer_part(drafter)
        assert part is not None  # the same method as first's
        part.index = index
        return drafter

    return RowDrafting(build, rows, first)


def written_order(nodes: int, path: Sequence[int]) -> np.ndarray:
    """A verified tree's nodes in the order their copy-logit rows are written: the rejected
    nodes first, the accepted path last, so that the accepted context's rows win."""
    rejected = np.ones(nodes, dtype=bool)
    rejected[path] = False
    return np.concatenate([np.flatnonzero(rejected), np.asarray(path, dtype=np.int64)])
