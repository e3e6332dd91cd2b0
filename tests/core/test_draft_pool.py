"""`DraftPool`: per-request RACER states drafted in one call.

Checked against B independent (Automaton, LogitsTable) pairs driven as `RacerDrafter` drives
them, against pure-Python oracles for the SGLang layout (rebuilt from the mask alone, as
SGLang's `reconstruct_indices_from_tree_mask` does) and for the best chains, across processes,
hash seeds and thread counts, and on every bad-input path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import racer_rs
from racer_rs import (
    EDGE_CELLS,
    Automaton,
    BatchDraft,
    DraftPool,
    DraftTree,
    LogitsTable,
    build_draft_tree,
)
from racer_rs._native import edge_cell_shared_counterparts
from racer_rs.errors import InvalidArgumentError, InvalidTypeError
from tests.reference import ancestor_mask

settings.register_profile("fast", max_examples=25, deadline=None)
settings.register_profile("ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

REPO = Path(__file__).resolve().parents[2]
VOCAB = 12
# Ten ids of both kinds: enough for a batch to reach the parallel threshold (8).
IDS: list[int | str] = [0, "a", 1, "b", -5, "req-7", 3, "c", 2**40, "d"]


def code_like(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    """A random-but-repetitive stream: a few chunks repeated, some with one token mutated."""
    chunks = [rng.integers(0, vocab, int(rng.integers(4, 16))) for _ in range(8)]
    out: list[int] = []
    while len(out) < n:
        c = chunks[int(rng.integers(len(chunks)))].copy()
        if rng.random() < 0.3:
            c[int(rng.integers(len(c)))] = rng.integers(vocab)
        out.extend(c.tolist())
    return np.asarray(out[:n], dtype=np.int32)


# ---------------------------------------------------------------------------------------------
# (1) The pool equals independent per-request pairs, through random interleavings.


class Reference:
    """One request's (Automaton, LogitsTable), driven exactly as `RacerDrafter` drives them."""

    def __init__(self, o: dict, prompt: list[int], vocab: int = VOCAB) -> None:
        self.o = o
        self.automaton = Automaton(ngram=o["ngram"], capacity=o["max_nodes"], min_depth=o["min_depth"])
        self.table = LogitsTable(vocab, o["breadth"])
        # begin(): a fresh table and automaton, a new sequence, the prompt indexed.
        self.automaton.new_sequence()
        if o["use_retrieval"]:
            self.automaton.extend(np.asarray(prompt, dtype=np.int32))

    def extend(self, tokens: list[int]) -> None:
        if self.o["use_retrieval"]:  # observe(): automaton.extend(committed)
            self.automaton.extend(np.asarray(tokens, dtype=np.int32))

    def update(self, tokens, ids, probs) -> None:
        if self.o["use_logits"]:  # observe(): table.update(tokens[order], topk_ids[order], probs)
            self.table.update(tokens, ids, probs)

    def propose(self, next_token: int, capacity: int, calibration, shared: Automaton | None = None) -> DraftTree:
        scored = self.o["tree"] == "scored"
        return build_draft_tree(
            self.automaton,
            self.table,
            next_token,
            capacity,
            use_retrieval=self.o["use_retrieval"],
            use_logits=self.o["use_logits"],
            exempt_depth=self.o["exempt_depth"],
            scored=scored,
            min_score=self.o["min_score"],
            calibration=calibration if scored else None,
            shared=shared,
        )


id_index = st.integers(0, len(IDS) - 1)
# Batch calls keep ids that are not in the pool (and must then fail) one time in five;
# otherwise they are narrowed to the ids present.
unknown_too = st.integers(0, 4).map(lambda x: x == 0)
big_capacity = st.sampled_from([8, 16, 64, 400])  # 10 requests of 400: 2 threads
tokens_st = st.lists(st.integers(0, VOCAB - 1), max_size=24)


@st.composite
def pool_options(draw, tree: str) -> dict:
    ngram = draw(st.integers(2, 5))
    window = ngram * (ngram + 1) // 2
    use_retrieval, use_logits = draw(st.sampled_from([(True, True), (True, False), (False, True)]))
    return {
        "ngram": ngram,
        "max_nodes": draw(st.integers(window, window + 60)),  # small: eviction happens
        "breadth": draw(st.integers(1, 4)),
        "min_depth": draw(st.integers(1, ngram)),
        "exempt_depth": draw(st.integers(0, 2)),
        "tree": tree,
        "min_score": draw(st.sampled_from([0.0, 0.01, 0.2])) if tree == "scored" else 0.0,
        "use_retrieval": use_retrieval,
        "use_logits": use_logits,
    }


