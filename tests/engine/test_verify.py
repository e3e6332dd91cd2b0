"""Tree verification: mask and positions against brute force, KV compaction, chunked prefill."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402

from racer_rs import DraftTree  # noqa: E402
from racer_rs.drafters import make_drafter  # noqa: E402
from racer_rs.engine.decode_engine import Request  # noqa: E402
from racer_rs.target.batch_verifier import BatchVerifier  # noqa: E402
from racer_rs.target.sampling import SamplingConfig  # noqa: E402
from racer_rs.target.verifier import TreeVerifier  # noqa: E402
from tests.helpers import FAMILIES, REPEATING_PROMPT, one_row_engine, random_prompt, tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

# A branchy tree: root 0; children 1, 2, 3; 1 -> 4, 5; 2 -> 6; 4 -> 7; 6 -> 8; 7 -> 9.
TREE_TOKENS = [11, 20, 21, 22, 30, 31, 32, 40, 41, 50]
TREE_PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4, 6, 7]


def _root_path(tree: DraftTree, node: int) -> list[int]:
    parents = tree.parents
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


@torch.inference_mode()
def _fresh_forward(model: torch.nn.Module, tokens: list[int]) -> tuple[torch.Tensor, DynamicCache]:
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([tokens]), cache=cache, use_cache=True).logits[0]
    return logits, cache


def _assert_cache_equal(actual: DynamicCache, expected: DynamicCache) -> None:
    assert actual.get_seq_length() == expected.get_seq_length()
    for got, want in zip(actual.layers, expected.layers, strict=True):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tree_logits_equal_brute_force_per_path_forward(family: str) -> None:
    model = tiny_model(family, seed=3)
    prompt = random_prompt(3, length=12)
    tree = DraftTree(TREE_TOKENS, TREE_PARENTS)
    verifier = TreeVerifier(model)
    verifier.prefill(np.asarray(prompt, dtype=np.int32))
    logits = verifier.forward_tree(tree.tokens, tree.depths, tree.attention_mask())
    for node in range(len(tree)):
        path_tokens = [TREE_TOKENS[i] for i in _root_path(tree, node)]
        expected, _ = _fresh_forward(model, prompt + path_tokens)
        torch.testing.assert_close(logits[node], expected[-1], atol=1e-4, rtol=1e-4)


def test_brute_force_check_can_fail_without_the_tree_mask() -> None:
    """With a plain causal mask, nodes see their siblings and the logits differ."""
    model = tiny_model("llama", seed=3)
    prompt = random_prompt(3, length=12)
    tree = DraftTree(TREE_TOKENS, TREE_PARENTS)
    verifier = TreeVerifier(model)
    verifier.prefill(np.asarray(prompt, dtype=np.int32))
    causal = np.tril(np.ones((len(tree), len(tree)), dtype=bool))
    logits = verifier.forward_tree(tree.tokens, tree.depths, causal)
    node = 5  # its causal prefix includes the unrelated nodes 2, 3 and 4
    expected, _ = _fresh_forward(model, prompt + [TREE_TOKENS[i] for i in _root_path(tree, node)])
    assert not torch.allclose(logits[node], expected[-1], atol=1e-4)


def test_tree_mask_is_additive_with_full_prefix() -> None:
    verifier = TreeVerifier(tiny_model("llama"))
    verifier.prefill(np.arange(7, dtype=np.int32))
    tree = DraftTree(TREE_TOKENS, TREE_PARENTS)
    mask = verifier.tree_mask(tree.attention_mask())
    assert mask.shape == (1, 1, len(tree), 7 + len(tree))
    assert torch.all(mask[..., :7] == 0)
    allowed = mask[0, 0, :, 7:] == 0
    assert torch.equal(allowed, torch.from_numpy(tree.attention_mask()))
    assert torch.all(mask[0, 0, :, 7:][~allowed] == torch.finfo(mask.dtype).min)


@pytest.mark.parametrize("path", [[0, 1, 4, 7, 9], [0, 2, 6], [0, 3], [0]])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_kv_compaction_equals_fresh_forward(family: str, path: list[int]) -> None:
    model = tiny_model(family, seed=5)
    prompt = random_prompt(5, length=10)
    verifier = TreeVerifier(model)
    verifier.prefill(np.asarray(prompt, dtype=np.int32))
    tree = DraftTree(TREE_TOKENS, TREE_PARENTS)
    verifier.forward_tree(tree.tokens, tree.depths, tree.attention_mask())
    verifier.commit(np.asarray(path))
    _, expected = _fresh_forward(model, prompt + [TREE_TOKENS[i] for i in path])
    assert verifier.length == len(prompt) + len(path)
    _assert_cache_equal(verifier.cache, expected)


def test_kv_compaction_check_detects_a_wrong_gather() -> None:
    """Keeping the first rows instead of the accepted ones must not pass the comparison."""
    model = tiny_model("llama", seed=5)
    prompt = random_prompt(5, length=10)
    verifier = TreeVerifier(model)
    verifier.prefill(np.asarray(prompt, dtype=np.int32))
    tree = DraftTree(TREE_TOKENS, TREE_PARENTS)
    verifier.forward_tree(tree.tokens, tree.depths, tree.attention_mask())
    verifier.commit(np.arange(3))  # rows of nodes 0, 1, 2 (not a root path)
    _, expected = _fresh_forward(model, prompt + [TREE_TOKENS[i] for i in (0, 2, 6)])
    with pytest.raises(AssertionError):
        _assert_cache_equal(verifier.cache, expected)


class SwappingVerifier(BatchVerifier):
    """A deliberately wrong compaction: from its ``fail_at``-th commit of three or more rows on,
    the last two accepted rows are gathered in swapped order."""

    def __init__(self, model: torch.nn.Module, fail_at: int) -> None:
        super().__init__(model)
        self.fail_at = fail_at
        self.long_commits = 0

    def commit(self, paths: list[np.ndarray | None]) -> None:  # type: ignore[override]
        path = paths[0]
        if path is not None and len(path) >= 3:
            self.long_commits += 1
            if self.long_commits >= self.fail_at:
                paths = [np.concatenate([path[:-2], path[-1:], path[-2:-1]])]
        super().commit(paths)


def decode_checking_the_cache(
    model: torch.nn.Module, verifier: BatchVerifier, temperature: float, new_tokens: int = 80
) -> int:
    """Decode with RACER through the engine, comparing the KV cache with a fresh forward of the
    committed context after every step; returns the number of steps that gathered drafted rows."""
    drafter = make_drafter("racer", model)
    engine, _ = one_row_engine(model, drafter, SamplingConfig(temperature=temperature), verifier=verifier)
    engine.admit([Request(0, np.asarray(REPEATING_PROMPT, dtype=np.int32), new_tokens, seed=0)])
    state = engine.live[0]
    while engine.live:
        engine.step()
        if not state.finished:  # the finishing step commits nothing to the cache
            _, expected = _fresh_forward(model, state.context[: state.length].tolist())
            _assert_cache_equal(verifier.cache, expected)
    return sum(length > 1 for length in state.accepted_lengths)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_cache_after_every_decode_step_equals_fresh_forward(family: str, temperature: float) -> None:
    model = tiny_model(family, seed=2, sharpen=4.0)
    multi_token_steps = decode_checking_the_cache(model, BatchVerifier(model), temperature)
    assert multi_token_steps >= 8  # many steps really gathered drafted rows


def test_a_compaction_going_wrong_after_many_steps_fails_the_same_check() -> None:
    model = tiny_model("qwen2", seed=2, sharpen=4.0)
    verifier = SwappingVerifier(model, fail_at=5)
    with pytest.raises(AssertionError):
        decode_checking_the_cache(model, verifier, temperature=0.0)
    assert verifier.long_commits == 5  # the check caught it at the first wrong step, not before


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi"])
def test_chunked_prefill_topk_matches_full_logits(family: str) -> None:
    model = tiny_model(family, seed=4)
    prompt = random_prompt(4, length=23)
    verifier = TreeVerifier(model)
    output = verifier.prefill(np.asarray(prompt, dtype=np.int32), topk=5, chunk=4)
    logits, cache = _fresh_forward(model, prompt)
    positions = output.prompt_topk_positions
    assert positions is not None and positions[-1] == 22
    # Exactly the last occurrence of every distinct token.
    assert positions.tolist() == sorted({token: i for i, token in enumerate(prompt)}.values())
    assert output.prompt_topk is not None and output.prompt_topk.shape == (len(positions), 5)
    assert output.prompt_topk.dtype == np.int32
    expected = torch.topk(logits, 5, dim=-1).indices.numpy()[positions]
    assert [set(row) for row in output.prompt_topk] == [set(row) for row in expected]
    torch.testing.assert_close(output.last_logits, logits[-1], atol=1e-5, rtol=1e-4)
    _assert_cache_equal(verifier.cache, cache)
