"""``suffix`` / ``suffix_chain``: SuffixDecoding (Oliaro et al., 2024) through Snowflake
ArcticInference's C++ suffix trees (``arctic_inference.suffix_decoding``, the ``suffix`` extra).

One :class:`~arctic_inference.suffix_decoding.SuffixDecodingCache` per drafter holds a suffix
tree of every request's prompt (for that request only) and one global suffix tree of the
responses of past and active requests (FIFO-evicted beyond ``max_cached_requests``), so the
method learns across requests: the tree is never reset between requests.

The cache is driven the way vLLM's ``SuffixDecodingProposer``
(``vllm/v1/spec_decode/suffix_decoding.py``, vLLM 0.33.0) drives it, with its defaults
(``vllm/config/speculative.py``: ``suffix_decoding_max_tree_depth=24``,
``suffix_decoding_max_cached_requests=10000``, ``suffix_decoding_max_spec_factor=1.0``,
``suffix_decoding_min_token_prob=0.1``):

- a request's first draft starts it: ``start_request(req_id, prompt)``;
- before every draft, the tokens the target produced since the last draft, up to and including
  the newest one (our ``next_token``), are appended: ``add_active_response(req_id, tokens)``
  (vLLM appends a step's sampled tokens, bonus included, then speculates);
- ``speculate(req_id, pattern, max_spec_tokens, max_spec_factor, min_token_prob)`` with the
  pattern = the last ``max_tree_depth`` tokens of the sequence, the newest one included, so
  the draft continues AFTER ``next_token``;
- the request's end stops it: ``stop_request(req_id)`` (always, also when the request fails).

Where vLLM differs from what we can do: vLLM has no tree verification and never passes
``use_tree_spec`` (the cache's default, ``False``: one path), nor ``max_spec_offset``
(default ``0.0``). ``suffix_chain`` is that exact configuration; ``suffix`` sets
``use_tree_spec=True``, ArcticInference's own tree speculation (the default of its simulator),
verified by our engine in one forward. vLLM caps ``max_spec_tokens`` at
``num_speculative_tokens`` (default ``max_tree_depth``); here it is the step's capacity minus
the root. With ``max_spec_factor=1`` that changes nothing: the library drafts at most
``max_spec_factor * match_len + max_spec_offset`` tokens and matches at most
``max_tree_depth - 1`` pattern tokens.

A draft's ``parents`` index earlier draft tokens, ``-1`` meaning the end of the matched
context (our root, ``next_token``); tree drafts come best first (by estimated probability),
not breadth first, and are reordered here. ``global_tree=False`` (the local-only ablation)
builds the cache with ``max_cached_requests=0``, the library's switch for "no global tree,
prompt trees only" (a request's own tree then holds its prompt and its response so far).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import Any

import numpy as np

from racer_rs import _validate as rules
from racer_rs._native import DraftTree
from racer_rs.drafters.base import Drafter, Proposal, RequestStart, StepOutcome
from racer_rs.errors import InvalidArgumentError, StateError
from racer_rs.optional_deps import require

# vLLM 0.33.0's defaults (vllm/config/speculative.py, SpeculativeConfig.suffix_decoding_*) and
# SuffixDecodingCache.speculate's default max_spec_offset (vLLM does not pass it).
MAX_TREE_DEPTH = 24
MAX_CACHED_REQUESTS = 10_000
MAX_SPEC_FACTOR = 1.0
MAX_SPEC_OFFSET = 0.0
MIN_TOKEN_PROB = 0.1


def draft_to_tree(next_token: int, token_ids: Any, parents: Any, capacity: int) -> DraftTree:
    """Our BFS :class:`DraftTree` for a SuffixDecoding draft rooted at ``next_token``.

    Args:
        next_token: the root (the last token of the matched pattern).
        token_ids: the draft's tokens.
        parents: each token's parent: an index of an EARLIER draft token, or ``-1`` for a child
            of the root (ArcticInference's convention).
        capacity: the most nodes, root included (>= 1); the longest prefix of the draft that
            fits is kept (drafts come best first, parents before children, so a prefix is a
            tree; the library drafts at most ``capacity - 1`` tokens when asked for them).

    Siblings carrying the same token (the library never produces them, as suffix-tree children
    start with distinct tokens) are merged, their subtrees united. Children keep the draft's
    order (best first), so a node's rank among its siblings follows the estimated probability.

    Raises:
        InvalidArgumentError: the arrays disagree in length or a parent does not precede its child.
    """
    tokens = [int(t) for t in token_ids]
    links = [int(p) for p in parents]
    if len(tokens) != len(links):
        raise InvalidArgumentError(f"draft has {len(tokens)} tokens but {len(links)} parents")
    # Merge equal siblings: draft index -> our node; our node -> its children in draft order.
    node_of: list[int] = []
    children: list[list[int]] = [[]]
    node_tokens = [int(next_token)]
    child_by_token: dict[tuple[int, int], int] = {}
    for index, (token, parent) in enumerate(zip(tokens, links, strict=False)):
        if not -1 <= parent < index:
            raise InvalidArgumentError(f"draft token {index} has parent {parent}: parents must precede children")
        parent_node = 0 if parent == -1 else node_of[parent]
        node = child_by_token.get((parent_node, token))
        if node is None:
            if len(node_tokens) >= capacity:
                break  # the kept nodes stay a prefix of the draft, hence a tree
            node = len(node_tokens)
            node_tokens.append(token)
            children.append([])
            children[parent_node].append(node)
            child_by_token[(parent_node, token)] = node
        node_of.append(node)
    if len(node_tokens) == 1:
        return DraftTree.chain([int(next_token)])
    # Breadth-first renumbering (children in draft order).
    order: list[int] = []
    queue = deque([0])
    while queue:
        node = queue.popleft()
        order.append(node)
        queue.extend(children[node])
    position = {node: i for i, node in enumerate(order)}
    bfs_parents = [-1] * len(order)
    for node, kids in enumerate(children):
        for kid in kids:
            bfs_parents[position[kid]] = position[node]
    bfs_tokens = [node_tokens[node] for node in order]
    if all(bfs_parents[i] == i - 1 for i in range(1, len(order))):
        return DraftTree.chain(bfs_tokens)
    return DraftTree(np.asarray(bfs_tokens, dtype=np.int32), np.asarray(bfs_parents, dtype=np.int32))


class _Request:
    """One thread's open request: its cache id and how many response tokens the cache holds."""

    def __init__(self, req_id: int, prompt_length: int) -> None:
        self.req_id = req_id
        self.prompt_length = prompt_length
        self.added = 0  # response tokens appended so far (the last draft's root included)


class SuffixDrafter(Drafter):
    """SuffixDecoding on ArcticInference's ``SuffixDecodingCache``.

    Args:
        model: unused.
        max_tree_depth: depth of the prompt and global suffix trees; also the pattern length
            (vLLM: ``suffix_decoding_max_tree_depth``, default 24).
        max_cached_requests: responses kept in the global tree, FIFO-evicted beyond it
            (vLLM: ``suffix_decoding_max_cached_requests``, default 10000); must be >= 1
            unless ``global_tree=False``.
        max_spec_factor: at most ``max_spec_factor * match_length + max_spec_offset`` tokens
            are drafted (vLLM: ``suffix_decoding_max_spec_factor``, default 1.0).
        max_spec_offset: see ``max_spec_factor`` (vLLM does not set it: the library's 0.0).
        min_token_prob: drafted tokens need an estimated probability (from the tree's counts)
            of at least this (vLLM: ``suffix_decoding_min_token_prob``, default 0.1).
        use_tree_spec: draft a tree (ArcticInference's best-first tree speculation) instead of
            one path (vLLM's behaviour).
        global_tree: cache every response in the global tree, so requests learn from earlier
            ones; ``False`` keeps each request's own tree only (prompt and response so far).
        name: the method name reported in results.

    Raises:
        MissingDependencyError: ``arctic_inference`` is not installed (the ``suffix`` extra).
    """

    name = "suffix"

    def __init__(
        self,
        model: Any = None,
        max_tree_depth: int = MAX_TREE_DEPTH,
        max_cached_requests: int = MAX_CACHED_REQUESTS,
        max_spec_factor: float = MAX_SPEC_FACTOR,
        max_spec_offset: float = MAX_SPEC_OFFSET,
        min_token_prob: float = MIN_TOKEN_PROB,
        use_tree_spec: bool = True,
        global_tree: bool = True,
        *,
        name: str = "suffix",
    ) -> None:
        del model
        self.name = name
        require("suffix", f"method {name!r} (SuffixDecoding)")
        self.max_tree_depth = rules.integer("max_tree_depth", max_tree_depth, minimum=1)
        self.max_cached_requests = rules.integer("max_cached_requests", max_cached_requests, minimum=0)
        self.max_spec_factor = rules.real("max_spec_factor", max_spec_factor, minimum=0.0)
        self.max_spec_offset = rules.real("max_spec_offset", max_spec_offset)
        self.min_token_prob = rules.probability("min_token_prob", min_token_prob)
        self.use_tree_spec = rules.flag("use_tree_spec", use_tree_spec)
        self.global_tree = rules.flag("global_tree", global_tree)
        if self.global_tree and self.max_cached_requests == 0:
            raise InvalidArgumentError("max_cached_requests=0 disables the global tree: pass global_tree=False instead")
        if self.max_cached_requests > 0x7FFFFFFF:
            raise InvalidArgumentError(f"max_cached_requests must be at most 2**31 - 1, got {self.max_cached_requests}")

        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(
            max_tree_depth=self.max_tree_depth,
            max_cached_requests=self.max_cached_requests if self.global_tree else 0,
        )
        self._ids = itertools.count()
        # The cache's Python bookkeeping (dicts of requests and sequence ids) is not atomic:
        # requests of several threads sharing this drafter take turns on it.
        self._lock = threading.Lock()
        # Each thread's current request (concurrent requests share the cache, not their ids).
        self._thread_state = threading.local()

    def _per_thread(self) -> threading.local:
        return self._thread_state

    @property
    def learns_across_requests(self) -> bool:
        """True with the global tree: responses of earlier requests serve later ones."""
        return self.global_tree

    @property
    def mode(self) -> str:
        """``"tree"`` or ``"chain"``."""
        return "tree" if self.use_tree_spec else "chain"

    # --- Drafter hooks -------------------------------------------------------------------------

    def begin(self, request: RequestStart) -> None:
        """Start the request in the cache (a fresh id; its prompt gets its own suffix tree)."""
        state = self._per_thread()
        if getattr(state, "request", None) is not None:
            self.end()  # a request of this thread that was never ended
        prompt = np.ascontiguousarray(request.prompt_ids, dtype=np.int32)
        with self._lock:
            req_id = next(self._ids)
            self.cache.start_request(req_id, prompt)
        state.request = _Request(req_id, len(prompt))

    def propose(self, context: np.ndarray, next_token: int, capacity: int) -> Proposal:
        """Append the new response tokens (``next_token`` last), then speculate from the last
        ``max_tree_depth`` tokens and map the draft to a tree rooted at ``next_token``."""
        request = self._request()
        pending = context[request.prompt_length + request.added :]
        tokens = np.append(pending, np.int32(next_token)).astype(np.int32, copy=False)
        tail = context[max(0, len(context) - (self.max_tree_depth - 1)) :]
        pattern = np.append(tail, np.int32(next_token)).astype(np.int32, copy=False)
        with self._lock:
            self.cache.add_active_response(request.req_id, tokens)
            request.added += len(tokens)
            if capacity < 2:
                return Proposal(DraftTree.chain([next_token]))
            draft = self.cache.speculate(
                request.req_id,
                pattern,
                max_spec_tokens=capacity - 1,
                max_spec_factor=self.max_spec_factor,
                max_spec_offset=self.max_spec_offset,
                min_token_prob=self.min_token_prob,
                use_tree_spec=self.use_tree_spec,
            )
        return Proposal(draft_to_tree(next_token, draft.token_ids, draft.parents, capacity))

    def observe(self, outcome: StepOutcome) -> None:
        """Append the step's committed tokens that the cache does not hold yet (all but the
        root, which the draft already appended)."""
        request = self._request()
        skip = request.added - int(outcome.position)
        new = np.ascontiguousarray(outcome.committed[max(0, skip) :], dtype=np.int32)
        if new.size:
            with self._lock:
                self.cache.add_active_response(request.req_id, new)
            request.added += int(new.size)

    def end(self) -> None:
        """Stop the request (its prompt tree is dropped; its response stays in the global tree)."""
        state = self._per_thread()
        request = getattr(state, "request", None)
        if request is None:
            return
        state.request = None
        with self._lock:
            self.cache.stop_request(request.req_id)

    def stats(self) -> dict[str, Any]:
        """The mode, whether the global tree learns across requests, and the cache's size."""
        with self._lock:
            cached = len(self.cache.cached_requests)
        return {
            "mode": self.mode,
            "global_tree": self.global_tree,
            "learns_across_requests": self.global_tree,
            "cached_requests": cached,
            "max_tree_depth": self.max_tree_depth,
        }

    def _request(self) -> _Request:
        request: _Request | None = getattr(self._per_thread(), "request", None)
        if request is None:
            raise StateError(f"drafter {self.name!r}: begin() must be called before propose()/observe()")
        return request


def suffix(
    model: Any = None,
    max_tree_depth: int = MAX_TREE_DEPTH,
    max_cached_requests: int = MAX_CACHED_REQUESTS,
    max_spec_factor: float = MAX_SPEC_FACTOR,
    max_spec_offset: float = MAX_SPEC_OFFSET,
    min_token_prob: float = MIN_TOKEN_PROB,
    global_tree: bool = True,
) -> SuffixDrafter:
    """SuffixDecoding with tree speculation (the registry's ``suffix``)."""
    return SuffixDrafter(
        model,
        max_tree_depth,
        max_cached_requests,
        max_spec_factor,
        max_spec_offset,
        min_token_prob,
        use_tree_spec=True,
        global_tree=global_tree,
    )


def suffix_chain(
    model: Any = None,
    max_tree_depth: int = MAX_TREE_DEPTH,
    max_cached_requests: int = MAX_CACHED_REQUESTS,
    max_spec_factor: float = MAX_SPEC_FACTOR,
    max_spec_offset: float = MAX_SPEC_OFFSET,
    min_token_prob: float = MIN_TOKEN_PROB,
    global_tree: bool = True,
) -> SuffixDrafter:
    """SuffixDecoding with one drafted path, exactly vLLM's configuration (the registry's
    ``suffix_chain``)."""
    return SuffixDrafter(
        model,
        max_tree_depth,
        max_cached_requests,
        max_spec_factor,
        max_spec_offset,
        min_token_prob,
        use_tree_spec=False,
        global_tree=global_tree,
        name="suffix_chain",
    )
