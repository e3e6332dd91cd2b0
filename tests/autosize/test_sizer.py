"""``capacity="auto"``: the size rule, the acceptance calibration, the cost model, and the engine.

The rule is checked on synthetic curves and probabilities against a brute-force oracle; the
calibration on streams with known acceptance rates; the engine for greedy equivalence with plain
decoding and exact sampled text with every method, under cost curves that force every kind of cut.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs import EDGE_CELLS, DraftTree, edge_cell_priors  # noqa: E402
from racer_rs._native import edge_cell_groups  # noqa: E402
from racer_rs.autosize import state as tree_state  # noqa: E402
from racer_rs.autosize.calibration import PRIOR_WEIGHT, EdgeCalibration, path_probabilities  # noqa: E402
from racer_rs.autosize.cost_model import CostModel, bucket_start, size_bucket  # noqa: E402
from racer_rs.autosize.sizer import EXPLORE_AFTER, TreeSizer, best_first_order, best_prefix_size, subtree  # noqa: E402
from racer_rs.target.sampling import SamplingConfig  # noqa: E402
from tests.helpers import REPEATING_PROMPT, plain_greedy, plain_sampling, tiny_llama, tiny_model  # noqa: E402

pytestmark = pytest.mark.torch


def brute_force_size(probabilities: list[float], seconds: list[float]) -> int:
    """The oracle: every prefix size's rate; the smallest size within rounding of the best."""
    rates = []
    for n in range(1, min(len(seconds), len(probabilities) + 1) + 1):
        rates.append((1 + sum(probabilities[: n - 1])) / seconds[n - 1])
    best = max(rates)
    return next(n for n, rate in enumerate(rates, start=1) if rate >= best * (1 - 1e-9))


# --- the choice rule -----------------------------------------------------------------------


def test_flat_cost_verifies_the_whole_tree():
    probabilities = np.array([0.3, 0.2, 0.05, 0.01, 0.001])
    assert best_prefix_size(probabilities, np.full(6, 0.05)) == 6
    assert best_prefix_size(probabilities, np.full(4, 0.05)) == 4  # bounded by the largest size


def test_steep_cost_and_low_probabilities_decode_plainly():
    steep = 0.05 * np.arange(1, 17)  # every node costs a whole forward
    assert best_prefix_size(np.full(15, 0.3), steep) == 1
    assert best_prefix_size(np.full(15, 0.99), 0.05 * (1 + 0.5 * np.arange(16))) > 1  # unless they pay


def test_the_root_counts_as_a_token():
    # One sure node at half again the cost: 2 tokens per 1.5 units beats 1 per 1.
    assert best_prefix_size(np.array([1.0]), np.array([1.0, 1.5])) == 2
    # A node that pays less than its cost is left out, even though it adds expected tokens.
    assert best_prefix_size(np.array([0.4]), np.array([1.0, 1.5])) == 1


sorted_probabilities = st.lists(st.floats(0.0, 1.0), min_size=0, max_size=24).map(lambda p: sorted(p, reverse=True))
increments = st.lists(st.floats(0.0, 2.0), min_size=1, max_size=25)


def _seconds(base: float, steps: list[float]) -> np.ndarray:
    return base + np.cumsum([0.0, *steps])[: len(steps)]


@settings(max_examples=200, deadline=None)
@given(sorted_probabilities, st.floats(0.01, 5.0), increments)
def test_rule_matches_the_brute_force_oracle(probabilities, base, steps):
    seconds = _seconds(base, steps)
    assert best_prefix_size(np.asarray(probabilities), seconds) == brute_force_size(probabilities, list(seconds))


@settings(max_examples=300, deadline=None)
@given(sorted_probabilities, st.floats(0.01, 5.0), increments, st.integers(0, 23), st.floats(0.0, 1.0))
def test_a_likelier_left_out_node_never_shrinks_the_tree(probabilities, base, steps, index, raise_to):
    # Raising a node the choice left out can only make bigger trees pay. (Raising one it kept
    # may favour a smaller tree: the extra expected token is worth more per second there.)
    seconds = _seconds(base, steps)
    before = best_prefix_size(np.asarray(probabilities), seconds)
    if before - 1 >= len(probabilities):
        return
    index = before - 1 + index % (len(probabilities) - before + 1)
    higher = list(probabilities)
    higher[index] = max(higher[index], raise_to)
    higher = higher[: before - 1] + sorted(higher[before - 1 :], reverse=True)
    if higher[before - 1] > higher[max(0, before - 2)] and before > 1:
        return  # the raised node would move into the kept prefix: not a left-out node any more
    assert best_prefix_size(np.asarray(higher), seconds) >= before


