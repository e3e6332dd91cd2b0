"""Requests join and leave mid-flight: ``generate_batch(..., max_batch_size=C)`` keeps at most C
rows live, admits the next prompt as soon as a row finishes, fails a row alone, streams per row,
and holds nothing of a finished request."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.drafters.pld import PromptLookupDrafter  # noqa: E402
from racer_rs.engine import generation  # noqa: E402
from racer_rs.errors import InvalidArgumentError, InvalidTypeError  # noqa: E402
from racer_rs.target.sampling import SamplingConfig  # noqa: E402
from tests.helpers import (  # noqa: E402
    REPEATING_PROMPT,
    own_request_only,
    plain_greedy,
    plain_sampling,
    random_prompt,
    tiny_model,
)

# Rows are compared with their own generate(): the same drafts (tests/engine/conftest.py).
pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("same_drafts_as_generate")]


#: Ragged prompts (some repeat themselves, so retrieval drafts) and ragged budgets.
PROMPTS = [
    REPEATING_PROMPT,
    random_prompt(1, length=5),
    random_prompt(2, length=17) * 2,
    REPEATING_PROMPT[:9],
    random_prompt(4, length=30),
    random_prompt(5, length=3) * 4,
    random_prompt(6, length=11),
]
BUDGETS = [30, 7, 22, 1, 16, 25, 12]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_model("llama", seed=2, sharpen=4.0)


class EngineSpy:
    """Captures the engine of the next generate_batch call (its drafting and policy after the run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.engines: list[Any] = []
        real = generation.DecodeEngine
        spy = self

        class Spied(real):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                spy.engines.append(self)

        monkeypatch.setattr(generation, "DecodeEngine", Spied)


@pytest.mark.parametrize("method", ["racer", "racer_scored", "pld", "token_recycling", "ar"])
@pytest.mark.parametrize("max_batch_size", [1, 2, 3])
def test_more_prompts_than_rows_every_row_equals_plain_greedy_and_its_own_generate(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, method: str, max_batch_size: int
) -> None:
    spy = EngineSpy(monkeypatch)
    isolated = own_request_only(method)
    results = racer_rs.generate_batch(
        model, PROMPTS, method=method, max_new_tokens=BUDGETS, capacity=8, max_batch_size=max_batch_size, **isolated
    )
    [engine] = spy.engines
    assert engine.peak_rows == max_batch_size  # never more rows live than allowed, and that many used
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results, strict=True):
        assert result.error is None
        assert result.tokens == plain_greedy(model, prompt, budget)
        # A row admitted into a freed place drafts exactly what its request drafts alone: nothing
        # of the request that finished there reached it.
        alone = racer_rs.generate(model, prompt, method=method, max_new_tokens=budget, capacity=8, **isolated)
        assert result.accepted_lengths == alone.accepted_lengths
    admitted = [r.extras["admitted_s"] for r in results]
    assert admitted == sorted(admitted)  # prompts are admitted in order
    assert all(r.extras["first_token_s"] >= r.extras["admitted_s"] for r in results)
    assert all(r.timings["total"] >= r.extras["first_token_s"] for r in results)
    if method != "ar":
        assert max(r.mat for r in results) > 1.3  # trees were really verified


def test_an_eos_inside_an_accepted_path_ends_a_row_and_the_next_takes_its_place(model: torch.nn.Module) -> None:
    free = [plain_greedy(model, p, 30) for p in PROMPTS]
    eos = free[0][12]  # a token row 0 produces mid-way (and maybe others)
    results = racer_rs.generate_batch(
        model, PROMPTS, method="racer", max_new_tokens=30, eos_token_id=eos, max_batch_size=2, capacity=8
    )
    for expected, result in zip(free, results, strict=True):
        assert result.tokens == (expected[: expected.index(eos) + 1] if eos in expected else expected)


