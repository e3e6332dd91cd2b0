"""``racer_rs.generate_batch``: many prompts decoded together, every step ONE target forward.

Prompts of different lengths decode side by side. Each step:

1. ``draft``: a tree for every live row (RACER methods: one :meth:`racer_rs.DraftPool.propose`
   call for the batch; other methods: each row's own drafter), cut by the capacity policy
   (``capacity="auto"``: one node budget for the batch, :mod:`racer_rs.autosize.batch_sizer`);
2. ``verify``: one forward over every row's tree, padded to the step's largest tree
   (:class:`racer_rs.target.batch_verifier.BatchVerifier`: per-row positions, a 4D mask over each
   row's own valid prefix and ancestors), the acceptors' device-side predictions for all rows and
   the step's single device-to-host copy;
3. ``accept``: per row, the very acceptor :func:`racer_rs.generate` uses (greedy walk, or the
   position-keyed sampling walk with the row's own uniforms and generator);
4. ``commit``: per row, cut at EOS / its budget; the ragged KV cache is compacted (each row's
   accepted nodes gathered to its own offset), finished rows leave the batch, the rest go on.

Every row is lossless on its own: greedy rows equal plain greedy decoding of their prompt, and a
sampled row ``b`` of a call with ``seed`` draws exactly what ``generate(..., seed=seed + b)`` draws
(the same uniforms, keyed by the row's own generation position).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from racer_rs import _validate as rules
from racer_rs.drafters.base import Proposal, RequestStart, StepOutcome
from racer_rs.engine.acceptance import Acceptor, GreedyWalk, SamplingWalk, StepInputs
from racer_rs.engine.batch_capacity import AutoBatchCapacity, BatchCapacityPolicy, BatchStepReport, FixedBatchCapacity
from racer_rs.engine.drafting import BatchDrafting, make_batch_drafting
from racer_rs.target.batch_verifier import BatchVerifier
from racer_rs.engine.decode_loop import DecodeState, Verification, check_proposal
from racer_rs.engine.generation import GenerationResult, eos_ids
from racer_rs.target.sampling import (
    CANDIDATES,
    SamplingConfig,
    draw_uniforms,
    process_logits,
    sample_nodes,
)
from racer_rs.engine.transfer import HostTransfer
from racer_rs.target.verifier import model_window, topk_with_probs, vocab_size
from racer_rs.errors import InvalidArgumentError, InvalidTypeError, UnsupportedError, error_context


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
    capacity: int | str = 16,
    max_capacity: int = 64,
    seed: int | None = None,
    **method_options: Any,
) -> list[GenerationResult]:
    """Generate for many prompts at once with lossless speculative decoding.

    Every step drafts a tree for each live row and verifies all of them in one target forward;
    rows accept different lengths, finish at different steps (EOS or budget) and leave the batch
    then. Each row's output is exactly what :func:`racer_rs.generate` gives for its prompt: plain
    greedy decoding when greedy, the target distribution when sampling.

    Args:
        model: a transformers causal LM (decoder-only, full-attention cache).
        prompts: one prompt per row: a list (or tuple) of prompts, each a list of ints or a
            ``[L]`` / ``[1, L]`` integer array/tensor (lengths may differ), or a ``[B, L]``
            integer array/tensor.
        method: the drafting method; RACER's methods draft the whole batch in one
            :class:`racer_rs.DraftPool` call per step, ``ar``, ``pld``, ``token_recycling`` and
            ``suffix`` row by row. Draft-model methods (``draft_model``, ``tts``, ``racer_tts``)
            are not supported.
        max_new_tokens: every row's budget, or one budget per row.
        temperature, top_p, top_k: as :func:`racer_rs.generate` (the same for every row).
        eos_token_id: one id or a list of ids that end a row (the EOS is kept).
        capacity: the most draft-tree nodes per row and step, root included; or ``"auto"``: one
            node budget for the batch, each step keeping every row's likeliest nodes up to the
            padded tree size with the most expected tokens per second of the batched forward, as
            measured on this device for this batch size (:mod:`racer_rs.autosize.batch_sizer`; at most
            ``max_capacity`` nodes per row). Each row's statistics are in
            ``extras["auto_capacity"]``; the first batch of a size for a model, device, dtype and
            thread count also measures its cost curves (``setup_s``; cached on disk).
        max_capacity: the largest tree per row ``capacity="auto"`` may verify.
        seed: row ``b`` samples with its own generator seeded ``seed + b``, so it gives the text
            ``generate(..., seed=seed + b)`` gives (``None``: torch's global RNG, rows in order).
        **method_options: options of the method's drafter (RACER's ``persistent=True`` is not
            supported: every row keeps its own state for the call).

    Returns:
        One :class:`GenerationResult` per prompt, in order. A row's ``timings`` are the batch's
        phase times over the steps it took part in (shared with the other rows, not divided),
        its own ``prefill``, and ``total``: seconds from the call's start to the row's end;
        ``extras["batch"]`` holds the batch's statistics (its size, the row's seed, the padded
        tokens every forward processed, the whole call's wall time).

    Raises:
        InvalidArgumentError: bad argument values (an empty batch, an empty prompt, a token out
            of range, a prompt plus its budget beyond the model's window, ...); a row's problem
            names it (``prompts[3]: ...``). Raised before any work starts.
        InvalidTypeError: arguments of the wrong type (a row's names it).
        UnsupportedError: a draft-model method, or an unsupported model architecture.
    """
    total_start = time.perf_counter()
    request = check_batch_request(
        model,
        prompts,
        method=method,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        eos_token_id=eos_token_id,
        capacity=capacity,
        max_capacity=max_capacity,
        seed=seed,
        method_options=method_options,
    )
    rows = len(request.prompts)
    policy: BatchCapacityPolicy
    if request.auto:
        policy = AutoBatchCapacity(model, request.drafting.name, request.sampling.greedy, request.max_capacity, rows)
    else:
        policy = FixedBatchCapacity(request.capacity)
    loop = BatchDecodeLoop(request, policy, total_start)
    try:
        states = loop.run()
        results = [loop.result(row, state) for row, state in enumerate(states)]
        policy.save()
    except BaseException:
        loop.end(raising=False)
        raise
    loop.end(raising=True)
    return results


@dataclass
class BatchRequest:
    """A checked :func:`generate_batch` request.

    Attributes:
        verifier: the batch's verifier (the model passed its checks).
        prompts: ``int32[L_b]`` prompts.
        max_new_tokens: every row's budget.
        sampling: the sampling settings.
        eos_ids: ids that end a row.
        auto: ``capacity="auto"``.
        capacity: the fixed node limit per row (``max_capacity`` when ``auto``).
        max_capacity: the largest tree ``auto`` may verify.
        seed: the batch's seed (row ``b`` uses ``seed + b``), or ``None``.
        drafting: the batch's drafting (its drafters built and options checked).
    """

    verifier: BatchVerifier
    prompts: list[np.ndarray]
    max_new_tokens: list[int]
    sampling: SamplingConfig
    eos_ids: tuple[int, ...]
    auto: bool
    capacity: int
    max_capacity: int
    seed: int | None
    drafting: BatchDrafting


def check_batch_request(
    model: PreTrainedModel,
    prompts: Any,
    *,
    method: Any,
    max_new_tokens: Any,
    temperature: Any,
    top_p: Any,
    top_k: Any,
    eos_token_id: Any,
    capacity: Any,
    max_capacity: Any,
    seed: Any,
    method_options: dict[str, Any],
) -> BatchRequest:
    """Check every argument of :func:`generate_batch` before any work starts; build the drafting.

    Raises:
        InvalidArgumentError, InvalidTypeError, UnsupportedError: as :func:`generate_batch`
            documents; a row's problem names the row (``prompts[3]: ...``).
    """
    verifier = BatchVerifier(model)
    vocab = vocab_size(model)
    batch = []
    for row, value in enumerate(_rows(prompts)):
        with error_context(f"prompts[{row}]"):
            batch.append(_prompt(value, vocab))
    budgets = _budgets(max_new_tokens, len(batch))
    auto = capacity == "auto"
    capacity = rules.capacity("capacity", capacity)
    max_capacity = rules.integer("max_capacity", max_capacity, minimum=1)
    if seed is not None:
        rules.seed("seed", seed)
        rules.integer("seed + the last row", seed + len(batch) - 1, maximum=rules.MAX_SEED)
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
    eos = eos_ids(eos_token_id, vocab)
    window = model_window(model)
    if window is not None:
        for row, (prompt, budget) in enumerate(zip(batch, budgets, strict=True)):
            if len(prompt) + budget > window:
                raise InvalidArgumentError(
                    f"prompts[{row}]: {len(prompt)} tokens plus max_new_tokens ({budget}) exceed the model's "
                    f"window of {window} positions"
                )
        if auto and max_capacity >= window:
            raise InvalidArgumentError(
                f"max_capacity ({max_capacity}) must be below the model's window of {window} positions"
            )
    drafting = make_batch_drafting(method, model, len(batch), vocab, method_options)
    return BatchRequest(
        verifier=verifier,
        prompts=batch,
        max_new_tokens=budgets,
        sampling=sampling,
        eos_ids=eos,
        auto=auto,
        capacity=max_capacity if auto else int(capacity),
        max_capacity=int(max_capacity),
        seed=None if seed is None else int(seed),
        drafting=drafting,
    )


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


#: The acceptors' host results, ``[B, n_max]`` each: every row reads its own nodes.
WALK_RESULTS = ("predicted", "valid")


class BatchDecodeLoop:
    """Runs a batch: prefill every row, then draft / verify / accept / commit until every row
    is done (a row that finishes leaves the batch at once).

    Args:
        request: the checked request.
        policy: the capacity policy (fixed, or one ``auto`` budget for the batch).
        started: ``time.perf_counter()`` at the call's start (rows' ``total`` count from it).
    """

    def __init__(self, request: BatchRequest, policy: BatchCapacityPolicy, started: float) -> None:
        self.request = request
        self.verifier = request.verifier
        self.drafting = request.drafting
        self.sampling = request.sampling
        self.policy = policy
        self.started = started
        self.eos = np.asarray(request.eos_ids, dtype=np.int32)
        # The very acceptor generate() uses, row by row; its device half runs batched here.
        self.walk: Acceptor = GreedyWalk(self.sampling) if self.sampling.greedy else SamplingWalk(self.sampling)
        rows = len(request.prompts)
        device = self.verifier.device
        self.generators: list[torch.Generator | None] = [
            None if request.seed is None else torch.Generator(device=device).manual_seed(request.seed + row)
            for row in range(rows)
        ]
        self.uniforms: torch.Tensor | None = None
        self.states: list[DecodeState] = []
        self.finished_at = [0.0] * rows
        self.begun: list[int] = []
        self.steps = 0

    # --- prefill ------------------------------------------------------------------------------

    def prefill(self) -> list[DecodeState]:
        """Run every prompt, pick every row's first token and start its drafting."""
        request = self.request
        probs_temperature = self.sampling.temperature if self.drafting.needs_topk_probs else None
        seconds: list[float] = []
        outputs = self.verifier.prefill(
            request.prompts, topk=self.drafting.needs_topk, probs_temperature=probs_temperature, timings=seconds
        )
        device = self.verifier.device
        if not self.sampling.greedy:
            # One extra position per row: a step's deepest node may predict one past the budget.
            self.uniforms = torch.zeros((len(outputs), max(request.max_new_tokens) + 1, CANDIDATES), device=device)
        for row, (prompt, output) in enumerate(zip(request.prompts, outputs, strict=True)):
            started = time.perf_counter()
            budget = request.max_new_tokens[row]
            uniforms = None
            if self.uniforms is not None:
                self.uniforms[row, : budget + 1] = draw_uniforms(budget + 1, self.generators[row], device)
                uniforms = self.uniforms[row, : budget + 1]
            state = DecodeState.after_prefill(
                prompt, budget, output.last_logits, self.sampling, uniforms, self.generators[row]
            )
            self.drafting.begin(
                row,
                RequestStart(
                    prompt_ids=state.context[: len(prompt)].copy(),
                    prompt_topk=output.prompt_topk,
                    prompt_logits_last=output.last_logits.detach(),
                    vocab_size=int(output.last_logits.shape[-1]),
                    device=device,
                    dtype=self.verifier.dtype,
                    temperature=self.sampling.temperature,
                    top_p=self.sampling.top_p,
                    top_k=self.sampling.top_k,
                    max_new_tokens=budget,
                    eos_token_ids=tuple(int(t) for t in self.eos),
                    generator=self.generators[row],
                    model=self.verifier.model,
                    prompt_topk_probs=output.prompt_topk_probs,
                    prompt_topk_positions=output.prompt_topk_positions,
                ),
            )
            self.begun.append(row)
            state.timings["prefill"] += seconds[row] + time.perf_counter() - started
            self.states.append(state)
        return self.states

    # --- one step -----------------------------------------------------------------------------

    def step(self, live: list[int]) -> list[int]:
        """One batched step over the ``live`` rows; returns the rows still live after it."""
        states = self.states
        for row in live:
            states[row].positions.append(states[row].generated)
        # Rows whose root is their last token commit it without a forward, as generate() does.
        done = [
            row
            for row in live
            if states[row].max_new_tokens - states[row].generated == 1 or states[row].next_token in self.eos
        ]
        for row in done:
            started = time.perf_counter()
            self._append(row, np.asarray([states[row].next_token], dtype=np.int32), finished=True)
            states[row].timings["bookkeeping"] += time.perf_counter() - started
        if done:
            self.verifier.keep_rows([index for index, row in enumerate(live) if not states[row].finished])
            live = [row for row in live if not states[row].finished]
        if not live:
            return live
        self.steps += 1
        started = time.perf_counter()
        full = self.draft(live)
        proposals, choices = self.policy.cut(full, live, self.verifier.physical)
        drafted = time.perf_counter()
        context = self.verifier.physical
        forward_before = self.verifier.model_seconds
        logits, host = self.verify(live, proposals)
        forward = self.verifier.model_seconds - forward_before
        padded = int(logits.shape[1])
        verified_at = time.perf_counter()
        verifications = self.accept(live, proposals, logits, host)
        accepted_at = time.perf_counter()
        still = self.commit(live, proposals, verifications)
        finished = time.perf_counter()
        for row in live:
            timings = states[row].timings
            timings["draft"] += drafted - started
            timings["verify"] += verified_at - drafted
            timings["forward"] += forward
            timings["accept"] += accepted_at - verified_at
            timings["bookkeeping"] += finished - accepted_at
        self.policy.observe(
            BatchStepReport(
                rows=list(live),
                full=full,
                verified=proposals,
                choices=choices,
                paths=[v.path for v in verifications],
                bonuses=[v.bonus for v in verifications],
                committed=[states[row].accepted_lengths[-1] for row in live],
                context=context,
                padded=padded,
                forward=forward,
                step=finished - started,
            )
        )
        return still

    def draft(self, live: list[int]) -> list[Proposal]:
        """Every live row's proposal, checked as the decode loop checks one request's."""
        states = self.states
        contexts = []
        for row in live:
            context = states[row].context[: states[row].length]
            context.flags.writeable = False  # a view of the engine's buffer; drafters only read it
            contexts.append(context)
        capacities = [min(self.policy.limit, states[row].max_new_tokens - states[row].generated) for row in live]
        next_tokens = [states[row].next_token for row in live]
        proposals = self.drafting.propose(live, contexts, next_tokens, capacities, self.policy.edge_calibration())
        if len(proposals) != len(live):
            raise InvalidArgumentError(
                f"drafting {self.drafting.name!r} returned {len(proposals)} proposals for {len(live)} rows"
            )
        checked = []
        for proposal, capacity, token in zip(proposals, capacities, next_tokens, strict=True):
            proposal = check_proposal(self.drafting.name, proposal, capacity, token)
            if proposal.draft_probs is not None and not self.sampling.greedy:
                raise UnsupportedError(
                    f"drafter {self.drafting.name!r}: draft probabilities (chain speculative sampling) are not "
                    "supported by generate_batch"
                )
            checked.append(proposal)
        return checked

    def verify(self, live: list[int], proposals: list[Proposal]) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
        """One forward over every row's tree; the acceptor's predictions and the drafters' top-k
        for all rows, copied to the host in the step's one transfer."""
        trees = [p.tree for p in proposals]
        for row, tree in zip(live, trees, strict=True):
            self.states[row].tree_nodes += len(tree)
        logits = self.verifier.forward_trees(trees)
        transfer = HostTransfer()
        self._predict(live, trees, logits, transfer)
        k = self.drafting.needs_topk
        if k > 0 and self.drafting.needs_topk_probs:
            ids, probs = topk_with_probs(logits, k, self.sampling.temperature)
            transfer.add("topk_ids", ids)
            transfer.add("topk_probs", probs)
        elif k > 0:
            transfer.add("topk_ids", torch.topk(logits, k, dim=-1).indices)
        return logits, transfer.fetch()

    def _predict(self, live: list[int], trees: list[Any], logits: torch.Tensor, transfer: HostTransfer) -> None:
        """The acceptor's device half for every row at once: ``GreedyWalk.predict`` /
        ``SamplingWalk.predict`` on ``[B, n_max]`` nodes, each row with its own uniforms keyed
        by its own generation position (padding nodes draw garbage nobody reads)."""
        if self.sampling.greedy:
            transfer.add("predicted", logits.argmax(dim=-1))
            return
        assert self.uniforms is not None
        batch, width = logits.shape[:2]
        positions = np.empty((batch, width), dtype=np.int64)
        for index, (row, tree) in enumerate(zip(live, trees, strict=True)):
            generated = self.states[row].generated
            positions[index, : len(tree)] = tree.depths.astype(np.int64) + generated + 1
            positions[index, len(tree) :] = generated + 1
        device = self.uniforms.device
        rows = torch.as_tensor(live, dtype=torch.long, device=device).unsqueeze(1)
        uniforms = self.uniforms[rows, torch.from_numpy(positions).to(device), 0]
        predicted, valid = sample_nodes(logits.reshape(batch * width, -1), self.sampling, uniforms.reshape(-1))
        transfer.add("predicted", predicted.view(batch, width))
        if valid is not None:
            transfer.add("valid", valid.view(batch, width).long())

    def accept(
        self, live: list[int], proposals: list[Proposal], logits: torch.Tensor, host: dict[str, np.ndarray]
    ) -> list[Verification]:
        """Every row's accepted path and bonus token, decided by the request's acceptor."""
        verifications = []
        for index, (row, proposal) in enumerate(zip(live, proposals, strict=True)):
            state = self.states[row]
            n = len(proposal.tree)
            node_logits = logits[index, :n]
            step = StepInputs(proposal, node_logits, state.generated, state.uniforms, self.generators[row])
            own: dict[str, np.ndarray] = {name: host[name][index, :n] for name in WALK_RESULTS if name in host}
            acceptance = self.walk.accept(step, own)
            state.resampled_nodes += acceptance.resampled
            topk_ids = host["topk_ids"][index, :n].astype(np.int32) if "topk_ids" in host else None
            topk_probs = host["topk_probs"][index, :n].astype(np.float32) if "topk_probs" in host else None
            processed = process_logits(node_logits, self.sampling).detach() if self.drafting.needs_logits else None
            verifications.append(Verification(acceptance.path, acceptance.bonus, topk_ids, processed, topk_probs))
        return verifications

    def commit(self, live: list[int], proposals: list[Proposal], verifications: list[Verification]) -> list[int]:
        """Cut every row at EOS / its budget, compact the cache (finished rows leave it), append,
        and let the drafting observe; returns the rows still live."""
        paths: list[np.ndarray | None] = []
        outcomes = []
        for row, proposal, verification in zip(live, proposals, verifications, strict=True):
            state = self.states[row]
            path = np.asarray(verification.path, dtype=np.int64)
            committed = proposal.tree.tokens[path][: state.max_new_tokens - state.generated]
            finished = state.generated + len(committed) >= state.max_new_tokens
            if self.eos.size:
                hits = np.flatnonzero(np.isin(committed, self.eos))
                if hits.size:
                    committed = committed[: int(hits[0]) + 1]
                    finished = True
            paths.append(None if finished else path)
            position = state.generated
            self._append(row, committed, finished)
            state.next_token = verification.bonus
            outcomes.append(
                StepOutcome(
                    tree=proposal.tree,
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
        self.verifier.commit(paths)
        self.drafting.observe(live, outcomes)
        return [row for row, path in zip(live, paths, strict=True) if path is not None]

    def _append(self, row: int, committed: np.ndarray, finished: bool) -> None:
        state = self.states[row]
        count = len(committed)
        state.context[state.length : state.length + count] = committed
        state.length += count
        state.accepted_lengths.append(count)
        state.finished = finished
        if finished:
            self.finished_at[row] = time.perf_counter()

    def run(self) -> list[DecodeState]:
        """Decode every row to completion."""
        self.prefill()
        live = list(range(len(self.states)))
        while live:
            live = self.step(live)
        return self.states

    # --- results ------------------------------------------------------------------------------

    def result(self, row: int, state: DecodeState) -> GenerationResult:
        """Row ``row``'s :class:`GenerationResult` (the policy reports what it chose for it)."""
        timings = dict(state.timings)
        timings["total"] = self.finished_at[row] - self.started
        steps = len(state.accepted_lengths)
        extras = dict(self.drafting.stats(row))
        extras["mean_tree_size"] = state.tree_nodes / max(1, steps)
        extras["resampled_nodes"] = state.resampled_nodes
        extras.update(self.policy.finish(row, state.length))
        verifier = self.verifier
        extras["batch"] = {
            "size": len(self.states),
            "row": row,
            "seed": None if self.request.seed is None else self.request.seed + row,
            "steps": self.steps,
            "padded_tokens": verifier.padded_tokens,
            "tree_tokens": verifier.tree_tokens,
            "wall_s": time.perf_counter() - self.started,
        }
        return GenerationResult(
            tokens=state.context[state.prompt_length : state.length].tolist(),
            accepted_lengths=state.accepted_lengths,
            mat=float(np.mean(state.accepted_lengths)) if steps else 0.0,
            steps=steps,
            timings=timings,
            positions=state.positions,
            method=self.drafting.name,
            extras=extras,
        )

    def end(self, raising: bool) -> None:
        """Run every started row's end hook; with ``raising``, the first hook's error surfaces
        (after every hook ran)."""
        first: Exception | None = None
        for row in self.begun:
            try:
                self.drafting.end(row)
            except Exception as error:
                if first is None:
                    first = error
        self.begun = []
        if raising and first is not None:
            raise first
