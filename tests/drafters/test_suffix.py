"""SuffixDecoding (``suffix``, ``suffix_chain``) on ArcticInference's suffix trees.

* exactness: greedy output equals plain greedy decoding on every tiny model family, at
  capacities 1, 2 and 16 too, and seeded sampling equals plain sampling;
* the draft mapping: ArcticInference's ``parents`` (``-1`` = the matched context's end) become
  a breadth-first :class:`DraftTree` rooted at ``next_token``, cut at the capacity;
* the cache is driven as vLLM's suffix proposer drives it: ``start_request`` with the prompt,
  the sampled tokens appended before each ``speculate`` whose pattern is the last
  ``max_tree_depth`` tokens (the newest included), ``stop_request`` at the end, also of a
  failing request; the global tree carries what one request learned to the next;
* without the package the method fails up front with one line naming the extra and the
  install commands.

The package is optional: these tests skip without it, except under ``RACER_REQUIRE_SUFFIX=1``
(CI), where a missing package fails them.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs import optional_deps  # noqa: E402
from racer_rs.drafters import METHOD_EXTRAS, make_drafter  # noqa: E402
from racer_rs.drafters.base import RequestStart  # noqa: E402
from racer_rs.errors import InvalidArgumentError, InvalidTypeError, MissingDependencyError  # noqa: E402
from racer_rs.target.sampling import SamplingConfig  # noqa: E402
from tests.helpers import FAMILIES, REPEATING_PROMPT, plain_greedy, plain_sampling, random_prompt, tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

METHODS = ["suffix", "suffix_chain"]
NEW_TOKENS = 40
INSTALL = optional_deps.INSTALL_COMMANDS["suffix"]
# The ``arctic`` fixture (tests/conftest.py) skips without arctic-inference, or fails under
# RACER_REQUIRE_SUFFIX=1.


_models: dict[tuple[str, int], torch.nn.Module] = {}
_expected: dict[tuple[str, int, str], list[int]] = {}


def _model(family: str, seed: int = 0) -> torch.nn.Module:
    if (family, seed) not in _models:
        _models[(family, seed)] = tiny_model(family, seed=seed, sharpen=4.0)
    return _models[(family, seed)]


def _prompt(kind: str, seed: int = 0) -> list[int]:
    return REPEATING_PROMPT if kind == "repeating" else random_prompt(seed)


def _greedy(family: str, kind: str, seed: int = 0) -> list[int]:
    key = (family, seed, kind)
    if key not in _expected:
        _expected[key] = plain_greedy(_model(family, seed), _prompt(kind, seed), NEW_TOKENS)
    return _expected[key]


def _request(prompt: list[int]) -> RequestStart:
    return RequestStart(
        prompt_ids=np.asarray(prompt, dtype=np.int32),
        prompt_topk=None,
        prompt_logits_last=torch.zeros(8),
        vocab_size=8,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )


def _paths(tokens: list[int], parents: list[int]) -> set[tuple[int, ...]]:
    """Every root-to-node token path of a parent-array tree (``-1``: child of the root)."""
    paths: set[tuple[int, ...]] = set()
    for node in range(len(tokens)):
        path, at = [], node
        while at != -1:
            path.append(tokens[at])
            at = parents[at]
        paths.add(tuple(reversed(path)))
    return paths


def _tree_paths(tree: Any) -> set[tuple[int, ...]]:
    """Root-to-node token paths of a DraftTree, the root left out."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    children = [p - 1 if p > 0 else -1 for p in parents[1:]]
    return _paths(tokens[1:], children)


# --- exactness ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["repeating", "random"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_equals_plain_greedy(arctic: None, family: str, method: str, kind: str) -> None:
    result = racer_rs.generate(_model(family), _prompt(kind), method=method, max_new_tokens=NEW_TOKENS)
    assert result.tokens == _greedy(family, kind)
    assert result.method == method


@pytest.mark.parametrize("capacity", [1, 2, 16])
@pytest.mark.parametrize("method", METHODS)
def test_greedy_equivalence_at_small_capacities(arctic: None, method: str, capacity: int) -> None:
    result = racer_rs.generate(
        _model("qwen3"), REPEATING_PROMPT, method=method, capacity=capacity, max_new_tokens=NEW_TOKENS
    )
    assert result.tokens == _greedy("qwen3", "repeating")
    assert result.extras["mean_tree_size"] <= capacity
    if capacity == 1:
        assert result.mat == 1.0


