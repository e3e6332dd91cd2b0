"""The shared index: `build_draft_tree(..., shared=...)` merges continuations from an automaton read
by every request into the request's tree, checked against the pure-Python oracle; the shared
automaton is only read; concurrent readers and a writer stay consistent and never deadlock."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from racer_rs import EDGE_CELLS, Automaton, DraftTree, LogitsTable, build_draft_tree, edge_cell_priors
from tests.reference import ReferenceIndex, ancestor_mask, tree_paths

settings.register_profile("fast", max_examples=25, deadline=None)
settings.register_profile("ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

ALPHABET = 6
# Edge-cell blocks (see EDGE_CELLS): chain 0-7, copy-logit 8-25, retrieval 26-65, shared 66-105,
# then the count-estimate blocks: retrieval 106-185, shared 186-265.
LOGITS_CELLS = range(8, 26)
# Retrieval cells by match length and share (26..106), then by match length and count estimate
# (the scored tree's, 106..266), each block the request's own then the shared index's.
LOCAL_CELLS = {*range(26, 66), *range(106, 186)}
SHARED_CELLS = {*range(66, 106), *range(186, 266)}

token_lists = st.lists(st.integers(0, ALPHABET - 1), min_size=0, max_size=50)
responses = st.lists(st.lists(st.integers(0, ALPHABET - 1), min_size=1, max_size=40), min_size=0, max_size=5)


def request_automaton(tokens: list[int], ngram: int) -> tuple[Automaton, ReferenceIndex]:
    a = Automaton(ngram=ngram, capacity=100_000)
    ref = ReferenceIndex(ngram)
    a.extend(tokens)
    ref.extend(tokens)
    return a, ref


def shared_automaton(corpus: list[list[int]], ngram: int, capacity: int = 100_000) -> tuple[Automaton, ReferenceIndex]:
    """Past responses, each written as a finished request would: extend, then new_sequence."""
    s = Automaton(ngram=ngram, capacity=capacity)
    ref = ReferenceIndex(ngram)
    for response in corpus:
        s.extend(response)
        s.new_sequence()
        ref.extend(response)
        ref.new_sequence()
    return s, ref


def table_with_rows(seed: int, vocab: int = ALPHABET, k: int = 2) -> LogitsTable:
    rng = np.random.default_rng(seed)
    table = LogitsTable(vocab, k)
    ids = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(vocab)]).astype(np.int32)
    probs = np.sort(rng.dirichlet(np.ones(k + 1), size=vocab)[:, :k], axis=1)[:, ::-1]
    table.update(np.arange(vocab, dtype=np.int32), ids, np.ascontiguousarray(probs, dtype=np.float32))
    return table


def as_tuple(tree: DraftTree) -> tuple:
    return tree.tokens.tolist(), tree.parents.tolist(), tree.cells.tolist()


def check_valid(tree: DraftTree, next_token: int, capacity: int) -> None:
    assert 1 <= len(tree) <= capacity
    assert tree.tokens[0] == next_token and tree.parents[0] == -1
    parents = tree.parents.tolist()
    assert all(0 <= parents[i] < i for i in range(1, len(tree)))
    assert np.all(np.diff(tree.depths) >= 0)
    siblings = list(zip(parents, tree.tokens.tolist(), strict=True))
    assert len(set(siblings)) == len(siblings)  # paths spelling the same tokens were merged
    assert tree.attention_mask().tolist() == ancestor_mask(parents)
    rebuilt = DraftTree(tree.tokens, tree.parents, tree.cells)  # the constructor's checks agree
    assert as_tuple(rebuilt) == as_tuple(tree)


def check_sources(
    tree: DraftTree,
    table: LogitsTable,
    local: set[tuple[int, ...]],
    shared: set[tuple[int, ...]],
) -> dict[str, int]:
    """Every node is a real continuation of the source its cell names; returns nodes per source."""
    paths = tree_paths(tree.tokens, tree.parents)
    seen = {"local": 0, "shared": 0, "logits": 0}
    for i in range(1, len(tree)):
        cell = int(tree.cells[i])
        if cell in SHARED_CELLS:
            assert paths[i] in shared, f"node {i}: {paths[i]} is not in the shared corpus"
            seen["shared"] += 1
        elif cell in LOCAL_CELLS:
            assert paths[i] in local, f"node {i}: {paths[i]} is not in the request's context"
            seen["local"] += 1
        else:
            assert cell in LOGITS_CELLS
            row = table.row(int(tree.tokens[tree.parents[i]]))
            assert row is not None and int(tree.tokens[i]) in row.tolist()
            seen["logits"] += 1
    return seen


@given(
    token_lists,
    responses,
    st.integers(2, 6),
    st.integers(2, 7),
    st.integers(0, ALPHABET - 1),
    st.integers(1, 80),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**16),
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_merged_tree_is_valid_and_every_node_is_a_real_continuation(
    context, corpus, ngram, shared_ngram, next_token, capacity, scored, use_logits, seed
):
    a, local_ref = request_automaton(context, ngram)
    s, shared_ref = shared_automaton(corpus, shared_ngram)
    table = table_with_rows(seed)
    tree = build_draft_tree(a, table, next_token, capacity, scored=scored, use_logits=use_logits, shared=s)
    check_valid(tree, next_token, capacity)
    # The shared automaton is asked about the request's recent tokens (its last `ngram`).
    local = local_ref.continuations(next_token)
    shared = shared_ref.continuations_after(context[-ngram:], next_token)
    seen = check_sources(tree, table, local, shared)
    if not use_logits:
        # Complete when there is room: every distinct path of both sources is in the tree.
        available = {(next_token,)} | local | shared
        assert len(tree) == min(capacity, len(available))
        if capacity >= len(available):
            assert set(tree_paths(tree.tokens, tree.parents)) == available
    if not use_logits and capacity >= len({(next_token,)} | local | shared) and shared - local - {(next_token,)}:
        assert seen["shared"] > 0
    a.check_integrity()
    s.check_integrity()


def test_the_source_check_rejects_a_fabricated_shared_node():
    """check_sources is not vacuous: a shared-cell node that never occurred in the corpus, or a
    real one labelled as the request's, fails it."""
    a, local_ref = request_automaton([1, 2], 4)
    s, shared_ref = shared_automaton([[2, 3, 4, 5]], 4)
    table = LogitsTable(ALPHABET, 2)
    tree = build_draft_tree(a, table, 3, 16, shared=s)
    local, shared = local_ref.continuations(3), shared_ref.continuations_after([1, 2], 3)
    assert check_sources(tree, table, local, shared)["shared"] == 2  # 3 -> 4 -> 5
    cells = tree.cells.copy()
    fake = DraftTree([*tree.tokens.tolist(), 0], [*tree.parents.tolist(), len(tree) - 1], [*cells.tolist(), 66])
    with pytest.raises(AssertionError, match="shared corpus"):
        check_sources(fake, table, local, shared)
    cells[1] = 26
    with pytest.raises(AssertionError, match="request's context"):
        check_sources(DraftTree(tree.tokens, tree.parents, cells), table, local, shared)


