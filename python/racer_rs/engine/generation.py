"""``racer_rs.generate`` and ``racer_rs.generate_batch``: one decode engine for every batch size.

Both entry points check their keywords once into one :class:`CallSettings` and one
:class:`~racer_rs.engine.decode_engine.Request` per prompt, then run the same
:class:`~racer_rs.engine.decode_engine.DecodeEngine`: ``generate`` with one row, ``generate_batch``
with up to ``max_batch_size`` rows live at once (requests join as others leave). Greedy output
equals plain greedy decoding token for token; sampling keeps the target distribution exactly, and
with a seed every deterministic drafter yields the very same text as plain sampling: methods
differ only in speed.
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
from racer_rs.drafters.base import Drafter
from racer_rs.engine.capacity import AutoCapacity, CapacityPolicy, FixedCapacity
from racer_rs.engine.decode_engine import DecodeEngine, DecodeState, Request, RowFailure
from racer_rs.engine.drafting import Drafting, make_drafting
from racer_rs.engine.streaming import is_streamer
from racer_rs.errors import InvalidArgumentError, InvalidTypeError, UnsupportedError, error_context
from racer_rs.target.batch_verifier import BatchVerifier
from racer_rs.target.sampling import SamplingConfig
from racer_rs.target.verifier import check_model, model_window, vocab_size

#: The default of ``capacity`` for every entry point and ``max_capacity`` (``auto``'s ceiling).
DEFAULT_CAPACITY = "auto"
DEFAULT_MAX_CAPACITY = 64


@dataclass
class GenerationResult:
    """The outcome of one request.

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
            drafter updates, streaming) and ``total``. In a batch, the phases are the batch's
            over the steps the row took part in (shared with the other rows, not divided).
        positions: number of generated tokens at the start of each step.
        method: the drafting method's name.
        extras: method-specific statistics (the drafter's ``stats()`` plus the engine's
            ``mean_tree_size`` and ``resampled_nodes``; in a batch also ``batch``,
            ``admitted_s`` and ``first_token_s``).
        error: what ended a :func:`generate_batch` row early (its drafter or streamer failed):
            ``tokens`` holds what it had committed. ``None`` for a request that finished.
    """

    tokens: list[int]
    accepted_lengths: list[int]
    mat: float
    steps: int
    timings: dict[str, float]
    positions: list[int]
    method: str
    extras: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None


@dataclass
class CallSettings:
    """The keywords every request of a call shares, checked once.

    Attributes:
        verifier: the target's verifier (the model passed its checks).
        vocab: the target's vocabulary size; ``window`` its positions (``None``: unbounded).
        sampling: the sampling settings.
        eos_ids: ids that end a request.
        auto: ``capacity="auto"``; ``capacity`` the fixed node limit (``max_capacity`` when auto).
        max_capacity: the largest tree ``auto`` may verify.
        method: the method's name (or the prebuilt drafter's).
        method_options: the method's options.
        drafter: the caller's prebuilt drafter, if any.
    """

    verifier: BatchVerifier
    vocab: int
    window: int | None
    sampling: SamplingConfig
    eos_ids: tuple[int, ...]
    auto: bool
    capacity: int
    max_capacity: int
    method: str
    method_options: dict[str, Any]
    drafter: Drafter | None = None


def check_settings(
    model: PreTrainedModel,
    *,
    method: Any,
    temperature: Any,
    top_p: Any,
    top_k: Any,
    eos_token_id: Any,
    capacity: Any,
    max_capacity: Any,
    drafter: Any,
    method_options: dict[str, Any],
) -> CallSettings:
    """Check the keywords shared by every request of a call (before any work starts)."""
    check_model(model)
    vocab = vocab_size(model)
    auto = capacity == "auto"
    capacity = rules.capacity("capacity", capacity)
    max_capacity = rules.integer("max_capacity", max_capacity, minimum=1)
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
    eos = eos_ids(eos_token_id, vocab)
    window = model_window(model)
    if auto and window is not None and max_capacity >= window:
        # The cost curve is measured with trees of up to max_capacity tokens after a context.
        raise InvalidArgumentError(
            f"max_capacity ({max_capacity}) must be below the model's window of {window} positions"
        )
    if drafter is not None:
        if not isinstance(drafter, Drafter):
            raise InvalidTypeError(f"drafter must be a racer_rs Drafter, got {type(drafter).__name__}")
        if method_options:
            raise InvalidArgumentError(
                f"method options {sorted(method_options)} cannot be combined with a prebuilt drafter"
            )
    return CallSettings(
        verifier=BatchVerifier(model),
        vocab=vocab,
        window=window,
        sampling=sampling,
        eos_ids=eos,
        auto=auto,
        capacity=int(max_capacity) if auto else int(capacity),
        max_capacity=int(max_capacity),
        method=drafter.name if drafter is not None else method,
        method_options=dict(method_options),
        drafter=drafter,
    )


def check_request(settings: CallSettings, prompt: np.ndarray, budget: int) -> None:
    """A prompt plus its budget must fit the model's window."""
    if settings.window is not None and len(prompt) + budget > settings.window:
        raise InvalidArgumentError(
            f"{len(prompt)} tokens plus max_new_tokens ({budget}) exceed the model's window of "
            f"{settings.window} positions"
        )


