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
breadth halving". ``tree="auto"`` (the ``racer`` method) builds the halving tree at a fixed
capacity and the scored one when the engine passes an edge calibration (``capacity="auto"``):
then every node carries a calibrated probability (a retrieval continuation's count over its
parent string's, by match length; a copy-logit entry's stored target probability), the sources
compete in one best-first order, and the size rule cuts where a node no longer pays.

Cross-request memory (``index=``, :mod:`racer_rs.drafters.index`): the retrieval methods also
draft from a shared index, an automaton every request reads (past responses, learned as each
request ends with ``learn=True``, and/or a corpus saved by ``racer index build``). The halving
tree takes the request's own retrieval first, then the shared index's continuations, then the
logits tree; the scored tree weighs them in one best-first order, calibrated on their own edge
cells. The request's own automaton stays per request.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from racer_rs import _validate as rules
from racer_rs._native import Automaton, DraftPool, DraftTree, LogitsTable, build_draft_tree
from racer_rs.drafters.base import Drafter, Proposal, RequestStart, StepOutcome
from racer_rs.drafters.index import (
    LEARNS_INTO_INDEX,
    MEMORY,
    READ_ONLY_INDEX,
    SCOPES,
    SharedIndex,
    check_index,
    open_index,
)
from racer_rs.errors import InvalidArgumentError, InvalidTypeError


@dataclass(frozen=True)
class RacerOptions:
    """RACER's drafting options: one list for every racer method, ``racer_tts`` and
    :class:`racer_rs.DraftPool` (which takes the same names, the shared-index ones aside).

    Attributes:
        ngram: longest n-gram the automaton indexes.
        max_nodes: the automaton's node budget (LRU eviction beyond it); not the draft tree's
            size, which is ``generate``'s ``capacity``.
        breadth: ids per copy-logit row (the target's top-k), also the logits tree's root
            breadth (the reference's ``max_breadth``).
        min_depth: shortest context suffix a retrieval border may match (2; with
            ``capacity="auto"``, whose trees are calibrated and scored, ``racer`` and
            ``racer_scored`` default to :data:`CALIBRATED_MIN_DEPTH`, 1).
        exempt_depth: depths (from the root) whose breadth is not halved in the logits tree.
        persistent: keep the automaton and table across requests (the reference code's
            behaviour); default is per-request state.
        min_score: scored trees only: leave out nodes whose estimated path probability is
            below this (0 keeps the tree at full capacity). On hardware where each extra node
            costs verification time (CPUs), a small threshold trades useless nodes for speed.
        index: a shared index every request drafts from besides its own automaton
            (:mod:`racer_rs.drafters.index`): ``"memory"`` (in memory, one per model and
            method in the process), the path of an index saved by ``Automaton.save`` /
            ``racer index build`` (loaded once per path), or an :class:`~racer_rs.Automaton`;
            ``None`` for none. The racer methods that draft by retrieval default to
            :data:`DEFAULT_INDEX` (see :meth:`for_method`); this class alone to ``None``.
        learn: write every finished request's response into the index (default: ``True``
            when an index is given); ``False`` only reads it (a corpus).
        index_max_nodes: node budget of an ``index="memory"`` index (LRU beyond it; default
            :data:`racer_rs.drafters.index.INDEX_MAX_NODES`); a saved index keeps its own.
        index_scope: ``"process"`` (default): the index is shared by every drafter given the
            same one; ``"drafter"``: this drafter gets its own (empty, or a copy of the file
            or automaton), kept across the requests it serves.
    """

    ngram: int = 10
    max_nodes: int = 10_000
    breadth: int = 8
    min_depth: int = 2
    exempt_depth: int = 1
    persistent: bool = False
    min_score: float = 0.0
    index: Any = None
    learn: bool | None = None
    index_max_nodes: int | None = None
    index_scope: str = "process"

    def __post_init__(self) -> None:
        for name in ("ngram", "max_nodes", "min_depth"):
            rules.integer(name, getattr(self, name), minimum=1)
        rules.integer("breadth", self.breadth, minimum=1, maximum=MAX_BREADTH)
        rules.integer("exempt_depth", self.exempt_depth, minimum=0)
        rules.flag("persistent", self.persistent)
        object.__setattr__(self, "min_score", rules.probability("min_score", self.min_score))
        object.__setattr__(self, "index", check_index(self.index))
        if self.learn is None:
            object.__setattr__(self, "learn", self.index is not None)
        elif rules.flag("learn", self.learn) and self.index is None:
            raise InvalidArgumentError(
                "learn=True needs an index to learn into (index='memory', a path or an Automaton)"
            )
        if self.index_max_nodes is not None:
            rules.integer("index_max_nodes", self.index_max_nodes, minimum=1)
            if self.index is None:
                raise InvalidArgumentError("index_max_nodes needs index='memory'")
        rules.choice("index_scope", self.index_scope, SCOPES)
        # Every combination the core refuses (ngram beyond 64, max_nodes beyond the node ids or
        # below one window's substrings, min_depth above ngram), now rather than at the first
        # request: an empty DraftPool checks the same settings without allocating.
        DraftPool(
            1,
            ngram=self.ngram,
            max_nodes=self.max_nodes,
            breadth=self.breadth,
            min_depth=self.min_depth,
            exempt_depth=self.exempt_depth,
            min_score=self.min_score,
        )

    @classmethod
    def for_method(cls, method: str, options: dict[str, Any]) -> RacerOptions:
        """The options ``method`` was given; any option the method does not take is an error.

        A method that takes an index and was given none drafts from :data:`DEFAULT_INDEX`, an
        in-memory index of its drafter's own (``index=None`` turns it off; an ``index_scope``
        given alone applies to it)."""
        rules.choice("method", method, tuple(METHOD_OPTIONS))
        if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
            raise InvalidTypeError(f"options must be a mapping of option names, got {type(options).__name__}")
        accepted = METHOD_OPTIONS[method]
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise InvalidArgumentError(
                f"unknown option(s) {', '.join(unknown)} for method {method!r}; accepted: {', '.join(accepted)}"
            )
        if "index" in accepted and "index" not in options:
            options = {**DEFAULT_INDEX, **options}
        return cls(**options)