@given(
    token_lists, responses, st.integers(2, 6), st.integers(0, ALPHABET - 1), st.integers(1, 60), st.integers(0, 2**16)
)
def test_an_empty_shared_index_changes_nothing(context, corpus, ngram, next_token, capacity, seed):
    table = table_with_rows(seed)
    for scored in (False, True):
        a, _ = request_automaton(context, ngram)
        b, _ = request_automaton(context, ngram)
        empty = Automaton(ngram=ngram, capacity=1000)
        plain = build_draft_tree(a, table, next_token, capacity, scored=scored)
        with_empty = build_draft_tree(b, table, next_token, capacity, scored=scored, shared=empty)
        assert as_tuple(with_empty) == as_tuple(plain)
        assert b.to_bytes() == a.to_bytes()  # the request's automaton was used the same way
        assert len(empty) == 0
    # With use_retrieval=False neither automaton is read.
    s, _ = shared_automaton(corpus, ngram)
    a, _ = request_automaton(context, ngram)
    plain = build_draft_tree(a, table, next_token, capacity, use_retrieval=False)
    assert as_tuple(build_draft_tree(a, table, next_token, capacity, use_retrieval=False, shared=s)) == as_tuple(plain)


@given(
    token_lists, responses, st.integers(2, 6), st.integers(0, ALPHABET - 1), st.integers(1, 60), st.integers(0, 2**16)
)
def test_halving_keeps_the_local_part_and_adds_shared_continuations_before_the_logits(
    context, corpus, ngram, next_token, capacity, seed
):
    table = table_with_rows(seed)
    a, _ = request_automaton(context, ngram)
    b, _ = request_automaton(context, ngram)
    s, _ = shared_automaton(corpus, ngram + 1)
    plain = build_draft_tree(a, table, next_token, capacity)
    merged = build_draft_tree(b, table, next_token, capacity, shared=s)
    assert b.to_bytes() == a.to_bytes()  # local retrieval ran first, exactly as without `shared`

    def local_part(tree: DraftTree) -> list[tuple[int, ...]]:
        paths = tree_paths(tree.tokens, tree.parents)
        return sorted(paths[i] for i in range(1, len(tree)) if tree.cells[i] in LOCAL_CELLS)

    assert local_part(merged) == local_part(plain)
    # Shared continuations come before the logits tree: with the logits off, the shared part is
    # exactly what the shared automaton retrieves for the request's context, merged after it.
    c, _ = request_automaton(context, ngram)
    local_only = build_draft_tree(c, table, next_token, capacity, use_logits=False)
    merged_no_logits = build_draft_tree(c, table, next_token, capacity, use_logits=False, shared=s)
    shared_alone = s.retrieve(next_token, capacity, context=context[-ngram:])
    union = set(tree_paths(local_only.tokens, local_only.parents)) | set(
        tree_paths(shared_alone.tokens, shared_alone.parents)
    )
    got = set(tree_paths(merged_no_logits.tokens, merged_no_logits.parents))
    assert set(tree_paths(local_only.tokens, local_only.parents)) <= got <= union
    if len(local_only) == 1:  # nothing local: the shared retrieval alone, with shared cells
        assert merged_no_logits.tokens.tolist() == shared_alone.tokens.tolist()
        assert merged_no_logits.parents.tolist() == shared_alone.parents.tolist()
        assert (merged_no_logits.cells[1:] - 40).tolist() == shared_alone.cells[1:].tolist()