def make_drafting_for(settings: CallSettings, model: PreTrainedModel, rows: int) -> Drafting:
    """The call's drafting (the method's factory checks its options)."""
    drafting = make_drafting(
        settings.method,
        model,
        rows,
        settings.vocab,
        settings.method_options,
        settings.drafter,
        calibrated=settings.auto,
    )
    if drafting.needs_topk > settings.vocab:
        raise InvalidArgumentError(
            f"drafter {drafting.name!r} asks for the target's top {drafting.needs_topk} tokens (its breadth), "
            f"more than the model's vocabulary of {settings.vocab}"
        )
    return drafting


def make_policy(settings: CallSettings, model: PreTrainedModel, drafting: Drafting, rows: int) -> CapacityPolicy:
    if drafting.never_drafts:  # plain decoding: nothing to size (the baseline pays no policy)
        return FixedCapacity(1)
    if settings.auto:
        return AutoCapacity(model, drafting.name, settings.sampling.greedy, settings.max_capacity, rows)
    return FixedCapacity(settings.capacity)


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
    capacity: int | str = DEFAULT_CAPACITY,
    max_capacity: int = DEFAULT_MAX_CAPACITY,
    seed: int | None = None,
    streamer: Any = None,
    drafter: Drafter | None = None,
    **method_options: Any,
) -> GenerationResult:
    """Generate with lossless speculative decoding (the engine with one row).

    Args:
        model: a transformers causal LM (decoder-only, full-attention cache).
        input_ids: the prompt: a list of ints, or a ``[L]`` / ``[1, L]`` integer tensor/array.
        method: the drafting method (see :func:`racer_rs.drafters.available_methods`).
        max_new_tokens: exact number of new tokens unless an EOS comes first.
        temperature: 0 for greedy decoding, else the sampling temperature.
        top_p: nucleus filter in (0, 1].
        top_k: top-k filter (0 disables it).
        eos_token_id: one id or a list of ids that end generation (the EOS is kept).
        capacity: ``"auto"`` (the default): every step verifies the tree prefix with the most
            expected tokens per second, from the target's measured forward cost on its device and
            the drafted nodes' calibrated acceptance probabilities (:mod:`racer_rs.autosize`; at
            most ``max_capacity`` nodes; plain decoding when no draft pays). Its statistics are in
            ``extras["auto_capacity"]``; the first request for a model, device, dtype and thread
            count also measures the cost curve (a few seconds, ``setup_s`` there; cached on disk
            afterwards). Or an int: the most draft-tree nodes per step, root included.
        max_capacity: the largest tree ``capacity="auto"`` may verify.
        seed: seeds a private random generator (``None``: torch's global RNG); for a seed,
            every method without draft probabilities samples the same text.
        streamer: receives committed tokens: ``put(tokens, drafted)`` + ``end()``, or an HF
            ``BaseStreamer`` (``put(tensor)``).
        drafter: a prebuilt drafter to use instead of ``method`` (reuse it across calls with
            its persistent mode to keep its state between requests).
        **method_options: options of the method's drafter (e.g. ``persistent=True``; for the racer
            methods that draft by retrieval ``index``: by default an index of the call's own,
            ``index=None`` for none, ``index="file.idx"`` or ``index="memory",
            index_scope="process"`` for one shared across calls).

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
    settings = check_settings(
        model,
        method=method,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        eos_token_id=eos_token_id,
        capacity=capacity,
        max_capacity=max_capacity,
        drafter=drafter,
        method_options=method_options,
    )
    prompt = prompt_ids("input_ids", input_ids, settings.vocab)
    budget = rules.integer("max_new_tokens", max_new_tokens, minimum=1)
    if seed is not None:
        seed = rules.seed("seed", seed)
    with error_context("input_ids"):
        check_request(settings, prompt, budget)
    if streamer is not None and not is_streamer(streamer):
        raise InvalidTypeError("streamer must have put() and end() methods")
    request = Request(0, prompt, int(budget), seed, streamer)
    results = run_requests(model, settings, [request], max_rows=1, started=total_start, isolate_failures=False)
    result = results[0]
    result.timings["total"] = time.perf_counter() - total_start
    return result


def generate_batch(
    model: PreTrainedModel,
    prompts: Sequence[Any] | np.ndarray | torch.Tensor,
    *,
    method: str = "racer",
    max_new_tokens: int | Sequence[int] = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    capacity: int | str = DEFAULT_CAPACITY,
    max_capacity: int = DEFAULT_MAX_CAPACITY,
    seed: int | None = None,
    streamer: Sequence[Any] | None = None,
    max_batch_size: int | None = None,
    **method_options: Any,
) -> list[GenerationResult]:
    """Generate for many prompts with lossless speculative decoding, at most ``max_batch_size``
    of them live at once.

    Every step drafts a tree for each live row and verifies all of them in one target forward;
    rows accept different lengths and finish at different steps (EOS or budget), and the next
    waiting prompt takes a finished row's place at once (its KV cache rows and drafter state are
    new: nothing of a finished request reaches it). Each row's output is exactly what
    :func:`racer_rs.generate` gives for its prompt: plain greedy decoding when greedy, the target
    distribution when sampling.

    Args:
        model: a transformers causal LM (decoder-only, full-attention cache).
        prompts: one prompt per row: a list (or tuple) of prompts, each a list of ints or a
            ``[L]`` / ``[1, L]`` integer array/tensor (lengths may differ), or a ``[B, L]``
            integer array/tensor.
        method: the drafting method, any of :func:`racer_rs.drafters.available_methods`: RACER's
            methods draft the whole batch in one :class:`racer_rs.DraftPool` call per step,
            the others row by row (the draft-model methods with one draft KV cache per row).
        max_new_tokens: every row's budget, or one budget per row.
        temperature, top_p, top_k: as :func:`racer_rs.generate` (the same for every row).
        eos_token_id: one id or a list of ids that end a row (the EOS is kept).
        capacity: ``"auto"`` (the default): one node budget per step for the live rows, every row
            keeping its likeliest nodes up to the padded tree size with the most expected tokens
            per second of the batched forward, as measured on this device for this batch size
            (plain decoding for every row when no node pays; :mod:`racer_rs.engine.capacity`).
            Each row's statistics are in ``extras["auto_capacity"]``. Or an int: the most nodes
            per row and step, root included.
        max_capacity: the largest tree per row ``capacity="auto"`` may verify.
        seed: row ``b`` samples with its own generator seeded ``seed + b``, so it gives the text
            ``generate(..., seed=seed + b)`` gives (``None``: torch's global RNG, rows in order).
        streamer: one streamer per prompt (or ``None`` entries), each fed as ``generate`` feeds
            its streamer, as its row commits tokens.
        max_batch_size: the most rows live at once (``None``: every prompt at once).
        **method_options: options of the method's drafter.

    Returns:
        One :class:`GenerationResult` per prompt, in prompt order. A row's ``timings`` are the
        batch's phase times over the steps it took part in, its own ``prefill``, and ``total``:
        seconds from the call's start to the row's end; ``extras["admitted_s"]`` and
        ``extras["first_token_s"]`` are seconds from the call's start to the row's admission and
        its first token; ``extras["batch"]`` holds the call's statistics. A row whose drafter or
        streamer failed holds the error in ``error`` and the tokens it had committed; the
        other rows finish.

    Raises:
        InvalidArgumentError: bad argument values (an empty batch, an empty prompt, a token out
            of range, a prompt plus its budget beyond the model's window, ...); a row's problem
            names it (``prompts[3]: ...``). Raised before any work starts.
        InvalidTypeError: arguments of the wrong type (a row's names it).
        UnsupportedError: an unsupported model architecture.
    """
    total_start = time.perf_counter()
    settings = check_settings(
        model,
        method=method,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        eos_token_id=eos_token_id,
        capacity=capacity,
        max_capacity=max_capacity,
        drafter=None,
        method_options=method_options,
    )
    batch = []
    for row, value in enumerate(_rows(prompts)):
        with error_context(f"prompts[{row}]"):
            batch.append(_prompt(value, settings.vocab))
    budgets = _budgets(max_new_tokens, len(batch))
    if seed is not None:
        rules.seed("seed", seed)
        rules.integer("seed + the last row", seed + len(batch) - 1, maximum=rules.MAX_SEED)
    streamers = _streamers(streamer, len(batch))
    rows = len(batch) if max_batch_size is None else rules.integer("max_batch_size", max_batch_size, minimum=1)
    requests = []
    for row, (prompt, budget) in enumerate(zip(batch, budgets, strict=True)):
        with error_context(f"prompts[{row}]"):
            check_request(settings, prompt, budget)
        requests.append(Request(row, prompt, budget, None if seed is None else int(seed) + row, streamers[row]))
    return run_requests(
        model, settings, requests, max_rows=min(rows, len(batch)), started=total_start, isolate_failures=True
    )


def run_requests(
    model: PreTrainedModel,
    settings: CallSettings,
    requests: list[Request],
    max_rows: int,
    started: float,
    isolate_failures: bool,
) -> list[GenerationResult]:
    """Decode checked requests with the engine; their results in request order."""
    drafting = make_drafting_for(settings, model, max_rows)
    policy = make_policy(settings, model, drafting, max_rows)
    results: list[GenerationResult | None] = [None] * len(requests)
    batched = isolate_failures  # generate_batch's rows carry the batch's statistics

    def on_finish(state: DecodeState, engine: DecodeEngine) -> None:
        assert state.request is not None
        results[state.request.index] = assemble_result(state, engine, policy, started, batched)

    engine = DecodeEngine(
        settings.verifier,
        drafting,
        settings.sampling,
        policy,
        settings.eos_ids,
        max_rows,
        started,
        on_finish,
        isolate_failures,
    )
    try:
        engine.run(requests)
    except RowFailure as failure:
        raise failure.cause from None
    policy.save()
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def assemble_result(
    state: DecodeState, engine: DecodeEngine, policy: CapacityPolicy, started: float, batched: bool
) -> GenerationResult:
    """A finished row's :class:`GenerationResult` (the policy reports what it chose for it)."""
    timings = dict(state.timings)
    timings["total"] = state.finished_at - started
    steps = len(state.accepted_lengths)
    extras = dict(engine.drafting.stats(state.row))
    extras["mean_tree_size"] = state.tree_nodes / max(1, steps)
    extras["resampled_nodes"] = state.resampled_nodes
    extras.update(policy.finish(state.row, state.length))
    if batched:
        request = state.request
        assert request is not None
        extras["admitted_s"] = state.admitted_at - started
        extras["first_token_s"] = state.first_token_at - started if state.first_token_at else None
        verifier = engine.verifier
        extras["batch"] = {
            "size": engine.requests,
            "max_batch_size": engine.max_rows,
            "peak_rows": engine.peak_rows,
            "row": request.index,
            "seed": request.seed,
            "steps": engine.steps,
            "padded_tokens": verifier.padded_tokens,
            "tree_tokens": verifier.tree_tokens,
            "wall_s": time.perf_counter() - started,
        }
    return GenerationResult(
        tokens=state.context[state.prompt_length : state.length].tolist(),
        accepted_lengths=state.accepted_lengths,
        mat=float(np.mean(state.accepted_lengths)) if steps else 0.0,
        steps=steps,
        timings=timings,
        positions=state.positions,
        method=engine.drafting.name,
        extras=extras,
        error=state.error,
    )


# --- argument rules ----------------------------------------------------------------------------


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
    return np.ascontiguousarray(array)


def eos_ids(eos_token_id: Any, vocab: int) -> tuple[int, ...]:
    """The ids that end a request: ``None``, one id, or a list of ids, each in ``[0, vocab)``."""
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, (list, tuple)):
        return tuple(int(t) for t in rules.token_ids("eos_token_id", list(eos_token_id), vocab))
    if not rules.is_int(eos_token_id):
        raise InvalidTypeError("eos_token_id must be None, an int, or a list of ints")
    return (rules.token_id("eos_token_id", eos_token_id, vocab),)


def _rows(prompts: Any) -> list[Any]:
    """The batch's rows, unchecked: a list/tuple of prompts, or the rows of a 2-D array/tensor."""
    if isinstance(prompts, (np.ndarray, torch.Tensor)):
        if prompts.ndim != 2:
            raise InvalidArgumentError(
                f"prompts must be a [B, L] array or tensor (one row per prompt), got shape {list(prompts.shape)}"
            )
        rows = list(prompts)
    elif isinstance(prompts, (list, tuple)):
        if prompts and all(rules.is_int(item) for item in prompts):
            raise InvalidTypeError(
                "prompts must be a sequence of prompts (one per row), got a flat list of ints: "
                "pass [prompt] for a batch of one"
            )
        rows = list(prompts)
    else:
        raise InvalidTypeError(
            f"prompts must be a list of prompts or a [B, L] array/tensor, got {type(prompts).__name__}"
        )
    if not rows:
        raise InvalidArgumentError("prompts is empty: at least one prompt is required")
    return rows


def _prompt(value: Any, vocab: int) -> np.ndarray:
    """One row's prompt as ``int32[L]``."""
    array = rules.token_ids("prompt", value, vocab, rows=True)
    if array.ndim == 2:
        if array.shape[0] != 1:
            raise InvalidArgumentError(f"prompt must be one prompt ([L] or [1, L]), got shape {list(array.shape)}")
        array = array[0]
    if array.size == 0:
        raise InvalidArgumentError("prompt is empty: at least one prompt token is required")
    return np.ascontiguousarray(array)


def _budgets(max_new_tokens: Any, rows: int) -> list[int]:
    """Every row's token budget: one int for all, or one per row."""
    if rules.is_int(max_new_tokens):
        return [rules.integer("max_new_tokens", max_new_tokens, minimum=1)] * rows
    if isinstance(max_new_tokens, (list, tuple, np.ndarray)):
        if len(max_new_tokens) != rows:
            raise InvalidArgumentError(
                f"max_new_tokens must hold one budget per prompt ({rows}), got {len(max_new_tokens)}"
            )
        return [rules.integer(f"max_new_tokens[{row}]", v, minimum=1) for row, v in enumerate(max_new_tokens)]
    raise InvalidTypeError(f"max_new_tokens must be an int or one int per prompt, got {type(max_new_tokens).__name__}")


def _streamers(streamer: Any, rows: int) -> list[Any]:
    """One streamer (or ``None``) per row."""
    if streamer is None:
        return [None] * rows
    if not isinstance(streamer, (list, tuple)):
        raise InvalidTypeError(
            f"streamer must be a list with one streamer (or None) per prompt, got {type(streamer).__name__}"
        )
    if len(streamer) != rows:
        raise InvalidArgumentError(f"streamer must hold one streamer per prompt ({rows}), got {len(streamer)}")
    for row, item in enumerate(streamer):
        if item is not None and not is_streamer(item):
            raise InvalidTypeError(f"streamer[{row}] must have put() and end() methods")
    return list(streamer)
