"""Rows leaving the batch: the rows that stay fill the finished rows' places from the end, so
only as many cache rows move as rows finished."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("transformers")

from racer_rs.engine.decode_engine import fill_holes


@given(st.lists(st.booleans(), max_size=40))
def test_every_live_row_stays_once_and_only_holes_are_refilled(finished: list[bool]) -> None:
    order = fill_holes(finished)
    alive = [row for row, done in enumerate(finished) if not done]
    assert sorted(order) == alive
    moved = [place for place, row in enumerate(order) if row != place]
    assert len(moved) == sum(finished[: len(alive)])  # one move per hole among the kept places
    assert all(finished[place] for place in moved)


def test_a_finished_middle_row_takes_the_last_row() -> None:
    assert fill_holes([False, True, False, False]) == [0, 3, 2]
    assert fill_holes([True, True, False]) == [2]
    assert fill_holes([False, False, True]) == [0, 1]
