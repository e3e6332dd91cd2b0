"""Which drafted tokens pay for their verification in a batched engine step.

An engine such as vLLM verifies every drafted token of every running request in one forward, whose
time grows with the tokens it processes: on a CPU, step seconds ``t(N) = a + b * N`` for ``N``
tokens (one per request plus its drafts). A drafted token at chain position ``j`` is accepted with
the product of its chain's calibrated edge probabilities up to ``j``
(:class:`racer_rs.autosize.calibration.EdgeCalibration`), so a step with ``R`` requests that
verifies the drafted tokens ``S`` is expected to yield ``(R + sum of P over S) / t(R + |S|)``
tokens per second. :func:`racer_rs._native.choose_chains` keeps the most probable tokens, across
the whole batch, that maximise it: at one request the fixed cost ``a`` makes nearly any draft pay;
at eight, only the likely ones do. :class:`StepCost` learns ``a`` and ``b`` from the engine's own
step times, and the time of each token count it has seen: a CPU forward's time is a staircase
more than a line (vLLM's bfloat16 SmolLM2-135M-Instruct at 8 requests on this CPU: 37-41 ms for
8 to 16 tokens, then 45 ms from 17, its matrix kernels working in blocks of 16 rows), and the
cut stops below a stair that the next tokens do not pay for.
"""

from __future__ import annotations

import numpy as np

from racer_rs._native import monotone_fit

#: Prior per-token share of the step, ``b / a``, before timings say otherwise (SmolLM2-135M on
#: two CPU cores: about 60 ms per step plus 1.5-5 ms per verified token).
PRIOR_RATIO = 1.0 / 32.0
#: Weight of the prior slope, in tokens squared of observed spread (small: timings soon win).
PRIOR_WEIGHT = 64.0
#: Least seconds per step the fit gives (steps timed at zero, by a stopped clock, still cost).
_MIN_SECONDS = 1e-9
#: Per observed step, the older steps' weight is multiplied by this (load changes over time).
DECAY = 0.995
#: Step times are kept per token count up to this count (beyond it, the line alone).
MEASURED_TOKENS = 256
#: Weight of the line at each token count, in steps: a count's own timings soon outweigh it,
#: and counts never seen (or not for a long while) follow it.
LINE_WEIGHT = 2.0


class StepCost:
    """``t(N) = a + b * N``, least squares over decayed step timings, its slope shrunk towards
    ``PRIOR_RATIO * a`` where the observed token counts hardly vary."""

    def __init__(self) -> None:
        self.weight = 0.0
        # Decayed sums of x, y, x*x and x*y (x tokens, y seconds); the weight is the sum of 1.
        # Plain floats: the proposer updates them every step, where numpy's overhead showed.
        self._sums = (0.0, 0.0, 0.0, 0.0)
        # Per token count, decayed steps and their seconds.
        self._steps = np.zeros(MEASURED_TOKENS + 1)
        self._seconds = np.zeros(MEASURED_TOKENS + 1)

    def observe(self, tokens: int, seconds: float) -> None:
        """Count one step of ``tokens`` verified tokens that took ``seconds``."""
        x, y = float(tokens), float(seconds)
        sx, sy, sxx, sxy = self._sums
        self._sums = (sx * DECAY + x, sy * DECAY + y, sxx * DECAY + x * x, sxy * DECAY + x * y)
        self.weight = self.weight * DECAY + 1.0
        self._steps *= DECAY
        self._seconds *= DECAY
        if 0 <= tokens <= MEASURED_TOKENS:
            self._steps[tokens] += 1.0
            self._seconds[tokens] += y

    def measured(self, most_tokens: int) -> np.ndarray:
        """``float64[min(most_tokens, MEASURED_TOKENS) + 1]``: seconds of a step verifying ``n``
        tokens: each count's own mean blended with the line (:data:`LINE_WEIGHT` steps of it),
        made non-decreasing in ``n`` by the weighted isotonic fit (a slow step at one count
        is averaged with its neighbours, not carried to every count above it)."""
        end = max(0, min(most_tokens, MEASURED_TOKENS)) + 1
        a, b = self.coefficients()
        line = a + b * np.arange(end)
        weights = self._steps[:end] + LINE_WEIGHT
        blended = (self._seconds[:end] + LINE_WEIGHT * line) / weights
        fitted: np.ndarray = np.maximum(monotone_fit(blended, weights, np.zeros(end, dtype=np.int64)), _MIN_SECONDS)
        return fitted

    def predicted(self, tokens: int) -> float:
        a, b = self.coefficients()
        return a + b * tokens

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)``: seconds per step and per verified token (``(1, PRIOR_RATIO)`` before any step)."""
        (sx, sy, sxx, sxy), w = self._sums, self.weight
        if w <= 0:
            return 1.0, PRIOR_RATIO
        mx, my = sx / w, sy / w
        var, cov = max(sxx / w - mx * mx, 0.0), sxy / w - mx * my
        prior = PRIOR_RATIO * my / (1.0 + PRIOR_RATIO * mx)  # the slope making b = r * a at the mean
        slope = (cov * w + PRIOR_WEIGHT * prior) / (var * w + PRIOR_WEIGHT)
        slope = max(slope, 1e-3 * prior)
        return max(my - slope * mx, slope, _MIN_SECONDS), slope
