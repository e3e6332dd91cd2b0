"""The drafting switch: a batched step drafts or decodes plainly by measured tokens per second.

Checked: the switch's schedule against its definition (an untried mode first, at a new batch
size the mode faster at the nearest measured size, then the faster one, the slower one after
waits of 2, 4, 8... blocks up to SWITCH_EXPLORE, the waits starting over when the verdict
changes), that plain steps still feed the drafters' tables
and keep every row lossless (greedy and seeded sampling, modes alternating step by step), that
they teach the batch's cost curve its size 1, and that a switch ignoring the rates fails the
schedule check.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs._native import DraftTree  # noqa: E402
from racer_rs.autosize import batch_sizer  # noqa: E402
from racer_rs.autosize.cost_model import CostModel  # noqa: E402
from racer_rs.autosize.sizer import SizeChoice  # noqa: E402
from racer_rs.drafters.base import Proposal  # noqa: E402
from racer_rs.engine import capacity, drafting  # noqa: E402
from racer_rs.engine.capacity import (  # noqa: E402
    SWITCH_BLOCK,
    SWITCH_EXPLORE,
    SWITCH_FIRST_EXPLORE,
    SWITCH_MARGIN,
    DraftingSwitch,
)
from tests.helpers import REPEATING_PROMPT, plain_greedy, random_prompt, tiny_model  # noqa: E402

PROMPTS = [REPEATING_PROMPT, random_prompt(1, 9), random_prompt(2, 30)]
BUDGETS = [40, 24, 33]


def run_blocks(
    switch: DraftingSwitch, blocks: int, rates: dict[bool, float] | list[dict[bool, float]], batch: int = 4
) -> list[bool]:
    """Every block's mode, each step committing ``rates[mode]`` tokens in one second (``rates``
    may give every block its own)."""
    modes = []
    for index in range(blocks):
        rate = rates[index] if isinstance(rates, list) else rates
        block = [switch.drafts(batch) for _ in range(SWITCH_BLOCK)]
        assert len(set(block)) == 1  # one mode per block
        modes.append(block[0])
        for mode in block:
            switch.observe(batch, mode, int(rate[mode] * 100), 100.0)
    return modes


def expected_blocks(blocks: int, faster: bool) -> list[bool]:
    """The definition, where one mode stays faster: drafting first, then plain (untried), then
    the faster mode, the slower one after 2, 4, 8... blocks of it (at most SWITCH_EXPLORE)."""
    modes = [True, False]
    wait = SWITCH_FIRST_EXPLORE
    while len(modes) < blocks:
        modes += [faster] * wait + [not faster]
        wait = min(2 * wait, SWITCH_EXPLORE)
    return modes[:blocks]


@pytest.mark.parametrize("faster", [True, False])
def test_the_switch_runs_the_faster_mode_and_explores_the_other(faster: bool) -> None:
    rates = {faster: 1.2, not faster: 1.0}
    blocks = 4 * SWITCH_EXPLORE + 3
    assert run_blocks(DraftingSwitch(), blocks, rates) == expected_blocks(blocks, faster)


def test_drafting_within_the_margin_of_plain_steps_does_not_run() -> None:
    rates = {True: 1 + SWITCH_MARGIN / 2, False: 1.0}  # drafting ahead, by less than the margin
    blocks = 4 * SWITCH_EXPLORE + 3
    assert run_blocks(DraftingSwitch(), blocks, rates) == expected_blocks(blocks, False)


def test_a_verdict_from_the_first_steps_is_checked_again_soon() -> None:
    """Drafting loses while contexts are short (its first block), then pays: the switch runs it
    again after SWITCH_FIRST_EXPLORE blocks of plain steps and keeps it (a fixed wait of
    SWITCH_EXPLORE blocks would decode plainly for 16 blocks)."""
    early, later = {True: 0.95, False: 1.0}, {True: 2.4, False: 1.0}
    blocks = 2 + SWITCH_FIRST_EXPLORE + 8
    modes = run_blocks(DraftingSwitch(), blocks, [early] * 2 + [later] * (blocks - 2))
    explored = 2 + SWITCH_FIRST_EXPLORE  # the block index where drafting runs again
    assert modes[:explored] == [True] + [False] * (explored - 1)
    assert all(modes[explored : explored + SWITCH_FIRST_EXPLORE + 1])  # drafting won: it stays
    assert modes.count(False) <= explored + 1  # plain only to check the new verdict once


def test_one_slow_step_counts_as_a_clipped_one() -> None:
    switch = DraftingSwitch()
    for _ in range(2 * SWITCH_BLOCK):
        switch.observe(4, True, 4, 1.0)
    switch.observe(4, True, 4, 100.0)  # a cache growth, not the mode
    _tokens, seconds, steps = switch.totals[4][True]
    assert seconds / steps < 1.1


def test_a_switch_that_ignores_the_rates_fails_the_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DraftingSwitch, "rate", lambda self, batch, mode: 1.0)  # every mode alike
    blocks = 2 * SWITCH_EXPLORE + 3
    assert run_blocks(DraftingSwitch(), blocks, {True: 1.0, False: 1.2}) != expected_blocks(blocks, False)


def test_batch_sizes_are_measured_apart() -> None:
    switch = DraftingSwitch()
    run_blocks(switch, 4, {True: 1.0, False: 2.0}, batch=8)
    assert switch.rate(8, False) == pytest.approx(2.0)
    assert switch.rate(2, True) is None


@pytest.mark.parametrize("faster", [True, False])
def test_a_new_batch_size_starts_with_its_nearest_size_s_verdict(faster: bool) -> None:
    """A shrinking batch's new sizes start with the mode that was faster at the nearest size
    where both ran (of two as near, the larger), then try the other one."""

    def measured(sizes: dict[int, bool]) -> DraftingSwitch:
        switch = DraftingSwitch()
        for size, fast in sizes.items():
            run_blocks(switch, 4, {fast: 1.2, not fast: 1.0}, batch=size)
        return switch

    assert run_blocks(measured({16: faster, 8: not faster}), 2, {True: 1.0, False: 1.0}, batch=13) == [
        faster,
        not faster,
    ]
    assert run_blocks(measured({16: faster, 8: not faster}), 1, {True: 1.0, False: 1.0}, batch=10) == [not faster]
    assert run_blocks(measured({4: faster, 8: not faster}), 1, {True: 1.0, False: 1.0}, batch=6) == [not faster]
    # A size where one mode alone ran says nothing; a switch that knows nothing drafts first.
    one_mode = DraftingSwitch()
    one_mode.observe(16, False, 16, 1.0)
    assert one_mode.drafts(13)
    assert DraftingSwitch().drafts(5)


def test_a_later_call_reuses_the_process_s_switch() -> None:
    key = "a model|racer|greedy"
    assert capacity.drafting_switch(key) is capacity.drafting_switch(key)
    assert capacity.drafting_switch(key) is not capacity.drafting_switch("another|racer|greedy")


def alternating(self: Any, batch: int) -> bool:
    """Modes alternating step by step: every row meets plain steps between drafted ones."""
    self.step_count = getattr(self, "step_count", 0) + 1
    return batch == 1 or self.step_count % 2 == 0


@pytest.mark.parametrize("method", ["racer", "racer_scored"])
def test_plain_steps_keep_every_row_lossless_and_feed_the_tables(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    monkeypatch.setattr(capacity.AutoCapacity, "drafts", alternating)
    topk_rows: list[int] = []
    observe = drafting.PoolDrafting.observe

    def counting(self: Any, rows: Any, outcomes: Any) -> Any:
        topk_rows.extend(o.topk_ids is not None for o in outcomes)
        return observe(self, rows, outcomes)

    monkeypatch.setattr(drafting.PoolDrafting, "observe", counting)
    model = tiny_model("llama", seed=0, sharpen=4.0)
    results = racer_rs.generate_batch(model, PROMPTS, method=method, max_new_tokens=BUDGETS, capacity="auto")
    for prompt, budget, result in zip(PROMPTS, BUDGETS, results, strict=True):
        assert result.tokens == plain_greedy(model, prompt, budget)
        report = result.extras["auto_capacity"]
        assert sum(report["chosen_sizes"].values()) == report["steps"]
    # Plain steps carry their roots' top-k too: a table starved during plain steps would draft
    # badly when drafting resumes, and the switch would measure that handicap, not drafting.
    assert topk_rows and all(topk_rows)
    assert sum(max(r.accepted_lengths) > 1 for r in results) >= 1  # drafted steps still draft


def test_plain_steps_keep_seeded_sampling_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("llama", seed=0, sharpen=1.0)
    kwargs: dict[str, Any] = {"method": "racer", "max_new_tokens": 24, "temperature": 0.9}
    # Row ``b`` of a batch seeded ``s`` draws what generate(seed=s + b) draws.
    alone = [racer_rs.generate(model, p, capacity=8, seed=5 + b, **kwargs).tokens for b, p in enumerate(PROMPTS)]
    monkeypatch.setattr(capacity.AutoCapacity, "drafts", alternating)
    batch = racer_rs.generate_batch(model, PROMPTS, capacity="auto", seed=5, **kwargs)
    assert [r.tokens for r in batch] == alone


def test_plain_steps_price_a_batch_s_size_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """The switch's plain steps teach the batch's cost curve its size 1, which the cut prices
    every node against. Measured flat (a padded size 2 timed at a plain step's cost), the curve
    meets plain steps of 1.0 s and drafted steps padded to 2 of 1.3 s, block by block: it must
    learn that size 2 costs about 1.3x size 1. Fed the drafted steps alone, its load followed
    their 1.3 s and priced size 1 (never met) there too, so a padded size 2 looked free."""
    monkeypatch.setenv("RACER_RS_CACHE", str(tmp_path))
    sizes = [1, 2, 4, 8, 16]
    measured = CostModel(sizes, {128: [1.0, 1.0, 1.2, 1.6, 2.4], 1024: [1.0, 1.0, 1.2, 1.6, 2.4]})

    class Costs:
        def for_batch(self, batch: int) -> CostModel:
            return measured

        def save(self) -> None:
            pass

    monkeypatch.setattr(batch_sizer, "batch_costs", lambda model, max_capacity, batch: Costs())
    policy = capacity.AutoCapacity(tiny_model("llama"), "racer", True, 16, 4)
    rows = [0, 1, 2, 3]
    for row in rows:
        policy.admit(row)
    pair = Proposal(DraftTree.chain(np.asarray([3, 4], dtype=np.int32)))
    root = Proposal(DraftTree.chain(np.asarray([3], dtype=np.int32)))
    choice = SizeChoice(np.asarray([0, 1]), 1.5, 0.5)

    def step(drafted: bool) -> capacity.StepReport:
        proposals = [pair if drafted else root] * len(rows)
        return capacity.StepReport(
            rows=rows,
            full=proposals,
            verified=proposals,
            choices=[choice if drafted else None] * len(rows),
            paths=[[0, 1] if drafted else [0]] * len(rows),
            bonuses=[5] * len(rows),
            randomized=[False] * len(rows),
            committed=[2 if drafted else 1] * len(rows),
            context=300,
            padded=2 if drafted else 1,
            forward=1.2 if drafted else 0.9,
            step=1.3 if drafted else 1.0,
            drafted=drafted,
        )

    for _ in range(30):
        for drafted in (False, True):
            for _ in range(SWITCH_BLOCK):
                policy.observe(step(drafted))
    one, two = measured.step_seconds(np.asarray([1, 2]), 300)
    assert one == pytest.approx(1.0, rel=0.1)
    assert two / one == pytest.approx(1.3, rel=0.08)
