"""``racer_rs.generate``: lossless speculative decoding with tree verification.

Every step of the decode loop runs the same named phases over a :class:`DecodeState`:

1. ``draft``: the drafter proposes a tree rooted at the last token the target produced;
2. ``verify``: one target forward over the tree, then one prediction per node (argmax, or
   one sample from the processed distribution) and one small device-to-host transfer;
3. ``accept``: walk the tree along the predictions (:meth:`DraftTree.greedy_accept`), or run
   chain speculative sampling when the drafter supplied draft probabilities;
4. ``commit``: cut at EOS / the token budget, compact the KV cache, append to the context,
   stream, and let the drafter observe the outcome.

Greedy output equals plain greedy decoding token for token; sampling keeps the target
distribution exactly, because a node's child is followed only when it equals the node's own
sample from the target distribution. Samples are keyed by generation position (one row of
uniforms per position, shared by the nodes of a depth), so with a seed every deterministic
drafter yields the very same text as plain sampling: methods differ only in speed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from racer_rs._native import DraftTree
from racer_rs.drafters import make_drafter
from racer_rs.drafters.base import Drafter, Proposal, RequestStart, StepOutcome
from racer_rs.engine.sampling import (
    SamplingConfig,
    chain_speculative_sample,
    draw_uniforms,
    process_logits,
    sample_nodes,
    sample_position,
)
from racer_rs.autosize.sizer import TreeSizer, subtree
from racer_rs.engine.verifier import TreeVerifier, model_window, topk_with_probs
from racer_rs.errors import InvalidArgumentError, InvalidTypeError, UnsupportedError

TIMING_KEYS = ("prefill", "draft", "verify", "forward", "bookkeeping", "total")


@dataclass
class GenerationResult:
    """The outcome of one :func:`generate` call.

    Attributes:
        tokens: the new tokens only.
        accepted_lengths: tokens committed per step, the target's own token included
            (plain decoding gives all ones); they sum to ``len(tokens)``.
        mat: mean accepted tokens per step (mean of ``accepted_lengths``).
        steps: number of steps.
        timings: seconds spent in ``prefill`` (prompt forward and drafter setup), ``draft``,
            ``verify`` (target forward, predictions and the device-to-host transfer),
            ``forward`` (the target's forward calls alone, a part of ``verify``),
            ``bookkeeping`` (acceptance, KV compaction, drafter updates, streaming) and
            ``total``.
        positions: number of generated tokens at the start of each step.
        method: the drafting method's name.
        extras: method-specific statistics (the drafter's ``stats()`` plus the engine's
            ``mean_tree_size`` and ``resampled_nodes``).
    """

    tokens: list[int]
    accepted_lengths: list[int]
    mat: float
    steps: int
    timings: dict[str, float]
    positions: list[int]
    method: str
    extras: dict[str, Any] = field(default_factory=dict)


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
            (sampling only; see :func:`racer_rs.engine.sampling.draw_uniforms`).
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

    @property
    def generated(self) -> int:
        """Number of tokens generated so far."""
        return self.length - self.prompt_length


@dataclass
class Verification:
    """What verifying one proposal yields (host-side, after the single transfer).

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


class _Streamer:
    """Adapts a user streamer: ``put(tokens, drafted)`` objects or HF ``BaseStreamer``s."""

    def __init__(self, streamer: Any, prompt_ids: np.ndarray) -> None:
        if not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
            raise InvalidTypeError("streamer must have put() and end() methods")
        self._target = streamer
        self._hf = _is_hf_streamer(streamer)
        if self._hf:
            # HF streamers expect the prompt first (TextStreamer(skip_prompt=True) drops it).
            streamer.put(torch.from_numpy(prompt_ids.astype(np.int64)).unsqueeze(0))

    def put(self, committed: np.ndarray) -> None:
        """Stream one step's tokens; the first is the target's own, the rest were drafted."""
        if self._hf:
            self._target.put(torch.from_numpy(committed.astype(np.int64)))
            return
        drafted = [True] * len(committed)
        drafted[0] = False
        self._target.put(committed.tolist(), drafted)

    def end(self) -> None:
        self._target.end()


def _is_hf_streamer(streamer: Any) -> bool:
    try:
        from transformers.generation.streamers import BaseStreamer
    except ImportError:  # pragma: no cover - very old transformers
        return False
    return isinstance(streamer, BaseStreamer)


class DecodeLoop:
    """Runs one request: prefill, then draft / verify / accept / commit until done.

    Args:
        verifier: the target wrapper that owns the KV cache.
        drafter: the drafting method.
        sampling: the request's sampling settings.
        capacity: the most tree nodes per step, root included.
        eos_token_ids: ids that end the request.
        generator: random generator for sampling (``None``: torch's global one).
        streamer: optional adapted streamer.
        sizer: with ``capacity="auto"``, chooses each step's tree size (``capacity`` is then
            its upper bound).
    """

    def __init__(
        self,
        verifier: TreeVerifier,
        drafter: Drafter,
        sampling: SamplingConfig,
        capacity: int,
        eos_token_ids: tuple[int, ...],
        generator: torch.Generator | None,
        streamer: _Streamer | None,
        sizer: TreeSizer | None = None,
    ) -> None:
        self.verifier = verifier
        self.drafter = drafter
        self.sampling = sampling
        self.capacity = capacity
        self.eos = np.asarray(eos_token_ids, dtype=np.int32)
        self.generator = generator
        self.streamer = streamer
        self.sizer = sizer

    def prefill(self, prompt: np.ndarray, max_new_tokens: int) -> DecodeState:
        """Run the prompt, pick the first token and start the drafter's request."""
        start = time.perf_counter()
        probs_temperature = self.sampling.temperature if self.drafter.needs_topk_probs else None
        output = self.verifier.prefill(prompt, topk=self.drafter.needs_topk, probs_temperature=probs_temperature)
        uniforms = None
        if self.sampling.greedy:
            first = int(output.last_logits.argmax())
        else:
            # One extra row: a step's deepest node may predict one token past the budget.
            uniforms = draw_uniforms(max_new_tokens + 1, self.generator, self.verifier.device)
            first = sample_position(output.last_logits, self.sampling, uniforms[0], self.generator)
        context = np.zeros(len(prompt) + max_new_tokens, dtype=np.int32)
        context[: len(prompt)] = prompt
        state = DecodeState(
            context=context,
            prompt_length=len(prompt),
            length=len(prompt),
            next_token=first,
            max_new_tokens=max_new_tokens,
            uniforms=uniforms,
        )
        self.drafter.begin(
            RequestStart(
                prompt_ids=context[: len(prompt)].copy(),
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
        if self.sizer is not None:
            self.drafter.edge_calibration = self.sizer.edge_probabilities()
        proposal = self.draft(state, min(self.capacity, remaining))
        full, choice = proposal.tree, None
        if self.sizer is not None:
            choice = self.sizer.choose(full, state.length)
            proposal = _cut(proposal, choice.keep)
        drafted = time.perf_counter()
        forward_before = state.timings["forward"]
        verification = self.verify(state, proposal)
        verified = time.perf_counter()
        self.commit(state, proposal.tree, verification)
        finished = time.perf_counter()
        state.timings["draft"] += drafted - started
        state.timings["verify"] += verified - drafted
        state.timings["bookkeeping"] += finished - verified
        if self.sizer is not None and choice is not None:
            self.sizer.observe(
                full,
                choice,
                verification.path,
                verification.bonus,
                randomized=proposal.draft_probs is not None and not self.sampling.greedy,
                context=state.length - state.accepted_lengths[-1],
                forward=state.timings["forward"] - forward_before,
                step=finished - started,
                committed=state.accepted_lengths[-1],
            )

    def draft(self, state: DecodeState, capacity: int) -> Proposal:
        """Ask the drafter for a tree rooted at ``state.next_token``."""
        context = state.context[: state.length]
        context.flags.writeable = False  # a view of the engine's buffer; drafters only read it
        proposal = self.drafter.propose(context, state.next_token, capacity)
        if not isinstance(proposal, Proposal) or not isinstance(proposal.tree, DraftTree):
            raise InvalidTypeError(f"drafter {self.drafter.name!r} must return a Proposal holding a DraftTree")
        size = len(proposal.tree)
        if size > capacity:
            raise InvalidArgumentError(f"drafter {self.drafter.name!r} proposed {size} nodes for a capacity of {capacity}")
        if proposal.draft_probs is not None and (
            proposal.tree.max_depth != size - 1 or tuple(proposal.draft_probs.shape[:1]) != (size - 1,)
        ):
            raise InvalidArgumentError(
                f"drafter {self.drafter.name!r}: draft_probs needs a chain tree and one row per drafted node"
            )
        return proposal

    def verify(self, state: DecodeState, proposal: Proposal) -> Verification:
        """Score the tree with the target and decide which nodes are accepted.

        All per-node results leave the device in one transfer: the predictions (argmax or
        one sample per node, with validity flags) or the chain decision, plus top-k ids.
        """
        tree = proposal.tree
        tokens, depths = tree.tokens, tree.depths
        n = len(tokens)
        if int(tokens[0]) != state.next_token:
            raise InvalidArgumentError(f"drafter {self.drafter.name!r} returned a tree whose root is not next_token")
        state.tree_nodes += n
        model_seconds = self.verifier.model_seconds
        logits = self.verifier.forward_tree(tokens, depths, tree.attention_mask() if n > 1 else None)
        state.timings["forward"] += self.verifier.model_seconds - model_seconds

        chain = proposal.draft_probs is not None and not self.sampling.greedy and n > 1
        valid: torch.Tensor | None = None
        if chain:
            assert proposal.draft_probs is not None
            drafts = torch.from_numpy(tokens[1:].astype(np.int64)).to(logits.device)
            decision = chain_speculative_sample(logits, proposal.draft_probs, drafts, self.sampling, self.generator)
            parts = [decision]
        elif self.sampling.greedy:
            parts = [logits.argmax(dim=-1)]
        else:
            assert state.uniforms is not None
            # Node at depth d predicts generation position generated + d + 1 (see draw_uniforms).
            rows = torch.from_numpy(depths.astype(np.int64) + state.generated + 1).to(state.uniforms.device)
            predicted, valid = sample_nodes(logits, self.sampling, state.uniforms[rows, 0])
            parts = [predicted] if valid is None else [predicted, valid.long()]
        k = self.drafter.needs_topk
        with_probs = k > 0 and self.drafter.needs_topk_probs
        if with_probs:
            ids, probs = topk_with_probs(logits, k, self.sampling.temperature)
            # float64 holds every token id exactly, so ids and probs share the one transfer.
            parts = [p.double() for p in parts] + [ids.reshape(-1).double(), probs.reshape(-1).double()]
        elif k > 0:
            parts.append(torch.topk(logits, k, dim=-1).indices.reshape(-1))
        host = torch.cat(parts).cpu().numpy()  # the step's single device-to-host transfer
        topk_probs = None
        if with_probs:
            topk_probs = host[-n * k :].reshape(n, k).astype(np.float32)
            host = host[: -n * k].astype(np.int64)

        if chain:
            accepted, bonus = int(host[0]), int(host[1])
            path, offset = list(range(accepted + 1)), 2
        else:
            predicted_host = host[:n]
            valid_host = host[n : 2 * n].astype(bool) if valid is not None else None
            offset = n if valid is None else 2 * n
            path, bonus = self._walk(state, tree, logits, predicted_host, valid_host)
        topk_ids = host[offset:].reshape(n, k).astype(np.int32) if k > 0 else None
        node_logits = process_logits(logits, self.sampling).detach() if self.drafter.needs_logits else None
        return Verification(path, bonus, topk_ids, node_logits, topk_probs)

    def _walk(
        self,
        state: DecodeState,
        tree: DraftTree,
        logits: torch.Tensor,
        predicted: np.ndarray,
        valid: np.ndarray | None,
    ) -> tuple[list[int], int]:
        """Follow the predictions down the tree; redraw visited samples that were invalid."""
        path, bonus = tree.greedy_accept(predicted)
        if valid is None:
            return path, bonus
        while True:
            invalid = np.flatnonzero(~valid[path])
            if invalid.size == 0:
                return path, bonus
            assert state.uniforms is not None
            node = path[int(invalid[0])]
            position = state.generated + int(invalid[0]) + 1  # path index = depth
            predicted[node] = sample_position(logits[node], self.sampling, state.uniforms[position], self.generator)
            valid[node] = True
            state.resampled_nodes += 1
            path, bonus = tree.greedy_accept(predicted)

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


def generate(
    model: PreTrainedModel,
    input_ids: Sequence[int] | np.ndarray | torch.Tensor,
    *,
    method: str = "racer",
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    capacity: int | str = 64,
    max_capacity: int = 64,
    seed: int | None = None,
    streamer: Any = None,
    drafter: Drafter | None = None,
    **method_options: Any,
) -> GenerationResult:
    """Generate with lossless speculative decoding.

    Args:
        model: a transformers causal LM (decoder-only, full-attention cache).
        input_ids: the prompt: a list of ints, or a ``[L]`` / ``[1, L]`` integer tensor/array.
        method: the drafting method (see :func:`racer_rs.drafters.available_methods`).
        max_new_tokens: exact number of new tokens unless an EOS comes first.
        temperature: 0 for greedy decoding, else the sampling temperature.
        top_p: nucleus filter in (0, 1].
        top_k: top-k filter (0 disables it).
        eos_token_id: one id or a list of ids that end generation (the EOS is kept).
        capacity: the most draft-tree nodes per step, root included; or ``"auto"``: every
            step verifies the tree prefix with the most expected tokens per second, from the
            target's measured forward cost on its device and the drafted nodes' calibrated
            acceptance probabilities (:mod:`racer_rs.autosize.sizer`; at most ``max_capacity``
            nodes). Its per-request statistics are in ``extras["auto_capacity"]``; the first
            request for a model, device, dtype and thread count also measures the cost curve
            (a few seconds, ``setup_s`` there; cached on disk afterwards).
        max_capacity: the largest tree ``capacity="auto"`` may verify.
        seed: seeds a private random generator (``None``: torch's global RNG); for a seed,
            every method without draft probabilities samples the same text.
        streamer: receives committed tokens: ``put(tokens, drafted)`` + ``end()``, or an HF
            ``BaseStreamer`` (``put(tensor)``).
        drafter: a prebuilt drafter to use instead of ``method`` (reuse it across calls with
            its persistent mode to keep its state between requests).
        **method_options: options of the method's drafter (e.g. ``persistent=True``).

    Returns:
        The generated tokens with per-step acceptance statistics and timings.

    Raises:
        ValueError: bad argument values, unknown method or option, empty prompt, or a prompt
            (plus ``max_new_tokens``) longer than the model's window.
        TypeError: arguments of the wrong type, or a model that is not a causal LM.
        NotImplementedError: batch size above 1, or an unsupported model architecture.
    """
    total_start = time.perf_counter()
    verifier = TreeVerifier(model)
    prompt = _prompt_array(input_ids)
    _check_int("max_new_tokens", max_new_tokens, minimum=1)
    auto = capacity == "auto"
    if not auto:
        if isinstance(capacity, str):
            raise InvalidArgumentError(f"capacity must be an int >= 1 or 'auto', got {capacity!r}")
        _check_int("capacity", capacity, minimum=1)
    _check_int("max_capacity", max_capacity, minimum=1)
    if seed is not None:
        _check_int("seed", seed, minimum=0)
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
    eos_ids = _eos_ids(eos_token_id)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if int(prompt.max()) >= vocab or int(prompt.min()) < 0:
        raise InvalidArgumentError(f"input_ids must be token ids in [0, {vocab})")
    window = model_window(model)
    if window is not None and len(prompt) + max_new_tokens > window:
        raise InvalidArgumentError(
            f"input_ids ({len(prompt)} tokens) plus max_new_tokens ({max_new_tokens}) exceed the model's "
            f"window of {window} positions"
        )
    if auto and window is not None and max_capacity >= window:
        # The cost curve is measured with trees of up to max_capacity tokens after a context.
        raise InvalidArgumentError(f"max_capacity ({max_capacity}) must be below the model's window of {window} positions")
    if drafter is None:
        drafter = make_drafter(method, model, **method_options)
    elif not isinstance(drafter, Drafter):
        raise InvalidTypeError(f"drafter must be a racer_rs Drafter, got {type(drafter).__name__}")
    elif method_options:
        raise InvalidArgumentError(f"method options {sorted(method_options)} cannot be combined with a prebuilt drafter")

    generator = None
    if seed is not None:
        generator = torch.Generator(device=verifier.device).manual_seed(seed)
    sizer, calibration_key, setup_seconds = None, "", 0.0
    if auto:
        setup_start = time.perf_counter()
        sizer, calibration_key = _auto_sizer(model, drafter.name, sampling.greedy, max_capacity)
        setup_seconds = time.perf_counter() - setup_start
    drafter.edge_calibration = None
    adapted = _Streamer(streamer, prompt) if streamer is not None else None
    limit = max_capacity if auto else int(capacity)
    loop = DecodeLoop(verifier, drafter, sampling, limit, eos_ids, generator, adapted, sizer)
    try:
        state = loop.run(prompt, max_new_tokens)
    finally:
        drafter.end()
        drafter.edge_calibration = None
        if adapted is not None:
            adapted.end()
    state.timings["total"] = time.perf_counter() - total_start
    steps = len(state.accepted_lengths)
    extras = dict(drafter.stats())
    extras["mean_tree_size"] = state.tree_nodes / max(1, steps)
    extras["resampled_nodes"] = state.resampled_nodes
    if sizer is not None:
        from racer_rs.autosize import sizer as tree_size

        tree_size.save_calibration(calibration_key, sizer.calibration)
        tree_size.save_cost_model(model, sizer.cost)
        # setup_s: the cost curve's measurement on first use (part of timings["total"]).
        extras["auto_capacity"] = sizer.report(state.length) | {"setup_s": setup_seconds}
    return GenerationResult(
        tokens=state.context[state.prompt_length : state.length].tolist(),
        accepted_lengths=state.accepted_lengths,
        mat=float(np.mean(state.accepted_lengths)) if steps else 0.0,
        steps=steps,
        timings=dict(state.timings),
        positions=state.positions,
        method=drafter.name,
        extras=extras,
    )


def _auto_sizer(model: PreTrainedModel, method: str, greedy: bool, max_capacity: int) -> tuple[TreeSizer, str]:
    """The request's tree sizer: the model's cost model and a warm-started calibration."""
    from racer_rs.autosize import sizer as tree_size

    key = tree_size.calibration_key(model, method, greedy)
    cost = tree_size.cost_model(model, max_capacity)
    return TreeSizer(cost, tree_size.load_calibration(key), max_capacity), key


def _cut(proposal: Proposal, keep: np.ndarray) -> Proposal:
    """The proposal restricted to the nodes ``keep`` (a connected prefix of the tree)."""
    if len(keep) == len(proposal.tree):
        return proposal
    probs = proposal.draft_probs
    # A chain's best-first prefix is its first nodes, so its draft probabilities stay aligned.
    return Proposal(subtree(proposal.tree, keep), None if probs is None else probs[: len(keep) - 1])


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")


def _prompt_array(input_ids: Any) -> np.ndarray:
    """The prompt as ``int32[L]``; validates shape, type and batch size."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise InvalidTypeError(f"input_ids must hold integers, got dtype {input_ids.dtype}")
        array = input_ids.detach().cpu().numpy()
    elif isinstance(input_ids, np.ndarray):
        if not np.issubdtype(input_ids.dtype, np.integer):
            raise InvalidTypeError(f"input_ids must hold integers, got dtype {input_ids.dtype}")
        array = input_ids
    elif isinstance(input_ids, (list, tuple)):
        if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in input_ids):
            raise InvalidTypeError("input_ids must be a list of ints")
        array = np.asarray(input_ids, dtype=np.int64).reshape(-1)
    else:
        raise InvalidTypeError(f"input_ids must be a list of ints or an integer tensor, got {type(input_ids).__name__}")
    if array.ndim == 2:
        if array.shape[0] != 1:
            raise UnsupportedError(f"input_ids: batch size {array.shape[0]} is not supported; only batch size 1")
        array = array[0]
    elif array.ndim != 1:
        raise InvalidArgumentError(f"input_ids must have shape [L] or [1, L], got {list(array.shape)}")
    if array.size == 0:
        raise InvalidArgumentError("input_ids is empty: at least one prompt token is required")
    return array.astype(np.int32)


def _eos_ids(eos_token_id: Any) -> tuple[int, ...]:
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, (int, np.integer)) and not isinstance(eos_token_id, bool):
        return (int(eos_token_id),)
    if isinstance(eos_token_id, (list, tuple)) and all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in eos_token_id
    ):
        return tuple(int(t) for t in eos_token_id)
    raise InvalidTypeError("eos_token_id must be None, an int, or a list of ints")
