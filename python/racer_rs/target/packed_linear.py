"""Half-precision linear layers on the CPU with their weights packed once, not at every call.

A tree verification forward multiplies a few tokens (2 to 64 per row) by every weight matrix. In
bfloat16 on an x86 CPU, torch's ``F.linear`` has a fast matrix-vector path for one token, but
with two tokens or more it hands the product to oneDNN, which reorders (packs) the whole weight
matrix into its blocked layout on every call: on this project's 2-core EPYC (one thread) one
SmolLM2-135M MLP projection takes 70 us for one token and 136 us for two (the packing, not the
arithmetic), so a 2-token tree forward cost 1.40x a one-token forward and no draft could pay for
less than that. Packed once, the same product takes 66 us for two tokens and 79 us for sixteen,
and the whole 2-token forward costs 1.09x the one-token one
(``python benches/bench_packed_linear.py``).

:func:`pack_linear_weights` turns every plain ``nn.Linear`` of a model whose weights are
bfloat16 or float16 on the CPU into a :class:`PackedLinear` (the same module object: its class is
swapped, its parameters, hooks and tied weights stay as they were) that keeps a packed copy of its
weight next to it. The product is oneDNN's, as ``F.linear``'s is for several rows, but not
always bit for bit: at tree-verification sizes a bias-free layer gave the same bits here, while
a layer with a bias may get it added before the single rounding to half precision (torch's own
small-matrix path may round the product first), and a big product (a prefill of a few hundred
rows on two threads) is split differently over the threads for a packed weight. Values may then
differ in their last bits, as half-precision kernels for one and for several tokens already do:
greedy outputs in half precision may part only at near-ties either way, which ``racer bench``
checks. It uses the packed copy only where that pays and is safe:

- more than one token row (one row keeps torch's matrix-vector path, as fast and already exact);
- no gradient needed (training, e.g. Test-Time Speculation's draft updates, takes ``F.linear``);
- the weight is still the one packed: same storage, dtype, device and in-place version (an
  optimizer step or ``load_state_dict`` bumps the version; the layer then packs it again, once,
  which costs what ``F.linear`` spends on every multi-row call).

It packs only where it measured the packed product faster on this machine (one of the model's
own matrices, two and sixteen rows), so a CPU whose ``F.linear`` is already fast is left alone.
The packed copies take as much memory again as the packed weights (about 0.27 GB for
SmolLM2-135M, 1 GB for Qwen2.5-Coder-0.5B); :func:`unpack_linear_weights` frees them.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

#: Dtypes whose CPU ``F.linear`` repacks the weight at every multi-row call.
PACKED_DTYPES = (torch.bfloat16, torch.float16)
#: Row counts the packed product is timed at before a model is packed (a small tree, a big one).
PROBE_ROWS = (2, 16)
#: Timed calls per row count and kernel (the fastest is kept).
PROBE_CALLS = 12


def _ops_available() -> bool:
    mkldnn = torch.ops.mkldnn
    try:
        return (
            torch.backends.mkldnn.is_available()
            and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise")
        )
    except (AttributeError, RuntimeError):
        return False


#: Per dtype, whether this machine's oneDNN packs and multiplies weights of it (probed once).
_DTYPE_SUPPORTED: dict[torch.dtype, bool] = {}


def dtype_supported(dtype: torch.dtype) -> bool:
    """Whether weights of ``dtype`` are packed here: one of :data:`PACKED_DTYPES` whose packed
    kernels run on this machine (float16's reorder needs AVX512-FP16 or AVX-NE-CONVERT and
    raises on other x86 CPUs: an AMD EPYC with AVX-512 BF16 packs bfloat16, not float16)."""
    if dtype not in PACKED_DTYPES:
        return False
    if dtype not in _DTYPE_SUPPORTED:
        try:
            _packed_product(torch.ones(2, 4, dtype=dtype), _pack(torch.ones(4, 4, dtype=dtype)), None)
            _DTYPE_SUPPORTED[dtype] = True
        except (AttributeError, RuntimeError, TypeError, ValueError):  # no such op, or not for this dtype
            _DTYPE_SUPPORTED[dtype] = False
    return _DTYPE_SUPPORTED[dtype]


def _pack(weight: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), max(PROBE_ROWS))
    return packed


def _packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    product: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return product


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` that multiplies multi-row inputs by a weight packed once (see the module
    docstring); made by :func:`pack_linear_weights` from a plain ``nn.Linear``, never built
    directly."""

    _packed: torch.Tensor | None
    _packed_of: tuple[int, int, torch.dtype, torch.device] | None

    def _weight_key(self) -> tuple[int, int, torch.dtype, torch.device]:
        weight = self.weight
        return (weight.data_ptr(), weight._version, weight.dtype, weight.device)

    def repack(self) -> None:
        """Pack the current weight (after it changed in place)."""
        self._packed = _pack(self.weight)
        self._packed_of = self._weight_key()

    def __getstate__(self) -> dict[str, Any]:
        # The packed copy is an opaque oneDNN tensor that cannot be copied or pickled: a copy of
        # the layer (copy.deepcopy, pickle) packs its own weight on first use.
        state = dict(self.__dict__)
        state["_packed"] = state["_packed_of"] = None
        return state

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (
            input.numel() == input.shape[-1]  # one row: torch's matrix-vector path
            or input.dtype != weight.dtype
            or weight.device.type != "cpu"
            or not dtype_supported(weight.dtype)  # e.g. a packed model moved to float16 here
            or (torch.is_grad_enabled() and (weight.requires_grad or input.requires_grad))
        ):
            return F.linear(input, weight, self.bias)
        if self._packed is None or self._packed_of != self._weight_key():
            self.repack()
        assert self._packed is not None
        return _packed_product(input, self._packed, self.bias)


