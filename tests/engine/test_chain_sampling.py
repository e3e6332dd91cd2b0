"""Chain speculative sampling keeps the target distribution at every drafted depth.

:func:`racer_rs.target.sampling.chain_speculative_sample` is run the way the decode loop runs it: a
chain of ``DEPTH`` tokens is drafted from a draft model ``q``, the target scores the chain, the
rule accepts a prefix and emits one more token, and positions the step did not reach are
filled by plain sampling (what the following steps do). The target and the draft are bigram
models over a small vocabulary, so the exact distribution of every position is known in
closed form and a target row used at the wrong depth, or after the wrong prefix, shows.

The test at depth ``d`` compares the joint distribution of the tokens at positions ``d - 1``
and ``d`` (position 0 is the fixed root) with the exact one. The same test is run on rules that
are wrong at depth ``d`` only and must reject each of them:

* ``resample_from_p``: after a rejection at depth ``d``, draw from ``p`` instead of the
  residual ``max(0, p - q)``;
* ``always_accept``: accept the draft at depth ``d`` without the ``min(1, p / q)`` test (at
  depths 2 and 3 this is "always accept past depth 1");
* ``misreported_q``: the drafter reports a shifted distribution for depth ``d`` instead of the
  one it sampled from (``Proposal.draft_probs`` that do not match the draft).

The last section checks the engine's side on a real model: the rule receives the target's
rows of the chain's nodes and the draft's reported rows, and the decode loop commits exactly
the accepted drafts and then the rule's token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytest.importorskip("transformers")

from racer_rs import DraftTree  # noqa: E402
from racer_rs.drafters.base import Drafter, Proposal, RequestStart  # noqa: E402
from racer_rs.engine import acceptance  # noqa: E402
from racer_rs.engine.decode_engine import DecodeEngine, DecodeState, Verification, Verified  # noqa: E402
from racer_rs.target.sampling import SamplingConfig, _inverse_cdf, chain_speculative_sample, process_logits  # noqa: E402
from tests.helpers import run_engine, tiny_model  # noqa: E402
from tests.stats import chi_square_pvalue  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 6
DEPTH = 3  # drafted tokens per chain
ROOT = 0
CONFIG = SamplingConfig(temperature=1.0, top_k=4)  # top-k: some tokens are impossible after each token
RUNS = 8000
ALPHA = 1e-3
MUTATIONS = ["resample_from_p", "always_accept", "misreported_q"]


def _bigrams() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target logits ``[V, V]`` (row = previous token), the target's processed rows ``p`` and
    the draft's rows ``q``.

    ``q`` mixes ``p`` (so drafts are often accepted and deep depths are reached), extra mass on
    the target's favourite token (so ``q > p`` there: rejections, and a residual far from ``p``)
    and a little uniform mass (so the draft proposes tokens the target's top-k rules out).
    """
    generator = torch.Generator().manual_seed(7)
    target = 1.5 * torch.randn(VOCAB, VOCAB, generator=generator)
    p = process_logits(target, CONFIG).softmax(dim=-1).double()
    favourite = torch.nn.functional.one_hot(p.argmax(dim=-1), VOCAB).double()
    q = 0.4 * p + 0.5 * favourite + 0.1 / VOCAB
    return target, p, q.float()


TARGET_LOGITS, P, DRAFT = _bigrams()


def exact_pairs(depth: int) -> dict[tuple[int, int], float]:
    """Exact joint distribution of the tokens at positions ``depth - 1`` and ``depth``."""
    marginal = torch.zeros(VOCAB, dtype=torch.float64)
    marginal[ROOT] = 1.0
    for _ in range(depth - 1):
        marginal = marginal @ P
    joint = marginal[:, None] * P
    return {(a, b): float(joint[a, b]) for a in range(VOCAB) for b in range(VOCAB)}


ChainRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, SamplingConfig, torch.Generator], torch.Tensor]


def chain_rule_with_mutation(mutation: str | None, depth: int) -> ChainRule:
    """A copy of ``chain_speculative_sample`` that is wrong at ``depth`` only (``None``: exact copy).

    The copy draws from the generator exactly as the library does, so without a mutation it
    returns the library's results (checked by ``test_unmutated_copy_is_the_library_rule``).
    """

    def rule(target_logits, draft_probs, draft_tokens, config, generator):  # type: ignore[no-untyped-def]
        p = process_logits(target_logits, config).softmax(dim=-1)
        q = draft_probs.to(dtype=p.dtype)
        index = draft_tokens.view(-1, 1)
        p_drafted = p[:-1].gather(1, index).squeeze(1)
        q_drafted = q.gather(1, index).squeeze(1)
        u = torch.rand(p_drafted.shape, generator=generator, dtype=p.dtype)
        accept = u * q_drafted < p_drafted
        if mutation == "always_accept":
            accept[depth - 1] = True
        accepted = accept.long().cumprod(dim=0).sum().reshape(1)
        residual = (p[:-1] - q).clamp(min=0.0)
        if mutation == "resample_from_p":
            residual[depth - 1] = p[depth - 1]
        empty = residual.sum(dim=-1, keepdim=True) <= 0
        residual = torch.where(empty, p[:-1], residual)
        rows = torch.cat([residual, p[-1:]])
        candidates = _inverse_cdf(rows, torch.rand(rows.shape[0], generator=generator))
        return torch.cat([accepted, candidates.gather(0, accepted)])

    return rule


