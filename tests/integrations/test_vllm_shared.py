"""The vLLM proposer's automaton shared across requests: a finished request's output is drafted
for a later request that starts repeating it (its own tree has nothing there), a running
request's for another running one (not with ``shared_running`` off), each request counted as a
sequence of its own, nothing is drafted from it when it is off (``shared_nodes = 0``); and a request's own
longest-match chain is drafted where a shorter match is more frequent."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from racer_rs import optional_deps
from racer_rs.integrations import vllm as integration
from racer_rs.integrations.options import ServingOptions
from racer_rs.integrations.vllm import RacerProposer

VOCAB, K, MAX_LEN = 1000, 8, 512


@pytest.fixture
def engine_free(monkeypatch):
    real = optional_deps.require
    monkeypatch.setattr(
        optional_deps, "require", lambda extra, purpose: None if extra == "vllm" else real(extra, purpose)
    )


class Batch:
    """vLLM's ``input_batch`` arrays for a few rows, and the proposer's calls on them."""

    def __init__(self, proposer: RacerProposer) -> None:
        self.proposer = proposer
        self.ids = np.zeros((4, MAX_LEN), dtype=np.int32)

    def step(self, contexts: list[list[int]], sampled: list[list[int]]) -> list[list[int]]:
        lens = np.zeros(4, dtype=np.int32)
        for i, context in enumerate(contexts):
            self.ids[i, : len(context)] = context
            lens[i] = len(context)
        return self.proposer.propose([*sampled, *[[] for _ in range(4 - len(sampled))]], lens, self.ids)[
            : len(contexts)
        ]


def new_batch(proposer_class: type[RacerProposer]) -> tuple[RacerProposer, Batch]:
    """A proposer of ``proposer_class`` on a vLLM config stand-in, and its batch."""
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(max_model_len=MAX_LEN, get_vocab_size=lambda: VOCAB),
    )
    proposer = proposer_class(config, options=ServingOptions(use_logits=False))
    return proposer, Batch(proposer)


def repeat_an_earlier_output(proposer_class: type[RacerProposer]) -> tuple[RacerProposer, list[list[int]], list[int]]:
    """Request A (prompt, then 40 generated tokens, all distinct) finishes; request B (another
    prompt) then generates A's output. Returns B's drafts per step and A's output."""
    proposer, batch = new_batch(proposer_class)
    tokens = np.random.default_rng(0).permutation(VOCAB)[:200].tolist()
    prompt_a, output, prompt_b = tokens[:30], tokens[30:70], tokens[70:100]
    context = prompt_a + output[:1]
    batch.step([context], [output[:1]])  # A's prefill
    for token in output[1:]:
        context = [*context, token]
        batch.step([context], [[token]])  # A's own tree never matches: all tokens distinct
    drafts = []
    context = prompt_b + output[:1]
    drafts.append(batch.step([context], [output[:1]])[0])  # A gone, B's prefill
    for token in output[1:12]:  # one token a step (the drafts' acceptance does not matter here)
        context = [*context, token]
        drafts.append(batch.step([context], [[token]])[0])
    return proposer, drafts, output


def test_a_finished_requests_output_is_drafted_for_a_later_request(engine_free):
    proposer, drafts, output = repeat_an_earlier_output(RacerProposer)
    assert proposer.stats["shared_chains"] > 0
    # Once B's context ends with two of A's output tokens, B's chain is A's continuation.
    for step, drafted in enumerate(drafts[2:], start=2):
        assert len(drafted) > 0, (step, drafts)
        assert drafted == output[step + 1 : step + 1 + len(drafted)], (step, drafted)


def test_nothing_is_drafted_without_the_shared_automaton(engine_free):
    class Unshared(RacerProposer):
        shared_nodes = 0

    proposer, drafts, _ = repeat_an_earlier_output(Unshared)
    assert proposer.shared is None and proposer.stats["shared_chains"] == 0
    assert all(d == [] for d in drafts), drafts


def follow_a_running_request(proposer_class: type[RacerProposer]) -> tuple[RacerProposer, list[list[int]], list[int]]:
    """Requests A and B run side by side (rows 0 and 1, other prompts): A generates distinct
    tokens, B the same output 12 steps behind. Returns B's drafts per step (A still running)
    and A's output."""
    proposer, batch = new_batch(proposer_class)
    tokens = np.random.default_rng(1).permutation(VOCAB)[:200].tolist()
    prompt_a, output, prompt_b = tokens[:30], tokens[30:70], tokens[70:100]
    a = prompt_a + output[:1]
    batch.step([a], [output[:1]])
    for token in output[1:12]:
        a = [*a, token]
        batch.step([a], [[token]])
    drafts = []
    a, b = [*a, output[12]], prompt_b + output[:1]
    drafts.append(batch.step([a, b], [[output[12]], output[:1]])[1])  # B's prefill
    for step, token in enumerate(output[1:12], start=1):
        a, b = [*a, output[12 + step]], [*b, token]
        drafts.append(batch.step([a, b], [[output[12 + step]], [token]])[1])
    return proposer, drafts, output