def _plain_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's ``nn.Linear`` modules themselves (not subclasses, which may compute otherwise)
    with weights on the CPU in a dtype packed here (:func:`dtype_supported`)."""
    return [
        module
        for module in model.modules()
        if type(module) is torch.nn.Linear
        and module.weight.device.type == "cpu"
        and dtype_supported(module.weight.dtype)
    ]


def _fastest(call: Any) -> float:
    best = float("inf")
    for _ in range(PROBE_CALLS + 1):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def packing_pays(linear: torch.nn.Linear) -> bool:
    """Whether the packed product of ``linear``'s weight beats ``F.linear`` at every probe row
    count on this machine and gives the same result (timed interleaved, fastest call kept)."""
    weight, bias = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
    try:
        packed = _pack(weight)
        with torch.no_grad():
            for rows in PROBE_ROWS:
                x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows)).to(weight.dtype)
                if not torch.equal(_packed_product(x, packed, bias), F.linear(x, weight, bias)):
                    return False
                plain = _fastest(lambda x=x: F.linear(x, weight, bias))
                fast = _fastest(lambda x=x: _packed_product(x, packed, bias))
                if fast >= plain:
                    return False
    except (RuntimeError, TypeError, ValueError):  # an oneDNN build without this dtype or op
        return False
    return True


def _most_weight(linears: list[torch.nn.Linear]) -> torch.nn.Linear:
    """A layer of the weight shape that holds most of the model's weights (where its forwards
    spend their time: the MLP projections of a transformer, not its one output head)."""
    totals: dict[tuple[int, ...], int] = {}
    for linear in linears:
        shape = tuple(linear.weight.shape)
        totals[shape] = totals.get(shape, 0) + linear.weight.numel()
    heaviest = max(totals, key=lambda shape: totals[shape])
    return next(linear for linear in linears if tuple(linear.weight.shape) == heaviest)


def pack_linear_weights(model: torch.nn.Module, *, measure: bool = True) -> int:
    """Pack the weights of ``model``'s half-precision CPU ``nn.Linear`` layers (in place).

    Args:
        model: a torch model; layers on another device, in float32 or of another class are left
            as they are.
        measure: pack only if the packed product measures faster than ``F.linear`` here (on a
            layer of the shape that holds most weights); ``False`` packs wherever the kernels
            exist.

    Returns:
        The number of layers packed (0: nothing to pack, no such kernel for the layers' dtype,
        or no gain here).
    """
    if not _ops_available():
        return 0
    linears = _plain_linears(model)
    if not linears:
        return 0
    if measure and not packing_pays(_most_weight(linears)):
        return 0
    for linear in linears:
        linear.__class__ = PackedLinear
        assert isinstance(linear, PackedLinear)
        linear.repack()
    return len(linears)


def unpack_linear_weights(model: torch.nn.Module) -> int:
    """Turn ``model``'s :class:`PackedLinear` layers back into plain ``nn.Linear`` (freeing the
    packed copies); returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is PackedLinear:
            layer: Any = module
            del layer._packed, layer._packed_of
            layer.__class__ = torch.nn.Linear
            count += 1
    return count


def packed_layers(model: torch.nn.Module) -> int:
    """How many of ``model``'s layers are :class:`PackedLinear`."""
    return sum(1 for module in model.modules() if type(module) is PackedLinear)
