"""Type stubs for the Rust extension ``racer_rs._native`` (hand-written, checked by stubtest)."""

import os
from collections.abc import Callable, Sequence
from typing import final

import numpy as np
import numpy.typing as npt

__version__: str
EDGE_CELLS: int
"""Number of edge cells (106): the kinds of draft-tree edge acceptance is calibrated by. In order:
chain edges by depth (cells 0-7), copy-logit edges by stored probability in tenths (8-17) or by
rank (18-25), retrieval edges from the request's automaton by matched length 1-8 and
continuation share in fifths (26-65), and the same 40 for retrieval from a shared automaton
(``build_draft_tree(..., shared=...)``, cells 66-105), so calibration learns how reliable
cross-request continuations are."""

__all__ = [
    "EDGE_CELLS",
    "Automaton",
    "DraftTree",
    "LogitsTable",
    "build_draft_tree",
    "edge_cell_priors",
    "__version__",
    "prompt_lookup",
]

_TokenArray = Sequence[int] | npt.NDArray[np.int32] | npt.NDArray[np.int64]

@final
class DraftTree:
    """A draft tree flattened in BFS order (root at index 0, every parent before its children).

    Sibling nodes always carry distinct tokens, so a greedy walk is unambiguous.
    """

    def __new__(cls, tokens: _TokenArray, parents: _TokenArray, cells: _TokenArray | None = None) -> DraftTree:
        """Build a tree from flat arrays.

        Args:
            tokens: token id of every node (non-negative).
            parents: parent index of every node, ``-1`` for the root at index 0;
                parents must precede children and depths must not decrease.
            cells: every node's edge cell (``-1`` for the root, else ``0..EDGE_CELLS``);
                by default a chain gets chain cells by depth and any other tree copy-logit
                rank cells by each node's index among its siblings.

        Raises:
            ValueError: if the arrays disagree in length, are empty, are not in BFS
                order, two siblings carry the same token, or a cell is out of range.
            TypeError: if an argument is not a sequence of ints or an integer array.
        """

    @staticmethod
    def chain(tokens: _TokenArray) -> DraftTree:
        """A chain tree: ``tokens[0]`` is the root, each next token the child of the previous."""

    @property
    def tokens(self) -> npt.NDArray[np.int32]: ...
    @property
    def parents(self) -> npt.NDArray[np.int32]: ...
    @property
    def depths(self) -> npt.NDArray[np.int32]: ...
    @property
    def cells(self) -> npt.NDArray[np.int32]:
        """``int32[n]``: every node's edge cell (``-1`` for the root); see ``EDGE_CELLS``."""

    @property
    def max_depth(self) -> int: ...
    def __len__(self) -> int: ...
    def attention_mask(self) -> npt.NDArray[np.bool_]:
        """``bool[n, n]``: row ``i`` marks the ancestors of ``i`` and ``i`` itself."""

    def leaf_paths(self) -> npt.NDArray[np.int32]:
        """``int32[leaves, max_depth + 1]``: root-to-leaf node indices, padded with ``-1``."""

    def greedy_accept(self, predicted: _TokenArray) -> tuple[list[int], int]:
        """Walk from the root, following the child whose token equals the parent's prediction.

        Args:
            predicted: the target's token for every node (``int32[n]``), e.g. its argmax,
                or one sample per node for lossless sampling.

        Returns:
            ``(path, bonus)``: accepted node indices starting with 0, and the prediction at
            the last accepted node.
        """

