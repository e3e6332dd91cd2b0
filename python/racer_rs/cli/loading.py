"""Loading a model and its tokenizer for the command line, with one-line errors.

Model specs are resolved by :mod:`racer_rs.loading.models` (short names, checkpoint folders,
``.gguf`` files); this module names the option in their errors. torch and transformers are
imported inside functions, so that ``racer --help`` and input validation stay fast.
"""

from __future__ import annotations

from typing import Any

from racer_rs.errors import error_context
from racer_rs.loading.models import DTYPES, ModelSource

__all__ = ["DTYPES", "check_model", "load_model"]


def check_model(spec: str, what: str = "--model") -> ModelSource:
    """Resolve a model spec and check the packages loading it needs, before any work starts.

    Raises:
        ModelSpecError: the spec names nothing loadable.
        MissingDependencyError: a package or extra is missing.
    """
    from racer_rs.loading import models as model_loading

    with error_context(what):
        source = model_loading.resolve_model(spec)
        model_loading.check_dependencies(source)
    return source


def load_model(spec: str, dtype: str, device: str, what: str = "--model", pack_weights: bool = True) -> tuple[Any, Any]:
    """Load a causal LM (eval mode, on ``device``) and its tokenizer.

    Args:
        spec: A short name, checkpoint folder, ``.gguf`` file or hub id.
        dtype: One of :data:`DTYPES`.
        device: A torch device string (already resolved).
        what: The option the spec came from, for error messages.
        pack_weights: Pack half-precision CPU linear weights once (``--no-pack-weights``: no).

    Raises:
        RacerError: The model cannot be loaded (its message names ``what``).
    """
    import sys

    from transformers.utils import logging as hf_logging

    from racer_rs.loading import gguf_cache
    from racer_rs.loading import models as model_loading

    source = check_model(spec, what)
    if model_loading.needs_conversion(source):
        what_file = source.location
        if source.parts is not None:
            what_file = f"{spec} (assembled from its {len(source.parts.parts)} part packages)"
        print(
            f"racer: converting {what_file} to float weights once "
            f"(cached in {gguf_cache.cache_root()}; later loads take seconds)",
            file=sys.stderr,
        )
    hf_logging.disable_progress_bar()
    with error_context(what):
        return model_loading.load_model(spec, dtype=dtype, device=device, pack_weights=pack_weights)
