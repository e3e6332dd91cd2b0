"""``racer_rs.generate``: lossless speculative decoding with tree verification.

:func:`generate` checks the request (:func:`check_request`), runs the decode loop
(:mod:`racer_rs.engine.decode_loop`: draft, verify, accept, commit) and assembles the result
(:func:`assemble_result`). Greedy output equals plain greedy decoding token for token; sampling
keeps the target distribution exactly, and with a seed every deterministic drafter yields the
very same text as plain sampling: methods differ only in speed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from racer_rs import _validate as rules
from racer_rs.drafters import make_drafter
from racer_rs.drafters.base import Drafter
from racer_rs.engine.capacity import AutoCapacity, CapacityPolicy, FixedCapacity
from racer_rs.engine.decode_loop import DecodeLoop, DecodeState
from racer_rs.target.sampling import SamplingConfig
from racer_rs.engine.streaming import StreamAdapter
from racer_rs.target.verifier import TreeVerifier, model_window, vocab_size
from racer_rs.errors import InvalidArgumentError, InvalidTypeError, UnsupportedError


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
            ``accept`` (deciding the accepted path), ``bookkeeping`` (KV compaction,
            drafter updates, streaming) and ``total``.
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
            acceptance probabilities (:mod:`racer_rs.autosize`; at most ``max_capacity``
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
        **method_options: options of the method's drafter (e.g. ``persistent=True``; for the racer
            methods ``index="memory"`` or ``index="file.idx"``: a shared index, learning across calls).

    Returns:
        The generated tokens with per-step acceptance statistics and timings.

    Raises:
        InvalidArgumentError: bad argument values, unknown method or option, empty prompt, or
            a prompt (plus ``max_new_tokens``) longer than the model's window (a ``ValueError``).
        InvalidTypeError: arguments of the wrong type, or a model that is not a causal LM
            (a ``TypeError``).
        UnsupportedError: batch size above 1 (see :func:`racer_rs.generate_batch`), or an
            unsupported model architecture (a ``NotImplementedError``).
    """
    total_start = time.perf_counter()
    request = check_request(
        model,
        input_ids,
        method=method,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        eos_token_id=eos_token_id,
        capacity=capacity,
        max_capacity=max_capacity,
        seed=seed,
        drafter=drafter,
        method_options=method_options,
    )
    drafter = request.drafter
    generator = None
    if request.seed is not None:
        generator = torch.Generator(device=request.verifier.device).manual_seed(request.seed)
    policy: CapacityPolicy
    if request.auto:
        policy = AutoCapacity(model, drafter.name, request.sampling.greedy, request.max_capacity)
    else:
        policy = FixedCapacity(request.capacity)
    adapted = StreamAdapter(streamer, request.prompt) if streamer is not None else None
    loop = DecodeLoop(request.verifier, drafter, request.sampling, policy, request.eos_ids, generator, adapted)
    try:
        state = loop.run(request.prompt, request.max_new_tokens)
    except BaseException as failure:
        _end_request(drafter, adapted, failure)
        raise
    _end_request(drafter, adapted, None)
    return assemble_result(state, drafter, policy, total_start)


@dataclass
class Request:
    """A checked :func:`generate` request.

    Attributes:
        verifier: the target's verifier (the model passed its checks).
        prompt: ``int32[L]`` prompt ids.
        max_new_tokens: the token budget.
        sampling: the sampling settings.
        eos_ids: ids that end the request.
        auto: ``capacity="auto"``.
        capacity: the fixed node limit (``max_capacity`` when ``auto``).
        max_capacity: the largest tree ``auto`` may verify.
        drafter: the drafter to use (built from the method unless given).
        seed: the request's seed (``None``: torch's global RNG).
    """

    verifier: TreeVerifier
    prompt: np.ndarray
    max_new_tokens: int
    sampling: SamplingConfig
    eos_ids: tuple[int, ...]
    auto: bool
    capacity: int
    max_capacity: int
    drafter: Drafter
    seed: int | None = None


