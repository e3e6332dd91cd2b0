"""An EOS inside an accepted path ends the request there, for every method, greedy and sampling.

For each method the EOS is chosen from that method's own run: a token that first occurs
strictly inside the accepted path of some step (after the step's root, before the path's last
token). The request with that EOS must stop right after it, in that very step, with the rest
of the path dropped, and its text must be the independent plain loop's text cut after the
first EOS.

``ar`` proposes the root alone, so its accepted paths have no interior: for it the test checks
that and that an EOS later in the text still ends the request there.

The prompt is the base prompt followed by the model's own greedy continuation, so that the
copying drafters (``pld``, ``racer_retrieval``) find what follows in the prompt and get whole
paths accepted from the first step; the model is sharp, so sampled text follows it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.drafters.base import StepOutcome  # noqa: E402
from racer_rs.engine import generation  # noqa: E402
from racer_rs.engine.decode_engine import DecodeEngine, DecodeState, Verification  # noqa: E402
from racer_rs.target.sampling import SamplingConfig  # noqa: E402
from tests.helpers import REPEATING_PROMPT, plain_greedy, plain_sampling, tiny_llama, tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

ENGINE_METHODS = ["pld", "token_recycling", "racer", "racer_scored", "racer_retrieval", "racer_logits"]
DRAFT_METHODS = ["draft_model", "tts", "racer_tts"]
NEW_TOKENS = 40
SEEDS = range(8)  # sampling: the first seed whose run has an EOS candidate is used
TEMPERATURE = 1.0
DRAFT_PROMPT = [7, 7, 30, 2, 9, 11, 50, 3]


Sharp = tuple[torch.nn.Module, list[int]]
Pair = tuple[torch.nn.Module, torch.nn.Module]


@pytest.fixture(scope="module")
def sharp() -> Sharp:
    """A very sharp Llama and a prompt that ends with the model's own greedy continuation."""
    model = tiny_model("llama", seed=0, sharpen=30.0)
    return model, REPEATING_PROMPT + plain_greedy(model, REPEATING_PROMPT, NEW_TOKENS)


@pytest.fixture(scope="module")
def pair() -> Pair:
    """A target and a draft that is a noisy copy of it (drafts often accepted)."""
    target = tiny_llama(0, hidden=64)
    draft = tiny_llama(0, hidden=64)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    return target, draft


@dataclass
class EosCase:
    """A run of a method and an EOS candidate inside one of its accepted paths."""

    kwargs: dict[str, Any]
    tokens: list[int]  # the run's text without EOS
    index: int  # the EOS's position in ``tokens`` (its first occurrence)
    step: int  # the step whose accepted path holds it
    step_start: int  # generated count at that step's start (its root's position)
    step_length: int  # tokens that step committed without EOS


def interior_first_occurrence(result: racer_rs.GenerationResult) -> tuple[int, int] | None:
    """``(step, index)`` of the first token that first occurs strictly inside an accepted path."""
    tokens = result.tokens
    for step, (start, length) in enumerate(zip(result.positions, result.accepted_lengths, strict=True)):
        for index in range(start + 1, start + length - 1):
            if tokens.index(tokens[index]) == index:
                return step, index
    return None


def find_case(model: torch.nn.Module, prompt: list[int], method: str, sampling: bool, **options: Any) -> EosCase:
    for seed in SEEDS if sampling else [None]:
        # A fixed capacity: the same tree every run, so the EOS run's steps are the free run's.
        kwargs: dict[str, Any] = {"method": method, "max_new_tokens": NEW_TOKENS, "capacity": 16, **options}
        if sampling:
            kwargs |= {"temperature": TEMPERATURE, "seed": seed}
        result = racer_rs.generate(model, prompt, **kwargs)
        found = interior_first_occurrence(result)
        if found is not None:
            step, index = found
            start, length = result.positions[step], result.accepted_lengths[step]
            return EosCase(kwargs, result.tokens, index, step, start, length)
    raise AssertionError(f"{method}: no run put a first occurrence inside an accepted path")


