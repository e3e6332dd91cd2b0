"""`racer_rs.integrations._shared`: the copy-logit write order against a pure-Python oracle
(the chain fast path included), and the per-row vocabulary check against ``in_vocab``."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from racer_rs.integrations._shared import copy_logit_order, in_vocab, rows_in_vocab


def oracle_order(nodes: int, path: list[int]) -> list[int]:
    """Every node not on the path in index order, then the path as given."""
    return [i for i in range(nodes) if i not in path] + path


@given(st.integers(1, 12), st.data())
def test_a_chains_prefix_is_written_after_its_rejected_tail(nodes, data):
    accepted = data.draw(st.integers(0, nodes))
    got = copy_logit_order(nodes, range(accepted))
    assert got.tolist() == oracle_order(nodes, list(range(accepted)))
    assert got.tolist() == copy_logit_order(nodes, list(range(accepted))).tolist()  # the general path


@given(st.integers(1, 12), st.data())
def test_any_path_is_written_after_the_nodes_off_it(nodes, data):
    path = data.draw(st.lists(st.integers(0, nodes + 2), unique=True, max_size=nodes))
    assert copy_logit_order(nodes, path).tolist() == oracle_order(nodes, path)


@given(st.lists(st.lists(st.integers(-3, 40), min_size=2, max_size=2), min_size=1, max_size=6), st.integers(1, 40))
def test_rows_in_vocab_checks_each_row_as_in_vocab(rows, vocab):
    ids = np.array(rows, dtype=np.int64)
    assert rows_in_vocab(ids, vocab).tolist() == [in_vocab(row, vocab) for row in ids]
