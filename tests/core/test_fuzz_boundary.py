"""Fuzzing of the Python boundary: arbitrary arguments give ValueError/TypeError or a result,
never a Rust panic (pyo3's PanicException derives from BaseException), a hang, or corruption."""

from __future__ import annotations

import contextlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from racer_rs import Automaton, DraftTree, LogitsTable, build_draft_tree, prompt_lookup

scalars = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.none(),
    st.text(max_size=3),
    st.booleans(),
)
arrays = st.one_of(
    st.lists(st.integers(-(2**40), 2**40), max_size=20),
    st.lists(scalars, max_size=5),
    st.builds(
        lambda dtype, shape, seed: np.random.default_rng(seed).integers(-3, 300, size=shape).astype(dtype),
        st.sampled_from([np.int32, np.int64, np.int8, np.uint16, np.float32, np.bool_]),
        st.sampled_from([(0,), (5,), (3, 2), (2, 2, 2), ()]),
        st.integers(0, 1000),
    ),
    scalars,
)
anything = st.one_of(arrays, scalars)


def call(fn, *args, **kwargs):
    with contextlib.suppress(ValueError, TypeError):
        fn(*args, **kwargs)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), anything, anything), min_size=1, max_size=8))
def test_random_calls_never_panic_or_corrupt(ops):
    a = Automaton(ngram=4, capacity=60)
    table = LogitsTable(256, top_k=3)
    a.extend([1, 2, 3, 1, 2])
    for op, x, y in ops:
        if op == 0:
            call(a.extend, x)
        elif op == 1:
            call(a.retrieve, x, y)
        elif op == 2:
            call(a.count, x)
        elif op == 3:
            call(table.update, x, y)
        elif op == 4:
            call(table.expand, x, y)
        elif op == 5:
            call(build_draft_tree, a, table, x, y)
        elif op == 6:
            call(DraftTree, x, y)
        elif op == 7:
            call(prompt_lookup, x, num_pred=y)
        elif op == 8:
            call(table.expand_static, 1, x, y)
        elif op == 9:
            call(build_draft_tree, a, table, 1, 16, draft_chain=x)
        elif op == 10:
            call(Automaton.from_bytes, x)
        elif op == 11:
            call(a.retrieve, 1, 8, context=x)
        else:
            call(build_draft_tree, a, table, 1, 16, shared=x)
        a.check_integrity()
        assert len(a) <= 60
