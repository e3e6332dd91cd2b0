"""``logits_summary`` (the Rust kernel on the CPU, torch elsewhere) against torch as the oracle.

Each check is one function, :func:`check_summary`, that every test applies; the counterparts at
the end show it rejects a summary broken in each way it could plausibly go wrong (the argmax's
tie rule, a top-k id missed, the probabilities' normaliser or temperature, NaN taken for -inf).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from racer_rs import _native  # noqa: E402
from racer_rs.errors import InvalidArgumentError, InvalidTypeError, RacerError  # noqa: E402
from racer_rs.target import sampling  # noqa: E402
from racer_rs.target.sampling import logits_summary, topk_ids  # noqa: E402

Summary = Callable[[Any, int, float], tuple[Any, Any, Any]]
NATIVE_DTYPES = (torch.bfloat16, torch.float32)


def oracle_probs(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """torch's probabilities of ``ids``: ``exp(logit / T - logsumexp(logits / T))`` in float32."""
    scale = 1.0 / temperature if temperature > 0 else 1.0
    scaled = logits.float() * scale
    return (scaled.gather(-1, ids) - torch.logsumexp(scaled, dim=-1, keepdim=True)).exp()


def check_summary(summary: Summary, logits: torch.Tensor, k: int, temperature: float) -> None:
    """``summary(logits, k, temperature)`` against torch: the argmax exactly ``torch.max``'s
    index; the ids' logits exactly ``torch.topk``'s values, largest first (NaN first), so the id
    sets equal torch's wherever the values are distinct; for the native kernel's dtypes, equal
    logits by id, the lowest ids kept (``torch.topk``'s order of ties, the fallback's, is its
    own); the probabilities within float32 rounding of torch's (NaN exactly where torch's are)."""
    ties_by_id = logits.dtype in NATIVE_DTYPES
    ids, probs, greedy = summary(logits, k, temperature)
    lead = tuple(logits.shape[:-1])
    assert tuple(ids.shape) == (*lead, k) and tuple(probs.shape) == (*lead, k) and tuple(greedy.shape) == lead
    assert ids.dtype == torch.int64 and greedy.dtype == torch.int64 and probs.dtype == torch.float32
    assert torch.equal(greedy, logits.max(dim=-1).indices), "argmax differs from torch.max"
    rows = logits.reshape(-1, logits.shape[-1]).float()
    flat_ids = ids.reshape(-1, k)
    want_values, want_ids = torch.topk(rows, k, dim=-1)
    got_values = rows.gather(-1, flat_ids)
    assert _same(got_values, want_values), "top-k values differ"
    for row, got, want, values in zip(rows, flat_ids, want_ids, want_values, strict=True):
        assert len(set(got.tolist())) == k, "an id twice"
        # Ties by id: the ids of equal logits ascend; and the kept ties are the lowest ids.
        for a, b, va, vb in zip(got[:-1], got[1:], values[:-1], values[1:], strict=True) if ties_by_id else ():
            if va == vb or (va.isnan() and vb.isnan()):
                assert a < b, "equal logits out of id order"
        kth = values[-1]
        if ties_by_id and not kth.isnan():
            tied = (row == kth).nonzero().flatten()
            kept = [i for i in got.tolist() if row[i] == kth]
            assert kept == tied[: len(kept)].tolist(), "not the lowest ids among the k-th's ties"
        # Distinct values, none tied with a logit left out: the set is torch's.
        if values.unique().numel() == k and not values.isnan().any() and int((row >= kth).sum()) == k:
            assert set(got.tolist()) == set(want.tolist())
    assert_probs_close(probs, logits, ids, temperature)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN where the other is NaN."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])


