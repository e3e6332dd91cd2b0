"""The vLLM proposer's ``adaptive`` drafting (`racer_rs._native.choose_chains` and
`chain_outcomes`, `racer_rs.integrations._payoff`): the batch-wide cut is the best set of chain
prefixes (brute force), the outcomes are those of plain loops, the step cost fit recovers a linear cost,
and a proposer whose drafts are never accepted stops drafting while one whose drafts are accepted
keeps drafting."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from racer_rs import optional_deps
from racer_rs._native import chain_outcomes, choose_chains
from racer_rs.errors import InvalidArgumentError
from racer_rs.integrations import vllm as integration
from racer_rs.integrations._payoff import MEASURED_TOKENS, StepCost
from racer_rs.integrations.options import ServingOptions

VOCAB = 64


def brute_force(probs: np.ndarray, requests: int, a: float, b: float, measured: np.ndarray | None = None) -> float:
    """The best tokens per second over every prefix length per row (a step of ``n`` tokens
    takes ``measured[n]`` where given, else ``a + b * n``)."""

    def seconds(n: int) -> float:
        return float(measured[n]) if measured is not None and n < len(measured) else a + b * n

    best = -1.0
    for lengths in itertools.product(*[range(int((row > 0).sum()) + 1) for row in probs]):
        gained = sum(float(row[:n].sum()) for row, n in zip(probs, lengths, strict=True))
        best = max(best, (requests + gained) / seconds(requests + sum(lengths)))
    return best


def one_candidate(edges: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A table of one candidate whose row ``r`` is a chain of ``lengths[r]`` tokens, each
    token with a cell of its own whose edge is ``edges[r, j]``; and its path probabilities."""
    rows, k = edges.shape
    cells = np.arange(rows * k, dtype=np.int32).reshape(1, rows, k)
    tokens = np.where(np.arange(k) < lengths[:, None], 7, -1).astype(np.int32)[None]
    edges32 = edges.astype(np.float32).ravel()
    probs = np.cumprod(edges.astype(np.float32), axis=1).astype(np.float64) * (np.arange(k) < lengths[:, None])
    return tokens, cells, edges32, probs


@pytest.mark.parametrize("seed", range(20))
def test_chosen_lengths_maximise_tokens_per_second(seed):
    rng = np.random.default_rng(seed)
    rows, k = int(rng.integers(1, 4)), 3
    edges = rng.uniform(0.05, 1.0, (rows, k))
    tokens, cells, edges32, probs = one_candidate(edges, rng.integers(0, k + 1, rows))
    a, b = 1.0, float(rng.uniform(0.01, 0.5))
    requests = rows + int(rng.integers(0, 3))
    best, lengths = choose_chains(tokens, cells, edges32, [1.0], [k] * rows, requests, (a, b))
    assert best.tolist() == [0] * rows
    gained = sum(float(row[:n].sum()) for row, n in zip(probs, lengths, strict=True))
    rate = (requests + gained) / (a + b * (requests + int(lengths.sum())))
    assert rate == pytest.approx(brute_force(probs, requests, a, b), rel=1e-9)
    assert all(n <= (row > 0).sum() for row, n in zip(probs, lengths, strict=True))


