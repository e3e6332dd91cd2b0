"""``capacity="auto"`` for a batch: one node budget for every row of the batched forward.

A batched step verifies every live row's tree in one forward. Its attention is laid out padded
to the step's largest tree ``m`` (every row attends over its own KV cache with ``m`` query
slots), while everything else (projections, MLP, norms, LM head) runs **flat** over the ``K``
real nodes only (:mod:`racer_rs.target.attention`). So a step costs

    T_B(1) + s * (T_B(1 + (K - B) / B) - T_B(1)) + (1 - s) * (T_B(m) - T_B(1)),

``T_B`` the measured cost curve of ``B`` rows that all verify the same number of nodes
(interpolated between sizes; plus the step's time outside the forward, learned online): the
nodes' part priced as if the drafted nodes were spread evenly over the rows, the padded part at
``m``. ``s`` (:class:`TokenShare`) is the share that grows with the nodes, measured against a step
where only one row verifies ``m`` nodes (about 0.8 for SmolLM2-135M at 16 rows on this CPU, less
at long contexts, where attention weighs more). Each row keeps a best-first prefix of its tree (by calibrated
probability, as one request does); the step chooses ``m`` and, under it, the drafted nodes of
all rows with the highest probabilities, where the expected tokens per second

    (B + sum of the kept drafted nodes' probabilities) / cost

are highest (:func:`best_flat_sizes`): a row whose drafts are likely goes deep while the others
verify their root alone, and a node is verified only where it pays for its own share of the
forward. With ``s = 0`` (a forward that cannot run flat) every row keeps all of its nodes up to
``m`` (they fill padding), as :func:`best_batch_size` chooses; at one row this is exactly
:func:`racer_rs.autosize.sizer.best_prefix_size`.

A flat step also pays for its layout (every layer scatters the rows' queries and keys into the
padded layout and gathers the outputs back): measured as what a flat step with one deep row
costs beyond the padded step with every row at ``m`` (:class:`TokenShare`'s overhead). Each step
then runs flat or padded, whichever has the more expected tokens per second
(:func:`best_layout_sizes`): on this CPU with SmolLM2-135M, 4 and 8 rows verifying one more node
each cost less padded than one row verifying it flat.

What the model leaves out, a real drafted step pays (the drafters' top-k of every verified
node, the acceptance, the cache moves, a forward dearer in the engine than alone): each batch
size learns it online as a factor on the price above a plain step (:class:`DraftPrice`, from the
drafted steps that ran; it fades back to its prior in the steps that verify no drafted node, so
that a price learned high from a few slow steps does not stop drafting for good), and the cut
prices with it one standard error high, so that a node is verified only where its gain clears
what the price is known to miss.

Cost curves (:class:`BatchCosts`) are **keyed by batch size**, not modelled over total tokens: a
row reads its own KV prefix (memory traffic ``~ B x P``) and attends over it (``~ B x m x P``), so
8 rows of 4 nodes do not cost what 1 row of 32 nodes does, most of all on accelerators, where a
small forward is bound by reading weights and KV rather than by its token count. Batch size 1 is
:func:`racer_rs.autosize.state.cost_model` itself (today's curve, measured with the single-request
path, with its corrections); sizes 2, 4, 8, ... are measured with the real batched path
(:class:`racer_rs.target.batch_verifier.BatchVerifier`: padded trees, 4D masks, per-row
positions) at the same two context lengths, sizes in between interpolated linearly in ``B``; every
batch size keeps its own online corrections (load, shape, overhead: see
:class:`racer_rs.autosize.cost_model.CostModel`). All are cached on disk next to today's curve
(``<cost key>-b<B>.json``), the shapes excepted: drafted steps teach them, alongside their price,
and what they learn belongs to the process's prices (:func:`_without_shapes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from racer_rs.autosize import state
from racer_rs.autosize.cost_model import (
    CURVE_CONTEXTS,
    CostModel,
    MachineLoad,
    measure_forward_cost,
    size_bucket,
    time_layouts,
)
from racer_rs.errors import InvalidArgumentError


def best_batch_size(probabilities: Sequence[np.ndarray], step_seconds: np.ndarray) -> int:
    """The padded tree size ``m`` (root included) with the most expected tokens per second.

    Args:
        probabilities: per row, its drafted nodes' acceptance probabilities best first (a row
            keeps its first ``min(m, len + 1) - 1``; a shorter tree stays whole).
        step_seconds: predicted seconds of a batched step padded to ``1, 2, ...`` nodes per row;
            its length bounds ``m``.

    Returns:
        ``m >= 1``; ties go to the smaller size. With one row this is
        :func:`racer_rs.autosize.sizer.best_prefix_size`.
    """
    if not len(probabilities):
        raise InvalidArgumentError("probabilities must hold at least one row")
    limit = min(len(step_seconds), max(len(p) for p in probabilities) + 1)
    expected = np.zeros(limit, dtype=np.float64)
    for row in probabilities:
        gains = np.concatenate([[0.0], np.cumsum(np.asarray(row, dtype=np.float64)[: limit - 1])])
        expected += 1.0 + np.pad(gains, (0, limit - len(gains)), mode="edge")
    rate = expected / np.asarray(step_seconds[:limit], dtype=np.float64)
    # Ties (to rounding) go to the smaller size: a gain within float noise is no gain.
    return int(np.flatnonzero(rate >= rate.max() * (1 - 1e-9))[0]) + 1


def flat_step_seconds(
    uniform: np.ndarray, share: np.ndarray, extra: np.ndarray, batch: int, overhead: np.ndarray | None = None
) -> np.ndarray:
    """Predicted seconds of a flat step padded to ``m = 1, 2, ...`` nodes per row when the rows
    verify ``extra[m - 1]`` drafted nodes in all (see the module's docstring).

    Args:
        uniform: seconds of a step in which every row verifies ``1, 2, ...`` nodes.
        share: per padded size, the part of ``uniform - uniform[0]`` that grows with the nodes.
        extra: per padded size (the last axis; leading axes price several node counts at once),
            the drafted nodes (beyond the rows' roots) verified.
        batch: the live rows.
        overhead: per padded size, the flat layout's own cost as a fraction of ``uniform``
            (:meth:`TokenShare.overhead_at`; default none).
    """
    uniform = np.asarray(uniform, dtype=np.float64)
    plain = uniform[0]
    # The nodes' part: as if the drafted nodes were spread evenly over the rows.
    spread = np.interp(1 + np.asarray(extra, dtype=np.float64) / batch, np.arange(1, len(uniform) + 1), uniform)
    share = np.asarray(share, dtype=np.float64)
    seconds: np.ndarray = plain + share * (spread - plain) + (1 - share) * (uniform - plain)
    if overhead is not None:
        seconds = seconds + np.asarray(overhead, dtype=np.float64) * uniform
    return seconds


def best_flat_sizes(
    probabilities: Sequence[np.ndarray],
    step_seconds: np.ndarray,
    share: np.ndarray,
    overhead: np.ndarray | None = None,
) -> np.ndarray:
    """Every row's tree size (root included) with the most expected tokens per second of a flat step.

    Args:
        probabilities: per row, its drafted nodes' acceptance probabilities best first (a row
            keeps a prefix of them).
        step_seconds: predicted seconds of a step in which every row verifies ``1, 2, ...``
            nodes (non-decreasing); its length bounds the sizes.
        share: per padded size, the share of ``step_seconds - step_seconds[0]`` that grows with
            the verified nodes (:func:`flat_step_seconds`); 0 everywhere: the padded step, where
            every row keeps its nodes up to the padded size (:func:`best_batch_size`).
        overhead: per padded size, the flat layout's own cost (:func:`flat_step_seconds`).

    Returns:
        ``int64[B]`` sizes ``>= 1``. For each padded size ``m`` the drafted nodes that may be
        kept (a row's first ``m - 1``) are taken most probable first (a row's in its order), as
        many as give the most tokens per second; ties go to the smaller size, then to fewer nodes.
    """
    batch = len(probabilities)
    if not batch:
        raise InvalidArgumentError("probabilities must hold at least one row")
    limit = min(len(step_seconds), max(len(p) for p in probabilities) + 1)
    counts_per_row = [min(len(p), limit - 1) for p in probabilities]
    if not sum(counts_per_row):
        return np.ones(batch, dtype=np.int64)
    rows = np.repeat(np.arange(batch), counts_per_row)
    values = np.concatenate(
        [np.asarray(p, dtype=np.float64)[:n] for p, n in zip(probabilities, counts_per_row, strict=True)]
    )
    ranks = np.concatenate([np.arange(n) for n in counts_per_row])
    order = np.lexsort((ranks, rows, -values))  # most probable first; a row's own nodes in order
    values, ranks, rows = values[order], ranks[order], rows[order]
    sizes = np.arange(2, limit + 1)  # the padded sizes with drafted nodes
    allowed = ranks[None, :] < (sizes - 1)[:, None]  # [sizes, nodes]
    gains = np.cumsum(np.where(allowed, values[None, :], 0.0), axis=1)
    counts = np.cumsum(allowed, axis=1)
    uniform = np.asarray(step_seconds[:limit], dtype=np.float64)
    shares = np.asarray(share, dtype=np.float64)[:limit]
    overheads = None if overhead is None else np.asarray(overhead, dtype=np.float64)[:limit]
    # Row m - 1 of the node counts is padded size m's (size 1 keeps none).
    extra = np.vstack([np.zeros(counts.shape[1]), counts])
    seconds = flat_step_seconds(uniform, shares, extra.T, batch, overheads).T[1:]
    rates = np.where(allowed, (batch + gains) / seconds, -np.inf)
    best = float(rates.max())
    if not best > (batch / uniform[0]) * (1 + 1e-9):
        return np.ones(batch, dtype=np.int64)
    size_index, node_index = map(int, np.argwhere(rates >= best * (1 - 1e-9))[0])
    kept = allowed[size_index, : node_index + 1]
    return 1 + np.bincount(rows[: node_index + 1][kept], minlength=batch).astype(np.int64)


def expected_tokens(probabilities: Sequence[np.ndarray], sizes: np.ndarray) -> float:
    """Expected committed tokens of a step in which row ``r`` verifies its first
    ``sizes[r] - 1`` drafted nodes (one token per row, plus the kept nodes' probabilities)."""
    return float(
        sum(
            1.0 + float(np.sum(np.asarray(p, dtype=np.float64)[: n - 1]))
            for p, n in zip(probabilities, sizes, strict=True)
        )
    )


def best_layout_sizes(
    probabilities: Sequence[np.ndarray],
    step_seconds: np.ndarray,
    share: np.ndarray,
    overhead: np.ndarray | None = None,
) -> tuple[np.ndarray, bool]:
    """Every row's tree size and the step's layout: flat (:func:`best_flat_sizes`) or padded
    (:func:`best_batch_size`, every row keeping its nodes up to the padded size), whichever has
    the most expected tokens per second; ties go to the padded step.

    A padded step's cost is the uniform curve's at its size however many of its slots hold real
    nodes, so its rows fill the padding with their own next nodes for nothing; a flat one pays
    for its real nodes only, at the token share's price, plus its layout's own work (``overhead``:
    every layer scatters the rows' queries and keys and gathers the outputs). Where the share is
    small (few rows, a short context: the projections cost about the same for 8 tokens as for
    16 on a CPU) the padded step verifies more nodes for less (SmolLM2-135M, bfloat16, one
    thread, this CPU, a 150-token context: every row verifying one more node padded 40.4 ms at 4
    rows and 45.9 at 8, one row verifying one more node flat 42.4 and 47.9;
    ``benches/bench_flat_forward.py``).

    Returns:
        ``(sizes, flat)``: ``int64[B]`` sizes ``>= 1`` and whether the step runs flat.
    """
    flat_sizes = best_flat_sizes(probabilities, step_seconds, share, overhead)
    size = best_batch_size(probabilities, step_seconds)
    padded_sizes = np.asarray([min(size, len(p) + 1) for p in probabilities], dtype=np.int64)
    steps = np.asarray(step_seconds, dtype=np.float64)
    padded_rate = expected_tokens(probabilities, padded_sizes) / steps[size - 1]
    m = int(flat_sizes.max())
    extra = np.full(len(steps), float(np.sum(flat_sizes - 1)))
    overheads = None if overhead is None else np.asarray(overhead, dtype=np.float64)[: len(steps)]
    shares = np.asarray(share, dtype=np.float64)[: len(steps)]
    flat_seconds = float(flat_step_seconds(steps, shares, extra, len(probabilities), overheads)[m - 1])
    flat_rate = expected_tokens(probabilities, flat_sizes) / flat_seconds
    if padded_rate >= flat_rate * (1 - 1e-9):
        return padded_sizes, False
    return flat_sizes, True


def bucket_sizes(batch: int) -> list[int]:
    """The measured batch sizes a batch of ``batch`` rows may need as it shrinks: 2, 4, ... up to
    the first power of two ``>= batch`` (none for one row)."""
    sizes = []
    size = 2
    while batch > 1:
        sizes.append(size)
        if size >= batch:
            break
        size *= 2
    return sizes


def measure_batch_forward_cost(
    model: Any,
    batch: int,
    sizes: Sequence[int],
    context: int,
    rounds: int = 3,
    seed: int = 0,
) -> dict[int, float]:
    """Fastest seconds of one batched tree forward (``batch`` rows, each a ``size``-node tree) per
    size, at a ``context``-token prefix in every row, through the engine's verification path
    (:func:`racer_rs.autosize.cost_model.measure_forward_cost`; the fastest round is kept: other
    load only ever adds time)."""
    return measure_forward_cost(model, sizes, context=context, rounds=rounds, seed=seed, statistic=np.min, batch=batch)


def measure_batch_cost_model(model: Any, batch: int, max_size: int, rounds: int = 3) -> CostModel:
    """A :class:`CostModel` of the batched forward for ``batch`` rows (``n`` = nodes per row), at
    the contexts and sizes :func:`racer_rs.autosize.cost_model.measure_cost_model` uses; made
    non-decreasing in the size, as that one is."""
    sizes = [1]
    while sizes[-1] < max_size:
        sizes.append(min(2 * sizes[-1], max_size))
    window = getattr(model.config.get_text_config(), "max_position_embeddings", None) or 4096
    seconds: dict[int, Sequence[float]] = {}
    for context in CURVE_CONTEXTS:
        context = min(context, max(1, int(window) - max_size - 1))
        cost = measure_batch_forward_cost(model, batch, sizes, context=context, rounds=rounds)
        seconds[context] = np.maximum.accumulate([cost[n] for n in sizes]).tolist()
    if len(seconds) < 2:  # a tiny window: one length, counted twice
        only = next(iter(seconds.values()))
        seconds = {1: only, 2: only}
    return CostModel(sizes, seconds)


#: Padded sizes the token share is measured at (larger sizes take the largest one's).
SHARE_SIZES = (2, 4, 8, 16)
#: How stored token shares were measured: 2, with the flat overheads, both layouts interleaved.
SHARE_FORMAT = 2


class TokenShare:
    """The share of a batched step's cost above a plain step that grows with the verified nodes
    (the rest grows with the padded size: attention), per padded size and context length, and
    what a flat step costs beyond that model: its layout's own work (every layer scatters the
    rows' queries and keys and gathers the outputs), as a fraction of the uniform step.

    Args:
        sizes: the padded sizes measured (ascending, ``>= 2``).
        shares: ``{context: shares at those sizes}`` at two context lengths.
        overheads: ``{context: overheads at those sizes}`` (default none): a flat step in which
            one row verifies ``m`` nodes took ``1 + overhead`` times the step in which every row
            does, padded (SmolLM2-135M on this CPU at ``m = 2``: 1.01 to 1.05 at 2 to 16 rows).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        shares: Mapping[int, Sequence[float]],
        overheads: Mapping[int, Sequence[float]] | None = None,
    ) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.short, self.long = sorted(shares)[0], sorted(shares)[-1]
        self.at_short = np.clip(np.asarray(shares[self.short], dtype=np.float64), 0.0, 1.0)
        self.at_long = np.clip(np.asarray(shares[self.long], dtype=np.float64), 0.0, 1.0)
        overheads = overheads or {self.short: [0.0] * len(self.sizes), self.long: [0.0] * len(self.sizes)}
        self.overhead_short = np.clip(np.asarray(overheads[self.short], dtype=np.float64), 0.0, 1.0)
        self.overhead_long = np.clip(np.asarray(overheads[self.long], dtype=np.float64), 0.0, 1.0)

    def _weight(self, context: int) -> float:
        if self.long == self.short:
            return 0.0
        return float(np.clip((context - self.short) / (self.long - self.short), 0, 1))

    def at(self, count: int, context: int) -> np.ndarray:
        """Shares at padded sizes ``1 .. count`` (size 1: 0) at ``context``."""
        weight = self._weight(context)
        curve = (1 - weight) * self.at_short + weight * self.at_long
        shares = np.interp(np.arange(1, count + 1), self.sizes, curve)
        shares[0] = 0.0
        return shares

    def overhead_at(self, count: int, context: int) -> np.ndarray:
        """Flat-layout overheads at padded sizes ``1 .. count`` (size 1: 0) at ``context``."""
        weight = self._weight(context)
        curve = (1 - weight) * self.overhead_short + weight * self.overhead_long
        overheads = np.interp(np.arange(1, count + 1), self.sizes, curve)
        overheads[0] = 0.0
        return overheads

    @staticmethod
    def blend(low: TokenShare, high: TokenShare, weight: float) -> TokenShare:
        """``(1 - weight) * low + weight * high`` at ``low``'s sizes and contexts."""

        def mixed(pairs: tuple[tuple[int, np.ndarray, np.ndarray], ...]) -> dict[int, list[float]]:
            return {
                context: ((1 - weight) * own + weight * np.interp(low.sizes, high.sizes, other)).tolist()
                for context, own, other in pairs
            }

        return TokenShare(
            low.sizes.tolist(),
            mixed(((low.short, low.at_short, high.at_short), (low.long, low.at_long, high.at_long))),
            mixed(
                (
                    (low.short, low.overhead_short, high.overhead_short),
                    (low.long, low.overhead_long, high.overhead_long),
                )
            ),
        )

    def state(self) -> dict[str, Any]:
        return {
            "format": SHARE_FORMAT,
            "sizes": self.sizes.tolist(),
            "shares": {str(self.short): self.at_short.tolist(), str(self.long): self.at_long.tolist()},
            "overheads": {str(self.short): self.overhead_short.tolist(), str(self.long): self.overhead_long.tolist()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> TokenShare:
        """The share of :meth:`state`; a state of another :data:`SHARE_FORMAT` (one stored
        before the flat overheads were measured, or measured otherwise) raises ``ValueError``,
        so that it is measured again."""
        if state.get("format") != SHARE_FORMAT:
            raise ValueError(f"token share format {state.get('format')!r}, not {SHARE_FORMAT}")
        return cls(
            state["sizes"],
            {int(context): values for context, values in state["shares"].items()},
            {int(context): values for context, values in state["overheads"].items()},
        )


def measure_token_share(model: Any, batch: int, contexts: Sequence[int], rounds: int = 7) -> TokenShare:
    """:class:`TokenShare` of ``batch`` rows: at each padded size ``m`` of :data:`SHARE_SIZES`, a
    step where every row verifies ``m`` nodes against one where only the first row does (timed
    in the same run), and how much dearer than the padded step the flat one is where it is (its
    layout's overhead). A forward that cannot run flat measures a share near 0, as it should."""
    sizes = [1, *SHARE_SIZES]
    shares: dict[int, list[float]] = {}
    overheads: dict[int, list[float]] = {}
    for context in contexts:
        # Both layouts interleaved, the median of their rounds: the differences measured are a
        # few percent of a step, about the noise between two separate runs on a shared machine.
        samples = time_layouts(model, sizes, (False, True), context, rounds, batch=batch)
        uniform = {n: float(np.median(samples[(n, False)])) for n in sizes}
        single = {n: float(np.median(samples[(n, True)])) for n in sizes}
        values, extra = [], []
        curve = np.asarray([uniform[n] for n in sizes])
        for m in SHARE_SIZES:
            # single = T(m) - s * (T(m) - T(1 + (m - 1) / B)): flat_step_seconds solved for s.
            spread = float(np.interp(1 + (m - 1) / batch, sizes, curve))
            saved = uniform[m] - spread
            values.append(float(np.clip((uniform[m] - single[m]) / saved, 0.0, 1.0)) if saved > 0 else 0.0)
            # A flat step dearer than the padded one with every row at m: the flat layout's own work.
            extra.append(max(0.0, single[m] / uniform[m] - 1.0))
        shares[context] = values
        overheads[context] = extra
    return TokenShare(list(SHARE_SIZES), shares, overheads)


#: Weight of the newest drafted step in :class:`DraftPrice`'s factor, against the steps before
#: it (the newest 20 or so count).
DRAFT_PRICE_RATE = 0.05
#: Spread of one drafted step's log error assumed before any has run (weighing as one step):
#: a process's first drafted steps at a batch size are priced about 20% above the model.
DRAFT_PRICE_PRIOR_SPREAD = 0.2
#: One step's log error counts at most this much (a step slowed 4x by another process is not
#: what its nodes cost).
DRAFT_PRICE_CLIP = float(np.log(4.0))


class DraftPrice:
    """What a drafted batched step really costs above a plain one, against the cost model's
    price, learned from the drafted steps that ran at one batch size.

    The model prices a batched step from curves measured once with synthetic trees, all rows at
    one context, forwards alone (the uniform curve, and for a flat step the token share). A real
    drafted step pays for more than they see: the drafters' top-k of every verified node, the
    acceptance, the rows' cache moves, and a forward 7-15% dearer inside the engine than the same
    token counts timed alone (ragged rows timed alone cost what the curve says; the cause is not
    found). At 8 rows of SmolLM2-135M on this CPU drafted steps took 1.35-1.48x a plain step
    where the model said 1.22-1.26x, while the cut's expected tokens matched the committed ones,
    so drafting lost to plain decoding.
    The curves' own corrections did not catch it: a size's shape is learned slowly (it is the
    model's, a property of the device), the machine's load (followed fast) took up a block of
    drafted steps' error and gave it back in the plain block after, and a flat step's error
    reached the uniform curve at its padded size, which prices a flat step only in part.

    The factor multiplies the model's price above a plain step, for flat and padded steps alike.
    Its log is the weighted mean of the drafted steps' log errors, each earlier step weighing
    :data:`DRAFT_PRICE_RATE` less, beside a prior of factor 1 that weighs as one step: the first
    steps teach fast, and a change of load or prompts is followed. The cut prices with
    :meth:`cautious`, the factor one standard error higher (the errors' weighted spread over
    their effective count): a node whose gain is within what the price is known to miss is not
    verified. The prior's spread is :data:`DRAFT_PRICE_PRIOR_SPREAD`. A step that verifies no
    drafted node moves the factor back toward the prior (:meth:`forget`): a price too high to
    draft under would otherwise never be measured again.
    """

    def __init__(self) -> None:
        # Decayed sums over the steps and the prior: weights, their squares, weighted log
        # errors and their squares.
        self.weight = 1.0
        self.weight_squared = 1.0
        self.total = 0.0
        self.squares = DRAFT_PRICE_PRIOR_SPREAD**2
        self.steps = 0

    @property
    def log_factor(self) -> float:
        return self.total / self.weight

    @property
    def factor(self) -> float:
        """The learned factor on the model's price above a plain step."""
        return float(np.exp(self.log_factor))

    def standard_error(self) -> float:
        """The standard error of :attr:`log_factor` (a weighted mean of the steps' errors)."""
        variance = max(self.squares / self.weight - self.log_factor**2, 0.0)
        return float(np.sqrt(variance * self.weight_squared) / self.weight)

    def cautious(self) -> float:
        """The factor one standard error higher: the price the cut decides with."""
        return float(np.exp(self.log_factor + self.standard_error()))

    def forget(self) -> None:
        """One batched step that verified no drafted node: what the drafted steps taught fades
        toward the prior. A price learned high stops the cut from drafting, and with no drafted
        step it would never be corrected (SmolLM2-135M at 8 rows, a fresh cache: the first four
        drafted steps left the factor at 2.8, priced cautiously at 3.5x, and the cut verified
        no node for the rest of the process). Every sum moves toward the prior's by
        :data:`DRAFT_PRICE_RATE` (the prior alone is the limit): four drafted steps at 2.8x
        their model's price leave it at 2.8x cautiously, 1.9x after 50 idle steps and 1.3x
        after 100, so the nodes that clear the price are verified again and teach it."""
        keep = 1.0 - DRAFT_PRICE_RATE
        self.weight = keep * self.weight + DRAFT_PRICE_RATE
        self.weight_squared = keep * self.weight_squared + DRAFT_PRICE_RATE
        self.total = keep * self.total
        self.squares = keep * self.squares + DRAFT_PRICE_RATE * DRAFT_PRICE_PRIOR_SPREAD**2

    @staticmethod
    def scaled(step_seconds: np.ndarray, factor: float) -> np.ndarray:
        """``step_seconds`` (a plain step's first) with every price above a plain step times ``factor``."""
        steps = np.asarray(step_seconds, dtype=np.float64)
        scaled: np.ndarray = steps[0] + factor * (steps - steps[0])
        return scaled

    def observe(self, predicted: float, measured: float, plain: float) -> None:
        """Learn from one drafted step: its ``predicted`` seconds (the model's, factor 1), its
        ``measured`` seconds and a plain step's predicted seconds."""
        excess = predicted - plain
        if not (np.isfinite(measured) and measured > 0 and excess > 0):
            return
        # A step that ran no slower than a plain one says the price is low, not that it is 0.
        ratio = max(measured - plain, 0.25 * excess) / excess
        error = float(np.clip(np.log(ratio), -DRAFT_PRICE_CLIP, DRAFT_PRICE_CLIP))
        keep = 1.0 - DRAFT_PRICE_RATE
        self.weight = keep * self.weight + 1.0
        self.weight_squared = keep * keep * self.weight_squared + 1.0
        self.total = keep * self.total + error
        self.squares = keep * self.squares + error * error
        self.steps += 1


def interpolated(low: CostModel, high: CostModel, weight: float) -> CostModel:
    """A cost model whose measured curves are ``(1 - weight) * low + weight * high`` (no
    corrections yet), at ``low``'s context lengths and its sizes up to both curves' largest."""
    largest = min(low.max_size, high.max_size)
    sizes = low.sizes[low.sizes <= largest]
    seconds = {
        context: ((1 - weight) * low.measured_seconds(sizes, context) + weight * high.measured_seconds(sizes, context))
        .clip(min=1e-9)
        .tolist()
        for context in (low.short, low.long)
    }
    return CostModel(sizes.astype(int).tolist(), seconds)


def _measured_curves(model: CostModel) -> CostModel:
    """``model``'s measured curves without its corrections."""
    return CostModel(
        model.sizes.astype(int).tolist(),
        {model.short: model.curve_short.tolist(), model.long: model.curve_long.tolist()},
    )


#: Per-batch-size cost models of this process, by ``(cost key, batch size)``.
_batch_costs: dict[tuple[str, int], CostModel] = {}
#: The machine's load as this process's forwards of a target (by cost key) measured it last.
_machine_loads: dict[str, MachineLoad] = {}


def _path(key: str, batch: int) -> Any:
    return state.state_dir("cost") / f"{key}-b{batch}.json"


#: Per-batch-size token shares of this process, by ``(cost key, batch size)``.
_token_shares: dict[tuple[str, int], TokenShare] = {}


def _load_share(key: str, batch: int) -> TokenShare | None:
    cached = _token_shares.get((key, batch))
    if cached is None:
        stored = state.read_json(_path(key, batch))
        try:
            cached = TokenShare.from_state(stored["token_share"]) if stored else None
        except (KeyError, ValueError, TypeError):
            cached = None
        if cached is not None:
            _token_shares[(key, batch)] = cached
    return cached


def _without_shapes(stored: dict[str, Any]) -> dict[str, Any]:
    """A batch size's stored cost model without its per-size shapes (the plain size's folded
    into the level), as it is written and read.

    Drafted steps teach the shapes, in the same error as the process's drafted-step price
    (:class:`DraftPrice`, never stored), and only drafted steps correct them: a shape learned
    high stops the cut from drafting, so nothing corrects it. Stored, it outlived the process and
    the price it was learned beside: SmolLM2-135M at 16 rows on this CPU read a shape that priced
    every row's one more node at 1.65x a plain step, where the measured curve says 1.36x (timed
    alone, 1.30x), and no node paid again.
    """
    shape = stored.get("shape", {})
    plain = float(shape.get(str(size_bucket(1)), 1.0)) if isinstance(shape, dict) else 1.0
    return stored | {"shape": {}, "level": float(stored.get("level", 1.0)) * plain}


def _load(key: str, batch: int, max_size: int) -> CostModel | None:
    cached = _batch_costs.get((key, batch))
    if cached is None:
        stored = state.read_json(_path(key, batch))
        try:
            cached = CostModel.from_state(_without_shapes(stored["cost"])) if stored else None
        except (KeyError, ValueError):
            cached = None
    if cached is not None and cached.max_size < max_size:
        return None
    return cached


class BatchCosts:
    """The batched step's cost for every batch size a shrinking batch goes through.

    Batch size 1 is today's cost model (:func:`racer_rs.autosize.state.cost_model`); the powers of
    two from 2 up to the first one ``>= batch`` are measured on first use (or read from the cache);
    sizes in between are interpolated linearly in the batch size, each with its own corrections
    (level and shape); all of them share one :class:`MachineLoad` (the process's for this target),
    so a batch size met for the first time is predicted at the load the others are measuring.

    Args:
        model: the target.
        max_capacity: the largest tree size per row.
        batch: the batch's starting size.
    """

    def __init__(self, model: Any, max_capacity: int, batch: int) -> None:
        self.model = model
        self.key = state.cost_key(model)
        self.max_capacity = max_capacity
        self.machine = _machine_loads.setdefault(self.key, MachineLoad())
        self.models: dict[int, CostModel] = {1: state.cost_model(model, max_capacity)}
        self.models[1].machine = self.machine
        self.measured: dict[int, CostModel] = {}
        self.shares: dict[int, TokenShare] = {}
        for size in bucket_sizes(batch):
            loaded = _load(self.key, size, max_capacity)
            if loaded is None:
                loaded = measure_batch_cost_model(model, size, max_capacity)
            loaded.machine = self.machine
            self.models[size] = loaded
            self.measured[size] = _measured_curves(loaded)
            _batch_costs[(self.key, size)] = loaded
            share = _load_share(self.key, size)
            if share is None:
                share = measure_token_share(model, size, (loaded.short, loaded.long))
                _token_shares[(self.key, size)] = share
            self.shares[size] = share

    def for_batch(self, batch: int) -> CostModel:
        """The cost model of a step with ``batch`` live rows."""
        model = self.models.get(batch)
        if model is None:
            model = _load(self.key, batch, self.max_capacity)
            if model is None:
                low = 1 << (batch.bit_length() - 1)
                high = 2 * low
                if high not in self.measured:
                    raise InvalidArgumentError(f"batch size {batch} exceeds the batch these costs were measured for")
                model = interpolated(self.measured[low], self.measured[high], (batch - low) / (high - low))
            model.machine = self.machine
            self.models[batch] = model
            _batch_costs[(self.key, batch)] = model
        return model

    def token_share(self, batch: int) -> TokenShare:
        """The token share of a step with ``batch >= 2`` live rows (interpolated between the
        measured batch sizes as the cost curves are)."""
        share = self.shares.get(batch)
        if share is None:
            low = 1 << (batch.bit_length() - 1)
            high = 2 * low
            if low == 1 or high not in self.shares:
                raise InvalidArgumentError(f"batch size {batch} has no measured token share")
            share = TokenShare.blend(self.shares[low], self.shares[high], (batch - low) / (high - low))
            self.shares[batch] = share
        return share

    def save(self) -> None:
        """Store every batch size's (corrected) cost model on disk; batch size 1 as today's."""
        for batch, model in self.models.items():
            if batch == 1:
                state.save_cost_model(self.model, model)
                continue
            stored: dict[str, Any] = {"cost": _without_shapes(model.state()), "batch_size": batch}
            if batch in bucket_sizes(batch) and batch in self.shares:  # a measured size
                stored["token_share"] = self.shares[batch].state()
            state.write_json(_path(self.key, batch), stored)


def batch_costs(model: Any, max_capacity: int, batch: int) -> BatchCosts:
    """The batch's cost models (looked up at call time, so tests may substitute fixed ones)."""
    return BatchCosts(model, max_capacity, batch)
