"""The self-draft on the real model (SmolLM2-135M-Instruct): greedy equivalence and a checkpoint.

A 4-layer self-draft over a reduced vocabulary drives ``draft_model`` and ``tts`` to exactly the
plain greedy output; a saved checkpoint loads back on the same model (its probe matches).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import racer_rs  # noqa: E402
from tests.test_real_model import NEW_TOKENS, plain, prompts, smollm2  # noqa: E402, F401

pytestmark = [pytest.mark.torch, pytest.mark.real_model]

KEPT = list(range(8192))  # merge order: the most frequent tokens of the tokenizer's corpus


@pytest.mark.parametrize("method", ["draft_model", "tts"])
def test_a_reduced_self_draft_decodes_exactly_like_plain_greedy(smollm2, prompts, plain, method):  # noqa: F811
    model, tokenizer = smollm2
    draft = racer_rs.self_draft(model, 4, vocab=KEPT)
    for name, ids in prompts.items():
        result = racer_rs.generate(
            model,
            ids,
            method=method,
            draft_model=draft,
            canvas=3,
            max_new_tokens=NEW_TOKENS,
            eos_token_id=tokenizer.eos_token_id,
        )
        assert result.tokens == plain[name], name


def test_a_checkpoint_of_the_real_model_loads_back(smollm2, tmp_path):  # noqa: F811
    from racer_rs.selfdraft.checkpoint import save_self_draft

    model, _ = smollm2
    draft = racer_rs.self_draft(model, 2, vocab=KEPT)
    save_self_draft(draft, model, tmp_path / "ckpt", target_name="smollm2-135m-instruct")
    loaded = racer_rs.load_self_draft(model, tmp_path / "ckpt")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, draft(input_ids=ids).logits, rtol=0, atol=0)
    # Only the draft's own tensors are stored: two layers (~28 MB) and a norm, not the 113 MB embedding.
    weights = next((tmp_path / "ckpt").glob("draft-*.safetensors"))
    assert weights.stat().st_size < 2.5 * 4 * 3.6e6
