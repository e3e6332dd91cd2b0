"""racer_rs: fast, lossless, training-free speculative decoding with a Rust core.

``import racer_rs`` loads only the Rust core and numpy. The model layer
(:func:`racer_rs.generate`, :func:`racer_rs.generate_batch`, :func:`racer_rs.load_model`,
:func:`racer_rs.pack_linear_weights`, the self-draft API
:func:`racer_rs.self_draft`, :func:`racer_rs.load_self_draft`, :func:`racer_rs.distill_self_draft`)
imports torch and transformers on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from racer_rs._native import (
    EDGE_CELLS,
    Automaton,
    BatchDraft,
    DraftPool,
    DraftTree,
    LogitsTable,
    __version__,
    build_draft_tree,
    edge_cell_priors,
    prompt_lookup,
)
from racer_rs.errors import (
    CorruptFileError,
    InvalidArgumentError,
    InvalidTypeError,
    MissingDependencyError,
    ModelLoadError,
    ModelSpecError,
    OutOfMemoryError,
    RacerError,
    StateError,
    UnsupportedError,
)

if TYPE_CHECKING:
    from racer_rs.engine.generation import GenerationResult, generate, generate_batch
    from racer_rs.loading.models import load_model, resolve_model
    from racer_rs.selfdraft.checkpoint import load_self_draft
    from racer_rs.selfdraft.distillation import DistillSettings, distill_self_draft
    from racer_rs.selfdraft.model import self_draft
    from racer_rs.target.packed_linear import pack_linear_weights

__all__ = [
    "EDGE_CELLS",
    "Automaton",
    "BatchDraft",
    "CorruptFileError",
    "DistillSettings",
    "DraftPool",
    "DraftTree",
    "GenerationResult",
    "InvalidArgumentError",
    "InvalidTypeError",
    "LogitsTable",
    "MissingDependencyError",
    "ModelLoadError",
    "ModelSpecError",
    "OutOfMemoryError",
    "RacerError",
    "StateError",
    "UnsupportedError",
    "__version__",
    "build_draft_tree",
    "distill_self_draft",
    "edge_cell_priors",
    "generate",
    "generate_batch",
    "load_model",
    "load_self_draft",
    "pack_linear_weights",
    "prompt_lookup",
    "resolve_model",
    "self_draft",
]

_LAZY = {
    "generate": "racer_rs.engine.generation",
    "GenerationResult": "racer_rs.engine.generation",
    "generate_batch": "racer_rs.engine.generation",
    "load_model": "racer_rs.loading.models",
    "pack_linear_weights": "racer_rs.target.packed_linear",
    "resolve_model": "racer_rs.loading.models",
    "self_draft": "racer_rs.selfdraft.model",
    "load_self_draft": "racer_rs.selfdraft.checkpoint",
    "distill_self_draft": "racer_rs.selfdraft.distillation",
    "DistillSettings": "racer_rs.selfdraft.distillation",
}


def __getattr__(name: str) -> Any:
    # Lazy: the model layer needs torch, which `import racer_rs` must not pull in.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'racer_rs' has no attribute {name!r}")