#: The index of a racer method given none (``index=None`` turns it off): an in-memory index of
#: the drafter's own, learning every finished response, as SuffixDecoding's global tree (vLLM's
#: ``suffix``) does by default. The drafter is the call's (``generate`` / ``generate_batch``:
#: a call's rows serve the rows admitted after them, and the next call starts empty) or a
#: persistent drafter's (``racer bench``, a server). On code, where answers share text that a
#: request's own prompt lacks, this is what moves racer's drafts most: Qwen2.5-Coder-0.5B on 16
#: HumanEval problems at concurrency 1, 2.21x ``ar`` with it against 1.62x without it (docs/results.md,
#: "Serving-style"); on chat it changes little. Drafting stays lossless and a seeded row still
#: samples what plain sampling does with its seed, whatever the index holds.
DEFAULT_INDEX: dict[str, Any] = {"index": MEMORY, "index_scope": "drafter"}

#: Tree kinds (see :class:`RacerDrafter`).
TREES = ("halving", "scored", "auto")
#: The copy-logit table keeps at most this many ids per row (the Rust core's limit).
MAX_BREADTH = 1024
RETRIEVAL_OPTIONS = ("ngram", "max_nodes", "min_depth")
LOGITS_OPTIONS = ("breadth", "exempt_depth")
#: The shared index's options (methods that draft by retrieval).
INDEX_OPTIONS = ("index", "learn", "index_max_nodes", "index_scope")
#: The options each racer method takes (the others keep their defaults there).
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "racer": (*RETRIEVAL_OPTIONS, *LOGITS_OPTIONS, "persistent", *INDEX_OPTIONS),
    "racer_scored": (*RETRIEVAL_OPTIONS, "breadth", "persistent", "min_score", *INDEX_OPTIONS),
    "racer_retrieval": (*RETRIEVAL_OPTIONS, "persistent", *INDEX_OPTIONS),
    "racer_logits": (*LOGITS_OPTIONS, "persistent"),
}


#: The core's words when the shared automaton hands a draft a token beyond the vocabulary (it
#: holds another tokenizer's ids; only an index can: every other id the drafters see is checked).
FOREIGN_IDS = re.compile(r"^shared\b.*: drafted token (\d+) is outside the vocabulary .*another tokenizer's ids")


def foreign_index_error(source: str, vocab: int, error: InvalidArgumentError) -> InvalidArgumentError | None:
    """The error to raise for ``error`` when it is the core refusing a draft of the shared
    index ``source`` for a token beyond the model's vocabulary; ``None`` for any other error."""
    found = FOREIGN_IDS.match(str(error))
    if found is None:
        return None
    return InvalidArgumentError(
        f"index {source}: drafted token {found.group(1)} is outside the model's vocabulary (0..{vocab}): "
        "the index was built with another tokenizer"
    )


