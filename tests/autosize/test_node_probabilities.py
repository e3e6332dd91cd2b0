"""Node probabilities of the scored tree (``racer`` at ``capacity="auto"``) against pure-Python oracles.

A retrieval node's edge is estimated from counts, as SuffixDecoding's ``min_token_prob`` uses its
counts: the continuation's count over its parent string's (``count / (parent + 1)``), by match
length; its cell is calibrated online and calibrated cells of one group never fall as the estimate
rises. The oracles count occurrences in the token stream directly and fit the isotonic calibration
by the min-max formula, so neither shares code with the automaton, the builder or the fit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from racer_rs import EDGE_CELLS, Automaton, LogitsTable, build_draft_tree, edge_cell_priors
from racer_rs._native import edge_cell_groups
from racer_rs.autosize.calibration import PRIOR_WEIGHT, EdgeCalibration, monotone_fit, path_probabilities
from racer_rs.errors import InvalidArgumentError

#: The scored build's retrieval cells (``EDGE_CELLS``' docstring): the request's own block, by
#: match length 1-8 (rows) and the count estimate in tenths (columns).
ESTIMATE_BLOCK, ESTIMATE_BUCKETS = 106, 10
NGRAM = 6  # match lengths stay below 8, so a cell names its parent string's exact length


def occurrences(stream: list[int], pattern: list[int]) -> int:
    """The oracle's count: how often ``pattern`` occurs in ``stream``."""
    k = len(pattern)
    return sum(stream[i : i + k] == pattern for i in range(len(stream) - k + 1))


def estimate_bucket(count: int, parent: int) -> int:
    """The oracle's bucket of ``count / (parent + 1)`` in tenths (float32, as the core)."""
    value = np.float32(count) / (np.float32(parent) + np.float32(1.0))
    return min(int(value * np.float32(ESTIMATE_BUCKETS)), ESTIMATE_BUCKETS - 1) if value > 0 else 0


def isotonic_oracle(values: list[float], weights: list[float]) -> list[float]:
    """Weighted isotonic regression by the min-max formula: f(i) = max_{j<=i} min_{k>=i} mean(j..k)."""

    def mean(j: int, k: int) -> float:
        w = sum(weights[j : k + 1])
        return sum(v * u for v, u in zip(values[j : k + 1], weights[j : k + 1], strict=True)) / w

    n = len(values)
    return [max(min(mean(j, k) for k in range(i, n)) for j in range(i + 1)) for i in range(n)]


def calibrated_oracle(calibration: EdgeCalibration) -> np.ndarray:
    """Every cell's calibrated probability, recomputed from the counts by the oracles."""
    weights = calibration.tried + PRIOR_WEIGHT
    smoothed = (calibration.accepted + PRIOR_WEIGHT * edge_cell_priors().astype(np.float64)) / weights
    out = smoothed.copy()
    groups = edge_cell_groups()
    for group in set(groups.tolist()) - {-1}:
        cells = np.flatnonzero(groups == group)
        out[cells] = isotonic_oracle(smoothed[cells].tolist(), weights[cells].tolist())
    return out


@st.composite
def calibrations(draw):
    """A calibration with random counts in random cells."""
    calibration = EdgeCalibration()
    cells = draw(st.lists(st.integers(0, EDGE_CELLS - 1), min_size=0, max_size=60))
    for cell in cells:
        tried = draw(st.integers(1, 30))
        calibration.observe(np.full(tried, cell), np.arange(tried) < draw(st.integers(0, tried)))
    return calibration


def scored_tree(stream: list[int], root: int, calibration: EdgeCalibration, ngram: int = NGRAM, min_depth: int = 1):
    automaton = Automaton(ngram=ngram, max_nodes=100_000, min_depth=min_depth)
    automaton.extend(stream)
    table = LogitsTable(8, 2)
    return build_draft_tree(
        automaton,
        table,
        root,
        64,
        use_logits=False,
        scored=True,
        calibration=calibration.probabilities(),
    )


