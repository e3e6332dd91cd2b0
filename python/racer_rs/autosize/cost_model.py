"""The target's forward cost t(n) for draft trees of n nodes, measured on its own device.

Speculative decoding pays off only when the tokens a tree adds are worth what verifying it costs,
and that cost depends on the hardware: nearly flat up to 64 nodes on a datacenter GPU, steep on a
CPU. :func:`measure_forward_cost` times the engine's own verification path (tree
mask, position ids, KV cache) at a given context length, interleaving the sizes over several rounds
so that machine noise hits every size alike, and reports a statistic of the rounds per size (the
median by default; the cost model keeps the fastest round, the least disturbed). :class:`CostModel`
turns two such curves into step-time predictions corrected online by the engine's own timings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from racer_rs._native import DraftTree
from racer_rs.errors import InvalidArgumentError
from racer_rs.target.batch_verifier import BatchVerifier
from racer_rs.target.verifier import vocab_size

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64)


def synthetic_tree(size: int, vocab: int, branching: int = 4) -> DraftTree:
    """A tree of ``size`` nodes, each node's parent ``(i - 1) // branching`` (distinct tokens)."""
    parents = np.asarray([-1] + [(i - 1) // branching for i in range(1, size)], dtype=np.int32)
    tokens = (np.arange(size, dtype=np.int64) * 7919 % vocab).astype(np.int32)
    return DraftTree(tokens, parents)


def measure_forward_cost(
    model: Any,
    sizes: Sequence[int] = DEFAULT_SIZES,
    context: int = 500,
    rounds: int = 5,
    seed: int = 0,
    statistic: Callable[[list[float]], Any] = np.median,
    batch: int = 1,
    one_row: bool = False,
) -> dict[int, float]:
    """Median (or ``statistic``) seconds of one tree forward per tree size, at a
    ``context``-token prefix, through the engine's own verification path.

    The engine verifies every batch size, one row included, with
    :class:`racer_rs.target.batch_verifier.BatchVerifier` (tree masks, per-row positions, its
    grouped-query attention that does not copy the KV cache per query head), so that is what is
    timed: a curve timed on another path prices a step the engine never runs (the single-row
    :class:`racer_rs.target.verifier.TreeVerifier` repeats the cache per query head and cost
    SmolLM2-135M 2-3 ms more per multi-token step at a 500-token context).

    Args:
        model: the target (as given to :func:`racer_rs.generate`).
        sizes: tree sizes to time (nodes per row, root included).
        context: tokens already in the KV cache (of every row).
        rounds: timed passes over every size (one untimed pass warms up first); sizes are
            interleaved over the rounds so that machine noise hits every size alike.
        seed: seeds the random prefix.
        batch: rows verified together, each with the same prefix and a ``size``-node tree.
        one_row: only the first row verifies a ``size``-node tree, the others their root alone
            (a flat forward's cheapest layout at that padded size).

    Returns:
        ``{size: statistic of the rounds' seconds}``.
    """
    samples = time_layouts(model, sizes, (one_row,), context, rounds, seed, batch)
    return {n: float(statistic(times)) for (n, _), times in samples.items()}


def time_layouts(
    model: Any,
    sizes: Sequence[int],
    layouts: Sequence[bool],
    context: int,
    rounds: int,
    seed: int = 0,
    batch: int = 1,
) -> dict[tuple[int, bool], list[float]]:
    """Seconds of every round's tree forward per ``(size, one_row)``: every row verifying a
    ``size``-node tree (``one_row`` false), or the first one alone, the others their roots. All
    cases run interleaved in one verifier (one untimed pass first), so that machine noise hits
    them alike and their differences are measured, not the drift between two runs."""
    if not sizes or any(int(n) < 1 for n in sizes):
        raise InvalidArgumentError(f"sizes must be positive tree sizes, got {list(sizes)}")
    if batch < 1 or context < 1 or rounds < 1:
        raise InvalidArgumentError("batch, context and rounds must be >= 1")
    verifier = BatchVerifier(model)
    vocab = vocab_size(model)
    prompt = np.random.default_rng(seed).integers(0, vocab, size=context, dtype=np.int64).astype(np.int32)
    verifier.prefill([prompt])
    if batch > 1:
        verifier.keep_rows([0] * batch)  # one prefix copied to every row: the values do not matter
    trees = {int(n): synthetic_tree(int(n), vocab) for n in sizes}
    roots = synthetic_tree(1, vocab)

    def synchronize() -> None:
        if verifier.device.type == "cuda":
            torch.cuda.synchronize(verifier.device)

    order = [(n, one_row) for n in trees for one_row in dict.fromkeys(layouts)]
    samples: dict[tuple[int, bool], list[float]] = {case: [] for case in order}
    for round_index in range(rounds + 1):
        for n, one_row in order[round_index % len(order) :] + order[: round_index % len(order)]:
            synchronize()
            start = time.perf_counter()
            verifier.forward_trees([trees[n]] + [roots if one_row else trees[n]] * (batch - 1))
            synchronize()
            elapsed = time.perf_counter() - start
            verifier.discard_uncommitted()  # the prefix stays put
            if round_index > 0:
                samples[(n, one_row)].append(elapsed)
    return samples


#: Context lengths the cost curve is measured at; t(n) at other lengths is interpolated.
CURVE_CONTEXTS = (128, 1024)
#: Weight of the newest step in the machine's load factor: load moves every size alike and
#: changes within seconds on a shared machine, so it is followed fast.
LOAD_RATE = 0.3
#: Weight of the newest step in a size bucket's shape factor: the measured curve's own error for
#: that size, a property of the model and device, so it is learned slowly from many steps.
SHAPE_RATE = 0.02
#: Overhead outside the forward (drafting, acceptance) is averaged at this rate.
CORRECTION_RATE = 0.1
#: Load factors beyond this range are clipped (a 10x spike must not decide the next hour).
LOAD_RANGE = (1 / 8, 8.0)
#: Shape factors beyond this range are clipped (the measured curve is never that wrong).
SHAPE_RANGE = (1 / 4, 4.0)


#: Sizes up to this one have a shape bucket each; bigger ones share one per power of two.
EXACT_BUCKETS = 8
#: The scheme of stored shape factors, their bucket layout and what teaches them (states of
#: another scheme start from shape 1): 4, a batch size's plain steps teach its size 1.
BUCKET_SCHEME = 4


def size_bucket(n: int) -> int:
    """The shape bucket of a ``n``-node step: ``n - 1`` up to :data:`EXACT_BUCKETS` nodes, then
    one per power of two, ending at it (9..16 -> 8, 17..32 -> 9, 33..64 -> 10, ...).

    Small sizes are where batched steps are decided (a padded size of 2 or 3 for every row), and
    their real costs part from the measured curve differently: one bucket for 2..3 nodes learned
    a compromise that underpriced both. A bigger bucket ends at the power of two the curve is
    measured at: the kernels work in blocks of 16 rows, so 17 to 31 nodes cost more than the
    straight line between the measured 16 and 32 (SmolLM2-135M bf16 on this CPU: 50.6 ms at 16,
    53.9 at 17, 60.9 at 31, 57.3 at 32), and a bucket 16..31 learned that surcharge for 16 as
    well: ``capacity="auto"`` then never verified more than 15 nodes.
    """
    n = max(1, int(n))
    if n <= EXACT_BUCKETS:
        return n - 1
    return EXACT_BUCKETS + (n - 1).bit_length() - EXACT_BUCKETS.bit_length()


def bucket_start(bucket: int) -> int:
    """The smallest size of shape bucket ``bucket`` (:func:`size_bucket`'s inverse on its first sizes)."""
    if bucket < EXACT_BUCKETS:
        return bucket + 1
    return (1 << (bucket - EXACT_BUCKETS + EXACT_BUCKETS.bit_length() - 1)) + 1


def _clip(value: float, bounds: tuple[float, float]) -> float:
    return float(min(max(value, bounds[0]), bounds[1]))


class MachineLoad:
    """How much slower than measured every forward runs right now: other processes on a shared
    machine slow every forward alike, whatever its shape. One factor, shared by every cost model
    of a target that shares this object (the batch sizes of one call), followed fast, never
    stored (a later process meets a different load)."""

    def __init__(self) -> None:
        self.factor = 1.0


class CostModel:
    """Predicted seconds of one decode step that verifies ``n`` tree tokens.

    ``t(n, L)`` comes from curves measured at two context lengths (linear in ``L`` between and
    beyond them), corrected online from the engine's own forward timings by three factors:

    - the machine's **load** (:class:`MachineLoad`), one factor for every size, followed fast;
      cost models that share one ``MachineLoad`` (every batch size of a call) share it, so a
      batch size met for the first time is predicted at the load the others measured;
    - a **level** factor, learned slowly: what the first-use measurement got wrong about this
      curve as a whole (e.g. a curve timed while other processes loaded the machine: next to
      curves timed at a quiet moment it is too high at every size). Stored with the curve;
    - a **shape** factor per size bucket (:func:`size_bucket`), learned slowly: what the first-use
      measurement got wrong about that size relative to the others (e.g. small trees timed
      while the machine was still warming up). Stored with the curve; 1 for a bucket never seen.

    Each step's error (in log space, observed over predicted seconds) moves the load by a large
    share and the bucket's shape by a small one; the shapes' mean is then folded into the
    level. A burst of load thus moves the load, hardly the shapes (and the errors after it, while
    the load comes back, take that back), and one disturbed first step no longer sets a bucket's
    factor for good (as a single "first observation" factor did).

    Args:
        sizes: the tree sizes measured, ascending, starting at 1.
        seconds: ``{context: seconds per size}`` for two context lengths.
        shape: per-bucket shape factors to start from (``None``: all 1).
        overhead: seconds per step outside the forward to start from.
        level: the level factor to start from.
        machine: the load to share (``None``: a load of its own).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        seconds: dict[int, Sequence[float]],
        shape: dict[int, float] | None = None,
        overhead: float = 0.0,
        level: float = 1.0,
        machine: MachineLoad | None = None,
    ) -> None:
        self.sizes = np.asarray(sizes, dtype=np.float64)
        if len(self.sizes) < 1 or self.sizes[0] != 1 or np.any(np.diff(self.sizes) <= 0):
            raise InvalidArgumentError("sizes must ascend from 1")
        if len(seconds) != 2 or any(len(v) != len(self.sizes) for v in seconds.values()):
            raise InvalidArgumentError("seconds must hold one curve per context length, for two lengths")
        (self.short, short), (self.long, long) = sorted(seconds.items())
        self.curve_short = np.asarray(short, dtype=np.float64)
        self.curve_long = np.asarray(long, dtype=np.float64)
        if not (np.all(self.curve_short > 0) and np.all(self.curve_long > 0)):
            raise InvalidArgumentError("measured seconds must be positive")
        self.shape: dict[int, float] = {k: _clip(v, SHAPE_RANGE) for k, v in (shape or {}).items()}
        self.level = _clip(level, SHAPE_RANGE)
        self.machine = MachineLoad() if machine is None else machine
        self.overhead = float(overhead)

    @property
    def load(self) -> float:
        """The machine's load factor now (shared with the models of the same :class:`MachineLoad`)."""
        return self.machine.factor

    @load.setter
    def load(self, factor: float) -> None:
        self.machine.factor = factor

    @property
    def max_size(self) -> int:
        """The largest measured tree size."""
        return int(self.sizes[-1])

    def measured_seconds(self, n: np.ndarray, context: int) -> np.ndarray:
        """Forward seconds for tree sizes ``n`` at ``context`` tokens on the measured curve alone."""
        n = np.asarray(n, dtype=np.float64)
        short = np.interp(n, self.sizes, self.curve_short)
        long = np.interp(n, self.sizes, self.curve_long)
        weight = (context - self.short) / (self.long - self.short)
        seconds: np.ndarray = np.maximum(short + weight * (long - short), 1e-6)
        return seconds

    def forward_seconds(self, n: np.ndarray, context: int) -> np.ndarray:
        """Predicted forward seconds for tree sizes ``n`` at ``context`` tokens: the measured
        curve times the load, the level and each size bucket's shape factor."""
        n = np.asarray(n, dtype=np.float64)
        shape = np.asarray([self.shape.get(size_bucket(int(k)), 1.0) for k in n.ravel()]).reshape(n.shape)
        seconds: np.ndarray = self.measured_seconds(n, context) * (self.load * self.level) * shape
        return seconds

    def step_seconds(self, n: np.ndarray, context: int) -> np.ndarray:
        """Predicted seconds of a whole decode step verifying ``n`` tree tokens."""
        return self.forward_seconds(n, context) + self.overhead

    def observe(self, n: int, context: int, forward: float, overhead: float, teaches_load: bool = True) -> None:
        """Correct the model with one step's measured forward and outside-forward seconds
        (``teaches_load=False``: the error teaches the size's shape only, not the machine's
        load; for a step whose price has another correction that learns it faster)."""
        if not (np.isfinite(forward) and forward > 0):
            return  # a clock that went backwards or a zero timing teaches nothing
        bucket = size_bucket(n)
        log_ratio = float(np.log(forward / float(self.measured_seconds(np.asarray([n]), context)[0])))
        log_shape = {k: float(np.log(v)) for k, v in self.shape.items()}
        log_shape.setdefault(bucket, 0.0)
        log_load = float(np.log(self.load))
        log_level = float(np.log(self.level))
        error = log_ratio - log_load - log_level - log_shape[bucket]
        if teaches_load:
            log_load += LOAD_RATE * error
        # The shape takes a small share of each step's error: a burst of load is a run of large
        # errors that the load follows and that the errors after it take back, a wrong curve a
        # long run of small ones. Not a clipped share: a slow step's error clipped, and the
        # load's overshoot after it not, the shape fell a little with every disturbance while
        # the load rose to match (SmolLM2 at 8 rows: a plain step priced at a quarter of its
        # time and a load of 6 after 750 plain steps, so no node ever paid).
        log_shape[bucket] += SHAPE_RATE * error
        # Level and shape only meet as a product; the shapes' mean (over the buckets seen) is
        # moved into the level, so one bucket alone keeps shape 1, and a bucket never seen is
        # predicted like the average of those that were.
        mean = float(np.mean(list(log_shape.values())))
        self.load = _clip(float(np.exp(log_load)), LOAD_RANGE)
        self.level = _clip(float(np.exp(log_level + mean)), SHAPE_RANGE)
        self.shape = {k: _clip(float(np.exp(v - mean)), SHAPE_RANGE) for k, v in log_shape.items()}
        self.overhead = (1 - CORRECTION_RATE) * self.overhead + CORRECTION_RATE * max(overhead, 0.0)

    def state(self) -> dict[str, Any]:
        """JSON-ready state (:meth:`from_state` restores it); the load is left out: it belongs
        to this moment on this machine, not to the model."""
        return {
            "sizes": self.sizes.astype(int).tolist(),
            "seconds": {str(self.short): self.curve_short.tolist(), str(self.long): self.curve_long.tolist()},
            "shape": {str(k): v for k, v in self.shape.items()},
            "buckets": BUCKET_SCHEME,
            "level": self.level,
            "overhead": self.overhead,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CostModel:
        """Restore :meth:`state`.

        Raises:
            ValueError: a malformed state.
        """
        try:
            seconds: dict[int, Sequence[float]] = {int(k): [float(x) for x in v] for k, v in state["seconds"].items()}
            # "factors" (load and shape in one, from before they were split) is not read: it
            # holds whatever load the machine had when it was saved.
            shape = {int(k): float(v) for k, v in state.get("shape", {}).items()}
            if not all(np.isfinite(v) and v > 0 for v in shape.values()):
                raise InvalidArgumentError("shape factors must be positive")
            if state.get("buckets") != BUCKET_SCHEME:
                shape = {}  # learned over other buckets: their keys mean other sizes
            overhead = float(state.get("overhead", 0.0))
            level = float(state.get("level", 1.0))
            if not (np.isfinite(level) and level > 0):
                raise InvalidArgumentError("the level factor must be positive")
            if not (np.isfinite(overhead) and overhead >= 0):
                raise InvalidArgumentError("the overhead must be finite and non-negative")
            if not all(np.isfinite(x) for curve in seconds.values() for x in curve):
                raise InvalidArgumentError("measured seconds must be finite")
            return cls(state["sizes"], seconds, shape, overhead, level)
        except (KeyError, TypeError, AttributeError) as exc:
            raise InvalidArgumentError(f"malformed cost state: {exc}") from None

    def curve_ms(self, context: int) -> dict[int, float]:
        """The corrected forward cost per measured size, in milliseconds (for reports)."""
        seconds = self.forward_seconds(self.sizes, context)
        return {int(n): round(1000 * float(t), 3) for n, t in zip(self.sizes, seconds, strict=True)}


def measure_cost_model(model: Any, max_size: int, rounds: int = 3) -> CostModel:
    """Measure a :class:`CostModel` for ``model``: sizes 1, 2, 4, ... up to ``max_size``.

    Each size keeps its fastest round (other load only ever adds time) and the curve is made
    non-decreasing in the size, so that one disturbed measurement cannot make a big tree look
    cheaper than a smaller one, a choice that would never be tried and so never corrected.
    """
    sizes = [1]
    while sizes[-1] < max_size:
        sizes.append(min(2 * sizes[-1], max_size))
    window = getattr(model.config.get_text_config(), "max_position_embeddings", None) or 4096
    seconds = {}
    for context in CURVE_CONTEXTS:
        context = min(context, max(1, int(window) - max_size - 1))
        cost = measure_forward_cost(model, sizes, context=context, rounds=rounds, statistic=np.min)
        seconds[context] = np.maximum.accumulate([cost[n] for n in sizes]).tolist()
    if len(seconds) < 2:  # a tiny window: one length, counted twice
        only = next(iter(seconds.values()))
        seconds = {1: only, 2: only}
    return CostModel(sizes, seconds)