@pytest.mark.parametrize("method", METHODS)
def test_drafts_are_accepted_on_repeating_output(arctic: None, method: str) -> None:
    """The equivalence tests would pass trivially if nothing were ever accepted."""
    # A fixed capacity: at "auto" how much is verified follows this machine's measured cost curve.
    result = racer_rs.generate(_model("llama"), REPEATING_PROMPT, method=method, max_new_tokens=NEW_TOKENS, capacity=16)
    assert result.tokens == _greedy("llama", "repeating")
    # The output repeats only from token 18 on, and a draft is at most as long as its match.
    assert result.mat > 1.25
    assert max(result.accepted_lengths) > 3


@pytest.mark.parametrize("method", METHODS)
def test_seeded_sampling_equals_plain_sampling(arctic: None, method: str) -> None:
    """Samples are keyed by position: a deterministic drafter samples plain sampling's text."""
    model = tiny_model("llama", seed=1, sharpen=15.0)
    config = SamplingConfig(temperature=1.0, top_p=0.9)
    drafter = make_drafter(method, model)
    mats = []
    for seed in range(3):
        expected = plain_sampling(model, REPEATING_PROMPT, NEW_TOKENS, config, seed)
        # The second run of a seed drafts from the first's answer in the global tree.
        for _ in range(2):
            result = racer_rs.generate(
                model,
                REPEATING_PROMPT,
                drafter=drafter,
                max_new_tokens=NEW_TOKENS,
                temperature=1.0,
                top_p=0.9,
                seed=seed,
                capacity=16,  # trees are verified whatever auto would choose for this tiny model
            )
            assert result.tokens == expected, seed
        mats.append(result.mat)
    assert min(mats) > 2.0  # drafts were accepted, so trees were really verified


# --- the draft's mapping ------------------------------------------------------------------------

# A real tree draft of SuffixDecodingCache.speculate (best first, not breadth first):
# 42 -> 8 -> {3 -> 17 -> 42 -> 8, 1} and 5, all under the matched context's end (-1).
HAND_TOKENS = [42, 8, 3, 17, 42, 8, 5, 1]
HAND_PARENTS = [-1, 0, 1, 2, 3, 4, -1, 1]


def test_draft_maps_to_a_bfs_tree_rooted_at_next_token(arctic: None) -> None:
    from arctic_inference.suffix_decoding import SuffixDecodingDraft

    from racer_rs.drafters.suffix import draft_to_tree

    draft = SuffixDecodingDraft(token_ids=HAND_TOKENS, parents=HAND_PARENTS, probs=[1.0] * 8, score=8.0, match_len=8)
    tree = draft_to_tree(99, draft.token_ids, draft.parents, capacity=64)
    assert tree.tokens.tolist() == [99, 42, 5, 8, 3, 1, 17, 42, 8]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 3, 3, 4, 6, 7]
    assert tree.depths.tolist() == [0, 1, 1, 2, 3, 3, 4, 5, 6]
    assert _tree_paths(tree) == _paths(HAND_TOKENS, HAND_PARENTS)


@pytest.mark.parametrize(
    ("capacity", "tokens", "parents"),
    [
        (1, [99], [-1]),
        (2, [99, 42], [-1, 0]),
        (4, [99, 42, 8, 3], [-1, 0, 1, 2]),  # the draft's first 3 tokens: a chain
        (8, [99, 42, 5, 8, 3, 17, 42, 8], [-1, 0, 0, 1, 3, 4, 5, 6]),  # 1 is cut, 5 kept
        (9, [99, 42, 5, 8, 3, 1, 17, 42, 8], [-1, 0, 0, 1, 3, 3, 4, 6, 7]),
    ],
)
def test_draft_is_cut_to_its_best_first_prefix_at_the_capacity(
    capacity: int, tokens: list[int], parents: list[int]
) -> None:
    from racer_rs.drafters.suffix import draft_to_tree

    tree = draft_to_tree(99, HAND_TOKENS, HAND_PARENTS, capacity)
    assert len(tree) == min(capacity, 9)
    assert (tree.tokens.tolist(), tree.parents.tolist()) == (tokens, parents)


