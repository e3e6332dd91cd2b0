"""A greedy decode step whose drafter needs the target's top-k reads the logits once: the walk's
argmax comes from the same :func:`racer_rs.target.sampling.logits_summary` as the top-k."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.engine import decode_engine  # noqa: E402
from tests.helpers import REPEATING_PROMPT, plain_greedy, tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

NEW_TOKENS = 30


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_model("llama", seed=0, sharpen=4.0)


def _generate(model: torch.nn.Module, method: str, **kwargs: Any) -> list[int]:
    result = racer_rs.generate(model, REPEATING_PROMPT, method=method, max_new_tokens=NEW_TOKENS, **kwargs)
    return list(result.tokens)


@pytest.mark.parametrize("method", ["racer", "racer_logits", "token_recycling"])
def test_greedy_steps_take_the_argmax_from_the_summary(
    model: torch.nn.Module, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    summaries = []
    real = decode_engine.logits_summary

    def counted(logits: torch.Tensor, k: int, temperature: float) -> Any:
        summaries.append(k)
        return real(logits, k, temperature)

    def second_pass(logits: torch.Tensor) -> torch.Tensor:
        raise AssertionError("greedy_ids read the step's logits a second time")

    monkeypatch.setattr(decode_engine, "logits_summary", counted)
    monkeypatch.setattr(decode_engine, "greedy_ids", second_pass)
    assert _generate(model, method) == plain_greedy(model, REPEATING_PROMPT, NEW_TOKENS)
    assert summaries


def test_a_summary_with_a_wrong_argmax_breaks_greedy_equivalence(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counterpart: the engine really uses the summary's argmax (the runner-up instead)."""
    real = decode_engine.logits_summary

    def runner_up(logits: torch.Tensor, k: int, temperature: float) -> Any:
        ids, probs, _ = real(logits, max(k, 2), temperature)
        return ids[..., :k], probs[..., :k], ids[..., 1]

    monkeypatch.setattr(decode_engine, "logits_summary", runner_up)
    assert _generate(model, "racer") != plain_greedy(model, REPEATING_PROMPT, NEW_TOKENS)


def test_sampling_keeps_its_own_walk(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    real = decode_engine.logits_summary

    def wrong_argmax(logits: torch.Tensor, k: int, temperature: float) -> Any:
        ids, probs, greedy = real(logits, k, temperature)
        return ids, probs, torch.zeros_like(greedy)

    first = _generate(model, "racer", temperature=0.8, seed=3)
    monkeypatch.setattr(decode_engine, "logits_summary", wrong_argmax)
    assert _generate(model, "racer", temperature=0.8, seed=3) == first


def _topk_probs_gaps(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, capacity: int) -> list[float]:
    """Per verified row of a sampled ``racer`` run, the largest gap between the top-k ids and
    probabilities the drafter gets and :func:`logits_summary` of the row's logits at T=0.8
    (``inf`` where the ids differ)."""
    gaps: list[float] = []
    real_verify = decode_engine.DecodeEngine.verify
    summary = decode_engine.logits_summary

    def verify(self: Any, live: Any, proposals: Any) -> Any:
        verified = real_verify(self, live, proposals)
        for row in verified:
            ids, probs, _ = summary(row.step.logits, self.drafting.needs_topk, 0.8)
            if not torch.equal(torch.from_numpy(row.host["topk_ids"]).long(), ids):
                gaps.append(float("inf"))
            else:
                gaps.append(float((torch.from_numpy(row.host["topk_probs"]) - probs).abs().max()))
        return verified

    monkeypatch.setattr(decode_engine.DecodeEngine, "verify", verify)
    _generate(model, "racer", temperature=0.8, seed=3, capacity=capacity)
    return gaps


@pytest.mark.parametrize("capacity", [2, 8])
def test_sampled_steps_give_the_drafter_the_summary_top_k(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, capacity: int
) -> None:
    """Small sampled trees draw every node, so their top-k probabilities come from the draws'
    weights and the ids from one top-k pass; bigger ones keep the summary. Both give what the
    summary would."""
    gaps = _topk_probs_gaps(model, monkeypatch, capacity)
    assert gaps and max(gaps) < 1e-5


def test_sampled_small_trees_skip_the_summary(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_summary(logits: torch.Tensor, k: int, temperature: float) -> Any:
        raise AssertionError("a step whose nodes are all drawn read the summary")

    monkeypatch.setattr(decode_engine, "logits_summary", no_summary)
    assert len(_generate(model, "racer", temperature=0.8, seed=3, capacity=2)) == NEW_TOKENS


def test_top_k_probabilities_from_other_weights_are_caught(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counterpart: weights at another temperature give the drafter wrong probabilities."""
    real = decode_engine.temperature_weights
    monkeypatch.setattr(decode_engine, "temperature_weights", lambda logits, config: real(logits * 0.8, config))
    assert max(_topk_probs_gaps(model, monkeypatch, 2)) > 1e-3
