"""The per-step reductions over a step's logits: exact against their plain torch definitions."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from racer_rs.target.sampling import greedy_ids  # noqa: E402
from racer_rs.target.verifier import topk_with_probs  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 20),
    vocab=st.integers(1, 300),
    levels=st.integers(1, 4),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_greedy_ids_are_argmax_first_maximum_on_ties(rows: int, vocab: int, levels: int, dtype, seed: int) -> None:  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(seed)
    # Few distinct values: most rows hold their maximum several times.
    logits = torch.randint(0, levels, (rows, 2, vocab), generator=generator).to(dtype)
    assert torch.equal(greedy_ids(logits), logits.argmax(dim=-1))


@settings(max_examples=40, deadline=None)
@given(
    shape=st.sampled_from([(3,), (5, 2), (17, 3), (2, 9, 2), (0, 4)]),
    vocab=st.integers(8, 200),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_topk_probabilities_equal_the_softmax_of_the_whole_row(
    shape, vocab: int, temperature: float, dtype, seed: int
) -> None:  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(*shape, vocab, generator=generator)).to(dtype)
    ids, probs = topk_with_probs(logits, 4, temperature)
    scale = 1.0 / temperature if temperature > 0 else 1.0
    expected = torch.softmax(logits.float() * scale, dim=-1).gather(-1, ids)
    assert ids.shape == probs.shape == (*shape, 4)
    # The ids' logits are torch.topk's (its order of equal logits is its own; the CPU kernel
    # orders them by id: tests/target/test_logits_summary.py).
    assert torch.equal(logits.gather(-1, ids), torch.topk(logits, 4, dim=-1).values)
    torch.testing.assert_close(probs, expected, rtol=1e-5, atol=1e-7)