def check_eos_ends_the_request_mid_path(
    model: torch.nn.Module, prompt: list[int], case: EosCase, reference: list[int]
) -> None:
    """The request with ``EOS = tokens[index]`` stops right after it, inside the same step."""
    eos = case.tokens[case.index]
    result = racer_rs.generate(model, prompt, eos_token_id=eos, **case.kwargs)
    assert result.tokens == reference[: reference.index(eos) + 1]
    assert result.steps == case.step + 1
    assert result.accepted_lengths[-1] == case.index - case.step_start + 1 < case.step_length  # cut mid-path
    assert sum(result.accepted_lengths) == len(result.tokens)


def reference_text(model: torch.nn.Module, prompt: list[int], case: EosCase) -> list[int]:
    """The text the request must cut after its EOS: the independent plain loop's (greedy, or
    position-keyed sampling with the case's seed).

    Chain speculative sampling (``draft_model``, ``tts``) draws from the generator as it goes,
    so its text differs from plain sampling's for a seed (it matches it in distribution): its
    reference is the same seeded request without EOS.
    """
    if "seed" not in case.kwargs:
        return plain_greedy(model, prompt, NEW_TOKENS)
    if case.kwargs["method"] in ("draft_model", "tts"):
        return case.tokens
    return plain_sampling(model, prompt, NEW_TOKENS, SamplingConfig(temperature=TEMPERATURE), case.kwargs["seed"])


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("method", ENGINE_METHODS)
def test_eos_inside_an_accepted_path_ends_the_request_there(sharp: Sharp, method: str, sampling: bool) -> None:
    model, prompt = sharp
    case = find_case(model, prompt, method, sampling)
    check_eos_ends_the_request_mid_path(model, prompt, case, reference_text(model, prompt, case))


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("method", DRAFT_METHODS)
def test_eos_inside_an_accepted_path_with_a_draft_model(pair: Pair, method: str, sampling: bool) -> None:
    target, draft = pair
    case = find_case(target, DRAFT_PROMPT, method, sampling, draft_model=draft, canvas=4)
    check_eos_ends_the_request_mid_path(target, DRAFT_PROMPT, case, reference_text(target, DRAFT_PROMPT, case))


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
def test_ar_paths_have_no_interior_and_a_later_eos_still_ends_the_request(sharp: Sharp, sampling: bool) -> None:
    model, prompt = sharp
    kwargs: dict[str, Any] = {"method": "ar", "max_new_tokens": NEW_TOKENS}
    if sampling:
        kwargs |= {"temperature": TEMPERATURE, "seed": 0}
    free = racer_rs.generate(model, prompt, **kwargs)
    assert set(free.accepted_lengths) == {1}  # no EOS can lie inside an ar path
    index = max(i for i, t in enumerate(free.tokens) if free.tokens.index(t) == i)  # the last new token
    assert index > 0
    result = racer_rs.generate(model, prompt, eos_token_id=free.tokens[index], **kwargs)
    assert result.tokens == free.tokens[: index + 1] and result.steps == index + 1


class EosOnlyAtTheRootLoop(DecodeEngine):
    """A plausible bug: EOS is looked for only in a step's root, not in the drafted tokens the
    step accepted (the commit ignores it)."""

    def commit_row(self, state: DecodeState, tree: racer_rs.DraftTree, verification: Verification) -> StepOutcome:
        eos, self.eos = self.eos, np.empty(0, dtype=np.int32)
        try:
            return super().commit_row(state, tree, verification)
        finally:
            self.eos = eos


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
def test_an_engine_missing_mid_path_eos_fails_the_same_check(
    sharp: Sharp, pair: Pair, monkeypatch: pytest.MonkeyPatch, sampling: bool
) -> None:
    model, prompt = sharp
    cases = [(model, prompt, method, {}) for method in ENGINE_METHODS]
    target, draft = pair
    cases += [(target, DRAFT_PROMPT, method, {"draft_model": draft, "canvas": 4}) for method in DRAFT_METHODS]
    found = [(m, p, find_case(m, p, method, sampling, **options)) for m, p, method, options in cases]
    references = [reference_text(m, p, case) for m, p, case in found]
    monkeypatch.setattr(generation, "DecodeEngine", EosOnlyAtTheRootLoop)
    for (m, p, case), reference in zip(found, references, strict=True):
        with pytest.raises(AssertionError):
            check_eos_ends_the_request_mid_path(m, p, case, reference)