class RacerDrafter(Drafter):
    """RACER's drafter.

    Args:
        model: the target (used only as the key of a process-wide ``index="memory"`` index).
        options: the drafting options (:class:`RacerOptions`); keyword options may be given
            instead, e.g. ``RacerDrafter(persistent=True)``.
        use_retrieval: draft from the automaton.
        use_logits: draft from the copy-logit table.
        tree: ``"halving"`` (the paper's merge), ``"scored"`` (best first by estimated
            path probability) or ``"auto"`` (scored when a calibration is given, i.e. with
            ``capacity="auto"``, else halving).
        name: the method name reported in results (also the key of a process-wide
            ``index="memory"`` index).

    Raises:
        InvalidArgumentError: a bad option; an index with ``use_retrieval=False`` (it is read
            by retrieval); an index file that is missing or unreadable.
        CorruptFileError: a damaged index file.
    """

    name = "racer"

    def __init__(
        self,
        model: Any = None,
        options: RacerOptions | None = None,
        *,
        use_retrieval: bool = True,
        use_logits: bool = True,
        tree: str = "halving",
        name: str = "racer",
        **keyword_options: Any,
    ) -> None:
        if options is None:
            options = RacerOptions(**keyword_options)
        elif keyword_options:
            raise InvalidArgumentError("pass RACER's options either as a RacerOptions or as keywords, not both")
        rules.choice("tree", tree, TREES)
        if not (rules.flag("use_retrieval", use_retrieval) or rules.flag("use_logits", use_logits)):
            raise InvalidArgumentError("use_retrieval and use_logits cannot both be False")
        self.options = options
        self.use_retrieval = use_retrieval
        self.use_logits = use_logits
        self.persistent = options.persistent
        self.exempt_depth = options.exempt_depth
        self.breadth = options.breadth
        self.needs_topk = options.breadth if use_logits else 0
        self.tree = tree
        self.scored = tree == "scored"
        self.min_score = options.min_score
        # Stored probabilities are the copy-logit nodes' estimates in a scored build.
        self.needs_topk_probs = tree != "halving" and use_logits
        # The prompt's rows only seed the copy-logit table, which every step writes anyway.
        self.prompt_topk_optional = True
        self.automaton = Automaton(ngram=options.ngram, max_nodes=options.max_nodes, min_depth=options.min_depth)
        self.table: LogitsTable | None = None
        self.name = name
        self.index: SharedIndex | None = None
        if options.index is not None:
            if not use_retrieval:
                raise InvalidArgumentError(f"method {name!r} drafts without retrieval: a shared index would go unread")
            self.index = open_index(
                options.index,
                learn=bool(options.learn),
                scope=options.index_scope,
                model=model,
                method=name,
                ngram=options.ngram,
                min_depth=options.min_depth,
                max_nodes=options.index_max_nodes,
            )
        # Each thread's open request: its prompt and the response committed so far (what end()
        # writes into the index); per thread, since a persistent drafter may serve many at once.
        self._requests = threading.local()

    @property
    def shared_automaton(self) -> Automaton | None:
        """The shared index's automaton (``build_draft_tree``'s ``shared``), or ``None``."""
        return self.index.automaton if self.index is not None else None

    @property
    def learns_across_requests(self) -> bool:
        """True when finished responses are written into a shared index that later requests read."""
        return self.index is not None and self.index.learn

    @property
    def learning_state(self) -> str:
        """How this drafter carries state across requests (``racer bench`` reports it)."""
        return LEARNS_INTO_INDEX if self.learns_across_requests else READ_ONLY_INDEX

    def begin(self, request: RequestStart) -> None:
        """Reset (unless persistent), then index the prompt and seed the table."""
        if self.table is None or self.table.vocab_size != request.vocab_size:
            self.table = LogitsTable(request.vocab_size, self.breadth)
        elif not self.persistent:
            self.table.clear()
        if not self.persistent:
            self.automaton.clear()
        self.automaton.new_sequence()
        if self.use_retrieval:
            self.automaton.extend(request.prompt_ids)
        tokens = request.prompt_topk_tokens
        if self.use_logits and tokens is not None and request.prompt_topk is not None:
            self.table.update(tokens, request.prompt_topk, request.prompt_topk_probs)
        if self.index is not None:
            self._requests.prompt = np.asarray(request.prompt_ids, dtype=np.int32)
            self._requests.response = []

    def propose(
        self, context: np.ndarray, next_token: int, capacity: int, edge_calibration: np.ndarray | None = None
    ) -> Proposal:
        """Retrieval paths first, then the logits tree fills the remaining budget (scored trees:
        best first by estimated path probability, calibrated per edge cell when given)."""
        assert self.table is not None, "begin() must be called first"
        scored = self.builds_scored(edge_calibration is not None)
        return Proposal(
            self.build_tree(
                next_token,
                capacity,
                use_retrieval=self.use_retrieval,
                use_logits=self.use_logits,
                scored=scored,
                min_score=self.min_score,
                calibration=edge_calibration if scored else None,
            )
        )

    def builds_scored(self, calibrated: bool) -> bool:
        """Whether trees are built best first: always for ``tree="scored"``, with a calibration
        (``capacity="auto"``) for ``tree="auto"``."""
        return self.scored or (self.tree == "auto" and calibrated)

    def build_tree(self, next_token: int, capacity: int, **options: Any) -> DraftTree:
        """:func:`racer_rs.build_draft_tree` over this request's automaton, table and index
        (``options`` as that function's); an index of another tokenizer is one clear error."""
        assert self.table is not None
        try:
            return build_draft_tree(
                self.automaton,
                self.table,
                next_token,
                capacity,
                exempt_depth=self.exempt_depth,
                shared=self.shared_automaton,
                **options,
            )
        except InvalidArgumentError as error:
            if self.index is None:
                raise
            foreign = foreign_index_error(self.index.source, self.table.vocab_size, error)
            if foreign is None:
                raise
            raise foreign from None

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
        response = getattr(self._requests, "response", None)
        if response is not None:
            response.append(np.array(outcome.committed, dtype=np.int32))

    def end(self) -> None:
        """Write the request's committed response into the shared index (``learn=True``).

        The tokens are those the steps committed: a request whose last step committed only the
        target's own token, without a draft (no ``observe``), ends one token short.
        """
        prompt = getattr(self._requests, "prompt", None)
        response = getattr(self._requests, "response", None)
        self._requests.prompt = self._requests.response = None
        if self.index is not None and prompt is not None and response:
            self.index.learn_response(prompt, response)

    def stats(self) -> dict[str, Any]:
        """State mode and sizes; with a shared index, its source, size and whether it learns."""
        stats: dict[str, Any] = {
            "persistent": self.persistent,
            "automaton_nodes": len(self.automaton),
            "table_rows": len(self.table) if self.table is not None else 0,
        }
        stats.update(self.index.stats() if self.index is not None else {"index": None})
        return stats


