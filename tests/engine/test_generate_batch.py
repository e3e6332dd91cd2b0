"""``generate_batch``: every row lossless on its own, the ragged KV cache, one ``auto`` budget.

Greedy rows must equal plain greedy decoding of their prompt (every tested family and every
method that batches, ragged prompts, rows finishing at different steps); sampled rows must follow
the exact distribution (a chi-square test per row, which a deliberately lossy rule fails) and a
seeded row ``b`` must give the very text plain sampling gives with seed ``seed + b``. The batched
verifier's cache is checked against one-request caches step by step, and ``capacity="auto"``'s
batch-wide rule against a brute-force oracle.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.autosize import batch_sizer as batch_sizing  # noqa: E402
from racer_rs.autosize import state as tree_size  # noqa: E402
from racer_rs.autosize.batch_sizer import (  # noqa: E402
    DRAFT_PRICE_PRIOR_SPREAD,
    BatchCosts,
    DraftPrice,
    TokenShare,
    best_batch_size,
    best_flat_sizes,
    best_layout_sizes,
    bucket_sizes,
    flat_step_seconds,
    interpolated,
)
from racer_rs.autosize.cost_model import CostModel, MachineLoad, synthetic_tree  # noqa: E402
from racer_rs.autosize.sizer import Ranking, best_prefix_size  # noqa: E402
from racer_rs.drafters.base import Proposal  # noqa: E402
from racer_rs.engine import capacity, generation  # noqa: E402
from racer_rs.engine.capacity import AutoCapacity, StepReport  # noqa: E402
from racer_rs.engine.decode_engine import DecodeEngine, DecodeState, Verification, Verified  # noqa: E402
from racer_rs.errors import InvalidArgumentError, InvalidTypeError, UnsupportedError  # noqa: E402
from racer_rs.target import attention  # noqa: E402
from racer_rs.target.batch_verifier import BatchVerifier, tree_offsets  # noqa: E402
from racer_rs.target.sampling import SamplingConfig, process_logits, resample_node  # noqa: E402
from racer_rs.target.verifier import TreeVerifier  # noqa: E402
from tests.helpers import (  # noqa: E402
    FAMILIES,
    REPEATING_PROMPT,
    own_request_only,
    plain_greedy,
    plain_sampling,
    random_prompt,
    tiny_model,
)
from tests.stats import chi_square_pvalue  # noqa: E402

# Rows are compared with their own generate(): the same drafts (tests/engine/conftest.py).
pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("same_drafts_as_generate")]


BATCH_METHODS = ["ar", "pld", "token_recycling", "racer", "racer_scored", "racer_retrieval", "racer_logits"]
#: Ragged prompts: a repeating one (drafts get accepted), a short and a long random one.
PROMPTS = [REPEATING_PROMPT, random_prompt(1, 9), random_prompt(2, 30)]
BUDGETS = [40, 24, 33]

_models: dict[tuple[str, int], torch.nn.Module] = {}
_plain: dict[tuple[str, int, tuple[int, ...], int], list[int]] = {}


def _model(family: str, seed: int = 0) -> torch.nn.Module:
    if (family, seed) not in _models:
        _models[(family, seed)] = tiny_model(family, seed=seed, sharpen=4.0)
    return _models[(family, seed)]


def _expected(family: str, prompt: list[int], budget: int, seed: int = 0) -> list[int]:
    key = (family, seed, tuple(prompt), budget)
    if key not in _plain:
        _plain[key] = plain_greedy(_model(family, seed), prompt, budget)
    return _plain[key]


# --- greedy: every row equals plain greedy decoding ------------------------------------------


@pytest.mark.parametrize("method", BATCH_METHODS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_row_equals_plain_greedy(family: str, method: str) -> None:
    results = racer_rs.generate_batch(_model(family), PROMPTS, method=method, max_new_tokens=BUDGETS)
    for row, (prompt, budget, result) in enumerate(zip(PROMPTS, BUDGETS, results, strict=True)):
        assert result.tokens == _expected(family, prompt, budget), (family, method, row)
        assert result.method == method


@pytest.mark.parametrize("method", BATCH_METHODS)
def test_every_row_takes_the_steps_generate_takes(method: str) -> None:
    """Each row drafts what its own request would (one DraftPool call for RACER's methods) and
    accepts the same paths: accepted lengths match ``generate`` step for step."""
    model, isolated = _model("llama"), own_request_only(method)
    results = racer_rs.generate_batch(model, PROMPTS, method=method, max_new_tokens=BUDGETS, capacity=12, **isolated)
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results, strict=True):
        alone = racer_rs.generate(model, prompt, method=method, max_new_tokens=budget, capacity=12, **isolated)
        assert result.accepted_lengths == alone.accepted_lengths
        assert result.extras["mean_tree_size"] == pytest.approx(alone.extras["mean_tree_size"])
    if method != "ar":
        assert max(r.mat for r in results) > 1.3  # drafts were accepted: trees were really verified


def test_rows_finish_at_different_steps_with_an_eos_inside_an_accepted_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """EOS 21 ends row 0 early, never comes in row 1 (its budget ends it) and ends row 2 in the
    middle of an accepted path (the path is cut after it)."""
    model, eos = _model("llama"), 21
    cut_inside_path = []
    commit = DecodeEngine.commit

    def spy(self: DecodeEngine, live: list[DecodeState], proposals: Any, verifications: list[Verification]) -> None:
        before = [state.length for state in live]
        commit(self, live, proposals, verifications)
        for state, length, verification in zip(live, before, verifications, strict=True):
            if state.finished and len(verification.path) > state.length - length:
                cut_inside_path.append(state.row)

    monkeypatch.setattr(DecodeEngine, "commit", spy)
    results = racer_rs.generate_batch(model, PROMPTS, method="racer", max_new_tokens=40, eos_token_id=eos, capacity=16)
    for prompt, result in zip(PROMPTS, results, strict=True):
        plain = _expected("llama", prompt, 40)
        assert result.tokens == (plain[: plain.index(eos) + 1] if eos in plain else plain)
    assert len({r.steps for r in results}) == 3  # every row left the batch at its own step
    assert results[0].tokens[-1] == eos and eos not in results[1].tokens and len(results[1].tokens) == 40
    assert cut_inside_path == [2]


def test_a_batch_of_one_equals_generate() -> None:
    model = _model("qwen3")
    for method in BATCH_METHODS:
        [row] = racer_rs.generate_batch(model, [REPEATING_PROMPT], method=method, max_new_tokens=40, capacity=16)
        alone = racer_rs.generate(model, REPEATING_PROMPT, method=method, max_new_tokens=40, capacity=16)
        assert (row.tokens, row.accepted_lengths, row.positions) == (
            alone.tokens,
            alone.accepted_lengths,
            alone.positions,
        )
        sampled = {"temperature": 1.0, "top_p": 0.9, "seed": 3, "max_new_tokens": 40}
        [row] = racer_rs.generate_batch(model, [REPEATING_PROMPT], method=method, capacity=16, **sampled)
        alone = racer_rs.generate(model, REPEATING_PROMPT, method=method, capacity=16, **sampled)
        assert (row.tokens, row.accepted_lengths) == (alone.tokens, alone.accepted_lengths)


@pytest.mark.parametrize("capacity", [1, 2, 5, 64])
def test_any_fixed_capacity_is_lossless_and_respected(capacity: int) -> None:
    results = racer_rs.generate_batch(_model("phi"), PROMPTS, method="racer", capacity=capacity, max_new_tokens=BUDGETS)
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results, strict=True):
        assert result.tokens == _expected("phi", prompt, budget)
        assert result.extras["mean_tree_size"] <= capacity


def test_budgets_of_one_and_prompts_as_tensors() -> None:
    model = _model("gpt_neox")
    results = racer_rs.generate_batch(model, torch.tensor([PROMPTS[0][:9], PROMPTS[1]]), max_new_tokens=1)
    assert [r.tokens for r in results] == [
        _expected("gpt_neox", PROMPTS[0][:9], 1),
        _expected("gpt_neox", PROMPTS[1], 1),
    ]
    mixed = [np.asarray(PROMPTS[0]), torch.tensor([PROMPTS[1]]), tuple(PROMPTS[2])]
    results = racer_rs.generate_batch(model, mixed, max_new_tokens=[1, 7, 12])
    assert [r.tokens for r in results] == [
        _expected("gpt_neox", p, n) for p, n in zip(PROMPTS, [1, 7, 12], strict=True)
    ]


def test_result_contract_per_row() -> None:
    results = racer_rs.generate_batch(_model("llama"), PROMPTS, max_new_tokens=BUDGETS, seed=11, temperature=0.7)
    for row, (budget, result) in enumerate(zip(BUDGETS, results, strict=True)):
        assert sum(result.accepted_lengths) == len(result.tokens) == budget
        assert result.steps == len(result.accepted_lengths) == len(result.positions)
        assert result.positions[0] == 0
        assert all(
            b - a == n for a, b, n in zip(result.positions, result.positions[1:], result.accepted_lengths, strict=False)
        )
        assert {"prefill", "draft", "verify", "forward", "accept", "bookkeeping", "total"} == set(result.timings)
        assert result.timings["forward"] <= result.timings["verify"] <= result.timings["total"]
        batch = result.extras["batch"]
        assert (batch["size"], batch["row"], batch["seed"]) == (3, row, 11 + row)
        assert batch["tree_tokens"] <= batch["padded_tokens"]
    assert max(r.timings["total"] for r in results) <= results[0].extras["batch"]["wall_s"]


def test_suffix_decoding_batches_row_by_row(arctic: None) -> None:
    model = _model("llama")
    for method in ("suffix", "suffix_chain"):
        results = racer_rs.generate_batch(model, PROMPTS, method=method, max_new_tokens=BUDGETS)
        assert [r.tokens for r in results] == [_expected("llama", p, n) for p, n in zip(PROMPTS, BUDGETS, strict=True)]


# --- sampling ---------------------------------------------------------------------------------

CONFIG = SamplingConfig(temperature=1.0, top_p=0.9)


@pytest.mark.parametrize("method", BATCH_METHODS)
def test_a_seeded_row_samples_what_plain_sampling_does_with_its_seed(method: str) -> None:
    """Row ``b`` of a call with ``seed`` uses seed ``seed + b``: its text is plain sampling's."""
    model = tiny_model("llama", seed=1, sharpen=15.0)
    results = racer_rs.generate_batch(
        model, PROMPTS, method=method, max_new_tokens=BUDGETS, temperature=1.0, top_p=0.9, seed=5
    )
    for row, (prompt, budget, result) in enumerate(zip(PROMPTS, BUDGETS, results, strict=True)):
        assert result.tokens == plain_sampling(model, prompt, budget, CONFIG, 5 + row), (method, row)


def test_a_seeded_batch_is_reproducible() -> None:
    model = tiny_model("qwen2", seed=1, sharpen=8.0)
    options: dict[str, Any] = {"max_new_tokens": 30, "temperature": 0.8, "top_k": 20, "top_p": 0.95}
    first = [r.tokens for r in racer_rs.generate_batch(model, PROMPTS, seed=7, **options)]
    assert [r.tokens for r in racer_rs.generate_batch(model, PROMPTS, seed=7, **options)] == first
    assert [r.tokens for r in racer_rs.generate_batch(model, PROMPTS, seed=8, **options)] != first
    assert len({tuple(tokens) for tokens in first}) == 3


VOCAB = 16
ROW_PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3], [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4]]
FIRST = 2  # tokens whose joint distribution is tested: the prefill's sample and the first step's
ALPHA = 1e-3
RUNS = 1500


