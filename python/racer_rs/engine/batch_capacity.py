"""How many draft-tree nodes each row of a batched step verifies: a fixed capacity, or one
``capacity="auto"`` budget for the whole batch (:mod:`racer_rs.autosize.batch_sizer`)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from racer_rs.drafters.base import Proposal
from racer_rs.engine.capacity import restrict

if TYPE_CHECKING:
    from racer_rs.autosize.sizer import SizeChoice, TreeSizer


@dataclass(frozen=True)
class BatchStepReport:
    """What a verified batched step tells the policy (lists follow ``rows``).

    Attributes:
        rows: the live rows (the batch's row indices), in batch order.
        full: the proposals drafted; ``verified`` the ones verified; ``choices`` the policy's.
        paths: accepted node indices of every verified tree; ``bonuses`` the tokens after them.
        committed: tokens every row committed.
        context: the step's prefix columns (the longest row's length).
        padded: nodes per row the forward processed (the step's largest tree).
        forward: seconds inside the target's forward; ``step`` seconds of the whole step.
    """

    rows: list[int]
    full: list[Proposal]
    verified: list[Proposal]
    choices: list[Any]
    paths: list[list[int]]
    bonuses: list[int]
    committed: list[int]
    context: int
    padded: int
    forward: float
    step: float


class FixedBatchCapacity:
    """Every row verifies its drafter's tree, of at most ``limit`` nodes (root included)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def edge_calibration(self) -> np.ndarray | None:
        """No calibration: drafters use their raw edge estimates."""
        return None

    def cut(self, proposals: list[Proposal], rows: Sequence[int], context: int) -> tuple[list[Proposal], list[Any]]:
        """The proposals as drafted."""
        return proposals, [None] * len(proposals)

    def observe(self, report: BatchStepReport) -> None:
        """Nothing to learn."""

    def finish(self, row: int, context: int) -> dict[str, Any]:
        """No statistics."""
        return {}

    def save(self) -> None:
        """Nothing to store."""


class AutoBatchCapacity:
    """``capacity="auto"`` for a batch: each step keeps every row's best nodes up to the padded
    size with the most expected tokens per second of the batched forward
    (:func:`racer_rs.autosize.batch_sizer.best_batch_size`), learning from every row's outcome.

    One calibration (per model, method and decoding mode, as one request's) learns from every
    row; the cost is the batched forward's for the step's batch size
    (:class:`racer_rs.autosize.batch_sizer.BatchCosts`). At one row this is :class:`AutoCapacity`.

    Args:
        model: the target.
        method: the drafter's name.
        greedy: whether the batch decodes greedily.
        max_capacity: the largest tree per row.
        rows: the batch's size.
    """

    def __init__(self, model: Any, method: str, greedy: bool, max_capacity: int, rows: int) -> None:
        from racer_rs.autosize import batch_sizer as batch_sizing
        from racer_rs.autosize import sizer, state

        started = time.perf_counter()
        self.limit = max_capacity
        self.key = state.calibration_key(model, method, greedy)
        self.calibration = state.load_calibration(self.key)
        self.costs = batch_sizing.batch_costs(model, max_capacity, rows)
        single = self.costs.for_batch(1)
        # One sizer per row for its ranking and statistics, all over the one shared calibration.
        self.sizers: list[TreeSizer] = [sizer.TreeSizer(single, self.calibration, max_capacity) for _ in range(rows)]
        self.batch_sizes: list[Counter[int]] = [Counter() for _ in range(rows)]
        self.padded_sizes: list[Counter[int]] = [Counter() for _ in range(rows)]
        self.first_batch: list[int | None] = [None] * rows
        self.setup_seconds = time.perf_counter() - started

    def edge_calibration(self) -> np.ndarray | None:
        """The calibrated acceptance probability of every edge cell."""
        return self.calibration.probabilities()

    def cut(
        self, proposals: list[Proposal], rows: Sequence[int], context: int
    ) -> tuple[list[Proposal], list[SizeChoice]]:
        """Every row's best-first prefix of at most the chosen padded size."""
        from racer_rs.autosize.batch_sizer import best_batch_size

        rankings = [self.sizers[row].rank(p.tree) for row, p in zip(rows, proposals, strict=True)]
        limits = [min(len(p.tree), self.limit) for p in proposals]
        cost = self.costs.for_batch(len(rows))
        # Per-size corrections are learned from noisy steps; a bigger tree never costs less.
        steps = np.maximum.accumulate(cost.step_seconds(np.arange(1, max(limits) + 1), context))
        size = best_batch_size([r.corrected[: n - 1] for r, n in zip(rankings, limits, strict=True)], steps)
        choices = [r.prefix(min(size, n)) for r, n in zip(rankings, limits, strict=True)]
        return [restrict(p, c.keep) for p, c in zip(proposals, choices, strict=True)], choices

    def observe(self, report: BatchStepReport) -> None:
        """Learn every row's acceptance and the batched forward's cost from one step."""
        batch = len(report.rows)
        for index, row in enumerate(report.rows):
            self.sizers[row].learn(
                report.full[index].tree,
                report.choices[index],
                report.paths[index],
                report.bonuses[index],
                randomized=False,
                committed=report.committed[index],
            )
            self.batch_sizes[row][batch] += 1
            self.padded_sizes[row][report.padded] += 1
            if self.first_batch[row] is None:
                self.first_batch[row] = batch
        self.costs.for_batch(batch).observe(report.padded, report.context, report.forward, report.step - report.forward)

    def finish(self, row: int, context: int) -> dict[str, Any]:
        """Row ``row``'s statistics (``extras["auto_capacity"]``): its chosen sizes and
        predictions, and the cost curve of the batch size it started in."""
        report = self.sizers[row].report(context)
        cost = self.costs.for_batch(self.first_batch[row] or 1)
        report["cost_curve_ms"] = cost.curve_ms(context)
        report["overhead_ms"] = round(1000 * cost.overhead, 3)
        report["batch_sizes"] = dict(sorted(self.batch_sizes[row].items()))
        report["padded_sizes"] = dict(sorted(self.padded_sizes[row].items()))
        report["cost_model"] = "per batch size (1: the single-request curve; 2, 4, 8, ...: measured batched)"
        return {"auto_capacity": report | {"setup_s": self.setup_seconds}}

    def save(self) -> None:
        """Store the calibration and every batch size's cost model for later requests."""
        from racer_rs.autosize import state

        state.save_calibration(self.key, self.calibration)
        self.costs.save()


BatchCapacityPolicy = FixedBatchCapacity | AutoBatchCapacity