def node_paths(tree) -> list[list[int]]:
    """Every node's tokens from the root."""
    paths: list[list[int]] = []
    for node in range(len(tree)):
        parent = int(tree.parents[node])
        paths.append(([] if parent < 0 else paths[parent]) + [int(tree.tokens[node])])
    return paths


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=50), calibrations())
def test_retrieval_nodes_carry_the_count_estimate_of_their_parent_string(stream, calibration):
    root = stream[-1]
    tree = scored_tree(stream[:-1], root, calibration)
    paths = node_paths(tree)
    context = stream[:-1]
    for node in range(1, len(tree)):
        offset = int(tree.cells[node]) - ESTIMATE_BLOCK
        assert 0 <= offset < 8 * ESTIMATE_BUCKETS, f"node {node}: cell {tree.cells[node]} is not a scored one"
        match_len, bucket = offset // ESTIMATE_BUCKETS + 1, offset % ESTIMATE_BUCKETS
        parent_string = (context + paths[node][:-1])[-match_len:]
        assert len(parent_string) == match_len
        parent = occurrences(context, parent_string)
        count = occurrences(context, parent_string + paths[node][-1:])
        assert count >= 1, f"node {node} was never seen after {parent_string}"
        assert bucket == estimate_bucket(count, parent), (parent_string, paths[node], count, parent)
    # The node's probability: the oracle-calibrated edges multiplied along its path.
    oracle = calibrated_oracle(calibration)
    probabilities = path_probabilities(tree, calibration.probabilities())
    for node in range(len(tree)):
        expected, at = 1.0, node
        while at > 0:
            expected *= oracle[tree.cells[at]]
            at = int(tree.parents[at])
        assert probabilities[node] == pytest.approx(expected, rel=1e-5)


def observe_and_read(calibration: EdgeCalibration, rounds: list[list[tuple[int, int, int]]]) -> None:
    """Counts ``(cell, tried, accepted)`` round by round, reading the probabilities after each
    round (a read after new counts refits, one without them returns the cached fit)."""
    for counts in rounds:
        for cell, tried, accepted in counts:
            calibration.observe(np.full(tried, cell), np.arange(tried) < accepted)
        calibration.probabilities()


count_rounds = st.lists(
    st.lists(
        st.tuples(st.integers(0, EDGE_CELLS - 1), st.integers(1, 20), st.integers(0, 20)).map(
            lambda c: (c[0], c[1], min(c[1], c[2]))
        ),
        max_size=6,
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(count_rounds)
def test_refitting_the_counted_groups_gives_the_whole_fit(rounds):
    calibration = EdgeCalibration()
    observe_and_read(calibration, rounds)
    assert np.allclose(calibration.probabilities(), calibrated_oracle(calibration), atol=1e-6)


def test_a_fit_cached_across_new_counts_fails_the_check(monkeypatch):
    rounds = [[(120, 10, 9)], [(121, 10, 1), (5, 4, 0)]]  # two cells of one group, then one alone
    calibration = EdgeCalibration()
    observe_and_read(calibration, rounds)
    assert np.allclose(calibration.probabilities(), calibrated_oracle(calibration), atol=1e-6)
    original = EdgeCalibration.observe

    def observe_keeping_the_cache(self, cells, accepted):
        cached = self._probabilities
        original(self, cells, accepted)
        self._probabilities = cached  # the counts change, the old fit is still served

    monkeypatch.setattr(EdgeCalibration, "observe", observe_keeping_the_cache)
    broken = EdgeCalibration()
    observe_and_read(broken, rounds)
    assert not np.allclose(broken.probabilities(), calibrated_oracle(broken), atol=1e-6)


@st.composite
def grouped_values(draw):
    """Values, positive weights and groups (-1 to 3, interleaved) of one length."""
    n = draw(st.integers(0, 24))
    unit = st.floats(0.0, 1.0, allow_nan=False)
    values = draw(st.lists(unit, min_size=n, max_size=n))
    weights = draw(st.lists(st.floats(0.01, 50.0), min_size=n, max_size=n))
    groups = draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n))
    return np.array(values), np.array(weights), np.array(groups)


def fit_oracle(values: np.ndarray, weights: np.ndarray, groups: np.ndarray) -> np.ndarray:
    out = values.copy()
    for group in set(groups.tolist()) - {-1}:
        cells = np.flatnonzero(groups == group)
        out[cells] = isotonic_oracle(values[cells].tolist(), weights[cells].tolist())
    return out


@settings(max_examples=200, deadline=None)
@given(grouped_values())
def test_the_native_fit_is_the_weighted_isotonic_fit_of_each_group(case):
    values, weights, groups = case
    fitted = monotone_fit(values, weights, groups)
    assert fitted.dtype == np.float64 and fitted.shape == values.shape
    assert np.allclose(fitted, fit_oracle(values, weights, groups), atol=1e-9)


