"""A batch's copy-logit writes: every row's rows in one ``DraftPool.update_topk_many`` call,
written as one request's drafter writes them (the rejected nodes first, the accepted path last,
so that the accepted context's rows win where a token repeats)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from racer_rs import DraftTree
from racer_rs.drafters.base import StepOutcome
from racer_rs.engine.drafting import PoolDrafting, make_drafting

VOCAB = 64
BREADTH = 8


def _drafting() -> PoolDrafting:
    made = make_drafting("racer_logits", None, 4, VOCAB, {})
    assert isinstance(made, PoolDrafting)
    for row in (0, 1):
        made.pool.add(row, np.arange(10, 20, dtype=np.int32))
    return made


def _outcomes() -> list[StepOutcome]:
    rng = np.random.default_rng(0)
    # Row 0: root 5 with children 7 and 8, and 8 again under 7; the path 5 -> 8 is accepted, so
    # token 8's row must be the accepted node's, not the rejected one's written after it.
    branching = DraftTree(np.asarray([5, 7, 8, 8], dtype=np.int32), np.asarray([-1, 0, 0, 1], dtype=np.int32))
    plain = DraftTree.chain(np.asarray([9], dtype=np.int32))
    outcomes = []
    for tree, path in ((branching, [0, 2]), (plain, [0])):
        ids = rng.integers(0, VOCAB, (len(tree), BREADTH)).astype(np.int32)
        probs = rng.uniform(0, 1, (len(tree), BREADTH)).astype(np.float32)
        committed = np.asarray([*tree.tokens[path][1:], 30], dtype=np.int32)
        outcomes.append(StepOutcome(tree, path, 30, committed, topk_ids=ids, topk_probs=probs))
    return outcomes


def _one_call_per_row(drafting: PoolDrafting, outcomes: list[StepOutcome], accepted_last: bool) -> None:
    for row, outcome in enumerate(outcomes):
        rejected = [i for i in range(len(outcome.tree)) if i not in outcome.path]
        order = np.asarray(rejected + outcome.path if accepted_last else outcome.path + rejected)
        assert outcome.topk_ids is not None and outcome.topk_probs is not None
        drafting.pool.update_topk(row, outcome.tree.tokens[order], outcome.topk_ids[order], outcome.topk_probs[order])
    drafting.pool.extend([0, 1], [o.committed for o in outcomes])


def _drafts(drafting: PoolDrafting) -> list[list[int]]:
    batch = drafting.pool.propose([0, 1], np.asarray([8, 9], dtype=np.int32), 16)
    return [batch.tree(i).tokens.tolist() for i in range(2)]


def test_a_batch_writes_its_rows_as_each_request_would() -> None:
    batched, reference = _drafting(), _drafting()
    outcomes = _outcomes()
    batched.observe([0, 1], outcomes)
    _one_call_per_row(reference, outcomes, accepted_last=True)
    assert _drafts(batched) == _drafts(reference)


def test_the_order_of_the_writes_shows() -> None:
    """The counterpart: the accepted path written first leaves the rejected node's row."""
    batched, wrong = _drafting(), _drafting()
    outcomes = _outcomes()
    batched.observe([0, 1], outcomes)
    _one_call_per_row(wrong, outcomes, accepted_last=False)
    assert _drafts(batched) != _drafts(wrong)