@st.composite
def operations(draw, breadth: int) -> list:
    """A few requests seeded with repetitive prompts and full copy-logit tables (so trees are
    big), then a random interleaving of every call."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ops: list = []
    for i in draw(st.permutations(range(len(IDS))))[: draw(st.integers(1, len(IDS)))]:
        ops.append(("add", i, code_like(rng, draw(st.integers(0, 300)), VOCAB).tolist()))
        if draw(st.integers(0, 3)) > 0:
            ids = rng.integers(0, VOCAB, VOCAB * breadth).tolist()
            probs = rng.random(VOCAB * breadth).astype(np.float32).tolist() if draw(st.booleans()) else None
            ops.append(("update", i, list(range(VOCAB)), ids, probs))
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["add", "add", "extend", "update", "propose", "propose", "everything", "remove"]))
        if kind == "add":
            ops.append(("add", draw(id_index), draw(st.lists(st.integers(0, VOCAB - 1), max_size=60))))
        elif kind == "remove":
            ops.append(("remove", draw(id_index)))
        elif kind == "extend":
            rows = draw(st.lists(st.tuples(id_index, tokens_st), min_size=1, max_size=10, unique_by=lambda r: r[0]))
            ops.append(("extend", rows, draw(st.booleans()), draw(unknown_too)))
        elif kind == "update":
            n = draw(st.integers(0, 6))
            tokens = draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n))
            ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=n * breadth, max_size=n * breadth))
            probs = draw(st.none() | st.lists(st.floats(0, 1, width=32), min_size=n * breadth, max_size=n * breadth))
            ops.append(("update", draw(id_index), tokens, ids, probs))
        elif kind == "everything":  # every request at once, in a shuffled order: big batches
            ops.append(("everything", draw(st.randoms(use_true_random=False)), draw(big_capacity)))
        else:
            rows = draw(
                st.lists(
                    st.tuples(
                        id_index, st.integers(0, VOCAB - 1), st.sampled_from([1, 2, 7, 16, 40]) | st.integers(1, 64)
                    ),
                    min_size=1,
                    max_size=10,
                    unique_by=lambda r: r[0],
                )
            )
            ops.append(("propose", rows, draw(st.booleans()), draw(st.booleans()), draw(unknown_too)))
    ops.append(("everything", draw(st.randoms(use_true_random=False)), draw(big_capacity)))
    return ops


def assert_same_tree(got: DraftTree, want: DraftTree, where: str) -> None:
    assert got.tokens.tolist() == want.tokens.tolist(), where
    assert got.parents.tolist() == want.parents.tolist(), where
    assert got.cells.tolist() == want.cells.tolist(), where


@pytest.mark.parametrize("tree", ["halving", "scored"])
@given(data=st.data())
def test_random_interleavings_match_independent_per_request_pairs(tree, data):
    o = data.draw(pool_options(tree))
    threads = data.draw(st.sampled_from([1, 2]))
    pool = DraftPool(VOCAB, threads=threads, **o)
    refs: dict[int | str, Reference] = {}
    calibration = np.linspace(0.05, 0.95, EDGE_CELLS, dtype=np.float32)
    # Half the runs draft every request from a shared automaton too (other requests' responses).
    shared = None
    if data.draw(st.booleans()):
        shared = Automaton(ngram=o["ngram"] + 2, max_nodes=400, min_depth=1)
        shared.extend(code_like(np.random.default_rng(data.draw(st.integers(0, 99))), 300, VOCAB))
    event(f"shared automaton: {shared is not None}")
    for step, op in enumerate(data.draw(operations(o["breadth"]))):
        where = f"step {step}: {op}"
        if op[0] == "add":
            rid, prompt = IDS[op[1]], op[2]
            if rid in refs:
                with pytest.raises(InvalidArgumentError, match="already in the pool"):
                    pool.add(rid, prompt)
            else:
                pool.add(rid, prompt)
                refs[rid] = Reference(o, prompt)
        elif op[0] == "remove":
            rid = IDS[op[1]]
            if rid in refs:
                pool.remove(rid)
                del refs[rid]
            else:
                with pytest.raises(InvalidArgumentError, match="unknown request id"):
                    pool.remove(rid)
        elif op[0] == "extend":
            rows, flat = op[1], op[2]
            if not op[3]:
                rows = [r for r in rows if IDS[r[0]] in refs]
                if not rows:
                    continue
            ids = [IDS[i] for i, _ in rows]
            parts = [t for _, t in rows]

            def call(ids: list = ids, parts: list = parts, flat: bool = flat) -> None:
                if flat:
                    joined = np.asarray([x for t in parts for x in t], dtype=np.int64)
                    pool.extend(ids, joined, lengths=[len(t) for t in parts])
                else:
                    pool.extend(ids, [np.asarray(t, dtype=np.int32) for t in parts])

            if all(i in refs for i in ids):
                call()
                for i, t in zip(ids, parts, strict=False):
                    refs[i].extend(t)
            else:  # a failed call must leave every request as it was (later steps check it)
                with pytest.raises(InvalidArgumentError, match="unknown request id"):
                    call()
        elif op[0] == "update":
            rid, tokens, ids, probs = IDS[op[1]], op[2], op[3], op[4]
            topk = np.asarray(ids, dtype=np.int32).reshape(len(tokens), o["breadth"])
            p = None if probs is None else np.asarray(probs, dtype=np.float32).reshape(topk.shape)
            if rid in refs:
                pool.update_topk(rid, tokens, topk, p)
                refs[rid].update(tokens, topk, p)
            else:
                with pytest.raises(InvalidArgumentError, match="unknown request id"):
                    pool.update_topk(rid, tokens, topk, p)
        else:
            if op[0] == "everything":
                order = list(refs)
                if not order:  # every request was removed: an empty batch is bad input (tested apart)
                    continue
                op[1].shuffle(order)
                committed = [code_like(np.random.default_rng(step), 3, VOCAB) for _ in order]
                pool.extend(order, committed)
                for rid, t in zip(order, committed, strict=False):
                    refs[rid].extend(t.tolist())
                op = (
                    "propose",
                    [(IDS.index(r), (step * 5 + j) % VOCAB, op[2]) for j, r in enumerate(order)],
                    True,
                    step % 2 == 0,
                    False,
                )
                if not order:
                    continue
            rows, scalar, calibrate = op[1], op[2], op[3]
            if not op[4]:
                rows = [r for r in rows if IDS[r[0]] in refs]
                if not rows:
                    continue
            ids = [IDS[i] for i, _, _ in rows]
            last = [t for _, t, _ in rows]
            caps = [c for _, _, c in rows]
            if scalar:
                caps = [caps[0]] * len(caps)
            cal = calibration if calibrate else None
            capacity = caps[0] if scalar else np.asarray(caps, dtype=np.int64)
            if not all(i in refs for i in ids):
                with pytest.raises(InvalidArgumentError, match="unknown request id"):
                    pool.propose(ids, last, capacity, calibration=cal, shared=shared)
                continue
            batch = pool.propose(ids, last, capacity, calibration=cal, shared=shared)
            event(f"proposed a batch of {'>= 8' if len(ids) >= 8 else '< 8'}")
            event(f"largest tree {'> 4' if max(batch.counts) > 4 else '<= 4'} nodes")
            assert len(batch) == len(ids)
            offsets = batch.offsets.tolist()
            assert offsets[0] == 0 and np.diff(offsets).tolist() == batch.counts.tolist()
            for j, (rid, t, c) in enumerate(zip(ids, last, caps, strict=False)):
                want = refs[rid].propose(t, c, cal, shared)
                assert_same_tree(batch.tree(j), want, f"{where}, request {rid!r}")
                lo, hi = offsets[j], offsets[j + 1]
                assert batch.tokens[lo:hi].tolist() == want.tokens.tolist()
                assert batch.parents[lo:hi].tolist() == want.parents.tolist()
                assert batch.cells[lo:hi].tolist() == want.cells.tolist()
    assert pool.ids() == list(refs)  # insertion order (a re-added id goes last), as a dict keeps it
    assert len(pool) == len(refs)


def test_ids_contains_len_clear_and_memory():
    pool = DraftPool(100, ngram=4, max_nodes=200, breadth=4)
    empty = pool.memory_bytes()
    for rid in ["x", 5, "y", -2]:
        pool.add(rid, [1, 2, 3, 1, 2])
    pool.remove(5)
    pool.add(5, np.array([], dtype=np.int64))
    assert pool.ids() == ["x", "y", -2, 5]
    assert len(pool) == 4 and "x" in pool and 5 in pool and 6 not in pool
    assert 1.5 not in pool and True not in pool and None not in pool
    per_request = (pool.memory_bytes() - empty) / 4
    assert 0 < per_request < 16 * 1024  # an empty table and a five-token automaton
    pool.remove("x")
    assert pool.memory_bytes() < empty + 4 * per_request
    pool.clear()
    assert len(pool) == 0 and pool.ids() == [] and pool.memory_bytes() == empty
    assert "DraftPool(vocab_size=100" in repr(pool)
    assert (pool.vocab_size, pool.ngram, pool.max_nodes, pool.breadth) == (100, 4, 200, 4)
    assert (pool.min_depth, pool.exempt_depth, pool.tree, pool.min_score) == (2, 1, "halving", 0.0)
    assert pool.use_retrieval and pool.use_logits and pool.threads == 1
    pool.threads = 3
    assert pool.threads == 3
    assert {"DraftPool", "BatchDraft"} <= set(racer_rs.__all__)
    assert DraftPool.__module__ == "racer_rs" and BatchDraft.__module__ == "racer_rs"


# ---------------------------------------------------------------------------------------------
# (2) SGLang's layout, rebuilt from the mask alone.


def reconstruct_from_mask(mask: np.ndarray, seq_lens: list[int], bs: int, n: int):
    """SGLang's `reconstruct_indices_from_tree_mask`, from its documented semantics: for node
    ``i`` of request ``b`` the depth is the number of earlier nodes its mask row marks,
    ``positions = depth + seq_len``, ``retrieve_index = b * n + i``, and the parent (the
    deepest marked earlier node, i.e. the last one) links ``i`` as its first child if it has
    none yet, else as the next sibling of its last child, so children stay in index order.
    """
    m = mask.reshape(bs, n, n)
    positions = np.zeros(bs * n, dtype=np.int64)
    retrieve_index = np.arange(bs * n, dtype=np.int64).reshape(bs, n)
    next_token = np.full((bs, n), -1, dtype=np.int64)
    next_sibling = np.full((bs, n), -1, dtype=np.int64)
    for b in range(bs):
        for i in range(n):
            earlier = [j for j in range(i) if m[b, i, j]]
            positions[b * n + i] = seq_lens[b] + len(earlier)
            if i == 0:
                continue
            parent = earlier[-1]
            if next_token[b, parent] == -1:
                next_token[b, parent] = i
            else:
                c = next_token[b, parent]
                while next_sibling[b, c] != -1:
                    c = next_sibling[b, c]
                next_sibling[b, c] = i
    return positions, retrieve_index, next_token, next_sibling


def parents_from_links(next_token: np.ndarray, next_sibling: np.ndarray) -> list[int]:
    """Walk first-child / next-sibling links from the root to recover every node's parent."""
    n = len(next_token)
    parents = [-2] * n
    parents[0] = -1
    stack = [0]
    while stack:
        u = stack.pop()
        c = int(next_token[u])
        while c != -1:
            parents[c] = u
            stack.append(c)
            c = int(next_sibling[c])
    return parents


