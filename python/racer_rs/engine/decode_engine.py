"""The decode engine: one loop over a set of live rows, for every batch size.

:func:`racer_rs.generate` runs it with one row, :func:`racer_rs.generate_batch` with many. Each
step is ONE target forward over every live row's draft tree:

1. ``draft``: a tree for every live row (:mod:`racer_rs.engine.drafting`: RACER's methods draft
   the whole batch in one :meth:`racer_rs.DraftPool.propose` call, others row by row), cut by the
   capacity policy (``capacity="auto"``: one node budget for the live rows,
   :mod:`racer_rs.engine.capacity`);
2. ``verify``: one forward over every row's tree, padded to the step's largest tree
   (:class:`racer_rs.target.batch_verifier.BatchVerifier`: per-row positions, a 4D mask over each
   row's own valid prefix and ancestors), the acceptors' device-side predictions for all rows and
   the step's single device-to-host copy (a row verifying a draft model's chain while sampling
   decides on its own, with chain speculative sampling);
3. ``accept``: per row, its acceptor (greedy walk, the position-keyed sampling walk with the row's
   own uniforms and generator, or chain speculative sampling);
4. ``commit``: per row, cut at EOS / its budget; the ragged KV cache is compacted, finished rows
   leave the batch, and the next waiting requests are admitted into the freed rows
   (``max_batch_size``), so a long job runs at a steady concurrency.

Every row is lossless on its own: greedy rows equal plain greedy decoding of their prompt, and a
sampled row with seed ``s`` draws exactly what ``generate(..., seed=s)`` draws (the same uniforms,
keyed by the row's own generation position). A row whose drafter or streamer fails ends alone,
its error and the tokens it had committed in its :class:`RowResult`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from racer_rs._native import DraftTree
from racer_rs.drafters.base import Proposal, RequestStart, StepOutcome
from racer_rs.engine.acceptance import (
    Acceptance,
    Acceptor,
    ChainSpeculativeSampling,
    GreedyWalk,
    SamplingWalk,
    StepInputs,
)
from racer_rs.engine.capacity import CapacityPolicy, StepReport
from racer_rs.engine.drafting import Drafting
from racer_rs.engine.streaming import StreamAdapter
from racer_rs.engine.transfer import HostTransfer
from racer_rs.errors import InvalidArgumentError, InvalidTypeError
from racer_rs.target.batch_verifier import BatchVerifier, tree_offsets
from racer_rs.target.sampling import (
    SamplingConfig,
    draw_uniforms,
    greedy_ids,
    logits_summary,
    process_logits,
    sample_nodes,
    sample_position,
    sample_weights,
    temperature_weights,
    topk_ids,
    uniform_rows,
)

TIMING_KEYS = ("prefill", "draft", "verify", "forward", "accept", "bookkeeping", "total")
#: On a CPU, sampled trees holding more than this many nodes per row have only their roots drawn
#: with the step, the deeper nodes by the walk if it reaches them (see ``DecodeEngine._predict``).
LAZY_DRAW_NODES_PER_ROW = 2
#: The acceptors' host results, ``[K]`` each (the step's nodes, rows one after another): every row reads its own.
WALK_RESULTS = ("predicted", "valid")


@dataclass
class Request:
    """One request, as every public entry point builds it once from its keywords.

    Attributes:
        index: its position in the call's results.
        prompt: ``int32[L]`` prompt ids (checked).
        max_new_tokens: its token budget.
        seed: seeds the row's private generator (``None``: torch's global one).
        streamer: the user's streamer for this request, or ``None``.
    """

    index: int
    prompt: np.ndarray
    max_new_tokens: int
    seed: int | None = None
    streamer: Any = None


@dataclass
class DecodeState:
    """Mutable state of one live row (one request).

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
        timings: accumulated seconds per phase (see :class:`racer_rs.GenerationResult`).
        tree_nodes: total number of verified tree nodes.
        resampled_nodes: nodes whose fast sample had to be redrawn exactly.
        uniforms: ``[max_new_tokens + 1, CANDIDATES]`` uniforms keyed by generation position
            (sampling only; see :func:`racer_rs.target.sampling.draw_uniforms`).
        request: the request this row decodes (``None`` for a state built by hand).
        generator: the row's random generator (``None``: torch's global one).
        streamer: the row's adapted streamer.
        admitted_at, first_token_at, finished_at: ``time.perf_counter()`` when the row was
            admitted, committed its first token and finished.
        error: what ended the row early, if anything.
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
    request: Request | None = None
    generator: torch.Generator | None = None
    streamer: StreamAdapter | None = None
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0
    error: BaseException | None = None

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
            generator=generator,
        )

    @property
    def generated(self) -> int:
        """Number of tokens generated so far."""
        return self.length - self.prompt_length

    @property
    def row(self) -> int:
        """The row's key in the drafting and the capacity policy: its request's index."""
        return 0 if self.request is None else self.request.index


