"""Sampling keeps the target distribution exactly (chi-square tests that can fail).

Samples are keyed by generation position, so every deterministic drafting method emits the
very same tokens for a seed: the per-method guarantee is the exact equality of each method's
sampled text with plain sampling (``test_sampled_text_is_the_same_for_every_method_and_plain_decoding``).
What is left to test statistically is the position-keyed sampler itself: the exact
distribution of the first generated tokens is computed from the model by enumeration and
thousands of seeded runs are compared with it. The same test is run on deliberately lossy
rules, and must reject them. Chain speculative sampling (drafters with ``draft_probs``) is
tested at every depth in ``test_chain_sampling.py``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.generation.logits_process import (  # noqa: E402
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import racer_rs  # noqa: E402
from racer_rs import DraftTree  # noqa: E402
from racer_rs.drafters import make_drafter  # noqa: E402
from racer_rs.drafters.base import Drafter, Proposal, RequestStart  # noqa: E402
from racer_rs.engine.decode_engine import DecodeEngine, DecodeState, Verification, Verified  # noqa: E402
from racer_rs.target.sampling import (  # noqa: E402
    CANDIDATES,
    SamplingConfig,
    process_logits,
    resample_node,
    sample_nodes,
    sample_position,
)
from tests.helpers import REPEATING_PROMPT, plain_sampling, run_engine, tiny_model  # noqa: E402
from tests.stats import chi_square_pvalue  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 16
PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
CONFIG = SamplingConfig(temperature=1.0, top_p=0.9)
FIRST = 2  # tokens whose joint distribution is tested: the prefill's sample and the first step's
ALPHA = 1e-3  # lossless runs must not be rejected at this level; lossy ones must be


@torch.inference_mode()
def exact_first_tokens(
    model: torch.nn.Module, prompt: list[int], config: SamplingConfig
) -> dict[tuple[int, ...], float]:
    """Exact joint distribution of the first ``FIRST`` sampled tokens (by enumeration)."""
    first = process_logits(model(input_ids=torch.tensor([prompt])).logits[0, -1], config).softmax(-1)
    batch = torch.tensor([[*prompt, t] for t in range(VOCAB)])
    second = process_logits(model(input_ids=batch).logits[:, -1], config).softmax(-1)
    joint = first[:, None] * second
    return {(a, b): float(joint[a, b]) for a in range(VOCAB) for b in range(VOCAB) if joint[a, b] > 0}


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    # A peaky model: drafts get accepted often, so a lossy rule is detectable.
    return tiny_model("llama", seed=2, vocab=VOCAB, sharpen=15.0)


@pytest.fixture(scope="module")
def exact(model: torch.nn.Module) -> dict[tuple[int, ...], float]:
    return exact_first_tokens(model, PROMPT, CONFIG)


def run_loop(
    model: torch.nn.Module, drafter: Drafter, runs: int, loop_class: type[DecodeEngine] = DecodeEngine
) -> tuple[Counter[tuple[int, ...]], float]:
    """First tokens of ``runs`` seeded requests, and the fraction of drafted tokens accepted."""
    counts: Counter[tuple[int, ...]] = Counter()
    multi = 0
    for seed in range(runs):
        state = run_engine(model, drafter, CONFIG, PROMPT, FIRST + 1, seed=seed, engine_class=loop_class)
        counts[tuple(state.context[len(PROMPT) : len(PROMPT) + FIRST].tolist())] += 1
        multi += state.accepted_lengths[0] > 1
    return counts, multi / runs


class ResampleAfterMismatchLoop(DecodeEngine):
    """The reference code's lossy rule: after a mismatch, emit a FRESH sample, not the mismatching one."""

    def accept(self, state: DecodeState, verified: Verified) -> Verification:
        verification = super().accept(state, verified)
        last = verification.path[-1]
        verification.bonus = resample_node(verified.step.logits[last], self.sampling, state.generator)
        return verification


def test_sampled_first_tokens_follow_the_exact_distribution(model: torch.nn.Module, exact: dict) -> None:
    """The position-keyed sampler, run through the decode loop, draws from the target exactly.

    One method is enough: for a seed every deterministic drafter emits the same tokens (the
    exact-equality test below), so the counts of any other method would be the very same.
    Drafts being accepted does not give this test power over the drafting method; it gives
    the lossy counterpart below its power, as that rule is wrong only where a walk ends on a
    node with drafted children (the ``accepted`` check keeps such steps frequent).
    """
    runs = 1500
    counts, accepted = run_loop(model, make_drafter("racer", model), runs)
    assert accepted > 0.1
    assert chi_square_pvalue(counts, exact, runs) > ALPHA


