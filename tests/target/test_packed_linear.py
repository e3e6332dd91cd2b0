"""Half-precision linear layers with their weights packed once (``racer_rs.target.packed_linear``):
the same results as ``F.linear`` at tree sizes (bit for bit without a bias, to the last bit with one), the packed
copy never used stale or under autograd,
the model otherwise as it was (parameters, ties, copies, state dict), and nothing packed where it
does not pay."""

from __future__ import annotations

import copy
import pickle

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.autosize import state  # noqa: E402
from racer_rs.target import packed_linear  # noqa: E402
from racer_rs.target.packed_linear import (  # noqa: E402
    PackedLinear,
    pack_linear_weights,
    packed_layers,
    unpack_linear_weights,
)
from tests.helpers import plain_greedy, random_prompt, tiny_model  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not packed_linear._ops_available(), reason="this torch has no oneDNN linear kernels"),
]


#: The tests that pack bfloat16 layers: where this CPU's oneDNN cannot (an AVX2-only x86 CPU has
#: no bfloat16 kernels), packing leaves them as they are
#: (test_a_dtype_without_packed_kernels_is_left_unpacked checks that).
needs_bfloat16_packing = pytest.mark.skipif(
    not packed_linear.dtype_supported(torch.bfloat16),
    reason="this CPU's oneDNN has no bfloat16 packing (no AVX512-BF16 or AMX): bfloat16 layers stay unpacked here",
)


def half_model(family: str = "llama", dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    return tiny_model(family, seed=1, sharpen=4.0).to(dtype)


def linear_count(model: torch.nn.Module) -> int:
    return sum(1 for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2, 7, 33])
def test_packed_forwards_without_biases_equal_plain_ones_bit_for_bit(
    family: str, dtype: torch.dtype, tokens: int
) -> None:
    plain = half_model(family, dtype)
    packed = copy.deepcopy(plain)
    if not packed_linear.dtype_supported(dtype):
        assert pack_linear_weights(packed, measure=False) == 0  # left as it was, no error
        pytest.skip(f"this CPU's oneDNN has no {dtype} packing (float16 needs AVX512-FP16 or AVX-NE-CONVERT)")
    assert pack_linear_weights(packed, measure=False) == linear_count(plain) > 0
    ids = torch.tensor([random_prompt(tokens, length=tokens)])
    with torch.no_grad():
        assert torch.equal(packed(ids).logits, plain(ids).logits)
        assert torch.equal(packed(ids.repeat(3, 1)).logits, plain(ids.repeat(3, 1)).logits)  # batch rows


@needs_bfloat16_packing
@pytest.mark.parametrize("family", ["qwen2", "gpt_neox", "phi"])
def test_packed_forwards_with_biases_differ_at_most_in_rounding(family: str) -> None:
    plain = half_model(family)
    packed = copy.deepcopy(plain)
    assert pack_linear_weights(packed, measure=False) == linear_count(plain) > 0
    ids = torch.tensor([random_prompt(11, length=11)] * 2)
    with torch.no_grad():
        torch.testing.assert_close(packed(ids).logits, plain(ids).logits)  # bfloat16's tolerances


@needs_bfloat16_packing
def test_packed_layers_use_the_packed_copy_for_several_rows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    model = half_model()
    pack_linear_weights(model, measure=False)
    calls: list[int] = []
    real = packed_linear._packed_product
    monkeypatch.setattr(packed_linear, "_packed_product", lambda x, *a: calls.append(x.shape[-2]) or real(x, *a))
    with torch.no_grad():
        model(torch.tensor([[1]]))
        assert calls == []  # one token: torch's own matrix-vector path
        model(torch.tensor([[1, 2, 3]]))
    assert len(calls) == linear_count(model) and set(calls) == {3}


@needs_bfloat16_packing
def test_float32_layers_and_linear_subclasses_are_left_alone() -> None:
    assert pack_linear_weights(tiny_model("llama")) == 0  # float32: F.linear does not repack there

    class Custom(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), Custom(8, 8)).to(torch.bfloat16)
    assert pack_linear_weights(model, measure=False) == 1
    assert type(model[0]) is PackedLinear and type(model[1]) is Custom


def _layer(weight_key_broken: bool, monkeypatch: pytest.MonkeyPatch) -> PackedLinear:
    layer = torch.nn.Linear(16, 24).to(torch.bfloat16)
    pack_linear_weights(layer, measure=False)
    if weight_key_broken:  # a layer that never notices its weight changed
        monkeypatch.setattr(PackedLinear, "_weight_key", lambda self: "always the same")
        layer.repack()
    assert isinstance(layer, PackedLinear)
    return layer