@dataclass
class Verified:
    """One row's verify-phase output: the acceptor's inputs and what the step copied to the host.

    Attributes:
        step: the acceptor's view of the step (proposal, logits, position, uniforms).
        acceptor: the acceptor that queued the predictions.
        host: the row's host-side results by name.
        node_logits: processed logits of every node, when the drafter asked for them.
    """

    step: StepInputs
    acceptor: Acceptor
    host: dict[str, np.ndarray]
    node_logits: torch.Tensor | None


@dataclass
class Verification:
    """One row's accept-phase output: what the step commits and what the drafter learns.

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


#: The most rows a call may keep live for an optional prompt top-k to be computed.
PROMPT_TOPK_MAX_ROWS = 1


def prompt_topk_rows(drafting: Drafting, max_rows: int) -> int:
    """Top-k ids per prompt position to compute at admission (0: none).

    An optional prompt top-k (a copy-logit table's seed) is taken for a request decoded alone
    only. It is one LM-head row per distinct prompt token, about 30% of a prefill, and prefills
    are not batched: at ``C`` rows they weigh ``C`` times more against the shared decode steps,
    while the drafts they seed pay less and less. Measured: Qwen2.5-Coder-0.5B on HumanEval at
    one row, +2% tokens/s with them (MAT 2.08 vs 1.95); SmolLM2-135M on Spec-Bench, no MAT
    change at one row and 6% of the run at 16 rows.
    """
    if drafting.prompt_topk_optional and max_rows > PROMPT_TOPK_MAX_ROWS:
        return 0
    return drafting.needs_topk


def fill_holes(finished: Sequence[bool]) -> list[int]:
    """The rows that stay, in their new order: a finished row's place goes to a live row from the
    end of the batch, so that only as many cache rows move as rows finished (keeping the order
    would move every row after the first that finished)."""
    alive = [row for row, done in enumerate(finished) if not done]
    order = list(range(len(alive)))
    holes = [place for place in order if finished[place]]
    movers = [row for row in alive if row >= len(alive)]
    for place, row in zip(holes, movers, strict=True):
        order[place] = row
    return order


class RowFailure(Exception):
    """Raised inside the engine to end one row: ``cause`` is the row's own error."""

    def __init__(self, state: DecodeState, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.state = state
        self.cause = cause


class DecodeEngine:
    """Decodes requests at a bounded concurrency: at most ``max_rows`` live rows share every
    forward; a finished row's place goes to the next waiting request at once.

    Args:
        verifier: the target's batched verifier (owns the ragged KV cache).
        drafting: the method's drafting for every row.
        sampling: the call's sampling settings.
        policy: the capacity policy (a fixed node limit, or ``capacity="auto"``).
        eos_token_ids: ids that end a request.
        max_rows: the most rows live at once.
        started: ``time.perf_counter()`` at the call's start.
        on_finish: called with every row's state and the engine as the row finishes (in
            finishing order); the engine is passed, not captured, so that no reference cycle
            keeps a finished run's KV cache alive until the garbage collector finds it.
        isolate_failures: a row whose drafter or streamer fails ends alone (its error kept in its
            state) instead of the whole call raising.
    """

    def __init__(
        self,
        verifier: BatchVerifier,
        drafting: Drafting,
        sampling: SamplingConfig,
        policy: CapacityPolicy,
        eos_token_ids: tuple[int, ...],
        max_rows: int,
        started: float,
        on_finish: Callable[[DecodeState, DecodeEngine], None],
        isolate_failures: bool,
    ) -> None:
        self.verifier = verifier
        self.drafting = drafting
        self.sampling = sampling
        self.policy = policy
        self.eos = np.asarray(eos_token_ids, dtype=np.int32)
        self.max_rows = max_rows
        self.started = started
        self.on_finish = on_finish
        self.isolate_failures = isolate_failures
        self.prompt_topk = prompt_topk_rows(drafting, max_rows)
        # One walk for every row; chain speculative sampling serves the proposals that carry
        # draft probabilities (a draft model's chains) when the call samples.
        self.walk: Acceptor = GreedyWalk(sampling) if sampling.greedy else SamplingWalk(sampling)
        self.chain: Acceptor | None = None if sampling.greedy else ChainSpeculativeSampling(sampling)
        self.live: list[DecodeState] = []  # in the verifier's row order
        self._finished_rows: list[DecodeState] = []  # finished, not yet handed to on_finish
        self.steps = 0
        self.peak_rows = 0
        self.requests = 0  # requests of the whole run
        self.waiting: Sized = ()  # requests not yet admitted (during :meth:`run`)
        self.ended_at_eos = False  # a request of the call ended at EOS before its budget

    # --- admission ----------------------------------------------------------------------------

    def admit(self, requests: Sequence[Request]) -> None:
        """Prefill ``requests`` into new rows after the live ones, pick each one's first token and
        start its drafting."""
        probs_temperature = self.sampling.temperature if self.drafting.needs_topk_probs else None
        admitted = time.perf_counter()
        prefill_seconds: list[float] = []
        # One call for all of them: the batch cache grows once, not once per request.
        outputs = self.verifier.add_rows(
            [request.prompt for request in requests],
            topk=self.prompt_topk,
            probs_temperature=probs_temperature,
            timings=prefill_seconds,
        )
        for request, output, seconds in zip(requests, outputs, prefill_seconds, strict=True):
            started = time.perf_counter()
            device = self.verifier.device
            generator = None if request.seed is None else torch.Generator(device=device).manual_seed(request.seed)
            uniforms = None
            if not self.sampling.greedy:
                # One extra row: a step's deepest node may predict one token past the budget.
                uniforms = draw_uniforms(request.max_new_tokens + 1, generator, device)
            state = DecodeState.after_prefill(
                request.prompt, request.max_new_tokens, output.last_logits, self.sampling, uniforms, generator
            )
            state.request = request
            state.admitted_at = admitted
            self.live.append(state)
            self.peak_rows = max(self.peak_rows, len(self.live))
            self.policy.admit(state.row)
            try:
                if request.streamer is not None:
                    state.streamer = StreamAdapter(request.streamer, request.prompt)
                self.drafting.begin(
                    state.row,
                    RequestStart(
                        prompt_ids=state.context[: len(request.prompt)].copy(),
                        prompt_topk=output.prompt_topk,
                        prompt_logits_last=output.last_logits.detach(),
                        vocab_size=int(output.last_logits.shape[-1]),
                        device=device,
                        dtype=self.verifier.dtype,
                        temperature=self.sampling.temperature,
                        top_p=self.sampling.top_p,
                        top_k=self.sampling.top_k,
                        max_new_tokens=request.max_new_tokens,
                        eos_token_ids=tuple(int(t) for t in self.eos),
                        generator=generator,
                        model=self.verifier.model,
                        prompt_topk_probs=output.prompt_topk_probs,
                        prompt_topk_positions=output.prompt_topk_positions,
                    ),
                )
            except Exception as error:
                self._fail(state, error)
            state.timings["prefill"] += seconds + time.perf_counter() - started

    # --- one step -----------------------------------------------------------------------------

    def finish_ready(self) -> None:
        """Rows whose root is their last token (its budget's last, or EOS) commit it without a
        forward, as plain decoding does, and leave the batch (the run admits into their places
        before the next forward)."""
        for state in list(self.live):
            if state.max_new_tokens - state.generated == 1 or state.next_token in self.eos:
                self.ended_at_eos |= state.max_new_tokens - state.generated > 1
                started = time.perf_counter()
                state.positions.append(state.generated)
                self._append(state, np.asarray([state.next_token], dtype=np.int32), finished=True)
                state.timings["bookkeeping"] += time.perf_counter() - started
        self._drop_finished()

    def step(self) -> None:
        """One step over the live rows: rows ready to finish do (:meth:`finish_ready`); the others
        draft, verify, accept and commit together."""
        self.finish_ready()
        if not self.live:
            return
        for state in self.live:
            state.positions.append(state.generated)
        live = list(self.live)
        self.steps += 1
        started = time.perf_counter()
        drafting = not self.drafting.never_drafts and (not self.drafting.skips_steps or self.policy.drafts(len(live)))
        if drafting:
            drafted_all = self.draft(live)
        else:  # a plain step: every row verifies its root alone
            drafted_all = [Proposal(DraftTree.chain(np.asarray([s.next_token], dtype=np.int32))) for s in live]
        full = [p for p in drafted_all if p is not None]
        if len(full) != len(live):  # a row failed while drafting: it leaves the batch alone
            live = [state for state, p in zip(live, drafted_all, strict=True) if p is not None]
            self._drop_finished()
            if not live:
                return
        rows = [state.row for state in live]
        if drafting:
            proposals, choices = self.policy.cut(
                full, rows, self.verifier.physical, flat=self.verifier.flat, pacing=self.pacing_rows(live)
            )
        else:
            proposals, choices = full, [None] * len(full)
        drafted = time.perf_counter()
        context = self.verifier.physical
        forward_before = self.verifier.model_seconds
        verified = self.verify(live, proposals)
        forward = self.verifier.model_seconds - forward_before
        padded = max(len(p.tree) for p in proposals)
        verified_at = time.perf_counter()
        verifications = [self.accept(state, v) for state, v in zip(live, verified, strict=True)]
        accepted_at = time.perf_counter()
        self.commit(live, proposals, verifications)
        finished = time.perf_counter()
        for state in live:
            timings = state.timings
            timings["draft"] += drafted - started
            timings["verify"] += verified_at - drafted
            timings["forward"] += forward
            timings["accept"] += accepted_at - verified_at
            timings["bookkeeping"] += finished - accepted_at
        self.policy.observe(
            StepReport(
                rows=rows,
                full=full,
                verified=proposals,
                choices=choices,
                paths=[v.path for v in verifications],
                bonuses=[v.bonus for v in verifications],
                randomized=[p.draft_probs is not None and not self.sampling.greedy for p in proposals],
                committed=[state.accepted_lengths[-1] for state in live],
                context=context,
                padded=padded,
                forward=verified_at - drafted,
                step=finished - started,
                drafted=drafting,
                flat=self.verifier.last_flat,
            )
        )
        self._drop_finished()

    def pacing_rows(self, live: list[DecodeState]) -> list[bool]:
        """Per live row, whether its accepted drafts bring the call's end nearer: every row's
        while requests wait (a row that finishes sooner admits the next one sooner); once none
        waits, only the rows with the most budget left, which the call's last steps wait for. A
        row ahead of them that finishes sooner leaves the last steps with fewer rows, no fewer
        steps, and every node it verifies costs a forward that all rows share: on
        Qwen2.5-Coder-0.5B at 16 rows, one wave of 16 requests, drafting made rows finish at
        different steps, and plain steps of 13 and 7 rows left behind cost 12.0 and 16.3 ms per
        token against 10.8 at 16.
        The budget tells which rows end last only while requests run to it: once one of the
        call's requests has ended at EOS, any row may end next, and every row drafts again (a
        row held back that turned out the last one would have ended at plain decoding's pace,
        never slower, but later than drafting would have ended it)."""
        if self.waiting or len(live) == 1 or self.ended_at_eos:
            return [True] * len(live)
        left = [state.max_new_tokens - state.generated for state in live]
        most = max(left)
        return [remaining == most for remaining in left]

    def draft(self, live: list[DecodeState]) -> list[Proposal | None]:
        """Every live row's proposal, checked as the drafter's rules require; ``None`` for a row
        whose drafter failed or broke them (the row fails alone)."""
        contexts = []
        for state in live:
            context = state.context[: state.length]
            context.flags.writeable = False  # a view of the engine's buffer; drafters only read it
            contexts.append(context)
        capacities = [min(self.policy.limit, state.max_new_tokens - state.generated) for state in live]
        next_tokens = [state.next_token for state in live]
        proposals = self.drafting.propose(
            [state.row for state in live], contexts, next_tokens, capacities, self.policy.edge_calibration()
        )
        if len(proposals) != len(live):
            raise InvalidArgumentError(
                f"drafting {self.drafting.name!r} returned {len(proposals)} proposals for {len(live)} rows"
            )
        checked: list[Proposal | None] = []
        for state, proposal, capacity, token in zip(live, proposals, capacities, next_tokens, strict=True):
            try:
                if isinstance(proposal, BaseException):  # the row's own drafter raised it
                    raise proposal
                checked.append(check_proposal(self.drafting.name, proposal, capacity, token))
            except Exception as error:
                self._fail(state, error)
                checked.append(None)
        return checked

    def verify(self, live: list[DecodeState], proposals: list[Proposal]) -> list[Verified]:
        """One forward over every row's tree; the acceptors' predictions and the
        drafters' top-k for all rows, copied to the host in the step's one transfer."""
        trees = [p.tree for p in proposals]
        for state, tree in zip(live, trees, strict=True):
            state.tree_nodes += len(tree)
        # [K, V]: the rows' nodes one after another; flat or padded as the policy priced the step.
        logits = self.verifier.forward_trees(trees, flat=self.policy.step_flat)
        offsets = tree_offsets([len(tree) for tree in trees])
        chains = [self.chain is not None and p.draft_probs is not None and len(p.tree) > 1 for p in proposals]
        steps = [
            StepInputs(p, logits[start : start + len(p.tree)], state.generated, state.uniforms, state.generator)
            for start, state, p in zip(offsets, live, proposals, strict=True)
        ]
        transfer = HostTransfer()
        k = self.drafting.needs_topk
        greedy = None
        topk = None
        roots_only = self._draws_roots_only(logits, trees)
        if k > 0 and self.drafting.needs_topk_probs and not self.sampling.greedy and not roots_only:
            # Sampling draws every node from softmax(logits / T) (_predict): the top-k
            # probabilities are read from those weights, and the ids alone take one cheap pass
            # (SmolLM2 bfloat16 on this CPU, 8 rows: 0.13 ms a step inside the engine against 0.29
            # for the summary).
            topk = topk_ids(logits, k)
            transfer.add("topk_ids", topk)
        elif k > 0 and (self.drafting.needs_topk_probs or logits.device.type == "cpu"):
            # One pass over the logits for the drafter's top-k, their probabilities and a greedy
            # walk's argmax (on the CPU, the Rust kernel: cheaper than torch.topk alone; elsewhere
            # torch's ops, so top-k ids alone stay one torch.topk).
            ids, probs, greedy = logits_summary(logits, k, self.sampling.temperature)
            transfer.add("topk_ids", ids)
            if self.drafting.needs_topk_probs:
                transfer.add("topk_probs", probs)
        elif k > 0:
            transfer.add("topk_ids", torch.topk(logits, k, dim=-1).indices)
        self._predict(live, trees, logits, transfer, greedy, roots_only, topk)
        # A chain verified with chain speculative sampling decides on its own (its draws come from
        # the row's generator in the order plain generate() makes them).
        chain_hosts: dict[int, dict[str, np.ndarray]] = {}
        for index, is_chain in enumerate(chains):
            if is_chain:
                assert self.chain is not None
                own = HostTransfer()
                self.chain.predict(steps[index], own)
                chain_hosts[index] = own.fetch()
        host = transfer.fetch()
        verified = []
        for index, (start, step) in enumerate(zip(offsets, steps, strict=True)):
            end = start + len(step.proposal.tree)
            own_host = {
                name: host[name][start:end] for name in (*WALK_RESULTS, "topk_ids", "topk_probs") if name in host
            }
            acceptor = self.walk
            if index in chain_hosts:
                assert self.chain is not None
                acceptor = self.chain
                own_host.update(chain_hosts[index])
            node_logits = process_logits(step.logits, self.sampling).detach() if self.drafting.needs_logits else None
            verified.append(Verified(step, acceptor, own_host, node_logits))
        return verified

    def _draws_roots_only(self, logits: torch.Tensor, trees: list[DraftTree]) -> bool:
        """Whether a sampled step draws its rows' roots only (:meth:`_predict`).

        On a CPU there is no device-to-host copy to save, and each node's draw is a few passes
        over the vocabulary: where the trees hold more than LAZY_DRAW_NODES_PER_ROW nodes a row,
        only the roots are drawn with the step, the deeper nodes by the walk, if it reaches them
        (SamplingWalk.accept; about the accepted tokens per row, not every node). Each such draw
        is a call of its own, so small trees are drawn at once: at batch 1 on SmolLM2 (about 7
        nodes at T=0.8) drawing the reached nodes only made 1.06x the tokens/s; at batch 4
        (1.5 nodes a row) it measured 0.98x."""
        return (
            not self.sampling.greedy
            and logits.device.type == "cpu"
            and logits.shape[0] > LAZY_DRAW_NODES_PER_ROW * len(trees)
        )

    def _predict(
        self,
        live: list[DecodeState],
        trees: list[DraftTree],
        logits: torch.Tensor,
        transfer: HostTransfer,
        greedy: torch.Tensor | None = None,
        roots_only: bool = False,
        topk: torch.Tensor | None = None,
    ) -> None:
        """The walk's device half for every row at once: ``GreedyWalk.predict`` /
        ``SamplingWalk.predict`` on the step's ``K`` nodes (flat logits ``[K, V]``), each row with
        its own uniforms keyed by its own generation position. ``greedy``: the logits' argmax if
        the step computed it already (:func:`logits_summary`); ``roots_only``: draw the roots
        alone (:meth:`_draws_roots_only`); ``topk``: ``[K, k]`` ids whose probabilities under
        the drawing weights go to the transfer as ``topk_probs`` (every node drawn)."""
        if self.sampling.greedy:
            transfer.add("predicted", greedy_ids(logits) if greedy is None else greedy)
            return
        device = logits.device
        draws = []
        for state, tree in zip(live, trees, strict=True):
            assert state.uniforms is not None
            positions = uniform_rows(
                state.generated, tree.depths[:1] if roots_only else tree.depths, len(state.uniforms)
            )
            draws.append(state.uniforms[torch.from_numpy(positions).to(state.uniforms.device), 0])
        uniforms = torch.cat(draws).to(device)
        if not roots_only:
            weights = temperature_weights(logits, self.sampling)
            predicted, valid = sample_weights(weights, self.sampling, uniforms)
            transfer.add("predicted", predicted)
            if topk is not None:
                transfer.add("topk_probs", weights.gather(1, topk))
            if valid is not None:
                transfer.add("valid", valid.long())
            return
        roots = torch.from_numpy(tree_offsets([len(tree) for tree in trees])).to(device)
        drawn, drawn_valid = sample_nodes(logits[roots], self.sampling, uniforms)
        # Nodes not drawn read the vocabulary size (above any draw; SamplingWalk.accept draws them).
        predicted = torch.full((logits.shape[0],), logits.shape[-1], dtype=torch.int64, device=device)
        transfer.add("predicted", predicted.index_copy_(0, roots, drawn))
        if drawn_valid is not None:
            valid = torch.ones(logits.shape[0], dtype=torch.long, device=device)
            transfer.add("valid", valid.index_copy_(0, roots, drawn_valid.long()))

    def accept(self, state: DecodeState, verified: Verified) -> Verification:
        """The row's accepted path and bonus token."""
        acceptance: Acceptance = verified.acceptor.accept(verified.step, verified.host)
        state.resampled_nodes += acceptance.resampled
        host = verified.host
        topk_ids = host["topk_ids"].astype(np.int32) if "topk_ids" in host else None
        topk_probs = host["topk_probs"].astype(np.float32) if "topk_probs" in host else None
        return Verification(acceptance.path, acceptance.bonus, topk_ids, verified.node_logits, topk_probs)

    def commit_row(self, state: DecodeState, tree: DraftTree, verification: Verification) -> StepOutcome:
        """Cut the row's accepted path at EOS / its budget and append it; what its drafter learns."""
        path = np.asarray(verification.path, dtype=np.int64)
        committed = tree.tokens[path][: state.max_new_tokens - state.generated]
        finished = state.generated + len(committed) >= state.max_new_tokens
        if self.eos.size:
            hits = np.flatnonzero(np.isin(committed, self.eos))
            if hits.size:
                committed = committed[: int(hits[0]) + 1]
                self.ended_at_eos |= state.generated + len(committed) < state.max_new_tokens
                finished = True
        position = state.generated
        self._append(state, committed, finished)
        state.next_token = verification.bonus
        return StepOutcome(
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

    def commit(self, live: list[DecodeState], proposals: list[Proposal], verifications: list[Verification]) -> None:
        """Commit every row, compact the cache (finished rows leave it) and let the drafting
        observe."""
        outcomes = [
            self.commit_row(state, proposal.tree, verification)
            for state, proposal, verification in zip(live, proposals, verifications, strict=True)
        ]
        paths = [
            None if state.finished else np.asarray(v.path, dtype=np.int64)
            for state, v in zip(live, verifications, strict=True)
        ]
        self.verifier.commit(paths)
        self.live = [state for state in live if not state.finished]
        failures = self.drafting.observe([state.row for state in live], outcomes)
        for state, failure in zip(live, failures, strict=True):
            if failure is not None:
                self._fail(state, failure)

    def _append(self, state: DecodeState, committed: np.ndarray, finished: bool) -> None:
        count = len(committed)
        state.context[state.length : state.length + count] = committed
        state.length += count
        state.accepted_lengths.append(count)
        state.finished = finished
        if not state.first_token_at:
            state.first_token_at = time.perf_counter()
        if finished:
            self._mark_finished(state)
        if state.streamer is not None and state.error is None:
            try:
                state.streamer.put(committed)
            except Exception as error:
                self._fail(state, error)

    # --- rows ending --------------------------------------------------------------------------

    def _mark_finished(self, state: DecodeState) -> None:
        state.finished = True
        if not state.finished_at:
            state.finished_at = time.perf_counter()
            self._finished_rows.append(state)

    def _fail(self, state: DecodeState, error: BaseException) -> None:
        """End the row with ``error`` (its committed tokens are kept); without isolation the
        whole call stops with it."""
        if not self.isolate_failures:
            raise RowFailure(state, error)
        if state.error is None:
            state.error = error
        self._mark_finished(state)

    def _drop_finished(self) -> None:
        """Rows that finished between forwards leave the cache."""
        if not any(state.finished for state in self.live):
            return
        keep = fill_holes([state.finished for state in self.live])
        self.verifier.keep_rows(keep)
        self.live = [self.live[index] for index in keep]

    def end_row(self, state: DecodeState) -> BaseException | None:
        """Run the row's end hooks (its drafting's, then its streamer's); the first error, if any."""
        first: BaseException | None = None
        for hook in (lambda: self.drafting.end(state.row), state.streamer.end if state.streamer is not None else None):
            if hook is None:
                continue
            try:
                hook()
            except Exception as error:
                if first is None:
                    first = error
        return first

    # --- the whole run ------------------------------------------------------------------------

    def run(self, requests: Sequence[Request]) -> None:
        """Decode every request; each finished row goes to ``on_finish`` as it ends."""
        waiting = deque(requests)
        self.waiting = waiting
        self.requests = len(requests)
        ended: set[int] = set()
        try:
            while waiting or self.live:
                self.finish_ready()  # their places go to waiting requests before the next forward
                free = self.max_rows - len(self.live)
                if free > 0 and waiting:
                    admitted = [waiting.popleft() for _ in range(min(free, len(waiting)))]
                    self.admit(admitted)
                    self._drop_finished()
                self._report(ended)
                if self.live:
                    self.step()
                    self._report(ended)
            self._report(ended)
        finally:
            for state in [*self.live, *self._finished_rows]:
                if state.row not in ended:
                    ended.add(state.row)
                    self.end_row(state)

    def _report(self, ended: set[int]) -> None:
        """Hand every finished, not yet reported row to ``on_finish`` (its end hooks run first;
        the row's drafting state and policy statistics are freed after)."""
        while self._finished_rows:
            state = self._finished_rows.pop(0)
            if state.row in ended:
                continue
            ended.add(state.row)
            failure = self.end_row(state)
            if failure is not None and state.error is None:
                if not self.isolate_failures:
                    raise RowFailure(state, failure)
                state.error = failure
            self.on_finish(state, self)
            self.drafting.release(state.row)
            self.policy.release(state.row)
