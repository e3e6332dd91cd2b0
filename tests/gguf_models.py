"""A tiny random Llama written to a ``.gguf`` file with the ``gguf`` package's writer.

The tensors are stored in float32 and named and permuted as llama.cpp's converter does (the query
and key projections are reordered for its rotary layout), so loading the file back through
transformers must reproduce the original model exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


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


def tiny_llama(seed: int = 0, vocab: int = 258) -> LlamaForCausalLM:
    """A seeded tiny float32 Llama with untied input and output embeddings."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    return LlamaForCausalLM(config).eval()


def write_tiny_gguf(path: Path, seed: int = 0) -> LlamaForCausalLM:
    """Write a tiny random Llama and a byte-level tokenizer to ``path``; return the model."""
    import gguf

    tokens = _byte_level_tokens()
    model = tiny_llama(seed, vocab=len(tokens))
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
