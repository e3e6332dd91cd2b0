"""The decode engine: ``generate``, the decode loop (draft, verify, accept, commit), tree
verification against the target's KV cache, lossless sampling and acceptance, streaming; and
``generate_batch`` (``batch``: many prompts, one forward per step over a ragged KV cache).

This package imports torch; ``import racer_rs`` never imports it.
"""
