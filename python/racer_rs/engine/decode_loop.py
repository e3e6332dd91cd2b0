"""The decode loop: one request, step by step, in four named phases over a :class:`DecodeState`.

1. ``draft``: the drafter proposes a tree rooted at the last token the target produced, and the
   capacity policy may cut it (``capacity="auto"``);
2. ``verify``: one target forward over the tree, the acceptor's device-side predictions, and the
   step's single device-to-host copy (:class:`racer_rs.engine.transfer.HostTransfer`);
3. ``accept``: the acceptor decides which nodes are committed (:mod:`racer_rs.engine.acceptance`);
4. ``commit``: cut at EOS / the token budget, compact the KV cache, append to the context,
   stream, and let the drafter and the capacity policy observe the outcome.

Greedy output equals plain greedy decoding token for token; sampling keeps the target
distribution exactly (see :mod:`racer_rs.engine.acceptance`).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from racer_rs._native import DraftTree
from racer_rs.drafters.base import Drafter, Proposal, RequestStart, StepOutcome
from racer_rs.engine.acceptance import (
    Acceptance,
    Acceptor,
    ChainSpeculativeSampling,
    GreedyWalk,
    SamplingWalk,
    StepInputs,
)
from racer_rs.engine.capacity import CapacityPolicy, StepReport
from racer_rs.target.sampling import SamplingConfig, draw_uniforms, process_logits, sample_position
from racer_rs.engine.streaming import StreamAdapter
from racer_rs.engine.transfer import HostTransfer
from racer_rs.target.verifier import TreeVerifier, topk_with_probs
from racer_rs.errors import InvalidArgumentError, InvalidTypeError

TIMING_KEYS = ("prefill", "draft", "verify", "forward", "accept", "bookkeeping", "total")


@dataclass
class DecodeState:
    """Mutable state of one request's decode loop.

    Attributes:
        context: ``int32`` buffer holding the prompt then the generated tokens.
        prompt_length: number of prompt tokens at the start of ``context``.
        length: number of committed tokens in ``context``.
        next_token: the token the target produced last (the next tree's root); not yet
            committed and not yet in the KV cache.
        max_new_tokens: the token budget.
        accepted_lengths: tokens committed per step.
        positions: generated count at the start of each step.
        finished: true once EOS or the budget ended the request.
        timings: accumulated seconds per phase (see :class:`GenerationResult`).
        tree_nodes: total number of verified tree nodes.
        resampled_nodes: nodes whose fast sample had to be redrawn exactly.
        uniforms: ``[max_new_tokens + 1, CANDIDATES]`` uniforms keyed by generation position
            (sampling only; see :func:`racer_rs.target.sampling.draw_uniforms`).
    """

    context: np.ndarray
    prompt_length: int
    length: int
    next_token: int
    max_new_tokens: int
    accepted_lengths: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    finished: bool = False
    timings: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIMING_KEYS, 0.0))
    tree_nodes: int = 0
    resampled_nodes: int = 0
    uniforms: torch.Tensor | None = None

    @classmethod
    def after_prefill(
        cls,
        prompt: np.ndarray,
        max_new_tokens: int,
        last_logits: torch.Tensor,
        sampling: SamplingConfig,
        uniforms: torch.Tensor | None,
        generator: torch.Generator | None,
    ) -> DecodeState:
        """A request's state once its prompt is prefilled: the first token is the prefill's
        argmax (greedy: ``uniforms`` is None) or its sample with ``uniforms[0]``."""
        if uniforms is None:
            first = int(last_logits.argmax())
        else:
            first = sample_position(last_logits, sampling, uniforms[0], generator)
        context = np.zeros(len(prompt) + max_new_tokens, dtype=np.int32)
        context[: len(prompt)] = prompt
        return cls(
            context=context,
            prompt_length=len(prompt),
            length=len(prompt),
            next_token=first,
            max_new_tokens=max_new_tokens,
            uniforms=uniforms,
        )

    @property
    def generated(self) -> int:
        """Number of tokens generated so far."""
        return self.length - self.prompt_length


@dataclass
class Verified:
    """The verify phase's output: the acceptor's inputs and what the step copied to the host.

    Attributes:
        step: the acceptor's view of the step (proposal, logits, position, uniforms).
        acceptor: the acceptor that queued the predictions.
        host: the step's host-side results by name.
        node_logits: processed logits of every node, when the drafter asked for them.
    """

    step: StepInputs
    acceptor: Acceptor
    host: dict[str, np.ndarray]
    node_logits: torch.Tensor | None


@dataclass
class Verification:
    """The accept phase's output: what the step commits and what the drafter learns.

    Attributes:
        path: accepted node indices, root first.
        bonus: the target's token after the accepted path.
        topk_ids: ``int32[n, k]`` top-k ids of every node's logits, or ``None``.
        node_logits: processed logits of every node if the drafter asked for them.
        topk_probs: ``float32[n, k]`` probabilities of ``topk_ids`` if the drafter asked.
    """

    path: list[int]
    bonus: int
    topk_ids: np.ndarray | None
    node_logits: torch.Tensor | None
    topk_probs: np.ndarray | None = None


def check_proposal(name: str, proposal: Any, capacity: int, next_token: int) -> Proposal:
    """``proposal`` if drafter ``name`` kept the rules: a :class:`Proposal` holding a
    :class:`DraftTree` of at most ``capacity`` nodes rooted at ``next_token`` (a chain with one
    ``draft_probs`` row per drafted node, if it has them).

    Raises:
        InvalidTypeError, InvalidArgumentError: a rule broken (the message names the drafter).
    """
    if not isinstance(proposal, Proposal) or not isinstance(proposal.tree, DraftTree):
        raise InvalidTypeError(f"drafter {name!r} must return a Proposal holding a DraftTree")
    size = len(proposal.tree)
    if size > capacity:
        raise InvalidArgumentError(f"drafter {name!r} proposed {size} nodes for a capacity of {capacity}")
    if int(proposal.tree.tokens[0]) != next_token:
        raise InvalidArgumentError(f"drafter {name!r} returned a tree whose root is not next_token")
    if proposal.draft_probs is not None and (
        proposal.tree.max_depth != size - 1 or tuple(proposal.draft_probs.shape[:1]) != (size - 1,)
    ):
        raise InvalidArgumentError(f"drafter {name!r}: draft_probs needs a chain tree and one row per drafted node")
    return proposal


class DecodeLoop:
    """Runs one request: prefill, then draft / verify / accept / commit until done.

    Args:
        verifier: the target wrapper that owns the KV cache.
        drafter: the drafting method.
        sampling: the request's sampling settings.
        policy: the capacity policy (a fixed node limit, or ``capacity="auto"``).
        eos_token_ids: ids that end the request.
        generator: random generator for sampling (``None``: torch's global one).
        streamer: optional adapted streamer.
    """

    def __init__(
        self,
        verifier: TreeVerifier,
        drafter: Drafter,
        sampling: SamplingConfig,
        policy: CapacityPolicy,
        eos_token_ids: tuple[int, ...],
        generator: torch.Generator | None,
        streamer: StreamAdapter | None,
    ) -> None:
        self.verifier = verifier
        self.drafter = drafter
        self.sampling = sampling
        self.policy = policy
        self.eos = np.asarray(eos_token_ids, dtype=np.int32)
        self.generator = generator
        self.streamer = streamer
        # One acceptor per request; chain speculative sampling serves the proposals that carry
        # draft probabilities (a draft model's chains) when the request samples.
        self.walk: Acceptor = GreedyWalk(sampling) if sampling.greedy else SamplingWalk(sampling)
        self.chain: Acceptor | None = None if sampling.greedy else ChainSpeculativeSampling(sampling)
        self._takes_calibration = "edge_calibration" in inspect.signature(drafter.propose).parameters

    def prefill(self, prompt: np.ndarray, max_new_tokens: int) -> DecodeState:
        """Run the prompt, pick the first token and start the drafter's request."""
        start = time.perf_counter()
        probs_temperature = self.sampling.temperature if self.drafter.needs_topk_probs else None
        output = self.verifier.prefill(prompt, topk=self.drafter.needs_topk, probs_temperature=probs_temperature)
        uniforms = None
        if not self.sampling.greedy:
            # One extra row: a step's deepest node may predict one token past the budget.
            uniforms = draw_uniforms(max_new_tokens + 1, self.generator, self.verifier.device)
        state = DecodeState.after_prefill(
            prompt, max_new_tokens, output.last_logits, self.sampling, uniforms, self.generator
        )
        self.drafter.begin(
            RequestStart(
                prompt_ids=state.context[: len(prompt)].copy(),
                prompt_topk=output.prompt_topk,
                prompt_logits_last=output.last_logits.detach(),
                vocab_size=int(output.last_logits.shape[-1]),
                device=self.verifier.device,
                dtype=self.verifier.dtype,
                temperature=self.sampling.temperature,
                top_p=self.sampling.top_p,
                top_k=self.sampling.top_k,
                max_new_tokens=max_new_tokens,
                eos_token_ids=tuple(int(t) for t in self.eos),
                generator=self.generator,
                model=self.verifier.model,
                prompt_topk_probs=output.prompt_topk_probs,
                prompt_topk_positions=output.prompt_topk_positions,
            )
        )
        state.timings["prefill"] += time.perf_counter() - start
        return state

    def step(self, state: DecodeState) -> None:
        """One decode step: draft, verify, accept and commit."""
        state.positions.append(state.generated)
        remaining = state.max_new_tokens - state.generated
        if remaining == 1 or state.next_token in self.eos:
            # The root is the last token: committing it needs no forward pass.
            started = time.perf_counter()
            self._append(state, np.asarray([state.next_token], dtype=np.int32), finished=True)
            state.timings["bookkeeping"] += time.perf_counter() - started
            return
        started = time.perf_counter()
        full = self.draft(state, min(self.policy.limit, remaining))
        proposal, choice = self.policy.cut(full, state.length)
        drafted = time.perf_counter()
        forward_before = state.timings["forward"]
        verified = self.verify(state, proposal)
        verified_at = time.perf_counter()
        verification = self.accept(state, verified)
        accepted_at = time.perf_counter()
        self.commit(state, proposal.tree, verification)
        finished = time.perf_counter()
        state.timings["draft"] += drafted - started
        state.timings["verify"] += verified_at - drafted
        state.timings["accept"] += accepted_at - verified_at
        state.timings["bookkeeping"] += finished - accepted_at
        self.policy.observe(
            StepReport(
                full=full,
                verified=proposal,
                choice=choice,
                path=verification.path,
                bonus=verification.bonus,
                randomized=proposal.draft_probs is not None and not self.sampling.greedy,
                context=state.length - state.accepted_lengths[-1],
                forward=state.timings["forward"] - forward_before,
                step=finished - started,
                committed=state.accepted_lengths[-1],
            )
        )

    def draft(self, state: DecodeState, capacity: int) -> Proposal:
        """Ask the drafter for a tree rooted at ``state.next_token`` and check what it returns."""
        context = state.context[: state.length]
        context.flags.writeable = False  # a view of the engine's buffer; drafters only read it
        if self._takes_calibration:
            calibration = self.policy.edge_calibration()
            propose: Any = self.drafter.propose  # its signature takes the optional calibration
            proposal = propose(context, state.next_token, capacity, edge_calibration=calibration)
        else:
            proposal = self.drafter.propose(context, state.next_token, capacity)
        return check_proposal(self.drafter.name, proposal, capacity, state.next_token)

    def verify(self, state: DecodeState, proposal: Proposal) -> Verified:
        """Score the tree with the target; queue the acceptor's predictions and the drafter's
        top-k, and copy them to the host in the step's one transfer."""
        tree = proposal.tree
        n = len(tree)
        state.tree_nodes += n
        model_seconds = self.verifier.model_seconds
        logits = self.verifier.forward_tree(tree.tokens, tree.depths, tree.attention_mask() if n > 1 else None)
        state.timings["forward"] += self.verifier.model_seconds - model_seconds

        step = StepInputs(proposal, logits, state.generated, state.uniforms, self.generator)
        acceptor = self.chain if self.chain is not None and proposal.draft_probs is not None and n > 1 else self.walk
        transfer = HostTransfer()
        acceptor.predict(step, transfer)
        k = self.drafter.needs_topk
        if k > 0 and self.drafter.needs_topk_probs:
            ids, probs = topk_with_probs(logits, k, self.sampling.temperature)
            transfer.add("topk_ids", ids)
            transfer.add("topk_probs", probs)
        elif k > 0:
            transfer.add("topk_ids", torch.topk(logits, k, dim=-1).indices)
        host = transfer.fetch()
        node_logits = process_logits(logits, self.sampling).detach() if self.drafter.needs_logits else None
        return Verified(step, acceptor, host, node_logits)

    def accept(self, state: DecodeState, verified: Verified) -> Verification:
        """Decide the accepted path and the bonus token."""
        acceptance: Acceptance = verified.acceptor.accept(verified.step, verified.host)
        state.resampled_nodes += acceptance.resampled
        host = verified.host
        topk_ids = host["topk_ids"].astype(np.int32) if "topk_ids" in host else None
        topk_probs = host["topk_probs"].astype(np.float32) if "topk_probs" in host else None
        return Verification(acceptance.path, acceptance.bonus, topk_ids, verified.node_logits, topk_probs)

    def commit(self, state: DecodeState, tree: DraftTree, verification: Verification) -> None:
        """Cut at EOS / the budget, compact the KV cache, append, stream and inform the drafter."""
        path = np.asarray(verification.path, dtype=np.int64)
        committed = tree.tokens[path][: state.max_new_tokens - state.generated]
        finished = state.generated + len(committed) >= state.max_new_tokens
        if self.eos.size:
            hits = np.flatnonzero(np.isin(committed, self.eos))
            if hits.size:
                committed = committed[: int(hits[0]) + 1]
                finished = True
        if not finished:
            self.verifier.commit(path)
        position = state.generated
        self._append(state, committed, finished)
        state.next_token = verification.bonus
        self.drafter.observe(
            StepOutcome(
                tree=tree,
                path=verification.path,
                bonus=verification.bonus,
                committed=committed,
                topk_ids=verification.topk_ids,
                topk_probs=verification.topk_probs,
                node_logits=verification.node_logits,
                position=position,
                finished=finished,
            )
        )

    def _append(self, state: DecodeState, committed: np.ndarray, finished: bool) -> None:
        count = len(committed)
        state.context[state.length : state.length + count] = committed
        state.length += count
        state.accepted_lengths.append(count)
        state.finished = finished
        if self.streamer is not None:
            self.streamer.put(committed)

    def run(self, prompt: np.ndarray, max_new_tokens: int) -> DecodeState:
        """Decode one request to completion."""
        state = self.prefill(prompt, max_new_tokens)
        while not state.finished:
            self.step(state)
        return state