@pytest.fixture(scope="module")
def peaky() -> torch.nn.Module:
    return tiny_model("llama", seed=2, vocab=VOCAB, sharpen=15.0)


@torch.inference_mode()
def exact_first_tokens(model: torch.nn.Module, prompt: list[int]) -> dict[tuple[int, int], float]:
    """Exact joint distribution of a prompt's first two sampled tokens (by enumeration)."""
    first = process_logits(model(input_ids=torch.tensor([prompt])).logits[0, -1], CONFIG).softmax(-1)
    second = process_logits(
        model(input_ids=torch.tensor([[*prompt, t] for t in range(VOCAB)])).logits[:, -1], CONFIG
    ).softmax(-1)
    joint = first[:, None] * second
    return {(a, b): float(joint[a, b]) for a in range(VOCAB) for b in range(VOCAB) if joint[a, b] > 0}


class ResampleAfterMismatchLoop(DecodeEngine):
    """The reference code's lossy rule, per row: after a mismatch, a FRESH sample is emitted."""

    def accept(self, state: DecodeState, verified: Verified) -> Verification:
        verification = super().accept(state, verified)
        last = verification.path[-1]
        verification.bonus = resample_node(verified.step.logits[last], self.sampling, state.generator)
        return verification


def _first_tokens(model: torch.nn.Module) -> tuple[list[Counter[tuple[int, ...]]], list[float]]:
    """Per row: counts of its first tokens over RUNS seeded batches, and how often its first
    step accepted a drafted token (every step drafts: the drafting switch, which learns over
    the RUNS calls that a tiny model's drafts do not pay, is kept on, and every call prices
    drafted steps afresh, as a new process does, not as the calls before it measured them)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity.AutoCapacity, "drafts", lambda self, batch: True)
        patch.setattr(capacity, "draft_prices", lambda key: {})
        return _first_tokens_drafting(model)


def _first_tokens_drafting(model: torch.nn.Module) -> tuple[list[Counter[tuple[int, ...]]], list[float]]:
    counts: list[Counter[tuple[int, ...]]] = [Counter() for _ in ROW_PROMPTS]
    accepted = [0.0 for _ in ROW_PROMPTS]
    for run in range(RUNS):
        seed = run * len(ROW_PROMPTS)  # rows use seed + row: no two runs share a seed
        results = racer_rs.generate_batch(
            model, ROW_PROMPTS, method="racer", max_new_tokens=FIRST + 1, temperature=1.0, top_p=0.9, seed=seed
        )
        for row, result in enumerate(results):
            counts[row][tuple(result.tokens[:FIRST])] += 1
            accepted[row] += (result.accepted_lengths[0] > 1) / RUNS
    return counts, accepted


def test_every_row_s_first_tokens_follow_the_exact_distribution(peaky: torch.nn.Module, forced_cost: Any) -> None:
    # Flat costs, a private cache and no calibration to warm-start from: the cut verifies drafts
    # at every first step, whatever other tests on this tiny model (its calibration key) taught
    # or a measured curve says (one full CI run accepted drafts in 0.7% of one row's runs).
    forced_cost(COSTS["flat"])
    counts, accepted = _first_tokens(peaky)
    for row, prompt in enumerate(ROW_PROMPTS):
        assert accepted[row] > 0.1, row  # drafts accepted: the walk's rule really decided
        assert chi_square_pvalue(counts[row], exact_first_tokens(peaky, prompt), RUNS) > ALPHA, row


def test_a_lossy_rule_fails_the_same_test_per_row(
    peaky: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, forced_cost: Any
) -> None:
    forced_cost(COSTS["flat"])  # as above
    monkeypatch.setattr(generation, "DecodeEngine", ResampleAfterMismatchLoop)
    counts, _ = _first_tokens(peaky)
    for row, prompt in enumerate(ROW_PROMPTS):
        assert chi_square_pvalue(counts[row], exact_first_tokens(peaky, prompt), RUNS) < ALPHA, row


def test_a_lossy_rule_breaks_equality_with_plain_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seeded-equality test above can fail."""
    model = tiny_model("llama", seed=1, sharpen=15.0)
    monkeypatch.setattr(generation, "DecodeEngine", ResampleAfterMismatchLoop)
    results = racer_rs.generate_batch(model, PROMPTS, max_new_tokens=40, temperature=1.0, top_p=0.9, seed=5)
    expected = [plain_sampling(model, p, 40, CONFIG, 5 + row) for row, p in enumerate(PROMPTS)]
    assert any(r.tokens != e for r, e in zip(results, expected, strict=True))


# --- the batched verifier ---------------------------------------------------------------------


def _chain_path(tree: Any, node: int) -> np.ndarray:
    """The accepted path ending at ``node``: its ancestors, root first."""
    path = [node]
    while tree.parents[path[-1]] >= 0:
        path.append(int(tree.parents[path[-1]]))
    return np.asarray(path[::-1], dtype=np.int64)


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "padded"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_ragged_cache_holds_every_row_s_own_cache(family: str, flat: bool) -> None:
    """Step by step, with rows accepting different paths and one row leaving, every row's valid
    columns hold what a one-request verifier holds, and its logits are that verifier's: trees
    of different sizes verified flat (the real nodes only) or padded."""
    model = _model(family)
    vocab = model.config.vocab_size
    prompts = [np.asarray(random_prompt(seed, length), dtype=np.int32) for seed, length in [(3, 5), (4, 21), (5, 12)]]
    batch = BatchVerifier(model, flat_forwards=flat)
    assert batch.flat == flat
    batch.prefill(prompts)
    alone = []
    for prompt in prompts:
        verifier = TreeVerifier(model)
        verifier.prefill(prompt)
        alone.append(verifier)
    rng = np.random.default_rng(0)
    rows = [0, 1, 2]
    for step in range(6):
        trees = [synthetic_tree(int(rng.integers(1, 12)), vocab, branching=int(rng.integers(1, 4))) for _ in rows]
        logits = batch.forward_trees(trees)
        assert logits.shape[0] == sum(len(tree) for tree in trees)
        paths: list[np.ndarray | None] = []
        offsets = tree_offsets([len(tree) for tree in trees])
        for start, row, tree in zip(offsets, rows, trees, strict=True):
            single = alone[row].forward_tree(tree.tokens, tree.depths, tree.attention_mask() if len(tree) > 1 else None)
            torch.testing.assert_close(logits[start : start + len(tree)], single, rtol=0, atol=1e-5)
            path = _chain_path(tree, int(rng.integers(len(tree))))
            alone[row].commit(path)
            paths.append(None if (step == 2 and row == 1) else path)  # row 1 leaves after step 2
        batch.commit(paths)
        rows = [row for row, path in zip(rows, paths, strict=True) if path is not None]
        assert batch.lengths.tolist() == [alone[row].length for row in rows]
        assert batch.cache is not None and batch.cache.get_seq_length() == max(alone[row].length for row in rows)
        for index, row in enumerate(rows):
            length = alone[row].length
            for mine, theirs in zip(batch.cache.layers, alone[row].cache.layers, strict=True):
                assert mine.keys is not None and theirs.keys is not None
                assert mine.values is not None and theirs.values is not None
                torch.testing.assert_close(mine.keys[index, :, :length], theirs.keys[0], rtol=0, atol=1e-5)
                torch.testing.assert_close(mine.values[index, :, :length], theirs.values[0], rtol=0, atol=1e-5)
    assert batch.flat == flat  # no layer fell back to padded forwards


