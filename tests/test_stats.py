"""The shared chi-square helper accepts exact samples and rejects wrong or impossible ones."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from tests.stats import chi_square_pvalue, pvalue_of_array  # noqa: E402

ALPHA = 1e-3
# Many small cells (pooled) and a few zero cells, as in the sampling tests.
PROBS = [0.3, 0.25, 0.2, 0.1, 0.08, 0.04, 0.02, 0.005, 0.004, 0.001, 0.0, 0.0]


def _sample(probs: list[float], runs: int, seed: int) -> Counter[int]:
    generator = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(torch.tensor(probs), runs, replacement=True, generator=generator)
    return Counter(draws.tolist())


@pytest.mark.parametrize("seed", range(5))
def test_exact_samples_pass(seed: int) -> None:
    runs = 3000
    counts = _sample(PROBS, runs, seed)
    assert chi_square_pvalue(counts, dict(enumerate(PROBS)), runs) > ALPHA
    assert pvalue_of_array([counts[i] for i in range(len(PROBS))], PROBS) > ALPHA


def test_a_wrong_distribution_fails() -> None:
    runs = 3000
    shifted = PROBS[1:2] + PROBS[:1] + PROBS[2:]  # the two most likely outcomes swapped
    counts = _sample(shifted, runs, 0)
    assert chi_square_pvalue(counts, dict(enumerate(PROBS)), runs) < ALPHA


@pytest.mark.parametrize("listed", [True, False])
def test_one_impossible_outcome_fails_however_the_rest_looks(listed: bool) -> None:
    runs = 3000
    counts = Counter({i: round(p * runs) for i, p in enumerate(PROBS)})  # a perfect fit...
    counts[0] -= 1
    counts[len(PROBS) - 1] += 1  # ...but one sample of a zero-probability outcome
    expected = dict(enumerate(PROBS)) if listed else {i: p for i, p in enumerate(PROBS) if p > 0}
    assert sum(counts.values()) == runs
    assert chi_square_pvalue(counts, expected, runs) == 0.0
    assert pvalue_of_array([counts[i] for i in range(len(PROBS))], PROBS) == 0.0
    # The same perfect fit without the impossible outcome passes: the zero p-value is due to it.
    counts[len(PROBS) - 1] -= 1
    counts[0] += 1
    assert chi_square_pvalue(counts, expected, runs) > 0.5


def test_counts_must_add_up_to_runs() -> None:
    with pytest.raises(ValueError, match="runs"):
        chi_square_pvalue(Counter({0: 3}), {0: 0.5, 1: 0.5}, 4)
