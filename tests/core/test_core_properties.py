"""Hypothesis properties of the Rust core against the pure-Python oracles in tests/reference.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from racer_rs import Automaton, DraftTree, LogitsTable, build_draft_tree
from racer_rs._native import edge_cell_shared_counterparts
from tests.reference import ReferenceIndex, ancestor_mask, greedy_walk, tree_paths

settings.register_profile("fast", max_examples=25, deadline=None)
settings.register_profile("ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

# Small alphabets make repeats (and so real retrieval work) likely.
token_lists = st.lists(st.integers(0, 5), min_size=0, max_size=60)
workloads = st.lists(st.tuples(token_lists, st.booleans()), min_size=1, max_size=4)


def feed(workload: list[tuple[list[int], bool]], ngram: int, capacity: int = 100_000, min_depth: int = 2):
    a = Automaton(ngram=ngram, capacity=capacity, min_depth=min_depth)
    ref = ReferenceIndex(ngram, min_depth)
    for tokens, new_seq in workload:
        a.extend(np.asarray(tokens, dtype=np.int32))
        ref.extend(tokens)
        if new_seq:
            a.new_sequence()
            ref.new_sequence()
    return a, ref


@given(workloads, st.integers(2, 6), st.lists(st.integers(0, 5), min_size=1, max_size=6))
def test_count_equals_brute_force_without_eviction(workload, ngram, pattern):
    a, ref = feed(workload, ngram)
    pattern = pattern[:ngram]
    assert a.count(pattern) == ref.count(pattern)
    # Every substring that ends at the newest token is already counted.
    last = ref.sequences[-1]
    for k in range(1, min(ngram, len(last)) + 1):
        assert a.count(last[-k:]) == ref.count(last[-k:])
    a.check_integrity()


@given(workloads, st.integers(2, 6), st.integers(1, 3), st.integers(0, 5), st.integers(0, 12), token_lists)
def test_chain_follows_the_longest_match(workload, ngram, min_depth, next_token, max_len, context):
    a, ref = feed(workload, ngram, min_depth=min(min_depth, ngram))
    own = a.chain(next_token, max_len)
    assert own.tokens[0] == next_token and own.parents.tolist() == list(range(-1, len(own) - 1))
    assert own.tokens[1:].tolist() == ref.chain_after(ref.sequences[-1], next_token, max_len)
    given_context = a.chain(next_token, max_len, context)
    assert given_context.tokens[1:].tolist() == ref.chain_after(context, next_token, max_len)
    # Every edge is the own automaton's retrieval edge (a cell with a shared counterpart).
    cells = own.cells[1:]
    assert (edge_cell_shared_counterparts()[cells] != cells).all()
    a.check_integrity()


def test_chain_prefers_the_longest_match_to_the_most_frequent():
    # After "1 2", 3 is the most frequent continuation; after "5 1 2" it was 9.
    a, ref = Automaton(ngram=10, capacity=1000), ReferenceIndex(10)
    text = [1, 2, 3, 4, 1, 2, 3, 4, 5, 1, 2, 9, 8, 0, 5, 1]
    a.extend(text)
    ref.extend(text)
    assert a.chain(2, 2).tokens.tolist() == [2, 9, 8] == [2, *ref.chain_after(text, 2, 2)]
    assert a.retrieve(2, 2).tokens.tolist() == [2, 3]  # the count-ranked tree after "1 2"
    assert a.chain(2, 3, [7, 1]).tokens.tolist() == [2, 3, 4, 1]  # no "7 1 2": after "1 2"


@given(workloads, st.integers(2, 6), st.integers(0, 5), st.integers(1, 80))
def test_retrieve_is_sound_and_complete(workload, ngram, next_token, budget):
    a, ref = feed(workload, ngram)
    tree = a.retrieve(next_token, budget)
    allowed = ref.continuations(next_token)
    paths = tree_paths(tree.tokens, tree.parents)
    assert paths[0] == (next_token,)
    assert set(paths[1:]) <= allowed  # sound: every path is a real continuation
    assert len(tree) == min(budget, len(allowed | {(next_token,)}))  # complete when room
    if budget > len(allowed):
        assert set(paths) == allowed | {(next_token,)}
    a.check_integrity()  # retrieve never breaks anything


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=400),
    st.integers(2, 5),
    st.integers(0, 40),
    st.integers(0, 6),
)
def test_eviction_keeps_budget_integrity_and_newest_window(tokens, ngram, extra, probe):
    capacity = ngram * (ngram + 1) // 2 + extra
    a = Automaton(ngram=ngram, capacity=capacity)
    ref = ReferenceIndex(ngram)
    for start in range(0, len(tokens), 7):
        chunk = tokens[start : start + 7]
        a.extend(chunk)
        ref.extend(chunk)
        assert len(a) <= capacity
        a.retrieve(probe, 16)
    a.check_integrity()
    for k in range(1, min(ngram, len(tokens)) + 1):
        assert 1 <= a.count(tokens[-k:]) <= ref.count(tokens[-k:])
    assert a.match_length == min(ngram, len(tokens))


def check_retrieval_sound(tree: DraftTree, allowed: set[tuple[int, ...]], next_token: int) -> None:
    """Every retrieved path is a real continuation (or the root alone)."""
    paths = tree_paths(tree.tokens, tree.parents)
    assert paths[0] == (next_token,)
    assert set(paths[1:]) <= allowed


def with_extra_child(tree: DraftTree, token: int) -> DraftTree:
    """``tree`` plus a child of the root carrying ``token`` (a fabricated path)."""
    tokens = np.append(tree.tokens, token)
    parents = np.append(tree.parents, 0)
    order = np.argsort(np.append(tree.depths, 1), kind="stable")  # keep BFS order
    remap = np.empty_like(order)
    remap[order] = np.arange(len(order))
    new_parents = [-1 if parents[i] < 0 else int(remap[parents[i]]) for i in order]
    return DraftTree(tokens[order], new_parents)


@given(
    st.lists(st.integers(0, 5), min_size=30, max_size=400),
    st.integers(2, 5),
    st.integers(0, 30),
    st.integers(0, 5),
    st.integers(1, 60),
    st.booleans(),
)
def test_retrieve_is_sound_after_eviction(tokens, ngram, extra, next_token, budget, split):
    """Under a node budget the automaton forgets, but what it retrieves really occurred."""
    capacity = ngram * (ngram + 1) // 2 + extra
    a = Automaton(ngram=ngram, capacity=capacity)
    ref = ReferenceIndex(ngram)
    for start in range(0, len(tokens), 7):
        chunk = tokens[start : start + 7]
        a.extend(chunk)
        ref.extend(chunk)
        if split and start == 14:
            a.new_sequence()
            ref.new_sequence()
        tree = a.retrieve(next_token, budget)
        allowed = ref.continuations(next_token)
        check_retrieval_sound(tree, allowed, next_token)
        # The same check rejects a path that never occurred (token 6 is never fed).
        with pytest.raises(AssertionError):
            check_retrieval_sound(with_extra_child(tree, 6), allowed, next_token)
    assert len(a) <= capacity
    a.check_integrity()


def test_retrieval_after_eviction_still_finds_continuations():
    """The property above is not vacuous: eviction happened and retrieval still returned paths."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 4, size=600).tolist()
    a = Automaton(ngram=4, capacity=30)
    ref = ReferenceIndex(4)
    sizes = []
    for start in range(0, len(tokens), 7):
        a.extend(tokens[start : start + 7])
        ref.extend(tokens[start : start + 7])
        tree = a.retrieve(tokens[start], 16)
        check_retrieval_sound(tree, ref.continuations(tokens[start]), tokens[start])
        sizes.append(len(tree))
    assert any(a.count([t]) < ref.count([t]) for t in range(4))  # counts were evicted
    assert max(sizes[-20:]) > 1
    a.check_integrity()


