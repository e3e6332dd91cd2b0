"""How likely each drafted node is to be accepted: per-edge-cell calibration, learned online.

Every draft-tree node records the cell of the edge that drafted it (``DraftTree.cells``: chain
depth, copy-logit probability or rank, retrieval match length and share, from the request's own
automaton or a shared one). Given that its parent is
accepted, a node is accepted with a probability that depends mostly on that cell, so counting
outcomes per cell calibrates it:

    q(cell) = (accepted(cell) + w * prior(cell)) / (tried(cell) + w)

and a node's acceptance probability is the product of ``q`` along its path. By linearity, a tree
is then expected to commit ``1 + sum of its drafted nodes' path probabilities`` tokens per step.

Outcomes are observed for every child of an accepted node in the drafter's FULL tree, whether
the step verified it or a size choice cut it: the target's token after an accepted node is known
(the next accepted token, or the bonus), and a child is accepted exactly when it carries that
token. So cutting nodes never starves a cell of evidence. With draft probabilities (chain
speculative sampling) acceptance is randomised, and only verified nodes are observed; the size
choice then verifies a drafted token now and then even when plain decoding looks best
(:data:`racer_rs.autosize.sizer.EXPLORE_AFTER`), or a low estimate could never be corrected.

Cells of one monotone group (:func:`racer_rs._native.edge_cell_groups`: copy-logit probability
buckets, retrieval count-estimate buckets at one match length) stand for rising raw estimates, so
their calibrated probabilities are kept non-decreasing across the group (a weighted isotonic
fit): more evidence for a continuation never makes it less likely, however noisy the counts.

Per-cell estimates are noisy, and a size choice keeps the nodes whose estimates came out high,
so summed path probabilities overstate what a chosen tree commits (and products along a path
assume independence). One more factor corrects the total: the ratio of drafted tokens committed
to drafted tokens expected over the steps so far (:meth:`EdgeCalibration.extra_scale`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from racer_rs._native import EDGE_CELLS, DraftTree, edge_cell_groups, edge_cell_priors
from racer_rs._native import monotone_fit as _monotone_fit
from racer_rs.errors import InvalidArgumentError

#: Weight of a cell's prior, in observations: small, since the priors are raw estimates that
#: measured acceptance soon replaces.
PRIOR_WEIGHT = 2.0
#: A warm start keeps at most this many observations per cell, so a request's own outcomes
#: soon outweigh what earlier requests (maybe of another kind of text) left behind.
WARM_START_CAP = 64.0
#: Pseudo-count, in drafted tokens, of the total's correction factor (it starts at 1).
SCALE_PRIOR = 4.0
#: A warm start keeps at most this many expected drafted tokens behind the correction factor.
SCALE_WARM_START_CAP = 256.0


class EdgeCalibration:
    """Per-cell acceptance counts and the calibrated edge probabilities they give."""

    def __init__(self) -> None:
        self.priors = edge_cell_priors().astype(np.float64)
        self.accepted = np.zeros(EDGE_CELLS, dtype=np.float64)
        self.tried = np.zeros(EDGE_CELLS, dtype=np.float64)
        self.expected_extra = 0.0
        self.committed_extra = 0.0
        self._probabilities: np.ndarray | None = None  # cached until the counts change

    def extra_scale(self) -> float:
        """Drafted tokens committed per drafted token the uncorrected estimates expected."""
        return (self.committed_extra + SCALE_PRIOR) / (self.expected_extra + SCALE_PRIOR)

    def record_step(self, expected_extra: float, committed_extra: int) -> None:
        """Count one step: the drafted tokens its kept nodes' (uncorrected) probabilities summed
        to, and the drafted tokens it committed."""
        self.expected_extra += expected_extra
        self.committed_extra += committed_extra

    def probabilities(self) -> np.ndarray:
        """``float32[EDGE_CELLS]``: calibrated probability that an edge of each cell is accepted
        (smoothed towards the cell's prior, non-decreasing within each monotone group)."""
        if self._probabilities is None:
            weights = self.tried + PRIOR_WEIGHT
            smoothed = (self.accepted + PRIOR_WEIGHT * self.priors) / weights
            self._probabilities = monotone_fit(smoothed, weights, _GROUPS).astype(np.float32)
            self._probabilities.flags.writeable = False
        return self._probabilities

    def observe(self, cells: np.ndarray, accepted: np.ndarray) -> None:
        """Count outcomes: edge ``cells[i]`` was accepted iff ``accepted[i]``."""
        cells = np.asarray(cells, dtype=np.int64)
        np.add.at(self.tried, cells, 1.0)
        np.add.at(self.accepted, cells, np.asarray(accepted, dtype=np.float64))
        self._probabilities = None

    def observe_step(self, tree: DraftTree, path: np.ndarray, bonus: int) -> None:
        """Outcomes of every child of an accepted node of ``tree`` (see the module docstring).

        Args:
            tree: the drafter's full tree (before any cut).
            path: accepted node indices of ``tree``, root first.
            bonus: the target's token after the last accepted node.
        """
        path = np.asarray(path, dtype=np.int64)
        parents = tree.parents
        if len(parents) < 2:
            return
        # The target's token after each accepted node: the next accepted node's, then the bonus.
        after = np.full(len(parents), -1, dtype=np.int64)
        tokens = tree.tokens
        after[path] = np.append(tokens[path[1:]], bonus)
        children = np.flatnonzero(after[parents[1:]] >= 0) + 1  # nodes whose parent was accepted
        self.observe(tree.cells[children], tokens[children] == after[parents[children]])

    def observe_verified(self, tree: DraftTree, path: np.ndarray) -> None:
        """Outcomes of the verified children of accepted nodes (randomised acceptance)."""
        accepted = np.zeros(len(tree), dtype=bool)
        accepted[np.asarray(path, dtype=np.int64)] = True
        children = np.flatnonzero(accepted[tree.parents[1:]]) + 1
        self.observe(tree.cells[children], accepted[children])

    def state(self) -> dict[str, Any]:
        """The counts, for :meth:`load` (JSON-ready)."""
        return {
            "accepted": self.accepted.tolist(),
            "tried": self.tried.tolist(),
            "expected_extra": self.expected_extra,
            "committed_extra": self.committed_extra,
        }

    def load(self, state: dict[str, Any], cap: float = WARM_START_CAP) -> None:
        """Warm-start from :meth:`state`, scaling each cell down to at most ``cap`` observations.

        A state saved before cells were appended (fewer counts: new blocks only ever follow
        the older ones) loads into the cells it knew; the newer cells start from their priors.

        Raises:
            ValueError: the state does not hold one count per cell (or fewer, for an older
                layout), or invalid counts or totals (nothing is loaded then).
        """
        accepted = np.asarray(state["accepted"], dtype=np.float64)
        tried = np.asarray(state["tried"], dtype=np.float64)
        if accepted.ndim != 1 or accepted.shape != tried.shape or not 0 < len(tried) <= EDGE_CELLS:
            raise InvalidArgumentError(f"calibration state must hold {EDGE_CELLS} counts per field")
        accepted, tried = (np.pad(x, (0, EDGE_CELLS - len(x))) for x in (accepted, tried))
        if not (np.all(np.isfinite(tried)) and np.all(tried >= 0) and np.all((accepted >= 0) & (accepted <= tried))):
            raise InvalidArgumentError("calibration state holds invalid counts")
        expected, committed = float(state.get("expected_extra", 0.0)), float(state.get("committed_extra", 0.0))
        if not (np.isfinite(expected) and np.isfinite(committed) and expected >= 0 and committed >= 0):
            raise InvalidArgumentError("calibration state holds invalid totals")
        scale = np.minimum(1.0, cap / np.maximum(tried, 1e-9))
        self.accepted, self.tried = accepted * scale, tried * scale
        self._probabilities = None
        shrink = min(1.0, SCALE_WARM_START_CAP / max(expected, 1e-9))
        self.expected_extra, self.committed_extra = expected * shrink, committed * shrink


#: Every cell's monotone group (-1: none), from the Rust core's cell layout.
_GROUPS = edge_cell_groups()


def monotone_fit(values: np.ndarray, weights: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``float64``: ``values`` made non-decreasing (in index order) within each group of
    ``groups`` by the weighted isotonic fit (pool adjacent violators, in the Rust core: a vLLM
    proposer refits every call); cells of group -1 are left as they are.

    The fit moves no weighted mass between groups: each group's weighted mean is kept.

    Raises:
        InvalidArgumentError: the lengths differ, a value is not finite or a weight is not
            positive and finite.
    """
    fitted: np.ndarray = _monotone_fit(
        np.asarray(values, dtype=np.float64), np.asarray(weights, dtype=np.float64), np.asarray(groups, dtype=np.int64)
    )
    return fitted


def path_probabilities(tree: DraftTree, edge_probabilities: np.ndarray) -> np.ndarray:
    """``float64[n]``: each node's probability of being accepted (the root's is 1).

    The product of the calibrated edge probabilities along the node's path, computed depth by
    depth (parents precede children in BFS order).
    """
    parents, depths = tree.parents, tree.depths
    probs = np.ones(len(parents), dtype=np.float64)
    if len(parents) > 1:
        edge = np.asarray(edge_probabilities, dtype=np.float64)[tree.cells[1:]]
        for depth in range(1, int(depths[-1]) + 1):
            level = np.flatnonzero(depths == depth)
            probs[level] = probs[parents[level]] * edge[level - 1]
    return probs
