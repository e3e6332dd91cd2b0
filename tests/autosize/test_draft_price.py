"""The drafted-step price (:class:`racer_rs.autosize.batch_sizer.DraftPrice`) against a small
pure-Python oracle: a weighted mean of the steps' log errors beside a prior of factor 1."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from racer_rs.autosize.batch_sizer import (
    DRAFT_PRICE_CLIP,
    DRAFT_PRICE_PRIOR_SPREAD,
    DRAFT_PRICE_RATE,
    DraftPrice,
)


def oracle(errors: list[float]) -> tuple[float, float]:
    """(mean, standard error) of the log errors, step ``i`` of ``n`` weighing ``keep ** (n - i)``
    and the prior (0, spread :data:`DRAFT_PRICE_PRIOR_SPREAD`) ``keep ** n``."""
    keep = 1 - DRAFT_PRICE_RATE
    n = len(errors)
    weights = [keep**n] + [keep ** (n - 1 - i) for i in range(n)]
    values = [0.0, *errors]
    total = sum(weights)
    mean = sum(w * v for w, v in zip(weights, values, strict=True)) / total
    # The prior contributes its spread around 0 as well as its value.
    squares = sum(w * v * v for w, v in zip(weights[1:], errors, strict=True))
    second = (weights[0] * DRAFT_PRICE_PRIOR_SPREAD**2 + squares) / total
    variance = max(second - mean * mean, 0.0)
    return mean, math.sqrt(variance * sum(w * w for w in weights)) / total


steps = st.lists(st.tuples(st.floats(0.1, 3.0), st.floats(0.5, 5.0)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_the_price_is_the_oracle_s_weighted_mean(observations: list[tuple[float, float]]) -> None:
    price = DraftPrice()
    errors = []
    for excess, ratio in observations:
        plain = 1.0
        price.observe(plain + excess, plain + ratio * excess, plain)
        errors.append(float(np.clip(np.log(max(ratio, 0.25)), -DRAFT_PRICE_CLIP, DRAFT_PRICE_CLIP)))
    mean, error = oracle(errors)
    assert price.log_factor == pytest.approx(mean, abs=1e-9)
    assert price.standard_error() == pytest.approx(error, abs=1e-9)
    assert price.cautious() == pytest.approx(math.exp(mean + error), rel=1e-9)
    assert price.steps == len(observations)


def test_a_new_price_is_the_model_s_one_prior_spread_higher() -> None:
    price = DraftPrice()
    assert price.factor == 1.0
    assert price.cautious() == pytest.approx(math.exp(DRAFT_PRICE_PRIOR_SPREAD))


def test_steady_steps_teach_their_ratio_and_the_caution_shrinks() -> None:
    """Drafted steps whose cost above a plain step is 1.3 times the model's, with a 10% spread:
    the factor goes to 1.3 and the cautious one comes within a few percent of it."""
    rng = np.random.default_rng(0)
    price = DraftPrice()
    for _ in range(200):
        price.observe(1.3, 1.0 + 0.3 * 1.3 * float(np.exp(rng.normal(0, 0.1))), 1.0)
    assert price.factor == pytest.approx(1.3, rel=0.05)
    assert 0 < price.standard_error() < 0.05
    assert price.factor < price.cautious() < 1.06 * price.factor


def test_a_noisy_price_stays_cautious() -> None:
    """The same mean with a 60% spread keeps the cut's price well above the factor."""
    rng = np.random.default_rng(0)
    price = DraftPrice()
    for _ in range(200):
        price.observe(1.3, 1.0 + 0.3 * 1.3 * float(np.exp(rng.normal(0, 0.6))), 1.0)
    assert price.cautious() > 1.08 * price.factor


@pytest.mark.parametrize(("predicted", "measured"), [(1.0, 2.0), (0.9, 2.0), (1.2, float("nan")), (1.2, 0.0)])
def test_steps_that_tell_nothing_teach_nothing(predicted: float, measured: float) -> None:
    """No excess predicted (a plain-priced step) or an unusable clock: the price is unchanged."""
    price = DraftPrice()
    price.observe(predicted, measured, 1.0)
    assert price.steps == 0 and price.factor == 1.0


def test_a_step_faster_than_plain_counts_as_a_quarter_of_its_price() -> None:
    price = DraftPrice()
    price.observe(1.2, 0.8, 1.0)
    assert price.log_factor == pytest.approx(oracle([math.log(0.25)])[0])


def test_the_factor_scales_the_price_above_a_plain_step_only() -> None:
    steps = np.asarray([1.0, 1.2, 1.4, 1.6])
    scaled = DraftPrice.scaled(steps, 1.5)
    assert scaled[0] == 1.0
    np.testing.assert_allclose(scaled - 1.0, 1.5 * (steps - 1.0))


@settings(max_examples=100, deadline=None)
@given(steps, st.integers(1, 40))
def test_idle_steps_move_the_price_toward_its_prior(observations: list[tuple[float, float]], idle: int) -> None:
    """Whatever the drafted steps taught, every idle step (:meth:`DraftPrice.forget`) moves the
    factor toward 1, never past it, and enough of them give back the prior itself."""
    price = DraftPrice()
    for excess, ratio in observations:
        price.observe(1.0 + excess, 1.0 + ratio * excess, 1.0)
    before = price.log_factor
    for _ in range(idle):
        price.forget()
    assert abs(price.log_factor) <= abs(before) + 1e-12
    assert price.log_factor * before >= 0.0
    for _ in range(2000):
        price.forget()
    prior = DraftPrice()
    assert price.factor == pytest.approx(prior.factor, abs=1e-9)
    assert price.cautious() == pytest.approx(prior.cautious(), rel=1e-6)


def test_a_new_price_is_where_idle_steps_leave_it() -> None:
    price = DraftPrice()
    price.forget()
    assert price.factor == 1.0
    assert price.cautious() == pytest.approx(DraftPrice().cautious())