def test_raising_a_kept_node_can_favour_a_smaller_tree():
    """Why the monotonicity above is stated for left-out nodes only: a counterexample."""
    seconds = np.array([1.0, 1.0, 1.3])
    assert best_prefix_size(np.array([0.5, 0.5]), seconds) == 3
    assert best_prefix_size(np.array([1.0, 0.5]), seconds) == 2


@settings(max_examples=200, deadline=None)
@given(sorted_probabilities, st.floats(0.01, 5.0), increments, st.integers(1, 24), st.floats(1.0, 3.0))
def test_costlier_big_trees_never_grow_the_tree(probabilities, base, steps, from_size, factor):
    # Big trees costing relatively more: every size from some size on costs ``factor`` times as
    # much. (Adding the same seconds to them instead can favour the biggest: more tokens to
    # spread a fixed cost over, as a larger per-step overhead does.)
    seconds = _seconds(base, steps)
    costlier = seconds.copy()
    costlier[min(from_size, len(costlier)) :] *= factor
    before = best_prefix_size(np.asarray(probabilities), seconds)
    assert best_prefix_size(np.asarray(probabilities), costlier) <= before


def test_a_rule_without_the_root_fails_the_oracle():
    """The oracle tests can fail: dropping the root's token from the expectation changes choices."""

    def rootless(probabilities: np.ndarray, seconds: np.ndarray) -> int:
        expected = np.concatenate([[0.0], np.cumsum(probabilities)])[: len(seconds)]
        return int(np.argmax(expected / seconds[: len(expected)])) + 1

    probabilities, seconds = [0.4], [1.0, 1.5]
    assert rootless(np.asarray(probabilities), np.asarray(seconds)) != brute_force_size(probabilities, seconds)


# --- trees, path probabilities and cuts ----------------------------------------------------


@st.composite
def trees(draw):
    n = draw(st.integers(1, 30))
    parents = [-1]
    for i in range(1, n):
        parents.append(draw(st.integers(max(0, parents[-1]), i - 1)))  # BFS: parents non-decreasing
    cells = [-1] + [draw(st.integers(0, EDGE_CELLS - 1)) for _ in range(n - 1)]
    return DraftTree(list(range(n)), parents, cells)


@settings(max_examples=150, deadline=None)
@given(trees(), st.lists(st.floats(0.0, 1.0), min_size=EDGE_CELLS, max_size=EDGE_CELLS))
def test_path_probability_is_the_product_along_the_path(tree, edge):
    probabilities = path_probabilities(tree, np.asarray(edge))
    for node in range(len(tree)):
        expected, at = 1.0, node
        while at > 0:
            expected *= edge[tree.cells[at]]
            at = tree.parents[at]
        assert probabilities[node] == pytest.approx(expected, rel=1e-9, abs=1e-300)


@settings(max_examples=150, deadline=None)
@given(trees(), st.lists(st.floats(0.0, 1.0), min_size=EDGE_CELLS, max_size=EDGE_CELLS), st.integers(1, 30))
def test_every_best_first_prefix_is_a_connected_tree(tree, edge, n):
    probabilities = path_probabilities(tree, np.asarray(edge))
    keep = np.sort(best_first_order(tree, probabilities)[: min(n, len(tree))])
    kept = set(keep.tolist())
    assert 0 in kept and all(tree.parents[k] in kept for k in keep if k > 0)
    cut = subtree(tree, keep)
    assert cut.tokens.tolist() == tree.tokens[keep].tolist() and cut.cells.tolist() == tree.cells[keep].tolist()
    for new, old in enumerate(keep):
        if old > 0:
            assert cut.tokens[cut.parents[new]] == tree.tokens[tree.parents[old]]


def test_an_order_ignoring_depth_on_ties_can_cut_a_parent_away():
    """Why ties go to the shallower node: with sure edges a child ties its parent."""
    tree = DraftTree([0, 1, 2], [-1, 0, 1], [-1, 0, 1])
    probabilities = np.ones(3)
    deepest_first = np.lexsort((-tree.depths, -probabilities))[:2]
    assert set(deepest_first.tolist()) == {1, 2}  # nodes without the root: not a tree
    assert np.sort(best_first_order(tree, probabilities)[:2]).tolist() == [0, 1]


