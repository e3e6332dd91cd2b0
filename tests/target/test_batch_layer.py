"""The batch KV cache's rows: a request joining writes its own row and a finished one leaves by
moving the rows after it, without copying the whole cache, and a reused row's holes are zeros."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from racer_rs.target.batch_verifier import BatchLayer  # noqa: E402

pytestmark = pytest.mark.torch


def row(length: int, value: float) -> torch.Tensor:
    return torch.full((1, 2, length, 4), value)


def layer_with(*rows: tuple[int, float]) -> BatchLayer:
    layer = BatchLayer()
    first = row(*rows[0])
    layer.adopt(first, first, 0)
    layer.append_rows([row(*r) for r in rows], [row(*r) for r in rows])
    return layer


def test_rows_join_and_leave_in_place_and_keep_their_values() -> None:
    layer = layer_with((5, 1.0), (3, 2.0), (4, 3.0))
    assert layer.keys is not None and tuple(layer.keys.shape) == (3, 2, 5, 4)
    buffer = layer._key_buffer.data_ptr()
    layer.select_rows(torch.tensor([0, 2]))  # the middle row finished
    assert tuple(layer.keys.shape) == (2, 2, 5, 4)
    assert torch.equal(layer.keys[1, :, :4], torch.full((2, 4, 4), 3.0))
    layer.append_rows([row(2, 4.0)], [row(2, 4.0)])  # a new request takes the free row
    assert layer._key_buffer.data_ptr() == buffer  # no copy of the whole cache
    assert torch.equal(layer.keys[2, :, :2], torch.full((2, 2, 4), 4.0))
    # The reused row held the finished request's row 2 (a longer one): its holes are zeros now.
    assert torch.equal(layer.keys[2, :, 2:], torch.zeros(2, 3, 4))
    assert torch.equal(layer.values[0, :, :5], torch.full((2, 5, 4), 1.0))


def test_a_decode_step_writes_only_the_live_rows() -> None:
    layer = layer_with((3, 1.0), (3, 2.0))
    layer.select_rows(torch.tensor([1]))
    keys, _ = layer.update(row(2, 9.0), row(2, 9.0))
    assert tuple(keys.shape) == (1, 2, 5, 4)
    assert torch.equal(keys[0, :, 3:], torch.full((2, 2, 4), 9.0))
    assert torch.equal(keys[0, :, :3], torch.full((2, 3, 4), 2.0))


def test_repeated_rows_copy_the_prefix() -> None:
    layer = layer_with((3, 5.0))
    layer.select_rows(torch.tensor([0, 0, 0]))
    assert layer.keys is not None and tuple(layer.keys.shape) == (3, 2, 3, 4)
    assert torch.equal(layer.keys, torch.full((3, 2, 3, 4), 5.0))


def test_a_permutation_moves_the_rows_it_names() -> None:
    layer = layer_with((2, 1.0), (2, 2.0), (2, 3.0), (2, 4.0))
    layer.select_rows(torch.tensor([0, 3, 2]))  # row 1 finished; the last row takes its place
    assert layer.keys is not None
    assert [float(layer.keys[r, 0, 0, 0]) for r in range(3)] == [1.0, 4.0, 3.0]
    assert [float(layer.values[r, 0, 0, 0]) for r in range(3)] == [1.0, 4.0, 3.0]


def test_a_batch_that_empties_keeps_its_cache_for_the_next_rows() -> None:
    """One live row at a time (``max_batch_size=1``): each request must not allocate a new cache
    (it cost 0.1 s a request on SmolLM2), and the next one sees none of the last one's columns."""
    from racer_rs.target.batch_verifier import BatchVerifier
    from tests.helpers import random_prompt, tiny_model

    model = tiny_model("llama")
    verifier = BatchVerifier(model)
    verifier.prefill([random_prompt(1, 30)])
    layer = verifier._layers()[0]
    buffer = layer._key_buffer.data_ptr()
    verifier.commit([None])  # the row finished: the batch is empty
    assert verifier.batch == 0 and verifier.cache is not None
    assert layer.keys is not None and tuple(layer.keys.shape[::2]) == (0, 0)
    prompt = random_prompt(2, 12)
    verifier.add_rows([prompt])
    assert verifier._layers()[0] is layer and layer._key_buffer.data_ptr() == buffer
    assert verifier.cache.get_seq_length() == 12 and verifier.lengths.tolist() == [12]
    fresh = BatchVerifier(model)
    fresh.prefill([prompt])
    for got, want in zip(verifier._layers(), fresh._layers(), strict=True):
        assert torch.equal(got.keys, want.keys) and torch.equal(got.values, want.values)
