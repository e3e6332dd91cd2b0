"""Which requests the engine computes the prompt's top-k rows for: a drafter that needs them
always gets them; an optional seed (RACER's copy-logit table) only for a request decoded alone,
and leaving it out changes drafts, never outputs."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.target.batch_verifier import BatchVerifier  # noqa: E402
from tests.helpers import REPEATING_PROMPT, plain_greedy, random_prompt, tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

PROMPTS = [REPEATING_PROMPT, random_prompt(3, length=20) * 2, random_prompt(4, length=9)]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_model("llama", seed=2, sharpen=4.0)


def seen_prompt_topk(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch the batched verifier's admission to record the top-k asked of every prompt group."""
    seen: list[int] = []
    original = BatchVerifier.add_rows

    def add_rows(self: Any, prompts: Any, topk: int = 0, **kwargs: Any) -> Any:
        seen.extend([topk] * len(prompts))
        return original(self, prompts, topk=topk, **kwargs)

    monkeypatch.setattr(BatchVerifier, "add_rows", add_rows)
    return seen


def test_racer_alone_gets_the_prompt_rows_and_a_batch_does_not(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = seen_prompt_topk(monkeypatch)
    alone = racer_rs.generate(model, PROMPTS[0], max_new_tokens=12, capacity=8)
    assert seen == [8]  # RACER's breadth
    seen.clear()
    batch = racer_rs.generate_batch(model, PROMPTS, max_new_tokens=12, capacity=8)
    assert seen == [0] * len(PROMPTS)
    # Outputs do not depend on the seed: every row is still plain greedy decoding.
    assert list(alone.tokens) == plain_greedy(model, PROMPTS[0], 12)
    for prompt, result in zip(PROMPTS, batch, strict=True):
        assert list(result.tokens) == plain_greedy(model, prompt, 12)


def test_a_drafter_that_needs_the_prompt_rows_gets_them_in_a_batch(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = seen_prompt_topk(monkeypatch)
    racer_rs.generate_batch(model, PROMPTS, method="token_recycling", max_new_tokens=8, capacity=8)
    assert len(seen) == len(PROMPTS) and all(k > 0 for k in seen)
