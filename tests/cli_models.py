"""A tiny random Llama model and byte-level tokenizer written to disk, for the CLI tests."""

from __future__ import annotations

import string
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def write_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Write a tiny random Llama model and a byte-level BPE tokenizer (257 tokens) to ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|endoftext|>": 0, **{char: index + 1 for index, char in enumerate(alphabet)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # Zero the output rows of every token but printable ASCII: greedy text is then readable and
    # soon repeats, so prompt lookup finds drafts that the target accepts.
    ascii_ids = tokenizer(string.ascii_letters + string.digits + string.punctuation + " \n")["input_ids"]
    keep = torch.zeros(len(vocab), dtype=torch.bool)
    keep[ascii_ids] = True
    with torch.no_grad():
        model.lm_head.weight[~keep] = 0.0
    model.save_pretrained(folder)
    return folder