def check_request(
    model: PreTrainedModel,
    input_ids: Any,
    *,
    method: str,
    max_new_tokens: Any,
    temperature: Any,
    top_p: Any,
    top_k: Any,
    eos_token_id: Any,
    capacity: Any,
    max_capacity: Any,
    seed: Any,
    drafter: Any,
    method_options: dict[str, Any],
) -> Request:
    """Check every argument of :func:`generate` before any work starts; build the drafter.

    Raises:
        InvalidArgumentError, InvalidTypeError, UnsupportedError: as :func:`generate` documents.
    """
    verifier = TreeVerifier(model)
    vocab = vocab_size(model)
    prompt = prompt_ids("input_ids", input_ids, vocab)
    max_new_tokens = rules.integer("max_new_tokens", max_new_tokens, minimum=1)
    auto = capacity == "auto"
    capacity = rules.capacity("capacity", capacity)
    max_capacity = rules.integer("max_capacity", max_capacity, minimum=1)
    if seed is not None:
        seed = rules.seed("seed", seed)
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
    eos = eos_ids(eos_token_id, vocab)
    window = model_window(model)
    if window is not None and len(prompt) + max_new_tokens > window:
        raise InvalidArgumentError(
            f"input_ids ({len(prompt)} tokens) plus max_new_tokens ({max_new_tokens}) exceed the model's "
            f"window of {window} positions"
        )
    if auto and window is not None and max_capacity >= window:
        # The cost curve is measured with trees of up to max_capacity tokens after a context.
        raise InvalidArgumentError(
            f"max_capacity ({max_capacity}) must be below the model's window of {window} positions"
        )
    if drafter is None:
        drafter = make_drafter(method, model, **method_options)
    elif not isinstance(drafter, Drafter):
        raise InvalidTypeError(f"drafter must be a racer_rs Drafter, got {type(drafter).__name__}")
    elif method_options:
        raise InvalidArgumentError(
            f"method options {sorted(method_options)} cannot be combined with a prebuilt drafter"
        )
    if drafter.needs_topk > vocab:
        raise InvalidArgumentError(
            f"drafter {drafter.name!r} asks for the target's top {drafter.needs_topk} tokens (its breadth), "
            f"more than the model's vocabulary of {vocab}"
        )
    return Request(
        verifier=verifier,
        prompt=prompt,
        max_new_tokens=int(max_new_tokens),
        sampling=sampling,
        eos_ids=eos,
        auto=auto,
        capacity=max_capacity if auto else int(capacity),
        max_capacity=int(max_capacity),
        drafter=drafter,
        seed=seed,
    )


def assemble_result(
    state: DecodeState, drafter: Drafter, policy: CapacityPolicy, total_start: float
) -> GenerationResult:
    """The :class:`GenerationResult` of a finished request (the policy stores what it learned)."""
    state.timings["total"] = time.perf_counter() - total_start
    steps = len(state.accepted_lengths)
    extras = dict(drafter.stats())
    extras["mean_tree_size"] = state.tree_nodes / max(1, steps)
    extras["resampled_nodes"] = state.resampled_nodes
    extras.update(policy.finish(state.length))
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


def _end_request(drafter: Drafter, streamer: StreamAdapter | None, failure: BaseException | None) -> None:
    """Run every end hook (the drafter's, the streamer's). The first error surfaces: the
    request's own when it failed, else the first hook's; a later hook's never replaces it."""
    first = failure
    for hook in (drafter.end, streamer.end if streamer is not None else None):
        if hook is None:
            continue
        try:
            hook()
        except Exception as error:
            if first is None:
                first = error
    if first is not None and first is not failure:
        raise first


def prompt_ids(name: str, value: Any, vocab: int) -> np.ndarray:
    """One prompt as ``int32[L]``: a list of ints, or a ``[L]`` / ``[1, L]`` integer array/tensor."""
    array = rules.token_ids(name, value, vocab, rows=True)
    if array.ndim == 2:
        if array.shape[0] != 1:
            raise UnsupportedError(
                f"{name}: batch size {array.shape[0]} is not supported by generate; use generate_batch"
            )
        array = array[0]
    if array.size == 0:
        raise InvalidArgumentError(f"{name} is empty: at least one prompt token is required")
    return array


def eos_ids(eos_token_id: Any, vocab: int) -> tuple[int, ...]:
    """The ids that end a request: ``None``, one id, or a list of ids, each in ``[0, vocab)``."""
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, (list, tuple)):
        return tuple(int(t) for t in rules.token_ids("eos_token_id", list(eos_token_id), vocab))
    if not rules.is_int(eos_token_id):
        raise InvalidTypeError("eos_token_id must be None, an int, or a list of ints")
    return (rules.token_id("eos_token_id", eos_token_id, vocab),)
