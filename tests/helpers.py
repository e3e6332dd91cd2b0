"""Tiny randomly initialised causal LMs (float32, seeded) for engine tests.

Every family the engine claims to support is built here from a config; nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PhiConfig,
    PhiForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from racer_rs.engine.sampling import SamplingConfig, draw_uniforms, sample_position

VOCAB = 96
WINDOW = 256


def _llama(vocab: int) -> PreTrainedModel:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=WINDOW,
    )
    return LlamaForCausalLM(config)


def _qwen2(vocab: int) -> PreTrainedModel:
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=WINDOW,
        use_sliding_window=False,
    )
    return Qwen2ForCausalLM(config)


def _qwen3(vocab: int) -> PreTrainedModel:
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=WINDOW,
    )
    return Qwen3ForCausalLM(config)


def _gpt_neox(vocab: int) -> PreTrainedModel:
    config = GPTNeoXConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=WINDOW,
        rotary_pct=0.5,
    )
    return GPTNeoXForCausalLM(config)


def _phi(vocab: int) -> PreTrainedModel:
    config = PhiConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=WINDOW,
        partial_rotary_factor=0.5,
    )
    return PhiForCausalLM(config)


FAMILIES: dict[str, Callable[[int], PreTrainedModel]] = {
    "llama": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "gpt_neox": _gpt_neox,
    "phi": _phi,
}


def tiny_model(family: str, seed: int = 0, vocab: int = VOCAB, sharpen: float = 1.0) -> PreTrainedModel:
    """A seeded tiny model of ``family`` in float32 eval mode.

    Args:
        family: a key of :data:`FAMILIES`.
        seed: initialisation seed.
        vocab: vocabulary size.
        sharpen: scales the output embeddings; values above 1 make the next-token
            distribution peakier, so drafts get accepted more often in tests.
    """
    torch.manual_seed(seed)
    model = FAMILIES[family](vocab).float().eval()
    if sharpen != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(sharpen)  # tied or not: the head's rows
    return model


@torch.inference_mode()
def plain_greedy(model: PreTrainedModel, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding: one token per forward with the model's own cache and masks."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]
    tokens: list[int] = []
    for _ in range(max_new_tokens):
        tokens.append(int(logits.argmax()))
        logits = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True).logits[0, -1]
    return tokens


@torch.inference_mode()
def plain_sampling(
    model: PreTrainedModel, prompt: list[int], new_tokens: int, config: SamplingConfig, seed: int
) -> list[int]:
    """Plain sampling, one token per forward, sampling position ``t`` with uniforms row ``t``
    (the engine's position-keyed sampler, so a seed gives every method the same text)."""
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(seed)
    uniforms = draw_uniforms(new_tokens + 1, generator)
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]
    tokens: list[int] = []
    for position in range(new_tokens):
        tokens.append(sample_position(logits, config, uniforms[position], generator))
        logits = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True).logits[0, -1]
    return tokens


REPEATING_PROMPT = [3, 17, 42, 8, 3, 17, 42, 8, 3, 17, 42, 8, 55, 3, 17, 42]
"""A prompt whose n-grams recur, so retrieval drafters find matches."""


def random_prompt(seed: int, length: int = 24, vocab: int = VOCAB) -> list[int]:
    """A seeded prompt of distinct-looking random tokens (few repeated n-grams)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


def seeded_llama(seed: int, hidden: int = 32, vocab: int = 96, init: float = 0.1) -> PreTrainedModel:
    """A seeded float32 Llama whose greedy output is varied (``init`` above the default 0.02),
    used as a draft or target in the draft-model and TTS tests."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=init,
    )
    return LlamaForCausalLM(config).eval()
