"""``racer_tts``: the RACER tree with an adapted draft model's chain as a third source.

Each step the draft model (adapted online as in ``tts``) drafts a greedy chain; the Rust core
merges it into the RACER tree first, then retrieval paths and the copy-logit tree fill the rest
of the same capacity (``build_draft_tree(..., draft_chain=chain)``). The automaton and the table
are kept up to date by a :class:`~racer_rs.drafters.racer.RacerDrafter` held by composition;
the draft model, its cache and its update worker by a :class:`~racer_rs.drafters.tts.TTSDrafter`.

After verification the chain's nodes are located in the tree; their target logits form the
training canvas, and the chain's accepted prefix (the part of the accepted path that follows
the chain) is its ``n_accepted``. The chain is drafted greedily (deterministically), so the
engine's one-sample-per-node walk stays lossless when sampling.

RACER's shared-index options (``index``, ``learn``, ...) apply as in ``racer``: the index's
continuations come after the chain and the request's own retrieval.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from racer_rs._native import DraftTree
from racer_rs.drafters.base import Drafter, Proposal, RequestStart, StepOutcome
from racer_rs.drafters.racer import METHOD_OPTIONS, RacerDrafter, RacerOptions
from racer_rs.drafters.tts import TTSDrafter
from racer_rs.errors import InvalidArgumentError, InvalidTypeError

#: RACER's options racer_tts takes (as the ``racer`` method does).
RACER_OPTIONS = METHOD_OPTIONS["racer"]
#: TTS's options racer_tts takes (as ``tts`` does; the draft model and canvas are its own).
TTS_OPTIONS = tuple(
    name
    for name in inspect.signature(TTSDrafter.__init__).parameters
    if name not in ("self", "model", "draft_model", "canvas")
)
ACCEPTED = ("draft_model", "canvas", "adapt", *RACER_OPTIONS, *TTS_OPTIONS)


def chain_nodes(tree: DraftTree, chain: np.ndarray) -> np.ndarray:
    """Indices of the root and of the chain's tokens in ``tree`` (a prefix if the tree cut it)."""
    tokens = tree.tokens
    parents = tree.parents
    nodes = [0]
    for token in chain:
        child = np.flatnonzero((parents == nodes[-1]) & (tokens == token))
        if child.size == 0:
            break
        nodes.append(int(child[0]))
    return np.asarray(nodes, dtype=np.int64)


class RacerTTSDrafter(Drafter):
    """RACER + an online-adapted draft-model chain, merged under one capacity.

    Args:
        model: the target.
        draft_model: the draft causal LM (left unmodified).
        canvas: chain length drafted per step.
        adapt: adapt the draft online (TTS); ``False`` keeps the original draft (an ablation).
        **options: RACER's options (:data:`RACER_OPTIONS`, see
            :class:`~racer_rs.drafters.racer.RacerOptions`) and TTS's (:data:`TTS_OPTIONS`, see
            :class:`~racer_rs.drafters.tts.TTSDrafter`).
    """

    name = "racer_tts"

    def __init__(
        self,
        model: Any = None,
        *,
        draft_model: Any = None,
        canvas: int = 8,
        adapt: bool = True,
        **options: Any,
    ) -> None:
        if not isinstance(adapt, bool):
            raise InvalidTypeError(f"adapt must be a bool, got {type(adapt).__name__}")
        unknown = sorted(set(options) - set(RACER_OPTIONS) - set(TTS_OPTIONS))
        if unknown:
            raise InvalidArgumentError(
                f"unknown option(s) {', '.join(unknown)} for method 'racer_tts'; accepted: {', '.join(ACCEPTED)}"
            )
        racer = {key: value for key, value in options.items() if key in RACER_OPTIONS}
        tts = {key: value for key, value in options.items() if key in TTS_OPTIONS}
        self.racer = RacerDrafter(model, RacerOptions.for_method("racer", racer), name="racer_tts")
        self.tts = TTSDrafter(model, draft_model=draft_model, canvas=canvas, **tts)
        self.adapt = adapt
        self.needs_topk = self.racer.needs_topk
        self.needs_logits = adapt
        self._chain = np.empty(0, dtype=np.int32)

    @property
    def learns_across_requests(self) -> bool:
        """True when RACER's shared index learns from finished responses (see ``index``)."""
        return self.racer.learns_across_requests

    @property
    def learning_state(self) -> str:
        """How RACER's shared index carries state across requests."""
        return self.racer.learning_state

    def begin(self, request: RequestStart) -> None:
        """Start both sources.

        Raises:
            RuntimeError: the drafter is serving a request in another thread.
        """
        self._claim()
        self.racer.begin(request)
        self.tts.begin(request)

    def propose(self, context: np.ndarray, next_token: int, capacity: int) -> Proposal:
        """The draft chain first, then retrieval paths and the logits tree."""
        assert self.racer.table is not None, "begin() must be called first"
        self._chain, _ = self.tts.draft_chain(context, next_token, min(self.tts.canvas, capacity - 1))
        return Proposal(self.racer.build_tree(next_token, capacity, draft_chain=self._chain))

    def observe(self, outcome: StepOutcome) -> None:
        """RACER's upkeep, then (if adapting) the chain's canvas goes to the TTS learner."""
        self.racer.observe(outcome)
        if not self.adapt:
            return
        nodes = chain_nodes(outcome.tree, self._chain)
        on_path = np.asarray(outcome.path[: len(nodes)], dtype=np.int64)
        n_accepted = int(np.cumprod(on_path == nodes[: len(on_path)]).sum()) - 1
        logits = outcome.node_logits
        rows = logits[torch.as_tensor(nodes, device=logits.device)] if logits is not None else None
        self.tts.learn(outcome.tree.tokens[nodes], rows, n_accepted, outcome.finished)

    def end(self) -> None:
        """Finish both sources (the update worker is always stopped), unless they belong to a
        request in another thread."""
        if self._held_elsewhere():
            return
        try:
            self.tts.end()
        finally:
            self.racer.end()
            self._release()

    def stats(self) -> dict[str, Any]:
        """RACER's sizes and the TTS update statistics."""
        return self.racer.stats() | (self.tts.stats() if self.adapt else {}) | {"racer_tts_adapt": self.adapt}


make_drafter = RacerTTSDrafter
make_drafter.accepted_options = ACCEPTED  # type: ignore[attr-defined]
"""Registry factory of the ``racer_tts`` method (the class itself, so unknown options are reported)."""