def staircase(rng: np.random.Generator, a: float, b: float, end: int) -> np.ndarray:
    """Step seconds of a CPU-like forward: the line, plus a stair every few tokens."""
    block = int(rng.integers(2, 6))
    stair = float(rng.uniform(0.0, 0.5))
    return np.array([a + b * n + stair * (n // block) for n in range(end)])


@pytest.mark.parametrize("seed", range(20))
def test_chosen_lengths_maximise_tokens_per_second_on_a_measured_staircase(seed):
    rng = np.random.default_rng(100 + seed)
    rows, k = int(rng.integers(1, 4)), 3
    edges = rng.uniform(0.05, 1.0, (rows, k))
    tokens, cells, edges32, probs = one_candidate(edges, rng.integers(0, k + 1, rows))
    a, b = 1.0, float(rng.uniform(0.01, 0.2))
    requests = rows + int(rng.integers(0, 3))
    # Measured up to some count, the line beyond it.
    measured = staircase(rng, a, b, int(rng.integers(requests, requests + rows * k + 2)))
    _, lengths = choose_chains(tokens, cells, edges32, [1.0], [k] * rows, requests, (a, b, measured))
    gained = sum(float(row[:n].sum()) for row, n in zip(probs, lengths, strict=True))
    n = requests + int(lengths.sum())
    rate = (requests + gained) / (measured[n] if n < len(measured) else a + b * n)
    assert rate == pytest.approx(brute_force(probs, requests, a, b, measured), rel=1e-9)


def test_a_cut_by_the_line_alone_fails_the_staircase():
    """The check above can fail: the line's cut steps onto a stair that does not pay."""
    tokens, cells, edges32, probs = one_candidate(np.full((8, 2), 0.5), np.full(8, 2))
    a, b, requests = 1.0, 0.01, 8
    measured = np.array([a + b * n + (0.3 if n > 16 else 0.0) for n in range(25)])
    _, by_line = choose_chains(tokens, cells, edges32, [1.0], [2] * 8, requests, (a, b))
    _, by_stairs = choose_chains(tokens, cells, edges32, [1.0], [2] * 8, requests, (a, b, measured))
    assert by_line.tolist() == [2] * 8 and by_stairs.tolist() == [1] * 8
    gained = sum(float(row[:n].sum()) for row, n in zip(probs, by_line, strict=True))
    line_rate = (requests + gained) / measured[requests + int(by_line.sum())]
    assert line_rate < brute_force(probs, requests, a, b, measured) * (1 - 1e-6)


def test_a_cut_by_chain_order_alone_fails_the_brute_force():
    """The check above can fail: cutting every chain at one depth is not the best set."""
    edges = np.array([[0.95, 0.9, 0.9], [0.2, 0.9, 0.9]])
    tokens, cells, edges32, probs = one_candidate(edges, np.array([3, 3]))
    a, b, requests = 1.0, 0.3, 2
    _, lengths = choose_chains(tokens, cells, edges32, [1.0], [3, 3], requests, (a, b))
    assert lengths.tolist() == [3, 0]
    same_depth = [int(lengths.max())] * 2
    gained = sum(float(row[:n].sum()) for row, n in zip(probs, same_depth, strict=True))
    rate = (requests + gained) / (a + b * (requests + sum(same_depth)))
    assert rate < brute_force(probs, requests, a, b) * (1 - 1e-6)


def test_the_cut_drafts_less_as_the_batch_grows():
    tokens, cells, edges, _ = one_candidate(np.full((8, 8), 0.7), np.full(8, 8))
    cost = (0.060, 0.002)  # about this CPU's: 60 ms a step, 2 ms a token
    first = (np.ascontiguousarray(tokens[:, :1]), np.ascontiguousarray(cells[:, :1]))
    _, alone = choose_chains(*first, edges, [1.0], [8], 1, cost)
    _, full = choose_chains(tokens, cells, edges, [1.0], [8] * 8, 8, cost)
    assert alone.sum() >= 5 and 0 < full.max() < alone.sum()
    tokens, cells, edges, _ = one_candidate(np.full((8, 8), 0.01), np.full(8, 8))
    assert choose_chains(tokens, cells, edges, [1.0], [8] * 8, 8, cost)[1].sum() == 0  # none pays


def test_the_choice_takes_the_candidate_expected_to_commit_most_after_its_scale():
    # Two candidates for one row: a long likely chain (cells 0) and a short sure one (cell 1).
    tokens = np.array([[[1, 2, 3]], [[4, -1, -1]]], dtype=np.int32)
    cells = np.array([[[0, 0, 0]], [[1, 0, 0]]], dtype=np.int32)
    edges = np.array([0.8, 1.0], dtype=np.float32)  # 0.8 + 0.64 + 0.512 = 1.952 against 1.0
    best, lengths = choose_chains(tokens, cells, edges, [1.0, 1.0], [3], 1, None)
    assert (best.tolist(), lengths.tolist()) == ([0], [3])
    best, lengths = choose_chains(tokens, cells, edges, [0.5, 1.0], [2], 1, None)
    assert (best.tolist(), lengths.tolist()) == ([1], [1])


def joint_brute_force(probs: np.ndarray, requests: int, a: float, b: float) -> float:
    """The best rate over every candidate and chain prefix per row (``probs[c, r, j]``)."""
    candidates, rows, _ = probs.shape
    best = -1.0
    for chosen in itertools.product(range(candidates), repeat=rows):
        best = max(best, brute_force(np.stack([probs[c, r] for r, c in enumerate(chosen)]), requests, a, b))
    return best


def random_candidates(rng: np.random.Generator, candidates: int, rows: int, k: int):
    """A table of ``candidates`` chains per row, every token with a cell of its own, its
    scaled path probabilities (``probs[c, r, j]``, 0 past a chain's end) and the scales."""
    edges = rng.uniform(0.05, 1.0, (candidates, rows, k))
    lengths = rng.integers(0, k + 1, (candidates, rows))
    present = np.arange(k) < lengths[..., None]
    tokens = np.where(present, 7, -1).astype(np.int32)
    cells = np.arange(edges.size, dtype=np.int32).reshape(edges.shape)
    scales = rng.uniform(0.3, 1.5, candidates)
    path = np.cumprod(edges.astype(np.float32), axis=2).astype(np.float64)
    probs = np.minimum(path * scales[:, None, None], 1.0) * present
    return tokens, cells, edges.astype(np.float32).ravel(), scales, probs


@pytest.mark.parametrize("seed", range(40))
def test_chosen_candidates_and_lengths_maximise_tokens_per_second(seed):
    """Candidate and cut together: the rate of the choice is the best over every candidate
    and prefix of every row (brute force)."""
    rng = np.random.default_rng(seed)
    candidates, rows, k = int(rng.integers(2, 4)), int(rng.integers(1, 4)), 3
    tokens, cells, edges, scales, probs = random_candidates(rng, candidates, rows, k)
    a, b = 1.0, float(rng.uniform(0.01, 0.6))
    requests = rows + int(rng.integers(0, 3))
    best, lengths = choose_chains(tokens, cells, edges, scales.tolist(), [k] * rows, requests, (a, b))
    gained = sum(float(probs[c, r, :n].sum()) for r, (c, n) in enumerate(zip(best, lengths, strict=True)))
    rate = (requests + gained) / (a + b * (requests + int(lengths.sum())))
    assert rate == pytest.approx(joint_brute_force(probs, requests, a, b), rel=1e-9)


def test_a_choice_by_the_whole_chain_fails_the_joint_brute_force():
    """The check above can fail: taking each row's candidate by its whole expected sum and then
    cutting drafts a long mediocre chain where a short sure one pays more."""
    # One row: a sure single token (p 0.9) against eight tokens at 0.7 per edge (sum 2.2).
    tokens = np.array([[[5] + [-1] * 7], [[6] * 8]], dtype=np.int32)
    cells = np.array([[[0] * 8], [[1] * 8]], dtype=np.int32)
    edges = np.array([0.9, 0.7], dtype=np.float32)
    probs = np.zeros((2, 1, 8))
    probs[0, 0, 0] = 0.9
    probs[1, 0] = np.cumprod(np.full(8, np.float32(0.7)))
    a, b, requests = 1.0, 0.3, 1
    by_sum, _ = choose_chains(tokens, cells, edges, [1.0, 1.0], [8], requests, None)
    assert by_sum.tolist() == [1]
    whole_sum_rate = brute_force(probs[1], requests, a, b)  # the long chain's best cut
    assert whole_sum_rate < joint_brute_force(probs, requests, a, b) * (1 - 1e-6)
    best, lengths = choose_chains(tokens, cells, edges, [1.0, 1.0], [8], requests, (a, b))
    assert (best.tolist(), lengths.tolist()) == ([0], [1])


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"cells": np.full((1, 1, 2), 5, dtype=np.int32)}, InvalidArgumentError, "cell"),
        ({"scales": [-1.0]}, InvalidArgumentError, "scales"),
        ({"budgets": [-1]}, InvalidArgumentError, "budgets"),
        ({"cost": (0.0, 1.0)}, InvalidArgumentError, "cost"),
        ({"cost": (1.0, float("nan"))}, InvalidArgumentError, "cost"),
        ({"cost": (1.0, 0.1, [1.0, float("nan")])}, InvalidArgumentError, "measured"),
        ({"cost": (1.0, 0.1, [1.0, 0.0])}, InvalidArgumentError, "measured"),
        ({"cost": (1.0, 0.1, "fast")}, TypeError, "float"),
        ({"cost": (1.0, 0.1, 2.0, 3.0)}, TypeError, "cost"),
        ({"tokens": np.zeros((1, 1, 2), dtype=np.int64)}, TypeError, "int32"),
        ({"tokens": np.zeros((1, 2, 2), dtype=np.int32)}, InvalidArgumentError, "shape"),
    ],
)
def test_choose_chains_refuses_bad_input_with_one_clear_error(change, error, match):
    args = {
        "tokens": np.zeros((1, 1, 2), dtype=np.int32),
        "cells": np.zeros((1, 1, 2), dtype=np.int32),
        "edges": np.full(2, 0.5, dtype=np.float32),
        "scales": [1.0],
        "budgets": [2],
        "requests": 1,
        "cost": (1.0, 0.1),
    } | change
    with pytest.raises(error, match=match):
        choose_chains(*args.values())


