"""A shared index in ``generate_batch``: the rows of one call read and teach one index.

* The pooled racer methods draft every row from the index in their one ``DraftPool.propose``
  call, and a finished row's response is learned for the rows admitted after it (as
  SuffixDecoding's global tree learns from finished requests); outputs stay plain greedy.
* ``index_scope="drafter"``: the index belongs to the call (the next call starts empty), also
  for methods drafted row by row.
* An index of another tokenizer fails its rows with a clear error, the call does not.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs import Automaton  # noqa: E402
from racer_rs.drafters.index import forget_indexes  # noqa: E402
from racer_rs.errors import InvalidArgumentError  # noqa: E402
from tests.helpers import plain_greedy, random_prompt, tiny_model  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

NEW = 40


@pytest.fixture(autouse=True)
def _fresh_process_indexes():
    forget_indexes()
    yield
    forget_indexes()


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0, sharpen=4.0)


def repeat_after_a_finished_row(model, **options):
    """Rows 0 and 2 share a prompt; row 1 runs longer, so row 2 is admitted (max_batch_size=2)
    once row 0 has finished and been learned, while row 1 is still live: the pool is in use."""
    prompt, other = random_prompt(3), random_prompt(4)
    prompts = [prompt, other, prompt]
    results = racer_rs.generate_batch(
        model, prompts, max_new_tokens=[NEW, 3 * NEW, NEW], capacity=16, max_batch_size=2, **options
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
    plain = repeat_after_a_finished_row(model, method=method)
    assert plain[2].extras["index"] is None
    assert plain[2].accepted_lengths == plain[0].accepted_lengths == read_only[0].accepted_lengths


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
    alone = repeat_after_a_finished_row(model, method="racer_tts", draft_model=tiny_model("llama", seed=1))
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
