"""Figures that survive a noisy machine: per-request speedups, geometric means, bootstrap intervals.

A shared machine's load comes in bursts; summed tokens over summed time lets one burst decide a
headline. Instead every method is compared with ``ar`` on the same request in the same run (the
methods of a request run back to back, in a rotating order), ``ar`` runs at the start and at the
end of each request's rotation, and a request whose two ``ar`` runs differ by more than
:data:`DISTURBED_RATIO` is flagged as disturbed: it is reported and left out of the aggregates.
Per-request speedups are aggregated by their geometric mean (the mean of log ratios, so a 2x
gain and a 2x loss cancel) with a percentile bootstrap 95% interval over requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Two ``ar`` runs of one request whose tokens/s differ by more than this factor mark it disturbed.
DISTURBED_RATIO = 1.25
#: Bootstrap resamples of the per-request ratios.
BOOTSTRAP_SAMPLES = 2000
#: The interval's coverage.
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """A geometric-mean ratio with its bootstrap interval.

    Attributes:
        value: the geometric mean (NaN without data).
        low, high: the interval's bounds (NaN with fewer than two requests).
        requests: how many per-request ratios it aggregates.
    """

    value: float
    low: float
    high: float
    requests: int

    def text(self) -> str:
        """``1.47x [1.30, 1.62]`` (no interval with one request; ``-`` without data)."""
        if math.isnan(self.value):
            return "-"
        if math.isnan(self.low):
            return f"{self.value:.2f}x"
        return f"{self.value:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def geometric_mean(ratios: Sequence[float], seed: int = 0) -> Estimate:
    """The geometric mean of positive ``ratios`` with a percentile bootstrap interval.

    The bootstrap is seeded, so a report's interval is reproducible from its records.
    """
    logs = np.log(np.asarray([r for r in ratios if r > 0 and math.isfinite(r)], dtype=np.float64))
    if logs.size == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    value = float(np.exp(logs.mean()))
    if logs.size < 2:
        return Estimate(value, math.nan, math.nan, 1)
    rng = np.random.default_rng(seed)
    samples = rng.integers(0, logs.size, size=(BOOTSTRAP_SAMPLES, logs.size))
    means = logs[samples].mean(axis=1)
    tail = (1.0 - CONFIDENCE) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Estimate(value, float(np.exp(low)), float(np.exp(high)), int(logs.size))


def disturbed(first: float, second: float) -> bool:
    """Whether two runs of the same work (tokens/s) differ by more than :data:`DISTURBED_RATIO`."""
    if not (first > 0 and second > 0):
        return True
    return max(first, second) / min(first, second) > DISTURBED_RATIO
