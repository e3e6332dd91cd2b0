"""Tests of the self-draft: its structure, a reduced vocabulary, and lossless decoding with it.

The self-draft is the target's first K layers (copied) with the target's embedding and LM head
(shared, frozen). Checks: with K = all layers it computes exactly the target's logits; a reduced
vocabulary gives the full head's logits on the kept ids and -inf elsewhere; training it never
changes the target; ``draft_model``, ``tts``, ``racer_tts`` and transformers' assisted generation
decode with it, greedily equal to the plain greedy loop and, when sampling, with the target's
distribution (a lossy report of the reduced distribution fails the same chi-square test).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.drafters.draft_model import DraftModelDrafter  # noqa: E402
from racer_rs.selfdraft.model import ReducedHead, self_draft  # noqa: E402
from tests.helpers import DEEP_LLAMA, plain_greedy, tiny_llama, tiny_model  # noqa: E402
from tests.stats import pvalue_of_array  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 96
SMALL_VOCAB = 12


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(**DEEP_LLAMA)


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


IDS = [3, 17, 42, 8, 55, 3, 17, 9]
KEPT = [*range(0, VOCAB, 2), 1, 5]  # about half the vocabulary


# --- structure --------------------------------------------------------------------------------


def test_all_layers_compute_the_targets_logits(target) -> None:
    draft = self_draft(target, target.config.num_hidden_layers)
    torch.testing.assert_close(logits(draft, IDS), logits(target, IDS), rtol=0, atol=0)


def test_fewer_layers_compute_the_truncated_forward(target) -> None:
    # The reference: the target's own modules, run by hand over the first two layers.
    draft = self_draft(target, 2)
    ids = torch.tensor([IDS])
    with torch.no_grad():
        body = target.model
        hidden = body.embed_tokens(ids)
        positions = torch.arange(len(IDS)).unsqueeze(0)
        rotary = body.rotary_emb(hidden, position_ids=positions)
        mask = transformers.masking_utils.create_causal_mask(
            config=target.config, inputs_embeds=hidden, attention_mask=None, cache=None, position_ids=positions
        )
        for layer in body.layers[:2]:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
        expected = target.lm_head(body.norm(hidden))[0]
    assert draft.config.num_hidden_layers == 2 and len(draft.model.layers) == 2
    torch.testing.assert_close(logits(draft, IDS), expected)
    assert not torch.allclose(logits(draft, IDS), logits(target, IDS))  # truncation does change them


def test_reduced_vocabulary_keeps_the_full_logits_on_kept_ids_only(target) -> None:
    full = logits(self_draft(target, 2), IDS)
    reduced_draft = self_draft(target, 2, vocab=KEPT)
    reduced = logits(reduced_draft, IDS)
    kept = torch.zeros(VOCAB, dtype=torch.bool)
    kept[KEPT] = True
    assert reduced.shape == full.shape  # full width: consumers see an ordinary distribution
    torch.testing.assert_close(reduced[:, kept], full[:, kept])
    assert torch.isneginf(reduced[:, ~kept]).all()
    assert isinstance(reduced_draft.lm_head, ReducedHead)
    assert reduced_draft.lm_head.kept_weight.shape == (len(KEPT), target.config.hidden_size)  # the saving


def test_embedding_and_head_are_shared_and_layers_are_copies(target) -> None:
    draft = self_draft(target, 2, vocab=KEPT)
    assert draft.model.embed_tokens is target.model.embed_tokens
    assert draft.lm_head.head is target.lm_head
    for mine, theirs in zip(draft.model.layers, target.model.layers[:2], strict=False):
        for a, b in zip(mine.parameters(), theirs.parameters(), strict=False):
            assert a.data_ptr() != b.data_ptr()
    assert draft.model.norm.weight.data_ptr() != target.model.norm.weight.data_ptr()


def test_training_the_draft_leaves_the_target_unchanged(target) -> None:
    before = logits(target, IDS).clone()
    draft = self_draft(target, 2, vocab=KEPT)
    params = [p for p in draft.parameters() if p.requires_grad]
    assert params and all(p is not target.model.embed_tokens.weight for p in params)
    optimizer = torch.optim.SGD(params, lr=1.0)
    out = draft(input_ids=torch.tensor([IDS])).logits
    out[torch.isfinite(out)].sum().backward()
    optimizer.step()
    torch.testing.assert_close(logits(target, IDS), before, rtol=0, atol=0)
    assert not torch.allclose(logits(draft, IDS)[:, KEPT], logits(self_draft(target, 2), IDS)[:, KEPT])


def test_other_model_families_get_a_clear_error() -> None:
    with pytest.raises(TypeError, match="Llama-style"):
        self_draft(tiny_model("gpt_neox"), 1)
    with pytest.raises(TypeError, match="PreTrainedModel"):
        self_draft(torch.nn.Linear(2, 2), 1)


def test_qwen3_layout_is_supported() -> None:
    qwen = tiny_model("qwen3")
    draft = self_draft(qwen, qwen.config.num_hidden_layers)
    torch.testing.assert_close(logits(draft, IDS), logits(qwen, IDS), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"layers": 0}, ValueError, "layers must be in 1..4"),
        ({"layers": 5}, ValueError, "layers must be in 1..4"),
        ({"layers": 2.0}, TypeError, "layers must be an int"),
        ({"layers": True}, TypeError, "layers must be an int"),
        ({"layers": 2, "vocab": []}, ValueError, "at least one"),
        ({"layers": 2, "vocab": [1, 1]}, ValueError, "repeats"),
        ({"layers": 2, "vocab": [0, VOCAB]}, ValueError, "outside"),
        ({"layers": 2, "vocab": [-1]}, ValueError, "outside"),
        ({"layers": 2, "vocab": [0.5]}, TypeError, "int token ids"),
        ({"layers": 2, "vocab": 100}, TypeError, "sequence of token ids"),
        ({"layers": 2, "vocab": torch.tensor([0.0, 1.0])}, TypeError, "integer tensor"),
    ],
)
def test_bad_arguments_are_rejected(target, kwargs, error, fragment) -> None:
    with pytest.raises(error, match=fragment):
        self_draft(target, **kwargs)


# --- greedy equivalence -----------------------------------------------------------------------

METHODS = {
    "draft_model": {},
    "tts": {"update_every": 1, "lr": 3e-2},
    "tts_sync": {"update_every": 2, "lr": 1e-2, "asynchronous": False},
    "racer_tts": {"update_every": 1, "lr": 3e-2},
}
PROMPTS = [[1, 2, 3, 4, 5], [7, 7, 30, 2, 9, 11, 50, 3]]


@pytest.mark.parametrize("vocab", [None, KEPT], ids=["full_vocab", "reduced_vocab"])
@pytest.mark.parametrize("variant", list(METHODS))
def test_greedy_output_equals_plain_greedy(target, variant: str, vocab) -> None:
    draft = self_draft(target, 2, vocab=vocab)
    method = variant.removesuffix("_sync")
    accepted = 0
    for prompt in PROMPTS:
        expected = plain_greedy(target, prompt, 40)
        result = racer_rs.generate(
            target,
            prompt,
            method=method,
            max_new_tokens=40,
            draft_model=draft,
            canvas=4,
            capacity=8,
            **METHODS[variant],
        )
        assert result.tokens == expected
        accepted += 40 - result.steps
        if method in ("tts", "racer_tts"):
            assert result.extras["tts_updates"] > 0 and np.isfinite(result.extras["tts_mean_loss"])
    assert accepted > 10  # drafted tokens were accepted, so the check exercises them


def test_greedy_self_draft_is_accepted_often(target) -> None:
    # Guards the equivalence tests: the self-draft's chain is mostly accepted on this target.
    # A fixed capacity (the whole chain and its root): with capacity="auto" how much of the chain
    # is verified follows the machine's measured costs, and a loaded machine cut it short.
    result = racer_rs.generate(
        target,
        PROMPTS[0],
        method="draft_model",
        max_new_tokens=40,
        draft_model=self_draft(target, 2),
        canvas=4,
        capacity=5,
    )
    assert result.mat > 1.5


def test_tts_keeps_sharing_the_targets_tensors_and_leaves_the_target_alone(target) -> None:
    from racer_rs.drafters.tts import TTSDrafter

    before = logits(target, IDS).clone()
    drafter = TTSDrafter(target, draft_model=self_draft(target, 2, vocab=KEPT), update_every=1, lr=5e-2)
    shared = target.model.embed_tokens.weight.data_ptr()
    assert drafter.draft.model.embed_tokens.weight.data_ptr() == shared  # not duplicated per copy
    assert drafter.shadow.model.embed_tokens.weight.data_ptr() == shared
    result = racer_rs.generate(target, PROMPTS[1], max_new_tokens=30, drafter=drafter)
    assert result.extras["tts_updates"] > 0
    torch.testing.assert_close(logits(target, IDS), before, rtol=0, atol=0)
    assert not torch.equal(drafter.draft.model.layers[0].mlp.up_proj.weight, target.model.layers[0].mlp.up_proj.weight)


def test_transformers_assisted_generation_accepts_a_reduced_self_draft(target) -> None:
    from racer_rs.bench.hf_peers import generate_with_transformers

    draft = self_draft(target, 2, vocab=KEPT)
    for prompt in PROMPTS:
        result = generate_with_transformers(
            target, prompt, method="hf_assisted", max_new_tokens=30, assistant_model=draft
        )
        assert result.tokens == plain_greedy(target, prompt, 30)


# --- sampling ---------------------------------------------------------------------------------

SMALL_KEPT = [0, 2, 3, 5, 6, 8, 9, 11]  # 8 of the 12 tokens


class ForgetsTheReducedSupport(DraftModelDrafter):
    """Samples from the reduced ``q`` but reports it mixed with the uniform distribution over
    the whole vocabulary, as if the draft could propose every token: lossy."""

    def _pick(self, logits: torch.Tensor, sample: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        token, q = super()._pick(logits, sample)
        return token, None if q is None else 0.5 * q + 0.5 / q.numel()


def small_target() -> torch.nn.Module:
    return tiny_llama(10, hidden=32, vocab=SMALL_VOCAB, init=0.3)


def test_reduced_draft_proposes_only_kept_tokens_and_reports_it() -> None:
    from dataclasses import replace

    from tests.drafters.test_draft_model import request_start

    target = small_target()
    drafter = DraftModelDrafter(target, draft_model=self_draft(target, 1, vocab=SMALL_KEPT), canvas=3)
    generator = torch.Generator().manual_seed(0)
    outside = np.setdiff1d(np.arange(SMALL_VOCAB), SMALL_KEPT)
    for step in range(200):
        drafter.begin(replace(request_start(SMALL_VOCAB, 0.9), generator=generator))
        proposal = drafter.propose(np.array([1, 2, step % SMALL_VOCAB], dtype=np.int32), 4, capacity=4)
        assert not np.isin(proposal.tree.tokens[1:], outside).any()
        assert proposal.draft_probs is not None
        assert float(proposal.draft_probs[:, outside].abs().max()) == 0.0
        torch.testing.assert_close(proposal.draft_probs.sum(-1), torch.ones(3))
    drafter.end()


def third_token_pvalue(drafter) -> tuple[float, int]:
    from tests.drafters.test_draft_model import exact_third_token

    target = small_target()
    prompt, temperature, runs = [1, 2, 3], 0.9, 2000
    expected = exact_third_token(target, prompt, temperature, 0)
    counts = np.zeros(SMALL_VOCAB, dtype=np.int64)
    accepted = 0
    for seed in range(runs):
        # A fixed capacity: at "auto" whether a chain is verified at all follows the machine's
        # measured cost curve, and a lossy drafter whose chains are never verified passes.
        result = racer_rs.generate(
            target, prompt, max_new_tokens=4, temperature=temperature, seed=seed, drafter=drafter, capacity=4
        )
        counts[result.tokens[2]] += 1
        accepted += result.steps < 4
    return pvalue_of_array(counts, expected), accepted


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft_model", "tts"])
def test_sampling_with_a_reduced_vocabulary_keeps_the_target_distribution(method: str) -> None:
    from racer_rs.drafters import make_drafter

    target = small_target()
    options = {"canvas": 3} if method == "draft_model" else {"canvas": 2, "update_every": 1, "lr": 5e-2}
    drafter = make_drafter(method, target, draft_model=self_draft(target, 1, vocab=SMALL_KEPT), **options)
    pvalue, accepted = third_token_pvalue(drafter)
    assert accepted > 200
    assert pvalue > 1e-3


@pytest.mark.slow
def test_forgetting_the_reduced_support_fails_the_same_sampling_test() -> None:
    target = small_target()
    drafter = ForgetsTheReducedSupport(target, draft_model=self_draft(target, 1, vocab=SMALL_KEPT), canvas=3)
    pvalue, accepted = third_token_pvalue(drafter)
    assert accepted > 200  # its chains were verified: the test sees the lossy acceptance
    assert pvalue < 1e-3


def test_tts_loss_renormalises_the_teacher_over_a_reduced_vocabulary() -> None:
    # Without the restriction KL(p || q) is infinite: q is 0 outside the draft's vocabulary.
    from racer_rs.tts.online_loss import distill_loss

    generator = torch.Generator().manual_seed(0)
    student = torch.randn(3, 10, generator=generator, requires_grad=True)
    reduced = torch.cat([student[:, :6], torch.full((3, 4), float("-inf"))], dim=1)
    teacher = torch.randn(3, 10, generator=generator)
    p = torch.softmax(teacher[:, :6], dim=-1)
    per_row = (p * (p.log() - torch.log_softmax(student[:, :6], dim=-1))).sum(-1)
    loss = distill_loss(reduced, teacher, torch.ones(3))
    torch.testing.assert_close(loss, per_row.mean())
    loss.backward()
    assert torch.isfinite(student.grad).all() and student.grad[:, :6].abs().sum() > 0
    # A row whose teacher keeps nothing the draft can propose carries no signal.
    teacher[0, :6] = float("-inf")
    torch.testing.assert_close(distill_loss(reduced.detach(), teacher, torch.ones(3)), per_row[1:].mean().detach())
