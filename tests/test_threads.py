"""One native object shared by several threads stays consistent (internal locks)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from racer_rs import Automaton, LogitsTable, build_draft_tree


@pytest.mark.timeout(60)
def test_concurrent_extend_retrieve_and_build_keep_integrity():
    a = Automaton(ngram=6, capacity=400)
    table = LogitsTable(32, top_k=4)
    rng = np.random.default_rng(0)
    table.update(np.arange(32, dtype=np.int32), rng.integers(0, 32, (32, 4)).astype(np.int32))
    errors: list[BaseException] = []
    total = 0
    lock = threading.Lock()

    def writer(seed: int) -> None:
        nonlocal total
        r = np.random.default_rng(seed)
        try:
            for _ in range(200):
                chunk = r.integers(0, 32, size=int(r.integers(1, 100))).astype(np.int32)
                a.extend(chunk)
                with lock:
                    total += len(chunk)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def reader(seed: int) -> None:
        r = np.random.default_rng(seed)
        try:
            for _ in range(400):
                tree = build_draft_tree(a, table, int(r.integers(0, 32)), 32)
                assert 1 <= len(tree) <= 32
                assert len(a.retrieve(int(r.integers(0, 32)), 16)) <= 16
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=reader, args=(10 + i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(a) <= 400
    a.check_integrity()
    assert total > 0


@pytest.mark.timeout(60)
def test_long_extend_releases_the_gil():
    """A second Python thread keeps running while a long `extend` works in Rust."""
    a = Automaton(ngram=10, capacity=10_000)
    tokens = np.random.default_rng(1).integers(0, 5000, size=400_000).astype(np.int32)
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
    a.extend(tokens)
    during = ticks - before
    done.set()
    t.join()
    assert during > 10  # with the GIL held the counter could not have advanced
    a.check_integrity()