def full_table(vocab: int, k: int, seed: int = 0) -> LogitsTable:
    rng = np.random.default_rng(seed)
    table = LogitsTable(vocab, k)
    rows = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(vocab)])
    table.update(np.arange(vocab, dtype=np.int32), rows.astype(np.int32))
    return table


def level_sizes(tree: DraftTree) -> list[int]:
    return np.bincount(tree.depths).tolist()


def test_expand_shapes_match_the_reference_rule():
    # Distinct tokens everywhere: a long-period table where no row repeats a token nearby.
    vocab, k = 100_000, 8
    table = LogitsTable(vocab, k)
    ids = (np.arange(vocab * k, dtype=np.int64).reshape(vocab, k) + 1) % vocab
    table.update(np.arange(vocab, dtype=np.int32), ids.astype(np.int32))
    assert level_sizes(table.expand(0, 16)) == [1, 8, 7]
    assert level_sizes(table.expand(0, 32)) == [1, 8, 12, 11]
    assert level_sizes(table.expand(0, 64)) == [1, 8, 12, 17, 18, 8]
    assert level_sizes(table.expand(0, 64, exempt_depth=0)) == [1, 8, 19, 24, 12]


def test_unseen_rows_produce_no_children():
    table = LogitsTable(10, 4)
    assert len(table.expand(3, 64)) == 1
    assert table.row(3) is None


