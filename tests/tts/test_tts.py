"""Tests of Test-Time Speculation: the distillation step, the update worker, and the tts methods."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.drafters.racer_tts import RacerTTSDrafter, chain_nodes  # noqa: E402
from racer_rs.drafters.tts import TTSDrafter  # noqa: E402
from racer_rs.engine import generation  # noqa: E402
from racer_rs.engine.decode_engine import DecodeEngine  # noqa: E402
from racer_rs.target.sampling import SamplingConfig, resample_node  # noqa: E402
from racer_rs.tts.online_loss import (  # noqa: E402
    Canvas,
    DistillConfig,
    canvas_logits,
    distill_loss,
    distill_step,
    make_optimizer,
    row_weights,
    trainable_parameter_names,
)
from racer_rs.tts.update_worker import THREAD_NAME_PREFIX, UpdateWorker  # noqa: E402
from tests.helpers import plain_greedy, plain_sampling, tiny_llama  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 96


def make_canvas(draft: torch.nn.Module, seed: int = 0, n_prefix: int = 12, n_canvas: int = 6) -> Canvas:
    """A canvas drafted after a random prefix, with a random teacher."""
    gen = torch.Generator().manual_seed(seed)
    prefix_ids = torch.randint(0, VOCAB, (1, n_prefix), generator=gen)
    with torch.no_grad():
        out = draft(input_ids=prefix_ids, use_cache=True)
    prefix = tuple((layer.keys, layer.values) for layer in out.past_key_values.layers)
    teacher = 3.0 * torch.randn(n_canvas, VOCAB, generator=gen)
    return Canvas(
        prefix=prefix,
        input_ids=torch.randint(0, VOCAB, (n_canvas,), generator=gen),
        teacher_logits=teacher,
        n_accepted=2,
    )


def canvas_loss(model: torch.nn.Module, canvas: Canvas, config: DistillConfig) -> float:
    with torch.no_grad():
        return float(distill_loss(canvas_logits(model, canvas), canvas.teacher_logits, row_weights(canvas, config)))


def trainable_params(model: torch.nn.Module, names: list[str]) -> list[torch.nn.Parameter]:
    params = dict(model.named_parameters())
    for name, param in params.items():
        param.requires_grad_(name in names)
    return [params[name] for name in names]


def distance(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pairs = zip(a.parameters(), b.parameters(), strict=True)
    return sum(float((pa - pb).detach().pow(2).sum()) for pa, pb in pairs) ** 0.5


# --- distillation -----------------------------------------------------------------------------


def test_canvas_logits_align_with_full_forward() -> None:
    draft = tiny_llama(1, init=0.02)
    canvas = make_canvas(draft)
    gen = torch.Generator().manual_seed(0)
    prefix_ids = torch.randint(0, VOCAB, (1, 12), generator=gen)  # same draw as make_canvas
    full = torch.cat([prefix_ids, canvas.input_ids[None]], dim=1)
    with torch.no_grad():
        expected = draft(input_ids=full).logits[0, 12:]
        got = canvas_logits(draft, canvas)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_loss_gradient_matches_analytic_form() -> None:
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(5, VOCAB, generator=gen, requires_grad=True)
    teacher = torch.randn(5, VOCAB, generator=gen)
    teacher[:, :10] = float("-inf")  # a truncated teacher must not produce NaNs
    weights = torch.tensor([1.0, 0.5, 0.25, 0.0, 0.1])
    distill_loss(z, teacher, weights).backward()
    p = torch.softmax(teacher, -1)
    expected = weights[:, None] / weights.sum() * (torch.softmax(z.detach(), -1) - p)
    torch.testing.assert_close(z.grad, expected, rtol=1e-5, atol=1e-7)


def test_reference_term_has_zero_gradient_at_its_reference_and_not_elsewhere() -> None:
    gen = torch.Generator().manual_seed(4)
    ref = torch.randn(4, VOCAB, generator=gen)
    teacher = torch.randn(4, VOCAB, generator=gen)
    weights = torch.ones(4)
    grads = []
    for lam in (0.0, 2.0):
        z = ref.clone().requires_grad_(True)
        distill_loss(z, teacher, weights, lam, ref).backward()
        grads.append(z.grad)
    torch.testing.assert_close(grads[0], grads[1])
    z = (ref + torch.randn(4, VOCAB, generator=gen)).requires_grad_(True)
    distill_loss(z, teacher, weights, 2.0, ref).backward()
    moved = z.grad.clone()
    z.grad = None
    distill_loss(z, teacher, weights, 0.0, ref).backward()
    assert not torch.allclose(moved, z.grad)


def test_on_trajectory_mask_ignores_rows_after_rejection() -> None:
    draft = tiny_llama(2, init=0.02)
    canvas = make_canvas(draft)
    config = DistillConfig(mask="on_trajectory")
    assert row_weights(canvas, config).nonzero().flatten().tolist() == [0, 1, 2]
    before = canvas_loss(draft, canvas, config)
    canvas.teacher_logits[3:] = torch.randn_like(canvas.teacher_logits[3:])
    assert canvas_loss(draft, canvas, config) == pytest.approx(before, rel=1e-6)
    full = DistillConfig(mask="full_canvas")
    assert row_weights(canvas, full).nonzero().numel() == canvas.input_ids.numel()


def test_step_lowers_loss_on_its_canvas() -> None:
    draft = tiny_llama(5, init=0.02)
    canvas = make_canvas(draft, seed=1)
    config = DistillConfig(lr=3e-3)
    names = trainable_parameter_names(draft, "all")
    optimizer = make_optimizer(trainable_params(draft, names), config)
    before = distill_step(draft, optimizer, canvas, config)
    assert before == pytest.approx(canvas_loss(tiny_llama(5, init=0.02), canvas, config), rel=1e-5)
    after = canvas_loss(draft, canvas, config)
    assert after < before


def test_step_works_on_inference_mode_tensors() -> None:
    draft = tiny_llama(6, init=0.02)
    with torch.inference_mode():
        canvas = make_canvas(draft, seed=2)
    config = DistillConfig(lr=3e-3)
    optimizer = make_optimizer(trainable_params(draft, trainable_parameter_names(draft)), config)
    before = distill_step(draft, optimizer, canvas, config)
    assert canvas_loss(draft, canvas, config) < before


def test_lambda_keeps_weights_closer_to_the_original() -> None:
    original = tiny_llama(7, init=0.02)
    canvas = make_canvas(original, seed=3)
    distances = {}
    for lam in (0.0, 4.0):
        config = DistillConfig(lr=1e-2, lam=lam)
        draft = tiny_llama(7, init=0.02)
        optimizer = make_optimizer(trainable_params(draft, trainable_parameter_names(draft)), config)
        for _ in range(8):
            distill_step(draft, optimizer, canvas, config, reference=original)
        distances[lam] = distance(draft, original)
    assert 0 < distances[4.0] < distances[0.0]


def test_frozen_parameters_stay_bit_identical() -> None:
    draft = tiny_llama(8, init=0.02)
    original = tiny_llama(8, init=0.02)
    canvas = make_canvas(draft, seed=4)
    config = DistillConfig(lr=1e-2)
    names = trainable_parameter_names(draft, "no_embeddings")
    assert "model.embed_tokens.weight" not in names and names
    optimizer = make_optimizer(trainable_params(draft, names), config)
    for _ in range(3):
        distill_step(draft, optimizer, canvas, config)
    trained = dict(draft.named_parameters())
    for name, param in original.named_parameters():
        if name in names:
            assert not torch.equal(trained[name], param), name
        else:
            assert torch.equal(trained[name], param), name


def test_parameters_shared_with_the_target_are_never_trainable() -> None:
    target = tiny_llama(9, init=0.02)
    draft = tiny_llama(10, init=0.02)
    draft.model.embed_tokens.weight = target.model.embed_tokens.weight  # borrowed, tied to the target
    names = trainable_parameter_names(draft, "all", shared_with=target)
    assert "model.embed_tokens.weight" not in names
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert trainable_parameter_names(draft, ["model.norm"]) == ["model.norm.weight"]


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"lr": 0.0}, "lr"),
        ({"lam": -1.0}, "lam"),
        ({"mask": "bogus"}, "mask"),
        ({"position_weights": "bogus"}, "position_weights"),
        ({"position_weights": (0.0, 0.0)}, "position_weights"),
        ({"gamma": 0.0}, "gamma"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        DistillConfig(**kwargs)


def test_trainable_rejects_bad_values() -> None:
    draft = tiny_llama(11, init=0.02)
    with pytest.raises(ValueError, match="trainable"):
        trainable_parameter_names(draft, "bogus")
    with pytest.raises(ValueError, match="trainable"):
        trainable_parameter_names(draft, ["no.such.prefix"])


# --- update worker ----------------------------------------------------------------------------


class Counter:
    """A toy model: step adds the job to a shadow value, publish copies it to the served value."""

    def __init__(self, fail_on: int | None = None, delay: float = 0.0) -> None:
        self.shadow = 0
        self.served = 0
        self.log: list[str] = []
        self.fail_on = fail_on
        self.delay = delay

    def step(self, job: int) -> float:
        time.sleep(self.delay)
        if job == self.fail_on:
            raise RuntimeError(f"boom on {job}")
        self.shadow += job
        self.log.append(f"step {job}")
        return float(job)

    def publish(self) -> None:
        self.served = self.shadow
        self.log.append(f"publish {self.served}")


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]


def test_sync_worker_publishes_each_update_at_once() -> None:
    toy = Counter()
    worker = UpdateWorker(toy.step, toy.publish, asynchronous=False)
    for job in (1, 2, 4):
        worker.submit(job)
        assert not worker.in_flight
    assert toy.served == 7
    assert toy.log == ["step 1", "publish 1", "step 2", "publish 3", "step 4", "publish 7"]
    worker.close()
    assert worker.stats()["updates"] == 3 and worker.stats()["overlapped_time"] == 0.0
    assert not worker_threads()


def test_async_worker_publishes_at_the_next_boundary_exactly_once() -> None:
    toy = Counter(delay=0.01)
    worker = UpdateWorker(toy.step, toy.publish, asynchronous=True)
    jobs = [1, 2, 4, 8, 16]
    served_at_boundaries = []
    for job in jobs:
        worker.submit(job)
        served_at_boundaries.append(toy.served)
        time.sleep(0.03)  # the update finishes during "decoding" but is not published yet
        assert toy.served == served_at_boundaries[-1]
    # At boundary r the update of boundary r-1 is published (and nothing newer).
    assert served_at_boundaries == [0, 1, 3, 7, 15]
    worker.close()
    assert toy.served == 31
    stats = worker.stats()
    assert stats["updates"] == stats["submitted"] == len(jobs)
    assert toy.log.count("publish 31") == 1 and len([e for e in toy.log if e.startswith("publish")]) == 5
    assert stats["update_time"] > 0 and stats["overlapped_time"] > 0
    assert not worker_threads()


def test_async_worker_surfaces_errors_and_shuts_down() -> None:
    toy = Counter(fail_on=2)
    worker = UpdateWorker(toy.step, toy.publish, asynchronous=True)
    worker.submit(1)
    worker.submit(2)
    with pytest.raises(RuntimeError, match="boom on 2"):
        worker.submit(3)
    assert toy.served == 1
    worker.close(discard=True)
    assert not worker_threads()
    with pytest.raises(RuntimeError, match="after close"):
        worker.submit(4)
    worker.close()  # idempotent


def test_async_worker_close_raises_pending_error_and_still_stops() -> None:
    toy = Counter(fail_on=5)
    worker = UpdateWorker(toy.step, toy.publish, asynchronous=True)
    worker.submit(5)
    with pytest.raises(RuntimeError, match="boom on 5"):
        worker.close()
    assert not worker_threads()
    assert worker.stats()["updates"] == 0


def test_async_worker_discard_drops_the_update_in_flight() -> None:
    toy = Counter(delay=0.01)
    worker = UpdateWorker(toy.step, toy.publish, asynchronous=True)
    worker.submit(1)
    worker.submit(2)
    worker.close(discard=True)
    assert toy.served == 1 and worker.stats()["updates"] == 1
    assert not worker_threads()


# --- the tts and racer_tts methods in the engine ----------------------------------------------

PROMPT = [1, 2, 3, 4, 5, 6]


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """A target and a draft that is a noisy copy of it (partial acceptance)."""
    target = tiny_llama(0, hidden=64)
    draft = tiny_llama(0, hidden=64)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=gen))
    return target, draft


class RecordingTTS(TTSDrafter):
    """Logs the round count at every publication of new weights."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.published_at: list[int] = []

    def _publish(self) -> None:
        self.published_at.append(self._rounds)
        super()._publish()