def test_a_model_whose_attention_cannot_run_flat_verifies_padded(monkeypatch: pytest.MonkeyPatch) -> None:
    """An attention call the flat layout does not cover (here: every call) makes the verifier
    discard the flat step, verify it padded, and stay padded; the logits are the padded ones."""
    model = _model("llama")
    prompts = [np.asarray(random_prompt(seed, 9), dtype=np.int32) for seed in (1, 2)]
    trees = [synthetic_tree(5, model.config.vocab_size), synthetic_tree(2, model.config.vocab_size)]
    padded = BatchVerifier(model, flat_forwards=False)
    padded.prefill(prompts)
    expected = padded.forward_trees(trees)

    def unsupported(*args: Any, **kwargs: Any) -> Any:
        raise attention.FlatLayoutUnsupported("test")

    monkeypatch.setattr(attention, "_flat_attention", unsupported)
    verifier = BatchVerifier(model)
    verifier.prefill(prompts)
    assert verifier.flat
    logits = verifier.forward_trees(trees)
    assert not verifier.flat and verifier.cache is not None
    assert verifier.cache.get_seq_length() == verifier.physical + 5  # the flat attempt's columns went
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)


def test_an_eager_attention_model_never_runs_flat() -> None:
    model = _model("llama")
    model.config._attn_implementation = "eager"
    try:
        assert not BatchVerifier(model).flat
    finally:
        model.config._attn_implementation = "sdpa"


def test_the_mask_blocks_holes_and_isolates_padding_nodes() -> None:
    model = _model("llama")
    batch = BatchVerifier(model)
    batch.prefill([np.asarray([1, 2, 3], dtype=np.int32), np.asarray([4, 5, 6, 7, 8], dtype=np.int32)])
    short, long = racer_rs.DraftTree([9, 10], [-1, 0]), racer_rs.DraftTree([11, 12, 13], [-1, 0, 0])
    inputs = batch.tree_inputs([short, long])
    assert inputs["input_ids"].tolist() == [[9, 10, 9], [11, 12, 13]]
    assert inputs["position_ids"].tolist() == [[3, 4, 3], [5, 6, 6]]
    allowed = (inputs["attention_mask"][:, 0] == 0).tolist()
    assert allowed[0] == [
        [True, True, True, False, False, True, False, False],  # the root: its prefix, not the holes
        [True, True, True, False, False, True, True, False],  # its child: the root too
        [True, True, True, False, False, False, False, True],  # a padding node: itself only
    ]
    assert allowed[1] == [
        [True] * 5 + [True, False, False],
        [True] * 5 + [True, True, False],
        [True] * 5 + [True, False, True],  # siblings do not see each other
    ]


# --- bad input: one clear error naming the row, before any work --------------------------------


@pytest.mark.parametrize(
    ("prompts", "options", "error", "message"),
    [
        ([], {}, InvalidArgumentError, r"prompts is empty"),
        ([[1, 2], [3], []], {}, InvalidArgumentError, r"prompts\[2\]: prompt is empty"),
        ([[1, 2], [3, 96]], {}, InvalidArgumentError, r"prompts\[1\]: prompt must be token ids in \[0, 96\), got 96"),
        ([[-1, 2], [3]], {}, InvalidArgumentError, r"prompts\[0\]: .* got -1"),
        ([[1], [2], [3], [4] * 250], {"max_new_tokens": 10}, InvalidArgumentError, r"prompts\[3\]: 250 tokens plus"),
        ([[1], [2] * 10], {"max_new_tokens": [10, 250]}, InvalidArgumentError, r"prompts\[1\]: 10 tokens plus"),
        ([[1], [[2, 3], [4, 5]]], {}, InvalidArgumentError, r"prompts\[1\]: prompt must be one prompt"),
        ([[1], [2**40]], {}, InvalidArgumentError, r"prompts\[1\]: .*got 1099511627776"),
        (np.zeros(4, dtype=np.int64), {}, InvalidArgumentError, r"prompts must be a \[B, L\] array"),
        ([[1, 2], ["a"]], {}, InvalidTypeError, r"prompts\[1\]: prompt must be a list of ints"),
        ([[1], [True, 2]], {}, InvalidTypeError, r"prompts\[1\]: prompt must be a list of ints"),
        ([[1], torch.tensor([1.5])], {}, InvalidTypeError, r"prompts\[1\]: prompt must hold integers"),
        ([[1], "abc"], {}, InvalidTypeError, r"prompts\[1\]: prompt must be a list of ints or an integer"),
        ([1, 2, 3], {}, InvalidTypeError, r"flat list of ints: pass \[prompt\]"),
        ("abc", {}, InvalidTypeError, r"prompts must be a list of prompts"),
        (None, {}, InvalidTypeError, r"prompts must be a list of prompts"),
        ([[1], [2]], {"max_new_tokens": 0}, InvalidArgumentError, r"max_new_tokens must be >= 1"),
        ([[1], [2]], {"max_new_tokens": [3]}, InvalidArgumentError, r"one budget per prompt \(2\), got 1"),
        ([[1], [2]], {"max_new_tokens": [3, 0]}, InvalidArgumentError, r"max_new_tokens\[1\] must be >= 1"),
        ([[1], [2]], {"max_new_tokens": 2.5}, InvalidTypeError, r"max_new_tokens must be an int"),
        ([[1], [2]], {"capacity": 0}, InvalidArgumentError, r"capacity must be an int >= 1 or 'auto'"),
        ([[1], [2]], {"temperature": -1.0}, InvalidArgumentError, r"temperature"),
        ([[1], [2]], {"seed": -1}, InvalidArgumentError, r"seed must be >= 0"),
        ([[1], [2]], {"seed": 2**64 - 1}, InvalidArgumentError, r"seed \+ the last row must be <="),
        ([[1], [2]], {"eos_token_id": 500}, InvalidArgumentError, r"eos_token_id"),
        ([[1], [2]], {"method": "nope"}, InvalidArgumentError, r"unknown method 'nope'"),
        ([[1], [2]], {"method": 3}, InvalidTypeError, r"method must be a string"),
        ([[1], [2]], {"method": "racer", "ngram": 0}, InvalidArgumentError, r"ngram must be >= 1"),
        ([[1], [2]], {"method": "pld", "colour": 1}, InvalidArgumentError, r"unknown option"),
        ([[1], [2]], {"capacity": "auto", "max_capacity": 256}, InvalidArgumentError, r"max_capacity \(256\)"),
    ],
)
def test_bad_input_is_one_clear_error_before_any_work(prompts: Any, options: dict, error: type, message: str) -> None:
    model = _model("llama")
    forwards = []
    hook = model.register_forward_pre_hook(lambda *args: forwards.append(1))
    try:
        with pytest.raises(error, match=message):
            racer_rs.generate_batch(model, prompts, **options)
    finally:
        hook.remove()
    assert not forwards


DRAFT_OPTIONS: dict[str, dict[str, Any]] = {
    "draft_model": {"canvas": 4},
    "tts": {"canvas": 4, "update_every": 2, "lr": 1e-2, "asynchronous": False},
    "racer_tts": {"canvas": 4, "update_every": 2, "lr": 1e-2, "asynchronous": False},
}


@pytest.mark.parametrize("method", list(DRAFT_OPTIONS))
@pytest.mark.parametrize("max_batch_size", [None, 2])
def test_draft_model_methods_batch_and_every_row_equals_plain_greedy(method: str, max_batch_size: int | None) -> None:
    from tests.helpers import tiny_llama

    target, draft = tiny_llama(0), tiny_llama(1)
    prompts = [random_prompt(seed, length=6 + 3 * seed) for seed in range(3)]
    results = racer_rs.generate_batch(
        target,
        prompts,
        method=method,
        max_new_tokens=[20, 14, 24],
        draft_model=draft,
        max_batch_size=max_batch_size,
        capacity=8,
        **DRAFT_OPTIONS[method],
    )
    for prompt, budget, result in zip(prompts, [20, 14, 24], results, strict=True):
        assert result.error is None
        assert result.tokens == plain_greedy(target, prompt, budget)
    assert max(r.mat for r in results) > 1.0  # the draft's tokens were accepted somewhere


def test_generate_points_a_batch_to_generate_batch() -> None:
    with pytest.raises(UnsupportedError, match="use generate_batch"):
        racer_rs.generate(_model("llama"), [[1, 2], [3, 4]])


# --- capacity="auto": one budget for the batch --------------------------------------------------


def brute_force_batch_rate(probabilities: list[list[float]], seconds: list[float]) -> float:
    """The oracle: the best rate over EVERY combination of per-row prefix sizes, a step costing
    the padded (largest) size."""
    limit = len(seconds)
    choices = [range(1, min(limit, len(p) + 1) + 1) for p in probabilities]
    best = 0.0
    for sizes in itertools.product(*choices):
        tokens = sum(1 + sum(p[: n - 1]) for p, n in zip(probabilities, sizes, strict=True))
        best = max(best, tokens / seconds[max(sizes) - 1])
    return best