# --- calibration ---------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.05, 0.3, 0.8])
def test_calibration_converges_to_a_known_acceptance_rate(rate):
    rng = np.random.default_rng(0)
    calibration = EdgeCalibration()
    cell = 40
    outcomes = rng.random(5000) < rate
    calibration.observe(np.full(5000, cell), outcomes)
    assert calibration.probabilities()[cell] == pytest.approx(rate, abs=0.02)
    # Cells outside the cell's monotone group keep their priors; inside, none rises above it.
    group = edge_cell_groups() == edge_cell_groups()[cell]
    untouched = ~group
    assert np.allclose(calibration.probabilities()[untouched], edge_cell_priors()[untouched])
    assert np.all(calibration.probabilities()[group][:-1] <= calibration.probabilities()[cell] + 1e-6)


def test_a_calibration_that_ignores_outcomes_fails_the_convergence_check():
    calibration = EdgeCalibration()
    calibration.observe(np.full(5000, 40), np.ones(5000, dtype=bool) * 0)  # every outcome a rejection
    assert calibration.probabilities()[40] < 0.01
    ignoring = EdgeCalibration()
    ignoring.tried[40] += 5000  # counts tries but never acceptances: stuck at 0 whatever the rate
    assert ignoring.probabilities()[40] != pytest.approx(0.3, abs=0.02)


def test_observing_a_step_counts_every_child_of_an_accepted_node():
    # root 0 -> a(1) -> c(3); root -> b(2); a -> d(4). The target produced a, c, then bonus 9.
    tree = DraftTree([5, 10, 11, 12, 13], [-1, 0, 0, 1, 1], [-1, 0, 1, 2, 3])
    calibration = EdgeCalibration()
    calibration.observe_step(tree, np.array([0, 1, 3]), bonus=9)
    tried, accepted = calibration.tried, calibration.accepted
    assert tried[:5].tolist() == [1, 1, 1, 1, 0]  # children of root and of a; c has no children
    assert accepted[:5].tolist() == [1, 0, 1, 0, 0]  # a and c accepted; b and d not


def test_cut_children_of_accepted_nodes_are_evidence_too():
    # The step verified only root and a; b was cut. The target's token after root was a.
    tree = DraftTree([5, 10, 11], [-1, 0, 0], [-1, 0, 1])
    calibration = EdgeCalibration()
    calibration.observe_step(tree, np.array([0]), bonus=11)  # a rejected: the target said b
    assert calibration.tried[:2].tolist() == [1, 1] and calibration.accepted[:2].tolist() == [0, 1]


def test_warm_start_caps_old_evidence():
    old = EdgeCalibration()
    old.observe(np.full(10_000, 7), np.ones(10_000, dtype=bool))
    fresh = EdgeCalibration()
    fresh.load(old.state(), cap=64)
    assert fresh.tried[7] == pytest.approx(64) and fresh.accepted[7] == pytest.approx(64)
    fresh.observe(np.full(200, 7), np.zeros(200, dtype=bool))
    assert fresh.probabilities()[7] < 0.3  # the request's own outcomes dominate
    with pytest.raises(ValueError, match="invalid counts"):
        fresh.load({"accepted": [1.0] * EDGE_CELLS, "tried": [0.0] * EDGE_CELLS})  # accepted > tried


# --- the cost model ------------------------------------------------------------------------


def steep_cost(per_node: float = 1.0, overhead: float = 0.0) -> CostModel:
    """t(n) = 1 + per_node * (n - 1) at 128 tokens of context, twice that at 1024."""
    sizes = [1, 2, 4, 8, 16, 32, 64]
    short = [1 + per_node * (n - 1) for n in sizes]
    return CostModel(sizes, {128: short, 1024: [2 * t for t in short]}, overhead=overhead)


def test_cost_interpolates_sizes_and_context_lengths():
    cost = steep_cost()
    assert cost.forward_seconds(np.array([3]), 128)[0] == pytest.approx(3.0)
    assert cost.forward_seconds(np.array([2]), 576)[0] == pytest.approx(3.0)