def test_seeded_rows_sample_what_generate_samples_with_their_seeds(model: torch.nn.Module) -> None:
    config = SamplingConfig(temperature=1.0, top_p=0.9)
    results = racer_rs.generate_batch(
        model, PROMPTS, method="racer", max_new_tokens=BUDGETS, temperature=1.0, top_p=0.9, seed=40, max_batch_size=3
    )
    for row, (prompt, budget, result) in enumerate(zip(PROMPTS, BUDGETS, results, strict=True)):
        assert result.tokens == plain_sampling(model, prompt, budget, config, 40 + row)


def _failing_pld(monkeypatch: pytest.MonkeyPatch, marker: int, after: int) -> None:
    """PLD's drafter raises for the request whose prompt starts with ``marker``, once it has
    generated ``after`` tokens."""
    real = PromptLookupDrafter.propose

    def propose(self: PromptLookupDrafter, context: np.ndarray, next_token: int, capacity: int) -> Any:
        if context[0] == marker and len(context) >= self._prompt_length + after:
            raise RuntimeError("the drafter broke")
        return real(self, context, next_token, capacity)

    real_begin = PromptLookupDrafter.begin

    def begin(self: PromptLookupDrafter, request: Any) -> None:
        self._prompt_length = len(request.prompt_ids)
        real_begin(self, request)

    monkeypatch.setattr(PromptLookupDrafter, "propose", propose)
    monkeypatch.setattr(PromptLookupDrafter, "begin", begin)