def serving_equals(drafter: TTSDrafter, other: torch.nn.Module) -> bool:
    theirs = dict(other.named_parameters())
    return all(torch.equal(p, theirs[n]) for n, p in drafter.draft.named_parameters())


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("update_every", [1, 3])
def test_updates_are_published_at_round_boundaries(pair, asynchronous: bool, update_every: int) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    drafter = RecordingTTS(
        target, draft_model=draft, canvas=3, update_every=update_every, lr=1e-2, asynchronous=asynchronous
    )
    result = racer_rs.generate(target, PROMPT, max_new_tokens=48, drafter=drafter)
    rounds = result.extras["tts_rounds"]
    # A round that ends the request trains nothing; a final step that only commits its root
    # (no draft, no verification) is not a round.
    last_round_finished = rounds == result.steps
    boundaries = [r for r in range(update_every, rounds + 1, update_every) if r < rounds or not last_round_finished]
    assert result.extras["tts_submitted"] == len(boundaries) > 0
    if asynchronous:
        # Update k is published at boundary k+1; the last one when the request ends.
        assert drafter.published_at == [*boundaries[1:], rounds]
    else:
        assert drafter.published_at == boundaries
    assert result.extras["tts_updates"] == len(boundaries)  # none lost, none applied twice
    shadow = dict(drafter.shadow.named_parameters())
    assert all(torch.equal(p, shadow[n]) for n, p in drafter.draft.named_parameters())  # the latest is served
    assert not serving_equals(drafter, draft)  # the draft did change
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]


