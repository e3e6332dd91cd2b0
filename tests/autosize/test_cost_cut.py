"""The cost-based cut of ``racer``'s scored tree at ``capacity="auto"``.

A node enters the verified tree only if its probability pays for what one more node costs in this
forward, read from the cost curve at the step's context length: with a flat curve the tree fills
its capacity; with a steep one it keeps exactly the nodes that pay. Each check is also run on a
counterpart that ignores the curve (a fixed probability threshold, as SuffixDecoding's
``min_token_prob``; or the curve read at another context length) and shown to fail there.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from racer_rs.autosize.calibration import EdgeCalibration  # noqa: E402
from racer_rs.autosize.cost_model import CostModel  # noqa: E402
from racer_rs.autosize.sizer import SizeChoice, TreeSizer  # noqa: E402
from racer_rs.drafters.base import RequestStart  # noqa: E402
from racer_rs.drafters.racer import racer  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB, BREADTH, CAPACITY = 40, 8, 24
SIZES = [1, 2, 4, 8, 16, 32, 64]
Choose = Callable[[TreeSizer, object, int], SizeChoice]


def linear_cost(per_node_short: float, per_node_long: float) -> CostModel:
    """t(n) = 1 + per_node * (n - 1), at 128 tokens of context and at 1024."""
    return CostModel(
        SIZES,
        {
            128: [1 + per_node_short * (n - 1) for n in SIZES],
            1024: [1 + per_node_long * (n - 1) for n in SIZES],
        },
    )


def drafted(seed: int):
    """``racer``'s tree (as drafted with ``capacity="auto"``: with a calibration) and its sizer's
    calibration, on a repetitive random prompt with a filled copy-logit table."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, VOCAB, size=rng.integers(3, 8)) for _ in range(6)]
    last = phrases[int(rng.integers(0, 6))]  # the prompt ends inside a phrase seen before
    prompt = np.concatenate([phrases[i] for i in rng.integers(0, 6, size=40)] + [last[:2]]).astype(np.int32)
    topk = np.stack([rng.permutation(VOCAB)[:BREADTH] for _ in prompt]).astype(np.int32)
    probs = np.sort(rng.dirichlet(np.ones(BREADTH + 2), size=len(prompt))[:, :BREADTH], axis=1)[:, ::-1]
    drafter = racer()
    drafter.begin(
        RequestStart(
            prompt_ids=prompt,
            prompt_topk=topk,
            prompt_logits_last=torch.zeros(VOCAB),
            vocab_size=VOCAB,
            device=torch.device("cpu"),
            dtype=torch.float32,
            prompt_topk_probs=np.ascontiguousarray(probs, dtype=np.float32),
            prompt_topk_positions=np.arange(len(prompt)),
        )
    )
    calibration = EdgeCalibration()
    proposal = drafter.propose(prompt, int(last[2]), CAPACITY, edge_calibration=calibration.probabilities())
    return proposal.tree, calibration


def rates(sizer: TreeSizer, tree, context: int) -> np.ndarray:
    """Expected tokens per second of every best-first prefix size 1.. (the cost at ``context``)."""
    corrected = sizer.rank(tree).corrected
    expected = 1 + np.concatenate([[0.0], np.cumsum(corrected)])
    return expected / sizer.cost.step_seconds(np.arange(1, len(expected) + 1), context)


def fills_capacity(choose: Choose, seed: int) -> bool:
    tree, calibration = drafted(seed)
    sizer = TreeSizer(linear_cost(0.0, 0.0), calibration, CAPACITY)
    return len(choose(sizer, tree, 128).keep) == min(CAPACITY, len(tree))


def keeps_only_paying_nodes(choose: Choose, seed: int, context: int = 128, per_node: float = 0.2) -> bool:
    """Every kept node raises the step's rate and the best left-out one would lower it."""
    tree, calibration = drafted(seed)
    sizer = TreeSizer(linear_cost(per_node, per_node), calibration, CAPACITY)
    n = len(choose(sizer, tree, context).keep)
    rate = rates(sizer, tree, context)
    kept_pay = all(rate[k] > rate[k - 1] for k in range(1, n))
    next_fails = n == len(rate) or rate[n] <= rate[n - 1]
    return kept_pay and next_fails


def follows_the_context_s_curve(choose: Choose, seed: int) -> bool:
    """Flat at a short context, steep at a long one: the long step keeps fewer nodes."""
    tree, calibration = drafted(seed)
    sizer = TreeSizer(linear_cost(0.0, 0.4), calibration, CAPACITY)
    short, long = len(choose(sizer, tree, 128).keep), len(choose(sizer, tree, 1024).keep)
    rate = rates(sizer, tree, 1024)
    return short == min(CAPACITY, len(tree)) and long < short and long == int(np.argmax(rate)) + 1


def the_rule(sizer: TreeSizer, tree, context: int) -> SizeChoice:
    return sizer.choose(tree, context)


def fixed_threshold(sizer: TreeSizer, tree, context: int) -> SizeChoice:
    """Counterpart: keep the nodes above a fixed probability (SuffixDecoding's min_token_prob)."""
    ranking = sizer.rank(tree)
    return ranking.prefix(1 + int(np.sum(ranking.corrected >= 0.1)))


def curve_at_one_context(sizer: TreeSizer, tree, context: int) -> SizeChoice:
    """Counterpart: the cost curve read at the short context whatever the step's."""
    return sizer.choose(tree, 128)


SEEDS = range(6)


def test_the_drafted_trees_mix_sources_and_are_worth_cutting():
    kinds = set()
    for seed in SEEDS:
        tree = drafted(seed)[0]
        assert len(tree) == CAPACITY
        # Copy-logit cells (8-25) and the scored build's retrieval cells (106-185).
        kinds |= {"logits" if c < 26 else "retrieval" if 106 <= c < 186 else "other" for c in tree.cells[1:]}
        assert drafted(seed)[0].tokens.tolist() == tree.tokens.tolist()  # deterministic
    assert kinds == {"logits", "retrieval"}


@pytest.mark.parametrize("seed", SEEDS)
def test_a_flat_curve_fills_the_capacity(seed):
    assert fills_capacity(the_rule, seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("per_node", [0.05, 0.2, 1.0])
def test_a_steep_curve_keeps_only_the_nodes_that_pay(seed, per_node):
    assert keeps_only_paying_nodes(the_rule, seed, per_node=per_node)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_cut_reads_the_curve_at_the_step_s_context(seed):
    assert follows_the_context_s_curve(the_rule, seed)


def test_counterparts_that_ignore_the_curve_fail_these_checks():
    """Each counterpart fails the check on most of the trees the rule passes on."""
    assert sum(fills_capacity(fixed_threshold, seed) for seed in SEEDS) <= 1
    for per_node in (0.05, 1.0):
        assert sum(keeps_only_paying_nodes(fixed_threshold, seed, per_node=per_node) for seed in SEEDS) <= 1
    assert sum(follows_the_context_s_curve(curve_at_one_context, seed) for seed in SEEDS) <= 1