def test_cost_corrects_itself_from_observed_steps():
    cost = steep_cost(per_node=0.0)
    for _ in range(100):  # the machine became twice as slow for single tokens
        cost.observe(1, 128, forward=2.0, overhead=0.5)
    assert cost.forward_seconds(np.array([1]), 128)[0] == pytest.approx(2.0, rel=0.01)
    assert cost.forward_seconds(np.array([64]), 128)[0] == pytest.approx(2.0, rel=0.01)  # unseen: the load
    assert cost.overhead == pytest.approx(0.5, rel=0.01)
    restored = CostModel.from_state(json.loads(json.dumps(cost.state())))
    # The load is this moment's, not the model's: a restored model starts at load 1.
    assert restored.load == 1.0
    assert restored.shape == pytest.approx(cost.shape)
    assert restored.forward_seconds(np.array([16]), 700) == pytest.approx(
        cost.forward_seconds(np.array([16]), 700) / cost.load
    )
    with pytest.raises(ValueError):  # noqa: PT011 - any malformed state is rejected; messages vary by field
        CostModel.from_state({"sizes": [1, 2], "seconds": {"1": [1.0]}})


def test_a_first_look_at_a_size_learns_the_machine_s_factor_not_one():
    cost = steep_cost(per_node=1.0)
    for _ in range(100):  # everything runs twice as slow as measured; only single tokens seen
        cost.observe(1, 128, forward=2.0, overhead=0.0)
    measured_16 = float(cost.measured_seconds(np.array([16]), 128)[0])
    cost.observe(16, 128, forward=2 * measured_16, overhead=0.0)  # first 16-token step: also 2x
    # A rule that compares with the prediction (already scaled by the default 2.0) learns 1.0 here.
    assert cost.forward_seconds(np.array([16]), 128)[0] == pytest.approx(2 * measured_16, rel=0.01)


def test_a_load_spike_moves_the_load_and_passes_leaving_the_shapes_alone():
    cost = steep_cost(per_node=1.0)
    measured = {n: float(cost.measured_seconds(np.array([n]), 128)[0]) for n in (1, 16)}
    for _ in range(5):  # a burst of contention: 16-node steps take 10x what was measured
        cost.observe(16, 128, forward=10 * measured[16], overhead=0.0)
    assert cost.load > 4
    assert 0.8 < cost.shape[size_bucket(16)] < 1.25  # the spike went to the load, not to the 16-node bucket
    for _ in range(30):  # the burst is over: single tokens run as measured again
        cost.observe(1, 128, forward=measured[1], overhead=0.0)
    assert cost.load == pytest.approx(1.0, rel=0.05)
    assert cost.forward_seconds(np.array([16]), 128)[0] == pytest.approx(measured[16], rel=0.25)
    restored = CostModel.from_state(json.loads(json.dumps(cost.state())))  # a saved spike is none
    assert restored.forward_seconds(np.array([16]), 128)[0] < 1.25 * measured[16]


@pytest.mark.parametrize("teaches_load", [False, True])
def test_steps_that_do_not_teach_the_load_leave_it_to_the_plain_steps(teaches_load: bool):
    """Blocks of 8 plain steps and 8 drafted ones (size 4) that cost 1.5x the curve: kept from
    the load, the drafted steps' error is the size's own, and the load stays the plain steps'
    right after a drafted block. The counterpart (the drafted steps teaching the load too, as
    before) ends a drafted block with the load well above the plain steps' 1."""
    cost = steep_cost(per_node=1.0)
    measured = {n: float(cost.measured_seconds(np.array([n]), 128)[0]) for n in (1, 4)}
    for _ in range(20):
        for _ in range(8):
            cost.observe(1, 128, forward=measured[1], overhead=0.0)
        for _ in range(8):
            cost.observe(4, 128, forward=1.5 * measured[4], overhead=0.0, teaches_load=teaches_load)
    if teaches_load:
        assert cost.load > 1.2
    else:
        assert cost.load == pytest.approx(1.0)
        ratio = cost.forward_seconds(np.array([4]), 128)[0] / cost.forward_seconds(np.array([1]), 128)[0]
        assert 1.0 * measured[4] / measured[1] < ratio < 1.5 * measured[4] / measured[1]