def test_lossy_acceptance_rule_fails_the_same_test(model: torch.nn.Module, exact: dict) -> None:
    runs = 1500
    counts, _ = run_loop(model, make_drafter("racer", model), runs, ResampleAfterMismatchLoop)
    assert chi_square_pvalue(counts, exact, runs) < ALPHA


def test_seeded_generation_is_reproducible(model: torch.nn.Module) -> None:
    kwargs: dict[str, Any] = {"method": "racer", "max_new_tokens": 30, "temperature": 0.8, "top_p": 0.95}
    first = racer_rs.generate(model, PROMPT, seed=7, **kwargs).tokens
    assert racer_rs.generate(model, PROMPT, seed=7, **kwargs).tokens == first
    assert any(racer_rs.generate(model, PROMPT, seed=s, **kwargs).tokens != first for s in range(8, 12))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_sampled_text_is_the_same_for_every_method_and_plain_decoding(family: str) -> None:
    """Samples are keyed by generation position, so drafting never changes the sampled text."""
    model = tiny_model(family, seed=1, sharpen=15.0)
    config = SamplingConfig(temperature=1.0, top_p=0.9)
    accepted = []
    for seed in range(3):
        expected = plain_sampling(model, REPEATING_PROMPT, 40, config, seed)
        for method in ["ar", "pld", "token_recycling", "racer", "racer_scored", "racer_retrieval", "racer_logits"]:
            result = racer_rs.generate(
                model,
                REPEATING_PROMPT,
                method=method,
                max_new_tokens=40,
                temperature=1.0,
                top_p=0.9,
                seed=seed,
                capacity=16,  # trees verified whatever auto would choose for this tiny model
            )
            assert result.tokens == expected, (method, seed)
            accepted.append(result.mat)
    assert max(accepted) > 1.2  # drafts were accepted, so verification really ran on trees


