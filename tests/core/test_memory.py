"""Memory follows what is stored, and an allocation that fails is an ``OutOfMemoryError``.

Bounds are on ``memory_bytes()`` (what the containers hold), never on timings or RSS.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

from racer_rs import Automaton, DraftPool, LogitsTable

EMPTY_REQUEST_LIMIT = 16 * 1024


def run_limited(code: str, limit_bytes: int = 1 << 30) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter whose address space is capped at ``limit_bytes``."""
    prelude = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, ({limit_bytes}, {limit_bytes}))
        """
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_twenty_thousand_automata_under_one_gib_never_abort() -> None:
    done = run_limited(
        """
        from racer_rs import Automaton
        try:
            kept = [Automaton(max_nodes=10000) for _ in range(20000)]
            print("ok", sum(a.memory_bytes() for a in kept))
        except MemoryError as e:
            print("oom", type(e).__name__)
        """
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split()[0] in {"ok", "oom"}, done.stdout


def test_an_automaton_that_outgrows_the_address_space_raises_out_of_memory() -> None:
    # Random tokens at ngram 64 add about 63 nodes a token, with no eviction below the
    # budget: the automaton must run out of the 512 MiB, and say so with OutOfMemoryError.
    done = run_limited(
        """
        import numpy as np
        from racer_rs import Automaton
        from racer_rs.errors import OutOfMemoryError
        a = Automaton(ngram=64, max_nodes=2**31)
        rng = np.random.default_rng(0)
        try:
            for _ in range(1000):
                a.extend(rng.integers(0, 2**30, 4096, dtype=np.int64))
            print("no-oom", len(a))
        except OutOfMemoryError as e:
            n = len(a)
            a.check_integrity()  # the step that failed left no half-built node
            print("oom", n, e)
        """,
        limit_bytes=512 << 20,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith("oom"), done.stdout


def test_empty_requests_hold_under_16_kb() -> None:
    assert Automaton(max_nodes=10_000).memory_bytes() < EMPTY_REQUEST_LIMIT
    assert Automaton(ngram=64, max_nodes=10**9).memory_bytes() < EMPTY_REQUEST_LIMIT
    assert LogitsTable(152_000, 8).memory_bytes() < EMPTY_REQUEST_LIMIT
    pool = DraftPool(152_000)
    base = pool.memory_bytes()
    for i in range(10_000):
        pool.add(i, [])
    per_request = (pool.memory_bytes() - base) / 10_000
    assert 0 < per_request < EMPTY_REQUEST_LIMIT


def test_a_table_costs_the_rows_it_holds() -> None:
    table = LogitsTable(152_000, 8)
    tokens = np.arange(0, 152_000, 152, dtype=np.int64)  # 1,000 rows spread over the vocabulary
    table.update(tokens, np.zeros((len(tokens), 8), np.int64))
    row = 8 * 8 + 1 + 8  # ids, probabilities, the measured flag, the map entry
    assert len(tokens) * row <= table.memory_bytes() < 3 * len(tokens) * row + 4096
    table.clear()
    assert table.memory_bytes() == 0


def test_a_pool_of_ten_thousand_costs_what_it_stores() -> None:
    pool = DraftPool(152_000, breadth=8)
    base = pool.memory_bytes()
    prompt = np.tile(np.arange(40, dtype=np.int64), 5)  # 200 tokens, 40 distinct
    for i in range(10_000):
        pool.add(i, prompt)
    per_request = (pool.memory_bytes() - base) / 10_000
    alone = Automaton(max_nodes=10_000)
    alone.extend(prompt)
    assert alone.memory_bytes() <= per_request < alone.memory_bytes() + EMPTY_REQUEST_LIMIT
    before = pool.memory_bytes()
    rows = np.arange(100, dtype=np.int64)
    for i in range(100):
        pool.update_topk(i, rows, np.ones((100, 8), np.int64))
    grew = (pool.memory_bytes() - before) / 100
    assert 100 * (8 * 8 + 9) <= grew < 3 * 100 * (8 * 8 + 9) + 4096