def test_equal_siblings_are_merged_and_bad_parents_rejected() -> None:
    from racer_rs.drafters.suffix import draft_to_tree

    tree = draft_to_tree(7, [4, 4, 5, 6, 5], [-1, -1, 0, 1, 1], capacity=16)
    assert tree.tokens.tolist() == [7, 4, 5, 6]
    assert tree.parents.tolist() == [-1, 0, 1, 1]
    with pytest.raises(InvalidArgumentError, match="parents must precede children"):
        draft_to_tree(7, [4, 5], [-1, 1], capacity=16)
    with pytest.raises(InvalidArgumentError, match="2 tokens but 1 parents"):
        draft_to_tree(7, [4, 5], [-1], capacity=16)
    assert draft_to_tree(7, [], [], capacity=16).tokens.tolist() == [7]


def test_library_tree_drafts_keep_their_paths(arctic: None) -> None:
    """Against the library itself: every path of a real tree draft is a path of our tree."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    from racer_rs.drafters.suffix import draft_to_tree

    generator = np.random.default_rng(0)
    # A recurring phrase followed by varied tails: matches inside it branch at its end.
    phrase = generator.integers(0, 50, 12, dtype=np.int32)
    stream = np.concatenate([np.concatenate([phrase, generator.integers(50, 56, 4, dtype=np.int32)]) for _ in range(8)])
    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10)
    cache.start_request("r", stream)
    branched = 0
    for end in range(30, len(stream)):
        pattern = np.ascontiguousarray(stream[max(0, end - 24) : end])
        draft = cache.speculate("r", pattern, 15, 4.0, 0.0, 0.02, True)
        tree = draft_to_tree(int(pattern[-1]), draft.token_ids, draft.parents, capacity=16)
        assert tree.tokens[0] == pattern[-1]
        assert _tree_paths(tree) == _paths(draft.token_ids, draft.parents)
        branched += tree.max_depth < len(tree) - 1
    cache.stop_request("r")
    assert branched  # some drafts were real trees, not chains


def test_first_level_predicts_the_token_after_next_token(arctic: None) -> None:
    """next_token is part of the matched pattern: the first drafted level continues AFTER it."""
    drafter = make_drafter("suffix_chain", None)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    drafter.begin(_request(prompt))
    try:
        tree = drafter.propose(np.asarray(prompt, dtype=np.int32), 3, capacity=8).tree
    finally:
        drafter.end()
    # With 3 appended the sequence ends ...1, 2, 3: what followed 1, 2, 3 before is 4, 5, 1, ...
    assert tree.tokens.tolist()[:4] == [3, 4, 5, 1]
    assert len(tree) == 8


# --- the cache's lifecycle (as vLLM drives it) --------------------------------------------------


class RecordingCache:
    """Forwards to the real SuffixDecodingCache and records every call."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.calls: list[tuple[Any, ...]] = []

    def start_request(self, req_id: Any, prompt: np.ndarray) -> None:
        self.calls.append(("start", req_id, np.asarray(prompt).tolist()))
        self.cache.start_request(req_id, prompt)

    def add_active_response(self, req_id: Any, tokens: np.ndarray) -> None:
        assert isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 and tokens.flags["C_CONTIGUOUS"]
        self.calls.append(("add", req_id, tokens.tolist()))
        self.cache.add_active_response(req_id, tokens)

    def speculate(self, req_id: Any, pattern: np.ndarray, **options: Any) -> Any:
        assert isinstance(pattern, np.ndarray) and pattern.dtype == np.int32 and pattern.flags["C_CONTIGUOUS"]
        self.calls.append(("speculate", req_id, pattern.tolist(), options))
        return self.cache.speculate(req_id, pattern, **options)

    def stop_request(self, req_id: Any) -> None:
        self.calls.append(("stop", req_id))
        self.cache.stop_request(req_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)


def _recording(method: str, **options: Any) -> tuple[Any, RecordingCache]:
    drafter = make_drafter(method, None, **options)
    drafter.cache = RecordingCache(drafter.cache)
    return drafter, drafter.cache