def test_caller_draft_is_untouched_and_requests_restart_from_it(pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    before = {n: p.clone() for n, p in draft.named_parameters()}
    drafter = TTSDrafter(target, draft_model=draft, canvas=3, update_every=1, lr=1e-2)
    first = racer_rs.generate(target, PROMPT, max_new_tokens=32, drafter=drafter)
    assert all(torch.equal(p, before[n]) for n, p in draft.named_parameters())
    assert not serving_equals(drafter, draft)
    second = racer_rs.generate(target, PROMPT, max_new_tokens=32, drafter=drafter)
    assert second.accepted_lengths == first.accepted_lengths  # same start weights, same trajectory
    carry = TTSDrafter(target, draft_model=draft, canvas=3, update_every=1, lr=1e-2, reset=False, asynchronous=False)
    a = racer_rs.generate(target, PROMPT, max_new_tokens=32, drafter=carry)
    adapted = {n: p.clone() for n, p in carry.draft.named_parameters()}
    b = racer_rs.generate(target, PROMPT, max_new_tokens=32, drafter=carry)
    assert a.tokens == b.tokens
    assert not all(torch.equal(p, adapted[n]) for n, p in carry.draft.named_parameters())  # kept learning


def test_frozen_draft_parameters_stay_bit_identical_in_generation(pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    drafter = TTSDrafter(target, draft_model=draft, canvas=3, update_every=1, lr=1e-2, trainable="no_embeddings")
    racer_rs.generate(target, PROMPT, max_new_tokens=32, drafter=drafter)
    original = dict(draft.named_parameters())
    for name, param in drafter.draft.named_parameters():
        same = torch.equal(param, original[name])
        assert same == (name not in drafter.trainable), name


def test_worker_stops_when_generation_fails(pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair

    class Exploding:
        def __init__(self) -> None:
            self.calls = 0

        def put(self, tokens, drafted) -> None:  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.calls == 6:
                raise KeyboardInterrupt("stop")

        def end(self) -> None:
            pass

    drafter = TTSDrafter(target, draft_model=draft, canvas=3, update_every=1, lr=1e-2)
    with pytest.raises(KeyboardInterrupt):
        racer_rs.generate(target, PROMPT, max_new_tokens=64, drafter=drafter, streamer=Exploding())
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]
    assert drafter.stats()["tts_updates"] >= 1
    result = racer_rs.generate(target, PROMPT, max_new_tokens=16, drafter=drafter)  # usable again
    assert result.tokens == plain_greedy(target, PROMPT, 16)


@pytest.mark.parametrize("options", [{}, {"adapt": False}, {"capacity": 4}, {"mask": "on_trajectory", "lam": 0.5}])
def test_racer_tts_greedy_output_equals_plain_greedy(pair, options: dict) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    options = dict(options)
    capacity = options.pop("capacity", 16)
    for prompt in (PROMPT, [9, 9, 9, 4, 9, 9, 9, 4, 9]):
        expected = plain_greedy(target, prompt, 48)  # the independent loop, not the engine's ar
        result = racer_rs.generate(
            target,
            prompt,
            method="racer_tts",
            max_new_tokens=48,
            draft_model=draft,
            canvas=4,
            capacity=capacity,
            update_every=1,
            lr=1e-2,
            **options,
        )
        assert result.tokens == expected
        assert result.mat > 1.0
        if options.get("adapt", True):
            assert result.extras["tts_updates"] > 0


class ResampleAfterMismatchLoop(DecodeEngine):
    """A lossy walk: after a mismatch, emit a fresh sample instead of the mismatching one."""

    def accept(self, state, verified):  # type: ignore[no-untyped-def]
        verification = super().accept(state, verified)
        last = verification.path[-1]
        verification.bonus = resample_node(verified.step.logits[last], self.sampling, state.generator)
        return verification


def racer_tts_sampled_equals_plain_sampling(pair) -> list[bool]:  # type: ignore[no-untyped-def]
    """For three seeds, whether racer_tts's sampled text equals plain sampling's; checks that
    drafts were accepted and the draft was adapted, so the walk ran on adapted merged trees."""
    target, draft = pair
    config = SamplingConfig(temperature=0.5, top_p=0.95)
    same = []
    for seed in range(3):
        expected = plain_sampling(target, PROMPT, 40, config, seed)
        result = racer_rs.generate(
            target,
            PROMPT,
            method="racer_tts",
            max_new_tokens=40,
            temperature=0.5,
            top_p=0.95,
            seed=seed,
            draft_model=draft,
            canvas=4,
            capacity=16,
            update_every=1,
            lr=1e-2,
            asynchronous=False,
        )
        assert result.mat > 1.2 and result.extras["tts_updates"] > 0
        same.append(result.tokens == expected)
    return same


def test_racer_tts_sampling_equals_plain_sampling(pair) -> None:  # type: ignore[no-untyped-def]
    """The chain is drafted greedily (deterministically), so sampling is keyed by position and
    racer_tts samples exactly plain sampling's text for a seed, while its draft adapts."""
    assert all(racer_tts_sampled_equals_plain_sampling(pair))


def test_racer_tts_sampling_with_a_lossy_walk_fails_the_same_check(  # type: ignore[no-untyped-def]
    pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(generation, "DecodeEngine", ResampleAfterMismatchLoop)
    assert not all(racer_tts_sampled_equals_plain_sampling(pair))


def test_chain_nodes_finds_the_chain_in_a_merged_tree() -> None:
    tree = racer_rs.DraftTree(np.array([5, 7, 3, 8, 4, 9]), np.array([-1, 0, 0, 1, 2, 3]))
    assert chain_nodes(tree, np.array([7, 8, 9])).tolist() == [0, 1, 3, 5]
    assert chain_nodes(tree, np.array([3, 4, 6])).tolist() == [0, 2, 4]
    assert chain_nodes(tree, np.array([1])).tolist() == [0]


def test_racer_tts_learns_from_the_chain_rows_only(pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    drafter = RacerTTSDrafter(target, draft_model=draft, canvas=4, update_every=1, asynchronous=False)
    seen: list[tuple[list[int], int, int]] = []
    learn = drafter.tts.learn

    def spy(tokens, logits, n_accepted, finished=False):  # type: ignore[no-untyped-def]
        seen.append((list(tokens), logits.shape[0], n_accepted))
        learn(tokens, logits, n_accepted, finished)

    drafter.tts.learn = spy  # type: ignore[method-assign]
    racer_rs.generate(target, PROMPT, max_new_tokens=32, drafter=drafter, capacity=16)
    assert seen
    for tokens, rows, n_accepted in seen:
        assert rows == len(tokens) <= 5 and 0 <= n_accepted <= len(tokens) - 1
