"""transformers' own decoding, run as benchmark peers of racer_rs's methods.

What a user would pick instead of racer_rs, measured in the same process on the same prompts:

- ``hf``: ``model.generate`` (plain greedy decoding or sampling);
- ``hf_pld``: ``model.generate(prompt_lookup_num_tokens=10)`` (transformers' prompt lookup);
- ``hf_assisted``: ``model.generate(assistant_model=draft)`` (transformers' assisted generation,
  with its default draft length and confidence threshold, as a user would run it).

Each call returns a :class:`racer_rs.engine.generation.GenerationResult`. Steps are the target's decode
forward calls plus the final token, which needs none, as in racer_rs's engine; the tokens each step
committed are read from the target's cache length at its forward calls (a forward pre-hook), so MAT
means the same for peers and for racer_rs's methods. Importing this module does not import torch.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from racer_rs.errors import InvalidArgumentError

if TYPE_CHECKING:
    from racer_rs.engine.generation import GenerationResult

#: Peer method names.
PEERS = ("hf", "hf_pld", "hf_assisted")
#: Draft tokens per prompt-lookup step (transformers' documented example value).
PROMPT_LOOKUP_TOKENS = 10


class _CacheLengthProbe:
    """Records the target's cache length, the tokens fed and the time at the start of each of its
    forward calls."""

    def __init__(self, model: Any) -> None:
        self.starts: list[int] = []
        self.times: list[float] = []
        self.inputs: list[int] = []
        self._handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.times.append(time.perf_counter())
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        self.starts.append(int(cache.get_seq_length()) if cache is not None else -1)
        ids: Any = kwargs.get("input_ids", args[0] if args else None)
        self.inputs.append(int(ids.shape[-1]) if hasattr(ids, "shape") else 0)

    def remove(self) -> None:
        self._handle.remove()


def accepted_lengths(starts: Sequence[int], prompt_length: int, new_tokens: int) -> list[int]:
    """Tokens committed per step, from the cache length at each target forward call.

    The first call is the prefill; decode call ``k`` feeds the tokens from cache position
    ``starts[k]`` on, so it committed ``starts[k + 1] - starts[k]`` of them; the last call's
    tokens run up to the one before the final token, which is a step of its own (it needs no
    forward). Returns ``[]`` when the calls cannot be read (no cache was passed).
    """
    decode = list(starts[1:])
    if new_tokens == 0 or any(start < 0 for start in decode) or (starts and starts[0] != 0):
        return []
    if not decode:
        return [1] * new_tokens  # one token, from the prefill alone
    ends = [*decode[1:], prompt_length + new_tokens - 1]
    lengths = [end - start for start, end in zip(decode, ends, strict=False)] + [1]
    if any(length < 1 for length in lengths) or sum(lengths) != new_tokens:
        return []
    return lengths


def generate_with_transformers(
    model: Any,
    input_ids: Sequence[int],
    *,
    method: str,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
    assistant_model: Any = None,
) -> GenerationResult:
    """Generate with transformers' ``model.generate`` as the peer ``method``.

    Args:
        model: the target causal LM.
        input_ids: the prompt's token ids.
        method: one of :data:`PEERS`.
        max_new_tokens: the token budget.
        temperature: 0 for greedy decoding, else sampling with ``top_p`` / ``top_k`` (0: off).
        eos_token_id: ids that end generation.
        seed: seeds torch's global RNG (transformers samples from it).
        assistant_model: the draft model (``hf_assisted`` only).

    Returns:
        The result; ``timings`` holds ``total`` and ``prefill`` (until the first decode forward).
    """
    import torch
    from transformers import GenerationConfig

    from racer_rs.engine.generation import GenerationResult

    if method not in PEERS:
        raise InvalidArgumentError(f"method: unknown transformers peer {method!r}; available: {', '.join(PEERS)}")
    if method == "hf_assisted" and assistant_model is None:
        raise InvalidArgumentError("method hf_assisted needs a draft model (assistant_model)")
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    settings: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": 0,
        "eos_token_id": eos or None,
        "pad_token_id": eos[0] if eos else 0,
        "do_sample": temperature > 0,
    }
    if temperature > 0:
        # top_k=0 and top_p=1 switch the filters off (transformers' defaults would apply top_k=50).
        settings.update(temperature=temperature, top_p=top_p, top_k=top_k)
    if method == "hf_pld":
        settings["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_TOKENS
    config = GenerationConfig(**settings)
    device = next(model.parameters()).device
    ids = torch.tensor([list(input_ids)], dtype=torch.long, device=device)
    extra: dict[str, Any] = {"assistant_model": assistant_model} if method == "hf_assisted" else {}
    if seed is not None:
        torch.manual_seed(seed)
    probe = _CacheLengthProbe(model)
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            output = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **extra)
    finally:
        probe.remove()
    total = time.perf_counter() - start
    prefill = probe.times[1] - start if len(probe.times) > 1 else total
    tokens = output[0, ids.shape[1] :].tolist()
    lengths = accepted_lengths(probe.starts, ids.shape[1], len(tokens))
    steps = len(lengths) if lengths else max(1, len(probe.starts))
    positions = [0, *itertools.accumulate(lengths)][: len(lengths)]
    return GenerationResult(
        tokens=tokens,
        accepted_lengths=lengths,
        mat=len(tokens) / steps if tokens else 0.0,
        steps=steps,
        timings={"prefill": prefill, "total": total},
        positions=positions,
        method=method,
        # Tokens the target verified in its decode forwards (the prefill excluded), as the
        # engine's tree nodes are counted.
        extras={"target_forward_calls": len(probe.starts), "verified_nodes": sum(probe.inputs[1:])},
    )
