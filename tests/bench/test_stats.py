"""Per-request speedups that survive a noisy machine: geometric means with bootstrap intervals,
``ar`` timed first and last, disturbed requests left out (:mod:`racer_rs.bench.stats`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from racer_rs.bench.report import summarise
from racer_rs.bench.runner import BenchConfig, BenchmarkRunner, Record, Setting
from racer_rs.bench.stats import DISTURBED_RATIO, disturbed, geometric_mean


def test_the_geometric_mean_cancels_a_gain_and_an_equal_loss():
    assert geometric_mean([2.0, 0.5]).value == pytest.approx(1.0)
    assert geometric_mean([1.5]).value == pytest.approx(1.5)
    assert math.isnan(geometric_mean([1.5]).low)  # no interval from one request
    assert geometric_mean([]).requests == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.2, 5.0), min_size=2, max_size=30))
def test_the_interval_holds_the_estimate_and_is_reproducible(ratios):
    estimate = geometric_mean(ratios)
    assert estimate.low <= estimate.value * (1 + 1e-12) and estimate.value <= estimate.high * (1 + 1e-12)
    assert estimate == geometric_mean(ratios)  # seeded bootstrap
    assert min(ratios) * (1 - 1e-12) <= estimate.low and estimate.high <= max(ratios) * (1 + 1e-12)


def test_the_interval_narrows_with_more_requests():
    rng = np.random.default_rng(0)
    few = geometric_mean(list(np.exp(rng.normal(0.3, 0.2, 6))))
    many = geometric_mean(list(np.exp(rng.normal(0.3, 0.2, 200))))
    assert many.high - many.low < (few.high - few.low) / 2
    assert many.low < math.exp(0.3) < many.high


def test_two_runs_differing_by_more_than_the_threshold_are_disturbed():
    assert not disturbed(20.0, 20.0 * DISTURBED_RATIO * 0.99)
    assert disturbed(20.0, 20.0 * DISTURBED_RATIO * 1.01) and disturbed(20.0 * DISTURBED_RATIO * 1.01, 20.0)
    assert disturbed(0.0, 20.0)


def record(question: int, method: str, tokens: int, wall: float, ar_pass: int = 0, category: str = "c") -> Record:
    return Record(
        setting="greedy",
        question_index=question,
        question_id=question,
        category=category,
        source="f",
        turn=0,
        method=method,
        seed=0,
        prompt_tokens=1,
        new_tokens=tokens,
        steps=tokens,
        mat=1.0,
        wall_s=wall,
        prefill_s=0.0,
        decode_s=wall,
        wall_s_repeats=[wall],
        timings={},
        accepted_lengths=[1] * tokens,
        positions=list(range(tokens)),
        tokens=[0] * tokens,
        verified_nodes=2 * tokens,
        ar_pass=ar_pass,
    )


def test_speedups_are_per_request_and_leave_disturbed_requests_out():
    records = [
        # question 0: ar 10 tok/s both times; racer 20 tok/s -> 2x
        record(0, "ar", 100, 10.0),
        record(0, "racer", 100, 5.0),
        record(0, "ar", 100, 10.0, ar_pass=1),
        # question 1: a long, slow request; ar 1 tok/s both times; racer 0.8 tok/s -> 0.8x
        record(1, "ar", 100, 100.0),
        record(1, "racer", 100, 125.0),
        record(1, "ar", 100, 100.0, ar_pass=1),
        # question 2: a burst of load hit ar's second run (3x slower): disturbed, left out
        record(2, "ar", 100, 10.0),
        record(2, "racer", 100, 1.0),
        record(2, "ar", 100, 30.0, ar_pass=1),
    ]
    overall = summarise(records, ["ar", "racer"])["greedy"]["overall"]["racer"]
    assert overall["speedup"] == pytest.approx(math.sqrt(2.0 * 0.8))
    assert (overall["requests"], overall["disturbed"], overall["speedup_requests"]) == (3, 1, 2)
    # Pooled tokens over pooled time (the old headline) lets the long request decide: a counterpart
    # computing that would report a slowdown where the per-request mean reports a gain.
    pooled = (200 / 130.0) / (200 / 110.0)
    assert pooled < 1.0 < overall["speedup"]
    assert overall["tokens_per_node"] == pytest.approx(0.5)


def test_ar_runs_first_and_last_and_the_others_rotate():
    config = BenchConfig(
        methods=["ar", "pld", "racer", "suffix"],
        method_options={},
        settings=[Setting(0.0)],
        max_new_tokens=8,
        capacity=16,
        warmup=0,
        repeat=1,
        seed=0,
        persistent=False,
        eos_token_id=None,
    )
    runner = BenchmarkRunner(None, None, config, generate=lambda *a, **k: None, make_drafter=lambda *a, **k: None)
    orders = [runner.question_order(i) for i in range(3)]
    for order in orders:
        assert order[0] == ("ar", 0) and order[-1] == ("ar", 1)
        assert sorted(m for m, _ in order[1:-1]) == ["pld", "racer", "suffix"]
    assert len({tuple(order) for order in orders}) == 3  # every question starts with another method