def sample_positions(rule: ChainRule, runs: int, seed: int, misreport_depth: int | None = None) -> torch.Tensor:
    """``int64[runs, DEPTH + 1]``: the root then the tokens at positions 1..DEPTH of each run.

    Each run is one chain step: root ``ROOT``, ``DEPTH`` drafted tokens (each drawn from the
    draft's row for the previous drafted token), the rule's accepted prefix and token; the
    positions after that token are filled by plain sampling from the target.
    """
    generator = torch.Generator().manual_seed(seed)
    chains = torch.full((runs, DEPTH + 1), ROOT, dtype=torch.long)
    for depth in range(1, DEPTH + 1):
        chains[:, depth] = torch.multinomial(DRAFT[chains[:, depth - 1]], 1, generator=generator).squeeze(1)
    out = torch.full((runs, DEPTH + 1), -1, dtype=torch.long)
    out[:, 0] = ROOT
    for run, chain in enumerate(chains):
        reported = DRAFT[chain[:-1]]
        if misreport_depth is not None:
            reported = reported.clone()
            reported[misreport_depth - 1] = reported[misreport_depth - 1].roll(1)
        accepted, token = rule(TARGET_LOGITS[chain], reported, chain[1:], CONFIG, generator).tolist()
        out[run, 1 : accepted + 1] = chain[1 : accepted + 1]
        if accepted < DEPTH:  # else the token is the next step's root, past the tested positions
            out[run, accepted + 1] = token
    for position in range(2, DEPTH + 1):
        fill = out[:, position] < 0
        previous = out[fill, position - 1]
        out[fill, position] = torch.multinomial(P[previous], 1, generator=generator).squeeze(1)
    return out


def pair_pvalue(samples: torch.Tensor, depth: int) -> float:
    counts = Counter(zip(samples[:, depth - 1].tolist(), samples[:, depth].tolist(), strict=True))
    return chi_square_pvalue(counts, exact_pairs(depth), len(samples))


@pytest.fixture(scope="module")
def exact_rule_samples() -> torch.Tensor:
    return sample_positions(chain_speculative_sample, RUNS, seed=0)


def test_drafts_are_accepted_and_rejected_at_every_depth() -> None:
    """The counterparts have power only if every depth is reached, and rejects, often."""
    generator = torch.Generator().manual_seed(1)
    accepted: Counter[int] = Counter()
    for _ in range(2000):
        chain = [ROOT]
        for _ in range(DEPTH):
            chain.append(int(torch.multinomial(DRAFT[chain[-1]], 1, generator=generator)))
        drafts = torch.tensor(chain[1:])
        decision = chain_speculative_sample(TARGET_LOGITS[chain], DRAFT[chain[:-1]], drafts, CONFIG, generator)
        accepted[int(decision[0])] += 1
    assert all(accepted[a] > 150 for a in range(DEPTH + 1)), accepted  # a: drafts accepted, 0..DEPTH


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_chain_sampling_keeps_the_distribution_at_depth(exact_rule_samples: torch.Tensor, depth: int) -> None:
    assert pair_pvalue(exact_rule_samples, depth) > ALPHA


@pytest.mark.parametrize("mutation", MUTATIONS)
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_rule_lossy_at_that_depth_fails_the_same_test(depth: int, mutation: str) -> None:
    if mutation == "misreported_q":
        samples = sample_positions(chain_speculative_sample, RUNS, seed=0, misreport_depth=depth)
    else:
        samples = sample_positions(chain_rule_with_mutation(mutation, depth), RUNS, seed=0)
    assert pair_pvalue(samples, depth) < ALPHA


def test_unmutated_copy_is_the_library_rule() -> None:
    """The mutations above are of a faithful copy: unmutated, it returns what the library does."""
    copy = chain_rule_with_mutation(None, 1)
    seeds = torch.Generator().manual_seed(3)
    for trial in range(200):
        target = 2 * torch.randn(DEPTH + 1, VOCAB, generator=seeds)
        draft = torch.softmax(torch.randn(DEPTH, VOCAB, generator=seeds), dim=-1)
        tokens = torch.multinomial(draft, 1, generator=seeds).squeeze(1)
        ours, theirs = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        expected = chain_speculative_sample(target, draft, tokens, CONFIG, theirs)
        assert torch.equal(copy(target, draft, tokens, CONFIG, ours), expected)