def _rate(probabilities: list[list[float]], seconds: list[float], m: int) -> float:
    tokens = sum(1 + sum(p[: min(m, len(p) + 1) - 1]) for p in probabilities)
    return tokens / seconds[m - 1]


row_probabilities = st.lists(st.floats(0.0, 1.0), max_size=6).map(lambda p: sorted(p, reverse=True))
increments = st.lists(st.floats(0.0, 2.0), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.lists(row_probabilities, min_size=1, max_size=3), st.floats(0.01, 5.0), increments)
def test_the_batch_rule_matches_the_brute_force_oracle(probabilities, base, steps):
    seconds = list(base + np.cumsum([0.0, *steps])[: len(steps)])
    m = best_batch_size([np.asarray(p) for p in probabilities], np.asarray(seconds))
    assert _rate(probabilities, seconds, m) >= brute_force_batch_rate(probabilities, seconds) * (1 - 1e-9)
    smaller = [_rate(probabilities, seconds, k) for k in range(1, m)]
    assert all(rate < _rate(probabilities, seconds, m) * (1 - 1e-9) for rate in smaller)  # ties: the smaller


@settings(max_examples=300, deadline=None)
@given(row_probabilities, st.floats(0.01, 5.0), increments)
def test_at_one_row_the_batch_rule_is_today_s_rule(probabilities, base, steps):
    seconds = base + np.cumsum([0.0, *steps])[: len(steps)]
    assert best_batch_size([np.asarray(probabilities)], seconds) == best_prefix_size(np.asarray(probabilities), seconds)


def flat_rate(
    probabilities: list[list[float]], seconds: list[float], share: float, sizes: Any, overhead: float = 0.0
) -> float:
    """Expected tokens per second of a flat step in which row ``b`` verifies ``sizes[b]`` nodes
    (the flat layout ``overhead`` times dearer than the uniform step from size 2 on)."""
    batch, m = len(probabilities), int(max(sizes))
    extra = np.full(len(seconds), sum(int(n) - 1 for n in sizes), dtype=np.float64)
    cost = flat_step_seconds(np.asarray(seconds), np.full(len(seconds), share), extra, batch)[m - 1]
    cost += overhead * seconds[m - 1] if m > 1 else 0.0
    return sum(1 + sum(p[: int(n) - 1]) for p, n in zip(probabilities, sizes, strict=True)) / float(cost)


def brute_force_flat_rate(
    probabilities: list[list[float]], seconds: list[float], share: float, overhead: float = 0.0
) -> float:
    """The oracle: the best rate over EVERY combination of per-row prefix sizes of a flat step."""
    choices = [range(1, min(len(seconds), len(p) + 1) + 1) for p in probabilities]
    return max(flat_rate(probabilities, seconds, share, sizes, overhead) for sizes in itertools.product(*choices))


@settings(max_examples=300, deadline=None)
@given(st.lists(row_probabilities, min_size=1, max_size=3), st.floats(0.01, 5.0), increments, st.floats(0.0, 1.0))
def test_the_flat_rule_matches_the_brute_force_oracle(probabilities, base, steps, share):
    seconds = list(base + np.cumsum([0.0, *steps])[: len(steps)])
    sizes = best_flat_sizes([np.asarray(p) for p in probabilities], np.asarray(seconds), np.full(len(seconds), share))
    assert all(1 <= n <= min(len(seconds), len(p) + 1) for n, p in zip(sizes, probabilities, strict=True))
    best = brute_force_flat_rate(probabilities, seconds, share)
    assert flat_rate(probabilities, seconds, share, sizes) >= best * (1 - 1e-9)


@settings(max_examples=300, deadline=None)
@given(st.lists(row_probabilities, min_size=1, max_size=3), st.floats(0.01, 5.0), increments)
def test_with_no_token_share_the_flat_rule_fills_the_padding(probabilities, base, steps):
    """A forward that cannot run flat (share 0): every row keeps its nodes up to the padded size."""
    seconds = np.asarray(base + np.cumsum([0.0, *steps])[: len(steps)])
    sizes = best_flat_sizes([np.asarray(p) for p in probabilities], seconds, np.zeros(len(seconds)))
    assert _rate(probabilities, list(seconds), int(max(sizes))) >= brute_force_batch_rate(
        probabilities, list(seconds)
    ) * (1 - 1e-9)


def test_rows_priced_padded_fail_the_flat_oracle():
    """The flat oracle can fail: the padded rule gives every row the padded size's nodes, which a
    flat step charges for; one likely row and two unlikely ones should not all go deep."""
    probabilities = [[0.9, 0.9, 0.9], [0.05, 0.05, 0.05], [0.05, 0.05, 0.05]]
    seconds = [1.0, 1.2, 1.4, 1.6]
    m = best_batch_size([np.asarray(p) for p in probabilities], np.asarray(seconds))
    padded_sizes = [min(m, len(p) + 1) for p in probabilities]
    assert flat_rate(probabilities, seconds, 1.0, padded_sizes) < brute_force_flat_rate(probabilities, seconds, 1.0) * (
        1 - 1e-3
    )
    sizes = best_flat_sizes([np.asarray(p) for p in probabilities], np.asarray(seconds), np.ones(4))
    assert sizes.tolist() == [4, 1, 1]


def layout_rate(
    probabilities: list[list[float]], seconds: list[float], share: float, sizes: Any, flat: bool, overhead: float = 0.0
) -> float:
    """Expected tokens per second of a step laid out flat, or padded (the padded size's price)."""
    if flat:
        return flat_rate(probabilities, seconds, share, sizes, overhead)
    return (
        sum(1 + sum(p[: int(n) - 1]) for p, n in zip(probabilities, sizes, strict=True)) / seconds[int(max(sizes)) - 1]
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(row_probabilities, min_size=1, max_size=3),
    st.floats(0.01, 5.0),
    increments,
    st.floats(0.0, 1.0),
    st.sampled_from([0.0, 0.03, 0.3]),
)
def test_the_layout_rule_matches_both_brute_force_oracles(probabilities, base, steps, share, overhead):
    """The step is the best flat one or the best padded one, whichever pays more (ties: padded)."""
    seconds = list(base + np.cumsum([0.0, *steps])[: len(steps)])
    overheads = np.full(len(seconds), overhead)
    overheads[0] = 0.0
    sizes, flat = best_layout_sizes(
        [np.asarray(p) for p in probabilities], np.asarray(seconds), np.full(len(seconds), share), overheads
    )
    assert all(1 <= n <= min(len(seconds), len(p) + 1) for n, p in zip(sizes, probabilities, strict=True))
    best_flat = brute_force_flat_rate(probabilities, seconds, share, overhead)
    best_padded = brute_force_batch_rate(probabilities, seconds)
    assert layout_rate(probabilities, seconds, share, sizes, flat, overhead) >= max(best_flat, best_padded) * (1 - 1e-9)
    if flat:
        assert best_flat > best_padded * (1 + 1e-12)


def test_a_step_priced_alike_both_ways_runs_padded():
    """Every row keeps its likely node either way (the flat step's nodes fill every row): the
    same price, so the step runs padded, without the flat layout's scatter and gather."""
    probabilities = [[0.6, 0.1], [0.5, 0.1], [0.5, 0.1]]
    seconds = np.asarray([1.0, 1.3, 1.6])
    sizes, flat = best_layout_sizes([np.asarray(p) for p in probabilities], seconds, np.full(3, 0.2))
    assert not flat and sizes.tolist() == [2, 2, 2]
    assert best_flat_sizes([np.asarray(p) for p in probabilities], seconds, np.full(3, 0.2)).tolist() == [2, 2, 2]


def test_always_flat_fails_the_layout_oracle():
    """The counterpart: the flat rule alone, with a flat layout 5% dearer, gives fewer tokens per
    second than the padded step the layout rule picks."""
    probabilities = [[0.7], [0.7], [0.01], [0.01]]
    seconds = [1.0, 1.1]
    flat_sizes = best_flat_sizes([np.asarray(p) for p in probabilities], np.asarray(seconds), np.full(2, 0.5))
    best = max(brute_force_flat_rate(probabilities, seconds, 0.5, 0.05), brute_force_batch_rate(probabilities, seconds))
    assert flat_rate(probabilities, seconds, 0.5, flat_sizes, 0.05) < best * (1 - 1e-3)


def test_one_likely_row_among_unlikely_ones_runs_flat():
    probabilities = [[0.9, 0.9, 0.9], [0.05, 0.05, 0.05], [0.05, 0.05, 0.05]]
    sizes, flat = best_layout_sizes(
        [np.asarray(p) for p in probabilities], np.asarray([1.0, 1.2, 1.4, 1.6]), np.ones(4)
    )
    assert flat and sizes.tolist() == [4, 1, 1]


def test_rows_sized_alone_fail_the_oracle():
    """The oracle can fail: sizing each row as if it were alone ignores that the padded forward
    costs the largest row's size for every row, so the smaller rows' nodes up to it come free."""
    probabilities = [[0.9, 0.9, 0.9], [0.3, 0.3, 0.3]]
    seconds = [1.0, 1.5, 2.0, 2.5]
    alone = [best_prefix_size(np.asarray(p), np.asarray(seconds)) for p in probabilities]
    assert alone == [4, 1]
    tokens_alone = sum(1 + sum(p[: n - 1]) for p, n in zip(probabilities, alone, strict=True))
    assert tokens_alone / seconds[max(alone) - 1] < brute_force_batch_rate(probabilities, seconds) * (1 - 1e-9)
    m = best_batch_size([np.asarray(p) for p in probabilities], np.asarray(seconds))
    assert m == 4 and _rate(probabilities, seconds, m) == pytest.approx(brute_force_batch_rate(probabilities, seconds))