@pytest.mark.parametrize("method", METHODS)
def test_cache_is_driven_like_vllms_suffix_proposer(arctic: None, method: str) -> None:
    drafter, recorder = _recording(method)
    prompt = random_prompt(3, length=30) + REPEATING_PROMPT
    result = racer_rs.generate(_model("llama"), prompt, drafter=drafter, max_new_tokens=NEW_TOKENS, capacity=12)
    calls = recorder.calls
    assert calls[0] == ("start", 0, prompt)
    assert calls[-1] == ("stop", 0)
    assert {call[1] for call in calls} == {0}
    response: list[int] = []
    speculated = 0
    for call in calls[1:-1]:
        if call[0] == "add":
            response += call[2]
            continue
        assert call[0] == "speculate"
        speculated += 1
        # vLLM: the sampled tokens (the newest = our next_token) are appended first, then the
        # pattern is the last max_tree_depth tokens of prompt + response.
        assert call[2] == (prompt + response)[-24:]
        assert call[3]["max_spec_factor"] == 1.0 and call[3]["min_token_prob"] == 0.1
        assert call[3]["max_spec_offset"] == 0.0
        assert call[3]["use_tree_spec"] is (method == "suffix")
        assert 1 <= call[3]["max_spec_tokens"] <= 11
    # A step with one token of budget left commits its root without drafting (nor observing).
    root_only = result.positions[-1] == NEW_TOKENS - 1
    assert speculated == result.steps - root_only
    assert response == result.tokens[: NEW_TOKENS - root_only]
    assert result.tokens == plain_greedy(_model("llama"), prompt, NEW_TOKENS)
    assert drafter.stats()["cached_requests"] == 1
    assert not drafter.cache.active_requests


def test_a_failing_request_still_stops(arctic: None) -> None:
    drafter, recorder = _recording("suffix")

    class Failing:
        def __init__(self) -> None:
            self.calls = 0

        def put(self, tokens: list[int], drafted: list[bool]) -> None:
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("client went away")

        def end(self) -> None:
            pass

    with pytest.raises(RuntimeError, match="client went away"):
        racer_rs.generate(
            _model("llama"), REPEATING_PROMPT, drafter=drafter, max_new_tokens=NEW_TOKENS, streamer=Failing()
        )
    assert recorder.calls[-1] == ("stop", 0)
    assert not drafter.cache.active_requests
    # The drafter serves the next request normally (a fresh id).
    result = racer_rs.generate(_model("llama"), REPEATING_PROMPT, drafter=drafter, max_new_tokens=NEW_TOKENS)
    assert result.tokens == _greedy("llama", "repeating")
    assert recorder.calls[-1] == ("stop", 1)


@pytest.mark.parametrize("method", METHODS)
def test_the_global_tree_carries_one_requests_answer_to_the_next(arctic: None, method: str) -> None:
    """Two sequential requests on one drafter: the second drafts from the first's response;
    with global_tree=False it drafts exactly as the first did."""
    model, prompt = _model("qwen2", 1), random_prompt(5)
    expected = plain_greedy(model, prompt, NEW_TOKENS)
    runs = {}
    for global_tree in (True, False):
        drafter = make_drafter(method, model, global_tree=global_tree)
        first = racer_rs.generate(model, prompt, drafter=drafter, max_new_tokens=NEW_TOKENS)
        second = racer_rs.generate(model, prompt, drafter=drafter, max_new_tokens=NEW_TOKENS)
        assert first.tokens == second.tokens == expected
        assert second.extras["global_tree"] is global_tree
        assert second.extras["learns_across_requests"] is global_tree
        assert second.extras["mode"] == ("tree" if method == "suffix" else "chain")
        runs[global_tree] = (first, second, drafter)
    first, second, drafter = runs[True]
    assert second.extras["cached_requests"] == 2
    assert second.mat > first.mat + 0.5
    assert second.extras["mean_tree_size"] > first.extras["mean_tree_size"]
    local_first, local_second, _ = runs[False]
    assert local_second.extras["cached_requests"] == 0
    assert local_second.accepted_lengths == local_first.accepted_lengths
    assert local_second.mat < second.mat


def test_requests_of_two_threads_may_share_one_drafter(arctic: None) -> None:
    """Like vLLM's batch, one cache holds several active requests: each thread has its own."""
    import threading

    drafter = make_drafter("suffix", None)
    prompts = [REPEATING_PROMPT, random_prompt(2)]
    expected = [_greedy("llama", "repeating"), plain_greedy(_model("llama"), prompts[1], NEW_TOKENS)]
    models = [tiny_model("llama", seed=0, sharpen=4.0) for _ in prompts]
    outputs: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            for _ in range(2):
                result = racer_rs.generate(models[index], prompts[index], drafter=drafter, max_new_tokens=NEW_TOKENS)
                assert result.tokens == expected[index]
            outputs[index] = result.tokens
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(outputs) == 2
    assert not drafter.cache.active_requests
    assert len(drafter.cache.cached_requests) == 4


