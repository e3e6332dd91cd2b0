"""A prefill that keeps the prompt's top-k rows: the one-forward path and the chunked path (for
prompts whose kept logits exceed ``PROMPT_LOGITS_BUDGET``) give the same rows and first logits."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from racer_rs.target import verifier as verifying  # noqa: E402
from tests.helpers import tiny_model  # noqa: E402


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("temperature", [None, 0.0, 0.7])
def test_both_prefill_paths_keep_the_same_rows(monkeypatch: pytest.MonkeyPatch, family: str, temperature) -> None:  # type: ignore[no-untyped-def]
    model = tiny_model(family)
    prompt = np.random.default_rng(0).integers(0, 50, size=40).astype(np.int32)  # many repeats
    one = verifying.TreeVerifier(model).prefill(prompt, topk=4, probs_temperature=temperature)
    monkeypatch.setattr(verifying, "PROMPT_LOGITS_BUDGET", 0)  # every prompt takes the chunked path
    chunked = verifying.TreeVerifier(model).prefill(prompt, topk=4, chunk=7, probs_temperature=temperature)
    np.testing.assert_array_equal(one.prompt_topk_positions, verifying.last_occurrences(prompt))
    np.testing.assert_array_equal(one.prompt_topk_positions, chunked.prompt_topk_positions)
    assert one.prompt_topk is not None and one.prompt_topk.shape == (len(one.prompt_topk_positions), 4)
    np.testing.assert_array_equal(one.prompt_topk, chunked.prompt_topk)
    torch.testing.assert_close(one.last_logits, chunked.last_logits, rtol=1e-4, atol=1e-5)
    if temperature is None:
        assert one.prompt_topk_probs is None and chunked.prompt_topk_probs is None
    else:
        np.testing.assert_allclose(one.prompt_topk_probs, chunked.prompt_topk_probs, rtol=1e-4, atol=1e-6)
