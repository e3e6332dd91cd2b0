"""``capacity="auto"``: each step verifies the tree prefix that maximises expected tokens per second.

A drafter proposes its tree at the largest allowed size; every node gets a calibrated acceptance
probability (:mod:`racer_rs.autosize.calibration`), nodes are ranked best first (probability, then
depth, so every prefix is a connected tree: a child never outranks its parent), and the step
keeps the ``n`` best that maximise

    (1 + sum of the kept drafted nodes' probabilities) / (t(n) + overhead)

with ``t`` the forward cost model of the target on its device (:class:`racer_rs.autosize.cost_model.
CostModel`). ``n = 1`` is a plain decoding step, chosen when no draft pays for its verification.
Only past outcomes and timings enter the choice, never the target's output for the step itself.
What the rule keeps across requests (the cost curve, the calibrations) is in
:mod:`racer_rs.autosize.state`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from racer_rs._native import DraftTree
from racer_rs.autosize.calibration import EdgeCalibration, path_probabilities
from racer_rs.autosize.cost_model import CostModel, bucket_start

#: With chain speculative sampling only verified nodes are evidence: after this many plain
#: decoding steps in a row, one step verifies the best drafted token anyway (at most one in
#: EXPLORE_AFTER + 1 steps costs a 2-token forward), so that a low estimate can recover.
EXPLORE_AFTER = 8


def best_prefix_size(probabilities: np.ndarray, step_seconds: np.ndarray) -> int:
    """The prefix size ``n`` (root included) with the most expected tokens per second.

    Args:
        probabilities: acceptance probabilities of the drafted nodes, best first (``n - 1`` of
            them are kept with a prefix of ``n``).
        step_seconds: predicted seconds of a step verifying ``1, 2, ...`` nodes; its length
            bounds ``n``.

    Returns:
        ``n >= 1``; ties go to the smaller tree.
    """
    limit = min(len(step_seconds), len(probabilities) + 1)
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(probabilities[: limit - 1])])
    rate = expected / np.asarray(step_seconds[:limit], dtype=np.float64)
    # Ties (to rounding) go to the smaller tree: a gain within float noise is no gain.
    return int(np.flatnonzero(rate >= rate.max() * (1 - 1e-9))[0]) + 1


def best_first_order(tree: DraftTree, probabilities: np.ndarray) -> np.ndarray:
    """Node indices by descending probability, shallower first on ties (root first)."""
    return np.lexsort((np.arange(len(tree)), tree.depths, -probabilities))


def subtree(tree: DraftTree, keep: np.ndarray) -> DraftTree:
    """The tree of the nodes ``keep`` (ascending, ancestor-closed, root included), BFS order kept."""
    new_index = np.full(len(tree), -1, dtype=np.int32)
    new_index[keep] = np.arange(len(keep), dtype=np.int32)
    parents = tree.parents[keep]
    parents = np.where(parents < 0, -1, new_index[np.maximum(parents, 0)]).astype(np.int32)
    return DraftTree(tree.tokens[keep], parents, tree.cells[keep])


@dataclass(frozen=True)
class SizeChoice:
    """One step's choice.

    Attributes:
        keep: ascending node indices of the drafter's tree to verify (a connected tree).
        expected: tokens the step is expected to commit (corrected estimate).
        uncorrected_extra: the kept drafted nodes' summed probabilities before the correction.
    """

    keep: np.ndarray
    expected: float
    uncorrected_extra: float


@dataclass(frozen=True)
class Ranking:
    """A drafter's tree ranked for a size choice.

    Attributes:
        order: node indices best first (root first; every prefix is a connected tree).
        probabilities: every node's calibrated path probability (tree order).
        corrected: the drafted nodes' probabilities in ``order[1:]``'s order, times the total's
            correction (:meth:`EdgeCalibration.extra_scale`), at most 1.
    """

    order: np.ndarray
    probabilities: np.ndarray
    corrected: np.ndarray

    def prefix(self, n: int) -> SizeChoice:
        """The choice that keeps the ``n`` best nodes (root included)."""
        return SizeChoice(
            np.sort(self.order[:n]),
            1.0 + float(self.corrected[: n - 1].sum()),
            float(self.probabilities[self.order[1:n]].sum()),
        )


class TreeSizer:
    """Chooses each step's tree size for one request and learns from its outcomes.

    Args:
        cost: the target's cost model (shared by the requests of this process).
        calibration: the request's edge calibration (warm-started by the caller).
        max_capacity: the largest tree.
    """

    def __init__(self, cost: CostModel, calibration: EdgeCalibration, max_capacity: int) -> None:
        self.cost = cost
        self.calibration = calibration
        self.max_capacity = max_capacity
        self.sizes: Counter[int] = Counter()
        self.predicted: list[float] = []
        self.observed: list[int] = []
        self.unverified_steps = 0  # plain steps in a row that gave a randomised calibration nothing

    def edge_probabilities(self) -> np.ndarray:
        """The calibrated probability of every edge cell (for drafters that build by it)."""
        return self.calibration.probabilities()

    def rank(self, tree: DraftTree) -> Ranking:
        """The drafter's tree best first, with calibrated and corrected probabilities."""
        probabilities = path_probabilities(tree, self.calibration.probabilities())
        order = best_first_order(tree, probabilities)
        scale = self.calibration.extra_scale()  # one factor for all: the ranking stays the same
        return Ranking(order, probabilities, np.minimum(probabilities[order[1:]] * scale, 1.0))

    def choose(self, tree: DraftTree, context: int) -> SizeChoice:
        """The nodes to verify and the tokens they are expected to commit (``1 +`` the sum of
        their acceptance probabilities, corrected by :meth:`EdgeCalibration.extra_scale`).

        Args:
            tree: the drafter's full tree.
            context: committed tokens (the forward's prefix length).
        """
        ranking = self.rank(tree)
        limit = min(len(tree), self.max_capacity)
        # Per-size corrections are learned from noisy steps; a bigger tree never costs less.
        steps = np.maximum.accumulate(self.cost.step_seconds(np.arange(1, limit + 1), context))
        n = best_prefix_size(ranking.corrected, steps)
        if n == 1 and limit > 1 and self.unverified_steps >= EXPLORE_AFTER:
            n = 2
        return ranking.prefix(n)

    def observe(
        self,
        full: DraftTree,
        choice: SizeChoice,
        path: list[int],
        bonus: int,
        randomized: bool,
        context: int,
        forward: float,
        step: float,
        committed: int,
    ) -> None:
        """Learn from one verified step.

        Args:
            full: the drafter's full tree; ``choice`` the step's choice from it.
            path: accepted node indices of the verified tree; ``bonus`` the token after them.
            randomized: acceptance was randomised (chain speculative sampling): only verified
                nodes are evidence then.
            context: the step's prefix length; ``forward`` and ``step`` its measured seconds.
            committed: tokens the step committed.
        """
        self.learn(full, choice, path, bonus, randomized, committed)
        self.cost.observe(len(choice.keep), context, forward, step - forward)

    def learn(
        self, full: DraftTree, choice: SizeChoice, path: list[int], bonus: int, randomized: bool, committed: int
    ) -> None:
        """The acceptance half of :meth:`observe`: calibration and statistics, not the cost model
        (a batched step's cost is observed once for the whole batch)."""
        keep = choice.keep
        accepted = keep[np.asarray(path, dtype=np.int64)]
        if randomized:
            self.calibration.observe_verified(subtree(full, keep), np.asarray(path))
            self.unverified_steps = self.unverified_steps + 1 if len(keep) == 1 and len(full) > 1 else 0
        else:
            self.calibration.observe_step(full, accepted, bonus)
        self.calibration.record_step(choice.uncorrected_extra, len(path) - 1)
        self.sizes[len(keep)] += 1
        self.predicted.append(choice.expected)
        self.observed.append(committed)

    def count_plain(self, committed: int) -> None:
        """Count a step that did not draft (nothing to learn: a plain step of size 1)."""
        self.sizes[1] += 1
        self.predicted.append(1.0)
        self.observed.append(committed)

    def report(self, context: int) -> dict[str, Any]:
        """Per-request statistics for ``GenerationResult.extras["auto_capacity"]``."""
        steps = len(self.observed)
        return {
            "max_capacity": self.max_capacity,
            "chosen_sizes": dict(sorted(self.sizes.items())),
            "steps": steps,
            "predicted_tokens_per_step": float(np.mean(self.predicted)) if steps else 0.0,
            "observed_tokens_per_step": float(np.mean(self.observed)) if steps else 0.0,
            "cost_curve_ms": self.cost.curve_ms(context),
            "overhead_ms": round(1000 * self.cost.overhead, 3),
            "load_factor": round(self.cost.load, 3),
            "level_factor": round(self.cost.level, 3),
            "shape_factors": {bucket_start(k): round(v, 3) for k, v in sorted(self.cost.shape.items())},
        }
