"""RACER as an SGLang speculative algorithm: ``--speculative-algorithm RACER_RS``.

Verified against SGLang 0.5.23. The algorithm reuses SGLang's n-gram machinery (the ``NGRAM``
algorithm's worker, verify kernels and CUDA graphs) and swaps only where the drafts come from:

- :func:`register` (run by SGLang's plugin loader in every process through the entry point
  ``[project.entry-points."sglang.srt.plugins"] racer_rs``) registers ``RACER_RS`` with
  ``SpeculativeAlgorithm.register``; its spec class answers ``is_ngram() -> True``, so the
  scheduler, the memory sizing and the CUDA-graph runner take their n-gram paths.
- The worker (:func:`worker_class`) subclasses SGLang's ``NGRAMWorker`` and replaces its
  ``ngram_corpus`` with a :class:`RacerCorpus`: the same methods, backed by a
  :class:`racer_rs.DraftPool` holding one RACER state (automaton + copy-logit table) per
  request. It indexes each request's full prompt and outputs itself (SGLang hands the corpus
  only the last ``--speculative-ngram-max-trie-depth`` tokens), and writes the top-k of the
  verify logits of every verified node into the request's copy-logit table (rejected nodes
  first, then the accepted path), read by wrapping the target worker's
  ``forward_batch_generation`` on the instance.
- Requests leave the pool when they leave the decode batch (``erase_match_state``, which
  ``NGRAMWorker`` calls after each verify step with the ids that were in the previous decode
  batch and are not in this one, so the last batch's requests stay while the server is idle),
  on ``flush_cache`` (``reset``), and whenever a request id shows up with a sequence that does
  not continue the one it had (an id reused before its old request was erased starts fresh).

Drafts are deterministic (the pool's outputs never depend on hash seeds or thread counts), as
tensor-parallel ranks need: every rank drafts for itself and the verify forward needs the same
draft tokens on all of them.

Launch (``--disable-overlap-schedule`` is required)::

    python -m sglang.launch_server --model-path MODEL --speculative-algorithm RACER_RS \\
        --speculative-num-draft-tokens 12 --disable-overlap-schedule

RACER's own options come from ``RACER_RS_OPTIONS`` (:mod:`racer_rs.integrations.options`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from racer_rs import _validate as rules
from racer_rs import optional_deps
from racer_rs.errors import InvalidArgumentError, InvalidTypeError, RacerError, StateError, UnsupportedError
from racer_rs.integrations._shared import copy_logit_order, in_vocab, int64_tokens, topk_rows
from racer_rs.integrations.options import ServingOptions

__all__ = [
    "ALGORITHM",
    "MAX_DRAFT_TOKENS",
    "RacerCorpus",
    "register",
    "resolve_server_args",
    "worker_class",
]

#: The name the algorithm is registered under (``RACER`` is left to upstream).
ALGORITHM = "RACER_RS"
#: Largest ``--speculative-num-draft-tokens`` SGLang's tree kernels take.
MAX_DRAFT_TOKENS = 1024
#: Tokens of a request's sequence kept to recognise its continuation.
_RECENT = 32

logger = logging.getLogger("sglang.racer_rs")


def _require_sglang() -> None:
    optional_deps.require("sglang", f"the SGLang speculative algorithm {ALGORITHM}")


# ---------------------------------------------------------------------------------------------
# The corpus: NGRAMWorker's ngram_corpus contract, backed by a DraftPool.


@dataclass
class _Request:
    """What the corpus knows of one request's sequence (prompt + outputs, root last)."""

    length: int
    recent: np.ndarray  # its last tokens: positions length - len(recent) .. length
    prompt_len: int | None  # None when started from a tail alone
    prompt_head: np.ndarray | None
    drafting: bool  # False: a token outside the vocabulary; root-only rows, no pool state


@dataclass
class _Layout:
    """The last ``batch_get``: its request ids and every request's padded tree."""

    req_ids: list[str]
    tokens: np.ndarray  # int64 [bs, N]
    parents: np.ndarray  # int64 [bs, N], -1 at the root, 0 for padding
    sizes: np.ndarray  # int64 [bs]: real (unpadded) nodes