def test_a_running_requests_output_is_drafted_for_another_running_request(engine_free):
    proposer, drafts, output = follow_a_running_request(RacerProposer)
    assert proposer.stats["shared_chains"] > 0
    for step, drafted in enumerate(drafts[2:], start=2):
        assert len(drafted) > 0, (step, drafts)
        assert drafted == output[step + 1 : step + 1 + len(drafted)], (step, drafted)
    # Each request's tokens are counted as its own sequence: no bigram spans two requests.
    shared = proposer.shared
    assert shared is not None
    assert shared.count(output[3:5]) == 2 and shared.count(output[11:13]) == 1
    assert shared.count([output[11], output[1]]) == 0  # A's last token before B's second


def test_running_outputs_are_not_shared_when_off(engine_free):
    class FinishedOnly(RacerProposer):
        shared_running = False

    proposer, drafts, _ = follow_a_running_request(FinishedOnly)
    assert proposer.stats["shared_chains"] == 0
    assert all(d == [] for d in drafts), drafts


def draft_after_shared_bigrams(
    options: ServingOptions, proposer_class: type[RacerProposer] = RacerProposer
) -> tuple[RacerProposer, list[list[int]], list[list[int]]]:
    """One request whose prompt holds a frequent ``B C X Y`` and eight segments ``Q B C D E F
    G`` (their other tokens distinct), and whose output repeats the segments in order, one
    token a step. Returns the proposer, the drafts made at each segment's ``C``, and the
    segments' ``D E F G``."""
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(max_model_len=MAX_LEN, get_vocab_size=lambda: VOCAB),
    )
    proposer = proposer_class(config, options=options)
    batch = Batch(proposer)
    b, c = 11, 12
    segments = [[100 + 10 * i, b, c, 101 + 10 * i, 102 + 10 * i, 103 + 10 * i, 104 + 10 * i] for i in range(8)]
    prompt = [b, c, 13, 14] * 6 + [t for s in segments for t in s]
    output = [t for s in segments for t in s]
    drafts, context = [], [*prompt, output[0]]
    batch.step([context], [output[:1]])
    for n, token in enumerate(output[1:], start=1):
        context = [*context, token]
        drafted = batch.step([context], [[token]])[0]
        if token == c:
            drafts.append(drafted)
        assert n < len(output)
    return proposer, drafts, [s[3:] for s in segments]


def test_the_longest_match_chain_is_drafted_where_a_shorter_match_is_more_frequent(engine_free):
    # Each segment's C follows "Q B C" once, and "B C" is followed by X most often: the
    # longest-match chain has the segment's own continuation, the count-ranked tree X.
    proposer, drafts, truths = draft_after_shared_bigrams(ServingOptions(use_logits=False))
    for drafted, truth in list(zip(drafts, truths, strict=True))[2:]:
        assert drafted[:4] == truth, (drafted, truth)
    # Every candidate learns, the one not chosen too: the tree's "B C X" edges were tried.
    assert proposer.calibration.tried.sum() > proposer.stats["accepted_tokens"]
    # The tree alone (no choice among candidates) drafts the frequent continuation instead.
    _, tree_drafts, _ = draft_after_shared_bigrams(ServingOptions(use_logits=False, adaptive=False))
    assert all(d[:1] != t[:1] for d, t in zip(tree_drafts[2:], truths[2:], strict=True)), tree_drafts
    assert proposer.source_committed[integration._OWN] > 0  # the own chains' outcomes were counted


def test_a_source_whose_chosen_chains_committed_far_less_than_expected_loses_the_choice(engine_free):
    class Discredited(RacerProposer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # As if the own chains had been chosen often and had committed nothing.
            self.source_expected[integration._OWN] = 1e6

    proposer, drafts, truths = draft_after_shared_bigrams(ServingOptions(use_logits=False), Discredited)
    assert all(d[:1] != t[:1] for d, t in zip(drafts[2:], truths[2:], strict=True)), drafts
    assert proposer.source_committed[integration._OWN] == 0


def test_the_proposer_drafts_after_a_one_token_match_unless_the_options_name_min_depth(engine_free, monkeypatch):
    # The root token 5 occurred once before, followed by 7, after another token than now: only
    # a one-token match (the proposer's default min_depth, RACER_DEFAULTS) continues it.
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(max_model_len=MAX_LEN, get_vocab_size=lambda: VOCAB),
    )
    context = [5, 7, *range(100, 130), 5]

    def first_draft(options: str) -> tuple[RacerProposer, list[int]]:
        monkeypatch.setenv("RACER_RS_OPTIONS", options)
        proposer = RacerProposer(config)
        return proposer, Batch(proposer).step([context], [[5]])[0]

    proposer, drafted = first_draft('{"use_logits": false}')
    assert proposer.options.racer.min_depth == integration.RACER_DEFAULTS["min_depth"] == 1
    assert drafted[:1] == [7], drafted
    proposer, drafted = first_draft('{"use_logits": false, "min_depth": 2}')
    assert proposer.options.racer.min_depth == 2 and drafted == []
    # SGLang's options (no engine defaults) and options given in code keep RacerOptions' 2.
    assert ServingOptions.from_env({}).racer.min_depth == ServingOptions().racer.min_depth == 2
