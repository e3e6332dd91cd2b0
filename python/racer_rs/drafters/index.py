"""Cross-request memory for the racer methods: a shared index read by every request.

A request's own automaton indexes its prompt and its response so far, and is emptied when the
next request starts (unless ``persistent``). A *shared index* is a second
:class:`~racer_rs.Automaton` that every request drafts from as well
(``build_draft_tree(..., shared=...)``): the responses of earlier requests (learned as each
request ends), a corpus built ahead of time (``racer index build``), or both. It never holds
per-request state: drafting only reads it (and refreshes the LRU recency of the nodes it used),
so requests on any number of threads may share one, and a request's own automaton stays clean.

What a finished request writes into it (``learn=True``): its response, preceded by the last
``ngram - 1`` prompt tokens (the index's ``ngram``) as a lead-in, as one sequence (``extend`` + ``new_sequence``, made
atomic by one lock, so two requests ending at once never splice their responses). The lead-in
is the end of the prompt, in a chat the template's assistant header, so the next response's
opening can be drafted from the same header. The rest of the prompt is not learned, as in
SuffixDecoding's global tree (responses only): the request's own automaton already indexes
its prompt, so indexing prompts again serves only later requests that repeat an earlier
request's prompt text in their answers; prompts (long documents, files, RAG contexts) are
usually far longer than the answers and would evict the answers under the LRU budget; and the
text a model produces again is its own output (phrasing, code it wrote), not the user's input.

Where the index comes from (the ``index`` option):

- ``"memory"``: an in-memory index, empty at first. With ``index_scope="process"`` (the
  default) there is one per (model, method, ``ngram``, ``min_depth``, ``index_max_nodes``) in
  the process, so every drafter built for that model and method, e.g. by successive
  ``generate(model, ..., method="racer", index="memory")`` calls, shares it and learns across
  requests. Its node budget is ``index_max_nodes`` (default :data:`INDEX_MAX_NODES`, LRU
  eviction beyond it; an automaton grows to about 110 bytes a node, only as it fills).
- a path (``str`` or ``os.PathLike``): a file written by ``Automaton.save`` (``racer index
  build``), loaded once per process and path (and reloaded if the file changes) and shared like
  ``"memory"``. What it learns stays in memory; the file is never written. The file keeps its
  own ``ngram``, ``min_depth`` and node budget.
- an :class:`~racer_rs.Automaton`: used as it is (the caller may share it, save it, ...).

``index_scope="drafter"`` gives the drafter an index of its own instead: an empty one for
``"memory"``, a fresh load of the file, a copy of the automaton. It lives as long as the
drafter (one drafter reused across requests learns across them) and nothing else sees it:
``racer bench`` uses it so that every setting, and the warm-up, start from the same index. In
:func:`racer_rs.generate_batch` it is the call's: every row reads it (the pooled methods in
their one ``DraftPool.propose`` call) and a finished row's response serves the rows admitted
after it, as SuffixDecoding's global tree serves later requests; the next call starts afresh.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from racer_rs import _validate as rules
from racer_rs._io import file_identity
from racer_rs._native import Automaton
from racer_rs.errors import InvalidArgumentError, InvalidTypeError

#: ``index="memory"``: an in-memory index.
MEMORY = "memory"
#: Default node budget of an in-memory index (about 110 MB when full; memory grows as it fills).
INDEX_MAX_NODES = 1_000_000
#: ``index_scope`` values.
SCOPES = ("process", "drafter")
#: A learning index's ``learning_state`` (what ``racer bench`` records per method).
LEARNS_INTO_INDEX = "shared index: learns across requests"
#: A read-only index's.
READ_ONLY_INDEX = "shared index: read only"

# Every learned response is one extend + new_sequence under this lock, so that two requests
# ending at once cannot interleave their tokens in one sequence. It is held only around those
# two calls (the Rust core takes the automaton's own write lock inside them and never waits
# for a Python lock), so it cannot deadlock with drafting.
_LEARN_LOCK = threading.Lock()
_REGISTRY_LOCK = threading.Lock()
# index="memory", index_scope="process": per model (weakly: a model's indexes go with it), per
# (method, ngram, min_depth, max_nodes). Models that cannot be weakly referenced share _NO_MODEL's.
_MEMORY: weakref.WeakKeyDictionary[Any, dict[tuple[str, int, int, int], Automaton]] = weakref.WeakKeyDictionary()
_NO_MODEL: dict[tuple[str, int, int, int], Automaton] = {}
# A path, index_scope="process": (resolved path, *file_identity) -> the loaded automaton (size,
# mtime, ctime, inode and device: a replaced file is reloaded even with its old mtime restored).
_FILES: dict[tuple[str | int, ...], Automaton] = {}


def check_index(value: Any) -> Any:
    """``value`` as an ``index`` option: ``None``, ``"memory"``, a path or an Automaton.

    Raises:
        InvalidTypeError: another type.
        InvalidArgumentError: an empty path.
    """
    if value is None or isinstance(value, Automaton):
        return value
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise InvalidTypeError(
            f"index must be None, 'memory', a path to a saved index or an Automaton, got {type(value).__name__}"
        )
    if not value.strip():
        raise InvalidArgumentError("index: empty path")
    return value


@dataclass(frozen=True)
class SharedIndex:
    """A drafter's view of its shared index.

    Attributes:
        automaton: the index itself (pass it as ``build_draft_tree(..., shared=...)``).
        source: where it came from: ``"memory"``, the file's path, or ``"automaton"`` (given).
        learn: whether finished responses are written into it.
        scope: ``"process"`` or ``"drafter"`` (see the module docstring).
        lead_in: prompt tokens learned before each response (the index's ``ngram - 1``).
    """

    automaton: Automaton
    source: str
    learn: bool
    scope: str
    lead_in: int

    def learn_response(self, prompt: np.ndarray, response: list[np.ndarray]) -> None:
        """Write one finished request into the index: the last :attr:`lead_in` prompt tokens
        and the response, as one sequence (nothing when there is no response)."""
        if not self.learn or not response:
            return
        tokens = np.concatenate([prompt[max(0, len(prompt) - self.lead_in) :], *response]).astype(np.int32)
        with _LEARN_LOCK:
            self.automaton.extend(tokens)
            self.automaton.new_sequence()

    def stats(self) -> dict[str, Any]:
        """``index`` (the source), ``index_nodes``, ``index_max_nodes`` and ``index_learns``."""
        return {
            "index": self.source,
            "index_nodes": len(self.automaton),
            "index_max_nodes": self.automaton.max_nodes,
            "index_learns": self.learn,
        }


def open_index(
    index: Any,
    *,
    learn: bool,
    scope: str,
    model: Any,
    method: str,
    ngram: int,
    min_depth: int,
    max_nodes: int | None,
) -> SharedIndex:
    """The :class:`SharedIndex` an ``index`` option names (see the module docstring).

    Args:
        index: ``"memory"``, a path or an Automaton (checked by :func:`check_index`).
        learn: write finished responses into it.
        scope: ``"process"`` or ``"drafter"``.
        model: the target (the key of a process-wide in-memory index).
        method: the method's name (ditto).
        ngram, min_depth: an in-memory index's settings (the drafter's own).
        max_nodes: an in-memory index's node budget (``None``: :data:`INDEX_MAX_NODES`).

    Raises:
        InvalidArgumentError: ``max_nodes`` given for a saved index or an Automaton, or a bad
            value; a file that is missing or unreadable (the message names it).
        CorruptFileError: a damaged file or one of another format version.
    """
    scope = rules.choice("index_scope", scope, SCOPES)
    index = check_index(index)
    if max_nodes is not None and index != MEMORY:
        raise InvalidArgumentError(
            "index_max_nodes applies to index='memory' only (a saved index or an Automaton keeps its own node budget)"
        )
    budget = INDEX_MAX_NODES if max_nodes is None else max_nodes
    automaton: Automaton
    if isinstance(index, Automaton):
        source = "automaton"
        automaton = index if scope == "process" else Automaton.from_bytes(index.to_bytes())
    elif index == MEMORY:
        source = MEMORY
        if scope == "drafter":
            automaton = Automaton(ngram=ngram, max_nodes=budget, min_depth=min_depth)
        else:
            automaton = _memory_index(model, (method, ngram, min_depth, budget))
    else:
        source = index
        automaton = _file_index(index, shared=scope == "process")
    return SharedIndex(automaton, source, learn, scope, max(1, automaton.ngram - 1))


def _memory_index(model: Any, key: tuple[str, int, int, int]) -> Automaton:
    _, ngram, min_depth, budget = key
    with _REGISTRY_LOCK:
        try:
            by_key = _MEMORY.setdefault(model, {}) if model is not None else _NO_MODEL
        except TypeError:  # not weakly referenceable
            by_key = _NO_MODEL
        automaton = by_key.get(key)
        if automaton is None:
            automaton = Automaton(ngram=ngram, max_nodes=budget, min_depth=min_depth)
            by_key[key] = automaton
        return automaton


def _file_index(path: str, *, shared: bool) -> Automaton:
    location = Path(path).expanduser()
    try:
        identity = file_identity(location)
    except FileNotFoundError:
        raise InvalidArgumentError(f"index: file not found: {path}") from None
    except OSError as exc:
        raise InvalidArgumentError(f"index: cannot read {path}: {exc.strerror or exc}") from None
    if location.is_dir():
        raise InvalidArgumentError(f"index: {path} is a folder, not an index file (made by racer index build)")
    if not shared:
        return _load(location, path)
    key: tuple[str | int, ...] = (str(location.resolve()), *identity)
    with _REGISTRY_LOCK:  # one load per file, even when threads ask at once
        automaton = _FILES.get(key)
        if automaton is None:
            for stale in [k for k in _FILES if k[0] == key[0]]:
                del _FILES[stale]  # the file changed since: the new one replaces it
            automaton = _FILES[key] = _load(location, path)
        return automaton


def _load(location: Path, path: str) -> Automaton:
    try:
        return Automaton.load(location)
    except OSError as exc:
        raise InvalidArgumentError(f"index: cannot read {path}: {exc.strerror or exc}") from None


def forget_indexes() -> None:
    """Drop every process-wide index (in memory and loaded files); drafters keep theirs."""
    with _REGISTRY_LOCK:
        _MEMORY.clear()
        _NO_MODEL.clear()
        _FILES.clear()
