"""RACER's defaults under ``capacity="auto"``: calibrated scored trees retrieve from one-token
matches (``min_depth`` 1, their cells calibrated by match length), the halving tree of a fixed
capacity keeps 2, and a caller's own ``min_depth`` always wins."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs
from racer_rs.drafters import calibrated_options
from racer_rs.drafters.racer import CALIBRATED_MIN_DEPTH, RacerOptions
from racer_rs.engine import drafting
from racer_rs.engine.drafting import PoolDrafting, RowDrafting, make_drafting
from tests.helpers import REPEATING_PROMPT, plain_greedy, tiny_model


def min_depth(made: Any) -> int:
    """The retrieval ``min_depth`` a drafting uses (its pool's, or its row drafters': the first
    one and one built for a later row)."""
    if isinstance(made, PoolDrafting):
        return int(made.pool.min_depth)
    assert isinstance(made, RowDrafting)
    depths = {made.idle[0].options.min_depth, made.build().options.min_depth}
    assert len(depths) == 1
    return depths.pop()


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("method", ["racer", "racer_scored"])
def test_calibrated_scored_trees_match_one_token(method: str, rows: int) -> None:
    assert CALIBRATED_MIN_DEPTH == 1 < RacerOptions.min_depth
    made = make_drafting(method, None, rows, 64, {}, calibrated=True)
    assert min_depth(made) == CALIBRATED_MIN_DEPTH
    assert min_depth(make_drafting(method, None, rows, 64, {}, calibrated=False)) == RacerOptions.min_depth


@pytest.mark.parametrize("method", ["racer", "racer_scored"])
def test_the_caller_s_min_depth_wins(method: str) -> None:
    assert calibrated_options(method, {"min_depth": 3}) == {"min_depth": 3}
    assert min_depth(make_drafting(method, None, 4, 64, {"min_depth": 3}, calibrated=True)) == 3


@pytest.mark.parametrize("method", ["racer_retrieval", "racer_logits", "pld", "suffix"])
def test_other_methods_keep_their_options(method: str) -> None:
    assert calibrated_options(method, {}) == {}


def test_auto_drafts_from_one_token_matches_and_stays_lossless(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default reaches the drafter ``generate`` builds, and outputs stay plain greedy."""
    seen: list[int] = []
    original = drafting.make_drafter

    def recording(method: str, model: Any, **options: Any) -> Any:
        made = original(method, model, **options)
        seen.append(made.options.min_depth)
        return made

    monkeypatch.setattr(drafting, "make_drafter", recording)
    model = tiny_model("llama", seed=0, sharpen=4.0)
    result = racer_rs.generate(model, REPEATING_PROMPT, max_new_tokens=24, capacity="auto")
    assert seen and set(seen) == {CALIBRATED_MIN_DEPTH}
    assert list(result.tokens) == plain_greedy(model, REPEATING_PROMPT, 24)