def _window(prompt: Any, output: Any, start: int, stop: int) -> np.ndarray:
    """Tokens ``start..stop`` of the sequence ``prompt + output`` without joining the two."""
    cut = len(prompt)
    parts = []
    if start < cut:
        parts.append(int64_tokens(prompt[start : min(stop, cut)], "prompt_ids"))
    if stop > cut:
        parts.append(int64_tokens(output[max(start - cut, 0) : stop - cut], "output_ids"))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _accepted_path(layout: _Layout, b: int, accepted: Sequence[int]) -> list[int]:
    tokens, parents = layout.tokens[b], layout.parents[b]
    path, node = [0], 0
    for token in accepted:
        children = np.flatnonzero((parents == node) & (tokens == int(token)))
        children = children[children > node]
        if not len(children):
            break
        node = int(children[0])
        path.append(node)
    return path


class RacerCorpus:
    """SGLang's ``ngram_corpus`` interface over a :class:`racer_rs.DraftPool`.

    ``NGRAMWorker`` calls ``synchronize()`` then ``batch_get(req_ids, batch_tokens,
    total_lens)`` before every verify step, ``batch_put`` after it, ``erase_match_state`` with
    the ids that left the decode batch and ``reset`` on ``flush_cache``. The worker of this
    module also calls :meth:`sync` with each request's full token ids before ``batch_get`` and
    :meth:`observe_verify` after the verify.

    Args:
        draft_token_num: ``N``, nodes per request in ``batch_get``'s layout (root included).
        vocab_size: the model's vocabulary size; token ids outside ``[0, vocab_size)`` (e.g.
            multimodal placeholders) make a request draft nothing rather than fail.
        options: how to draft (default: ``$RACER_RS_OPTIONS``).
    """

    def __init__(self, draft_token_num: int, vocab_size: int, options: ServingOptions | None = None) -> None:
        draft_token_num = rules.integer("draft_token_num", draft_token_num, minimum=1, maximum=MAX_DRAFT_TOKENS)
        vocab_size = rules.integer("vocab_size", vocab_size, minimum=1, maximum=rules.MAX_TOKEN_ID)
        if options is not None and not isinstance(options, ServingOptions):
            raise InvalidTypeError(f"options must be a ServingOptions or None, got {type(options).__name__}")
        self.options = ServingOptions.from_env() if options is None else options
        self.draft_token_num = draft_token_num
        self.pool = self.options.pool(vocab_size)
        self.vocab_size = self.pool.vocab_size
        self._requests: dict[str, _Request] = {}
        self._last: _Layout | None = None
        n = draft_token_num
        # A root-only request: node 0 then padding (token 0, child of the root).
        self._root_only_mask = np.eye(n, dtype=bool)
        self._root_only_mask[:, 0] = True
        #: Counters: batch_get calls, requests started, restarted (sequence did not continue),
        #: dropped (erased), verify steps whose logits were written, and those skipped.
        self.stats = {
            "batches": 0,
            "started": 0,
            "restarted": 0,
            "erased": 0,
            "logit_steps": 0,
            "logit_skips": 0,
        }

    # -- state -----------------------------------------------------------------------------

    def __len__(self) -> int:
        """Requests the corpus holds."""
        return len(self._requests)

    def __contains__(self, rid: object) -> bool:
        return rid in self._requests

    def _drop(self, rid: str) -> None:
        self._requests.pop(rid, None)
        if rid in self.pool:
            self.pool.remove(rid)

    def _start(self, rid: str, sequence: np.ndarray, prompt_len: int | None, prompt_head: np.ndarray | None) -> None:
        """A fresh state for ``rid`` from ``sequence`` (its last token is the root, not indexed)."""
        if rid in self._requests:
            self._drop(rid)
            self.stats["restarted"] += 1
        self.stats["started"] += 1
        drafting = in_vocab(sequence, self.vocab_size)
        if drafting:
            self.pool.add(rid, sequence[:-1])
        self._requests[rid] = _Request(
            length=len(sequence),
            recent=sequence[-_RECENT:].copy(),
            prompt_len=prompt_len,
            prompt_head=prompt_head,
            drafting=drafting,
        )

    def _append(self, rid: str, state: _Request, new: np.ndarray) -> None:
        """Tokens ``new`` follow ``state``'s sequence: commit the old root and all but the new
        last token (the new root)."""
        if not len(new):
            return
        if state.drafting:
            if in_vocab(new, self.vocab_size):
                committed = np.concatenate([state.recent[-1:], new[:-1]])
                self.pool.extend([rid], [committed])
            else:
                self.pool.remove(rid)
                state.drafting = False
        state.length += len(new)
        state.recent = np.concatenate([state.recent, new])[-_RECENT:]

    @staticmethod
    def _agrees(state: _Request, start: int, tokens: np.ndarray) -> bool:
        """Whether ``tokens`` (positions ``start..``) agree with the end of ``state``'s
        sequence on every position both know, and overlap it."""
        known_from = state.length - len(state.recent)
        lo, hi = max(start, known_from), min(start + len(tokens), state.length)
        if lo >= hi:
            return False
        return bool(np.array_equal(tokens[lo - start : hi - start], state.recent[lo - known_from : hi - known_from]))

    def sync(self, rid: str, prompt_ids: Any, output_ids: Any) -> None:
        """Bring request ``rid``'s state up to its full sequence ``prompt_ids + output_ids``
        (the worker's hook: SGLang's ``req.origin_input_ids_unpadded`` and ``req.output_ids``).

        An unknown id starts a state indexing the whole sequence (its last token, the root, is
        drafted from). A known id whose sequence continues what the corpus has (same prompt,
        longer or equal, and the same tokens where they overlap) appends the new tokens; any
        other sequence under a known id (an id reused) restarts it.
        """
        total = len(prompt_ids) + len(output_ids)
        if total < 1:
            raise InvalidArgumentError(f"request {rid!r}: empty sequence")
        state = self._requests.get(rid)
        if state is not None and total >= state.length:
            head = state.prompt_head
            same_prompt = state.prompt_len is None or (
                state.prompt_len == len(prompt_ids)
                and head is not None
                and np.array_equal(_window(prompt_ids, (), 0, len(head)), head)
            )
            start = max(state.length - len(state.recent), 0)
            if same_prompt and self._agrees(state, start, _window(prompt_ids, output_ids, start, state.length)):
                self._append(rid, state, _window(prompt_ids, output_ids, state.length, total))
                if state.prompt_len is None:  # started from a tail: now the prompt is known
                    state.prompt_len = len(prompt_ids)
                    state.prompt_head = _window(prompt_ids, (), 0, min(len(prompt_ids), _RECENT))
                return
        head = _window(prompt_ids, (), 0, min(len(prompt_ids), _RECENT))
        self._start(rid, _window(prompt_ids, output_ids, 0, total), len(prompt_ids), head)

    def _sync_tail(self, rid: str, tail: np.ndarray, total: int) -> None:
        """``batch_get``'s view of a request: only its last tokens (``tail``, positions
        ``total - len(tail)..total``). Used as is when :meth:`sync` did not run first."""
        state = self._requests.get(rid)
        start = total - len(tail)
        if state is not None and total >= state.length and self._agrees(state, start, tail):
            first_new = state.length - start  # tail index of the first token the state lacks
            if first_new >= 0:
                self._append(rid, state, tail[first_new:])
                return
        self._start(rid, tail, None, None)

    # -- NGRAMWorker's corpus contract ------------------------------------------------------

    def synchronize(self) -> None:
        """Nothing to wait for: every write is synchronous."""

    def batch_get(
        self, req_ids: Sequence[str], batch_tokens: Sequence[Sequence[int]], total_lens: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """One draft tree per request in SGLang's padded layout.

        Args:
            req_ids: the batch's request ids (``req.rid``), in batch order.
            batch_tokens: each request's last tokens, ending with the root (the last
                sampled token), as ``NGRAMWorker._prepare_draft_tokens`` builds them.
            total_lens: each request's full sequence length (the one ``batch_tokens[i]`` ends).

        Returns:
            ``(tokens, mask)``: ``int64[bs * N]`` (node 0 of each request its root, then its
            tree in BFS order, padded with token 0 under the root) and ``bool[bs * N * N]``,
            row-major ``[bs, N, N]``, true where node ``j`` is node ``i`` or its ancestor.

        Raises:
            InvalidArgumentError: if the three lists differ in length or a tail is empty.
        """
        bs, n = len(req_ids), self.draft_token_num
        if len(batch_tokens) != bs or len(total_lens) != bs:
            raise InvalidArgumentError(
                f"batch_get: req_ids, batch_tokens and total_lens must have one entry per request, "
                f"got {bs}, {len(batch_tokens)} and {len(total_lens)}"
            )
        tails = []
        for i, (rid, given, total) in enumerate(zip(req_ids, batch_tokens, total_lens, strict=True)):
            array = int64_tokens(given, f"batch_tokens[{i}] ({rid!r})")
            if not len(array):
                raise InvalidArgumentError(f"batch_tokens[{i}] ({rid!r}): empty token tail")
            total = rules.integer(f"total_lens[{i}] ({rid!r})", total, minimum=1)
            if total < len(array):
                raise InvalidArgumentError(f"total_lens[{i}] ({rid!r}): {total} is shorter than its tail")
            self._sync_tail(rid, array, total)
            tails.append(array)
        tokens = np.zeros((bs, n), dtype=np.int64)
        mask = np.empty((bs, n, n), dtype=bool)
        mask[:] = self._root_only_mask
        parents = np.zeros((bs, n), dtype=np.int64)
        parents[:, 0] = -1
        sizes = np.ones(bs, dtype=np.int64)
        for b, tail in enumerate(tails):
            tokens[b, 0] = tail[-1]
        rows = [b for b, rid in enumerate(req_ids) if self._requests[rid].drafting]
        if rows:
            draft = self.pool.propose([req_ids[b] for b in rows], tokens[rows, 0], n)
            flat_tokens, flat_mask = draft.sglang(n)
            tokens[rows] = flat_tokens.reshape(len(rows), n)
            mask[rows] = flat_mask.reshape(len(rows), n, n)
            counts, offsets, local = draft.counts, draft.offsets, draft.parents
            for j, b in enumerate(rows):
                m = int(counts[j])
                parents[b, :m] = local[offsets[j] : offsets[j] + m]
                sizes[b] = m
        self._last = _Layout(list(req_ids), tokens, parents, sizes)
        self.stats["batches"] += 1
        every = self.options.log_every
        if every and self.stats["batches"] % every == 0:
            logger.info("racer_rs corpus: %s (%d requests)", self.stats, len(self._requests))
        return tokens.reshape(-1), mask.reshape(-1)

    def batch_put(self, batch_tokens: Sequence[Sequence[int]]) -> None:
        """Nothing: RACER indexes each request's own sequence (from :meth:`sync`, or from the
        tails ``batch_get`` receives), not a corpus shared by all requests."""

    def erase_match_state(self, req_ids: Sequence[str]) -> None:
        """Forget the requests ``req_ids`` (those that left the decode batch); unknown ids are
        ignored. Their ids, if reused, start fresh."""
        for rid in req_ids:
            if rid in self._requests:
                self._drop(rid)
                self.stats["erased"] += 1

    def reset(self) -> None:
        """Forget every request (SGLang's ``flush_cache``)."""
        self.pool.clear()
        self._requests.clear()
        self._last = None

    def load_external_corpus_named(self, corpus_id: str, chunks: Any) -> int:
        raise UnsupportedError(
            f"{ALGORITHM} has no external corpus (an NGRAM feature); use --speculative-algorithm NGRAM"
        )

    def commit_external_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        self.load_external_corpus_named(corpus_id, ())

    def remove_external_corpus(self, corpus_id: str) -> None:
        self.load_external_corpus_named(corpus_id, ())

    def list_external_corpora(self) -> dict[str, int]:
        self.load_external_corpus_named("", ())
        return {}

    # -- the verify outcome -----------------------------------------------------------------

    def accepted_path(self, b: int, accepted: Sequence[int]) -> list[int]:
        """Request ``b``'s accepted node indices in the last ``batch_get`` layout, found as
        SGLang's greedy verification walks the tree: from the root, the smallest-index child
        whose token is the next accepted token, stopping where there is none.

        Raises:
            StateError: if no layout is pending (``batch_get`` not called since the last verify).
        """
        if self._last is None:
            raise StateError("accepted_path: no batch_get layout is pending")
        return _accepted_path(self._last, b, accepted)

    def observe_verify(
        self,
        req_ids: Sequence[str],
        committed: Sequence[Sequence[int] | np.ndarray],
        topk_ids: np.ndarray,
        topk_probs: np.ndarray | None = None,
    ) -> bool:
        """Write the verify step's copy-logit rows.

        Args:
            req_ids: the verified batch's request ids (must be the last ``batch_get``'s).
            committed: per request, the tokens the step committed: the accepted drafts, then
                the bonus token (SGLang's ``next_token_ids.view(bs, N)[i, :accept_lens[i]]``).
            topk_ids: ``[bs * N, breadth]`` top-k ids of the verify logits; row ``b * N + t``
                is the target's prediction after node ``t`` of request ``b``.
            topk_probs: their probabilities (scored trees), same shape, or ``None``.

        Returns:
            Whether rows were written (False when the batch is not the last layout's).
        """
        last, n = self._last, self.draft_token_num
        self._last = None
        if last is None or list(req_ids) != last.req_ids or len(committed) != len(req_ids):
            self.stats["logit_skips"] += 1
            return False
        breadth = self.pool.breadth
        if topk_ids.shape != (len(req_ids) * n, breadth):
            want = [len(req_ids) * n, breadth]
            raise InvalidArgumentError(f"topk_ids must have shape [bs * N, breadth] {want}, got {list(topk_ids.shape)}")
        written, tokens, at = [], [], []
        for b, rid in enumerate(req_ids):
            state = self._requests.get(rid)
            if state is None or not state.drafting:
                continue
            path = _accepted_path(last, b, list(committed[b])[:-1])
            order = copy_logit_order(int(last.sizes[b]), path)
            if not in_vocab(topk_ids[b * n + order], self.vocab_size):
                continue
            written.append(rid)
            tokens.append(last.tokens[b, order])
            at.append(b * n + order)
        if written:  # every request's rows in one call
            rows = np.concatenate(at)
            probs = None if topk_probs is None else np.clip(topk_probs[rows], 0.0, 1.0)
            lengths = np.asarray([len(t) for t in tokens], dtype=np.int64)
            self.pool.update_topk_many(written, np.concatenate(tokens), topk_ids[rows], lengths, probs)
        self.stats["logit_steps"] += 1
        return True


# ---------------------------------------------------------------------------------------------
# Server arguments.

_DEVICES = ("cuda", "cpu", "xpu")


def resolve_server_args(server_args: Any) -> None:
    """Fill the n-gram path's settings and check every argument ``RACER_RS`` depends on.

    ``server_args`` is SGLang's stand-in during resolution (reads see what is resolved so
    far, assignments are recorded). Like ``NGRAM``'s own resolution it defaults
    ``--speculative-num-draft-tokens`` to 12 and ``--max-running-requests`` to 48, turns
    mixed chunked prefill off and sets ``speculative_eagle_topk`` to
    ``--speculative-ngram-max-bfs-breadth`` (which sizes the verify KV reservation).

    Raises:
        InvalidArgumentError: one line listing every problem, e.g. overlap scheduling on.
    """

    def get(name: str, default: Any = None) -> Any:
        return getattr(server_args, name, default)

    if get("max_running_requests") is None:
        server_args.max_running_requests = 48
    server_args.enable_mixed_chunk = False
    if get("speculative_num_draft_tokens") is None:
        server_args.speculative_num_draft_tokens = 12
    breadth = get("speculative_ngram_max_bfs_breadth", 10)
    server_args.speculative_eagle_topk = breadth
    draft_tokens = get("speculative_num_draft_tokens")
    problems = []
    if not get("disable_overlap_schedule", False):
        problems.append(
            "overlap scheduling must be off: pass --disable-overlap-schedule (RACER_RS drafts from the "
            "committed tokens and reads the verify logits synchronously)"
        )
    device = get("device")
    if device is not None and device not in _DEVICES:
        problems.append(f"--device must be one of {', '.join(_DEVICES)} (as for NGRAM), got {device!r}")
    if not isinstance(draft_tokens, int) or isinstance(draft_tokens, bool) or not 1 <= draft_tokens <= MAX_DRAFT_TOKENS:
        problems.append(f"--speculative-num-draft-tokens must be in 1..{MAX_DRAFT_TOKENS}, got {draft_tokens!r}")
    if not isinstance(breadth, int) or breadth < 1:
        problems.append(f"--speculative-ngram-max-bfs-breadth must be >= 1, got {breadth!r}")
    if get("speculative_ngram_external_corpus_path") is not None:
        problems.append("--speculative-ngram-external-corpus-path is an NGRAM feature; RACER_RS has no external corpus")
    if get("enable_dp_attention", False):
        problems.append("--enable-dp-attention is not supported (as for NGRAM)")
    if get("speculative_adaptive", False):
        problems.append("--speculative-adaptive is not supported")
    page_size, backend = get("page_size"), get("attention_backend")
    if isinstance(breadth, int) and breadth > 1 and page_size is not None and page_size > 1 and backend != "flashinfer":
        problems.append(
            f"page size {page_size} > 1 with tree drafts (speculative_eagle_topk {breadth} > 1) needs "
            "--attention-backend flashinfer (as for NGRAM), or --page-size 1"
        )
    try:
        ServingOptions.from_env()
    except RacerError as exc:
        problems.append(str(exc))
    if problems:
        raise InvalidArgumentError(f"--speculative-algorithm {ALGORITHM}: {'; '.join(problems)}")
    if get("speculative_num_steps") is None:
        server_args.speculative_num_steps = max(1, draft_tokens // breadth)


# ---------------------------------------------------------------------------------------------
# The engine-facing classes, built on first use (they subclass SGLang's).

_CLASSES: dict[str, type] = {}


def algorithm_class() -> type:
    """The ``CustomSpecAlgo`` subclass ``RACER_RS`` is registered with.

    ``is_ngram()`` is True, so every n-gram branch of the scheduler and model runner applies;
    it also defines the methods SGLang 0.5.23's scheduler calls on any algorithm that the
    base ``CustomSpecAlgo`` lacks (``create_future_map``, ``carries_draft_hidden_states``,
    ``need_topk``, ``get_platform_worker_cls``).
    """
    if "algorithm" not in _CLASSES:
        _require_sglang()
        from sglang.srt.speculative.spec_info import CustomSpecAlgo, SpeculativeAlgorithm

        class RacerRsAlgorithm(CustomSpecAlgo):  # type: ignore[misc]  # SGLang is untyped here
            """``RACER_RS``: NGRAM's paths, RACER's drafts."""

            create_future_map = SpeculativeAlgorithm.create_future_map

            def is_ngram(self) -> bool:
                return True

            def has_draft_kv(self) -> bool:
                return False

            def need_topk(self) -> bool:
                return False

            def carries_draft_hidden_states(self) -> bool:
                return False

            def get_platform_worker_cls(self) -> None:
                return None

            def handle_server_args(self, server_args: Any) -> None:
                resolve_server_args(server_args)

        _CLASSES["algorithm"] = RacerRsAlgorithm
    return _CLASSES["algorithm"]


def _wrap_target_worker(worker: Any, breadth: int, with_probs: bool) -> None:
    """Wrap ``worker``'s target worker's ``forward_batch_generation`` on the instance: after a
    verify forward, keep the top-k of its logits (``[bs * N, vocab]``, read before
    ``eagle_sample`` adds penalties or grammar masks in place, and copied out of any CUDA-graph
    buffer the next replay reuses)."""
    target = worker._target_worker
    original = target.forward_batch_generation
    owner = weakref.ref(worker)

    def forward_batch_generation(batch: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(batch, *args, **kwargs)
        is_verify = kwargs.get("is_verify", args[2] if len(args) > 2 else False)
        racer = owner()
        logits = getattr(result.logits_output, "next_token_logits", None) if is_verify else None
        if racer is not None and logits is not None:
            racer._racer_verify_topk = topk_rows(logits, breadth, with_probs)
        return result

    forward_batch_generation.__wrapped__ = original  # type: ignore[attr-defined]
    target.forward_batch_generation = forward_batch_generation


def worker_class() -> type:
    """``RacerRsWorker``: SGLang's ``NGRAMWorker`` drafting from a :class:`RacerCorpus`.

    Overrides (each calls the ``NGRAMWorker`` method it extends):

    - ``__init__``: swaps ``self.ngram_corpus`` for a :class:`RacerCorpus` (the model's
      vocabulary, ``--speculative-num-draft-tokens``, ``$RACER_RS_OPTIONS``) and wraps the
      target worker's ``forward_batch_generation`` to keep the verify logits' top-k;
    - ``_prepare_draft_tokens(batch)``: first :meth:`RacerCorpus.sync` for every request of
      the batch with its full token ids (``req.origin_input_ids_unpadded`` +
      ``req.output_ids``);
    - ``forward_batch_generation(batch, ...)``: after a verify step, reads the committed
      tokens (``result.next_token_ids``, ``result.accept_lens``) and calls
      :meth:`RacerCorpus.observe_verify` (a host read, fine with overlap scheduling off).
    """
    if "worker" not in _CLASSES:
        _require_sglang()
        from sglang.srt.speculative.ngram_worker import NGRAMWorker

        class RacerRsWorker(NGRAMWorker):  # type: ignore[misc]  # SGLang is untyped here
            """SGLang's n-gram worker with RACER's drafts."""

            def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
                super().__init__(server_args, gpu_id, nccl_port, target_worker)
                vocab_size = int(self.model_runner.model_config.vocab_size)
                options = ServingOptions.from_env()
                options.check(vocab_size)  # the options against the model, naming the variable
                corpus = RacerCorpus(int(self.draft_token_num), vocab_size, options)
                self.ngram_corpus = corpus
                self._racer_verify_topk: tuple[Any, Any] | None = None
                if corpus.pool.use_logits:
                    _wrap_target_worker(self, corpus.pool.breadth, corpus.pool.tree == "scored")

            def _prepare_draft_tokens(self, batch: Any) -> Any:
                corpus: RacerCorpus = self.ngram_corpus
                for req in batch.reqs:
                    corpus.sync(req.rid, req.origin_input_ids_unpadded, req.output_ids)
                return super()._prepare_draft_tokens(batch)

            def forward_batch_generation(self, batch: Any, on_publish: Any = None, pp_proxy_tensors: Any = None) -> Any:
                self._racer_verify_topk = None
                req_ids = [req.rid for req in batch.reqs]
                result = super().forward_batch_generation(
                    batch, on_publish=on_publish, pp_proxy_tensors=pp_proxy_tensors
                )
                captured, self._racer_verify_topk = self._racer_verify_topk, None
                if captured is not None and result.accept_lens is not None and req_ids:
                    feed_verify_result(self.ngram_corpus, req_ids, result, captured)
                return result

        _CLASSES["worker"] = RacerRsWorker
    return _CLASSES["worker"]


def feed_verify_result(corpus: RacerCorpus, req_ids: list[str], result: Any, captured: tuple[Any, Any]) -> bool:
    """Hand a verify step's outcome to :meth:`RacerCorpus.observe_verify`.

    Args:
        corpus: the worker's corpus.
        req_ids: the verified batch's request ids, in batch order.
        result: SGLang's ``GenerationBatchResult`` of the step: ``accept_lens`` (``int32[bs]``,
            the bonus included) and ``next_token_ids`` (``int32[bs * N]``, per request the
            accepted drafts then the bonus, padding after).
        captured: the wrapped target worker's ``(topk_ids, topk_probs)`` of the verify logits.
    """
    bs, n = len(req_ids), corpus.draft_token_num
    ids, probs = captured
    if ids.shape[0] != bs * n:
        corpus.stats["logit_skips"] += 1
        return False
    accept = np.asarray(result.accept_lens.cpu()).reshape(-1)
    committed_all = np.asarray(result.next_token_ids.cpu()).reshape(bs, -1)
    committed = [committed_all[b, : int(accept[b])] for b in range(bs)]
    return corpus.observe_verify(
        req_ids,
        committed,
        np.asarray(ids.cpu()),
        None if probs is None else np.asarray(probs.cpu()),
    )


def _worker_factory(server_args: Any) -> type:
    """The registered factory: SGLang instantiates the class it returns."""
    return worker_class()


def register() -> None:
    """Register ``RACER_RS`` with SGLang (idempotent).

    SGLang's plugin loader calls this in every process through the entry point
    ``racer_rs = "racer_rs.integrations.sglang:register"`` of the group
    ``sglang.srt.plugins``; it imports only SGLang's algorithm registry.

    Raises:
        MissingDependencyError: if SGLang is not installed (the ``sglang`` extra).
        StateError: if another plug-in already registered the name.
    """
    _require_sglang()
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    spec_class = algorithm_class()
    existing = get_spec(ALGORITHM)
    if existing is not None:
        if not isinstance(existing, spec_class):
            raise StateError(f"speculative algorithm {ALGORITHM} is already registered by {type(existing).__module__}")
        return
    SpeculativeAlgorithm.register(ALGORITHM, supports_overlap=False, spec_class=spec_class)(_worker_factory)