def filled_pool(requests: int = 6, context: int = 400, **kw) -> tuple[DraftPool, list, list[int]]:
    """A pool whose requests hold a code-like context and a copy-logit row for every token;
    returns it, the ids, and each request's next token (the one after its indexed context)."""
    rng = np.random.default_rng(7)
    kw.setdefault("breadth", 4)
    pool = DraftPool(50, ngram=6, max_nodes=2000, **kw)
    ids: list[int | str] = [f"r{i}" if i % 2 else i for i in range(requests)]
    nexts = []
    for rid in ids:
        stream = code_like(rng, context, 50)
        pool.add(rid, stream[:-1])
        pool.update_topk(rid, np.arange(50), rng.integers(0, 50, (50, kw["breadth"])))
        nexts.append(int(stream[-1]))
    return pool, ids, nexts


@pytest.mark.parametrize("tree", ["halving", "scored"])
def test_sglang_layout_rebuilt_from_the_mask_recovers_every_tree(tree):
    pool, ids, nexts = filled_pool(tree=tree)
    capacities = [1, 4, 9, 16, 30, 2]
    batch = pool.propose(ids, nexts, capacities)
    trees = [batch.tree(i) for i in range(len(ids))]
    sizes = [len(t) for t in trees]
    assert sizes == capacities  # every row full (both sources on, every row seen)
    seq_lens = [100 + 10 * b for b in range(len(ids))]
    for n in sorted({1, 3, 9, 16, 17, 40}):
        tokens, mask = batch.sglang(n)
        bs = len(ids)
        assert tokens.dtype == np.int64 and tokens.shape == (bs * n,)
        assert mask.dtype == np.bool_ and mask.shape == (bs * n * n,)
        positions, retrieve_index, next_token, next_sibling = reconstruct_from_mask(mask, seq_lens, bs, n)
        assert retrieve_index.ravel().tolist() == list(range(bs * n))
        for b, t in enumerate(trees):
            kept = min(n, len(t))
            want_parents = t.parents.tolist()[:kept] + [0] * (n - kept)  # padding: root's children
            want_tokens = t.tokens.tolist()[:kept] + [0] * (n - kept)
            assert parents_from_links(next_token[b], next_sibling[b]) == want_parents, (b, n)
            assert tokens[b * n : (b + 1) * n].tolist() == want_tokens, (b, n)
            rows = mask.reshape(bs, n, n)[b]
            assert rows.tolist() == ancestor_mask(want_parents), (b, n)
            depths = t.depths.tolist()[:kept] + [1] * (n - kept)
            assert positions[b * n : (b + 1) * n].tolist() == [seq_lens[b] + d for d in depths]
            # first child = the smallest-index child, next sibling = the next one in index order
            for u in range(n):
                kids = [c for c in range(n) if want_parents[c] == u]
                assert next_token[b, u] == (kids[0] if kids else -1), (b, n, u)
                for x, y in zip(kids, [*kids[1:], -1], strict=False):
                    assert next_sibling[b, x] == y, (b, n, x)
            if n >= len(t):  # the whole tree is there, as DraftTree masks it
                assert t.attention_mask().tolist() == rows[: len(t), : len(t)].tolist()