def test_bucket_sizes_cover_a_shrinking_batch():
    assert bucket_sizes(1) == []
    assert bucket_sizes(2) == [2]
    assert bucket_sizes(3) == [2, 4]
    assert bucket_sizes(8) == [2, 4, 8]
    assert bucket_sizes(9) == [2, 4, 8, 16]


def _flat(seconds: float = 1.0) -> CostModel:
    return CostModel([1, 64], {1: [seconds, seconds], 2: [seconds, seconds]})


def _steep(per_node: float, overhead: float = 0.0) -> CostModel:
    sizes = [1, 2, 4, 8, 16, 32, 64]
    curve = [1.0 + per_node * (n - 1) for n in sizes]
    return CostModel(sizes, {128: curve, 1024: curve}, overhead=overhead)


class FixedCosts:
    """Batch costs that never change: ``per_batch(B)`` for every batch size, and a token share of
    ``share`` at every padded size (flat steps)."""

    def __init__(self, per_batch: Any, share: float = 0.8) -> None:
        self.per_batch = per_batch
        self.share = share
        self.models: dict[int, CostModel] = {}

    def for_batch(self, batch: int) -> CostModel:
        return self.models.setdefault(batch, self.per_batch(batch))

    def token_share(self, batch: int) -> TokenShare:
        return TokenShare([2], {1: [self.share], 2: [self.share]})

    def save(self) -> None:
        pass


@pytest.fixture
def forced_cost(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    """Fixed, frozen cost curves (batch size 1 through today's ``state.cost_model``) and a private
    cache; ``force(per_batch)`` sets them."""
    monkeypatch.setenv("RACER_RS_CACHE", str(tmp_path))
    monkeypatch.setattr(tree_size, "_calibrations", {})
    monkeypatch.setattr(CostModel, "observe", lambda self, *args, **kwargs: None)

    def force(per_batch: Any) -> None:
        monkeypatch.setattr(tree_size, "cost_model", lambda model, max_capacity: per_batch(1))
        monkeypatch.setattr(batch_sizing, "batch_costs", lambda model, max_capacity, batch: FixedCosts(per_batch))

    return force


COSTS = {
    "flat": lambda batch: _flat(),
    "steep": lambda batch: _steep(per_node=1.0),
    "mild": lambda batch: _steep(per_node=0.05 * batch, overhead=0.2),
}


@pytest.mark.parametrize("cost", list(COSTS))
@pytest.mark.parametrize("method", ["racer", "racer_scored", "token_recycling", "pld"])
def test_auto_at_batch_one_makes_today_s_choices(
    forced_cost: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, method: str, cost: str
) -> None:
    forced_cost(COSTS[cost])
    sizes: list[int] = []
    prefix = Ranking.prefix
    monkeypatch.setattr(Ranking, "prefix", lambda self, n: sizes.append(n) or prefix(self, n))
    model = _model("llama")
    alone = racer_rs.generate(model, REPEATING_PROMPT, method=method, max_new_tokens=40, capacity="auto")
    generate_sizes = list(sizes)
    sizes.clear()
    monkeypatch.setattr(tree_size, "_calibrations", {})  # the same warm start: none
    monkeypatch.setenv("RACER_RS_CACHE", str(tmp_path / "again"))
    [row] = racer_rs.generate_batch(model, [REPEATING_PROMPT], method=method, max_new_tokens=40, capacity="auto")
    assert sizes == generate_sizes
    assert (row.tokens, row.accepted_lengths) == (alone.tokens, alone.accepted_lengths)
    mine, today = row.extras["auto_capacity"], alone.extras["auto_capacity"]
    for key in ("chosen_sizes", "steps", "predicted_tokens_per_step", "observed_tokens_per_step", "cost_curve_ms"):
        assert mine[key] == today[key], key


@pytest.mark.parametrize("cost", list(COSTS))
@pytest.mark.parametrize("method", ["racer", "racer_scored", "token_recycling"])
def test_auto_batches_are_lossless_and_spend_one_budget(forced_cost: Any, method: str, cost: str) -> None:
    forced_cost(COSTS[cost])
    model = _model("qwen2")
    results = racer_rs.generate_batch(model, PROMPTS, method=method, max_new_tokens=BUDGETS, capacity="auto")
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results, strict=True):
        assert result.tokens == _expected("qwen2", prompt, budget)
        report = result.extras["auto_capacity"]
        assert sum(report["chosen_sizes"].values()) == report["steps"] == sum(report["batch_sizes"].values())
        assert max(report["chosen_sizes"]) <= max(report["padded_sizes"])  # no row beyond the padded size
    if cost == "steep":
        assert all(set(r.extras["auto_capacity"]["padded_sizes"]) == {1} for r in results)
    if cost == "flat":
        assert max(max(r.extras["auto_capacity"]["chosen_sizes"]) for r in results) > 8


def test_once_no_request_waits_only_the_rows_with_the_most_budget_left_pace() -> None:
    """The rows whose drafts shorten the call: all of them while a request waits (a row that
    finishes sooner admits it sooner), then only those with the most budget left."""
    states = [
        DecodeState(np.zeros(20, np.int32), prompt_length=2, length=2 + made, next_token=0, max_new_tokens=budget)
        for made, budget in [(3, 8), (0, 7), (1, 6), (2, 4), (0, 7)]
    ]  # 5, 7, 5, 2 and 7 tokens left
    engine: Any = dataclasses.make_dataclass("Engine", ["waiting", "ended_at_eos"])(["the next request"], False)
    assert DecodeEngine.pacing_rows(engine, states) == [True] * 5
    engine.waiting = []
    assert DecodeEngine.pacing_rows(engine, states) == [False, True, False, False, True]
    assert DecodeEngine.pacing_rows(engine, states[:1]) == [True]
    engine.ended_at_eos = True  # any row may end next: the budget no longer tells which ends last
    assert DecodeEngine.pacing_rows(engine, states) == [True] * 5


def test_a_row_that_does_not_pace_verifies_its_root_alone(forced_cost: Any) -> None:
    forced_cost(COSTS["flat"])  # every node pays
    policy = _three_row_policy()
    trees = [synthetic_tree(n, 96, branching=b) for n, b in [(16, 1), (9, 3), (9, 3)]]
    proposals = [Proposal(tree) for tree in trees]
    everyone, _ = policy.cut(proposals, [0, 1, 2], context=40, flat=True)
    assert all(len(p.tree) > 1 for p in everyone)
    paced, choices = policy.cut(proposals, [0, 1, 2], context=40, flat=True, pacing=[True, False, True])
    assert [len(p.tree) for p in paced] == [len(everyone[0].tree), 1, len(everyone[2].tree)]
    assert choices[1].keep.tolist() == [0]


def _paced_run(monkeypatch: pytest.MonkeyPatch, eos: int | None) -> list[tuple[int, bool, list[bool], list[int]]]:
    """Four requests at two rows, ragged budgets, checked against plain greedy decoding (cut
    after the first EOS); per drafted step: requests waiting, whether one had ended at EOS, the
    rows' pacing and the sizes the cut kept."""
    cut, pacing_rows = AutoCapacity.cut, DecodeEngine.pacing_rows
    engine_state: list[tuple[int, bool]] = []
    steps: list[tuple[list[bool], list[int]]] = []

    def recording_pacing(self: DecodeEngine, live: list[DecodeState]) -> list[bool]:
        engine_state.append((len(self.waiting), self.ended_at_eos))
        return pacing_rows(self, live)

    def recording_cut(self: AutoCapacity, proposals: Any, rows: Any, context: int, flat: bool, pacing: Any) -> Any:
        kept, choices = cut(self, proposals, rows, context, flat, pacing)
        steps.append((list(pacing), [len(p.tree) for p in kept]))
        return kept, choices

    monkeypatch.setattr(DecodeEngine, "pacing_rows", recording_pacing)
    monkeypatch.setattr(AutoCapacity, "cut", recording_cut)
    monkeypatch.setattr(AutoCapacity, "drafts", lambda self, batch: True)  # every step drafts
    prompts = [PROMPTS[1], REPEATING_PROMPT, PROMPTS[2], REPEATING_PROMPT]
    budgets = [8, 40, 24, 33]
    results = racer_rs.generate_batch(
        _model("qwen2"),
        prompts,
        method="racer",
        max_new_tokens=budgets,
        capacity="auto",
        max_batch_size=2,
        eos_token_id=eos,
    )
    for prompt, budget, result in zip(prompts, budgets, results, strict=True):
        expected = _expected("qwen2", prompt, budget)
        if eos in expected:
            expected = expected[: expected.index(eos) + 1]
        assert result.tokens == expected
    assert len(engine_state) == len(steps)
    return [
        (waiting, ended, pacing, sizes) for (waiting, ended), (pacing, sizes) in zip(engine_state, steps, strict=True)
    ]


