"""How many draft-tree nodes a step verifies: a fixed capacity, or ``capacity="auto"``.

The decode loop asks its policy for the drafter's node limit and edge calibration before drafting,
lets it cut the proposal before verifying, and reports each step's outcome back; a fixed policy
does nothing more than bound the tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from racer_rs.drafters.base import Proposal

if TYPE_CHECKING:
    from racer_rs.autosize.sizer import SizeChoice, TreeSizer


@dataclass(frozen=True)
class StepReport:
    """What a verified step tells the policy.

    Attributes:
        full: the proposal the drafter made; ``verified`` the one the step verified.
        choice: the policy's own choice for the step (``None`` for a fixed capacity).
        path: accepted node indices of the verified tree; ``bonus`` the token after them.
        randomized: acceptance was randomised (chain speculative sampling).
        context: the step's prefix length.
        forward: seconds inside the target's forward; ``step`` seconds of the whole step.
        committed: tokens the step committed.
    """

    full: Proposal
    verified: Proposal
    choice: Any
    path: list[int]
    bonus: int
    randomized: bool
    context: int
    forward: float
    step: float
    committed: int


class FixedCapacity:
    """Every step verifies the drafter's tree, of at most ``limit`` nodes (root included)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def edge_calibration(self) -> np.ndarray | None:
        """No calibration: drafters use their raw edge estimates."""
        return None

    def cut(self, proposal: Proposal, context: int) -> tuple[Proposal, Any]:
        """The proposal as drafted."""
        return proposal, None

    def observe(self, report: StepReport) -> None:
        """Nothing to learn."""

    def finish(self, context: int) -> dict[str, Any]:
        """No statistics."""
        return {}


class AutoCapacity:
    """``capacity="auto"``: each step verifies the tree prefix with the most expected tokens per
    second (:class:`racer_rs.autosize.sizer.TreeSizer`), learning from every outcome.

    Args:
        model: the target (its cost model and calibration are keyed by it).
        method: the drafter's name (calibrations are kept per method and decoding mode).
        greedy: whether the request decodes greedily.
        max_capacity: the largest tree.
    """

    def __init__(self, model: Any, method: str, greedy: bool, max_capacity: int) -> None:
        from racer_rs.autosize import sizer, state

        started = time.perf_counter()
        self.model = model
        self.limit = max_capacity
        self.key = state.calibration_key(model, method, greedy)
        self.sizer: TreeSizer = sizer.TreeSizer(
            state.cost_model(model, max_capacity), state.load_calibration(self.key), max_capacity
        )
        # The cost curve's measurement on first use (a part of the request's total time).
        self.setup_seconds = time.perf_counter() - started

    def edge_calibration(self) -> np.ndarray | None:
        """The calibrated acceptance probability of every edge cell."""
        return self.sizer.edge_probabilities()

    def cut(self, proposal: Proposal, context: int) -> tuple[Proposal, SizeChoice]:
        """The best-first prefix of the drafter's tree that the size rule chooses."""
        choice = self.sizer.choose(proposal.tree, context)
        return restrict(proposal, choice.keep), choice

    def observe(self, report: StepReport) -> None:
        """Learn acceptance and cost from one verified step."""
        self.sizer.observe(
            report.full.tree,
            report.choice,
            report.path,
            report.bonus,
            randomized=report.randomized,
            context=report.context,
            forward=report.forward,
            step=report.step,
            committed=report.committed,
        )

    def finish(self, context: int) -> dict[str, Any]:
        """Store the calibration and cost model for later requests; the request's statistics."""
        from racer_rs.autosize import state

        state.save_calibration(self.key, self.sizer.calibration)
        state.save_cost_model(self.model, self.sizer.cost)
        return {"auto_capacity": self.sizer.report(context) | {"setup_s": self.setup_seconds}}


def restrict(proposal: Proposal, keep: np.ndarray) -> Proposal:
    """The proposal restricted to the nodes ``keep`` (a connected prefix of the tree)."""
    from racer_rs.autosize.sizer import subtree

    if len(keep) == len(proposal.tree):
        return proposal
    probs = proposal.draft_probs
    # A chain's best-first prefix is its first nodes, so its draft probabilities stay aligned.
    return Proposal(subtree(proposal.tree, keep), None if probs is None else probs[: len(keep) - 1])


CapacityPolicy = FixedCapacity | AutoCapacity
