"""The racer methods' shared index (cross-request memory, :mod:`racer_rs.drafters.index`).

* Lossless: greedy output equals plain greedy and seeded sampling equals plain sampling, with an
  index built from related text (the model's own answers to related prompts), from unrelated
  noise, and learning as it goes.
* It learns: a second request on the same prompt drafts from the first one's response (a higher
  MAT) with ``learn=True``, and gains nothing with ``learn=False``.
* Per-request state stays clean: the request's own automaton holds its prompt and response only.
* Concurrency: threads sharing one index (drafting, learning, saving) give exact outputs, never
  deadlock, and every learned response is one sequence (as if learned one after the other).
* Where an index comes from: ``"memory"`` per model and method, a file loaded once per path
  (reloaded when it changes), a private copy with ``index_scope="drafter"``; bad options.
* In ``generate_batch``: the pooled racer methods draft every row from the index in their one
  ``DraftPool.propose`` call, a finished row's response serves the rows admitted after it, a
  ``"drafter"``-scope index is the call's (rows drafted one by one share it too), and an index
  of another tokenizer fails its rows alone.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs import Automaton  # noqa: E402
from racer_rs.drafters import make_drafter  # noqa: E402
from racer_rs.drafters.index import INDEX_MAX_NODES, forget_indexes, open_index  # noqa: E402
from racer_rs.drafters.racer import RacerDrafter, RacerOptions  # noqa: E402
from racer_rs.engine.drafting import racer_part  # noqa: E402
from racer_rs.errors import CorruptFileError, InvalidArgumentError, InvalidTypeError  # noqa: E402
from racer_rs.target.sampling import SamplingConfig  # noqa: E402
from tests.helpers import REPEATING_PROMPT, plain_greedy, plain_sampling, random_prompt, tiny_model  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

NEW = 48
INDEX_METHODS = ("racer", "racer_scored", "racer_retrieval")


@pytest.fixture(autouse=True)
def _fresh_process_indexes():
    forget_indexes()
    yield
    forget_indexes()


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0, sharpen=4.0)


def related_index(model, prompts, new_tokens=NEW, noise=0) -> Automaton:
    """An index of the model's own greedy answers to ``prompts`` (plus ``noise`` random sequences)."""
    index = Automaton(ngram=10, max_nodes=50_000)
    for prompt in prompts:
        index.extend(np.asarray(prompt[-9:] + plain_greedy(model, prompt, new_tokens), dtype=np.int32))
        index.new_sequence()
    for seed in range(noise):
        index.extend(np.asarray(random_prompt(100 + seed, length=80), dtype=np.int32))
        index.new_sequence()
    return index


def ngrams(tokens, n):
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