@given(workloads, st.integers(0, 5), st.integers(1, 150), st.booleans(), st.booleans())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_build_draft_tree_size_shape_and_mask(workload, next_token, capacity, use_r, use_l):
    a, _ = feed(workload, 4)
    table = full_table(6, 3, seed=capacity)
    tree = build_draft_tree(a, table, next_token, capacity, use_retrieval=use_r, use_logits=use_l)
    big = build_draft_tree(a, table, next_token, 4000, use_retrieval=use_r, use_logits=use_l)
    assert len(tree) == min(capacity, len(big))
    assert tree.tokens[0] == next_token and tree.parents[0] == -1
    parents = tree.parents.tolist()
    assert all(0 <= parents[i] < i for i in range(1, len(tree)))
    assert np.all(np.diff(tree.depths) >= 0)  # BFS order
    siblings = list(zip(tree.parents.tolist(), tree.tokens.tolist(), strict=True))
    assert len(set(siblings)) == len(siblings)  # distinct sibling tokens
    assert tree.attention_mask().tolist() == ancestor_mask(parents)
    again = build_draft_tree(a, table, next_token, capacity, use_retrieval=use_r, use_logits=use_l)
    assert again.tokens.tolist() == tree.tokens.tolist()  # deterministic
    assert again.parents.tolist() == parents