def chain_outcomes_oracle(tokens, cells, edges, rows, best, drafted, sampled):
    """The outcomes by plain loops (the proposer's old numpy, unrolled)."""
    observed, accepted, committed, expected = [], [], [], []
    for c in range(tokens.shape[0]):
        for r, s in zip(rows, sampled, strict=True):
            chain = [int(t) for t in tokens[c, r] if t >= 0]
            chain = chain[: next((j for j, t in enumerate(tokens[c, r]) if t < 0), len(tokens[c, r]))]
            matched = 0
            while matched < min(len(chain), len(s)) and chain[matched] == s[matched]:
                matched += 1
            for j in range(min(matched + 1, len(chain), len(s))):
                observed.append(int(cells[c, r, j]))
                accepted.append(j < matched)
    for r, c, n, s in zip(rows, best, drafted, sampled, strict=True):
        chain = list(tokens[c, r, :n])
        matched = 0
        while matched < min(len(chain), len(s)) and chain[matched] == s[matched]:
            matched += 1
        committed.append(matched)
        p, total = np.float32(1.0), 0.0
        for j in range(n):
            p = np.float32(p * edges[cells[c, r, j]])
            total += float(p)
        expected.append(total)
    return observed, accepted, committed, expected


@pytest.mark.parametrize("seed", range(25))
def test_chain_outcomes_match_the_plain_loops(seed):
    rng = np.random.default_rng(seed)
    candidates, rows, k = int(rng.integers(1, 4)), int(rng.integers(1, 5)), 4
    tokens = rng.integers(0, 3, (candidates, rows, k)).astype(np.int32)
    ends = rng.integers(0, k + 1, (candidates, rows))
    tokens[np.arange(k) >= ends[..., None]] = -1
    cells = rng.integers(0, 6, (candidates, rows, k)).astype(np.int32)
    edges = rng.uniform(0.1, 1.0, 6).astype(np.float32)
    picked = rng.permutation(rows)[: int(rng.integers(1, rows + 1))].tolist()
    best = rng.integers(0, candidates, len(picked)).tolist()
    drafted = [int(rng.integers(0, ends[c, r] + 1)) for c, r in zip(best, picked, strict=True)]
    sampled = [rng.integers(0, 3, int(rng.integers(1, k + 2))).tolist() for _ in picked]
    got = chain_outcomes(tokens, cells, edges, picked, best, drafted, sampled)
    want = chain_outcomes_oracle(tokens, cells, edges, picked, best, drafted, sampled)
    assert got[0].tolist() == want[0] and got[1].tolist() == want[1] and got[2].tolist() == want[2]
    assert got[3] == pytest.approx(want[3], rel=1e-6)