def test_the_engine_drafts_only_for_the_rows_the_call_waits_for(
    forced_cost: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a request waits every row drafts; after that only the rows with the most budget
    left (the others verify their roots alone), and the outputs stay plain greedy decoding's."""
    forced_cost(COSTS["flat"])  # every node pays
    steps = _paced_run(monkeypatch, eos=None)
    assert {waiting > 0 for waiting, *_ in steps} == {True, False}
    held_back = 0
    for waiting, _, pacing, sizes in steps:
        if waiting or len(sizes) == 1:
            assert all(pacing)
        for paces, size in zip(pacing, sizes, strict=True):
            held_back += not paces
            assert paces or size == 1
    assert held_back, "no step ran with a row ahead of the others"


def test_once_a_request_ends_at_eos_every_row_drafts_again(forced_cost: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first request ends at EOS after 4 of its 8 tokens: from then on the budget does not
    tell which row ends last, and no row is held back."""
    forced_cost(COSTS["flat"])
    eos = _expected("qwen2", PROMPTS[1], 8)[3]
    steps = _paced_run(monkeypatch, eos=eos)
    after = [(pacing, sizes) for waiting, ended, pacing, sizes in steps if ended and not waiting and len(sizes) > 1]
    assert after, "no batched step after the EOS once the queue was empty"
    assert all(all(pacing) for pacing, _ in after)


def _three_row_policy() -> AutoCapacity:
    """``capacity="auto"`` on the llama model with rows 0, 1 and 2 admitted (costs as forced)."""
    policy = AutoCapacity(_model("llama"), "racer", greedy=True, max_capacity=16, max_rows=3)
    for row in range(3):
        policy.admit(row)
    return policy


def _three_row_report(
    full: list[Proposal],
    verified: list[Proposal],
    padded: int,
    step: float,
    flat: bool = False,
    drafted: bool = True,
) -> StepReport:
    """A step of :func:`_three_row_policy`'s rows at a 40-token context in which every row
    committed its root's token alone."""
    return StepReport(
        rows=[0, 1, 2],
        full=full,
        verified=verified,
        choices=[None, None, None],
        paths=[np.asarray([0])] * 3,
        bonuses=[1, 1, 1],
        randomized=[False] * 3,
        committed=[1, 1, 1],
        context=40,
        padded=padded,
        forward=0.0,
        step=step,
        drafted=drafted,
        flat=flat,
    )


def test_auto_cut_fills_every_row_up_to_the_chosen_padded_size(forced_cost: Any) -> None:
    forced_cost(lambda batch: _steep(per_node=0.02))
    policy = _three_row_policy()
    trees = [synthetic_tree(n, 96, branching=b) for n, b in [(16, 1), (3, 2), (9, 3)]]
    proposals = [Proposal(tree) for tree in trees]
    cut, choices = policy.cut(proposals, [0, 1, 2], context=40, flat=False)
    rankings = [policy.sizers[row].rank(tree) for row, tree in enumerate(trees)]
    steps = np.maximum.accumulate(_steep(per_node=0.02).step_seconds(np.arange(1, 17), 40))
    m = best_batch_size([r.corrected for r in rankings], DraftPrice.scaled(steps, DraftPrice().cautious()))
    assert [len(p.tree) for p in cut] == [min(m, len(tree)) for tree in trees]
    for ranking, choice in zip(rankings, choices, strict=True):
        assert choice.keep.tolist() == sorted(ranking.order[: len(choice.keep)].tolist())  # best first


def test_auto_cut_of_a_flat_step_keeps_each_row_s_own_best_prefix(forced_cost: Any) -> None:
    forced_cost(lambda batch: _steep(per_node=0.02))
    policy = _three_row_policy()
    trees = [synthetic_tree(n, 96, branching=b) for n, b in [(16, 1), (3, 2), (9, 3)]]
    cut, choices = policy.cut([Proposal(tree) for tree in trees], [0, 1, 2], context=40, flat=True)
    rankings = [policy.sizers[row].rank(tree) for row, tree in enumerate(trees)]
    steps = np.maximum.accumulate(_steep(per_node=0.02).step_seconds(np.arange(1, 17), 40))
    # A new process's price of drafting: the model's, one prior standard error higher.
    correction = DraftPrice().cautious()
    assert correction == pytest.approx(np.exp(DRAFT_PRICE_PRIOR_SPREAD))
    priced = DraftPrice.scaled(steps, correction)
    sizes = best_flat_sizes([r.corrected for r in rankings], priced, np.full(16, 0.8))
    assert policy.step_flat and [len(p.tree) for p in cut] == sizes.tolist()
    for ranking, choice in zip(rankings, choices, strict=True):
        assert choice.keep.tolist() == sorted(ranking.order[: len(choice.keep)].tolist())  # best first


@pytest.mark.parametrize("factor", [1.0, 1.2])
def test_a_flat_step_teaches_the_curve_its_error_not_the_nodes_left_out(
    forced_cost: Any, monkeypatch: pytest.MonkeyPatch, factor: float
) -> None:
    """A flat step that takes exactly its price (the model's, its part above a plain step times
    the drafted steps' learned ``factor``) is observed as the uniform step's predicted seconds at
    its padded size (no error left to learn), and one 10% slower as 10% over it; fails if the
    flat step's own seconds were observed (the curve would learn the saving), or if the factor
    were learned twice (by the price and again by the curve). A padded step's price is the
    uniform curve's at its size, with the same factor."""
    forced_cost(lambda batch: _steep(per_node=0.05))
    observed: list[tuple[int, float]] = []
    monkeypatch.setattr(
        CostModel,
        "observe",
        lambda self, n, context, forward, overhead, teaches_load: observed.append((n, forward, teaches_load)),
    )
    monkeypatch.setattr(DraftPrice, "observe", lambda self, predicted, measured, plain: None)  # held at `factor`
    policy = _three_row_policy()
    policy._draft_price(3).total = float(np.log(factor))
    for row in range(3):  # what the rows learn is not this test's
        monkeypatch.setattr(policy.sizers[row], "learn", lambda *args, **kwargs: None)
    trees = [synthetic_tree(8, 96, branching=1), synthetic_tree(1, 96), synthetic_tree(1, 96)]
    proposals = [Proposal(tree) for tree in trees]
    policy.cut(proposals, [0, 1, 2], context=40, flat=True)
    steps, share, _ = policy.last_prices[3]
    extra = np.full(len(steps), 7.0)
    predicted = float(DraftPrice.scaled(flat_step_seconds(steps, share, extra, 3), factor)[7])
    assert predicted < float(steps[7])  # two rows of roots cost less than three rows of 8
    padded = float(DraftPrice.scaled(steps, factor)[7])
    for slower in (1.0, 1.1):
        report = _three_row_report(proposals, proposals, padded=8, step=slower * predicted, flat=True)
        observed.clear()
        policy.observe(report)
        # Drafted steps teach the size's shape, not the machine's load (plain steps do).
        assert observed == [(8, pytest.approx(slower * float(steps[7])), False)]
        # A padded step that takes its price is the uniform curve's own at its size.
        observed.clear()
        policy.observe(dataclasses.replace(report, flat=False, step=slower * padded))
        assert observed == [(8, pytest.approx(slower * float(steps[7])), False)]
    observed.clear()
    policy.observe(dataclasses.replace(report, padded=1, drafted=False, step=float(steps[0])))
    assert observed == [(1, pytest.approx(float(steps[0])), True)]


def test_drafted_steps_teach_the_price_and_plain_steps_do_not(
    forced_cost: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flat and padded drafted steps each teach the batch size's price their cost above a plain
    step against the model's; a plain step (the drafting switch's) teaches it nothing."""
    forced_cost(lambda batch: _steep(per_node=0.05))
    seen: list[tuple[float, float, float]] = []
    monkeypatch.setattr(DraftPrice, "observe", lambda self, *args: seen.append(args))
    policy = _three_row_policy()
    for row in range(3):
        monkeypatch.setattr(policy.sizers[row], "learn", lambda *args, **kwargs: None)
        monkeypatch.setattr(policy.sizers[row], "count_plain", lambda *args, **kwargs: None)
    trees = [synthetic_tree(8, 96, branching=1), synthetic_tree(1, 96), synthetic_tree(1, 96)]
    proposals = [Proposal(tree) for tree in trees]
    policy.cut(proposals, [0, 1, 2], context=40, flat=True)
    steps, share, _ = policy.last_prices[3]
    flat = float(flat_step_seconds(steps, share, np.full(len(steps), 7.0), 3)[7])
    policy.observe(_three_row_report(proposals, proposals, padded=8, step=2.0, flat=True))
    policy.observe(_three_row_report(proposals, proposals, padded=8, step=2.0, flat=False))
    policy.observe(_three_row_report(proposals, proposals, padded=1, step=2.0, drafted=False))
    assert seen == [
        pytest.approx((flat, 2.0, float(steps[0]))),
        pytest.approx((float(steps[7]), 2.0, float(steps[0]))),
    ]


def test_a_new_batch_size_starts_from_the_nearest_learned_price(
    forced_cost: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch size met for the first time prices drafted steps as the nearest size that learned
    its price (of two as near, the larger), in a copy of its own; with none learned, the prior."""
    forced_cost(lambda batch: _steep(per_node=0.05))
    monkeypatch.setattr(capacity, "_draft_prices", {})  # this test's process-wide prices
    policy = _three_row_policy()
    assert policy._draft_price(5).factor == 1.0  # nothing learned yet
    learned = {16: policy._draft_price(16), 8: policy._draft_price(8)}  # both from the prior
    for size, measured in ((16, 3.0), (8, 1.25)):  # model: 2.0 s, plain 1.0 s
        for _ in range(4):
            learned[size].observe(2.0, measured, 1.0)
    sixteen, eight = learned[16].factor, learned[8].factor
    assert sixteen > 1.5 and eight < 0.5
    assert policy._draft_price(12).factor == pytest.approx(sixteen)  # as near as 8: the larger
    assert policy._draft_price(9).factor == pytest.approx(eight)
    policy._draft_price(9).observe(2.0, 3.0, 1.0)
    assert policy._draft_price(8).factor == pytest.approx(eight)  # a copy: 8's own is unchanged
    assert policy._draft_price(5).factor == 1.0


@pytest.mark.parametrize("learns", [True, False])
def test_flat_steps_dearer_than_their_model_stop_the_cut_from_drafting(
    forced_cost: Any, monkeypatch: pytest.MonkeyPatch, learns: bool
) -> None:
    """Flat steps that cost three times their model's price above a plain step teach the price
    of drafting, and the cut then verifies the roots alone, as the true price says it should
    (one likely row and two with nothing drafted: a padded step would charge every row for the
    deep one's nodes). The counterpart (``learns=False``: a price that never learns, as when the
    error only reached the uniform curve) keeps drafting: the check can fail."""
    forced_cost(lambda batch: _steep(per_node=0.2))
    if not learns:
        monkeypatch.setattr(DraftPrice, "observe", lambda self, predicted, measured, plain: None)
    policy = _three_row_policy()
    for row in range(3):
        monkeypatch.setattr(policy.sizers[row], "learn", lambda *args, **kwargs: None)
    trees = [synthetic_tree(16, 96, branching=1), synthetic_tree(1, 96), synthetic_tree(1, 96)]
    proposals = [Proposal(tree) for tree in trees]
    rankings = [policy.sizers[row].rank(tree) for row, tree in enumerate(trees)]
    probabilities = [r.corrected[: len(t) - 1] for r, t in zip(rankings, trees, strict=True)]
    for _ in range(60):
        cut, _ = policy.cut(proposals, [0, 1, 2], context=40, flat=True)
        if not policy.step_flat:
            break
        steps, share, _ = policy.last_prices[3]
        extra = np.full(len(steps), sum(len(p.tree) - 1 for p in cut), dtype=np.float64)
        m = max(len(p.tree) for p in cut)
        model = float(flat_step_seconds(steps, share, extra, 3)[m - 1])
        step = float(steps[0]) + 3.0 * (model - float(steps[0]))
        report = _three_row_report(proposals, cut, padded=m, step=step, flat=True)
        policy.observe(report)
    steps = np.maximum.accumulate(_steep(per_node=0.2).step_seconds(np.arange(1, 17), 40))
    at_true_price = best_flat_sizes(probabilities, DraftPrice.scaled(steps, 3.0), np.full(16, 0.8))
    cut, _ = policy.cut(proposals, [0, 1, 2], context=40, flat=True)
    kept = [len(p.tree) for p in cut]
    if learns:
        assert kept == at_true_price.tolist() == [1, 1, 1]
        # Learned part of the way: the cut stops drafting once the evidence is enough.
        assert 1.5 < policy._draft_price(3).factor <= 3.0
    else:
        assert kept == [2, 1, 1]


@pytest.mark.parametrize("fades", [True, False])
def test_a_price_learned_high_fades_in_the_steps_that_verify_no_node(
    forced_cost: Any, monkeypatch: pytest.MonkeyPatch, fades: bool
) -> None:
    """Ten drafted steps at three times their model's price stop the cut from drafting (one
    likely row, two with nothing drafted). The steps after, cut to their roots, teach the price
    nothing, but it fades toward its prior (:meth:`DraftPrice.forget`), and the cut verifies the
    likely row's nodes again within 100 steps. The counterpart (``fades=False``, as before
    ``forget``) never drafts again: the price that stopped it can no longer be measured."""
    forced_cost(lambda batch: _steep(per_node=0.2))
    if not fades:
        monkeypatch.setattr(DraftPrice, "forget", lambda self: None)
    policy = _three_row_policy()
    for row in range(3):
        monkeypatch.setattr(policy.sizers[row], "learn", lambda *args, **kwargs: None)
    price = policy._draft_price(3)
    for _ in range(10):
        price.observe(2.0, 1.0 + 3.0 * 1.0, 1.0)
    trees = [synthetic_tree(16, 96, branching=1), synthetic_tree(1, 96), synthetic_tree(1, 96)]
    proposals = [Proposal(tree) for tree in trees]
    cut, _ = policy.cut(proposals, [0, 1, 2], context=40, flat=True)
    assert [len(p.tree) for p in cut] == [1, 1, 1]
    roots = _three_row_report(proposals, cut, padded=1, step=1.0)
    idle = 0
    while idle < 100 and [len(p.tree) for p in cut] == [1, 1, 1]:
        policy.observe(roots)
        idle += 1
        cut, _ = policy.cut(proposals, [0, 1, 2], context=40, flat=True)
    kept = [len(p.tree) for p in cut]
    if fades:
        assert kept[0] > 1 and kept[1:] == [1, 1]
        assert price.steps == 10 and price.cautious() < 2.0
    else:
        assert kept == [1, 1, 1] and idle == 100


def test_stored_batch_curves_keep_no_per_size_shape(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A batch size's curve stored with the shapes its drafted steps taught (here size 2 at 1.3x
    the curve, size 1 at 0.9x) is read without them, the plain size's folded into the level, and
    written without them; fails if the stored shape came back (it priced 16 rows' one more node
    each at 1.65x a plain step, where the measured curve says 1.36x)."""
    monkeypatch.setenv("RACER_RS_CACHE", str(tmp_path))
    monkeypatch.setattr(batch_sizing, "_batch_costs", {})
    learned = _steep(per_node=0.1)
    learned.shape = {0: 0.9, 1: 1.3}
    learned.level = 1.1
    tree_size.write_json(batch_sizing._path("key", 4), {"cost": learned.state(), "batch_size": 4})
    loaded = batch_sizing._load("key", 4, 16)
    assert loaded is not None and loaded.shape == {}
    assert loaded.level == pytest.approx(1.1 * 0.9)
    sizes = np.asarray([1, 2, 4])
    np.testing.assert_allclose(loaded.step_seconds(sizes, 128), 0.99 * _steep(per_node=0.1).step_seconds(sizes, 128))
    stored = batch_sizing._without_shapes(learned.state())
    assert stored["shape"] == {} and stored["level"] == pytest.approx(0.99)


def test_batch_costs_are_measured_per_batch_size_and_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("RACER_RS_CACHE", str(tmp_path))
    monkeypatch.setattr(tree_size, "_costs", {})
    monkeypatch.setattr(batch_sizing, "_batch_costs", {})
    measured: list[int] = []
    real = batch_sizing.measure_batch_cost_model
    monkeypatch.setattr(
        batch_sizing,
        "measure_batch_cost_model",
        lambda model, batch, size: measured.append(batch) or real(model, batch, size, rounds=1),
    )
    single = tree_size.measure_cost_model
    monkeypatch.setattr(tree_size, "measure_cost_model", lambda model, size: single(model, size, rounds=1))
    monkeypatch.setattr(batch_sizing, "_token_shares", {})
    shares: list[int] = []
    share = batch_sizing.measure_token_share
    monkeypatch.setattr(
        batch_sizing,
        "measure_token_share",
        lambda model, batch, contexts: shares.append(batch) or share(model, batch, contexts, rounds=1),
    )
    model = _model("llama")
    costs = BatchCosts(model, max_capacity=4, batch=3)
    assert measured == [2, 4] and shares == [2, 4]
    middle_share = costs.token_share(3).at(4, 128)
    expected_share = (costs.token_share(2).at(4, 128) + costs.token_share(4).at(4, 128)) / 2
    np.testing.assert_allclose(middle_share, expected_share)
    assert middle_share[0] == 0 and np.all((middle_share >= 0) & (middle_share <= 1))
    assert costs.for_batch(1) is tree_size.cost_model(model, 4)  # batch size 1: today's curve
    middle = costs.for_batch(3)  # between the measured 2 and 4
    low, high = costs.for_batch(2), costs.for_batch(4)
    np.testing.assert_allclose(middle.curve_short, (low.curve_short + high.curve_short) / 2)
    assert np.all(np.diff(high.curve_long) >= 0) and middle.max_size == 4
    costs.save()
    names = sorted(p.name for p in (tmp_path / "tree_size" / "cost").glob("*.json"))
    assert [re.sub(r".*-(b\d+)\.json$", r"\1", name) for name in names if re.search(r"-b\d+\.json$", name)] == [
        "b2",
        "b3",
        "b4",
    ]
    monkeypatch.setattr(batch_sizing, "_batch_costs", {})  # a new process: read from disk
    monkeypatch.setattr(batch_sizing, "_token_shares", {})
    again = BatchCosts(model, max_capacity=4, batch=4)
    assert measured == [2, 4] and shares == [2, 4]
    assert again.for_batch(4).state() == high.state()
    assert again.token_share(4).state() == costs.token_share(4).state()
    stored = json.loads(next((tmp_path / "tree_size" / "cost").glob("*-b2.json")).read_text())
    assert stored["batch_size"] == 2 and "token_share" in stored
    between = json.loads(next((tmp_path / "tree_size" / "cost").glob("*-b3.json")).read_text())
    assert "token_share" not in between  # interpolated, not measured
    # A share stored before flat overheads were measured is measured again, not trusted.
    path = next((tmp_path / "tree_size" / "cost").glob("*-b2.json"))
    del stored["token_share"]["overheads"], stored["token_share"]["format"]
    path.write_text(json.dumps(stored))
    monkeypatch.setattr(batch_sizing, "_token_shares", {})
    BatchCosts(model, max_capacity=4, batch=2)
    assert shares == [2, 4, 2]


def test_a_flat_step_dearer_than_the_padded_one_is_measured_as_overhead(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure_token_share: the one-row flat step above the uniform padded one is the overhead
    (relative), and its share is then 0; below it, no overhead."""
    uniform = {1: 1.0, 2: 1.04, 4: 1.2, 8: 1.5, 16: 2.0}
    single = {1: 1.0, 2: 1.06, 4: 1.1, 8: 1.2, 16: 1.3}
    timed = {(n, False): [t, 9.0, t] for n, t in uniform.items()} | {(n, True): [t, 0.1, t] for n, t in single.items()}
    monkeypatch.setattr(batch_sizing, "time_layouts", lambda *args, **kwargs: timed)
    share = batch_sizing.measure_token_share(None, 8, (128, 1024))
    np.testing.assert_allclose(share.overhead_at(2, 128), [0.0, 1.06 / 1.04 - 1])
    assert share.at(2, 128)[1] == 0.0
    assert share.overhead_at(4, 1024)[3] == 0.0 and share.at(4, 1024)[3] > 0


def test_a_flat_overhead_makes_the_padded_step_win():
    """Two rows likely, two hardly (share 0.5): without an overhead the flat step verifies the
    likely rows' nodes alone; a flat layout 5% dearer than the padded step hands it to the
    padded one, which every row fills."""
    probabilities = [np.asarray([0.7]), np.asarray([0.7]), np.asarray([0.01]), np.asarray([0.01])]
    seconds = np.asarray([1.0, 1.1])
    sizes, flat = best_layout_sizes(probabilities, seconds, np.full(2, 0.5))
    assert flat and sizes.tolist() == [2, 2, 1, 1]
    sizes, flat = best_layout_sizes(probabilities, seconds, np.full(2, 0.5), np.asarray([0.0, 0.05]))
    assert not flat and sizes.tolist() == [2, 2, 2, 2]


def test_a_batch_size_met_first_is_predicted_at_the_load_the_others_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("RACER_RS_CACHE", str(tmp_path))
    monkeypatch.setattr(tree_size, "_costs", {})
    monkeypatch.setattr(batch_sizing, "_batch_costs", {})
    monkeypatch.setattr(batch_sizing, "_machine_loads", {})
    curves = {2: _steep(per_node=0.1), 4: _steep(per_node=0.2)}
    monkeypatch.setattr(batch_sizing, "measure_batch_cost_model", lambda model, batch, size: curves[batch])
    monkeypatch.setattr(tree_size, "measure_cost_model", lambda model, size: _steep(per_node=0.05))
    costs = BatchCosts(_model("llama"), max_capacity=4, batch=4)
    four = costs.for_batch(4)
    measured_four = float(four.measured_seconds(np.array([2]), 128)[0])
    for _ in range(30):  # the machine got three times slower: every 4-row step shows it
        four.observe(2, 128, forward=3 * measured_four, overhead=0.0)
    for batch in (1, 2, 3):  # never observed: predicted at the machine's load, not at load 1
        model = costs.for_batch(batch)
        predicted = float(model.forward_seconds(np.array([2]), 128)[0])
        assert predicted == pytest.approx(3 * float(model.measured_seconds(np.array([2]), 128)[0]), rel=0.1)


def test_the_level_learns_a_curve_timed_under_load_and_the_shared_load_moves_both() -> None:
    machine = MachineLoad()
    quiet, loaded = _steep(per_node=0.1), _steep(per_node=0.1)
    quiet.machine = loaded.machine = machine
    seconds = {n: float(quiet.measured_seconds(np.array([n]), 128)[0]) for n in (1, 4)}

    def predicted(cost: CostModel, n: int) -> float:
        return float(cost.forward_seconds(np.array([n]), 128)[0])

    for _ in range(300):  # `loaded` was timed under 2x load: its batch size runs at half its curve
        quiet.observe(1, 128, forward=1.5 * seconds[1], overhead=0.0)  # the machine now: 1.5x
        loaded.observe(4, 128, forward=0.75 * seconds[4], overhead=0.0)
    assert predicted(quiet, 1) == pytest.approx(1.5 * seconds[1], rel=0.15)
    assert predicted(loaded, 4) == pytest.approx(0.75 * seconds[4], rel=0.15)
    for _ in range(20):  # the machine quiets down; only the quiet curve's batch size runs
        quiet.observe(1, 128, forward=seconds[1], overhead=0.0)
    # The other batch size follows the machine through the shared load, its level kept.
    assert predicted(loaded, 4) == pytest.approx(0.5 * seconds[4], rel=0.2)
    restored = [CostModel.from_state(json.loads(json.dumps(c.state()))) for c in (quiet, loaded)]
    assert all(c.load == 1.0 for c in restored)  # the load is this moment's, never stored
    ratio = predicted(restored[1], 4) / predicted(restored[0], 4)
    assert ratio == pytest.approx(0.5, rel=0.2)  # the levels are the curves' own: stored


def test_interpolated_costs_handle_curves_of_other_sizes() -> None:
    small = _steep(per_node=0.1)
    big = CostModel([1, 2, 4, 8], {128: [2.0, 2.0, 3.0, 4.0], 1024: [3.0, 3.0, 4.0, 5.0]})
    mixed = interpolated(small, big, 0.5)
    assert mixed.max_size == 8
    np.testing.assert_allclose(mixed.curve_short, (small.curve_short[:4] + big.curve_short) / 2)


def test_auto_reports_every_row_s_choices(forced_cost: Any) -> None:
    forced_cost(COSTS["mild"])
    model = _model("llama")
    results = racer_rs.generate_batch(
        model, PROMPTS, method="racer", max_new_tokens=BUDGETS, capacity="auto", max_capacity=16
    )
    for result in results:
        report = result.extras["auto_capacity"]
        assert report["max_capacity"] == 16 and max(report["chosen_sizes"]) <= 16
        assert report["observed_tokens_per_step"] == pytest.approx(np.mean(result.accepted_lengths[: report["steps"]]))
        assert set(report["batch_sizes"]) <= {1, 2, 3} and 3 in report["batch_sizes"]
        assert set(report["cost_curve_ms"]) == {1, 2, 4, 8, 16, 32, 64}
        assert 0.0 <= report["setup_s"] <= result.timings["total"]


# --- grouped-query attention without repeat_kv ---------------------------------------------------


def test_packed_gqa_attention_equals_transformers_sdpa() -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from racer_rs.target.attention import packed_gqa_attention

    class Module(torch.nn.Module):
        num_key_value_groups = 3

    generator = torch.Generator().manual_seed(0)
    batch, kv_heads, n, length, dim = 2, 2, 5, 11, 8
    query = torch.randn(batch, 3 * kv_heads, n, dim, generator=generator)
    key = torch.randn(batch, kv_heads, length, dim, generator=generator)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator)
    mask = torch.where(torch.rand(batch, 1, n, length, generator=generator) < 0.3, -1e30, 0.0)
    mask[..., 0] = 0.0  # every query attends to something
    expected, _ = sdpa_attention_forward(Module(), query, key, value, mask, scaling=0.35)
    actual, _ = packed_gqa_attention(Module(), query, key, value, mask, scaling=0.35)
    assert actual.shape == expected.shape == (batch, n, 3 * kv_heads, dim)
    torch.testing.assert_close(actual, expected)


def test_gqa_attention_switches_the_model_only_inside_the_block() -> None:
    from racer_rs.target.attention import NAME, gqa_attention

    model = _model("qwen2")
    assert model.config._attn_implementation == "sdpa"
    with gqa_attention(model):
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError), gqa_attention(model):
        raise RuntimeError
    assert model.config._attn_implementation == "sdpa"