def test_sglang_rejects_bad_sizes():
    pool, ids, nexts = filled_pool(requests=2)
    batch = pool.propose(ids, nexts, 8)
    for bad in (0, -3):
        with pytest.raises(InvalidArgumentError, match=r"^n: must be >= 1"):
            batch.sglang(bad)
    with pytest.raises(InvalidArgumentError, match=r"^n: .*over the limit"):
        batch.sglang(2**14)


# ---------------------------------------------------------------------------------------------
# (3) Best chains against a pure-Python oracle.


def best_chain(tokens: list[int], parents: list[int], k: int) -> list[int]:
    """The deepest root-to-leaf path (ties: the smallest leaf index), tokens after the root."""
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    leaf = min(range(len(parents)), key=lambda i: (-depth[i], i))
    path = []
    while leaf > 0:
        path.append(tokens[leaf])
        leaf = parents[leaf]
    return path[::-1][:k]


@pytest.mark.parametrize("tree", ["halving", "scored"])
def test_chains_follow_the_deepest_leaf_with_the_smallest_index(tree):
    pool, ids, nexts = filled_pool(tree=tree)
    batch = pool.propose(ids, nexts, [1, 4, 9, 16, 30, 64])
    assert batch.counts.tolist() == [1, 4, 9, 16, 30, 64]
    for k in (0, 1, 2, 5, 100):
        chains = batch.chains(k)
        assert len(chains) == len(ids)
        for i, c in enumerate(chains):
            t = batch.tree(i)
            assert c.dtype == np.int32
            assert c.tolist() == best_chain(t.tokens.tolist(), t.parents.tolist(), k)
    # The oracle on a hand-made tie: leaves 3 (under 2) and 4 (under 1) at depth 2; 3 wins.
    assert best_chain([9, 1, 2, 3, 4], [-1, 0, 0, 2, 1], 5) == [2, 3]


@pytest.mark.parametrize("tree", ["halving", "scored"])
def test_chain_table_holds_each_best_chain_with_its_cells(tree):
    pool, ids, nexts = filled_pool(tree=tree)
    batch = pool.propose(ids, nexts, [1, 4, 9, 16, 30, 64])
    for k in (0, 1, 2, 5, 100):
        tokens, cells = batch.chain_table(k)
        assert tokens.shape == cells.shape == (len(ids), k)
        assert tokens.dtype == cells.dtype == np.int32
        for i in range(len(ids)):
            t = batch.tree(i)
            # The oracle's chain, as node indices: each chain token's node is the one whose
            # parent is the previous node (tokens are distinct among siblings).
            chain = best_chain(t.tokens.tolist(), t.parents.tolist(), k)
            node, nodes = 0, []
            for token in chain:
                node = next(j for j in range(len(t)) if t.parents[j] == node and t.tokens[j] == token)
                nodes.append(node)
            n = len(chain)
            assert tokens[i, :n].tolist() == chain and (tokens[i, n:] == -1).all()
            assert cells[i, :n].tolist() == t.cells[nodes].tolist() and (cells[i, n:] == -1).all()
    with pytest.raises(InvalidArgumentError, match=r"^k: must be >= 0"):
        batch.chain_table(-1)
    with pytest.raises(InvalidArgumentError, match=r"^k: .*over the limit"):
        batch.chain_table(2**28)


# ---------------------------------------------------------------------------------------------
# (4) Byte-identical outputs across processes, hash seeds and thread counts.

