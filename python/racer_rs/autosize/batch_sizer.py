"""``capacity="auto"`` for a batch: one node budget for every row of the batched forward.

A batched step verifies every live row's tree in one forward padded to the step's largest tree,
so it processes ``B x n_max`` tree tokens whatever the rows' own sizes: its cost is ``T_B(n_max)``,
the batched forward's measured cost curve for ``B`` rows (plus the step's time outside the forward,
learned online). Given ``n_max = m``, a row's nodes up to ``m`` cost nothing more (they fill
padding), so every row keeps its ``min(m, |tree_b|)`` best nodes (best first by calibrated
probability, as one request does) and the step chooses the ``m`` with the most expected tokens
per second over the whole batch:

    sum over rows b of (1 + sum of row b's kept drafted nodes' probabilities) / T_B(m)

(:func:`best_batch_size`). A node's depth and row only matter through its probability: deeper
levels are bought for every row at once, and pay when the rows' next-best nodes together are worth
the forward's extra cost. At one row this is exactly :func:`racer_rs.autosize.sizer.best_prefix_size`.

Cost curves (:class:`BatchCosts`) are **keyed by batch size**, not modelled over total tokens: a
row reads its own KV prefix (memory traffic ``~ B x P``) and attends over it (``~ B x m x P``), so
8 rows of 4 nodes do not cost what 1 row of 32 nodes does, most of all on accelerators, where a
small forward is bound by reading weights and KV rather than by its token count. Batch size 1 is
:func:`racer_rs.autosize.state.cost_model` itself (today's curve, measured with the single-request
path, with its corrections); sizes 2, 4, 8, ... are measured with the real batched path
(:class:`racer_rs.target.batch_verifier.BatchVerifier`: padded trees, 4D masks, per-row
positions) at the same two context lengths, sizes in between interpolated linearly in ``B``; every
batch size keeps its own online corrections (load, shape, overhead: see
:class:`racer_rs.autosize.cost_model.CostModel`). All are cached on disk next to
today's curve (``<cost key>-b<B>.json``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from racer_rs.autosize import state
from racer_rs.autosize.cost_model import CURVE_CONTEXTS, CostModel, MachineLoad, measure_forward_cost
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


def _load(key: str, batch: int, max_size: int) -> CostModel | None:
    cached = _batch_costs.get((key, batch))
    if cached is None:
        stored = state.read_json(_path(key, batch))
        try:
            cached = CostModel.from_state(stored["cost"]) if stored else None
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
        for size in bucket_sizes(batch):
            loaded = _load(self.key, size, max_capacity)
            if loaded is None:
                loaded = measure_batch_cost_model(model, size, max_capacity)
            loaded.machine = self.machine
            self.models[size] = loaded
            self.measured[size] = _measured_curves(loaded)
            _batch_costs[(self.key, size)] = loaded

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

    def save(self) -> None:
        """Store every batch size's (corrected) cost model on disk; batch size 1 as today's."""
        for batch, model in self.models.items():
            if batch == 1:
                state.save_cost_model(self.model, model)
            else:
                state.write_json(_path(self.key, batch), {"cost": model.state(), "batch_size": batch})


def batch_costs(model: Any, max_capacity: int, batch: int) -> BatchCosts:
    """The batch's cost models (looked up at call time, so tests may substitute fixed ones)."""
    return BatchCosts(model, max_capacity, batch)
