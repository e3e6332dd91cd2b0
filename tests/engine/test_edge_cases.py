"""Edge cases of ``racer_rs.generate``: EOS, exact budgets, bad input, unsupported models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.drafters import make_drafter  # noqa: E402
from tests.helpers import REPEATING_PROMPT, WINDOW, plain_greedy, tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

METHODS = ["ar", "pld", "token_recycling", "racer", "racer_retrieval", "racer_logits"]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_model("llama", seed=0, sharpen=4.0)


@pytest.fixture(scope="module")
def reference(model: torch.nn.Module) -> list[int]:
    return plain_greedy(model, REPEATING_PROMPT, 60)


def _eos_inside_a_step(model: torch.nn.Module) -> tuple[list[int], int, int]:
    """Racer's greedy tokens, an index ``i`` whose token first occurs there and is the second
    token of a step that committed at least 3 tokens (so an EOS there lies inside an accepted
    path), and that step's number."""
    # A fixed capacity: the same trees in every run of this test, whatever auto would choose.
    result = racer_rs.generate(model, REPEATING_PROMPT, method="racer", max_new_tokens=60, capacity=16)
    tokens = result.tokens
    for step, (position, length) in enumerate(zip(result.positions, result.accepted_lengths, strict=False)):
        if length >= 3 and tokens.index(tokens[position + 1]) == position + 1:
            return tokens, position + 1, step
    raise AssertionError("no suitable multi-token step; the test model is not repetitive enough")


# Every method with an EOS inside its own accepted paths, greedy and sampling: tests/engine/test_eos.py.


def test_eos_cuts_the_accepted_path_mid_step(model: torch.nn.Module) -> None:
    tokens, index, step = _eos_inside_a_step(model)
    result = racer_rs.generate(
        model, REPEATING_PROMPT, method="racer", max_new_tokens=60, eos_token_id=tokens[index], capacity=16
    )
    assert result.steps == step + 1
    assert result.accepted_lengths[-1] == 2  # the root and the EOS; the rest of the path is dropped


def test_eos_list_stops_at_the_first_listed_token(model: torch.nn.Module) -> None:
    tokens, index, _ = _eos_inside_a_step(model)
    eos_ids = [max(tokens) + 1, tokens[index]]  # the first id never occurs
    result = racer_rs.generate(
        model, REPEATING_PROMPT, method="racer", max_new_tokens=60, eos_token_id=eos_ids, capacity=16
    )
    assert result.tokens == tokens[: index + 1]


def test_eos_as_first_token_stops_immediately(model: torch.nn.Module, reference: list[int]) -> None:
    result = racer_rs.generate(model, REPEATING_PROMPT, max_new_tokens=20, eos_token_id=reference[0])
    assert result.tokens == reference[:1]
    assert result.steps == 1


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("budget", [1, 2, 5, 37])
def test_max_new_tokens_is_exact(model: torch.nn.Module, reference: list[int], method: str, budget: int) -> None:
    result = racer_rs.generate(model, REPEATING_PROMPT, method=method, max_new_tokens=budget)
    assert result.tokens == reference[:budget]


def test_max_new_tokens_exact_when_sampling(model: torch.nn.Module) -> None:
    for seed in range(5):
        result = racer_rs.generate(model, REPEATING_PROMPT, max_new_tokens=23, temperature=1.0, seed=seed)
        assert len(result.tokens) == 23


@pytest.mark.parametrize("empty", [[], torch.tensor([], dtype=torch.long), torch.zeros((1, 0), dtype=torch.long)])
def test_empty_prompt_raises_value_error(model: torch.nn.Module, empty: object) -> None:
    with pytest.raises(ValueError, match="input_ids"):
        racer_rs.generate(model, empty)  # type: ignore[arg-type]


def test_prompt_longer_than_window_raises_value_error(model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="window"):
        racer_rs.generate(model, [1] * (WINDOW + 1), max_new_tokens=1)


def test_prompt_plus_budget_beyond_window_raises_value_error(model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        racer_rs.generate(model, [1] * (WINDOW - 10), max_new_tokens=11)
    assert len(racer_rs.generate(model, [1] * (WINDOW - 10), max_new_tokens=10).tokens) == 10


def test_batch_larger_than_one_raises_not_implemented(model: torch.nn.Module) -> None:
    with pytest.raises(NotImplementedError, match="batch size"):
        racer_rs.generate(model, torch.tensor([REPEATING_PROMPT, REPEATING_PROMPT]))


def test_three_dimensional_prompt_raises_value_error(model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="input_ids"):
        racer_rs.generate(model, torch.tensor([[REPEATING_PROMPT]]))


@pytest.mark.parametrize("bad", [[1.5, 2.0], torch.tensor([1.0, 2.0]), "hello", [True, False]])
def test_non_integer_prompt_raises_type_error(model: torch.nn.Module, bad: object) -> None:
    with pytest.raises(TypeError, match="input_ids"):
        racer_rs.generate(model, bad)  # type: ignore[arg-type]


def test_out_of_vocabulary_token_raises_value_error(model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="input_ids"):
        racer_rs.generate(model, [1, 2, 10_000])


def test_non_model_raises_type_error() -> None:
    with pytest.raises(TypeError, match="model"):
        racer_rs.generate(torch.nn.Linear(2, 2), [1, 2, 3])  # type: ignore[arg-type]


def test_encoder_only_model_raises_clear_error() -> None:
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    with pytest.raises(TypeError, match="causal LM"):
        racer_rs.generate(transformers.BertForMaskedLM(config), [1, 2, 3])


def test_sliding_window_model_raises_not_implemented() -> None:
    config = transformers.MistralConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=8,
    )
    with pytest.raises(NotImplementedError, match="cache layers"):
        racer_rs.generate(transformers.MistralForCausalLM(config), [1, 2, 3])


def test_unknown_method_raises_value_error(model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="unknown method"):
        racer_rs.generate(model, REPEATING_PROMPT, method="medusa")


def test_unknown_option_raises_value_error(model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="bogus"):
        racer_rs.generate(model, REPEATING_PROMPT, method="racer", bogus=3)
    with pytest.raises(ValueError, match="persistent"):
        racer_rs.generate(model, REPEATING_PROMPT, method="pld", persistent=True)


def test_options_with_prebuilt_drafter_raise_value_error(model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="prebuilt drafter"):
        racer_rs.generate(model, REPEATING_PROMPT, drafter=make_drafter("racer", model), ngram=4)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, TypeError, "max_new_tokens"),
        ({"capacity": 0}, ValueError, "capacity"),
        ({"temperature": -0.5}, ValueError, "temperature"),
        ({"top_p": 1.5}, ValueError, "top_p"),
        ({"top_k": -1}, ValueError, "top_k"),
        ({"seed": "x"}, TypeError, "seed"),
        ({"eos_token_id": "eos"}, TypeError, "eos_token_id"),
        ({"streamer": object()}, TypeError, "streamer"),
        ({"drafter": object()}, TypeError, "drafter"),
    ],
)
def test_bad_arguments_name_the_argument(model: torch.nn.Module, kwargs: dict, error: type, name: str) -> None:
    with pytest.raises(error, match=name):
        racer_rs.generate(model, REPEATING_PROMPT, **kwargs)