DETERMINISM_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from racer_rs import DraftPool

    threads, out = int(sys.argv[1]), sys.argv[2]
    rng = np.random.default_rng(2024)
    chunks = []
    with open(out, "wb") as f:
        for tree in ("halving", "scored"):
            pool = DraftPool(500, ngram=8, max_nodes=3000, tree=tree, threads=threads)
            ids = [f"req-{i}" if i % 3 else i * 1000 for i in range(20)]
            for rid in ids:
                base = rng.integers(0, 500, (6, 10))
                stream = base[rng.integers(0, 6, 150)].ravel().astype(np.int32)
                pool.add(rid, stream)
                pool.update_topk(rid, stream[:64], rng.integers(0, 500, (64, 8)), rng.random((64, 8)))
            for step in range(6):
                order = [ids[i] for i in rng.permutation(len(ids))]
                big = step % 2 == 0  # alternate 3-token steps with 400-token (parallel) extends
                parts = [rng.integers(0, 500, 400 if big else 3) for _ in order]
                pool.extend(order, parts)
                last = rng.integers(0, 500, len(order))
                caps = rng.integers(1, 600, len(order))  # enough work for 2-3 threads
                batch = pool.propose(order, last, caps, calibration=None)
                for arr in (batch.tokens, batch.parents, batch.cells, batch.counts, batch.offsets):
                    f.write(arr.tobytes())
                for arr in batch.sglang(16):
                    f.write(arr.tobytes())
                for c in batch.chains(6):
                    f.write(c.tobytes())
    """
)


@pytest.mark.timeout(120)
def test_outputs_are_byte_identical_across_processes_hash_seeds_and_threads(tmp_path):
    outputs = []
    for seed, threads in (("0", 1), ("12345", 2), ("random", 4)):
        out = tmp_path / f"out-{seed}-{threads}.bin"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run(
            [sys.executable, "-c", DETERMINISM_SCRIPT, str(threads), str(out)],
            check=True,
            env=env,
            cwd=REPO,
            timeout=100,
        )
        outputs.append(out.read_bytes())
    assert len(outputs[0]) > 10_000
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]


# ---------------------------------------------------------------------------------------------
# (5) Bad input: the right class, a message naming the request, and no state change.


def make_pool() -> DraftPool:
    pool = DraftPool(10, ngram=4, max_nodes=200, breadth=2)
    pool.add("a", [1, 2, 3, 4, 1, 2, 3, 5, 1, 2])
    pool.add(7, [5, 6, 7, 5, 6, 8, 5, 6])
    pool.update_topk("a", [1, 2, 3], np.array([[2, 3], [3, 4], [4, 5]], dtype=np.int32))
    pool.update_topk(7, [5, 6], np.array([[6, 7], [8, 9]], dtype=np.int32), np.array([[0.6, 0.2], [0.5, 0.4]]))
    return pool


def snapshot(pool: DraftPool) -> tuple:
    ids = pool.ids()
    state: list = [len(pool), ids]
    for root in range(10):  # every root: retrieval and copy-logit rows both show any change
        b = pool.propose(ids, [root] * len(ids), 32)
        state.append((b.tokens.tolist(), b.parents.tolist(), b.cells.tolist()))
    return tuple(state)


I32 = np.int32
BAD_CALLS = [
    # add / remove
    (lambda p: p.add("a", [1]), InvalidArgumentError, r"^id \('a'\): already in the pool"),
    (lambda p: p.add(7, [1]), InvalidArgumentError, r"^id \(7\): already in the pool"),
    (lambda p: p.add("new", [1, 10]), InvalidArgumentError, r"^prompt_ids \('new'\): token 10 is outside 0\.\.10"),
    (lambda p: p.add("new", [1, -1]), InvalidArgumentError, r"^prompt_ids \('new'\): token -1"),
    (lambda p: p.add("new", np.array([1.0])), InvalidTypeError, r"^prompt_ids \('new'\): expected an integer array"),
    (lambda p: p.add(1.5, [1]), InvalidTypeError, r"^id: a request id must be an int or a str, got float"),
    (lambda p: p.add(True, [1]), InvalidTypeError, r"^id: .* got bool"),
    (lambda p: p.add(2**70, [1]), InvalidArgumentError, r"^id: int id 1180591620717411303424 does not fit"),
    (lambda p: p.remove("zz"), InvalidArgumentError, r"^id \('zz'\): unknown request id"),
    # extend
    (lambda p: p.extend(["a", "zz"], [[1], [2]]), InvalidArgumentError, r"^ids\[1\] \('zz'\): unknown request id"),
    (
        lambda p: p.extend(["a", 7, "a"], [[1], [2], [3]]),
        InvalidArgumentError,
        r"^ids\[2\] \('a'\): duplicate request id \(also ids\[0\]\)",
    ),
    (
        lambda p: p.extend(["a", 7], [[1, 2], [3, -4]]),
        InvalidArgumentError,
        r"^tokens\[1\] \(7\): token -4 is outside 0\.\.10",
    ),
    (lambda p: p.extend(["a", 7], [[1, 10], [3]]), InvalidArgumentError, r"^tokens\[0\] \('a'\): token 10"),
    (
        lambda p: p.extend(["a", 7], [[1], [2], [3]]),
        InvalidArgumentError,
        r"^tokens: expected one token array per id \(2\), got 3",
    ),
    (
        lambda p: p.extend(["a", 7], [[1], np.array([1.5])]),
        InvalidTypeError,
        r"^tokens\[1\] \(7\): expected an integer array",
    ),
    (lambda p: p.extend(["a", 7], [[1], "xy"]), InvalidTypeError, r"^tokens\[1\] \(7\): expected a sequence of ints"),
    (
        lambda p: p.extend(["a", 7], np.array([1, 2, 3], dtype=I32)),
        InvalidArgumentError,
        r"^tokens: a flat array needs lengths",
    ),
    (
        lambda p: p.extend(["a", 7], [1, 2, 3], lengths=[1, 1]),
        InvalidArgumentError,
        r"^lengths: add up to 2, but 3 tokens",
    ),
    (
        lambda p: p.extend(["a", 7], [1, 2, 3], lengths=[1, 3]),
        InvalidArgumentError,
        r"^lengths\[1\] \(7\): the lengths so far exceed",
    ),
    (
        lambda p: p.extend(["a", 7], [1, 2, 3], lengths=[-1, 4]),
        InvalidArgumentError,
        r"^lengths\[0\] \('a'\): must be >= 0",
    ),
    (
        lambda p: p.extend(["a", 7], [1, 2, 3], lengths=[3]),
        InvalidArgumentError,
        r"^lengths: expected one length per id \(2\), got 1",
    ),
    (lambda p: p.extend(["a", 7], [1, 2, 10], lengths=[1, 2]), InvalidArgumentError, r"^tokens\[1\] \(7\): token 10"),
    (lambda p: p.extend([], []), InvalidArgumentError, r"^ids: the batch is empty"),
    (lambda p: p.extend("a", [[1]]), InvalidTypeError, r"^ids: expected a sequence of request ids"),
    (
        lambda p: p.extend(["a", None], [[1], [2]]),
        InvalidTypeError,
        r"^ids\[1\]: a request id must be an int or a str, got NoneType",
    ),
    # update_topk_many: every request's rows checked before any is written
    (
        lambda p: p.update_topk_many(["a", "zz"], [1, 2], np.zeros((2, 2), dtype=I32), [1, 1]),
        InvalidArgumentError,
        r"^ids\[1\] \('zz'\): unknown request id",
    ),
    (
        lambda p: p.update_topk_many(["a", 7], [1, 2], np.array([[1, 2], [1, 10]], dtype=I32), [1, 1]),
        InvalidArgumentError,
        r"^topk_ids \(7\): token 10 is outside",
    ),
    (
        lambda p: p.update_topk_many(["a", 7], [1, 2], np.zeros((2, 2), dtype=I32), [1]),
        InvalidArgumentError,
        r"^lengths: expected one length per id \(2\), got 1",
    ),
    (
        lambda p: p.update_topk_many(["a", 7], [1, 2], np.zeros((2, 2), dtype=I32), [2, 1]),
        InvalidArgumentError,
        r"^lengths\[1\] \(7\): the lengths so far exceed the 2 tokens given",
    ),
    (
        lambda p: p.update_topk_many(["a", 7], [1, 2], np.zeros((2, 2), dtype=I32), [1, -1]),
        InvalidArgumentError,
        r"^lengths\[1\] \(7\): must be >= 0",
    ),
    (
        lambda p: p.update_topk_many(["a", 7], [1, 2], np.zeros((3, 2), dtype=I32), [1, 1]),
        InvalidArgumentError,
        r"^topk_ids: has 3 rows but tokens has 2",
    ),
    (
        lambda p: p.update_topk_many(["a"], [1], np.zeros((1, 2), dtype=I32), [1], np.full((1, 2), 1.5)),
        InvalidArgumentError,
        r"^topk_probs \('a'\)",
    ),
    (
        lambda p: p.update_topk_many(["a"], [1], np.zeros((1, 2), dtype=np.float32), [1]),
        InvalidTypeError,
        r"^topk_ids: expected a int32",
    ),
    # update_topk
    (
        lambda p: p.update_topk("zz", [1], np.zeros((1, 2), dtype=I32)),
        InvalidArgumentError,
        r"^id \('zz'\): unknown request id",
    ),
    (
        lambda p: p.update_topk("a", [1], np.zeros((1, 3), dtype=I32)),
        InvalidArgumentError,
        r"^topk_ids \('a'\): expected 2 columns, got 3",
    ),
    (
        lambda p: p.update_topk("a", [1, 2], np.zeros((3, 2), dtype=I32)),
        InvalidArgumentError,
        r"^topk_ids \('a'\): has 3 rows but tokens has 2",
    ),
    (
        lambda p: p.update_topk(7, [1], np.array([[1, 10]], dtype=I32)),
        InvalidArgumentError,
        r"^topk_ids \(7\): token 10 is outside",
    ),
    (
        lambda p: p.update_topk(7, [11], np.array([[1, 2]], dtype=I32)),
        InvalidArgumentError,
        r"^tokens \(7\): token 11 is outside",
    ),
    (
        lambda p: p.update_topk(7, [1], np.zeros((1, 2), dtype=np.float32)),
        InvalidTypeError,
        r"^topk_ids \(7\): expected a int32",
    ),
    (
        lambda p: p.update_topk(7, [1], np.zeros(2, dtype=I32)),
        InvalidArgumentError,
        r"^topk_ids \(7\): expected a 2-D array",
    ),
    (
        lambda p: p.update_topk(7, [1], np.zeros((1, 2), dtype=I32), np.full((1, 2), 1.5)),
        InvalidArgumentError,
        r"^topk_probs \(7\): probabilities must be in \[0, 1\]",
    ),
    (
        lambda p: p.update_topk(7, [1], np.zeros((1, 2), dtype=I32), np.full((1, 3), 0.5)),
        InvalidArgumentError,
        r"^topk_probs \(7\): shape \(1, 3\) differs",
    ),
    # propose
    (
        lambda p: p.propose(["a", 7, "zz"], [1, 2, 3], 8),
        InvalidArgumentError,
        r"^ids\[2\] \('zz'\): unknown request id",
    ),
    (lambda p: p.propose([7, 7], [1, 2], 8), InvalidArgumentError, r"^ids\[1\] \(7\): duplicate request id"),
    (lambda p: p.propose([], [], 8), InvalidArgumentError, r"^ids: the batch is empty"),
    (
        lambda p: p.propose(["a", 7], [1, 10], 8),
        InvalidArgumentError,
        r"^last_tokens\[1\] \(7\): token 10 is outside 0\.\.10",
    ),
    (lambda p: p.propose(["a", 7], [-1, 1], 8), InvalidArgumentError, r"^last_tokens\[0\] \('a'\): token -1"),
    (
        lambda p: p.propose(["a", 7], [1], 8),
        InvalidArgumentError,
        r"^last_tokens: expected one entry per id \(2\), got 1",
    ),
    (lambda p: p.propose(["a", 7], [1, 2], 0), InvalidArgumentError, r"^capacity: must be in 1\.\.=1048576, got 0"),
    (lambda p: p.propose(["a", 7], [1, 2], 2**70), InvalidArgumentError, r"^capacity: must be in"),
    (
        lambda p: p.propose(["a", 7], [1, 2], [8, 0]),
        InvalidArgumentError,
        r"^capacity\[1\] \(7\): must be in 1\.\.=1048576, got 0",
    ),
    (
        lambda p: p.propose(["a", 7], [1, 2], np.array([2**21, 8])),
        InvalidArgumentError,
        r"^capacity\[0\] \('a'\): must be in",
    ),
    (
        lambda p: p.propose(["a", 7], [1, 2], [8]),
        InvalidArgumentError,
        r"^capacity: expected one entry per id \(2\), got 1",
    ),
    (lambda p: p.propose(["a", 7], [1, 2], 8.0), InvalidTypeError, r"^capacity: expected an int or a sequence of ints"),
    (
        lambda p: p.propose(["a", 7], [1, 2], [8, "x"]),
        InvalidTypeError,
        r"^capacity\[1\] \(7\) must be an int, got str",
    ),
    (lambda p: p.propose(["a", 7], [1, 2], 8, calibration=[0.5]), InvalidArgumentError, r"^calibration: needs"),
    (
        lambda p: p.propose(["a", 7], [1, 2], 8, calibration=np.full(EDGE_CELLS, 2.0)),
        InvalidArgumentError,
        r"^calibration: probabilities must be in \[0, 1\]",
    ),
    (
        lambda p: p.propose(["a", 7], np.array([1.0, 2.0]), 8),
        InvalidTypeError,
        r"^last_tokens: expected an integer array",
    ),
    (
        lambda p: p.propose(["a", 2.5], [1, 2], 8),
        InvalidTypeError,
        r"^ids\[1\]: a request id must be an int or a str, got float",
    ),
    (lambda p: p.propose(7, [1], 8), InvalidTypeError, r"^ids: expected a sequence of request ids .* got int"),
    # settings and the batch's accessors
    (lambda p: setattr(p, "threads", 0), InvalidArgumentError, r"^threads: must be >= 1, got 0"),
    (lambda p: setattr(p, "threads", 5000), InvalidArgumentError, r"^threads: must be in 1\.\.=1024, got 5000"),
    (lambda p: p.propose(["a"], [1], 8).tree(1), InvalidArgumentError, r"^i: index 1 is outside -1\.\.1"),
    (lambda p: p.propose(["a"], [1], 8).chains(-1), InvalidArgumentError, r"^k: must be >= 0"),
]


def test_batched_copy_logit_writes_equal_one_call_per_request():
    one, many = make_pool(), make_pool()
    tokens = np.asarray([1, 2, 1, 5], dtype=np.int32)
    rows = np.asarray([[2, 3], [4, 5], [6, 7], [8, 9]], dtype=np.int32)
    probs = np.asarray([[0.5, 0.2], [0.4, 0.3], [0.9, 0.05], [0.6, 0.1]], dtype=np.float32)
    one.update_topk("a", tokens[:3], rows[:3], probs[:3])
    one.update_topk(7, tokens[3:], rows[3:], probs[3:])
    many.update_topk_many(["a", 7], tokens, rows, np.asarray([3, 1]), probs)
    assert snapshot(many) == snapshot(one)
    assert snapshot(many) != snapshot(make_pool())  # the rows were written


@pytest.mark.parametrize(("call", "exc", "message"), BAD_CALLS)
def test_failed_calls_name_the_request_and_change_no_state(call, exc, message):
    pool = make_pool()
    before = snapshot(pool)
    threads = pool.threads
    with pytest.raises(exc, match=message):
        call(pool)
    assert snapshot(pool) == before
    assert pool.threads == threads


BAD_CONSTRUCTORS = [
    ({"vocab_size": 0}, InvalidArgumentError, r"^vocab_size: must be >= 1"),
    ({"vocab_size": 2**40}, InvalidArgumentError, r"^vocab_size: must be in"),
    ({"vocab_size": 10, "tree": "greedy"}, InvalidArgumentError, r"^tree: must be one of 'halving', 'scored'"),
    ({"vocab_size": 10, "min_score": 1.5}, InvalidArgumentError, r"^min_score: must be in \[0, 1\]"),
    ({"vocab_size": 10, "min_score": float("nan")}, InvalidArgumentError, r"^min_score"),
    ({"vocab_size": 10, "use_retrieval": False, "use_logits": False}, InvalidArgumentError, r"cannot both be False"),
    ({"vocab_size": 10, "ngram": 10, "max_nodes": 54}, InvalidArgumentError, r"^max_nodes: must be >= ngram"),
    ({"vocab_size": 10, "ngram": 65}, InvalidArgumentError, r"^ngram: must be in 2\.\.=64"),
    ({"vocab_size": 10, "breadth": 0}, InvalidArgumentError, r"^breadth: must be >= 1"),
    ({"vocab_size": 10, "breadth": 2000}, InvalidArgumentError, r"^breadth: must be in 1\.\.=1024"),
    ({"vocab_size": 10, "min_depth": 11}, InvalidArgumentError, r"^min_depth: must be in 1\.\.=10"),
    ({"vocab_size": 10, "exempt_depth": -1}, InvalidArgumentError, r"^exempt_depth: must be >= 0"),
    ({"vocab_size": 10, "threads": 0}, InvalidArgumentError, r"^threads: must be >= 1"),
]


@pytest.mark.parametrize(("kwargs", "exc", "message"), BAD_CONSTRUCTORS)
def test_bad_settings_raise_named_errors(kwargs, exc, message):
    kwargs = dict(kwargs)
    vocab_size = kwargs.pop("vocab_size")
    with pytest.raises(exc, match=message):
        DraftPool(vocab_size, **kwargs)


def test_one_source_pools_check_and_ignore_the_other_source():
    rng = np.random.default_rng(3)
    prompt = code_like(rng, 200, 30)
    topk = rng.integers(0, 30, (20, 3))
    rows = rng.integers(0, 30, 20)
    for use_retrieval, use_logits in ((True, False), (False, True)):
        pool = DraftPool(30, ngram=5, max_nodes=500, breadth=3, use_retrieval=use_retrieval, use_logits=use_logits)
        ref = Reference(
            {
                "ngram": 5,
                "max_nodes": 500,
                "breadth": 3,
                "min_depth": 2,
                "exempt_depth": 1,
                "tree": "halving",
                "min_score": 0.0,
                "use_retrieval": use_retrieval,
                "use_logits": use_logits,
            },
            prompt.tolist(),
            vocab=30,
        )
        pool.add("r", prompt)
        pool.update_topk("r", rows, topk)
        ref.update(rows, topk, None)
        pool.extend(["r"], [prompt[:50]])
        ref.extend(prompt[:50].tolist())
        with pytest.raises(InvalidArgumentError, match=r"^topk_ids \('r'\)"):
            pool.update_topk("r", rows, topk + 30)  # still checked when ignored
        with pytest.raises(InvalidArgumentError, match=r"^tokens\[0\] \('r'\)"):
            pool.extend(["r"], [[31]])
        for root in range(30):
            assert_same_tree(pool.propose(["r"], [root], 20).tree(0), ref.propose(root, 20, None), f"root {root}")


# ---------------------------------------------------------------------------------------------
# (6) One GIL release for the whole batch.


@pytest.mark.timeout(60)
def test_large_propose_releases_the_gil():
    rng = np.random.default_rng(1)
    pool = DraftPool(1000, ngram=10, max_nodes=20_000, breadth=8)
    ids = list(range(48))
    for rid in ids:
        pool.add(rid, code_like(rng, 1000, 1000))
        pool.update_topk(rid, np.arange(1000), rng.integers(0, 1000, (1000, 8)))
    ticks = 0
    done = threading.Event()

    def counter() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0)

    t = threading.Thread(target=counter)
    t.start()
    time.sleep(0.01)
    before = ticks
    start = time.perf_counter()
    batch = pool.propose(ids, rng.integers(0, 1000, len(ids)), 2**14)
    elapsed = time.perf_counter() - start
    during = ticks - before
    done.set()
    t.join()
    assert batch.counts.tolist() == [2**14] * len(ids)
    # With the GIL held the counter could not have advanced (the call takes tens of ms).
    assert during > 10, (during, elapsed)


@given(st.lists(st.lists(st.integers(0, 6), min_size=0, max_size=40), min_size=1, max_size=5), st.integers(0, 10))
def test_retrieval_chains_are_each_automatons_chain(prompts, max_len):
    pool = DraftPool(16, ngram=6, use_logits=False)
    automata = []
    for i, prompt in enumerate(prompts):
        pool.add(i, prompt)
        automaton = Automaton(ngram=6, capacity=10_000)
        automaton.extend(prompt)
        automata.append(automaton)
    roots = [(7 * i) % 7 for i in range(len(prompts))]
    batch = pool.retrieval_chains(list(range(len(prompts))), roots, max_len)
    for i, (automaton, root) in enumerate(zip(automata, roots, strict=True)):
        tree = batch.tree(i)
        expected = automaton.chain(root, max_len)
        assert tree.tokens.tolist() == expected.tokens.tolist()
        assert tree.cells.tolist() == expected.cells.tolist()


@given(
    # Few distinct tokens: long matches, where the request's whole recent context counts.
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=30), min_size=1, max_size=4),
    st.lists(st.integers(0, 2), min_size=0, max_size=60),
    st.integers(0, 10),
)
def test_shared_retrieval_chains_are_the_shared_automatons_chain_after_each_context(prompts, corpus, max_len):
    pool = DraftPool(16, ngram=5, use_logits=False)
    shared = Automaton(ngram=6, capacity=10_000)
    shared.extend(corpus)
    for i, prompt in enumerate(prompts):
        pool.add(i, prompt)
    roots = [i % 3 for i in range(len(prompts))]
    batch = pool.retrieval_chains(list(range(len(prompts))), roots, max_len, shared=shared)
    counterparts = edge_cell_shared_counterparts()
    for i, (prompt, root) in enumerate(zip(prompts, roots, strict=True)):
        # The request's latest tokens: what its own automaton (ngram 5) keeps of its context.
        expected = shared.chain(root, max_len, prompt[-5:])
        tree = batch.tree(i)
        assert tree.tokens.tolist() == expected.tokens.tolist()
        own = expected.cells
        assert tree.cells.tolist() == np.where(own >= 0, counterparts[np.maximum(own, 0)], own).tolist()
    # Only read: the requests' own chains are as before.
    assert pool.retrieval_chains([0], [roots[0]], max_len).tree(0).tokens.tolist()[0] == roots[0]


@pytest.mark.parametrize(
    ("call", "error", "names"),
    [
        (lambda p: p.retrieval_chains([], [], 4), InvalidArgumentError, "empty"),
        (lambda p: p.retrieval_chains([0], [1], 4, shared=3), InvalidTypeError, "shared"),
        (lambda p: p.retrieval_chains(["missing"], [1], 4, shared=Automaton(4, 100)), InvalidArgumentError, "missing"),
        (lambda p: p.retrieval_chains(["missing"], [1], 4), InvalidArgumentError, "missing"),
        (lambda p: p.retrieval_chains([0, 0], [1, 1], 4), InvalidArgumentError, "0"),
        (lambda p: p.retrieval_chains([0], [1, 2], 4), InvalidArgumentError, "last_tokens"),
        (lambda p: p.retrieval_chains([0], [99], 4), InvalidArgumentError, "last_tokens"),
        (lambda p: p.retrieval_chains([0], [1], -1), InvalidArgumentError, "max_len"),
        (lambda p: p.retrieval_chains([0], [1], 2**20), InvalidArgumentError, "max_len"),
        (lambda p: p.retrieval_chains([0], [1.5], 4), InvalidTypeError, "last_tokens"),
    ],
)
def test_retrieval_chains_bad_input(call, error, names):
    pool = DraftPool(16, use_logits=False)
    pool.add(0, [1, 2, 3, 1])
    with pytest.raises(error, match=names):
        call(pool)
    assert pool.retrieval_chains([0], [2], 3).tree(0).tokens.tolist() == [2, 3, 1]  # nothing changed