def test_chain_outcomes_refuse_a_row_outside_the_table():
    tokens = np.zeros((1, 1, 2), dtype=np.int32)
    edges = np.full(1, 0.5, dtype=np.float32)
    with pytest.raises(InvalidArgumentError, match="outside"):
        chain_outcomes(tokens, tokens, edges, [1], [0], [0], [[0]])
    with pytest.raises(InvalidArgumentError, match="one length"):
        chain_outcomes(tokens, tokens, edges, [0], [0, 0], [0], [[0]])


def test_step_cost_measures_a_staircase_and_keeps_the_line_elsewhere():
    cost = StepCost()
    rng = np.random.default_rng(0)

    def true_seconds(n: int) -> float:
        return 0.030 + 0.0005 * n + (0.004 if n > 16 else 0.0)

    for _ in range(600):
        n = int(rng.integers(8, 25))
        cost.observe(n, true_seconds(n) + float(rng.normal(0, 0.0005)))
    cost.observe(12, 0.080)  # one slow step (a stalled machine) is averaged, not carried up
    measured = cost.measured(40)
    assert len(measured) == 41 and np.all(np.diff(measured) >= 0)
    assert measured[17] - measured[16] > 0.003  # the stair
    for n in (10, 14, 20, 24):
        assert measured[n] == pytest.approx(true_seconds(n), abs=0.0012)
    a, b = cost.coefficients()
    assert measured[40] == pytest.approx(max(a + b * 40, measured[24]))  # never seen: the line
    assert len(cost.measured(10**6)) == MEASURED_TOKENS + 1 and len(cost.measured(-3)) == 1


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