@pytest.mark.parametrize("slow", [1.8, 5.0])
def test_occasional_slow_steps_leave_the_prices_where_they_are(slow: float):
    """A batch of plain steps (size 1 alone) where one step in 20 is slow (another process, a
    cache growth), then size 2 met again: the curve must still price both sizes as they run.
    With each step's shape share clipped and the load's overshoot after a slow step not, the
    size-1 shape fell a little at every slow step while the load rose to match, until a plain
    step was priced at a quarter of its time against the other sizes."""
    cost = steep_cost(per_node=0.0)
    truth = {1: 1.0, 2: 1.3}  # the measured curve says 1.0 for both
    for _ in range(60):  # the two sizes learned side by side first
        for n in (1, 2):
            cost.observe(n, 128, forward=truth[n], overhead=0.0)
    rng = np.random.default_rng(0)
    for _ in range(3000):
        cost.observe(1, 128, forward=truth[1] * (slow if rng.random() < 0.05 else 1.0), overhead=0.0)
    for _ in range(10):
        cost.observe(1, 128, forward=truth[1], overhead=0.0)
    seconds = cost.forward_seconds(np.array([1, 2]), 128)
    assert seconds[0] == pytest.approx(truth[1], rel=0.1)
    assert seconds[1] / seconds[0] == pytest.approx(truth[2] / truth[1], rel=0.1)
    assert cost.load < 1.5  # the load is the machine's now, not a shape's drift


def test_the_shape_learns_what_the_measured_curve_got_wrong_for_one_size():
    cost = steep_cost(per_node=1.0)
    measured = {n: float(cost.measured_seconds(np.array([n]), 128)[0]) for n in (1, 16)}
    for _ in range(200):  # single tokens as measured; 16-node trees in truth cost half the curve
        cost.observe(1, 128, forward=measured[1], overhead=0.0)
        cost.observe(16, 128, forward=0.5 * measured[16], overhead=0.0)
    assert cost.forward_seconds(np.array([1]), 128)[0] == pytest.approx(measured[1], rel=0.2)
    assert cost.forward_seconds(np.array([16]), 128)[0] == pytest.approx(0.5 * measured[16], rel=0.2)
    restored = CostModel.from_state(json.loads(json.dumps(cost.state())))  # the ratio is kept, the load not
    assert restored.shape[size_bucket(16)] / restored.shape[0] == pytest.approx(0.5, rel=0.2)


def test_a_cost_state_from_before_the_load_split_is_read_without_its_factors():
    state = {"sizes": [1, 2], "seconds": {"128": [1.0, 2.0], "1024": [2.0, 3.0]}, "factors": {"0": 10.0}}
    cost = CostModel.from_state(state)
    assert cost.forward_seconds(np.array([1]), 128)[0] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "bad",
    [
        {"overhead": float("nan")},
        {"shape": {"0": -1.0}},
        {"overhead": -1.0},
        {"seconds": {"128": [1.0, float("inf")], "1024": [2.0, 3.0]}},
    ],
)
def test_a_cost_state_with_non_finite_or_negative_values_is_rejected(bad):
    state = {"sizes": [1, 2], "seconds": {"128": [1.0, 2.0], "1024": [2.0, 3.0]}, "overhead": 0.0} | bad
    with pytest.raises(ValueError):  # noqa: PT011 - any malformed state is rejected; messages vary by field
        CostModel.from_state(json.loads(json.dumps(state)))


def test_a_calibration_state_with_bad_totals_loads_nothing():
    calibration = EdgeCalibration()
    before = calibration.state()
    good = EdgeCalibration()
    good.accepted[:] = 3.0
    good.tried[:] = 4.0
    state = good.state() | {"expected_extra": -1.0}
    with pytest.raises(ValueError, match="invalid totals"):
        calibration.load(state)
    assert calibration.state() == before


def test_a_noisy_correction_never_makes_a_bigger_tree_cheaper_than_a_smaller_one():
    cost = steep_cost(per_node=1.0)
    cost.shape = {0: 1.0, size_bucket(64): 0.001}  # an absurdly low factor for 64 nodes (set directly, past the clip)
    sizer = TreeSizer(cost, EdgeCalibration(), max_capacity=64)
    chain = DraftTree.chain(np.arange(64, dtype=np.int32))
    # Without the envelope t(64) would be 0.064 s against t(1) = 1 s and the whole chain would win.
    assert len(sizer.choose(chain, 128).keep) < 64


