"""Type stubs for the Rust extension ``racer_rs._native`` (hand-written, checked by stubtest)."""

import os
from collections.abc import Callable, Sequence
from typing import NoReturn, final

import numpy as np
import numpy.typing as npt

__version__: str
EDGE_CELLS: int
"""Number of edge cells (266): the kinds of draft-tree edge acceptance is calibrated by. In order:
chain edges by depth (cells 0-7), copy-logit edges by stored probability in tenths (8-17) or by
rank (18-25), retrieval edges from the request's automaton by matched length 1-8 and
continuation share in fifths (26-65), and the same 40 for retrieval from a shared automaton
(``build_draft_tree(..., shared=...)``, cells 66-105), so calibration learns how reliable
cross-request continuations are; then the scored build's retrieval edges by matched length 1-8
and the count estimate ``count / (parent count + 1)`` in tenths, the request's own (106-185) and
the shared automaton's (186-265)."""

__all__ = [
    "EDGE_CELLS",
    "Automaton",
    "BatchDraft",
    "DraftPool",
    "DraftTree",
    "LogitsTable",
    "__version__",
    "build_draft_tree",
    "chain_outcomes",
    "choose_chains",
    "edge_cell_groups",
    "edge_cell_priors",
    "edge_cell_shared_counterparts",
    "logits_summary",
    "logits_topk",
    "monotone_fit",
    "prompt_lookup",
]