@given(token_lists, responses, st.integers(2, 6), st.integers(0, ALPHABET - 1), st.integers(1, 80))
def test_retrieve_with_a_context_is_sound_and_complete(context, corpus, ngram, next_token, budget):
    s, ref = shared_automaton(corpus, ngram)
    before = s.to_bytes()
    tree = s.retrieve(next_token, budget, context=context)
    allowed = ref.continuations_after(context, next_token)
    paths = tree_paths(tree.tokens, tree.parents)
    assert paths[0] == (next_token,)
    assert set(paths[1:]) <= allowed
    assert len(tree) == min(budget, len(allowed | {(next_token,)}))
    assert s.match_length == 0  # the match state was not used
    assert Automaton.from_bytes(before).match_length == 0
    s.check_integrity()


def snapshot(a: Automaton) -> tuple:
    """What a shared automaton indexes (counts of every short pattern, size, match state)."""
    patterns = [[x] for x in range(ALPHABET)] + [[x, y] for x in range(ALPHABET) for y in range(ALPHABET)]
    return len(a), a.match_length, tuple(a.count(p) for p in patterns)


def test_drafting_only_reads_the_shared_index():
    rng = np.random.default_rng(3)
    s, _ = shared_automaton([rng.integers(0, ALPHABET, 60).tolist() for _ in range(4)], 5)
    s.extend([1, 2, 3])  # a writer in the middle of a response: its state must survive drafting
    before = snapshot(s)
    table = table_with_rows(0)
    for i in range(200):
        a, _ = request_automaton(rng.integers(0, ALPHABET, 30).tolist(), 4)
        build_draft_tree(a, table, int(rng.integers(0, ALPHABET)), 40, scored=bool(i % 2), shared=s)
    assert snapshot(s) == before
    s.extend([4])
    assert s.count([1, 2, 3, 4]) >= 1  # the writer's sequence continued where it was
    s.check_integrity()


def test_cross_request_memory_drafts_a_previous_response():
    """The use case: a response finished by one request is drafted, with shared cells, for the
    next request that reaches the same context (its own automaton knows nothing of it)."""
    s = Automaton(ngram=8, capacity=10_000)
    s.extend([5, 6, 7, 8, 9, 10, 11, 12])
    s.new_sequence()
    a = Automaton(ngram=8, capacity=10_000)
    a.extend([1, 2, 5, 6])
    table = LogitsTable(20, 2)
    for scored in (False, True):
        tree = build_draft_tree(a, table, 7, 16, scored=scored, shared=s)
        assert tree.tokens.tolist() == [7, 8, 9, 10, 11, 12]
        assert all(c in SHARED_CELLS for c in tree.cells[1:].tolist())
    assert len(build_draft_tree(a, table, 7, 16)) == 1  # nothing without the shared index


