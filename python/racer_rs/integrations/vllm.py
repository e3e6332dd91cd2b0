"""RACER as a vLLM proposer: ``method="custom_class"`` with
``model="racer_rs.integrations.vllm.RacerProposer"``.

Verified against vLLM 0.33.0, whose model runner (V1; ``custom_class`` forces it, with
asynchronous scheduling off) builds the proposer with ``RacerProposer(vllm_config)``, calls
``load_model(target_model)`` once the target is loaded, and after every step's bookkeeping::

    propose(sampled_token_ids, input_batch.num_tokens_no_spec, input_batch.token_ids_cpu,
            slot_mappings=slot_mappings) -> list[list[int]]

vLLM verifies chains only (one draft token per position), so each request drafts one chain of
at most ``num_speculative_tokens`` tokens, chosen among three: its RACER tree's deepest
root-to-leaf path (retrieval and copy-logit nodes), and the longest-match chains of its own
automaton and of the automaton shared across requests (:meth:`racer_rs.Automaton.chain`: the
continuation of the longest matched context, as SuffixDecoding's greedy path, where the tree's
retrieval ranks continuations of its shortest match by count). Each request drafts the chain
whose tokens, by the calibrated edges, gain the most beyond what a token costs in the batch's
forward, cut to the tokens that pay by the measured time of each token count
(:func:`racer_rs._native.choose_chains`, :class:`racer_rs.integrations._payoff.StepCost`); every
candidate's edges learn from what the target then sampled. Each source's expectations are scaled by what
its chosen chains committed against what their edges expected (:meth:`RacerProposer.source_scales`):
choosing the likeliest of three favours the chain whose estimate came out high, more so for
some sources than for others (in the replay at concurrency 8 the tree's chains committed about
0.6 of their expectation, the own chains 0.97). What is lost against a tree verifier: the
other branches.

vLLM passes no request ids, and its rows are batch slots that get reordered and reused, so
requests are recognised by content: a row continues a request of the previous call when its
context is that request's context followed by exactly the tokens sampled this step (the request
may have moved to another row); anything else starts a fresh state from the row's whole
context, and states no row continued are freed. A fresh state is always correct (drafts never
change the output, only their acceptance). The one case where a state passes to another request
is a new request that arrives, the very next step, with exactly the old one's context plus
that step's tokens: the same token sequence, whose automaton is the one its own context gives
and whose copy-logit rows are the target's predictions on those same tokens.

Logits (off by default here, :data:`LOGITS_BY_DEFAULT`: in vLLM's one chain per request they
did not pay for their time; ``RACER_RS_OPTIONS='{"use_logits": true}'`` turns them on): proposers
get none. :meth:`RacerProposer.load_model` wraps ``compute_logits`` on the
target model instance and keeps the top-k of every call. The runner calls it once per step on
``hidden_states[logits_indices]``: per request, request-major in the batch's row order, one row
after the last verified token and one after each scheduled draft token. The proposer does not
learn how many drafts were scheduled (the scheduler may cut them), so the rows are used only
when they can be attributed exactly: a single call since the last ``propose`` whose row count
equals the sum over the batch of (drafts proposed last step + 1), with every continued request's
accepted tokens equal to its proposed chain's prefix. Since a scheduled draft is never longer
than the proposed one, the count forces every request's split. Steps that fail this (drafts cut
by the token budget or structured output, a second logits call of the same row count such as
prompt logprobs, a step whose ``propose`` vLLM skipped) write no rows; ``stats`` counts both.
Tensor-parallel ranks each run the wrapper and the proposer on their own logits (vLLM uses only
one rank's drafts). Not verified on a GPU yet: if the rows never arrive, drafting falls back to
retrieval alone.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from racer_rs import optional_deps
from racer_rs._native import Automaton, DraftPool, chain_outcomes, choose_chains
from racer_rs.autosize.calibration import SCALE_PRIOR, EdgeCalibration
from racer_rs.drafters.racer import CALIBRATED_MIN_DEPTH
from racer_rs.errors import InvalidArgumentError
from racer_rs.integrations._payoff import StepCost
from racer_rs.integrations._shared import (
    copy_logit_order,
    in_vocab,
    list_in_vocab,
    rows_in_vocab,
    topk_rows,
)
from racer_rs.integrations.options import ServingOptions

__all__ = ["FALLBACK_VOCAB", "LOGITS_BY_DEFAULT", "RACER_DEFAULTS", "RacerProposer"]

logger = logging.getLogger("vllm.racer_rs")

#: Token id range used when neither the config nor the model gives the vocabulary size
#: (retrieval only then: a copy-logit table needs the exact size).
FALLBACK_VOCAB = 1 << 18
#: RACER's options the proposer takes where ``$RACER_RS_OPTIONS`` does not name them: chains
#: may follow a one-token match (the calibrated cells carry the match length, so the cut keeps
#: such a token only where it pays, as for the scored methods' ``CALIBRATED_MIN_DEPTH``). In the
#: replay (SmolLM2-135M-Instruct, 16 prompts, against ``min_depth`` 2; docs/results.md): 92.84 against
#: 91.19 tokens/s at concurrency 8, 64.97 against 65.21 and 71.01 against 69.40 at 4 (two prompt
#: sets), 22.66 against 22.75 at 1.
RACER_DEFAULTS: Mapping[str, Any] = MappingProxyType({"min_depth": CALIBRATED_MIN_DEPTH})
#: Whether the copy-logit tables draft where ``use_logits`` is not given (and retrieval is on).
#: vLLM verifies one chain per request, and there they did not pay: in the replay
#: (``benches/serving/vllm_replay.py``, SmolLM2-135M-Instruct, 32 Spec-Bench and HumanEval
#: requests per level, greedy) accepted tokens with and without them were 1,221 and 1,214 at
#: concurrency 1, 1,030 and 1,040 at 4, 1,133 and 1,135 at 8, while the logits wrapper's top-k
#: and the writes took 0.17-0.43 ms of every step (modelled tokens/s without them 1.473x,
#: 1.297x, 1.178x `none`'s; with them 1.471x, 1.295x, 1.177x).
LOGITS_BY_DEFAULT = False
#: Logits calls kept between two ``propose`` calls (more than one is already ambiguous).
_MAX_RECORDS = 4
#: The candidate chains' sources: the tree's deepest path, the request's own longest-match
#: chain, the shared automaton's.
_TREE, _OWN, _SHARED = 0, 1, 2
#: Per call, the older evidence of each source's scale is multiplied by this: a source whose
#: scale came out low and is no longer chosen drifts back towards its calibrated edges.
_SOURCE_DECAY = 0.995


@dataclass(slots=True)
class _Continued:
    """A request the current call continues, with what the previous call drafted for it."""

    request: _Request
    sampled: list[int]  # this step's tokens: the accepted drafts and the bonus token
    first_row: int  # its first logits row this step (if every request verified its draft)
    root: int
    chain: list[int]  # drafted at the previous call, after root
    slot: int  # its row in the previous call's candidates (-1: it drafted nothing)


@dataclass(slots=True)
class _Request:
    """One request as the proposer knows it."""

    key: int  # its DraftPool id (never reused)
    tokens: np.ndarray  # int32 buffer: its context so far is tokens[:length]
    length: int
    drafting: bool  # False: a token outside the vocabulary
    output: int = 0  # tokens[output:length] are what the engine generated (as far as known)
    shared: int = 0  # tokens[output:shared] are in the shared automaton
    root: int = 0
    chain: list[int] = field(default_factory=list)  # drafted at the last call, after root
    slot: int = -1  # its row in the last call's candidate chains (-1: none)

    def append(self, new: list[int] | np.ndarray) -> None:
        end = self.length + len(new)
        if end > len(self.tokens):
            grown = np.empty(max(2 * end, 64), dtype=np.int32)
            grown[: self.length] = self.tokens[: self.length]
            self.tokens = grown
        self.tokens[self.length : end] = new
        self.length = end


class RacerProposer:
    """vLLM's ``custom_class`` proposer drafting RACER chains.

    Besides each request's own tree, every request may retrieve from an automaton of every
    request's output (:attr:`shared`, at most :attr:`shared_nodes` nodes, LRU), the running
    requests' included as they are generated (as suffix decoding's global tree does; with
    :attr:`shared_running` off, only the outputs of requests that finished): a request
    verifies that chain instead of its own when the calibrated edges expect more accepted
    tokens from it (its edges have the shared-retrieval cells, so calibration learns how
    reliable cross-request continuations are).

    Args:
        vllm_config: vLLM's config; read: ``speculative_config.num_speculative_tokens`` (k),
            and when present ``model_config.max_model_len`` and ``model_config.get_vocab_size()``.
        options: how to draft (default: ``$RACER_RS_OPTIONS``, RACER's options it does not
            name from :data:`RACER_DEFAULTS`).

    Raises:
        MissingDependencyError: if vLLM is not installed (the ``vllm`` extra).
        InvalidArgumentError: if ``num_speculative_tokens`` is missing or below 1, or the
            options are invalid.
    """

    #: Node budget of the automaton shared across requests (0: none).
    shared_nodes: int = 200_000
    #: Running requests' outputs join the shared automaton step by step (else at their end).
    shared_running: bool = True

    def __init__(self, vllm_config: Any, *, options: ServingOptions | None = None) -> None:
        optional_deps.require("vllm", "racer_rs.integrations.vllm.RacerProposer")
        self.vllm_config = vllm_config
        self.options = ServingOptions.from_env(racer_defaults=RACER_DEFAULTS) if options is None else options
        spec = getattr(vllm_config, "speculative_config", None)
        k = getattr(spec, "num_speculative_tokens", None)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InvalidArgumentError(f"speculative_config.num_speculative_tokens must be an int >= 1, got {k!r}")
        #: Most draft tokens per request (vLLM's ``num_speculative_tokens``).
        self.k = k
        model_config = getattr(vllm_config, "model_config", None)
        length = getattr(model_config, "max_model_len", None)
        #: vLLM's ``max_model_len`` (``None`` when the config has no model config).
        self.max_model_len: int | None = int(length) if length is not None else None
        self.vocab_size: int | None = self.options.vocab_size or _config_vocab(model_config)
        if self.vocab_size is not None:
            self.options.check(self.vocab_size)  # at start-up, naming RACER_RS_OPTIONS
        #: Nodes of the tree each chain is taken from.
        self.capacity = self.options.capacity or max(16, 2 * k + 1)
        self._pool: DraftPool | None = None
        #: Finished requests' outputs, read by every request (the counterpart of suffix
        #: decoding's global tree and of NGRAM's corpus): ``None`` when ``shared_nodes`` is 0.
        self.shared: Automaton | None = None
        if self.shared_nodes:
            racer = self.options.racer
            nodes = max(self.shared_nodes, racer.ngram * (racer.ngram + 1) // 2)
            self.shared = Automaton(racer.ngram, nodes, racer.min_depth)
        self._rows: dict[int, _Request] = {}
        self._next_key = 0
        self._records: list[tuple[Any, Any]] = []
        # The last call's candidate chains (tokens and edge cells, each [candidates, rows, k]; a
        # request's ``slot`` is its row) and each row's chosen candidate.
        self._candidates: tuple[np.ndarray, np.ndarray] | None = None
        self._best = np.zeros(0, dtype=np.int64)
        self._sources = np.zeros(0, dtype=np.int64)  # each candidate's source
        self._edges = np.zeros(0, dtype=np.float32)  # the calibrated edges they were chosen by
        #: Per source, the drafted tokens its chosen chains committed and the calibrated edges
        #: expected: choosing the likeliest of several chains favours the one whose estimate
        #: came out high, and each source's estimates err their own way.
        self.source_committed = np.zeros(3)
        self.source_expected = np.zeros(3)
        self._wrapped = False
        #: Acceptance per edge cell, learned from what vLLM samples after each chain.
        self.calibration = EdgeCalibration()
        #: Step seconds against verified tokens, learned from the intervals between calls.
        self.step_cost = StepCost()
        self._last_call: float | None = None
        #: Counters: propose calls, rows drafted, requests started, requests continued, steps
        #: whose logits were attributed and written, steps whose logits could not be, drafted
        #: tokens and the accepted ones among them.
        self.stats = {
            "calls": 0,
            "drafted": 0,
            "started": 0,
            "continued": 0,
            "logit_steps": 0,
            "logit_skips": 0,
            "drafted_tokens": 0,
            "accepted_tokens": 0,
            "shared_chains": 0,
        }
        #: Seconds spent in ``propose``, in the logits wrapper's top-k, and in the timed steps
        #: (intervals between two calls whose requests all continued), with those steps' count.
        self.seconds = {"propose": 0.0, "logits": 0.0, "steps": 0.0, "timed_steps": 0.0}

    # -- vLLM's hooks -----------------------------------------------------------------------

    def load_model(self, target_model: Any) -> None:
        """Called by vLLM with the target model once it is loaded: takes the vocabulary size
        from its config if the model config had none, and (unless ``use_logits`` is off) wraps
        ``target_model.compute_logits`` on the instance to keep the top-k of its logits."""
        if self.vocab_size is None:
            self.vocab_size = _config_vocab(getattr(target_model, "config", None))
        original = getattr(target_model, "compute_logits", None)
        if not self.options.logits_on(LOGITS_BY_DEFAULT) or self._wrapped or not callable(original):
            return
        owner = weakref.ref(self)

        def compute_logits(*args: Any, **kwargs: Any) -> Any:
            logits = original(*args, **kwargs)
            proposer = owner()
            if proposer is not None and getattr(logits, "ndim", 0) == 2:
                proposer._record(logits)
            return logits

        compute_logits.__wrapped__ = original  # type: ignore[attr-defined]
        target_model.compute_logits = compute_logits
        self._wrapped = True

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
        **kwargs: Any,
    ) -> list[list[int]]:
        """Draft tokens for every request of the batch.

        Args:
            sampled_token_ids: per row (``input_batch`` order), the tokens this step sampled:
                the accepted drafts and the bonus token; ``[]`` for a row whose sample was
                discarded (a partial prefill chunk).
            num_tokens_no_spec: ``int32[max_num_reqs]``: row ``i``'s context length, this
                step's tokens included.
            token_ids_cpu: ``int32[max_num_reqs, max_model_len]``: row ``i``'s context is
                ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` (its last token is the root).
            slot_mappings: unused.

        Returns:
            One list per row: ``[]`` for discarded rows, else at most
            ``min(k, max_model_len - n - 1)`` tokens (``n`` the row's context length), the
            bound vLLM's scheduler cuts drafts to.
        """
        now = time.perf_counter()
        records, self._records = self._records, []
        self.stats["calls"] += 1
        pool = self._ensure_pool()
        previous = self._rows
        by_length: dict[int, list[_Request]] = {}
        for request in previous.values():
            by_length.setdefault(request.length, []).append(request)
        claimed: set[int] = set()
        rows: dict[int, _Request] = {}
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        continued: list[_Continued] = []
        extended: list[tuple[_Request, int]] = []  # continued drafting requests, new tokens
        logit_rows = 0  # logits rows this step had, if every request verified what we drafted
        draft_rows: list[int] = []
        budgets: list[int] = []  # the drafting rows' most draft tokens
        timed = self._last_call is not None  # every row continued: the interval is one step
        lengths = np.asarray(num_tokens_no_spec[: len(sampled_token_ids)]).tolist()
        for i, sampled in enumerate(sampled_token_ids):
            n = int(lengths[i])
            if not sampled or n < 1:
                logit_rows += 1
                timed = False
                continue
            step = [int(t) for t in sampled]
            context = token_ids_cpu[i, :n]
            found = self._continuing(previous.get(i), by_length, claimed, context, step)
            if found is not None:
                request = found
                claimed.add(request.key)
                continued.append(_Continued(request, step, logit_rows, request.root, request.chain, request.slot))
                logit_rows += len(request.chain) + 1
                self._extend(pool, request, step, extended)
                self.stats["continued"] += 1
            else:
                request = self._start(pool, context)
                logit_rows += 1
                timed = False
            rows[i] = request
            request.root, request.chain, request.slot = int(context[-1]), [], -1
            budget = self._budget(n)
            if request.drafting and budget > 0:
                draft_rows.append(i)
                budgets.append(budget)
        for request in previous.values():
            if request.key not in claimed:
                self._finish(pool, request)
        if extended:  # in each automaton: the old root and the new tokens before the new root
            pool.extend([r.key for r, _ in extended], [r.tokens[r.length - n - 1 : r.length - 1] for r, n in extended])
        self._rows = rows
        if self.shared is not None and self.shared_running:
            for request in rows.values():
                self._share(request)
        if timed and continued:
            self._time_step(now, logit_rows)
        self._learn(continued)
        if continued and pool.use_logits:
            self._write_logits(pool, records, continued, logit_rows)
        if draft_rows:
            self._draft(pool, rows, draft_rows, budgets, len(rows), out)
        every = self.options.log_every
        if every and self.stats["calls"] % every == 0:
            logger.info("racer_rs proposer: %s", json.dumps({**self.stats, **self.seconds, **self.timing()}))
        self._last_call = now
        self.seconds["propose"] += time.perf_counter() - now
        return out

    def timing(self) -> dict[str, float]:
        """Milliseconds per timed step: the whole step, the proposer's part, the logits
        wrapper's part, and the fitted step cost ``a + b * tokens`` (``a_ms``, ``b_ms``)."""
        s, steps = self.seconds, max(self.seconds["timed_steps"], 1.0)
        calls = max(self.stats["calls"], 1)
        a, b = self.step_cost.coefficients()
        return {
            "step_ms": round(1e3 * s["steps"] / steps, 3),
            "propose_ms": round(1e3 * s["propose"] / calls, 3),
            "logits_ms": round(1e3 * s["logits"] / calls, 3),
            "a_ms": round(1e3 * a, 3) if self.step_cost.weight else 0.0,
            "b_ms": round(1e3 * b, 3) if self.step_cost.weight else 0.0,
        }

    # -- internals --------------------------------------------------------------------------

    def _time_step(self, now: float, tokens: int) -> None:
        """Count the interval since the last call as one step verifying ``tokens`` tokens
        (intervals far beyond the fitted cost, an idle engine or a stalled machine, are not)."""
        assert self._last_call is not None
        seconds = now - self._last_call
        if self.step_cost.weight >= 8 and seconds > 10 * self.step_cost.predicted(tokens):
            return
        self.step_cost.observe(tokens, seconds)
        self.seconds["steps"] += seconds
        self.seconds["timed_steps"] += 1

    def _learn(self, continued: list[_Continued]) -> None:
        """Acceptance outcomes of the last call's candidate chains. The tokens vLLM sampled
        are the target's own after the root, so every chain token up to the first mismatch is
        evidence, verified, cut or not chosen (no cell is starved of evidence)."""
        learning = [c for c in continued if c.slot >= 0]
        if self._candidates is None or not learning:
            return
        tokens, cells = self._candidates
        slots = [c.slot for c in learning]
        best = self._best[slots]
        # The drafted chain is the best candidate's prefix: what it was expected to commit.
        observed, accepted, committed, expected = chain_outcomes(
            tokens, cells, self._edges, slots, best, [len(c.chain) for c in learning], [c.sampled for c in learning]
        )
        sources = self._sources[best]
        self.source_committed *= _SOURCE_DECAY
        self.source_expected *= _SOURCE_DECAY
        np.add.at(self.source_committed, sources, committed)
        np.add.at(self.source_expected, sources, expected)
        self.calibration.observe(observed, accepted)
        self.calibration.record_step(float(expected.sum()), int(committed.sum()))
        self.stats["accepted_tokens"] += int(committed.sum())

    def source_scales(self) -> np.ndarray:
        """Per source, drafted tokens committed per drafted token its calibrated edges
        expected (``1`` before any evidence)."""
        return (self.source_committed + SCALE_PRIOR) / (self.source_expected + SCALE_PRIOR)

    def _draft(
        self,
        pool: DraftPool,
        rows: dict[int, _Request],
        draft_rows: list[int],
        budgets: list[int],
        requests: int,
        out: list[list[int]],
    ) -> None:
        """Every drafting row's best chain, cut to the tokens that pay (``adaptive``).

        A row's candidates: its tree's deepest path (retrieval and copy-logit nodes), its own
        automaton's longest-match chain and the shared automaton's; with ``adaptive`` the one
        whose tokens pay the most in the batch's forward (by the calibrated edges and the
        fitted step cost), else the tree's."""
        k = self.k
        keys = [rows[i].key for i in draft_rows]
        roots = np.array([rows[i].root for i in draft_rows], dtype=np.int64)
        candidates = [pool.propose(keys, roots, self.capacity).chain_table(k)]
        sources = [_TREE]
        if self.options.adaptive:
            if self.options.use_retrieval:
                candidates.append(pool.retrieval_chains(keys, roots, k).chain_table(k))
                sources.append(_OWN)
            if self.shared is not None and len(self.shared):
                candidates.append(pool.retrieval_chains(keys, roots, k, shared=self.shared).chain_table(k))
                sources.append(_SHARED)
        tokens = np.empty((len(candidates), len(draft_rows), k), dtype=np.int32)
        cells = np.empty_like(tokens)
        for c, (chain_tokens, chain_cells) in enumerate(candidates):
            tokens[c], cells[c] = chain_tokens, chain_cells
        edges = self.calibration.probabilities()
        cost = None
        if self.options.adaptive:  # the line, and the staircase of the token counts timed
            cost = (*self.step_cost.coefficients(), self.step_cost.measured(requests + sum(budgets)))
        best, lengths = choose_chains(tokens, cells, edges, self.source_scales()[sources], budgets, requests, cost)
        # Every candidate is kept: what each would have committed is known after the step, so
        # every source's cells learn, not only the chosen one's.
        self._candidates, self._best, self._sources, self._edges = (tokens, cells), best, np.array(sources), edges
        self.stats["shared_chains"] += int((self._sources[best] == _SHARED).sum())
        drafts = tokens[best, np.arange(len(draft_rows))].tolist()
        for j, (i, cut) in enumerate(zip(draft_rows, lengths.tolist(), strict=True)):
            request = rows[i]
            request.slot = j
            request.chain = out[i] = drafts[j][:cut]
        self.stats["drafted"] += len(draft_rows)
        self.stats["drafted_tokens"] += int(lengths.sum())

    def _finish(self, pool: DraftPool, request: _Request) -> None:
        """Free a request no row continued; what the shared automaton lacks of its output
        joins it."""
        if request.key in pool:
            pool.remove(request.key)
        self._share(request)

    def _share(self, request: _Request) -> None:
        """Add the request's output tokens the shared automaton lacks, after its own last
        ``ngram - 1`` output tokens there (many requests extend it in turns)."""
        start = max(request.shared, request.output)
        if self.shared is None or not request.drafting or request.length <= start:
            return
        lead = request.tokens[max(request.output, start - self.shared.ngram + 1) : start]
        self.shared.extend_after(lead, request.tokens[start : request.length])
        request.shared = request.length

    def _budget(self, n: int) -> int:
        if self.max_model_len is None:
            return self.k
        return min(self.k, self.max_model_len - n - 1)

    def _ensure_pool(self) -> DraftPool:
        if self._pool is None:
            vocab, use_logits = self.vocab_size, self.options.logits_on(LOGITS_BY_DEFAULT)
            if vocab is None:
                logger.warning(
                    "racer_rs: no vocabulary size in the config or the model; drafting from "
                    "retrieval alone with token ids below %d",
                    FALLBACK_VOCAB,
                )
                vocab, use_logits = FALLBACK_VOCAB, False
            self.vocab_size = vocab
            self._pool = self.options.pool(vocab, use_logits=use_logits)
        return self._pool

    @staticmethod
    def _continuing(
        same_row: _Request | None,
        by_length: dict[int, list[_Request]],
        claimed: set[int],
        context: np.ndarray,
        sampled: list[int],
    ) -> _Request | None:
        """The request of the previous call this row continues: its context, then exactly this
        step's sampled tokens (the row's own request first, then any that moved)."""
        before = len(context) - len(sampled)
        if before < 1 or context[before:].tolist() != sampled:
            return None
        candidates = [same_row] if same_row is not None else []
        candidates += by_length.get(before, [])
        for request in candidates:
            fresh = request.key not in claimed and request.length == before
            if fresh and _same_tokens(request.tokens, context, before):
                return request
        return None

    def _start(self, pool: DraftPool, context: np.ndarray) -> _Request:
        key, self._next_key = self._next_key, self._next_key + 1
        assert self.vocab_size is not None
        drafting = in_vocab(context, self.vocab_size)
        if drafting:
            pool.add(key, context[:-1])
        self.stats["started"] += 1
        # Its last token is the first one the engine sampled (after a prefill).
        return _Request(key, np.array(context, dtype=np.int32), len(context), drafting, output=len(context) - 1)

    def _extend(self, pool: DraftPool, request: _Request, new: list[int], extended: list[tuple[_Request, int]]) -> None:
        """Append a continued request's new tokens; its automaton takes them in the call's one
        batched ``pool.extend`` (listed in ``extended``), or it stops drafting at a token
        outside the vocabulary."""
        assert self.vocab_size is not None
        fits = list_in_vocab(new, self.vocab_size)
        if request.drafting:
            if fits:
                extended.append((request, len(new)))
            else:
                pool.remove(request.key)
                request.drafting = False
        # Ids beyond int32 wrap in the buffer as numpy's casts do (the request drafts no more).
        request.append(new if fits else np.asarray(new, dtype=np.int64))

    def _record(self, logits: Any) -> None:
        """Keep the top-k of one ``compute_logits`` call (on its device)."""
        pool = self._pool
        breadth = pool.breadth if pool is not None else self.options.racer.breadth
        with_probs = self.options.tree == "scored"
        if logits.shape[-1] < breadth:
            return
        start = time.perf_counter()
        ids, probs = topk_rows(logits.detach(), breadth, with_probs)
        self.seconds["logits"] += time.perf_counter() - start
        self._records = [*self._records[-(_MAX_RECORDS - 1) :], (ids, probs)]

    def _write_logits(
        self,
        pool: DraftPool,
        records: list[tuple[Any, Any]],
        continued: list[_Continued],
        logit_rows: int,
    ) -> None:
        """Write the copy-logit rows of the continued requests if this step's logits can be
        attributed exactly (see the module's docstring), else count a skip."""
        matching = [r for r in records if r[0].shape[0] == logit_rows and r[0].shape[1] == pool.breadth]
        consistent = all(
            len(c.sampled) - 1 <= len(c.chain) and c.sampled[:-1] == c.chain[: len(c.sampled) - 1] for c in continued
        )
        if len(matching) != 1 or not consistent:
            self.stats["logit_skips"] += 1
            return
        ids_t, probs_t = matching[0]
        ids = np.asarray(ids_t.cpu())
        probs = None if probs_t is None else np.clip(np.asarray(probs_t.float().cpu()), 0.0, 1.0)
        assert self.vocab_size is not None
        fits = rows_in_vocab(ids, self.vocab_size)
        keys, tokens, rows = [], [], []
        for c in continued:
            if not c.request.drafting or c.request.key not in pool:
                continue
            nodes = np.array([c.root, *c.chain], dtype=np.int64)
            order = copy_logit_order(len(nodes), range(len(c.sampled)))
            at = c.first_row + order
            if fits[at].all():
                keys.append(c.request.key)
                tokens.append(nodes[order])
                rows.append(at)
        if keys:  # every request's rows in one call
            at = np.concatenate(rows)
            lengths = np.asarray([len(t) for t in tokens], dtype=np.int64)
            pool.update_topk_many(keys, np.concatenate(tokens), ids[at], lengths, None if probs is None else probs[at])
        self.stats["logit_steps"] += 1


def _same_tokens(stored: np.ndarray, context: np.ndarray, length: int) -> bool:
    """Whether the first ``length`` tokens of two id arrays are equal (a byte compare when
    both hold int32, as vLLM's ``token_ids_cpu`` and the proposer's buffers do)."""
    if stored.dtype == context.dtype:
        return bool(stored[:length].tobytes() == context[:length].tobytes())
    return bool(np.array_equal(stored[:length], context[:length]))


def _config_vocab(config: Any) -> int | None:
    """The vocabulary size a vLLM model config (``get_vocab_size()``) or a Hugging Face config
    (``vocab_size``) gives, else ``None``."""
    if config is None:
        return None
    getter = getattr(config, "get_vocab_size", None)
    value = getter() if callable(getter) else getattr(config, "vocab_size", None)
    if value is None:
        text = getattr(config, "get_text_config", None)
        value = getattr(text(), "vocab_size", None) if callable(text) else None
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0 else None