_TokenArray = Sequence[int] | npt.NDArray[np.int32] | npt.NDArray[np.int64]
_RequestId = int | str
_Calibration = Sequence[float] | npt.NDArray[np.float32] | npt.NDArray[np.float64]

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

    def __new__(
        cls, ngram: int = 10, max_nodes: int | None = None, min_depth: int = 2, *, capacity: int | None = None
    ) -> Automaton:
        """An empty automaton.

        Args:
            ngram: longest substring indexed (``2..=64``).
            max_nodes: the node budget (LRU eviction beyond it; default 10,000); at least
                ``ngram * (ngram + 1) / 2``. This is the index's size, not a draft tree's
                (``capacity`` in ``generate``).
            min_depth: shortest context suffix a retrieval border may match (``1..=ngram``).
            capacity: ``max_nodes``'s earlier name, still accepted (not both).

        Raises:
            InvalidArgumentError: a value out of range (the message names it).
        """

    @property
    def ngram(self) -> int: ...
    @property
    def max_nodes(self) -> int:
        """The node budget."""

    @property
    def capacity(self) -> int:
        """The node budget (``max_nodes``'s earlier name)."""

    @property
    def min_depth(self) -> int: ...
    @property
    def match_length(self) -> int:
        """Depth of the current match state (length of the longest indexed context suffix)."""

    def __len__(self) -> int:
        """Live nodes, root excluded."""

    def extend(self, tokens: _TokenArray) -> None:
        """Append tokens to the context and count every new substring of length 1..ngram."""

    def extend_after(self, lead: _TokenArray, tokens: _TokenArray) -> None:
        """Append ``tokens`` to the sequence whose last tokens are ``lead``, in place of the
        current one: counts every substring (length 1..ngram) of ``lead + tokens`` that ends at
        a token of ``tokens``, as far as ``lead``'s own substrings are indexed (they are when
        the sequence was fed from its start, less what was evicted since). Running requests
        can so feed one shared index in turns, each passing its own last ``ngram - 1`` tokens
        as ``lead``: the counts are what extending each request's sequence alone would give.
        The sequence continued afterwards (by ``extend``) is ``lead + tokens``.

        Raises:
            ValueError: a negative token id in ``lead`` or ``tokens`` (nothing changes).
        """

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

    def chain(self, next_token: int, max_len: int, context: _TokenArray | None = None) -> DraftTree:
        """The longest-match chain rooted at ``next_token``: a one-path tree of at most
        ``max_len`` tokens after the root, as SuffixDecoding's greedy path.

        It starts from the longest border (the longest context suffix ``s`` with ``s +
        [next_token]`` indexed, at least ``min_depth`` tokens) and takes, each step, the
        continuation that most often followed the string matched so far (ties to the smaller
        id). A string with no continuation indexed (``ngram`` long, or never continued) gives
        way to its longest suffix that has one, while that suffix is at least ``min_depth``
        tokens. :meth:`retrieve` ranks continuations by count after the shortest border
        instead; a verifier of one chain wants the most specific context.

        Args:
            next_token: the root's token (the token the target produced last).
            max_len: most tokens after the root (``0`` gives the root alone).
            context: match this context instead of the automaton's own, read-only (as in
                :meth:`retrieve`).

        Returns:
            The chain; every edge's cell holds the matched string's length and the
            continuation's count estimate ``count / (string count + 1)`` (the scored tree's
            retrieval cells).

        Raises:
            ValueError: if a token is negative or ``max_len`` is negative or above
                ``2**20 - 1``.
            TypeError: if ``context`` is not a sequence of ints or an integer array.
        """

    def memory_bytes(self) -> int:
        """Heap memory held, in bytes: the capacity of every container, which grows with the
        nodes held (nothing is reserved for ``max_nodes`` up front)."""

    def check_integrity(self) -> None:
        """Raise ``StateError`` (a ``RuntimeError``) if an internal invariant is broken (slow; for tests)."""

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
    """The copy-logit table: per token id, the target's top-k next tokens at its latest occurrence.

    Sparse: only the rows written are stored, so memory follows the rows held, never
    ``vocab_size * top_k``.
    """

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

    def row(self, token: int) -> npt.NDArray[np.int32] | None:
        """Row ``token``'s ids, or ``None`` if it was never written.

        Raises:
            InvalidArgumentError: ``token`` is not in ``[0, vocab_size)``.
        """

    def row_probs(self, token: int) -> npt.NDArray[np.float32] | None:
        """Row ``token``'s probabilities, or ``None`` if it was never written (as :meth:`row`)."""
    def clear(self) -> None:
        """Forget every row, releasing their memory."""

    def memory_bytes(self) -> int:
        """Heap memory held, in bytes (the containers' capacities, not a length-based guess)."""

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
    calibration: _Calibration | None = None,
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
        ValueError: if a size or token is out of range, ``calibration`` is malformed,
            ``shared`` is ``automaton`` itself, or a retrieved token is outside
            ``0..table.vocab_size`` (the automaton it came from, named ``automaton`` or
            ``shared``, holds another tokenizer's ids).
        TypeError: if an argument has the wrong type.
    """

def choose_chains(
    tokens: npt.NDArray[np.int32],
    cells: npt.NDArray[np.int32],
    edges: npt.NDArray[np.float32],
    scales: npt.ArrayLike,
    budgets: _TokenArray,
    requests: int,
    cost: tuple[float, float] | tuple[float, float, npt.ArrayLike] | None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each request's draft chain among candidates, cut to the tokens that pay.

    A token at chain position ``j`` is accepted with the product of its chain's calibrated edge
    probabilities up to ``j`` (float32 products); candidate ``c``'s chains are expected to
    commit ``scales[c]`` times the sum of theirs.

    Args:
        tokens: ``int32[candidates, rows, k]``, C-contiguous: each request's candidate chains,
            a chain ending at its first negative id.
        cells: ``int32[candidates, rows, k]``: each chain token's edge cell (read only up to
            its chain's end).
        edges: ``float32[cells]``: each cell's calibrated acceptance probability.
        scales: per candidate, a non-negative factor on its expectations.
        budgets: per row, most tokens it may draft (``>= 0``).
        requests: requests in the step (each verifies one token whether it drafts or not).
        cost: ``(a, b)``: a step verifying ``n`` tokens takes ``a + b * n`` seconds;
            ``(a, b, measured)``: ``measured[n]`` seconds where ``n < len(measured)`` (finite,
            positive; a CPU forward's staircase), the line beyond; ``None``: no cut, every
            chain token within the budget.

    Returns:
        ``(best, lengths)``, each ``int64[rows]``: the chosen candidate and how many of its
        first tokens to draft. Without a cost, the candidate whose scaled expectation within
        the budget is highest (the first on ties) and all its tokens within the budget. With
        a cost, the candidates and lengths that together maximise
        ``(requests + sum of p) / (a + b * (requests + n))`` over every candidate and length
        per row (``p`` a token's path probability times its candidate's scale, at most 1; the
        fewest tokens on ties): at the best rate ``r`` a token pays when ``p > b * r``, so a
        row drafts the candidate whose tokens gain the most beyond that price (a short sure
        chain over a long mediocre one once tokens cost), found by alternating the rows'
        choices and the batch's cut until no row changes. With ``measured`` seconds the cut
        of the chosen candidates maximises ``(requests + sum of p) / seconds(requests + n)``
        exactly (the most probable tokens first), the candidates still priced by the line.

    Raises:
        InvalidArgumentError: shapes or lengths that do not match, a chain token's cell
            outside ``edges``, a negative or non-finite scale or budget, or a cost without
            ``a > 0`` and ``b >= 0`` (finite) or with a measured time not finite and positive.
        TypeError: an argument of the wrong type or dtype.
    """

def chain_outcomes(
    tokens: npt.NDArray[np.int32],
    cells: npt.NDArray[np.int32],
    edges: npt.NDArray[np.float32],
    rows: _TokenArray,
    best: _TokenArray,
    drafted: _TokenArray,
    sampled: Sequence[Sequence[int]],
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.bool_], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """What the target's sampled tokens say about the candidate chains of a step's requests
    (the table of :func:`choose_chains`).

    Args:
        tokens, cells, edges: as :func:`choose_chains`.
        rows: per request, its row in the table.
        best: per request, the candidate it drafted from.
        drafted: per request, the tokens it drafted (a prefix of that candidate's chain).
        sampled: per request, the tokens the target sampled after the root (the accepted
            drafts, then the bonus token).

    Returns:
        ``(cells, accepted, committed, expected)``: every observed edge's cell (each
        candidate's chain up to and including its first token that differs from the sampled
        ones, and none past them; candidate-major, then request) and whether it was accepted;
        per request, the drafted tokens committed and the drafted tokens its path
        probabilities expected (unscaled).

    Raises:
        InvalidArgumentError: as :func:`choose_chains`, lengths that differ, or a row,
            candidate or drafted length outside the table.
        TypeError: an argument of the wrong type or dtype.
    """

def edge_cell_groups() -> npt.NDArray[np.int32]:
    """``int32[EDGE_CELLS]``: the monotone group of every edge cell (``-1``: none). Within a
    group, cells stand for ascending raw estimates (copy-logit probability buckets, a retrieval
    block's buckets at one match length): a calibration keeps each group non-decreasing."""

def monotone_fit(
    values: npt.ArrayLike,
    weights: npt.ArrayLike,
    groups: _TokenArray,
) -> npt.NDArray[np.float64]:
    """``float64[n]``: ``values`` made non-decreasing, in index order, within each group of
    ``groups`` (``-1``: none; a group's cells need not be contiguous) by the weighted isotonic
    fit (pool adjacent violators), the GIL released. Each group keeps its weighted mean.

    Raises:
        InvalidArgumentError: the lengths differ, a value is not finite or a weight is not a
            finite positive number.
        TypeError: an argument is not a 1-D float (``values``, ``weights``) or int (``groups``)
            array or list.
    """

def edge_cell_priors() -> npt.NDArray[np.float32]:
    """``float32[EDGE_CELLS]``: the raw acceptance estimate each edge cell stands for, a prior
    before any outcome is observed."""

def edge_cell_shared_counterparts() -> npt.NDArray[np.int32]:
    """``int32[EDGE_CELLS]``: every edge cell's counterpart for the same edge found in an
    automaton shared across requests (a request's own retrieval cells, by share or by estimate,
    map to the shared ones of the same match length and bucket; other cells to themselves)."""

def logits_summary(
    logits: npt.NDArray[np.float32] | npt.NDArray[np.uint16] | npt.NDArray[np.int16], k: int, scale: float = 1.0
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """One pass per row of ``[rows, V]`` logits (float32, or bfloat16 as its ``uint16``/``int16``
    bits; C-contiguous), the GIL released: ``(ids, probs, greedy)``, the ``int64[rows, k]`` ids
    of the k largest logits (largest first, equal ones by id), their ``float32[rows, k]``
    probabilities under ``softmax(logits * scale)`` and the ``int64[rows]`` argmax (the first
    index of the largest logit, ``ids[:, 0]``). NaN ranks above every number and makes its row's
    probabilities NaN; infinities give torch's ``logsumexp`` results. ``1 <= k <= V`` and a
    finite ``scale > 0``, or an ``InvalidArgumentError``; another dtype is an
    ``InvalidTypeError``."""

def logits_topk(
    logits: npt.NDArray[np.float32] | npt.NDArray[np.uint16] | npt.NDArray[np.int16], k: int
) -> npt.NDArray[np.int64]:
    """The ``int64[rows, k]`` ids of ``logits_summary`` alone, computing no probability (about
    a third of its time), the GIL released; the same errors."""

def prompt_lookup(
    context: _TokenArray, *, max_ngram: int = 3, min_ngram: int = 1, num_pred: int = 10
) -> npt.NDArray[np.int32]:
    """Prompt lookup decoding: find the most recent earlier occurrence of the longest context
    suffix n-gram (``max_ngram`` down to ``min_ngram``) and return up to ``num_pred`` tokens
    that followed it (empty if none).
    """

@final
class DraftPool:
    """A pool of per-request RACER states drafted in one call.

    Every request owns an :class:`Automaton` (``ngram``, ``max_nodes``, ``min_depth``) and a
    :class:`LogitsTable` (``vocab_size`` x ``breadth``), driven exactly as
    :class:`racer_rs.drafters.racer.RacerDrafter` drives its pair: :meth:`add` is ``begin``
    (a new sequence indexing the prompt), :meth:`extend` and :meth:`update_topk` are
    ``observe`` (committed tokens, copy-logit rows), and :meth:`propose` builds each
    request's tree as :func:`build_draft_tree` does with the pool's options, so request ``i``
    of a batch gets the tree its own drafter would have proposed.

    Requests are keyed by an ``int`` (within int64) or a ``str``; ``bool`` is refused.
    Outputs follow the order of the ids given, never the pool's internal order, and the same
    calls give byte-identical trees in any process, under any ``PYTHONHASHSEED`` and with
    any ``threads``. Batch calls release the GIL once. A batch of at least 8 requests is
    split into contiguous chunks drafted on up to ``threads`` threads (the caller's
    included), but only as many as give every thread enough work to pay for starting it
    (about 60 µs: some 25 requests' 16-node trees in :meth:`propose`, 96 tokens in
    :meth:`extend`); smaller batches stay on the calling thread. A call that raises changes no
    request's state. The pool may be shared by
    Python threads (a lock per request, and one for the set of requests).

    Args:
        vocab_size: token ids are ``0..vocab_size``; each copy-logit table has one row per id.
        ngram: longest n-gram each automaton indexes (``2..=64``).
        max_nodes: node budget of each automaton (LRU eviction beyond it); at least
            ``ngram * (ngram + 1) / 2``.
        breadth: ids per copy-logit row (the target's top-k), also the logits tree's root
            breadth (``1..=1024``).
        min_depth: shortest context suffix a retrieval border may match (``1..=ngram``).
        exempt_depth: depth whose nodes do not halve their children's breadth.
        tree: ``"halving"`` (retrieval first, then the breadth-halving logits tree) or
            ``"scored"`` (best first by estimated path probability).
        min_score: scored trees only: leave out nodes whose estimated path probability is
            below this (``[0, 1]``).
        use_retrieval: draft from the automata (when False, :meth:`extend` checks its input
            and indexes nothing, as ``RacerDrafter`` does).
        use_logits: draft from the copy-logit tables (when False, :meth:`update_topk` checks
            its input and writes nothing, and no table is allocated per request).
        threads: most threads one batch call uses (``1..=1024``); settable later.

    Raises:
        ValueError: (``InvalidArgumentError``) if a setting is out of range, ``tree`` is
            neither name, or both sources are off.
    """

    def __new__(
        cls,
        vocab_size: int,
        *,
        ngram: int = 10,
        max_nodes: int = 10_000,
        breadth: int = 8,
        min_depth: int = 2,
        exempt_depth: int = 1,
        tree: str = "halving",
        min_score: float = 0.0,
        use_retrieval: bool = True,
        use_logits: bool = True,
        threads: int = 1,
    ) -> DraftPool: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def ngram(self) -> int: ...
    @property
    def max_nodes(self) -> int: ...
    @property
    def breadth(self) -> int: ...
    @property
    def min_depth(self) -> int: ...
    @property
    def exempt_depth(self) -> int: ...
    @property
    def tree(self) -> str:
        """``"halving"`` or ``"scored"``."""

    @property
    def min_score(self) -> float: ...
    @property
    def use_retrieval(self) -> bool: ...
    @property
    def use_logits(self) -> bool: ...
    @property
    def threads(self) -> int:
        """Most threads one batch call uses, the calling thread included (``1..=1024``).

        Setting it to anything else raises ``InvalidArgumentError``; it never changes an output.
        """

    @threads.setter
    def threads(self, threads: int) -> None: ...
    def __len__(self) -> int:
        """Number of requests."""

    def __contains__(self, key: object, /) -> bool:
        """Whether ``key`` is a request id of the pool (False for anything that is no int or str)."""

    def ids(self) -> list[_RequestId]:
        """The request ids, in insertion order (a removed and re-added id goes last)."""

    def memory_bytes(self) -> int:
        """Heap memory held, in bytes: every request's automaton and copy-logit table (as
        their own ``memory_bytes`` count them: both grow with what they store, about
        ``breadth * 8 + 13`` bytes per copy-logit row written and 100-250 bytes per automaton
        node up to ``max_nodes``; an empty request holds well under 16 KB), plus the pool's
        bookkeeping."""

    def clear(self) -> None:
        """Remove every request."""

    def add(self, id: _RequestId, prompt_ids: _TokenArray) -> None:
        """Start request ``id``: a new automaton indexing ``prompt_ids`` and an empty
        copy-logit table (``RacerDrafter.begin``; write prompt top-k rows with
        :meth:`update_topk`).

        Args:
            id: the request's key, an int or a str not yet in the pool.
            prompt_ids: the prompt's token ids (``int32``/``int64`` array or list of ints).

        Raises:
            ValueError: (``InvalidArgumentError``) if ``id`` is already in the pool or a
                token is outside ``0..vocab_size``; the message names the request.
            TypeError: (``InvalidTypeError``) if ``id`` is no int or str, or ``prompt_ids``
                is no sequence of ints or integer array.
        """

    def remove(self, id: _RequestId) -> None:
        """Forget request ``id`` (its automaton and table are freed).

        Raises:
            ValueError: (``InvalidArgumentError``) if ``id`` is not in the pool.
            TypeError: (``InvalidTypeError``) if ``id`` is no int or str.
        """

    def extend(
        self,
        ids: Sequence[_RequestId],
        tokens: Sequence[_TokenArray] | npt.NDArray[np.int32] | npt.NDArray[np.int64],
        lengths: _TokenArray | None = None,
    ) -> None:
        """Append committed tokens to each request's context (``RacerDrafter.observe``'s
        ``automaton.extend``), ``tokens[i]`` to request ``ids[i]``.

        Args:
            ids: distinct request ids (at least one).
            tokens: one 1-D token sequence per id (ragged; a 2-D array gives one row per
                id), or, with ``lengths``, one flat 1-D array holding them back to back.
            lengths: with a flat ``tokens``, the number of tokens of each id (``>= 0``,
                adding up to ``len(tokens)``).

        Raises:
            ValueError: (``InvalidArgumentError``) if ``ids`` is empty, an id is unknown or
                repeated, ``tokens``/``lengths`` do not hold one entry per id, the lengths
                do not add up, or a token is outside ``0..vocab_size``; the message names
                the request (``tokens[3] ('req-7'): ...``) and no request changes.
            TypeError: (``InvalidTypeError``) if an id or a token array has the wrong type.
        """

    def update_topk(
        self,
        id: _RequestId,
        tokens: _TokenArray,
        topk_ids: npt.NDArray[np.int32] | npt.NDArray[np.int64],
        topk_probs: npt.NDArray[np.float32] | npt.NDArray[np.float64] | None = None,
    ) -> None:
        """Write copy-logit rows of request ``id``, as :meth:`LogitsTable.update` does: for
        ``i`` in order, row ``tokens[i]`` := ``topk_ids[i]``; the last write wins.

        Args:
            id: the request.
            tokens: ``[n]`` token ids whose rows are written.
            topk_ids: ``[n, breadth]`` ids (the target's top-k after each token).
            topk_probs: ``[n, breadth]`` probabilities in ``[0, 1]`` of those ids, used by
                scored trees; without them rank ``j`` counts as ``2 ** -(j + 1)``.

        Raises:
            ValueError: (``InvalidArgumentError``) if ``id`` is unknown, the shapes
                disagree (``k`` must equal ``breadth``), an id is outside
                ``0..vocab_size`` or a probability outside ``[0, 1]``; the message names
                the request and nothing is written.
            TypeError: (``InvalidTypeError``) if an array has the wrong dtype.
        """

    def update_topk_many(
        self,
        ids: Sequence[_RequestId],
        tokens: _TokenArray,
        topk_ids: npt.NDArray[np.int32] | npt.NDArray[np.int64],
        lengths: _TokenArray,
        topk_probs: npt.NDArray[np.float32] | npt.NDArray[np.float64] | None = None,
    ) -> None:
        """Write copy-logit rows of several requests in one call: request ``ids[i]`` gets the
        next ``lengths[i]`` entries of ``tokens`` (and their rows of ``topk_ids`` and
        ``topk_probs``), written as :meth:`update_topk` writes them.

        Args:
            ids: distinct request ids (at least one).
            tokens: ``[n]`` token ids whose rows are written, the requests' back to back.
            topk_ids: ``[n, breadth]`` ids (the target's top-k after each token).
            lengths: rows per id (``>= 0``, adding up to ``n``).
            topk_probs: ``[n, breadth]`` probabilities in ``[0, 1]`` of those ids.

        Raises:
            ValueError: (``InvalidArgumentError``) if ``ids`` is empty, an id is unknown or
                repeated, the lengths do not add up, the shapes disagree, an id is outside
                ``0..vocab_size`` or a probability outside ``[0, 1]``; the message names the
                request and nothing is written.
            TypeError: (``InvalidTypeError``) if an id or an array has the wrong type.
        """

    def retrieval_chains(
        self, ids: Sequence[_RequestId], last_tokens: _TokenArray, max_len: int, *, shared: Automaton | None = None
    ) -> BatchDraft:
        """Per request, its automaton's longest-match chain rooted at ``last_tokens[i]``
        (:meth:`Automaton.chain`, at most ``max_len`` tokens after the root), as one-path
        trees in one :class:`BatchDraft`, in one GIL release. Refreshes the LRU recency of the
        automaton nodes used and nothing else.

        With ``shared`` (an automaton of other requests' responses), each chain is that
        automaton's instead, after the request's latest tokens: what
        ``shared.chain(last_tokens[i], max_len, context)`` gives for the request's context,
        its edges in the shared-retrieval cells (``edge_cell_shared_counterparts``). ``shared``
        is only read, the LRU recency of its nodes used refreshed; the requests' automata are
        not changed.

        Raises:
            InvalidArgumentError: if the batch is empty, an id is unknown or repeated,
                ``last_tokens`` does not hold one token per id, a token is outside the
                vocabulary, or ``max_len`` is negative or above ``2**20 - 1``.
        """

    def propose(
        self,
        ids: Sequence[_RequestId],
        last_tokens: _TokenArray,
        capacity: int | _TokenArray,
        *,
        calibration: _Calibration | None = None,
        shared: Automaton | None = None,
    ) -> BatchDraft:
        """One draft tree per request, in one GIL release (``RacerDrafter.propose`` for
        every request of the batch).

        Args:
            ids: distinct request ids (at least one); the output follows their order.
            last_tokens: each tree's root: the request's last verified token, the one the
                target produced last (``RacerDrafter.propose``'s ``next_token``), which is
                not yet in the context (it is committed, root first, by a later
                :meth:`extend`).
            capacity: most nodes per tree, root included (``1..=2**20``): one int for every
                request, or one per request (so a batch-wide budget can size rows apart).
            calibration: ``float32[EDGE_CELLS]`` acceptance probabilities in ``[0, 1]``, one
                per edge cell, replacing a scored tree's raw edge estimates (as in
                :func:`build_draft_tree`; halving trees ignore it once checked).
            shared: an automaton every request also drafts from (other requests' responses,
                a corpus), as :func:`build_draft_tree`'s ``shared``: only read, the LRU
                recency of the nodes used refreshed; other threads may use it meanwhile.

        Returns:
            A :class:`BatchDraft` whose tree ``i`` is the one :func:`build_draft_tree` builds
            from request ``ids[i]``'s automaton and table with the pool's options (and
            ``shared``).

        Raises:
            ValueError: (``InvalidArgumentError``) if ``ids`` is empty, an id is unknown or
                repeated, ``last_tokens`` or ``capacity`` do not hold one entry per id, a
                token is outside ``0..vocab_size``, a capacity is out of range, or the
                calibration is malformed, or ``shared`` hands a request a token outside
                ``0..vocab_size`` (it holds another tokenizer's ids: ``shared ('req-7'):
                drafted token ...``); the message names the request
                (``ids[3] ('req-7'): unknown request id``) and no request changes.
            TypeError: (``InvalidTypeError``) if an argument has the wrong type.
        """

@final
class BatchDraft:
    """The draft trees of one :meth:`DraftPool.propose` call, in the order of its ids.

    The flat arrays hold every request's nodes back to back (request ``i`` at
    ``offsets[i]:offsets[i + 1]``, each tree in its own BFS order); the layouts are built in
    Rust from the same trees.
    """

    def __new__(cls, *args: object, **kwargs: object) -> NoReturn:
        """Not built from Python: :meth:`DraftPool.propose` returns one (``InvalidTypeError``)."""

    @property
    def tokens(self) -> npt.NDArray[np.int32]:
        """``int32[total]``: every node's token, request after request."""

    @property
    def parents(self) -> npt.NDArray[np.int32]:
        """``int32[total]``: every node's parent as an index local to its request (``-1`` at
        each root)."""

    @property
    def cells(self) -> npt.NDArray[np.int32]:
        """``int32[total]``: every node's edge cell (``-1`` at each root); see ``EDGE_CELLS``."""

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        """``int64[bs]``: nodes per request, root included."""

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """``int64[bs + 1]``: request ``i``'s nodes are ``offsets[i]:offsets[i + 1]``."""

    def __len__(self) -> int:
        """Number of requests (``bs``)."""

    def tree(self, i: int) -> DraftTree:
        """Request ``i``'s tree, as a new :class:`DraftTree` (negative ``i`` counts from the end).

        Raises:
            ValueError: (``InvalidArgumentError``) if ``i`` is outside ``-bs..bs``.
        """

    def sglang(self, n: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """SGLang's n-gram verification layout with exactly ``n`` nodes per request.

        Node 0 of every request is its root (the last verified token) and nodes follow the
        tree's BFS order, so parents come before children. A tree bigger than ``n`` keeps its
        first ``n`` BFS nodes (a connected prefix); a smaller one is padded with nodes of
        token 0 that are children of the root.

        Args:
            n: nodes per request (SGLang's ``draft_token_num``), ``>= 1``.

        Returns:
            ``(tokens, mask)``: ``int64[bs * n]`` with ``tokens[b * n + i]`` node ``i`` of
            request ``b``, and ``bool[bs * n * n]``, row-major ``[bs, n, n]``, with
            ``mask[b, i, j]`` true iff node ``j`` is node ``i`` or one of its ancestors.

        Raises:
            ValueError: (``InvalidArgumentError``) if ``n < 1`` or the mask would exceed
                ``2**28`` elements.
        """

    def chain_table(self, k: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """:meth:`chains` as a table, with each node's edge cell.

        Args:
            k: most tokens per chain, ``>= 0``.

        Returns:
            ``(tokens, cells)``, each ``int32[bs, k]``: row ``i`` holds request ``i``'s chain
            tokens and their edge cells (see ``EDGE_CELLS``), ``-1`` past its end.

        Raises:
            ValueError: (``InvalidArgumentError``) if ``k < 0`` or ``bs * k`` is over the
                layout limit (``2**28`` elements).
        """

    def chains(self, k: int) -> list[npt.NDArray[np.int32]]:
        """Per request, the tokens after the root along the tree's best root-to-leaf path,
        at most ``k`` of them (those nearest the root).

        The best path is the deepest one, ties broken by BFS order: it ends at the leaf of
        greatest depth with the smallest node index. A root-only tree gives an empty chain.

        Args:
            k: most tokens per chain, ``>= 0``.

        Returns:
            One ``int32`` array per request, in batch order.
        """