class Recording(RacerDrafter):
    """A racer drafter that records, per request, the prompt and the tokens its steps committed
    (what ``end`` learns: a last step that commits only the target's token is not observed)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests: list[tuple[list[int], list[int]]] = []
        self._record_lock = threading.Lock()
        self._open = threading.local()

    def begin(self, request):
        super().begin(request)
        self._open.request = (request.prompt_ids.tolist(), [])

    def observe(self, outcome):
        super().observe(outcome)
        self._open.request[1].extend(outcome.committed.tolist())

    def end(self):
        with self._record_lock:
            self.requests.append(self._open.request)
        super().end()


# --- lossless ----------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("method", INDEX_METHODS)
def test_greedy_with_a_related_index_equals_plain_greedy(family, method):
    model = tiny_model(family, seed=1, sharpen=4.0)
    prompts = [random_prompt(seed) for seed in range(4)]
    # The index holds answers to the same prompts, to prompts sharing their opening, and noise.
    neighbours = [p[:12] + random_prompt(50 + i, length=12) for i, p in enumerate(prompts)]
    index = related_index(model, prompts[:2] + neighbours, noise=3)
    before = index.to_bytes()
    for capacity in (4, 16):
        for prompt in prompts:
            expected = plain_greedy(model, prompt, NEW)
            result = racer_rs.generate(
                model, prompt, method=method, max_new_tokens=NEW, capacity=capacity, index=index, learn=False
            )
            assert result.tokens == expected, (method, capacity)
            assert result.extras["index"] == "automaton" and result.extras["index_learns"] is False
    assert len(Automaton.from_bytes(before)) == len(index)  # read only: nothing learned
    index.check_integrity()


@pytest.mark.parametrize("method", INDEX_METHODS)
def test_a_learning_index_stays_lossless_over_many_requests(model, method):
    prompts = [random_prompt(seed % 3) for seed in range(6)] + [REPEATING_PROMPT]
    for prompt in prompts:
        result = racer_rs.generate(model, prompt, method=method, max_new_tokens=NEW, capacity=8, index="memory")
        assert result.tokens == plain_greedy(model, prompt, NEW)


def test_the_index_is_what_makes_repeats_fast_and_they_stay_exact(model):
    # The index holds this very answer: most of it is drafted from the index, and still exact.
    prompt = random_prompt(7)
    index = related_index(model, [prompt])
    plain = racer_rs.generate(model, prompt, max_new_tokens=NEW, capacity=16)
    indexed = racer_rs.generate(model, prompt, max_new_tokens=NEW, capacity=16, index=index, learn=False)
    assert indexed.tokens == plain.tokens == plain_greedy(model, prompt, NEW)
    assert indexed.mat > plain.mat


@pytest.mark.parametrize("method", ["racer", "racer_scored"])
def test_seeded_sampling_with_an_index_equals_plain_sampling(method):
    model = tiny_model("llama", seed=1, sharpen=15.0)
    config = SamplingConfig(temperature=1.0, top_p=0.9)
    index = Automaton(ngram=10, max_nodes=50_000)
    mats = []
    for seed in range(3):
        expected = plain_sampling(model, REPEATING_PROMPT, 40, config, seed)
        for _ in range(2):  # the second run drafts from the first one's answer, learned
            result = racer_rs.generate(
                model,
                REPEATING_PROMPT,
                method=method,
                max_new_tokens=40,
                temperature=1.0,
                top_p=0.9,
                seed=seed,
                index=index,
            )
            assert result.tokens == expected, (method, seed)
            mats.append(result.mat)
    assert len(index) > 0 and max(mats) > 1.2


# --- learning ------------------------------------------------------------------------------


def test_a_second_request_drafts_from_the_first_ones_response_only_when_learning(model):
    prompt = random_prompt(3)
    for learn in (True, False):
        forget_indexes()
        first = racer_rs.generate(model, prompt, max_new_tokens=NEW, capacity=16, index="memory", learn=learn)
        second = racer_rs.generate(model, prompt, max_new_tokens=NEW, capacity=16, index="memory", learn=learn)
        assert first.tokens == second.tokens == plain_greedy(model, prompt, NEW)
        assert first.extras["index_learns"] is learn and first.extras["index"] == "memory"
        if learn:
            assert first.extras["index_nodes"] > 0
            assert second.mat > first.mat and second.steps < first.steps
        else:
            assert first.extras["index_nodes"] == second.extras["index_nodes"] == 0
            assert second.accepted_lengths == first.accepted_lengths


def test_a_learned_response_is_the_response_with_a_short_prompt_lead_in(model):
    prompt = random_prompt(5)
    index = Automaton(ngram=6, max_nodes=50_000)
    drafter = Recording(model, RacerOptions(index=index))
    result = racer_rs.generate(model, prompt, max_new_tokens=NEW, drafter=drafter)
    [(_, committed)] = drafter.requests
    assert committed == result.tokens[: len(committed)] and len(committed) >= len(result.tokens) - 1
    expected = Automaton(ngram=6, max_nodes=50_000)
    expected.extend(np.asarray(prompt[-5:] + committed, dtype=np.int32))  # the index's ngram - 1
    expected.new_sequence()
    sequence = prompt + result.tokens
    for n in range(1, 7):
        for gram in ngrams(sequence, n) | ngrams(prompt, n):
            assert index.count(list(gram)) == expected.count(list(gram)), gram
    assert index.count(prompt[:6]) == 0  # the prompt's opening is not learned


def test_stats_report_the_index(model):
    plain = racer_rs.generate(model, [1, 2, 3], max_new_tokens=8, index=None)
    assert plain.extras["index"] is None and "index_nodes" not in plain.extras
    learned = racer_rs.generate(model, [1, 2, 3], max_new_tokens=8, index="memory", index_max_nodes=5_000)
    assert learned.extras["index"] == "memory" and learned.extras["index_learns"] is True
    assert 0 < learned.extras["index_nodes"] <= learned.extras["index_max_nodes"] == 5_000
    drafter = make_drafter("racer", model, index="memory")
    assert drafter.learns_across_requests and drafter.learning_state == "shared index: learns across requests"
    reader = make_drafter("racer", model, index="memory", learn=False)
    assert not reader.learns_across_requests and reader.learning_state == "shared index: read only"
    assert not make_drafter("racer", model, index=None).learns_across_requests
    assert make_drafter("racer", model, index="memory").index.automaton.max_nodes == INDEX_MAX_NODES


@pytest.mark.parametrize("method", ["racer", "racer_scored", "racer_retrieval", "racer_tts"])
def test_the_retrieval_methods_learn_into_an_index_of_their_own_by_default(model, method):
    options = {"draft_model": tiny_model("llama", seed=1)} if method == "racer_tts" else {}
    drafter = make_drafter(method, model, **options)
    index = racer_part(drafter).index
    assert (index.source, index.scope, index.learn) == ("memory", "drafter", True)
    assert index.automaton is not racer_part(make_drafter(method, model, **options)).index.automaton
    assert drafter.learns_across_requests
    # Turned off with index=None; an index_scope given alone applies to the default index.
    assert racer_part(make_drafter(method, model, index=None, **options)).index is None
    shared = racer_part(make_drafter(method, model, index_scope="process", **options)).index
    assert shared.scope == "process"
    assert shared.automaton is racer_part(make_drafter(method, model, index_scope="process", **options)).index.automaton
    # The default is the call's: one generate call does not see another's answers.
    default = racer_rs.generate(model, REPEATING_PROMPT, method=method, max_new_tokens=8, **options)
    assert default.extras["index"] == "memory" and default.extras["index_learns"] is True
    again = racer_rs.generate(model, REPEATING_PROMPT, method=method, max_new_tokens=8, **options)
    assert again.accepted_lengths == default.accepted_lengths
    assert again.extras["index_nodes"] == default.extras["index_nodes"] > 0  # its own response only


def test_the_logits_method_has_no_index_by_default(model):
    assert make_drafter("racer_logits", model).index is None


# --- per-request state ---------------------------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
def test_the_request_automaton_holds_only_its_own_tokens(model, persistent):
    other = random_prompt(11, length=60)
    index = Automaton(ngram=10, max_nodes=50_000)
    index.extend(np.asarray(other, dtype=np.int32))
    index.new_sequence()
    drafter = Recording(model, RacerOptions(index=index, persistent=persistent))
    prompt = random_prompt(12)
    result = racer_rs.generate(model, prompt, max_new_tokens=NEW, drafter=drafter)
    [(_, committed)] = drafter.requests
    own = Automaton(ngram=10, max_nodes=10_000)
    own.extend(np.asarray(prompt, dtype=np.int32))
    own.extend(np.asarray(committed, dtype=np.int32))
    mine = prompt + result.tokens
    for n in range(1, 5):
        for gram in ngrams(other, n) | ngrams(mine, n):
            assert drafter.automaton.count(list(gram)) == own.count(list(gram)), gram
    assert len(drafter.automaton) == len(own)
    # A second request with a non-persistent drafter starts from its own prompt only.
    if not persistent:
        racer_rs.generate(model, [5, 6, 7], max_new_tokens=1, drafter=drafter)
        assert drafter.automaton.count(prompt[:3]) == 0 and drafter.automaton.count([5, 6, 7]) == 1


# --- concurrency ---------------------------------------------------------------------------


def run_threads(work, count, timeout=240):
    errors: list[BaseException] = []

    def guarded(which):
        try:
            work(which)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(which,), daemon=True) for which in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads), "a thread is stuck (deadlock?)"
    assert not errors, errors


def test_concurrent_requests_share_one_index_exactly(model, tmp_path):
    prompts = [random_prompt(seed % 3) for seed in range(4)] + [REPEATING_PROMPT]
    expected = {tuple(p): plain_greedy(model, p, NEW) for p in prompts}
    index = Automaton(ngram=10, max_nodes=50_000)
    outputs: list[tuple[tuple[int, ...], list[int]]] = []
    methods = ["racer", "racer_scored", "racer_retrieval"]

    def work(which):
        for round_ in range(3):
            prompt = prompts[(which + round_) % len(prompts)]
            method = methods[(which + round_) % len(methods)]
            result = racer_rs.generate(model, prompt, method=method, max_new_tokens=NEW, capacity=8, index=index)
            outputs.append((tuple(prompt), result.tokens))

    def saver(_):
        for k in range(10):
            index.save(tmp_path / f"snapshot-{k % 2}.idx")  # safe while others draft and learn

    run_threads(lambda which: saver(which) if which == 4 else work(which), 5)
    assert len(outputs) == 12
    assert all(tokens == expected[prompt] for prompt, tokens in outputs)
    index.check_integrity()
    Automaton.load(tmp_path / "snapshot-1.idx").check_integrity()
    for tokens in expected.values():
        assert index.count(tokens[:8]) >= 1  # every answer was learned


def test_one_persistent_drafter_serving_threads_learns_each_response_as_one_sequence(model):
    index = Automaton(ngram=10, max_nodes=50_000)
    drafter = Recording(model, RacerOptions(persistent=True, index=index))
    prompts = [random_prompt(20 + k) for k in range(4)]
    results: dict[int, list[int]] = {}

    def work(which):
        for _ in range(2):
            results[which] = racer_rs.generate(model, prompts[which], max_new_tokens=NEW, drafter=drafter).tokens

    run_threads(work, 4)
    for which, tokens in results.items():
        assert tokens == plain_greedy(model, prompts[which], NEW)
    # Learned one after the other, in some order: the same counts as a serial reference,
    # splices of two responses included.
    assert len(drafter.requests) == 8
    learned = [prompt[-9:] + committed for prompt, committed in drafter.requests]
    serial = Automaton(ngram=10, max_nodes=50_000)
    for tokens in learned:
        serial.extend(np.asarray(tokens, dtype=np.int32))
        serial.new_sequence()
    for a, b in itertools.permutations(learned, 2):
        assert index.count(a[-3:] + b[:3]) == serial.count(a[-3:] + b[:3])
    for tokens in learned:
        for gram in ngrams(tokens, 4):
            assert index.count(list(gram)) == serial.count(list(gram))


def test_concurrent_learning_is_one_sequence_per_response():
    index = Automaton(ngram=6, max_nodes=200_000)
    serial = Automaton(ngram=6, max_nodes=200_000)
    learner = open_index(
        index, learn=True, scope="process", model=None, method="racer", ngram=6, min_depth=2, max_nodes=None
    )
    sequences = [random_prompt(300 + k, length=40 + k) for k in range(32)]

    def work(which):
        for k in range(which, len(sequences), 8):
            tokens = sequences[k]
            learner.learn_response(np.asarray(tokens[:5], dtype=np.int32), [np.asarray(tokens[5:], dtype=np.int32)])

    run_threads(work, 8)
    for tokens in sequences:
        serial.extend(np.asarray(tokens, dtype=np.int32))  # a 5-token lead-in (ngram - 1) + the rest
        serial.new_sequence()
    for a, b in itertools.permutations(sequences[:8], 2):
        assert index.count(a[-3:] + b[:3]) == serial.count(a[-3:] + b[:3])
    for tokens in sequences:
        for gram in ngrams(tokens, 5):
            assert index.count(list(gram)) == serial.count(list(gram))


# --- where an index comes from -------------------------------------------------------------


def test_memory_indexes_are_one_per_model_and_method(model):
    other_model = tiny_model("llama", seed=3, sharpen=4.0)
    a = make_drafter("racer", model, index="memory")
    b = make_drafter("racer", model, index="memory")
    assert a.index.automaton is b.index.automaton
    assert make_drafter("racer_scored", model, index="memory").index.automaton is not a.index.automaton
    assert make_drafter("racer", other_model, index="memory").index.automaton is not a.index.automaton
    assert make_drafter("racer", model, index="memory", ngram=6).index.automaton is not a.index.automaton
    own = make_drafter("racer", model, index="memory", index_scope="drafter")
    assert own.index.automaton is not a.index.automaton and len(own.index.automaton) == 0


def test_a_saved_index_is_loaded_once_per_path_and_reloaded_when_it_changes(model, tmp_path):
    path = tmp_path / "corpus.idx"
    corpus = Automaton(ngram=10, max_nodes=10_000)
    corpus.extend(np.asarray(random_prompt(1, length=40), dtype=np.int32))
    corpus.save(path)
    a = make_drafter("racer", model, index=str(path))
    b = make_drafter("racer_scored", model, index=path)
    assert a.index.automaton is b.index.automaton and a.index.source == str(path)
    assert len(a.index.automaton) == len(corpus)
    copy = make_drafter("racer", model, index=path, index_scope="drafter")
    assert copy.index.automaton is not a.index.automaton and copy.index.automaton.to_bytes() == corpus.to_bytes()
    corpus.extend(np.asarray(random_prompt(2, length=40), dtype=np.int32))
    corpus.save(path)
    reloaded = make_drafter("racer", model, index=path)
    assert reloaded.index.automaton is not a.index.automaton and len(reloaded.index.automaton) == len(corpus)
    # Learning stays in memory: the file is never written.
    before = path.read_bytes()
    racer_rs.generate(model, [1, 2, 3], max_new_tokens=8, drafter=reloaded)
    assert path.read_bytes() == before and len(reloaded.index.automaton) > len(corpus)


def test_a_given_automaton_is_used_as_is_or_copied(model):
    index = Automaton(ngram=10, max_nodes=10_000)
    assert make_drafter("racer", model, index=index).index.automaton is index
    copy = make_drafter("racer", model, index=index, index_scope="drafter").index.automaton
    assert copy is not index and copy.to_bytes() == index.to_bytes()


def test_an_index_from_another_vocabulary_is_a_clear_error(model):
    index = Automaton(ngram=4, max_nodes=10_000)
    big = model.config.vocab_size + 5
    for token in range(model.config.vocab_size):  # "1 2 t" continues beyond the vocabulary
        index.extend(np.asarray([1, 2, token, big, big + 1], dtype=np.int32))
        index.new_sequence()
    with pytest.raises(InvalidArgumentError, match=r"outside the model's vocabulary.*another tokenizer"):
        racer_rs.generate(model, [7, 1, 2], max_new_tokens=8, index=index, learn=False)


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"index": None, "learn": True}, InvalidArgumentError, "learn=True needs an index"),
        ({"index": None, "index_max_nodes": 100}, InvalidArgumentError, "index_max_nodes needs index='memory'"),
        ({"index": "memory", "index_max_nodes": 0}, InvalidArgumentError, "index_max_nodes must be >= 1"),
        ({"index": "memory", "index_max_nodes": 3}, InvalidArgumentError, "max_nodes"),
        ({"index": "memory", "index_scope": "thread"}, InvalidArgumentError, "index_scope"),
        ({"index": "memory", "learn": "yes"}, InvalidTypeError, "learn"),
        ({"index": 5}, InvalidTypeError, "index must be None, 'memory', a path"),
        ({"index": " "}, InvalidArgumentError, "index: empty path"),
        ({"index": "/no/such/file.idx"}, InvalidArgumentError, "index: file not found: /no/such/file.idx"),
    ],
)
def test_bad_index_options_are_clear_errors(model, options, error, fragment):
    with pytest.raises(error, match=fragment):
        make_drafter("racer", model, **options)


def test_index_option_limits(model, tmp_path):
    saved = tmp_path / "a.idx"
    Automaton().save(saved)
    with pytest.raises(InvalidArgumentError, match="index_max_nodes applies to index='memory' only"):
        make_drafter("racer", model, index=saved, index_max_nodes=1000)
    with pytest.raises(InvalidArgumentError, match=r"unknown option.*index"):
        make_drafter("racer_logits", model, index="memory")
    with pytest.raises(InvalidArgumentError, match="a shared index would go unread"):
        RacerDrafter(model, RacerOptions(index="memory"), use_retrieval=False)
    with pytest.raises(InvalidArgumentError, match="is a folder"):
        make_drafter("racer", model, index=tmp_path)
    damaged = tmp_path / "damaged.idx"
    damaged.write_bytes(saved.read_bytes()[:-3])
    with pytest.raises(CorruptFileError):
        make_drafter("racer", model, index=damaged)


def test_racer_tts_drafts_from_the_index_too(model):
    from tests.helpers import tiny_llama

    target = tiny_model("llama", seed=2, sharpen=4.0)
    draft = tiny_llama(5, vocab=target.config.vocab_size)
    prompt = random_prompt(9)
    expected = plain_greedy(target, prompt, 32)
    mats = []
    for _ in range(2):
        result = racer_rs.generate(
            target, prompt, method="racer_tts", draft_model=draft, max_new_tokens=32, capacity=16, index="memory"
        )
        assert result.tokens == expected
        mats.append(result.mat)
    assert result.extras["index_nodes"] > 0 and mats[1] > mats[0]


def test_path_objects_and_strings_name_the_same_file(model, tmp_path):
    path = tmp_path / "same.idx"
    Automaton().save(path)
    assert (
        make_drafter("racer", model, index=Path(path)).index.automaton
        is make_drafter("racer", model, index=str(path)).index.automaton
    )


# --- generate_batch: the call's rows share one index ------------------------------------

BATCH_NEW = 40


def repeat_after_a_finished_row(model, **options):
    """Rows 0 and 2 share a prompt; row 1 runs longer, so row 2 is admitted (max_batch_size=2)
    once row 0 has finished and been learned, while row 1 is still live: the pool is in use."""
    prompt, other = random_prompt(3), random_prompt(4)
    prompts = [prompt, other, prompt]
    results = racer_rs.generate_batch(
        model, prompts, max_new_tokens=[BATCH_NEW, 3 * BATCH_NEW, BATCH_NEW], capacity=16, max_batch_size=2, **options
    )
    for row, result in zip(prompts, results, strict=True):
        assert result.error is None
        assert result.tokens == plain_greedy(model, row, len(result.tokens))
    return results


@pytest.mark.parametrize("method", ["racer", "racer_retrieval"])
def test_a_row_admitted_later_drafts_from_a_finished_rows_response(model, method):
    learned = repeat_after_a_finished_row(model, method=method, index="memory", index_scope="drafter")
    assert learned[2].extras["draft_pool"] is True and learned[2].extras["index"] == "memory"
    assert learned[2].extras["index_nodes"] > 0
    assert learned[2].mat > learned[0].mat and learned[2].steps < learned[0].steps
    # Without learning, the repeated prompt drafts exactly as the first time.
    read_only = repeat_after_a_finished_row(model, method=method, index="memory", index_scope="drafter", learn=False)
    assert read_only[2].extras["index_nodes"] == 0
    assert read_only[2].accepted_lengths == read_only[0].accepted_lengths
    plain = repeat_after_a_finished_row(model, method=method, index=None)
    assert plain[2].extras["index"] is None
    assert plain[2].accepted_lengths == plain[0].accepted_lengths == read_only[0].accepted_lengths
    # The call's index is the method's default.
    default = repeat_after_a_finished_row(model, method=method)
    assert [r.accepted_lengths for r in default] == [r.accepted_lengths for r in learned]


def test_a_drafter_scope_index_belongs_to_its_call(model):
    first = repeat_after_a_finished_row(model, index="memory", index_scope="drafter")
    second = repeat_after_a_finished_row(model, index="memory", index_scope="drafter")
    assert [r.accepted_lengths for r in second] == [r.accepted_lengths for r in first]
    # A process-scope index outlives the call: the next call's first row already knows the answer.
    warm = repeat_after_a_finished_row(model, index="memory")
    again = repeat_after_a_finished_row(model, index="memory")
    assert again[0].mat > warm[0].mat


def test_rows_drafted_one_by_one_share_the_calls_index_too(model):
    # racer_tts drafts row by row (a draft model per row): the rows' drafters share one index.
    results = repeat_after_a_finished_row(
        model, method="racer_tts", draft_model=tiny_model("llama", seed=1), index="memory", index_scope="drafter"
    )
    assert "draft_pool" not in results[2].extras
    # Each row reports the index as it finished (rows 0, 2, 1): one index, growing.
    assert 0 < results[0].extras["index_nodes"] <= results[2].extras["index_nodes"] < results[1].extras["index_nodes"]
    alone = repeat_after_a_finished_row(model, method="racer_tts", draft_model=tiny_model("llama", seed=1), index=None)
    assert results[2].mat > alone[2].mat


def test_an_index_of_another_tokenizer_fails_its_rows_alone(model):
    # Only "1 2 t" (three tokens matched) continues beyond the vocabulary.
    index = Automaton(ngram=4, max_nodes=10_000, min_depth=3)
    big = model.config.vocab_size + 5
    for token in range(model.config.vocab_size):
        index.extend(np.asarray([1, 2, token, big, big + 1], dtype=np.int32))
        index.new_sequence()
    prompts = [[7, 1, 2], random_prompt(9)]
    results = racer_rs.generate_batch(model, prompts, max_new_tokens=8, index=index, learn=False)
    assert isinstance(results[0].error, InvalidArgumentError)
    assert "another tokenizer" in str(results[0].error)
    assert results[1].error is None and results[1].tokens == plain_greedy(model, prompts[1], 8)