def test_a_row_whose_drafter_fails_ends_alone_keeping_its_tokens(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = [[90, *random_prompt(9, length=10)], *PROMPTS[:4]]
    budgets = [30, *BUDGETS[:4]]
    _failing_pld(monkeypatch, marker=90, after=5)
    results = racer_rs.generate_batch(model, prompts, method="pld", max_new_tokens=budgets, max_batch_size=2)
    failed, *others = results
    assert isinstance(failed.error, RuntimeError) and "the drafter broke" in str(failed.error)
    expected = plain_greedy(model, prompts[0], 30)
    assert 5 <= len(failed.tokens) < 30 and failed.tokens == expected[: len(failed.tokens)]  # nothing lost
    for prompt, budget, result in zip(prompts[1:], budgets[1:], others, strict=True):
        assert result.error is None and result.tokens == plain_greedy(model, prompt, budget)


def test_generate_raises_what_its_drafter_raised(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_pld(monkeypatch, marker=90, after=2)
    with pytest.raises(RuntimeError, match="the drafter broke"):
        racer_rs.generate(model, [90, 1, 2, 3], method="pld", max_new_tokens=10)


class RecordingStreamer:
    def __init__(self, log: list[tuple[int, str, list[int]]], row: int, fail_at: int | None = None) -> None:
        self.log, self.row, self.fail_at, self.puts = log, row, fail_at, 0

    def put(self, tokens: list[int], drafted: list[bool]) -> None:
        self.puts += 1
        if self.puts == self.fail_at:
            raise OSError("the client went away")
        assert drafted[0] is False and all(drafted[1:])
        self.log.append((self.row, "put", tokens))

    def end(self) -> None:
        self.log.append((self.row, "end", []))


def test_per_row_streamers_see_their_own_tokens_in_order_and_end_once(model: torch.nn.Module) -> None:
    log: list[tuple[int, str, list[int]]] = []
    streamers = [RecordingStreamer(log, row) for row in range(len(PROMPTS))]
    streamers[3] = None  # type: ignore[call-overload]  # a row may stream nothing
    results = racer_rs.generate_batch(
        model, PROMPTS, method="racer", max_new_tokens=BUDGETS, streamer=streamers, max_batch_size=3, capacity=8
    )
    for row, result in enumerate(results):
        events = [(kind, tokens) for r, kind, tokens in log if r == row]
        if row == 3:
            assert events == []
            continue
        assert [kind for kind, _ in events] == ["put"] * (len(events) - 1) + ["end"]
        assert [t for _, tokens in events for t in tokens] == result.tokens
        assert [len(tokens) for kind, tokens in events if kind == "put"] == result.accepted_lengths


def test_a_failing_streamer_fails_its_row_alone(model: torch.nn.Module) -> None:
    log: list[tuple[int, str, list[int]]] = []
    streamers = [RecordingStreamer(log, row, fail_at=3 if row == 1 else None) for row in range(3)]
    prompts, budgets = PROMPTS[:3], [20, 20, 20]
    results = racer_rs.generate_batch(model, prompts, method="racer", max_new_tokens=budgets, streamer=streamers)
    assert isinstance(results[1].error, OSError)
    assert results[1].tokens == plain_greedy(model, prompts[1], 20)[: len(results[1].tokens)]
    for row in (0, 2):
        assert results[row].error is None and results[row].tokens == plain_greedy(model, prompts[row], 20)
    assert (1, "end", []) in log  # the failed row's streamer was still told the request is over


@pytest.mark.parametrize("method", ["racer", "pld"])
def test_a_long_job_holds_nothing_of_finished_requests(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """600 short requests through 4 rows: the drafting, the capacity policy and the KV cache hold
    only live rows' state (a long job's memory is bounded by its concurrency, not its length)."""
    spy = EngineSpy(monkeypatch)
    sizes: list[tuple[int, int, int]] = []
    real_step = generation.DecodeEngine.step

    def step(self: Any) -> None:
        real_step(self)
        drafting = self.drafting
        held = len(drafting.pool) if hasattr(drafting, "pool") else len(drafting.drafters)
        sizes.append((held, len(self.policy.sizers), self.verifier.batch))

    monkeypatch.setattr(generation.DecodeEngine, "step", step)
    prompts = [random_prompt(seed, length=4 + seed % 7) for seed in range(600)]
    results = racer_rs.generate_batch(
        model, prompts, method=method, max_new_tokens=3, capacity="auto", max_batch_size=4
    )
    assert all(r.error is None and len(r.tokens) == 3 for r in results)
    assert len(sizes) > 100 and max(max(s) for s in sizes) <= 4
    [engine] = spy.engines
    leftover = engine.drafting.pool if hasattr(engine.drafting, "pool") else engine.drafting.drafters
    assert len(leftover) == 0 and engine.policy.sizers == {} and engine.live == []


@pytest.mark.parametrize("method", ["racer", "suffix", "racer_tts"])
@pytest.mark.parametrize("batched", [True, False])
def test_a_finished_call_frees_its_engine_and_kv_cache_without_the_garbage_collector(
    model: torch.nn.Module, batched: bool, method: str
) -> None:
    """A call's engine, verifier and KV cache go when the call returns, by reference counting: a
    reference cycle would keep each call's cache (hundreds of MB for a real model) until Python's
    cyclic collector happens to run, and a serving run's memory grew by GBs that way."""
    import gc

    from racer_rs.engine.decode_engine import DecodeEngine
    from racer_rs.target.batch_verifier import BatchVerifier

    def alive() -> int:
        return sum(isinstance(o, (DecodeEngine, BatchVerifier)) for o in gc.get_objects())

    if method == "suffix":
        pytest.importorskip("arctic_inference", reason="suffix is ArcticInference's code")
    options: dict[str, Any] = {"method": method, "max_new_tokens": 5}
    if method == "racer_tts":  # a draft model, its canvas and its online updates
        options.update(draft_model=tiny_model("llama", seed=3), canvas=4, update_every=2, lr=1e-2)
    gc.collect()
    before = alive()
    gc.disable()
    try:
        if batched:
            racer_rs.generate_batch(model, PROMPTS[:3], max_batch_size=2, **options)
        else:
            racer_rs.generate(model, PROMPTS[0], **options)
        assert alive() == before
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"max_batch_size": 0}, InvalidArgumentError, r"max_batch_size must be >= 1"),
        ({"max_batch_size": 1.5}, InvalidTypeError, r"max_batch_size"),
        ({"streamer": [None]}, InvalidArgumentError, r"one streamer per prompt \(2\)"),
        ({"streamer": object()}, InvalidTypeError, r"streamer must be a list"),
        ({"streamer": [object(), None]}, InvalidTypeError, r"streamer\[0\] must have put\(\) and end\(\)"),
    ],
)
def test_bad_batching_arguments_are_one_clear_error(
    model: torch.nn.Module, options: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        racer_rs.generate_batch(model, [[1, 2], [3]], **options)