def test_an_unweighted_fit_fails_the_oracle():
    """The check above can fail: a fit that forgets the weights is not the oracle's."""
    values, weights, groups = np.array([0.8, 0.2]), np.array([1.0, 3.0]), np.array([0, 0])
    assert np.allclose(monotone_fit(values, weights, groups), fit_oracle(values, weights, groups))
    assert not np.allclose(monotone_fit(values, np.ones(2), groups), fit_oracle(values, weights, groups))


@pytest.mark.parametrize(
    ("values", "weights", "groups", "match"),
    [
        ([0.1, 0.2], [1.0], [0, 0], "one length"),
        ([0.1], [0.0], [0], "positive"),
        ([0.1], [float("nan")], [0], "positive"),
        ([float("inf")], [1.0], [0], "finite"),
    ],
)
def test_the_fit_refuses_bad_input_with_one_clear_error(values, weights, groups, match):
    with pytest.raises(InvalidArgumentError, match=match):
        monotone_fit(np.array(values), np.array(weights), np.array(groups))


@settings(max_examples=80, deadline=None)
@given(calibrations())
def test_the_calibration_is_the_isotonic_fit_of_the_smoothed_counts(calibration):
    assert np.allclose(calibration.probabilities(), calibrated_oracle(calibration), atol=1e-6)
    groups = edge_cell_groups()
    probabilities = calibration.probabilities()
    for group in set(groups.tolist()) - {-1}:
        assert np.all(np.diff(probabilities[groups == group]) >= -1e-7)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=3, max_size=40),
    st.integers(0, 3),
    st.integers(0, 3),
    calibrations(),
)
def test_more_evidence_for_a_continuation_never_makes_it_less_likely(stream, token, other, calibration):
    """Monotone in counts: one more occurrence of ``string + token`` (or of ``string + other``)
    moves the node's calibrated edge probability the way it moves the oracle's count estimate."""
    context, root = stream[:-1], stream[-1]
    string = ([*context, root])[-2:]  # the parent string (match length 2)
    probabilities = calibration.probabilities()

    def edge(extra: list[int]) -> tuple[float | None, float]:
        """The node's edge probability (None: not drafted) and the oracle's estimate."""
        # The extra occurrence goes before the context, after a separator token that occurs
        # nowhere else, so the context's suffix (the border) stays; trigrams with borders of
        # length 2 only, so ``string`` is the node's one parent string.
        full = [*extra, 7, *context]
        estimate = occurrences(full, [*string, token]) / (occurrences(full, string) + 1)
        tree = scored_tree(full, root, calibration, ngram=3, min_depth=2)
        for node, path in enumerate(node_paths(tree)):
            if path == [root, token]:
                assert (int(tree.cells[node]) - ESTIMATE_BLOCK) // ESTIMATE_BUCKETS == 1
                return float(probabilities[tree.cells[node]]), estimate
        return None, estimate

    before, base = edge([])
    for extra in ([*string, token], [*string, other]):
        after, estimate = edge(extra)
        if after is None or before is None:
            assert after is not None or estimate == 0  # every continuation seen is drafted
            continue
        if estimate >= base:
            assert after >= before, (extra, estimate, base)
        else:
            assert after <= before, (extra, estimate, base)


def test_monotone_fit_leaves_ordered_values_and_ungrouped_cells_alone():
    groups = np.array([-1, 0, 0, 0, -1, 1, 1])
    values = np.array([0.9, 0.1, 0.2, 0.3, 0.1, 0.8, 0.2])
    weights = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0])
    fitted = monotone_fit(values, weights, groups)
    assert fitted[:5].tolist() == pytest.approx(values[:5].tolist())
    assert fitted[5:].tolist() == pytest.approx([0.35, 0.35])  # (0.8 + 3 * 0.2) / 4


def test_an_older_calibration_state_loads_into_the_cells_it_knew():
    old = {"accepted": [3.0] * 106, "tried": [4.0] * 106, "expected_extra": 1.0, "committed_extra": 1.0}
    calibration = EdgeCalibration()
    calibration.load(old)
    assert calibration.tried[:106].tolist() == [4.0] * 106 and not calibration.tried[106:].any()
    with pytest.raises(ValueError, match="counts per field"):
        calibration.load({"accepted": [0.0] * (EDGE_CELLS + 1), "tried": [0.0] * (EDGE_CELLS + 1)})
