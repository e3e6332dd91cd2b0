"""racer_rs: fast, lossless, training-free speculative decoding with a Rust core.

``import racer_rs`` loads only the Rust core and numpy. The model layer
(:func:`racer_rs.generate`) imports torch and transformers on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from racer_rs._native import (
    Automaton,
    DraftTree,
    LogitsTable,
    __version__,
    build_draft_tree,
    prompt_lookup,
)

if TYPE_CHECKING:
    from racer_rs.generation import GenerationResult, generate

__all__ = [
    "Automaton",
    "DraftTree",
    "GenerationResult",
    "LogitsTable",
    "__version__",
    "build_draft_tree",
    "generate",
    "prompt_lookup",
]


def __getattr__(name: str) -> Any:
    # Lazy: the model layer needs torch, which `import racer_rs` must not pull in.
    if name in ("generate", "GenerationResult"):
        from racer_rs import generation

        return getattr(generation, name)
    raise AttributeError(f"module 'racer_rs' has no attribute {name!r}")
