"""``capacity="auto"``: each step verifies the tree prefix that maximises expected tokens per second.

A drafter proposes its tree at the largest allowed size; every node gets a calibrated acceptance
probability (:mod:`racer_rs.autosize.calibration`), nodes are ranked best first (probability, then
depth, so every prefix is a connected tree: a child never outranks its parent), and the step
keeps the ``n`` best that maximise

    (1 + sum of the kept drafted nodes' probabilities) / (t(n) + overhead)

with ``t`` the forward cost model of the target on its device (:class:`racer_rs.autosize.cost_model.
CostModel`). ``n = 1`` is a plain decoding step, chosen when no draft pays for its verification.
Only past outcomes and timings enter the choice, never the target's output for the step itself.

The cost curve is measured once per model, device, dtype and thread count and cached on disk
with its online corrections; the calibration is kept per model, method and decoding mode and
warm-starts each request.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from racer_rs._io import write_text_atomically
from racer_rs._native import DraftTree
from racer_rs.autosize.calibration import EdgeCalibration, path_probabilities
from racer_rs.autosize.cost_model import CostModel, measure_cost_model

#: Cached-state format; files of another format are measured again.
STATE_FORMAT = 1
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
            "shape_factors": {1 << k: round(v, 3) for k, v in sorted(self.cost.shape.items())},
        }


# --- state shared across requests: in memory, and cached on disk ---------------------------

_costs: dict[str, CostModel] = {}
_calibrations: dict[str, dict[str, Any]] = {}


def model_key(model: Any) -> str:
    """A short identity of a model's weights and configuration (not its file's path)."""
    config = model.config.to_dict()
    config.pop("_name_or_path", None)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    parameters = list(model.parameters())
    digest.update(str(sum(p.numel() for p in parameters)).encode())
    for parameter in (parameters[0], parameters[-1]):
        digest.update(parameter.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _state_dir(kind: str) -> Path:
    from racer_rs.loading.gguf_cache import cache_root

    return cache_root() / "tree_size" / kind


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent, unreadable or half-written: measured again, never trusted
    return data if isinstance(data, dict) and data.get("format") == STATE_FORMAT else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (temporary file, then rename); a failure only loses the cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps({"format": STATE_FORMAT, **data}))
    except OSError:
        pass


def cost_key(model: Any) -> str:
    """Key of a cost curve: model, device (its kind and the hardware), dtype and torch's thread count."""
    import torch

    parameter = next(model.parameters())
    device = parameter.device
    dtype = str(parameter.dtype).removeprefix("torch.")
    return f"{model_key(model)}-{device.type}-{_hardware_id(device)}-{dtype}-{torch.get_num_threads()}t"


def _hardware_id(device: Any) -> str:
    """A short digest of the processor a curve is measured on: a cache folder may be shared by
    machines (a network home), and a curve's shape is the hardware's."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{platform.machine()}-{platform.processor()}-{_cpu_model()}-{os.cpu_count()}"
    return hashlib.sha256(name.encode()).hexdigest()[:8]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        return ""


def cost_model(model: Any, max_capacity: int) -> CostModel:
    """The model's cost model: from this process, else the disk cache, else measured now."""
    key = cost_key(model)
    cached = _costs.get(key)
    if cached is None:
        state = _read_json(_state_dir("cost") / f"{key}.json")
        try:
            cached = CostModel.from_state(state["cost"]) if state else None
        except (KeyError, ValueError):
            cached = None
    if cached is None or cached.max_size < max_capacity:
        cached = measure_cost_model(model, max_capacity)
    _costs[key] = cached
    return cached


def save_cost_model(model: Any, cost: CostModel) -> None:
    """Store the (corrected) cost model on disk."""
    _write_json(_state_dir("cost") / f"{cost_key(model)}.json", {"cost": cost.state()})


def calibration_key(model: Any, method: str, greedy: bool) -> str:
    """Key of a calibration: model, method and decoding mode."""
    return f"{model_key(model)}-{method}-{'greedy' if greedy else 'sampling'}"


def load_calibration(key: str) -> EdgeCalibration:
    """A calibration warm-started from this process's or the disk's last state for ``key``."""
    calibration = EdgeCalibration()
    state = _calibrations.get(key)
    if state is None:
        stored = _read_json(_state_dir("calibration") / f"{key}.json")
        state = stored.get("calibration") if stored else None
    if state is not None:
        with contextlib.suppress(ValueError, KeyError, TypeError):  # a damaged state: the priors
            calibration.load(state)
    return calibration


def save_calibration(key: str, calibration: EdgeCalibration) -> None:
    """Keep a request's final calibration for the next request (in memory and on disk)."""
    _calibrations[key] = calibration.state()
    _write_json(_state_dir("calibration") / f"{key}.json", {"calibration": _calibrations[key]})
