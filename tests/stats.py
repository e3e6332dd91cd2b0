"""The chi-square goodness-of-fit test shared by the distribution tests.

An outcome the exact distribution gives probability zero (an impossible outcome) fails the
test outright, whatever the other counts: pooling it with small cells, or dropping cells of
zero expectation, would let a lossy rule that emits impossible tokens pass.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

MIN_EXPECTED = 5.0
"""Cells expecting fewer samples than this are pooled into one cell (the usual rule)."""


def chi_square_pvalue(observed: Mapping[Hashable, int], expected: Mapping[Hashable, float], runs: int) -> float:
    """Goodness-of-fit p-value of ``observed`` counts against ``expected`` probabilities.

    Args:
        observed: count of every outcome seen (outcomes absent from ``expected`` allowed).
        expected: exact probability of every possible outcome; cells of probability 0 may be
            listed or left out, both mean "impossible".
        runs: number of samples (the sum of ``observed``).

    Returns:
        The p-value; 0.0 as soon as one impossible outcome was observed.
    """
    if sum(observed.values()) != runs:
        raise ValueError(f"observed counts sum to {sum(observed.values())}, not runs={runs}")
    possible = {cell: p for cell, p in expected.items() if p > 0}
    if any(count > 0 and cell not in possible for cell, count in observed.items()):
        return 0.0
    statistic, cells = 0.0, 0
    pooled_observed, pooled_expected = 0, 0.0
    for cell, probability in possible.items():
        mean = probability * runs
        if mean >= MIN_EXPECTED:
            statistic += (observed.get(cell, 0) - mean) ** 2 / mean
            cells += 1
        else:
            pooled_observed += observed.get(cell, 0)
            pooled_expected += mean
    if pooled_expected > 0:
        statistic += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        cells += 1
    if cells < 2:
        raise ValueError("the chi-square test needs at least two cells")
    return chi_square_survival(statistic, cells - 1)


def chi_square_survival(statistic: float, dof: int) -> float:
    """``P(X >= statistic)`` for ``X`` chi-square with ``dof`` degrees of freedom."""
    import torch

    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(statistic / 2)))


def pvalue_of_array(observed_counts: Sequence[int], expected_probs: Sequence[float]) -> float:
    """:func:`chi_square_pvalue` for outcomes ``0..V-1`` given as arrays of counts and probabilities."""
    observed = {i: int(c) for i, c in enumerate(observed_counts) if int(c) > 0}
    expected = {i: float(p) for i, p in enumerate(expected_probs)}
    return chi_square_pvalue(observed, expected, int(sum(int(c) for c in observed_counts)))