@pytest.mark.parametrize("randomized", [True, False])
def test_chain_sampling_verifies_a_drafted_token_after_a_run_of_plain_steps(randomized):
    # With randomised acceptance a cut node teaches nothing: without a look now and then, a low
    # estimate would pin plain decoding forever. Greedy outcomes of cut nodes are known: no need.
    sizer = TreeSizer(steep_cost(per_node=10.0), EdgeCalibration(), max_capacity=8)
    chain = DraftTree.chain(np.arange(5, dtype=np.int32))
    sizes = []
    for _ in range(3 * (EXPLORE_AFTER + 1)):
        choice = sizer.choose(chain, 128)
        sizes.append(len(choice.keep))
        forward = float(sizer.cost.measured_seconds(np.array([len(choice.keep)]), 128)[0])  # as predicted
        sizer.observe(chain, choice, [0], 99, randomized, context=128, forward=forward, step=forward, committed=1)
    expected = ([1] * EXPLORE_AFTER + [2]) * 3 if randomized else [1] * (3 * (EXPLORE_AFTER + 1))
    assert sizes == expected


# --- the engine ----------------------------------------------------------------------------

METHODS = ["ar", "pld", "token_recycling", "racer", "racer_scored", "racer_retrieval", "racer_logits"]
COSTS = {
    "flat": lambda: CostModel([1, 64], {1: [1.0, 1.0], 2: [1.0, 1.0]}),
    "steep": lambda: steep_cost(per_node=1.0),
    "mild": lambda: steep_cost(per_node=0.05, overhead=0.2),
}


@pytest.fixture
def forced_cost(monkeypatch, tmp_path):
    """Use a given cost curve, frozen (no online correction), and a private cache."""
    monkeypatch.setenv("RACER_RS_CACHE", str(tmp_path))
    monkeypatch.setattr(tree_state, "_calibrations", {})
    monkeypatch.setattr(CostModel, "observe", lambda self, *args, **kwargs: None)

    def force(kind: str) -> None:
        monkeypatch.setattr(tree_state, "cost_model", lambda model, max_capacity: COSTS[kind]())

    return force


@pytest.mark.parametrize("cost", list(COSTS))
@pytest.mark.parametrize("method", METHODS)
def test_auto_greedy_equals_plain_greedy(forced_cost, method, cost):
    forced_cost(cost)
    model = tiny_model("llama", seed=0, sharpen=4.0)
    expected = plain_greedy(model, REPEATING_PROMPT, 40)
    result = racer_rs.generate(model, REPEATING_PROMPT, method=method, max_new_tokens=40, capacity="auto")
    assert result.tokens == expected
    if method == "ar":  # plain decoding has nothing to size: no policy runs
        assert "auto_capacity" not in result.extras
        return
    report = result.extras["auto_capacity"]
    assert sum(report["chosen_sizes"].values()) == report["steps"] >= 1
    if cost == "steep":
        assert set(report["chosen_sizes"]) == {1}  # nothing pays at a whole forward per node
    if cost == "flat" and method in ("racer", "racer_scored"):
        assert max(report["chosen_sizes"]) > 8


@pytest.mark.parametrize("method", METHODS)
def test_auto_sampling_equals_plain_sampling(forced_cost, method):
    forced_cost("mild")
    model = tiny_model("llama", seed=1, sharpen=15.0)
    config = SamplingConfig(temperature=1.0, top_p=0.9)
    for seed in range(2):
        expected = plain_sampling(model, REPEATING_PROMPT, 40, config, seed)
        result = racer_rs.generate(
            model,
            REPEATING_PROMPT,
            method=method,
            max_new_tokens=40,
            temperature=1.0,
            top_p=0.9,
            seed=seed,
            capacity="auto",
        )
        assert result.tokens == expected, (method, seed)


@pytest.mark.parametrize("method", ["draft_model", "tts", "racer_tts"])
def test_auto_with_draft_model_methods_is_lossless_in_greedy(forced_cost, method):
    forced_cost("mild")
    target, draft = tiny_llama(11), tiny_llama(12, hidden=16)
    prompt = [3, 17, 42, 8, 3, 17, 42, 8, 3]
    expected = plain_greedy(target, prompt, 32)
    result = racer_rs.generate(
        target, prompt, method=method, max_new_tokens=32, capacity="auto", draft_model=draft, canvas=6
    )
    assert result.tokens == expected


