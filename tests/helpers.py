"""The tests' shared builders: tiny seeded models, reference decoding, prompts, models on disk.

Every family the engine claims to support is built here from a config; nothing is downloaded.
Sections: tiny models in memory; plain decoding (the references the engine is checked against);
prompts; models written to disk: a Llama folder with a byte-level tokenizer for the CLI tests and
a ``.gguf`` file for the loaders' tests, both with :data:`CHAT_TEMPLATE`.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
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

from racer_rs.target.sampling import SamplingConfig, draw_uniforms, sample_position

VOCAB = 96
WINDOW = 256


#: :func:`tiny_llama`'s keywords for the self-draft tests' deeper model: four layers and an
#: untied head. With this init its greedy output is varied (about ten distinct tokens in 40) and
#: its first two layers predict like the whole model about half the time, so a self-draft has
#: tokens both accepted and rejected. (A tied head would make the model mostly repeat its input
#: token.)
DEEP_LLAMA: dict[str, Any] = {"layers": 4, "heads": 4, "tied": False, "init": 0.05}


def tiny_llama(
    seed: int | None = 0,
    *,
    vocab: int = VOCAB,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    window: int = 512,
    tied: bool = True,
    init: float = 0.1,
    **config: Any,
) -> LlamaForCausalLM:
    """The tests' one Llama builder: a tiny random float32 Llama (two key-value heads, an MLP
    twice the hidden size) in eval mode.

    The defaults give a model whose greedy output is varied (``init`` above transformers' 0.02),
    the draft or target of the draft-model, TTS, EOS and auto-capacity tests. The other tests'
    models are keyword arguments of the same builder: ``tiny_model("llama")`` (four heads, window
    :data:`WINDOW`, untied, ``init=0.02``), :data:`DEEP_LLAMA`, the TTS tests' drafts
    (``init=0.02``), and the models :func:`write_tiny_model` and :func:`write_tiny_gguf` write.

    Args:
        seed: torch's seed, set just before initialisation; None keeps the generator's state
            (:func:`tiny_model` seeds it).
        vocab, hidden, layers, heads: the shape.
        window: ``max_position_embeddings``.
        tied: tie the output embeddings to the input ones.
        init: ``initializer_range``.
        config: further ``LlamaConfig`` fields (token ids, ``rms_norm_eps``, ...).
    """
    if seed is not None:
        torch.manual_seed(seed)
    llama_config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=2,
        max_position_embeddings=window,
        tie_word_embeddings=tied,
        initializer_range=init,
        **config,
    )
    return LlamaForCausalLM(llama_config).eval()


def _llama(vocab: int) -> PreTrainedModel:
    return tiny_llama(None, vocab=vocab, heads=4, window=WINDOW, tied=False, init=0.02)


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


def own_request_only(method: str) -> dict[str, Any]:
    """Options that make ``method`` draft from each request alone: no index shared by a call's
    rows (the racer methods' default has one), so a row drafts what its request drafts alone."""
    from racer_rs.drafters import accepted_options

    return {"index": None} if "index" in accepted_options(method) else {}


def random_prompt(seed: int, length: int = 24, vocab: int = VOCAB) -> list[int]:
    """A seeded prompt of distinct-looking random tokens (few repeated n-grams)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


# --- models on disk ----------------------------------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def write_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Write a tiny random Llama model and a byte-level BPE tokenizer (257 tokens) to ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|endoftext|>": 0, **{char: index + 1 for index, char in enumerate(alphabet)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    model = tiny_llama(seed, vocab=len(vocab), tied=False, init=0.02, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    # Zero the output rows of every token but printable ASCII: greedy text is then readable and
    # soon repeats, so prompt lookup finds drafts that the target accepts.
    ascii_ids = tokenizer(string.ascii_letters + string.digits + string.punctuation + " \n")["input_ids"]
    keep = torch.zeros(len(vocab), dtype=torch.bool)
    keep[ascii_ids] = True
    with torch.no_grad():
        model.lm_head.weight[~keep] = 0.0
    model.save_pretrained(folder)
    return folder


# The GGUF file: a tiny random Llama written with the ``gguf`` package's writer. The tensors are
# stored in float32 and named and permuted as llama.cpp's converter does (the query and key
# projections are reordered for its rotary layout), so loading the file back through transformers
# must reproduce the original model exactly.


def _byte_level_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return ["<|endoftext|>", *sorted(bytes_to_unicode().values()), "he"]


MERGES = ["h e"]


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's query/key reordering (transformers undoes it when loading)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_tiny_gguf(path: Path, seed: int = 0) -> LlamaForCausalLM:
    """Write a tiny random Llama and a byte-level tokenizer to ``path``; return the model."""
    import gguf

    tokens = _byte_level_tokens()
    model = tiny_llama(
        seed,
        vocab=len(tokens),
        heads=4,
        window=256,
        tied=False,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] + [1] * (len(tokens) - 1))  # <|endoftext|> is a control token
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)

    state = {name: tensor.detach().numpy().astype(np.float32) for name, tensor in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        names = {
            "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj",
            "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj",
        }
        for gguf_name, hf_name in names.items():
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", state[prefix + hf_name + ".weight"])
        query = _permute(state[prefix + "self_attn.q_proj.weight"], config.num_attention_heads)
        key = _permute(state[prefix + "self_attn.k_proj.weight"], config.num_key_value_heads)
        writer.add_tensor(f"blk.{layer}.attn_q.weight", query)
        writer.add_tensor(f"blk.{layer}.attn_k.weight", key)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


# --- the decode engine, driven by hand ---------------------------------------------------------


def one_row_engine(
    model: PreTrainedModel,
    drafter: Any,
    sampling: SamplingConfig,
    *,
    capacity: int = 16,
    eos: tuple[int, ...] = (),
    engine_class: Any = None,
    verifier: Any = None,
) -> tuple[Any, list[Any]]:
    """A :class:`racer_rs.engine.decode_engine.DecodeEngine` for one row with a fixed capacity
    (``engine_class``: a subclass under test; ``verifier``: a BatchVerifier of the test's), and the
    list its finished rows' states are appended to."""
    import time

    from racer_rs.engine.capacity import FixedCapacity
    from racer_rs.engine.decode_engine import DecodeEngine
    from racer_rs.engine.drafting import RowDrafting
    from racer_rs.target.batch_verifier import BatchVerifier

    finished: list[Any] = []
    engine = (engine_class or DecodeEngine)(
        verifier if verifier is not None else BatchVerifier(model),
        RowDrafting(lambda: drafter, 1, drafter),
        sampling,
        FixedCapacity(capacity),
        eos,
        1,
        time.perf_counter(),
        lambda state, _engine: finished.append(state),
        False,
    )
    return engine, finished


def run_engine(
    model: PreTrainedModel,
    drafter: Any,
    sampling: SamplingConfig,
    prompt: list[int] | np.ndarray,
    max_new_tokens: int,
    *,
    seed: int | None = None,
    capacity: int = 16,
    eos: tuple[int, ...] = (),
    engine_class: Any = None,
) -> Any:
    """Decode one request with ``drafter`` through the engine (``engine_class``: a subclass under
    test); its finished :class:`racer_rs.engine.decode_engine.DecodeState`."""
    from racer_rs.engine.decode_engine import Request

    engine, finished = one_row_engine(model, drafter, sampling, capacity=capacity, eos=eos, engine_class=engine_class)
    engine.run([Request(0, np.asarray(prompt, dtype=np.int32), max_new_tokens, seed)])
    return finished[0]