#: ``min_depth`` of a method whose trees are calibrated and scored (``capacity="auto"``) when
#: the caller gives none. A scored tree ranks every retrieval edge by its calibrated cell, which
#: has the match length, so one-token matches enter only where they pay; the halving tree puts
#: retrieval first whatever its match length, and keeps :attr:`RacerOptions.min_depth`'s 2.
#: Measured with ``racer bench --concurrency 1 4`` (16 requests, 64 tokens, bfloat16, one
#: thread, ``racer`` against the same with ``min_depth=1``): SmolLM2-135M on Spec-Bench 1.24x ->
#: 1.35x ``ar`` at C = 1 (MAT 1.56 -> 1.83), 1.19x -> 1.27x at C = 4; Qwen2.5-Coder-0.5B on
#: HumanEval 1.43x -> 1.48x at C = 1, 1.29x -> 1.27x at C = 4. ``racer@16`` (halving) lost with
#: it: 1.28x -> 1.24x (MAT 1.81 -> 1.66).
CALIBRATED_MIN_DEPTH = 1


def _method(name: str, **settings: Any) -> Any:
    """The registry factory of racer method ``name``: its options are :data:`METHOD_OPTIONS`'s."""

    def factory(model: Any = None, **options: Any) -> RacerDrafter:
        return RacerDrafter(model, RacerOptions.for_method(name, options), name=name, **settings)

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = f"The registry's ``{name}`` (options: {', '.join(METHOD_OPTIONS[name])})."
    factory.accepted_options = METHOD_OPTIONS[name]  # type: ignore[attr-defined]
    if settings.get("tree") in ("auto", "scored") and "min_depth" in METHOD_OPTIONS[name]:
        factory.calibrated_defaults = {"min_depth": CALIBRATED_MIN_DEPTH}  # type: ignore[attr-defined]
    return factory


#: RACER with both sources: the paper's merge at a fixed capacity, the calibrated scored tree
#: with ``capacity="auto"``.
racer = _method("racer", tree="auto")
#: RACER's two sources in a probability-scored tree (best first by estimated path probability).
racer_scored = _method("racer_scored", tree="scored")
#: Ablation: the automaton only.
racer_retrieval = _method("racer_retrieval", use_logits=False)
#: Ablation: the copy-logit table only.
racer_logits = _method("racer_logits", use_retrieval=False)