def test_auto_reports_sizes_predictions_and_the_cost_curve(forced_cost):
    forced_cost("mild")
    model = tiny_model("llama", seed=0, sharpen=4.0)
    result = racer_rs.generate(
        model, REPEATING_PROMPT, method="racer", max_new_tokens=40, capacity="auto", max_capacity=16
    )
    report = result.extras["auto_capacity"]
    assert report["max_capacity"] == 16 and max(report["chosen_sizes"]) <= 16
    assert report["observed_tokens_per_step"] == pytest.approx(np.mean(result.accepted_lengths[: report["steps"]]))
    assert report["predicted_tokens_per_step"] >= 1.0
    assert set(report["cost_curve_ms"]) == {1, 2, 4, 8, 16, 32, 64}
    assert 0.0 <= report["setup_s"] <= result.timings["total"]
    assert result.extras["mean_tree_size"] <= 16


def test_bad_capacity_values_are_clear_errors():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="capacity must be an int >= 1 or 'auto'"):
        racer_rs.generate(model, [1, 2, 3], capacity="automatic")
    with pytest.raises(ValueError, match="max_capacity must be >= 1"):
        racer_rs.generate(model, [1, 2, 3], capacity="auto", max_capacity=0)
    window = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=r"max_capacity .* must be below the model's window"):
        racer_rs.generate(model, [1, 2, 3], capacity="auto", max_capacity=window)


def test_cost_curve_is_measured_once_and_cached_on_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("RACER_RS_CACHE", str(tmp_path))
    monkeypatch.setattr(tree_state, "_costs", {})
    measured = []
    real = tree_state.measure_cost_model
    monkeypatch.setattr(tree_state, "measure_cost_model", lambda m, n: measured.append(n) or real(m, n, rounds=1))
    model = tiny_model("llama", seed=0, sharpen=4.0)
    racer_rs.generate(model, REPEATING_PROMPT, method="racer", max_new_tokens=8, capacity="auto", max_capacity=8)
    assert measured == [8]
    files = list((tmp_path / "tree_size" / "cost").glob("*.json"))
    assert len(files) == 1
    monkeypatch.setattr(tree_state, "_costs", {})  # a new process: read from disk, not measured
    racer_rs.generate(model, REPEATING_PROMPT, method="racer", max_new_tokens=8, capacity="auto", max_capacity=8)
    assert measured == [8]
    for damaged in ("{half-written", json.dumps({"format": tree_state.STATE_FORMAT})):  # measured again
        files[0].write_text(damaged, encoding="utf-8")
        monkeypatch.setattr(tree_state, "_costs", {})
        racer_rs.generate(model, REPEATING_PROMPT, method="racer", max_new_tokens=8, capacity="auto", max_capacity=8)
    assert measured == [8, 8, 8]
    assert not list((tmp_path / "tree_size" / "cost").glob(".*"))  # no temporary file left behind


def test_calibration_warm_starts_the_next_request(forced_cost):
    forced_cost("mild")
    model = tiny_model("llama", seed=0, sharpen=4.0)
    racer_rs.generate(model, REPEATING_PROMPT, method="racer", max_new_tokens=40, capacity="auto")
    key = tree_state.calibration_key(model, "racer", greedy=True)
    warm = tree_state.load_calibration(key)
    assert warm.tried.sum() > 0
    assert not np.allclose(warm.probabilities(), EdgeCalibration().probabilities())
    assert PRIOR_WEIGHT > 0


@pytest.mark.slow
def test_auto_chain_sampling_keeps_the_target_distribution(forced_cost):
    """Chain speculative sampling on chains cut by the size choice: the 3rd token's distribution."""
    from racer_rs.drafters import make_drafter
    from tests.drafters.test_draft_model import ShiftedReportDrafter, third_token_draft, third_token_sampling

    forced_cost("mild")
    drafter = make_drafter("draft_model", None, draft_model=third_token_draft(), canvas=3)
    pvalue, accepted = third_token_sampling(drafter, top_k=0, capacity="auto", max_capacity=4)
    assert accepted > 200 and pvalue > 1e-3
    lossy = ShiftedReportDrafter(None, draft_model=third_token_draft(), canvas=3)
    pvalue, _ = third_token_sampling(lossy, top_k=0, capacity="auto", max_capacity=4)
    assert pvalue < 1e-3  # the same test rejects misreported draft probabilities


