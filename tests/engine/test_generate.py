"""Greedy equivalence of every method with plain greedy decoding, and the result contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.drafters import METHODS, available_methods, make_drafter  # noqa: E402
from racer_rs.drafters.racer import RacerDrafter  # noqa: E402
from tests.conftest import reference_file  # noqa: E402
from tests.helpers import FAMILIES, REPEATING_PROMPT, plain_greedy, random_prompt, tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

ENGINE_METHODS = ["ar", "pld", "token_recycling", "racer", "racer_scored", "racer_retrieval", "racer_logits"]
NEW_TOKENS = 40

_reference_cache: dict[tuple[str, int, object], list[int]] = {}


def _prompt(kind: str, seed: int) -> list[int]:
    return REPEATING_PROMPT if kind == "repeating" else random_prompt(seed)


def _expected(family: str, seed: int, kind: str) -> list[int]:
    key = (family, seed, kind)
    if key not in _reference_cache:
        _reference_cache[key] = plain_greedy(_model(family, seed), _prompt(kind, seed), NEW_TOKENS)
    return _reference_cache[key]


_models: dict[tuple[str, int], torch.nn.Module] = {}


def _model(family: str, seed: int) -> torch.nn.Module:
    # sharpen > 1 makes the random model repeat itself, so drafts actually get accepted.
    if (family, seed) not in _models:
        _models[(family, seed)] = tiny_model(family, seed=seed, sharpen=4.0)
    return _models[(family, seed)]


@pytest.mark.parametrize("kind", ["repeating", "random"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("method", ENGINE_METHODS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_equals_plain_greedy(family: str, method: str, seed: int, kind: str) -> None:
    result = racer_rs.generate(_model(family, seed), _prompt(kind, seed), method=method, max_new_tokens=NEW_TOKENS)
    assert result.tokens == _expected(family, seed, kind)


def test_drafts_are_accepted_on_repeating_output() -> None:
    """Equivalence tests would pass trivially if nothing were ever accepted."""
    result = racer_rs.generate(
        _model("llama", 0), REPEATING_PROMPT, method="racer", max_new_tokens=NEW_TOKENS, capacity=16
    )
    assert result.mat > 1.5
    assert max(result.accepted_lengths) > 2


@pytest.mark.parametrize("capacity", [1, 2, 3, 7, 100])
def test_greedy_equivalence_at_any_capacity(capacity: int) -> None:
    result = racer_rs.generate(
        _model("qwen3", 0), REPEATING_PROMPT, method="racer", capacity=capacity, max_new_tokens=NEW_TOKENS
    )
    assert result.tokens == _expected("qwen3", 0, "repeating")
    assert result.extras["mean_tree_size"] <= capacity


@pytest.mark.parametrize("method", ENGINE_METHODS)
def test_result_contract(method: str) -> None:
    result = racer_rs.generate(_model("llama", 1), REPEATING_PROMPT, method=method, max_new_tokens=NEW_TOKENS)
    assert result.method == method
    assert sum(result.accepted_lengths) == len(result.tokens) == NEW_TOKENS
    assert result.steps == len(result.accepted_lengths) == len(result.positions)
    assert result.mat == pytest.approx(NEW_TOKENS / result.steps)
    assert result.positions[0] == 0
    steps = zip(result.positions, result.positions[1:], result.accepted_lengths, strict=False)
    assert all(b - a == n for a, b, n in steps)
    assert {"prefill", "draft", "verify", "bookkeeping", "total"} <= set(result.timings)
    assert result.timings["forward"] <= result.timings["verify"] <= result.timings["total"]
    if method == "ar":
        assert set(result.accepted_lengths) == {1}


def test_tensor_prompts_match_list_prompts() -> None:
    model = _model("llama", 0)
    expected = racer_rs.generate(model, REPEATING_PROMPT, max_new_tokens=12).tokens
    as_1d = racer_rs.generate(model, torch.tensor(REPEATING_PROMPT), max_new_tokens=12).tokens
    as_2d = racer_rs.generate(model, torch.tensor([REPEATING_PROMPT]), max_new_tokens=12).tokens
    assert expected == as_1d == as_2d


def test_streamer_receives_committed_tokens_with_draft_flags() -> None:
    class Collector:
        def __init__(self) -> None:
            self.chunks: list[tuple[list[int], list[bool]]] = []
            self.ended = False

        def put(self, tokens: list[int], drafted: list[bool]) -> None:
            self.chunks.append((tokens, drafted))

        def end(self) -> None:
            self.ended = True

    collector = Collector()
    result = racer_rs.generate(_model("llama", 0), REPEATING_PROMPT, max_new_tokens=NEW_TOKENS, streamer=collector)
    assert collector.ended
    assert [t for tokens, _ in collector.chunks for t in tokens] == result.tokens
    assert [len(tokens) for tokens, _ in collector.chunks] == result.accepted_lengths
    assert all(flags == [False] + [True] * (len(flags) - 1) for _, flags in collector.chunks)


def test_hf_streamer_gets_prompt_then_tokens() -> None:
    from transformers.generation.streamers import BaseStreamer

    class HFCollector(BaseStreamer):
        def __init__(self) -> None:
            self.values: list[list[int]] = []

        def put(self, value: torch.Tensor) -> None:
            self.values.append(value.reshape(-1).tolist())

        def end(self) -> None:
            pass

    collector = HFCollector()
    result = racer_rs.generate(_model("llama", 0), REPEATING_PROMPT, max_new_tokens=10, streamer=collector)
    assert collector.values[0] == REPEATING_PROMPT
    assert [t for chunk in collector.values[1:] for t in chunk] == result.tokens


def test_persistent_racer_keeps_its_index_across_requests() -> None:
    model = _model("llama", 0)
    requests = [("repeating", REPEATING_PROMPT), ("random", random_prompt(0))]
    persistent = make_drafter("racer", model, persistent=True)
    fresh = make_drafter("racer", model)
    final_nodes = {}
    for name, drafter in (("persistent", persistent), ("fresh", fresh)):
        for kind, prompt in requests:
            result = racer_rs.generate(model, prompt, max_new_tokens=NEW_TOKENS, drafter=drafter)
            assert result.tokens == _expected("llama", 0, kind)
            assert result.extras["persistent"] == (name == "persistent")
        final_nodes[name] = result.extras["automaton_nodes"]
    assert final_nodes["persistent"] > final_nodes["fresh"]
    assert isinstance(persistent, RacerDrafter)


def test_registry_lists_every_method_and_imports_lazily() -> None:
    assert set(available_methods()) == {
        "ar",
        "pld",
        "token_recycling",
        "racer",
        "racer_scored",
        "racer_retrieval",
        "racer_logits",
        "draft_model",
        "tts",
        "racer_tts",
        "suffix",
        "suffix_chain",
    }
    assert all(":" in target for target in METHODS.values())


def test_registry_import_is_lazy_and_torch_free() -> None:
    code = (
        "import sys, racer_rs.drafters as d; "
        "assert d.available_methods(); "
        "loaded = [m for m in ('torch', 'racer_rs.drafters.racer', 'racer_rs.drafters.tts') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr


def test_missing_method_module_fails_only_when_requested(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(METHODS, "ghost", "racer_rs.drafters.no_such_module:make_drafter")
    with pytest.raises(ModuleNotFoundError):
        make_drafter("ghost", _model("llama", 0))
    assert make_drafter("pld", _model("llama", 0)).name == "pld"


def _reference_prompts(limit: int) -> list[str]:
    path = reference_file("data/code_completion.jsonl")
    if not path.is_file():
        pytest.skip(f"{path} is absent (set RACER_SHARED_DIR to the shared folder)")
    with path.open() as handle:
        rows = [json.loads(line) for line, _ in zip(handle, range(limit), strict=False)]
    return [row["turns"][0] for row in rows]


@pytest.mark.parametrize("method", ENGINE_METHODS)
def test_reference_model_greedy_equivalence(reference_model, method: str) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer = reference_model
    for text in _reference_prompts(limit=2):
        prompt = tokenizer(text)["input_ids"][-300:]
        key = ("reference", 0, tuple(prompt))
        if key not in _reference_cache:
            _reference_cache[key] = plain_greedy(model, prompt, 48)
        expected = _reference_cache[key]
        result = racer_rs.generate(model, prompt, method=method, max_new_tokens=48)
        assert result.tokens == expected


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("racer", {"breadth": 2, "ngram": 4}),
        ("racer_scored", {"min_score": 0.2}),
        ("racer_logits", {"breadth": 3}),
        ("pld", {"max_ngram": 2, "num_pred": 4}),
    ],
)
def test_method_options_reach_the_drafter(method: str, options: dict) -> None:
    model = _model("llama", 0)
    # A fixed capacity: at "auto" the tree sizes follow this machine's measured cost curve.
    narrow = racer_rs.generate(
        model, REPEATING_PROMPT, method=method, max_new_tokens=NEW_TOKENS, capacity=16, **options
    )
    default = racer_rs.generate(model, REPEATING_PROMPT, method=method, max_new_tokens=NEW_TOKENS, capacity=16)
    assert narrow.tokens == default.tokens == _expected("llama", 0, "repeating")
    assert narrow.extras["mean_tree_size"] < default.extras["mean_tree_size"]
