"""The ``tts`` method: Test-Time Speculation, a draft model distilled online from the target.

It drafts exactly like ``draft_model``. The target's verification pass already scores every
drafted position, so every ``update_every`` (S) rounds the latest verified canvas becomes a
training example and the draft takes one Adam step on the loss of :mod:`racer_rs.tts.online_loss`.

Three copies of the draft take part, so the caller's model is never modified:

* the *original* (the caller's model, ``theta_0``): the anchor of the ``lam`` regulariser and the
  weights every request starts from;
* the *serving* copy: drafts; only the caller's thread reads or writes it;
* the *shadow* copy: the update worker trains it (Adam state included) off the critical path;
  its trainable weights are copied into the serving copy at the next S-round boundary.

Losslessness does not depend on the updates: each round's acceptance uses the distribution that
actually drafted that round, and weights change only between rounds.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from racer_rs import _validate as rules
from racer_rs.drafters.base import RequestStart, StepOutcome
from racer_rs.drafters.draft_model import DraftModelDrafter, check_draft_model
from racer_rs.errors import InvalidTypeError
from racer_rs.tts.online_loss import Canvas, DistillConfig, distill_step, make_optimizer, trainable_parameter_names
from racer_rs.tts.update_worker import UpdateWorker


def copy_sharing(draft: Any, target: Any) -> Any:
    """A deep copy of ``draft`` that keeps sharing the target's modules and tensors.

    A self-draft holds the target's embedding and LM head (frozen); a plain deep copy would
    duplicate them (hundreds of MB for a real model) in each of the serving and shadow copies.
    """
    if not isinstance(target, torch.nn.Module):
        return copy.deepcopy(draft)
    shared = [*target.modules(), *target.parameters(), *target.buffers()]
    return copy.deepcopy(draft, {id(obj): obj for obj in shared})


class TTSDrafter(DraftModelDrafter):
    """A ``draft_model`` drafter whose draft keeps learning from the target (see the module docstring).

    Args:
        model: the target; draft parameters sharing its storage are never trained.
        draft_model: the draft causal LM (left unmodified; the drafter trains copies of it).
        canvas: tokens drafted per round.
        update_every: S, rounds between updates (an update trains on the latest round only).
        lr: Adam learning rate.
        lam: weight of ``KL(q_original || q)``, anchoring the draft to its original weights.
        position_weights: ``"exp"``, ``"uniform"`` or explicit per-row weights.
        gamma: decay length (rows) of the ``"exp"`` position weights.
        mask: ``"full_canvas"`` (every verified row) or ``"on_trajectory"`` (accepted prefix only).
        trainable: ``"all"``, ``"no_embeddings"`` or a sequence of parameter-name prefixes.
        reset: start every request from the original weights and a fresh optimiser.
        asynchronous: train on a background worker (default) or synchronously.
    """

    name = "tts"
    needs_logits = True

    def __init__(
        self,
        model: Any = None,
        *,
        draft_model: Any = None,
        canvas: int = 8,
        update_every: int = 5,
        lr: float = 1e-3,
        lam: float = 0.0,
        position_weights: str | Sequence[float] = "exp",
        gamma: float = 4.0,
        mask: str = "full_canvas",
        trainable: str | Sequence[str] = "all",
        reset: bool = True,
        asynchronous: bool = True,
    ) -> None:
        check_draft_model(draft_model)
        self.update_every = rules.integer("update_every", update_every, minimum=1)
        if not isinstance(reset, bool):
            raise InvalidTypeError(f"reset must be a bool, got {type(reset).__name__}")
        if not isinstance(asynchronous, bool):
            raise InvalidTypeError(f"asynchronous must be a bool, got {type(asynchronous).__name__}")
        weights = position_weights if isinstance(position_weights, str) else tuple(position_weights)
        self.config = DistillConfig(lr=lr, lam=lam, position_weights=weights, gamma=gamma, mask=mask)
        names = trainable_parameter_names(draft_model, trainable, shared_with=model)
        self.original = draft_model
        super().__init__(model, draft_model=copy_sharing(draft_model, model), canvas=canvas)
        self.shadow = copy_sharing(draft_model, model)
        self.reset = reset
        self.asynchronous = asynchronous
        self.trainable = names
        self._pairs = self._param_pairs(names)
        for module in (self.draft, self.shadow):
            for name, param in module.named_parameters():
                param.requires_grad_(module is self.shadow and name in names)
        self._optimizer: torch.optim.Optimizer | None = None
        self._worker: UpdateWorker[Canvas] | None = None
        self._prefix: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
        self._rounds = 0
        self._stats: dict[str, Any] = {}
        self._diverged = 0

    # --- Drafter hooks -------------------------------------------------------------------------

    def begin(self, request: RequestStart) -> None:
        """Start a request: reset the weights (if ``reset``) and start the update worker."""
        super().begin(request)
        self._close_worker(discard=True)
        if self.reset or self._optimizer is None:
            self._restore_original()
            self._optimizer = make_optimizer([s for _, s in self._pairs], self.config)
        self._worker = UpdateWorker(self._train, self._publish, asynchronous=self.asynchronous, device=self._device)
        self._rounds = 0
        self._stats = {}
        self._diverged = 0

    def observe(self, outcome: StepOutcome) -> None:
        """Every S rounds, submit the latest verified chain as a training example."""
        n_accepted = len(outcome.path) - 1
        self.learn(outcome.tree.tokens, outcome.node_logits, n_accepted, outcome.finished)

    def end(self) -> None:
        """Wait for the update in flight, publish it, stop the worker and record the stats."""
        if self._held_elsewhere():
            return  # a request in another thread owns the worker and the cache
        try:
            self._close_worker(discard=False)
        finally:
            super().end()
            self._prefix = ()

    def stats(self) -> dict[str, Any]:
        """Update statistics of the last request (``GenerationResult.extras``)."""
        live = self._worker.stats() if self._worker is not None else self._stats
        return (
            super().stats()
            | {f"tts_{key}": value for key, value in live.items()}
            | {
                "tts_diverged_updates": self._diverged,
                "tts_rounds": self._rounds,
                "tts_update_every": self.update_every,
                "tts_async": self.asynchronous,
            }
        )

    # --- learning ------------------------------------------------------------------------------

    def learn(
        self, canvas_tokens: np.ndarray, node_logits: torch.Tensor | None, n_accepted: int, finished: bool = False
    ) -> None:
        """Count one round; at an S boundary submit its canvas as the next update.

        Args:
            canvas_tokens: the verified chain, root first (the last proposal's root and draft).
            node_logits: ``[len(canvas_tokens), V]`` processed target logits of those nodes.
            n_accepted: drafted tokens of the chain the target accepted.
            finished: the request ended with this round (nothing left to improve).
        """
        self._rounds += 1
        if finished or self._worker is None or self._rounds % self.update_every:
            return
        if node_logits is None:
            raise AssertionError("the engine passed no node_logits to a drafter with needs_logits=True")
        canvas = Canvas(
            prefix=self._prefix,
            input_ids=torch.as_tensor(np.asarray(canvas_tokens, dtype=np.int64), device=self._device),
            teacher_logits=node_logits.detach(),
            n_accepted=int(n_accepted),
            temperature=self._sampling.temperature if not self._sampling.greedy else 1.0,
        )
        self._worker.submit(canvas)

    def _sync(self, context: np.ndarray, next_token: int) -> torch.Tensor:
        logits = super()._sync(context, next_token)
        # Views of the cache as it is now (the committed context): later cache updates concatenate
        # into new tensors, so these stay valid as the training prefix of this round's canvas.
        n_prefix = len(context)
        self._prefix = tuple(
            (layer.keys[..., :n_prefix, :], layer.values[..., :n_prefix, :]) for layer in self._cache.layers
        )
        return logits

    def _train(self, canvas: Canvas) -> float:
        """One update of the shadow weights (on the worker). An update that leaves the loss or
        the weights non-finite (too high a learning rate, a bad canvas) is undone: the shadow
        returns to the serving weights, the optimiser starts afresh, and it is counted, so a
        diverging draft costs acceptance for one update, never the request."""
        assert self._optimizer is not None
        reference = self.original if self.config.lam > 0 else None
        loss = distill_step(self.shadow, self._optimizer, canvas, self.config, reference=reference)
        with torch.no_grad():
            finite = math.isfinite(loss) and all(bool(torch.isfinite(s).all()) for _, s in self._pairs)
            if not finite:
                for serving, shadow in self._pairs:
                    shadow.copy_(serving)
                self._optimizer = make_optimizer([s for _, s in self._pairs], self.config)
                self._diverged += 1
        return loss

    def _publish(self) -> None:
        for serving, shadow in self._pairs:
            serving.copy_(shadow)

    def _param_pairs(self, names: list[str]) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
        serving = dict(self.draft.named_parameters())
        shadow = dict(self.shadow.named_parameters())
        return [(serving[name], shadow[name]) for name in names]

    def _restore_original(self) -> None:
        original = dict(self.original.named_parameters())
        with torch.no_grad():
            for name, (serving, shadow) in zip(self.trainable, self._pairs, strict=True):
                serving.copy_(original[name])
                shadow.copy_(original[name])

    def _close_worker(self, *, discard: bool) -> None:
        worker, self._worker = self._worker, None
        if worker is None:
            return
        try:
            worker.close(discard=discard)
        finally:
            self._stats = worker.stats()


make_drafter = TTSDrafter
"""Registry factory of the ``tts`` method (the class itself, so unknown options are reported)."""
