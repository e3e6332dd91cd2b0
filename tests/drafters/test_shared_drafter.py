"""One drafter object shared by two threads' ``generate`` calls: safe, or a clear error.

* A persistent RACER drafter keeps only indexes every request may read and extend: two
  threads' requests may share it at the same time, and both outputs stay exact.
* Drafters with per-request state (the draft model's KV cache, TTS's update worker) serve one
  request at a time: a second thread's request raises a clear ``RuntimeError`` and the first
  request goes on undisturbed.

Both checks are run on deliberately broken setups that they must reject.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.drafters import make_drafter  # noqa: E402
from racer_rs.drafters.base import Drafter, Proposal, RequestStart  # noqa: E402
from racer_rs.drafters.racer import RacerDrafter  # noqa: E402
from tests.helpers import REPEATING_PROMPT, plain_greedy, random_prompt, tiny_llama, tiny_model  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

NEW_TOKENS = 60
REQUESTS_PER_THREAD = 4


class MeetAtFirstBegin:
    """Mixin: each thread's first ``begin`` waits until the other thread's has run too, so the
    two threads' requests certainly overlap (both are open before either drafts)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.barrier = threading.Barrier(2, timeout=30)
        self.seen = threading.local()

    def begin(self, request: RequestStart) -> None:
        super().begin(request)  # type: ignore[misc]
        if not getattr(self.seen, "met", False):
            self.seen.met = True
            self.barrier.wait()


class SharedRacer(MeetAtFirstBegin, RacerDrafter):
    pass


class PerRequestStateDrafter(Drafter):
    """A drafter that is NOT safe to share: it keeps its request's prompt and drafts from it,
    asserting that the context it is asked about is that request's."""

    name = "per_request_state"

    def begin(self, request: RequestStart) -> None:
        self.prompt = request.prompt_ids.copy()

    def propose(self, context: np.ndarray, next_token: int, capacity: int) -> Proposal:
        assert np.array_equal(context[: len(self.prompt)], self.prompt), "another request's state"
        return Proposal(racer_rs.DraftTree.chain([next_token]))


class SharedPerRequestState(MeetAtFirstBegin, PerRequestStateDrafter):
    pass


def check_two_threads_share_safely(model: torch.nn.Module, drafter: Drafter) -> None:
    """Two threads run requests with ``drafter`` at the same time; every output is exact."""
    prompts = [REPEATING_PROMPT, random_prompt(0)]
    expected = [plain_greedy(model, prompt, NEW_TOKENS) for prompt in prompts]
    errors: list[BaseException] = []
    outputs: list[tuple[int, list[int]]] = []

    def work(which: int) -> None:
        try:
            for _ in range(REQUESTS_PER_THREAD):
                result = racer_rs.generate(model, prompts[which], max_new_tokens=NEW_TOKENS, drafter=drafter)
                outputs.append((which, result.tokens))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(which,)) for which in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(outputs) == 2 * REQUESTS_PER_THREAD
    assert all(tokens == expected[which] for which, tokens in outputs)


def test_a_persistent_racer_drafter_shared_by_two_threads_is_safe() -> None:
    model = tiny_model("llama", seed=0, sharpen=4.0)
    drafter = SharedRacer(model, persistent=True)
    check_two_threads_share_safely(model, drafter)
    drafter.automaton.check_integrity()
    assert len(drafter.automaton) > 0 and len(drafter.table) > 0  # both requests' tokens were indexed