def assert_probs_close(probs: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> None:
    """Within 2e-5 of torch's, relative, plus float32's rounding of the logsumexp ``lse`` that
    both subtract (4 ulp of ``lse``: ``exp`` turns an absolute error into a relative one; at a
    temperature of 1e-3 a logit of 8 is 8000 and one ulp there is 1e-3); NaN where torch's are."""
    want = oracle_probs(logits, ids, temperature)
    scale = 1.0 / temperature if temperature > 0 else 1.0
    lse = torch.logsumexp(logits.float() * scale, dim=-1, keepdim=True)
    tolerance = 2e-5 + 4 * torch.finfo(torch.float32).eps * lse.abs()
    assert torch.equal(probs.isnan(), want.isnan()), "probabilities not close: NaN elsewhere than torch's"
    known = ~want.isnan()
    error = (probs - want).abs()[known]
    allowed = (tolerance * want).nan_to_num(nan=0.0)[known] + 1e-7  # an infinite lse: want is 0
    assert (error <= allowed).all(), f"probabilities not close: {error.max()}"


def tied_logits(shape: tuple[int, ...], vocab: int, dtype: torch.dtype, seed: int, levels: int) -> torch.Tensor:
    """Random logits rounded to ``levels`` values (few levels: many ties, at the top too)."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randint(0, levels, (*shape, vocab), generator=generator).float() * (8.0 / levels)
    return values.to(dtype)


@settings(max_examples=80, deadline=None)
@given(
    shape=st.sampled_from([(1,), (3,), (2, 3), (16, 1), (1, 5), (0,), (2, 0, 3)]),
    vocab=st.sampled_from([1, 7, 8, 9, 100, 511, 512, 513, 1025, 4000]),
    k=st.integers(1, 12),
    temperature=st.sampled_from([0.0, 1e-3, 0.5, 1.0, 1.7]),
    dtype=st.sampled_from((*NATIVE_DTYPES, torch.float16)),
    ties=st.sampled_from([2, 5, 30, 0]),
    seed=st.integers(0, 2**16),
)
def test_summary_agrees_with_torch(
    shape: tuple[int, ...], vocab: int, k: int, temperature: float, dtype: torch.dtype, ties: int, seed: int
) -> None:
    k = min(k, vocab)
    if ties:
        logits = tied_logits(shape, vocab, dtype, seed, ties)
    else:
        generator = torch.Generator().manual_seed(seed)
        logits = (4 * torch.randn(*shape, vocab, generator=generator)).to(dtype)
    check_summary(logits_summary, logits, k, temperature)


def ids_alone(ids_of: Callable[[Any, int], Any]) -> Summary:
    """A summary made of an ids-only function: torch's probabilities of its ids and its first id
    as the argmax (torch's own where ``torch.topk`` orders ties), so that :func:`check_summary`
    judges the ids alone."""

    def summary(logits: Any, k: int, temperature: float) -> tuple[Any, Any, Any]:
        ids = ids_of(logits, k)
        greedy = ids[..., 0] if logits.dtype in NATIVE_DTYPES else logits.max(dim=-1).indices
        return ids, oracle_probs(logits, ids, temperature), greedy

    return summary


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from([(1,), (3,), (2, 3), (16, 1), (0,)]),
    vocab=st.sampled_from([1, 7, 9, 511, 513, 4000]),
    k=st.integers(1, 12),
    dtype=st.sampled_from((*NATIVE_DTYPES, torch.float16)),
    ties=st.sampled_from([2, 5, 30, 0]),
    seed=st.integers(0, 2**16),
)
def test_topk_ids_are_the_summary_ids(
    shape: tuple[int, ...], vocab: int, k: int, dtype: torch.dtype, ties: int, seed: int
) -> None:
    k = min(k, vocab)
    if ties:
        logits = tied_logits(shape, vocab, dtype, seed, ties)
    else:
        logits = (4 * torch.randn(*shape, vocab, generator=torch.Generator().manual_seed(seed))).to(dtype)
    check_summary(ids_alone(topk_ids), logits, k, 1.0)
    if dtype in NATIVE_DTYPES:
        assert torch.equal(topk_ids(logits, k), logits_summary(logits, k, 1.0)[0])


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_topk_ids_take_nan_first_and_fail_when_broken(dtype: torch.dtype) -> None:
    logits = tied_logits((16, 2), 3000, dtype, 7, 6)
    logits[3, 1, 2500] = float("nan")
    check_summary(ids_alone(topk_ids), logits, 8, 1.0)
    assert topk_ids(logits, 8)[3, 1, 0] == 2500
    last_dropped = ids_alone(
        lambda x, k: torch.cat([topk_ids(x, k + 1)[..., : k - 1], topk_ids(x, k + 1)[..., k:]], -1)
    )
    highest_first = ids_alone(lambda x, k: x.shape[-1] - 1 - topk_ids(x.flip(-1), k))
    for broken, message in ((last_dropped, "values|lowest ids"), (highest_first, "argmax|lowest ids|id order")):
        with pytest.raises(AssertionError, match=message):
            check_summary(broken, logits, 8, 1.0)


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_a_vocabulary_row_of_a_real_size(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(4, 2, 49152, generator=generator)).to(dtype)
    logits[0, 0, 777] = logits[0, 0, 40000] = logits[0, 0].max() + 1  # a tie at the top
    check_summary(logits_summary, logits, 8, 0.7)
    assert logits_summary(logits, 8, 0.7)[2][0, 0] == 777


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_nan_and_infinities_follow_torch(dtype: torch.dtype) -> None:
    logits = tied_logits((6,), 700, dtype, 0, 50)
    nan, inf = float("nan"), float("inf")
    logits[0, 600] = logits[0, 5] = nan  # NaN ranks first: argmax 5, probabilities NaN
    logits[1, 300] = inf  # logsumexp +inf: NaN for the +inf entry, 0 for the others
    logits[2, :] = -inf  # nothing but -inf: NaN probabilities
    logits[3, 10:20] = -inf  # some -inf: no mass
    logits[4, 1] = logits[4, 650] = inf
    logits[5, 0] = nan
    logits[5, 1] = inf
    check_summary(logits_summary, logits, 3, 1.0)
    ids, probs, greedy = logits_summary(logits, 3, 1.0)
    assert greedy.tolist()[:3] == [5, 300, 0] and ids[0, :2].tolist() == [5, 600]
    assert probs[0].isnan().all() and probs[2].isnan().all() and not probs[3].isnan().any()
    assert probs[1, 0].isnan() and (probs[1, 1:] == 0).all()


def test_scaled_logits_that_overflow_follow_torch() -> None:
    logits = tied_logits((2,), 600, torch.float32, 1, 40)
    logits[0, 3] = 3e38
    check_summary(logits_summary, logits, 2, 0.1)  # 3e39 is +inf in float32


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_views_gradients_and_inference_tensors(dtype: torch.dtype) -> None:
    base = tied_logits((3, 4), 300, dtype, 2, 1000)
    check_summary(logits_summary, base[:, ::2], 4, 1.0)  # not contiguous: copied
    check_summary(logits_summary, base.transpose(0, 1), 4, 1.0)
    check_summary(logits_summary, base.float().requires_grad_(), 4, 1.0)
    with torch.inference_mode():
        inference = base.clone()
    check_summary(logits_summary, inference, 4, 1.0)


def test_the_native_kernel_serves_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    native = _native.logits_summary
    monkeypatch.setattr(sampling._native, "logits_summary", lambda *a: calls.append(a) or native(*a))
    for dtype in NATIVE_DTYPES:
        logits_summary(torch.zeros(2, 10, dtype=dtype), 2, 1.0)
    logits_summary(torch.zeros(2, 10, dtype=torch.float16), 2, 1.0)  # float16: torch
    assert [a[0].dtype for a in calls] == [np.int16, np.float32]


def test_topk_with_probs_keeps_its_meaning() -> None:
    from racer_rs.target.verifier import topk_with_probs

    logits = tied_logits((5,), 200, torch.bfloat16, 4, 20)
    ids, probs = topk_with_probs(logits, 6, 0.0)
    assert torch.equal(ids, logits_summary(logits, 6, 1.0)[0])
    assert_probs_close(probs, logits, ids, 1.0)


# --- bad input: RacerError subclasses, never a panic ------------------------------------------


def _rows(dtype: Any = np.float32, shape: tuple[int, ...] = (3, 10)) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: _native.logits_summary(_rows(np.float64), 2), InvalidTypeError, "dtype"),
        (lambda: _native.logits_summary(_rows(np.int32), 2), InvalidTypeError, "dtype"),
        (lambda: _native.logits_summary(_rows(np.float16), 2), InvalidTypeError, "dtype"),
        (lambda: _native.logits_summary([[1.0, 2.0]], 1), InvalidTypeError, "numpy array"),
        (lambda: _native.logits_summary(_rows(shape=(10,)), 2), InvalidArgumentError, "2-D"),
        (lambda: _native.logits_summary(_rows(shape=(2, 3, 10)), 2), InvalidArgumentError, "2-D"),
        (lambda: _native.logits_summary(_rows(), 0), InvalidArgumentError, "k"),
        (lambda: _native.logits_summary(_rows(), -3), InvalidArgumentError, "k"),
        (lambda: _native.logits_summary(_rows(), 11), InvalidArgumentError, "k"),
        (lambda: _native.logits_summary(_rows(shape=(3, 0)), 1), InvalidArgumentError, "k"),
        (lambda: _native.logits_summary(_rows(), True), InvalidTypeError, "k"),
        (lambda: _native.logits_summary(_rows(), 2.0), InvalidTypeError, "k"),
        (lambda: _native.logits_summary(_rows(shape=(3, 20))[:, ::2], 2), InvalidArgumentError, "contiguous"),
        (lambda: _native.logits_summary(_rows(shape=(20, 3)).T, 2), InvalidArgumentError, "contiguous"),
        (lambda: _native.logits_summary(_rows(), 2, 0.0), InvalidArgumentError, "scale"),
        (lambda: _native.logits_summary(_rows(), 2, -1.0), InvalidArgumentError, "scale"),
        (lambda: _native.logits_summary(_rows(), 2, float("nan")), InvalidArgumentError, "scale"),
        (lambda: _native.logits_summary(_rows(), 2, float("inf")), InvalidArgumentError, "scale"),
        (lambda: _native.logits_summary(_rows(), 2, 1e300), InvalidArgumentError, "scale"),
        (lambda: _native.logits_summary(_rows(), 2, "1"), InvalidTypeError, "scale"),
        (lambda: _native.logits_topk(_rows(np.float64), 2), InvalidTypeError, "dtype"),
        (lambda: _native.logits_topk(_rows(shape=(10,)), 2), InvalidArgumentError, "2-D"),
        (lambda: _native.logits_topk(_rows(), 0), InvalidArgumentError, "k"),
        (lambda: _native.logits_topk(_rows(), 11), InvalidArgumentError, "k"),
        (lambda: _native.logits_topk(_rows(), 2, 1.0), TypeError, "argument"),
        (lambda: _native.logits_topk(_rows(shape=(20, 3)).T, 2), InvalidArgumentError, "contiguous"),
        (lambda: topk_ids(torch.zeros(3, 10), 11), InvalidArgumentError, "k"),
        (lambda: logits_summary(torch.zeros(3, 10), 0, 1.0), InvalidArgumentError, "k"),
        (lambda: logits_summary(torch.zeros(3, 10), 11, 1.0), InvalidArgumentError, "k"),
    ],
)
def test_bad_input_is_a_racer_error(call: Callable[[], Any], error: type[RacerError], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_the_native_function_reads_bf16_bits_of_either_integer_dtype() -> None:
    logits = tied_logits((4,), 300, torch.bfloat16, 5, 1000)
    signed = _native.logits_summary(logits.view(torch.int16).numpy(), 5, 1.0)
    unsigned = _native.logits_summary(logits.view(torch.int16).numpy().view(np.uint16), 5, 1.0)
    as_float = _native.logits_summary(logits.float().numpy(), 5, 1.0)
    for a, b, c in zip(signed, unsigned, as_float, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


# --- the checks' power: each broken counterpart fails them --------------------------------------


def _last_index_on_ties(logits: Any, k: int, temperature: float) -> tuple[Any, Any, Any]:
    ids, probs, _ = logits_summary(logits, k, temperature)
    v = logits.shape[-1]
    return ids, probs, v - 1 - logits.flip(-1).float().nan_to_num(nan=np.inf).argmax(dim=-1)


def _kth_dropped(logits: Any, k: int, temperature: float) -> tuple[Any, Any, Any]:
    ids, _, greedy = logits_summary(logits, k + 1, temperature)
    keep = torch.cat([ids[..., : k - 1], ids[..., k:]], dim=-1)  # the (k+1)-th instead of the k-th
    return keep, oracle_probs(logits, keep, temperature), greedy


def _highest_ids_on_ties(logits: Any, k: int, temperature: float) -> tuple[Any, Any, Any]:
    flipped = logits.flip(-1)
    ids, probs, _ = logits_summary(flipped, k, temperature)
    ids = logits.shape[-1] - 1 - ids
    return ids, probs, logits_summary(logits, k, temperature)[2]


def _unscaled_probs(logits: Any, k: int, temperature: float) -> tuple[Any, Any, Any]:
    ids, _, greedy = logits_summary(logits, k, temperature)
    return ids, oracle_probs(logits, ids, 1.0), greedy


def _probs_off_by_1e4(logits: Any, k: int, temperature: float) -> tuple[Any, Any, Any]:
    ids, probs, greedy = logits_summary(logits, k, temperature)
    return ids, probs * (1 + 1e-4), greedy


def _nan_as_minus_inf(logits: Any, k: int, temperature: float) -> tuple[Any, Any, Any]:
    return logits_summary(logits.nan_to_num(nan=-np.inf), k, temperature)


@pytest.mark.parametrize(
    ("broken", "temperature", "message"),
    [
        (_last_index_on_ties, 1.0, "argmax"),
        (_kth_dropped, 1.0, "values|lowest ids"),
        (_highest_ids_on_ties, 1.0, "lowest ids|id order"),
        (_unscaled_probs, 0.5, "close"),
        (_probs_off_by_1e4, 1.0, "close"),
    ],
)
@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_each_broken_counterpart_fails_the_check(
    broken: Summary, temperature: float, message: str, dtype: torch.dtype
) -> None:
    logits = tied_logits((16, 2), 3000, dtype, 7, 6)  # every row's top tied many times over
    check_summary(logits_summary, logits, 8, temperature)
    with pytest.raises(AssertionError, match=message):
        check_summary(broken, logits, 8, temperature)


def test_nan_taken_for_minus_inf_fails_the_check() -> None:
    logits = tied_logits((3,), 500, torch.float32, 8, 40)
    logits[1, 250] = float("nan")
    check_summary(logits_summary, logits, 4, 1.0)
    with pytest.raises(AssertionError):
        check_summary(_nan_as_minus_inf, logits, 4, 1.0)