# The engine's side: rows in, decision out ---------------------------------------------------

ENGINE_VOCAB = 16
ENGINE_PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]


class BigramChainDrafter(Drafter):
    """Drafts a chain of ``DEPTH`` tokens from a fixed bigram table and reports its rows."""

    name = "bigram_chain"

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.generator: torch.Generator | None = None

    def begin(self, request: RequestStart) -> None:
        self.generator = request.generator

    def propose(self, context: np.ndarray, next_token: int, capacity: int) -> Proposal:
        chain = [next_token]
        for _ in range(min(DEPTH, capacity - 1)):
            chain.append(int(torch.multinomial(self.table[chain[-1]], 1, generator=self.generator)))
        probs = self.table[chain[:-1]] if len(chain) > 1 else None
        return Proposal(DraftTree.chain(chain), draft_probs=probs)


@dataclass
class EngineRun:
    """A decode run with chain drafts and the chain rule's every call."""

    model: torch.nn.Module
    table: torch.Tensor
    state: DecodeState | None = None
    calls: list = field(default_factory=list)  # type: ignore[type-arg]


class CommitOneDraftTooManyLoop(DecodeEngine):
    """A deliberately wrong engine: commits the first rejected draft as if it were accepted."""

    def accept(self, state: DecodeState, verified: Verified) -> Verification:
        verification = super().accept(state, verified)
        if len(verification.path) < len(verified.step.proposal.tree):
            verification.path = [*verification.path, len(verification.path)]
        return verification


def engine_run(monkeypatch: pytest.MonkeyPatch, loop_class: type[DecodeEngine]) -> EngineRun:
    """Decode 40 tokens with chain drafts, recording every call of the chain rule."""
    model = tiny_model("llama", seed=2, vocab=ENGINE_VOCAB, sharpen=15.0)
    with torch.inference_mode():
        own = model(input_ids=torch.tensor([ENGINE_PROMPT])).logits[0, -1].softmax(-1)
    noise = torch.softmax(torch.randn(ENGINE_VOCAB, ENGINE_VOCAB, generator=torch.Generator().manual_seed(0)), -1)
    table = 0.5 * noise + 0.5 * own  # shares the target's favourites: drafts get accepted
    run = EngineRun(model, table)

    def spy(target_logits, draft_probs, draft_tokens, config, generator):  # type: ignore[no-untyped-def]
        decision = chain_speculative_sample(target_logits, draft_probs, draft_tokens, config, generator)
        run.calls.append((target_logits.clone(), draft_probs.clone(), draft_tokens.tolist(), decision.tolist()))
        return decision

    monkeypatch.setattr(acceptance, "chain_speculative_sample", spy)
    run.state = run_engine(
        model,
        BigramChainDrafter(table),
        SamplingConfig(temperature=1.0),
        ENGINE_PROMPT,
        40,
        seed=5,
        engine_class=loop_class,
    )
    return run


def check_engine_applies_chain_decisions(run: EngineRun) -> None:
    """Every chain step: the rule saw the target's rows of the chain's nodes and the draft's
    reported rows, and the engine committed exactly the accepted drafts, then the rule's token."""
    state = run.state
    tokens = state.context[state.prompt_length : state.length].tolist()
    steps = list(zip(state.positions, state.accepted_lengths, strict=True))
    for (position, committed), (target_logits, draft_probs, drafts, decision) in zip(steps, run.calls, strict=False):
        accepted, token = decision
        chain = [tokens[position], *drafts]
        with torch.inference_mode():
            full = ENGINE_PROMPT + tokens[:position] + chain
            expected_rows = run.model(input_ids=torch.tensor([full])).logits[0, -len(chain) :]
        torch.testing.assert_close(target_logits, expected_rows, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(draft_probs, run.table[chain[:-1]])
        assert committed == accepted + 1
        assert tokens[position + 1 : position + 1 + accepted] == drafts[:accepted]
        if position + committed < len(tokens):
            assert tokens[position + committed] == token
    assert len(run.calls) == len(steps) - 1  # the last step commits its root alone (budget of 1)


def test_engine_feeds_the_chain_rule_and_commits_its_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    run = engine_run(monkeypatch, DecodeEngine)
    accepted = Counter(decision[0] for *_, decision in run.calls)
    assert all(accepted[a] > 0 for a in range(DEPTH + 1)), accepted  # decisions at every depth
    check_engine_applies_chain_decisions(run)


def test_an_engine_committing_a_rejected_draft_fails_the_same_check(monkeypatch: pytest.MonkeyPatch) -> None:
    run = engine_run(monkeypatch, CommitOneDraftTooManyLoop)
    with pytest.raises(AssertionError):
        check_engine_applies_chain_decisions(run)