def test_concurrent_requests_draft_with_their_own_edge_calibration() -> None:
    # The engine passes each request's calibration to propose (no state on a shared drafter):
    # two threads drafting from one persistent drafter with opposite calibrations each get the
    # tree their own calibration asks for.
    import torch

    model = tiny_model("llama")
    drafter = make_drafter("racer_scored", model, persistent=True, min_score=0.05)
    context = np.asarray(REPEATING_PROMPT, dtype=np.int32)
    vocab = model.config.vocab_size
    drafter.begin(RequestStart(context, None, torch.zeros(vocab), vocab, torch.device("cpu"), torch.float32))
    trust_all = np.full(racer_rs.EDGE_CELLS, 0.9, dtype=np.float32)
    trust_none = np.full(racer_rs.EDGE_CELLS, 0.01, dtype=np.float32)  # below min_score: root only
    expected = {
        "all": drafter.propose(context, 8, 16, edge_calibration=trust_all).tree.tokens.tolist(),
        "none": drafter.propose(context, 8, 16, edge_calibration=trust_none).tree.tokens.tolist(),
    }
    assert len(expected["all"]) > 1 and expected["none"] == [8]
    seen: dict[str, list[list[int]]] = {"all": [], "none": []}

    def request(name: str, calibration: np.ndarray) -> None:
        for _ in range(50):
            seen[name].append(drafter.propose(context, 8, 16, edge_calibration=calibration).tree.tokens.tolist())

    threads = [threading.Thread(target=request, args=args) for args in (("all", trust_all), ("none", trust_none))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert seen["all"] == [expected["all"]] * 50
    assert seen["none"] == [expected["none"]] * 50


def test_a_drafter_with_per_request_state_fails_the_same_check() -> None:
    model = tiny_model("llama", seed=0, sharpen=4.0)
    with pytest.raises(AssertionError, match="another request's state"):
        check_two_threads_share_safely(model, SharedPerRequestState())


# Drafters with per-request state: a clear error --------------------------------------------

DRAFT_PROMPT = [7, 7, 30, 2, 9, 11, 50, 3]


class PausingStreamer:
    """Blocks the request's thread at its third step until ``resume`` is set."""

    def __init__(self) -> None:
        self.paused = threading.Event()
        self.resume = threading.Event()
        self.steps = 0

    def put(self, tokens: list[int], drafted: list[bool]) -> None:
        self.steps += 1
        if self.steps == 3:
            self.paused.set()
            assert self.resume.wait(timeout=60)

    def end(self) -> None:
        pass


def check_second_thread_gets_a_clear_error(target: torch.nn.Module, drafter: Drafter) -> None:
    """While thread A's request holds ``drafter``, a request in this thread raises a clear
    ``RuntimeError``; A's request then completes exactly, and the drafter serves again."""
    expected = plain_greedy(target, DRAFT_PROMPT, 40)
    streamer = PausingStreamer()
    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            outcome["tokens"] = racer_rs.generate(
                target, DRAFT_PROMPT, max_new_tokens=40, drafter=drafter, streamer=streamer
            ).tokens
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert streamer.paused.wait(timeout=60)
        with pytest.raises(RuntimeError, match="serving a request in another thread"):
            racer_rs.generate(target, [1, 2, 3], max_new_tokens=20, drafter=drafter)
    finally:
        streamer.resume.set()
        thread.join()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["tokens"] == expected  # the first request was not disturbed
    assert racer_rs.generate(target, DRAFT_PROMPT, max_new_tokens=40, drafter=drafter).tokens == expected


Pair = tuple[torch.nn.Module, torch.nn.Module]


@pytest.fixture(scope="module")
def pair() -> Pair:
    return tiny_llama(0, hidden=64), tiny_llama(1, hidden=32)


@pytest.mark.parametrize("method", ["draft_model", "tts", "racer_tts"])
def test_a_draft_model_drafter_shared_by_two_threads_raises_a_clear_error(pair: Pair, method: str) -> None:
    target, draft = pair
    check_second_thread_gets_a_clear_error(target, make_drafter(method, target, draft_model=draft, canvas=4))


@pytest.mark.parametrize("method", ["draft_model", "tts", "racer_tts"])
def test_without_the_guard_the_same_check_fails(pair: Pair, method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the guard disabled, the second request runs (on the first one's cache and worker)
    instead of raising; run freely, such overlapping requests failed with tensor size mismatches
    deep in the draft model before the guard existed."""
    target, draft = pair
    monkeypatch.setattr(Drafter, "_claim", lambda self: None)
    monkeypatch.setattr(Drafter, "_held_elsewhere", lambda self: False)
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        check_second_thread_gets_a_clear_error(target, make_drafter(method, target, draft_model=draft, canvas=4))
