"""The drafter interface: what the decode loop asks of every drafting method.

A drafter proposes a draft tree rooted at the token the target just produced, and learns from
the outcome of verifying it. The engine (:mod:`racer_rs.engine.generation`) owns the model, the KV
cache and acceptance; drafters only see token ids (numpy) and, when they ask for it, the
target's top-k ids or logits.

Lifecycle per request: ``begin`` once, then ``propose``/``observe`` once per step, then ``end``
(always called, also when the request fails).

Drafters whose per-request state cannot be shared (a draft model's KV cache, an update worker)
serve one request at a time: :meth:`Drafter._claim` in their ``begin`` raises a clear
``RuntimeError`` when a request in another thread holds the drafter, and their ``end`` leaves
that request's state alone (:meth:`Drafter._held_elsewhere`). RACER's drafters keep only
indexes that every request may read and extend, so one (persistent) RACER drafter may serve
concurrent requests: drafts get worse, the output stays exact.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from racer_rs._native import DraftTree
from racer_rs.errors import StateError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RequestStart:
    """What a drafter learns when a request starts.

    Attributes:
        prompt_ids: the prompt, ``int32[L]``.
        prompt_topk: ``int32[m, needs_topk]``: the target's top-k next-token ids at the prompt
            positions ``prompt_topk_positions`` (row ``j`` predicts the token after
            ``prompt_ids[prompt_topk_positions[j]]``), or ``None`` when the drafter asked for
            none. Only the last occurrence of each distinct token is computed, which is all a
            last-write-wins table (copy-logit, Token Recycling) keeps.
        prompt_topk_positions: ``int64[m]`` ascending prompt positions of the rows of
            ``prompt_topk`` (the last one is ``L - 1``).
        prompt_logits_last: the target's raw logits at the last prompt position, ``[V]``.
        prompt_topk_probs: ``float32[m, needs_topk]`` probabilities of ``prompt_topk`` under the
            request's temperature (1 when greedy), when the drafter sets ``needs_topk_probs``.
        vocab_size: number of rows of the target's LM head (the logits width).
        device: the target's device.
        dtype: the target's parameter dtype.
        temperature: sampling temperature (0 means greedy).
        top_p: nucleus threshold (1.0 disables it).
        top_k: top-k filter (0 disables it).
        max_new_tokens: the request's token budget.
        eos_token_ids: ids that end the request.
        generator: the request's random generator (``None``: torch's global one); drafters
            that sample (e.g. a draft model) should draw from it so that a seeded request
            is reproducible.
        model: the target model itself, for drafters that need more than its outputs.
    """

    prompt_ids: np.ndarray
    prompt_topk: np.ndarray | None
    prompt_logits_last: torch.Tensor
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    eos_token_ids: tuple[int, ...] = ()
    generator: torch.Generator | None = None
    model: Any = None
    prompt_topk_probs: np.ndarray | None = None
    prompt_topk_positions: np.ndarray | None = None

    @property
    def prompt_topk_tokens(self) -> np.ndarray | None:
        """The prompt tokens whose rows ``prompt_topk`` holds (``None`` without top-k)."""
        if self.prompt_topk is None or self.prompt_topk_positions is None:
            return None
        tokens: np.ndarray = self.prompt_ids[self.prompt_topk_positions]
        return tokens


@dataclass
class Proposal:
    """A draft for one verification step.

    Attributes:
        tree: the draft tree; node 0 is the root (the token the target already produced).
        draft_probs: ``[n - 1, V]`` draft distribution of every non-root node of a CHAIN tree
            (row ``i`` is the distribution node ``i + 1`` was sampled from). When set and the
            request samples (temperature > 0), the engine uses standard speculative sampling
            (accept with ``min(1, p / q)``, resample from the residual) instead of the
            one-sample-per-node walk, which assumes deterministic drafts.
    """

    tree: DraftTree
    draft_probs: torch.Tensor | None = None


@dataclass
class StepOutcome:
    """The result of verifying one proposal.

    Attributes:
        tree: the verified tree.
        path: accepted node indices, starting with the root (0).
        bonus: the token the target produced after the accepted path (the next root);
            meaningless when ``finished`` is true.
        committed: ``int32`` tokens committed this step, root included (may be shorter than
            ``path`` when an EOS or the token budget cut the step).
        topk_ids: ``int32[n, needs_topk]`` top-k ids of the target logits of every tree node,
            or ``None`` when the drafter asked for none.
        topk_probs: ``float32[n, needs_topk]`` their probabilities (see ``RequestStart``), when
            the drafter sets ``needs_topk_probs``.
        node_logits: ``[n, V]`` detached target logits of every node, after the request's
            temperature/top-k/top-p processing (filtered entries are ``-inf``); raw logits
            when greedy. ``None`` unless the drafter sets ``needs_logits``.
        position: number of tokens generated before this step.
        finished: true when this step ended the request.
    """

    tree: DraftTree
    path: list[int]
    bonus: int
    committed: np.ndarray
    topk_ids: np.ndarray | None = None
    node_logits: torch.Tensor | None = None
    position: int = 0
    finished: bool = False
    topk_probs: np.ndarray | None = None


class Drafter(ABC):
    """Base class of every drafting method.

    Subclasses set ``name``, optionally ``needs_topk``/``needs_logits``, implement
    :meth:`propose`, and override the other hooks as needed.

    Attributes:
        name: the method name reported in results.
        needs_topk: if > 0, the engine computes that many top-k ids of the target logits at
            every prompt position (``RequestStart.prompt_topk``) and every tree node
            (``StepOutcome.topk_ids``).
        needs_logits: if true, ``StepOutcome.node_logits`` carries the tree's target logits.
        needs_topk_probs: if true, the top-k ids come with their probabilities
            (``RequestStart.prompt_topk_probs``, ``StepOutcome.topk_probs``).
        prompt_topk_optional: if true, the prompt's top-k rows only seed what the tree nodes'
            rows fill anyway (a copy-logit table), so the engine may leave them out
            (``RequestStart.prompt_topk`` is then ``None``) where they do not pay.
        never_drafts: if true, every proposal is the lone root (plain decoding): the engine
            verifies the roots without asking, and no capacity policy runs.
    """

    name: str = "drafter"
    never_drafts: bool = False
    needs_topk: int = 0
    needs_logits: bool = False
    needs_topk_probs: bool = False
    prompt_topk_optional: bool = False

    def begin(self, request: RequestStart) -> None:  # noqa: B027 - optional hook
        """Start a new request."""

    @abstractmethod
    def propose(self, context: np.ndarray, next_token: int, capacity: int) -> Proposal:
        """Draft a tree rooted at ``next_token``.

        Args:
            context: every committed token so far (prompt + generated), ``int32``; read-only.
            next_token: the token the target produced last; not yet in ``context``.
            capacity: the most nodes the tree may have, root included (>= 1).

        A drafter that grows its tree by estimated acceptance probability may also take a
        keyword ``edge_calibration: np.ndarray | None``: with ``capacity="auto"`` the engine
        passes the calibrated acceptance probability of every edge cell
        (``float32[EDGE_CELLS]``, see :mod:`racer_rs.autosize.calibration`), else ``None``.
        The engine passes it only to a ``propose`` whose signature has that parameter.

        Returns:
            The proposal; its tree's root token must be ``next_token``.
        """

    def observe(self, outcome: StepOutcome) -> None:  # noqa: B027 - optional hook
        """Learn from a verified step.

        Not called for a request's last step when that step only commits the root (the
        budget had one token left, or the root is an EOS): no tree is verified then.
        """

    def end(self) -> None:  # noqa: B027 - optional hook
        """The request finished (normally or not)."""

    def stats(self) -> dict[str, Any]:
        """Method-specific statistics, copied into ``GenerationResult.extras``."""
        return {}

    # --- one request at a time (for drafters with per-request state) -------------------------

    def _claim(self) -> None:
        """Mark this drafter as serving a request of the calling thread (call it in ``begin``).

        Raises:
            RuntimeError: a request in another thread holds the drafter (until its ``end``).
        """
        with _CLAIMS:
            owner = self.__dict__.get("_request_thread")
            if owner is not None and owner != threading.get_ident():
                raise StateError(
                    f"drafter {self.name!r} is serving a request in another thread; a "
                    f"{type(self).__name__} serves one request at a time (build one drafter per thread)"
                )
            self.__dict__["_request_thread"] = threading.get_ident()

    def _held_elsewhere(self) -> bool:
        """True while a request in another thread holds this drafter (``end`` must not touch its state)."""
        with _CLAIMS:
            owner = self.__dict__.get("_request_thread")
            return owner is not None and owner != threading.get_ident()

    def _release(self) -> None:
        """End the calling thread's claim (call it at the end of ``end``)."""
        with _CLAIMS:
            if self.__dict__.get("_request_thread") == threading.get_ident():
                del self.__dict__["_request_thread"]


_CLAIMS = threading.Lock()
"""Guards every drafter's ``_request_thread`` (see :meth:`Drafter._claim`)."""