@given(st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_greedy_accept_and_leaf_paths_match_brute_force(n, seed):
    rng = np.random.default_rng(seed)
    parents = [-1]
    tokens = [int(rng.integers(0, 4))]
    for i in range(1, n):
        p = int(rng.integers(max(0, parents[-1]), i)) if i > 1 else 0
        used = {tokens[c] for c in range(i) if parents[c] == p}
        free = [t for t in range(8) if t not in used]
        if not free:
            break
        parents.append(p)
        tokens.append(int(rng.choice(free)))
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    order = sorted(range(len(parents)), key=lambda i: (depths[i], i))
    remap = {old: new for new, old in enumerate(order)}
    tokens = [tokens[i] for i in order]
    parents = [-1 if parents[i] < 0 else remap[parents[i]] for i in order]
    tree = DraftTree(tokens, parents)
    predicted = rng.integers(0, 8, size=len(tokens)).astype(np.int32)
    assert tree.greedy_accept(predicted) == greedy_walk(tokens, parents, predicted.tolist())
    rows = tree.leaf_paths()
    leaves = [i for i in range(len(tokens)) if i not in set(parents)]
    assert rows.shape == (len(leaves), max(tree.depths) + 1)
    for row, leaf in zip(rows.tolist(), leaves, strict=True):
        path = [i for i in row if i >= 0]
        assert path[-1] == leaf and path[0] == 0
        assert all(parents[path[j + 1]] == path[j] for j in range(len(path) - 1))


def tree_score(tree: DraftTree, table: LogitsTable) -> float:
    """Expected accepted drafts under the table: sum over nodes of the product of the
    table's probabilities along the root-to-node path."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    score = [1.0] * len(tokens)
    for i in range(1, len(tokens)):
        p = parents[i]
        ids, probs = table.row(tokens[p]), table.row_probs(tokens[p])
        edge = probs[ids.tolist().index(tokens[i])] if ids is not None and tokens[i] in ids else 0.0
        score[i] = score[p] * float(edge)
    return sum(score[1:])


@given(st.integers(0, 2**32 - 1), st.integers(1, 60), st.integers(2, 6))
def test_scored_tree_is_at_least_as_good_as_breadth_halving(seed, capacity, k):
    rng = np.random.default_rng(seed)
    vocab = 12
    table = LogitsTable(vocab, k)
    ids = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(vocab)]).astype(np.int32)
    probs = rng.dirichlet(np.ones(vocab), size=vocab)
    top = np.take_along_axis(probs, ids, axis=1)
    order = np.argsort(-top, axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    top = np.take_along_axis(top, order, axis=1)
    table.update(np.arange(vocab, dtype=np.int32), ids, top.astype(np.float32))
    a = Automaton(ngram=4, capacity=1000)
    scored = build_draft_tree(a, table, 0, capacity, use_retrieval=False, scored=True)
    halving = build_draft_tree(a, table, 0, capacity, use_retrieval=False)
    assert len(scored) == len(halving) == capacity
    assert tree_score(scored, table) >= tree_score(halving, table) - 1e-5
    siblings = list(zip(scored.parents.tolist(), scored.tokens.tolist(), strict=True))
    assert len(set(siblings)) == len(siblings)
    assert np.all(np.diff(scored.depths) >= 0)


@given(workloads, st.integers(0, 5), st.integers(1, 80))
def test_scored_retrieval_paths_are_real_continuations(workload, next_token, capacity):
    a, ref = feed(workload, 5)
    table = LogitsTable(6, 2)  # empty: every node must come from retrieval
    tree = build_draft_tree(a, table, next_token, capacity, scored=True)
    allowed = ref.continuations(next_token) | {(next_token,)}
    assert set(tree_paths(tree.tokens, tree.parents)) <= allowed
    assert len(tree) == min(capacity, len(allowed))
    again = build_draft_tree(a, table, next_token, capacity, scored=True)
    assert again.tokens.tolist() == tree.tokens.tolist()
    a.check_integrity()


def f32_path_scores(tree: DraftTree, table: LogitsTable) -> list[np.float32]:
    """Every node's estimated path probability, computed as the core does: in float32, the
    parent's score times the table's probability of the node's token in the parent's row."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    scores = [np.float32(1.0)] * len(tokens)
    for i in range(1, len(tokens)):
        row = table.row(tokens[parents[i]]).tolist()
        edge = table.row_probs(tokens[parents[i]])[row.index(tokens[i])]
        scores[i] = np.float32(scores[parents[i]] * np.float32(edge))
    return scores


def check_min_score_pruning(full: DraftTree, pruned: DraftTree, table: LogitsTable, min_score: float) -> None:
    """``pruned`` holds exactly the nodes of the unpruned ``full`` tree scoring at least
    ``min_score``: none below it (each was checked) and every one at or above it (kept)."""
    threshold = np.float32(min_score)
    for score in f32_path_scores(pruned, table)[1:]:
        assert score >= threshold
    full_paths = tree_paths(full.tokens, full.parents)
    above = {path for path, score in zip(full_paths, f32_path_scores(full, table), strict=True) if score >= threshold}
    assert set(tree_paths(pruned.tokens, pruned.parents)) == above


def random_scored_table(seed: int, vocab: int = 10, k: int = 3) -> LogitsTable:
    rng = np.random.default_rng(seed)
    table = LogitsTable(vocab, k)
    ids = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(vocab)]).astype(np.int32)
    probs = np.sort(rng.dirichlet(np.ones(k + 1), size=vocab)[:, :k], axis=1)[:, ::-1]
    table.update(np.arange(vocab, dtype=np.int32), ids, np.ascontiguousarray(probs, dtype=np.float32))
    return table


@given(st.integers(0, 2**32 - 1), st.floats(0.0, 0.5))
def test_min_score_prunes_exactly_the_unlikely_nodes(seed, min_score):
    table = random_scored_table(seed)
    a = Automaton(ngram=4, capacity=1000)
    full = build_draft_tree(a, table, 0, 40, use_retrieval=False, scored=True)
    pruned = build_draft_tree(a, table, 0, 40, use_retrieval=False, scored=True, min_score=min_score)
    check_min_score_pruning(full, pruned, table, min_score)


def test_min_score_check_rejects_trees_missing_likely_nodes():
    """The check above can fail: a tree of just the root, or one that lost a likely leaf, is
    rejected (a one-directional check accepted both)."""
    table = random_scored_table(seed=1)
    a = Automaton(ngram=4, capacity=1000)
    full = build_draft_tree(a, table, 0, 40, use_retrieval=False, scored=True)
    min_score = 0.05
    pruned = build_draft_tree(a, table, 0, 40, use_retrieval=False, scored=True, min_score=min_score)
    check_min_score_pruning(full, pruned, table, min_score)
    assert 2 < len(pruned) < len(full)  # the threshold keeps some nodes and drops others
    with pytest.raises(AssertionError):
        check_min_score_pruning(full, DraftTree.chain([0]), table, min_score)
    keep = len(pruned) - 1  # BFS order: the last node is a leaf
    lost_leaf = DraftTree(pruned.tokens[:keep], pruned.parents[:keep])
    with pytest.raises(AssertionError):
        check_min_score_pruning(full, lost_leaf, table, min_score)