# --- options and the missing extra --------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"max_tree_depth": 0}, InvalidArgumentError, "max_tree_depth must be >= 1"),
        ({"max_cached_requests": -1}, InvalidArgumentError, "max_cached_requests must be >= 0"),
        ({"max_cached_requests": 0}, InvalidArgumentError, "global_tree=False"),
        ({"max_spec_factor": -0.5}, InvalidArgumentError, "max_spec_factor must be >= 0, got -0.5"),
        ({"min_token_prob": 1.5}, InvalidArgumentError, "min_token_prob must be in [0, 1], got 1.5"),
        ({"max_spec_offset": float("nan")}, InvalidArgumentError, "max_spec_offset must be finite"),
        ({"global_tree": "yes"}, InvalidTypeError, "global_tree must be True or False"),
        ({"max_tree_depth": 2.5}, InvalidTypeError, "max_tree_depth must be an int"),
        ({"use_tree_spec": False}, InvalidArgumentError, "unknown option(s) use_tree_spec"),
    ],
)
def test_bad_options_are_clear_errors(arctic: None, options: dict, error: type, fragment: str) -> None:
    with pytest.raises(error) as info:
        make_drafter("suffix", None, **options)
    assert fragment in str(info.value)


def test_defaults_are_vllms(arctic: None) -> None:
    drafter = make_drafter("suffix", None)
    assert (drafter.max_tree_depth, drafter.max_cached_requests) == (24, 10_000)
    assert (drafter.max_spec_factor, drafter.max_spec_offset, drafter.min_token_prob) == (1.0, 0.0, 0.1)
    assert drafter.cache.max_tree_depth == 24 and drafter.cache.max_cached_requests == 10_000
    assert drafter.use_tree_spec and not make_drafter("suffix_chain", None).use_tree_spec
    local = make_drafter("suffix_chain", None, global_tree=False)
    assert local.cache.max_cached_requests == 0 and not local.learns_across_requests


def _without_arctic(monkeypatch: pytest.MonkeyPatch) -> None:
    real = optional_deps.installed
    monkeypatch.setattr(optional_deps, "installed", lambda module: module != "arctic_inference" and real(module))


@pytest.mark.parametrize("method", METHODS)
def test_missing_extra_is_one_line_naming_the_extra_and_the_commands(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    _without_arctic(monkeypatch)
    with pytest.raises(MissingDependencyError) as info:
        make_drafter(method, None)
    message = str(info.value)
    assert "\n" not in message
    assert (
        f"method {method!r}" in message and "'suffix' extra" in message and "arctic_inference not installed" in message
    )
    assert INSTALL in message
    assert "pip install --no-build-isolation --no-deps arctic-inference==" in INSTALL


def test_cli_checks_the_extra_before_loading_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from racer_rs.cli import common
    from racer_rs.cli.errors import CLIError

    assert METHOD_EXTRAS == {"suffix": "suffix", "suffix_chain": "suffix"}
    _without_arctic(monkeypatch)
    assert not common.method_importable("suffix")
    assert common.method_importable("racer")
    with pytest.raises(CLIError, match="'suffix' extra") as info:
        common.check_methods(["ar", "suffix_chain"])
    assert INSTALL in str(info.value)


def test_bench_defaults_include_suffix_only_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from racer_rs.cli import bench

    args = argparse.Namespace(methods=None, draft_model=None)
    with_it = bench._methods(args)
    assert ("suffix" in with_it) is optional_deps.installed("arctic_inference")
    _without_arctic(monkeypatch)
    without = bench._methods(args)
    assert "suffix" not in without
    assert without == [m for m in with_it if m != "suffix"]


def test_the_extra_is_declared_in_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from tests.conftest import REPO_ROOT

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("arctic-inference") for requirement in extras["suffix"])
    assert optional_deps.EXTRAS["suffix"] == ("arctic_inference",)


def test_the_installed_check_does_not_import_arctic_inference() -> None:
    code = (
        "import sys; from racer_rs.cli import common; common.method_importable('suffix'); "
        "import racer_rs.drafters.suffix; "
        "assert 'arctic_inference' not in sys.modules, 'imported'"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