def test_the_total_correction_learns_how_much_estimates_overstate():
    calibration = EdgeCalibration()
    assert calibration.extra_scale() == 1.0
    for _ in range(500):  # every step expected 2 drafted tokens and committed 1
        calibration.record_step(2.0, 1)
    assert calibration.extra_scale() == pytest.approx(0.5, abs=0.01)
    warm = EdgeCalibration()
    warm.load(calibration.state())
    assert warm.expected_extra == pytest.approx(256.0) and warm.extra_scale() == pytest.approx(0.5, abs=0.01)
    for _ in range(2000):  # the new request's estimates are right: the factor moves back to 1
        warm.record_step(1.0, 1)
    assert warm.extra_scale() == pytest.approx(1.0, abs=0.06)


def test_the_correction_scales_the_expectation_but_not_the_ranking():
    tree = DraftTree([0, 1, 2, 3], [-1, 0, 0, 1], [-1, 8, 9, 10])
    calibration = EdgeCalibration()
    flat = TreeSizer(COSTS["flat"](), calibration, max_capacity=4)
    before = flat.choose(tree, 100)
    for _ in range(200):
        calibration.record_step(1.0, 0)  # nothing drafted is ever committed
    after = flat.choose(tree, 100)
    assert before.keep.tolist() == after.keep.tolist() == [0, 1, 2, 3]  # flat cost: the whole tree
    assert after.uncorrected_extra == pytest.approx(before.uncorrected_extra)
    assert after.expected - 1 < 0.05 * (before.expected - 1)


def test_small_sizes_learn_their_own_shape():
    # A batched step is decided between padded sizes 1, 2 and 3: a shared bucket for 2 and 3
    # learned a compromise that underpriced both.
    cost = steep_cost(per_node=1.0)
    measured = {n: float(cost.measured_seconds(np.array([n]), 128)[0]) for n in (1, 2, 3)}
    for _ in range(300):
        cost.observe(1, 128, forward=measured[1], overhead=0.0)
        cost.observe(2, 128, forward=1.2 * measured[2], overhead=0.0)
        cost.observe(3, 128, forward=0.8 * measured[3], overhead=0.0)
    predicted = {n: float(cost.forward_seconds(np.array([n]), 128)[0]) for n in (1, 2, 3)}
    assert predicted[2] / predicted[1] == pytest.approx(1.2 * measured[2] / measured[1], rel=0.05)
    assert predicted[3] / predicted[1] == pytest.approx(0.8 * measured[3] / measured[1], rel=0.05)


def test_size_buckets_are_exact_for_small_sizes_then_end_at_the_measured_powers_of_two():
    assert [size_bucket(n) for n in (1, 2, 3, 8)] == [0, 1, 2, 7]
    assert size_bucket(9) == size_bucket(16) != size_bucket(17) == size_bucket(32) != size_bucket(33)
    assert size_bucket(33) == size_bucket(64) != size_bucket(65)
    assert [bucket_start(size_bucket(n)) for n in (1, 8, 9, 16, 17, 32, 33, 64, 65)] == [1, 8, 9, 9, 17, 17, 33, 33, 65]


def test_shape_factors_stored_over_other_buckets_are_not_read():
    state = {"sizes": [1, 2], "seconds": {"128": [1.0, 2.0], "1024": [2.0, 3.0]}, "shape": {"1": 3.0}}
    assert CostModel.from_state(state).shape == {}  # bucket 1 meant sizes 2..3 then
    cost = steep_cost()
    cost.shape = {1: 3.0}
    assert CostModel.from_state(json.loads(json.dumps(cost.state()))).shape == {1: 3.0}


def test_a_surcharge_between_measured_sizes_does_not_price_the_measured_size_below_it():
    """Kernels that work in blocks of 16 rows make 17..31 nodes cost more than the line between
    the measured 16 and 32; what steps of 24 nodes teach must not make 16 nodes look dearer
    (with 16 in the 17..31 bucket, auto never verified more than 15 nodes)."""
    cost = steep_cost(per_node=0.01)
    measured = {n: float(cost.measured_seconds(np.array([n]), 128)[0]) for n in (12, 15, 16, 24)}
    for _ in range(300):
        cost.observe(24, 128, forward=1.12 * measured[24], overhead=0.0)
        cost.observe(12, 128, forward=measured[12], overhead=0.0)
    predicted = {n: float(cost.forward_seconds(np.array([n]), 128)[0]) for n in (15, 16, 24)}
    assert predicted[24] / predicted[16] > 1.05 * measured[24] / measured[16]  # the surcharge is learned
    assert predicted[16] / predicted[15] == pytest.approx(measured[16] / measured[15], rel=0.01)  # 16 keeps its price