def test_calibration_of_shared_cells_steers_the_scored_tree():
    a = Automaton(ngram=6, capacity=1000)
    a.extend([1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    s = Automaton(ngram=6, capacity=1000)
    s.extend([1, 2, 3, 9, 9, 9])
    s.new_sequence()
    table = LogitsTable(12, 2)
    cells = np.arange(EDGE_CELLS)
    trust_shared = np.where(np.isin(cells, list(SHARED_CELLS)), 0.95, 0.05).astype(np.float32)
    tree = build_draft_tree(a, table, 3, 4, scored=True, calibration=trust_shared, shared=s)
    assert tree.tokens.tolist() == [3, 9, 9, 9]
    trust_local = np.where(np.isin(cells, list(LOCAL_CELLS)), 0.95, 0.05).astype(np.float32)
    tree = build_draft_tree(a, table, 3, 4, scored=True, calibration=trust_local, shared=s)
    assert tree.tokens.tolist() == [3, 4, 1, 2]
    priors = edge_cell_priors()
    assert len(priors) == EDGE_CELLS == 266
    # The shared blocks' priors mirror the request's own blocks'.
    assert np.array_equal(priors[66:106], priors[26:66]) and np.array_equal(priors[186:266], priors[106:186])


def test_a_saved_corpus_index_drafts_like_the_original(tmp_path):
    rng = np.random.default_rng(11)
    corpus = [rng.integers(0, ALPHABET, 80).tolist() for _ in range(6)]
    s, _ = shared_automaton(corpus, 6, capacity=200)  # under budget: evictions happened
    s.save(tmp_path / "corpus.racer")
    loaded = Automaton.load(tmp_path / "corpus.racer")
    table = table_with_rows(1)
    for i in range(60):
        context = rng.integers(0, ALPHABET, 20).tolist()
        next_token = int(rng.integers(0, ALPHABET))
        trees = []
        for shared in (s, loaded):
            a, _ = request_automaton(context, 5)
            trees.append(as_tuple(build_draft_tree(a, table, next_token, 30, scored=bool(i % 2), shared=shared)))
        assert trees[0] == trees[1]
        assert loaded.to_bytes() == s.to_bytes()  # the same recency refreshes


def test_shared_argument_errors():
    a = Automaton(ngram=4, capacity=100)
    table = LogitsTable(10, 2)
    with pytest.raises(ValueError, match="shared"):
        build_draft_tree(a, table, 1, 8, shared=a)
    with pytest.raises(TypeError, match="shared"):
        build_draft_tree(a, table, 1, 8, shared=table)
    with pytest.raises(ValueError, match="context"):
        a.retrieve(1, 8, context=[1, -2])
    with pytest.raises(TypeError, match="context"):
        a.retrieve(1, 8, context="ab")


def substrings(sequences: list[list[int]], ngram: int) -> set[tuple[int, ...]]:
    return {tuple(seq[i : i + n]) for seq in sequences for n in range(1, ngram + 1) for i in range(len(seq) - n + 1)}


def occurred_after(grams: set[tuple[int, ...]], context: list[int], path: tuple[int, ...], ngram: int) -> bool:
    """``path`` followed some suffix ``s`` of ``context`` (1 <= len(s) <= ngram - 1, the border
    ``s + path[:1]`` at least 2 deep) within one indexed sequence: the oracle's
    `continuations_after` membership, by substring lookup."""
    longest = min(len(context), ngram - len(path))
    return any(tuple(context[len(context) - k :]) + path in grams for k in range(1, longest + 1))


@pytest.mark.timeout(120)
def test_concurrent_readers_and_a_writer_stay_consistent():
    """Readers draft from the shared index (each with its own request automaton) while one
    writer keeps adding responses to it; every shared node a reader got is a real continuation
    of the responses written, and both automata stay intact."""
    rng = np.random.default_rng(5)
    pool = [rng.integers(0, 12, size=int(rng.integers(20, 80))).tolist() for _ in range(40)]
    s = Automaton(ngram=6, capacity=600)  # small: the writer evicts while readers read
    table = LogitsTable(12, 3)
    table.update(np.arange(12, dtype=np.int32), rng.integers(0, 12, (12, 3)).astype(np.int32))
    errors: list[BaseException] = []
    results: list[tuple[list[int], DraftTree]] = []
    written: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer() -> None:
        try:
            i = 0
            while not stop.is_set():
                s.extend(pool[i % len(pool)])
                s.new_sequence()
                written.append(i % len(pool))
                i += 1
        except BaseException as e:
            errors.append(e)

    def reader(seed: int) -> None:
        r = np.random.default_rng(seed)
        try:
            for count in range(300):
                context = pool[int(r.integers(0, len(pool)))][: int(r.integers(1, 20))]
                a = Automaton(ngram=6, capacity=1000)
                a.extend(context)
                next_token = int(r.integers(0, 12))
                tree = build_draft_tree(a, table, next_token, 32, scored=bool(count % 2), shared=s)
                check_valid(tree, next_token, 32)
                if count % 5 == 0:
                    assert len(s.retrieve(next_token, 16, context=context)) <= 16
                with lock:
                    results.append((context, tree))
        except BaseException as e:
            errors.append(e)

    writer_thread = threading.Thread(target=writer)
    readers = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    writer_thread.start()
    for t in readers:
        t.start()
    for t in readers:
        t.join(timeout=100)
    stop.set()
    writer_thread.join(timeout=10)
    assert not any(t.is_alive() for t in [writer_thread, *readers]), "a thread hung (deadlock?)"
    assert not errors, errors
    assert len(written) > len(pool)  # the writer ran (and evicted) throughout
    s.check_integrity()
    assert len(s) <= 600
    grams = substrings([pool[i] for i in set(written)], 6)
    shared_nodes = 0
    for context, tree in results:
        paths = tree_paths(tree.tokens, tree.parents)
        for i in range(1, len(tree)):
            if tree.cells[i] in SHARED_CELLS:
                assert occurred_after(grams, context, paths[i], 6), (context, paths[i])
                shared_nodes += 1
    assert shared_nodes > 0


def test_the_concurrency_oracle_rejects_a_path_that_never_occurred():
    grams = substrings([[1, 2, 3, 4]], 4)
    assert occurred_after(grams, [0, 1, 2], (3, 4), 4)
    assert not occurred_after(grams, [0, 1, 2], (3, 5), 4)  # never followed "1 2 3"
    assert not occurred_after(grams, [0, 1, 2], (3, 4), 2)  # no suffix fits beside it in ngram 2
    assert not occurred_after(grams, [], (3, 4), 4)  # a border needs a context token
    assert occurred_after(grams, [0, 9, 2], (3, 4), 4)  # "2 3 4" after the suffix [2]


@pytest.mark.timeout(120)
def test_two_automata_in_opposite_roles_do_not_deadlock():
    """Thread 1 drafts with (a, shared=b) while thread 2 drafts with (b, shared=a) and a third
    extends both: the locks are taken in one global order, so all of them finish."""
    a = Automaton(ngram=5, capacity=400)
    b = Automaton(ngram=5, capacity=400)
    rng = np.random.default_rng(9)
    a.extend(rng.integers(0, 8, 300).astype(np.int32))
    b.extend(rng.integers(0, 8, 300).astype(np.int32))
    table = LogitsTable(8, 2)
    errors: list[BaseException] = []

    def drafter(request: Automaton, shared: Automaton, seed: int) -> None:
        r = np.random.default_rng(seed)
        try:
            for i in range(5000):
                build_draft_tree(request, table, int(r.integers(0, 8)), 24, scored=bool(i % 2), shared=shared)
        except BaseException as e:
            errors.append(e)

    def extender() -> None:
        r = np.random.default_rng(1)
        try:
            for _ in range(300):
                a.extend(r.integers(0, 8, 80).astype(np.int32))
                b.extend(r.integers(0, 8, 80).astype(np.int32))
        except BaseException as e:
            errors.append(e)

    threads = [
        threading.Thread(target=drafter, args=(a, b, 1)),
        threading.Thread(target=drafter, args=(b, a, 2)),
        threading.Thread(target=extender),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=100)
    assert not any(t.is_alive() for t in threads), "a thread hung (deadlock?)"
    assert not errors, errors
    a.check_integrity()
    b.check_integrity()
