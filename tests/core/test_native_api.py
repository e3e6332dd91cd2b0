"""The binding contract: types, shapes, exceptions, and that bad input never corrupts state."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

import racer_rs
from racer_rs import Automaton, DraftTree, LogitsTable, build_draft_tree, prompt_lookup


def test_import_does_not_pull_in_torch():
    code = "import sys, racer_rs; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_public_names_and_version():
    assert isinstance(racer_rs.__version__, str) and racer_rs.__version__.count(".") == 2
    for name in ("Automaton", "DraftTree", "LogitsTable", "build_draft_tree", "prompt_lookup"):
        assert name in racer_rs.__all__
    assert Automaton.__module__ == "racer_rs"


def test_token_inputs_accept_lists_int32_int64_and_strided_arrays():
    for tokens in (
        [1, 2, 3, 1, 2],
        np.array([1, 2, 3, 1, 2], dtype=np.int32),
        np.array([1, 2, 3, 1, 2], dtype=np.int64),
        np.array([1, 9, 2, 9, 3, 9, 1, 9, 2, 9], dtype=np.int32)[::2],
    ):
        a = Automaton(ngram=3, capacity=100)
        a.extend(tokens)
        assert a.count([1, 2]) == 2
        assert a.count(np.array([2, 3], dtype=np.int64)) == 1


def test_draft_tree_outputs_are_typed_numpy_arrays():
    t = DraftTree([5, 1, 2, 3], [-1, 0, 0, 1])
    for arr in (t.tokens, t.parents, t.depths):
        assert arr.dtype == np.int32 and arr.ndim == 1 and len(arr) == 4
    assert t.attention_mask().dtype == np.bool_ and t.attention_mask().shape == (4, 4)
    assert t.leaf_paths().dtype == np.int32
    assert t.leaf_paths().tolist() == [[0, 2, -1], [0, 1, 3]]
    assert t.greedy_accept([1, 3, 0, 7]) == ([0, 1, 3], 7)
    assert t.max_depth == 2
    assert pickle.loads(pickle.dumps(t)).parents.tolist() == [-1, 0, 0, 1]
    assert DraftTree.chain([4, 5, 6]).parents.tolist() == [-1, 0, 1]


BAD_CONSTRUCTORS = [
    (lambda: Automaton(ngram=1), ValueError, "ngram"),
    (lambda: Automaton(ngram=10, capacity=54), ValueError, "capacity"),
    (lambda: Automaton(ngram=4, capacity=-5), ValueError, "capacity"),
    (lambda: Automaton(ngram=4, min_depth=0), ValueError, "min_depth"),
    (lambda: Automaton(ngram=4, min_depth=5), ValueError, "min_depth"),
    (lambda: Automaton(ngram="4"), TypeError, "ngram"),
    (lambda: Automaton(ngram=4, capacity=2**70), ValueError, "capacity"),
    (lambda: Automaton(ngram=2**70), ValueError, "ngram"),
    (lambda: LogitsTable(0), ValueError, "vocab_size"),
    (lambda: LogitsTable(2**40), ValueError, "vocab_size"),
    (lambda: LogitsTable(2**31 - 1, top_k=8), ValueError, "vocab_size"),
    (lambda: LogitsTable(10, top_k=-(2**70)), ValueError, "top_k"),
    (lambda: LogitsTable(10, top_k=0), ValueError, "top_k"),
    (lambda: DraftTree([], []), ValueError, "tokens"),
    (lambda: DraftTree([1, 2], [-1]), ValueError, "parents"),
    (lambda: DraftTree([1, 2], [0, 0]), ValueError, "parents"),
    (lambda: DraftTree([1, 2, 3], [-1, 2, 0]), ValueError, "parents"),
    (lambda: DraftTree([1, 2, 2], [-1, 0, 0]), ValueError, "tokens"),
    (lambda: DraftTree([1, -2], [-1, 0]), ValueError, "tokens"),
    (lambda: DraftTree([1.5, 2], [-1, 0]), TypeError, "tokens"),
    (lambda: DraftTree.chain([]), ValueError, "tokens"),
    (lambda: prompt_lookup([1, 2], max_ngram=0), ValueError, "max_ngram"),
    (lambda: prompt_lookup([1, 2], min_ngram=4), ValueError, "min_ngram"),
    (lambda: prompt_lookup([1, 2], num_pred=0), ValueError, "num_pred"),
    (lambda: prompt_lookup(np.zeros((2, 2), dtype=np.int32)), ValueError, "context"),
]


@pytest.mark.parametrize(("call", "exc", "arg"), BAD_CONSTRUCTORS)
def test_bad_arguments_raise_named_errors(call, exc, arg):
    with pytest.raises(exc, match=arg):
        call()


def filled() -> tuple[Automaton, LogitsTable]:
    a = Automaton(ngram=4, capacity=200)
    a.extend([1, 2, 3, 4, 1, 2, 3, 5, 1, 2])
    table = LogitsTable(10, top_k=2)
    table.update([1, 2, 3], np.array([[2, 3], [3, 4], [4, 5]], dtype=np.int32))
    return a, table


def snapshot(a: Automaton, table: LogitsTable) -> tuple:
    tree = build_draft_tree(a, table, 3, 64)
    return (
        len(a),
        a.match_length,
        a.count([1, 2]),
        a.count([2, 3, 4]),
        len(table),
        table.row(1).tolist(),
        tree.tokens.tolist(),
        tree.parents.tolist(),
    )


BAD_CALLS = [
    (lambda a, t: a.extend([1, -1]), ValueError, "tokens"),
    (lambda a, t: a.extend([1, 2**40]), ValueError, "tokens"),
    (lambda a, t: a.extend(np.array([1.0, 2.0])), TypeError, "tokens"),
    (lambda a, t: a.extend(np.array([True, False])), TypeError, "tokens"),
    (lambda a, t: a.extend(np.zeros((2, 2), dtype=np.int32)), ValueError, "tokens"),
    (lambda a, t: a.extend("abc"), TypeError, "tokens"),
    (lambda a, t: a.extend(None), TypeError, "tokens"),
    (lambda a, t: a.extend([1, "x"]), TypeError, "tokens"),
    (lambda a, t: a.extend_after([1, -1], [2]), ValueError, "lead"),
    (lambda a, t: a.extend_after([1], [2, -1]), ValueError, "tokens"),
    (lambda a, t: a.extend_after(np.array([1.0]), [2]), TypeError, "lead"),
    (lambda a, t: a.count([]), ValueError, "pattern"),
    (lambda a, t: a.count([1, 2, 3, 4, 5]), ValueError, "pattern"),
    (lambda a, t: a.count([-3]), ValueError, "pattern"),
    (lambda a, t: a.retrieve(-1, 10), ValueError, "next_token"),
    (lambda a, t: a.retrieve(1, 0), ValueError, "budget"),
    (lambda a, t: a.retrieve(1, -3), ValueError, "budget"),
    (lambda a, t: a.retrieve(2**70, 3), ValueError, "next_token"),
    (lambda a, t: a.chain(-1, 3), ValueError, "next_token"),
    (lambda a, t: a.chain(1, -1), ValueError, "max_len"),
    (lambda a, t: a.chain(1, 2**20), ValueError, "max_len"),
    (lambda a, t: a.chain(1, 3, [1, -2]), ValueError, "context"),
    (lambda a, t: a.chain(1, 3, np.array([1.0])), TypeError, "context"),
    (lambda a, t: a.chain(1, 3.5), TypeError, "max_len"),
    (lambda a, t: t.update([1, 2], np.zeros((3, 2), dtype=np.int32)), ValueError, "topk_ids"),
    (lambda a, t: t.update([1], np.zeros((1, 3), dtype=np.int32)), ValueError, "topk_ids"),
    (lambda a, t: t.update([1], np.zeros(2, dtype=np.int32)), ValueError, "topk_ids"),
    (lambda a, t: t.update([1], np.zeros((1, 2), dtype=np.float32)), TypeError, "topk_ids"),
    (lambda a, t: t.update([1, 11], np.zeros((2, 2), dtype=np.int32)), ValueError, "tokens"),
    (lambda a, t: t.update([1], np.array([[1, 10]], dtype=np.int32)), ValueError, "topk_ids"),
    (lambda a, t: t.update([-1], np.zeros((1, 2), dtype=np.int32)), ValueError, "tokens"),
    (lambda a, t: t.expand(10, 5), ValueError, "root"),
    (lambda a, t: t.expand(1, 0), ValueError, "budget"),
    (lambda a, t: t.expand(1, 5, exempt_depth=-1), ValueError, "exempt_depth"),
    (lambda a, t: t.expand_static(1, [-1, 0], [0, 2]), ValueError, "ranks"),
    (lambda a, t: t.expand_static(1, [-1, 1], [0, 0]), ValueError, "parents"),
    (lambda a, t: t.row(-1), ValueError, "token"),
    (lambda a, t: t.update([1], np.zeros((1, 2), dtype=np.int32), np.ones((1, 3))), ValueError, "topk_probs"),
    (lambda a, t: t.update([1], np.zeros((1, 2), dtype=np.int32), np.full((1, 2), 1.5)), ValueError, "topk_probs"),
    (lambda a, t: t.update([1], np.zeros((1, 2), dtype=np.int32), np.full((1, 2), np.nan)), ValueError, "topk_probs"),
    (
        lambda a, t: t.update([1], np.zeros((1, 2), dtype=np.int32), np.ones((1, 2), dtype=np.int32)),
        TypeError,
        "topk_probs",
    ),
    (lambda a, t: build_draft_tree(a, t, 3, 0), ValueError, "capacity"),
    (lambda a, t: build_draft_tree(a, t, 10, 8), ValueError, "next_token"),
    (lambda a, t: build_draft_tree(a, t, -1, 8), ValueError, "next_token"),
    (lambda a, t: build_draft_tree(a, t, 3, 8, draft_chain=[1, 99]), ValueError, "draft_chain"),
    (lambda a, t: build_draft_tree(t, a, 3, 8), TypeError, "automaton"),
    (lambda a, t: build_draft_tree(a, t, 3, 8, scored=True, min_score=1.5), ValueError, "min_score"),
    (lambda a, t: build_draft_tree(a, t, 3, 8, scored=True, min_score=float("nan")), ValueError, "min_score"),
    (lambda a, t: DraftTree([1, 2], [-1, 0]).greedy_accept([1]), ValueError, "predicted"),
]


@pytest.mark.parametrize(("call", "exc", "arg"), BAD_CALLS)
def test_failed_calls_name_the_argument_and_leave_state_unchanged(call, exc, arg):
    a, table = filled()
    before = snapshot(a, table)
    with pytest.raises(exc, match=arg):
        call(a, table)
    assert snapshot(a, table) == before
    a.check_integrity()


def test_huge_budgets_are_rejected_and_huge_lookups_are_just_large():
    a, table = filled()
    for call in (
        lambda: a.retrieve(1, 2**70),
        lambda: build_draft_tree(a, table, 1, 2**62),
        lambda: table.expand(1, 2**21),
    ):
        with pytest.raises(ValueError, match=r"budget|capacity"):
            call()
    table.update(np.arange(10), (np.arange(20).reshape(10, 2) + 3) % 10)  # every row written
    assert len(build_draft_tree(a, table, 1, 2**20)) == 2**20  # large trees do work
    assert prompt_lookup([1, 2, 1], max_ngram=2**70, num_pred=2**70).tolist() == [2, 1]


def test_expand_static_fills_a_template_and_drops_unseen_rows():
    table = LogitsTable(10, top_k=2)
    table.update([1, 2], np.array([[2, 3], [4, 5]], dtype=np.int32))
    tree = table.expand_static(1, [-1, 0, 0, 1, 2], [0, 0, 1, 0, 0])
    # root 1 -> rank0 = 2 (merged twice), rank1 = 3; 2 -> 4; 3 has no row.
    assert tree.tokens.tolist() == [1, 2, 3, 4]
    assert tree.parents.tolist() == [-1, 0, 0, 1]


def test_copy_logit_probabilities_are_stored_or_rank_priors():
    table = LogitsTable(10, top_k=3)
    table.update([4], np.array([[1, 2, 3]], dtype=np.int32), np.array([[0.5, 0.25, 0.125]]))
    assert table.row_probs(4).tolist() == [0.5, 0.25, 0.125]
    table.update([5], np.array([[1, 2, 3]], dtype=np.int32))
    assert table.row_probs(5).tolist() == [0.5, 0.25, 0.125]
    assert table.row_probs(6) is None


def test_copy_logit_last_write_wins():
    table = LogitsTable(10, top_k=2)
    table.update([4, 4], np.array([[1, 2], [7, 8]], dtype=np.int64))
    assert table.row(4).tolist() == [7, 8]
    assert len(table) == 1
    table.clear()
    assert table.row(4) is None


def test_clear_and_new_sequence():
    a, _ = filled()
    a.new_sequence()
    assert a.match_length == 0
    a.extend([2, 3])
    assert a.count([1, 2, 3]) == 2  # the boundary is never spanned: no "2 2 3"
    assert a.count([2, 2]) == 0
    a.clear()
    assert len(a) == 0 and a.count([1]) == 0
    a.check_integrity()


def test_memory_and_repr():
    a, table = filled()
    assert a.memory_bytes() > 0 and table.memory_bytes() >= 10 * 2 * 4
    assert "Automaton(ngram=4" in repr(a) and "LogitsTable(vocab_size=10" in repr(table)