@final
class Automaton:
    """Aho-Corasick automaton over the token stream with LRU eviction under a node budget."""

    def __new__(cls, ngram: int = 10, capacity: int = 10_000, min_depth: int = 2) -> Automaton: ...
    @property
    def ngram(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def min_depth(self) -> int: ...
    @property
    def match_length(self) -> int:
        """Depth of the current match state (length of the longest indexed context suffix)."""

    def __len__(self) -> int:
        """Live nodes, root excluded."""

    def extend(self, tokens: _TokenArray) -> None:
        """Append tokens to the context and count every new substring of length 1..ngram."""

    def new_sequence(self) -> None:
        """Start a new request: later substrings never span this boundary; the index is kept."""

    def clear(self) -> None:
        """Forget everything."""

    def count(self, pattern: _TokenArray) -> int:
        """Occurrences of ``pattern`` (1 <= len <= ngram) in the context (never above the truth)."""

    def retrieve(self, next_token: int, budget: int, context: _TokenArray | None = None) -> DraftTree:
        """The retrieval tree rooted at ``next_token`` with at most ``budget`` nodes (root included).

        Borders are the nodes for ``s + [next_token]`` (``s`` a context suffix, depth >=
        ``min_depth``); continuations from their subtrees are ranked by count (higher first),
        then shallower, then smaller token id.

        Args:
            next_token: the root's token (the token the target produced last).
            budget: maximum nodes, root included, in ``1..=2**20``.
            context: match this context instead of the automaton's own (its suffixes of at
                most ``ngram - 1`` tokens); the match state is neither used nor changed, so a
                shared automaton can answer for any request. Only LRU recency is updated.

        Returns:
            The tree; every non-root node has a retrieval edge cell.

        Raises:
            ValueError: if a token is negative or ``budget`` is out of range.
            TypeError: if ``context`` is not a sequence of ints or an integer array.
        """

    def memory_bytes(self) -> int: ...
    def check_integrity(self) -> None:
        """Raise ``RuntimeError`` if any internal invariant is broken (slow; for tests)."""

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the automaton to ``path`` atomically.

        The image (see ``to_bytes``) goes to a temporary file in the same folder, is synced to
        disk and renamed over ``path``; on failure the temporary file is removed and an
        existing ``path`` is left as it was. Other threads may keep using the automaton.

        Args:
            path: the file to write (replaced if it exists).

        Raises:
            OSError: the subclass for the failure (``FileNotFoundError`` for a missing folder,
                ``PermissionError``, ``IsADirectoryError``, ...), with ``filename`` set.
            ValueError: if ``path`` names no file (e.g. ends with ``..``).
            TypeError: if ``path`` is not a str or ``os.PathLike``.
        """

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Automaton:
        """Read an automaton written by ``save``.

        The loaded automaton behaves exactly as the saved one: same counts, retrievals and
        draft trees, and the same evictions as further tokens arrive. The file is checked in
        full (length, checksum, every field, then the automaton's invariants) before use.

        Args:
            path: a file written by ``save``.

        Returns:
            The automaton.

        Raises:
            racer_rs.errors.CorruptFileError: (a ``ValueError``) if the file is empty,
                truncated, damaged, not an automaton image, or of another format version; the
                message names the file and what is wrong.
            OSError: the subclass for a file that cannot be read (``FileNotFoundError``,
                ``PermissionError``, ``IsADirectoryError``, ...).
            TypeError: if ``path`` is not a str or ``os.PathLike``.
        """

    def to_bytes(self) -> bytes:
        """The automaton's image, as ``save`` writes it.

        Format version 1: magic ``b"RACERIDX"``, the version, the configuration (``ngram``,
        ``min_depth``, ``capacity``), the clock, the recent tokens, the free slots and the
        live trie nodes (token, parent, failure link, count, last use, depth), then a CRC-32
        (as ``zlib.crc32`` computes it) of everything before it.

        Returns:
            The image; ``Automaton.from_bytes`` reads it back.
        """

    @classmethod
    def from_bytes(cls, data: bytes | bytearray) -> Automaton:
        """Rebuild an automaton from ``to_bytes`` output (checked as ``load`` checks a file).

        Args:
            data: an image from ``to_bytes``.

        Returns:
            The automaton.

        Raises:
            racer_rs.errors.CorruptFileError: (a ``ValueError``) if ``data`` is not an intact
                image of a format version this build reads; the message starts with ``data``.
            TypeError: if ``data`` is not bytes or a bytearray.
        """

    def __reduce__(self) -> tuple[Callable[[bytes], Automaton], tuple[bytes]]:
        """Pickle support: ``(Automaton.from_bytes, (self.to_bytes(),))``."""

@final
class LogitsTable:
    """The copy-logit table: per token id, the target's top-k next tokens at its latest occurrence."""

    def __new__(cls, vocab_size: int, top_k: int = 8) -> LogitsTable: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    def __len__(self) -> int:
        """Number of rows that have been written."""

    def update(
        self,
        tokens: _TokenArray,
        topk_ids: npt.NDArray[np.int32] | npt.NDArray[np.int64],
        topk_probs: npt.NDArray[np.float32] | npt.NDArray[np.float64] | None = None,
    ) -> None:
        """For i in order, row ``tokens[i]`` := ``topk_ids[i]`` (``[n]`` and ``[n, k]``); last write wins.

        ``topk_probs`` (same shape, values in ``[0, 1]``) are the target's probabilities of
        those ids, used by ``build_draft_tree(..., scored=True)``; without them rank ``j`` is
        assumed to have probability ``2 ** -(j + 1)``.
        """

    def row(self, token: int) -> npt.NDArray[np.int32] | None: ...
    def row_probs(self, token: int) -> npt.NDArray[np.float32] | None: ...
    def clear(self) -> None: ...
    def memory_bytes(self) -> int: ...
    def expand(self, root: int, budget: int, exempt_depth: int = 1) -> DraftTree:
        """Breadth-halving logits tree of at most ``budget`` nodes rooted at ``root``."""

    def expand_static(self, root: int, parents: _TokenArray, ranks: _TokenArray) -> DraftTree:
        """Fill a static tree template: node i is rank ``ranks[i]`` of its parent's row.

        Nodes below a row that was never written are dropped with their descendants; a node
        that repeats a sibling's token is merged into it. ``parents[0]`` must be ``-1``.
        """

def build_draft_tree(
    automaton: Automaton,
    table: LogitsTable,
    next_token: int,
    capacity: int = 64,
    *,
    use_retrieval: bool = True,
    use_logits: bool = True,
    draft_chain: _TokenArray | None = None,
    exempt_depth: int = 1,
    scored: bool = False,
    min_score: float = 0.0,
    calibration: Sequence[float] | npt.NDArray[np.float32] | npt.NDArray[np.float64] | None = None,
    shared: Automaton | None = None,
) -> DraftTree:
    """RACER's draft tree: ``draft_chain`` (if any) first, then retrieval paths, then the logits
    tree fills what is left. The budget is charged after merging, so the tree has exactly
    ``min(capacity, available)`` nodes, root included. Every node records its edge cell.

    With ``scored=True`` nodes are chosen best first by estimated path probability (the
    product of copy-logit probabilities and smoothed retrieval frequencies along the path),
    which maximises the expected accepted length under those estimates; ``min_score`` in
    ``[0, 1]`` then leaves out nodes whose estimate is below it (the tree grows only while a
    node is likely enough to pay for its verification). ``calibration`` (``EDGE_CELLS``
    probabilities in ``[0, 1]``, one per edge cell) replaces those raw edge estimates.

    Args:
        automaton: the request's own automaton (its match state is the context).
        table: the copy-logit table.
        next_token: the root's token, in ``0..table.vocab_size``.
        capacity: maximum nodes, root included, in ``1..=2**20``.
        use_retrieval: add retrieval paths (from ``automaton`` and ``shared``).
        use_logits: fill with the copy-logit tree.
        draft_chain: tokens placed first as a chain below the root.
        exempt_depth: depths whose breadth the halving logits tree does not halve.
        scored: grow best first by estimated path probability instead of halving.
        min_score: scored trees only: leave out nodes estimated below this.
        calibration: per-cell acceptance probabilities for the scored build.
        shared: a second automaton read by every request: past responses
            (``shared.extend(response); shared.new_sequence()``) or a corpus
            (``Automaton.load``). Its borders are found for this request's context (the
            ``automaton``'s last ``ngram`` tokens), so it keeps no per-request state and is
            only read: never extended, only the LRU recency of the nodes used is refreshed.
            Its edges get the shared-retrieval cells. In the halving build its continuations
            (ranked by count) come after the request's retrieval, before the logits tree; in
            the scored build they compete in the same best-first order. Paths spelling the
            same tokens merge. Empty, it changes nothing. Safe while other threads draft
            from it or extend it.

    Returns:
        The tree.

    Raises:
        ValueError: if a size or token is out of range, ``calibration`` is malformed, or
            ``shared`` is ``automaton`` itself.
        TypeError: if an argument has the wrong type.
    """

def edge_cell_priors() -> npt.NDArray[np.float32]:
    """``float32[EDGE_CELLS]``: the raw acceptance estimate each edge cell stands for, a prior
    before any outcome is observed."""

def prompt_lookup(
    context: _TokenArray, *, max_ngram: int = 3, min_ngram: int = 1, num_pred: int = 10
) -> npt.NDArray[np.int32]:
    """Prompt lookup decoding: find the most recent earlier occurrence of the longest context
    suffix n-gram (``max_ngram`` down to ``min_ngram``) and return up to ``num_pred`` tokens
    that followed it (empty if none).
    """
