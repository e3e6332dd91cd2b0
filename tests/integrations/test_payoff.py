"""`racer_rs.integrations._payoff` and the vLLM proposer's ``adaptive`` drafting: the batch-wide
choice is the best set of chain prefixes (brute force), the step cost fit recovers a linear cost,
and a proposer whose drafts are never accepted stops drafting while one whose drafts are accepted
keeps drafting."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from racer_rs import optional_deps
from racer_rs.integrations import vllm as integration
from racer_rs.integrations._payoff import StepCost, chosen_lengths
from racer_rs.integrations.options import ServingOptions

VOCAB = 64


def brute_force(probs: np.ndarray, requests: int, a: float, b: float) -> float:
    best = -1.0
    for lengths in itertools.product(*[range(int((row > 0).sum()) + 1) for row in probs]):
        gained = sum(float(row[:n].sum()) for row, n in zip(probs, lengths, strict=True))
        best = max(best, (requests + gained) / (a + b * (requests + sum(lengths))))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_chosen_lengths_maximise_tokens_per_second(seed):
    rng = np.random.default_rng(seed)
    rows, k = int(rng.integers(1, 4)), 3
    edges = rng.uniform(0.05, 1.0, (rows, k))
    probs = np.cumprod(edges, axis=1) * (np.arange(k) < rng.integers(0, k + 1, rows)[:, None])
    a, b = 1.0, float(rng.uniform(0.01, 0.5))
    requests = rows + int(rng.integers(0, 3))
    lengths = chosen_lengths(probs, requests, (a, b))
    gained = sum(float(row[:n].sum()) for row, n in zip(probs, lengths, strict=True))
    rate = (requests + gained) / (a + b * (requests + int(lengths.sum())))
    assert rate == pytest.approx(brute_force(probs, requests, a, b), rel=1e-9)
    assert all(n <= (row > 0).sum() for row, n in zip(probs, lengths, strict=True))


def test_chosen_lengths_draft_less_as_the_batch_grows():
    probs = np.tile(np.cumprod(np.full(8, 0.7)), (8, 1))
    cost = (0.060, 0.002)  # about this CPU's: 60 ms a step, 2 ms a token
    alone = chosen_lengths(probs[:1], 1, cost)
    full = chosen_lengths(probs, 8, cost)
    assert alone.sum() >= 5 and 0 < full.max() < alone.sum()
    assert chosen_lengths(np.full((8, 8), 0.01), 8, cost).sum() == 0  # none pays: nothing


def test_step_cost_recovers_a_linear_cost():
    cost = StepCost()
    assert cost.coefficients() == (1.0, pytest.approx(1 / 32))
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(1, 72))
        cost.observe(n, 0.050 + 0.003 * n + float(rng.normal(0, 0.001)))
    a, b = cost.coefficients()
    assert a == pytest.approx(0.050, rel=0.1) and b == pytest.approx(0.003, rel=0.1)


@pytest.fixture
def engine_free(monkeypatch):
    real = optional_deps.require
    monkeypatch.setattr(
        optional_deps, "require", lambda extra, purpose: None if extra == "vllm" else real(extra, purpose)
    )


def drive(accepting: bool, monkeypatch, rows: int = 8, steps: int = 60) -> list[int]:
    """Drafted tokens per step of a proposer on ``rows`` repetitive requests, on a fake clock
    whose steps cost 60 ms + 2 ms per verified token; vLLM's sampled tokens either follow each
    chain (all accepted) or never match its first token."""
    clock = [0.0]
    monkeypatch.setattr(integration.time, "perf_counter", lambda: clock[0])
    k, max_len = 8, 4096
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_len, get_vocab_size=lambda: VOCAB),
    )
    proposer = integration.RacerProposer(config, options=ServingOptions(use_logits=False))
    rng = np.random.default_rng(1)
    contexts = [list(np.tile(rng.integers(1, VOCAB, 12), 6)) for _ in range(rows)]
    ids = np.zeros((rows, max_len), dtype=np.int32)
    sampled = [[c[-1]] for c in contexts]
    drafted = []
    for _ in range(steps):
        lens = np.array([len(c) for c in contexts], dtype=np.int32)
        for i, c in enumerate(contexts):
            ids[i, : len(c)] = c
        out = proposer.propose(sampled, lens, ids)
        drafted.append(sum(len(o) for o in out))
        clock[0] += 0.060 + 0.002 * sum(len(o) + 1 for o in out)
        if accepting:
            sampled = [[*o, int(rng.integers(1, VOCAB))] for o in out]
        else:  # never the chain's first token, nor the pattern's next one
            sampled = [[int((c[-12] + 1) % (VOCAB - 1) + 1)] for c in contexts]
        contexts = [c + s for c, s in zip(contexts, sampled, strict=True)]
    return drafted


def test_adaptive_proposer_stops_drafting_what_is_never_accepted(engine_free, monkeypatch):
    rejected = drive(False, monkeypatch)
    assert rejected[0] > 0 and sum(rejected[-20:]) == 0, rejected
    accepted = drive(True, monkeypatch)
    assert sum(accepted[-20:]) > 0, accepted