@needs_bfloat16_packing
@pytest.mark.parametrize("broken", [False, True])
def test_a_weight_changed_in_place_is_packed_again(broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _layer(broken, monkeypatch)
    x = torch.randn(4, 16).to(torch.bfloat16)
    new_weights = torch.randn(24, 16).to(torch.bfloat16)
    with torch.no_grad():
        layer(x)
        layer.weight.copy_(new_weights)  # an optimizer step or load_state_dict does this
        fresh = torch.equal(layer(x), torch.nn.functional.linear(x, new_weights, layer.bias))
    assert fresh is not broken  # the counterpart that ignores the change computes with the old weight


def test_a_weight_replaced_or_moved_is_not_multiplied_by_the_old_copy() -> None:
    layer = torch.nn.Linear(16, 24).to(torch.bfloat16)
    pack_linear_weights(layer, measure=False)
    x = torch.randn(4, 16)
    with torch.no_grad():
        layer.weight.data = torch.randn(24, 16).to(torch.bfloat16)  # new storage, same version
        assert torch.equal(layer(x.bfloat16()), torch.nn.functional.linear(x.bfloat16(), layer.weight, layer.bias))
        layer.float()
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_gradients_flow_as_through_a_plain_layer() -> None:
    plain = torch.nn.Linear(16, 24).to(torch.bfloat16)
    packed = copy.deepcopy(plain)
    pack_linear_weights(packed, measure=False)
    x = torch.randn(5, 16).to(torch.bfloat16)
    plain(x).float().square().sum().backward()
    packed(x).float().square().sum().backward()
    assert packed.weight.grad is not None and plain.weight.grad is not None
    assert torch.equal(packed.weight.grad, plain.weight.grad)


@needs_bfloat16_packing
def test_the_model_stays_what_it_was_copies_pickles_ties_and_state_dict() -> None:
    model = half_model()
    model.get_output_embeddings().weight = model.get_input_embeddings().weight  # tied, as SmolLM2's are
    keys = sorted(model.state_dict())
    pack_linear_weights(model, measure=False)
    assert sorted(model.state_dict()) == keys  # the packed copies are not state
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied
    ids = torch.tensor([random_prompt(5, length=9)])
    with torch.no_grad():
        expected = model(ids).logits
        for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert packed_layers(twin) == packed_layers(model)
            assert torch.equal(twin(ids).logits, expected)
    assert unpack_linear_weights(model) == linear_count(model)
    assert packed_layers(model) == 0 and all(type(m) is not PackedLinear for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected)


def test_nothing_is_packed_where_it_does_not_measure_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    timings = iter([1.0, 2.0] * 4)  # F.linear first, then the packed product: always slower
    monkeypatch.setattr(packed_linear, "_fastest", lambda call: next(timings))
    model = half_model()
    assert pack_linear_weights(model) == 0 and packed_layers(model) == 0
    monkeypatch.setattr(packed_linear, "_ops_available", lambda: False)
    assert pack_linear_weights(model, measure=False) == 0  # no kernels: nothing


@needs_bfloat16_packing
def test_greedy_generation_is_unchanged_and_its_cost_curve_is_its_own() -> None:
    model = half_model()
    prompt = random_prompt(7, length=20) * 2
    expected = racer_rs.generate(model, prompt, method="racer", capacity=8, max_new_tokens=20)
    key = state.cost_key(model)
    pack_linear_weights(model, measure=False)
    result = racer_rs.generate(model, prompt, method="racer", capacity=8, max_new_tokens=20)
    assert result.tokens == expected.tokens and result.accepted_lengths == expected.accepted_lengths
    assert result.tokens[:5] == plain_greedy(model, prompt, 5)
    assert state.cost_key(model) == key + "-packed"  # a packed model's forward costs differ


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_dtype_without_packed_kernels_is_left_unpacked(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """Where oneDNN cannot pack a dtype (float16 on a CPU without AVX512-FP16, bfloat16 on an
    AVX2-only one), packing skips those layers instead of raising from the reorder."""
    monkeypatch.setattr(packed_linear, "_DTYPE_SUPPORTED", {dtype: False})
    model = half_model("llama", dtype)
    assert pack_linear_weights(model, measure=False) == 0
    assert packed_linear.packed_layers(model) == 0


@needs_bfloat16_packing
def test_a_packed_model_moved_to_a_dtype_without_kernels_multiplies_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model packed in bfloat16 and then moved to float16 where float16 cannot be packed
    computes with ``F.linear``, not a repack that raises."""
    monkeypatch.setattr(packed_linear, "_DTYPE_SUPPORTED", {torch.float16: False})
    packed = half_model("llama", torch.bfloat16)
    assert pack_linear_weights(packed, measure=False) > 0
    packed = packed.to(torch.float16)
    plain = half_model("llama", torch.bfloat16).to(torch.float16)
    ids = torch.tensor([random_prompt(5, length=5)])
    with torch.no_grad():
        assert torch.equal(packed(ids).logits, plain(ids).logits)