def test_a_lossy_walk_breaks_equality_with_plain_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact-equality test above can fail: with the lossy walk, text parts from plain sampling."""
    from racer_rs.engine import generation

    model = tiny_model("llama", seed=1, sharpen=15.0)
    config = SamplingConfig(temperature=1.0, top_p=0.9)
    monkeypatch.setattr(generation, "DecodeEngine", ResampleAfterMismatchLoop)
    differs = []
    for seed in range(3):
        expected = plain_sampling(model, REPEATING_PROMPT, 40, config, seed)
        result = racer_rs.generate(
            model, REPEATING_PROMPT, method="racer", max_new_tokens=40, temperature=1.0, top_p=0.9, seed=seed
        )
        differs.append(result.tokens != expected)
    assert any(differs)


# Chain speculative sampling (Proposal.draft_probs) ------------------------------------------


class SyntheticChainDrafter(Drafter):
    """Drafts a chain by sampling from fixed distributions and reports them as ``draft_probs``.

    Args:
        sample_from: ``[depth, V]`` distributions the drafts are really drawn from.
        report: the distributions reported to the engine (differ from ``sample_from`` to
            make a deliberately lossy drafter).
    """

    name = "synthetic_chain"

    def __init__(self, sample_from: torch.Tensor, report: torch.Tensor | None = None) -> None:
        self.sample_from = sample_from
        self.report = sample_from if report is None else report
        self.generator: torch.Generator | None = None

    def begin(self, request: RequestStart) -> None:
        self.generator = request.generator

    def propose(self, context: np.ndarray, next_token: int, capacity: int) -> Proposal:
        depth = min(len(self.sample_from), capacity - 1)
        drafts = torch.multinomial(self.sample_from[:depth], 1, generator=self.generator).squeeze(1)
        tree = DraftTree.chain([next_token, *drafts.tolist()])
        return Proposal(tree, draft_probs=self.report[:depth])


def _draft_distributions(model: torch.nn.Module) -> torch.Tensor:
    # Close to the target's own next-token distribution, so drafts are often accepted.
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([PROMPT])).logits[0, -1]
    base = logits.softmax(-1)
    return torch.stack([0.5 * base + 0.5 / VOCAB, base.roll(1)])


# The fast suite tests chain speculative sampling at depths 1-3 with lossy counterparts, and the
# engine's side of it, in test_chain_sampling.py; these two run it end to end on a real model.
@pytest.mark.slow
def test_chain_speculative_sampling_is_lossless(model: torch.nn.Module, exact: dict) -> None:
    runs = 1500
    counts, accepted = run_loop(model, SyntheticChainDrafter(_draft_distributions(model)), runs)
    assert accepted > 0.1
    assert chi_square_pvalue(counts, exact, runs) > ALPHA


@pytest.mark.slow
def test_chain_with_misreported_draft_probs_fails_the_same_test(model: torch.nn.Module, exact: dict) -> None:
    runs = 1500
    truth = _draft_distributions(model)
    uniform = torch.full_like(truth, 1.0 / VOCAB)
    counts, _ = run_loop(model, SyntheticChainDrafter(truth, report=uniform), runs)
    assert chi_square_pvalue(counts, exact, runs) < ALPHA


# Logits processing and the fast per-node sampler ---------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(temperature=0.7),
        SamplingConfig(temperature=1.3, top_k=5),
        SamplingConfig(temperature=0.8, top_p=0.9),
        SamplingConfig(temperature=1.0, top_k=7, top_p=0.6),
    ],
)
def test_process_logits_matches_transformers_warpers(config: SamplingConfig) -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1)) * 3
    expected = TemperatureLogitsWarper(config.temperature)(None, logits.clone())
    if config.top_k:
        expected = TopKLogitsWarper(config.top_k)(None, expected)
    if config.top_p < 1:
        expected = TopPLogitsWarper(config.top_p)(None, expected)
    actual = process_logits(logits, config)
    assert torch.equal(torch.isinf(actual), torch.isinf(expected))
    torch.testing.assert_close(actual[~torch.isinf(actual)], expected[~torch.isinf(expected)])


def _node_samples(logits: torch.Tensor, config: SamplingConfig, honour_validity: bool) -> list[int]:
    generator = torch.Generator().manual_seed(3)
    tokens, valid = sample_nodes(logits, config, torch.rand(logits.shape[0], generator=generator))
    if valid is not None and honour_validity:
        for row in torch.nonzero(~valid).flatten().tolist():
            uniforms = torch.rand(CANDIDATES, generator=generator)
            tokens[row] = sample_position(logits[row], config, uniforms, generator)
    return tokens.tolist()


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(temperature=0.9),
        SamplingConfig(temperature=1.0, top_p=0.7),
        SamplingConfig(temperature=1.2, top_k=4, top_p=0.9),
    ],
)
def test_per_node_sampler_matches_processed_distribution(config: SamplingConfig) -> None:
    row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2)) * 2
    runs = 20000
    probs = process_logits(row, config).softmax(-1)
    counts = Counter(_node_samples(row.expand(runs, VOCAB), config, honour_validity=True))
    assert chi_square_pvalue(counts, {t: float(probs[t]) for t in range(VOCAB) if probs[t] > 0}, runs) > ALPHA


def test_per_node_sampler_ignoring_validity_fails_the_same_test() -> None:
    config = SamplingConfig(temperature=1.0, top_p=0.7)
    row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2)) * 2
    runs = 20000
    probs = process_logits(row, config).softmax(-1)
    counts = Counter(_node_samples(row.expand(runs, VOCAB), config, honour_validity=False))
    assert chi_square_pvalue(counts, {t: float(probs[t]) for t in range(VOCAB) if probs[t] > 0}, runs) < ALPHA


def test_sampling_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingConfig(temperature=1.0, top_k=-2)
    with pytest.raises(TypeError, match="top_k"):
        SamplingConfig(temperature=1.0, top_k=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [4.4e-256, 1e-300, 5e-6])
def test_a_temperature_too_small_to_divide_by_decodes_greedily(temperature: float) -> None:
    assert SamplingConfig(temperature=temperature).greedy
    assert not SamplingConfig(temperature=1e-3).greedy
    model = tiny_model("llama")
    greedy = racer_rs.generate(model, REPEATING_PROMPT, max_new_tokens=8, capacity=8)
    tiny = racer_rs.generate(model, REPEATING_PROMPT, max_new_tokens=8, capacity=8, temperature=temperature, seed=1)
    assert tiny.tokens == greedy.tokens