def test_a_forward_repeats_its_mask_once_and_the_next_forward_sees_its_own_mask() -> None:
    from racer_rs.target import attention
    from racer_rs.target.attention import gqa_attention, packed_gqa_attention

    class Module(torch.nn.Module):
        num_key_value_groups = 3

    generator = torch.Generator().manual_seed(1)
    query = torch.randn(1, 6, 4, 8, generator=generator)
    key, value = torch.randn(2, 1, 2, 9, 8, generator=generator)
    mask = torch.zeros(1, 1, 4, 9)
    model = _model("qwen2")
    with gqa_attention(model):
        first, _ = packed_gqa_attention(Module(), query, key, value, mask)
        again, _ = packed_gqa_attention(Module(), query, key, value, mask)  # the next layer
        assert len(attention._REPEATED) == 1 and torch.equal(first, again)
    assert attention._REPEATED == []
    mask[..., 1:] = -1e30  # the verifier's next forward: the same tensor, written in place
    with gqa_attention(model):
        masked, _ = packed_gqa_attention(Module(), query, key, value, mask)
    expected = value.repeat_interleave(3, dim=1)[:, :, :1].expand(1, 6, 4, 8).transpose(1, 2)
    torch.testing.assert_close(masked, expected)  # only position 0 is visible now
