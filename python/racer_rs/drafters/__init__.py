"""Drafting methods and their registry.

``METHODS`` maps a method name to ``"module:factory"``; modules are imported only when their
method is requested, so a method whose module is missing fails only when it is used.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any

from racer_rs.errors import InvalidArgumentError, InvalidTypeError

if TYPE_CHECKING:
    from racer_rs.drafters.base import Drafter

METHODS: dict[str, str] = {
    "ar": "racer_rs.drafters.ar:AutoregressiveDrafter",
    "pld": "racer_rs.drafters.pld:PromptLookupDrafter",
    "token_recycling": "racer_rs.drafters.token_recycling:TokenRecyclingDrafter",
    "racer": "racer_rs.drafters.racer:racer",
    "racer_scored": "racer_rs.drafters.racer:racer_scored",
    "racer_retrieval": "racer_rs.drafters.racer:racer_retrieval",
    "racer_logits": "racer_rs.drafters.racer:racer_logits",
    "draft_model": "racer_rs.drafters.draft_model:make_drafter",
    "tts": "racer_rs.drafters.tts:make_drafter",
    "racer_tts": "racer_rs.drafters.racer_tts:make_drafter",
    "suffix": "racer_rs.drafters.suffix:suffix",
    "suffix_chain": "racer_rs.drafters.suffix:suffix_chain",
}

#: Methods that need an optional extra beyond the engine's (see :mod:`racer_rs.optional_deps`);
#: building one without it raises ``MissingDependencyError`` before any work.
METHOD_EXTRAS: dict[str, str] = {
    "suffix": "suffix",
    "suffix_chain": "suffix",
}


def available_methods() -> list[str]:
    """Names of every registered method (their modules are not imported)."""
    return list(METHODS)


def make_drafter(method: str, model: Any, **options: Any) -> Drafter:
    """Build the drafter of ``method`` for ``model``.

    Args:
        method: a name from :data:`METHODS`.
        model: the target model (some drafters read its config or use it directly).
        **options: the method's keyword options.

    Raises:
        ValueError: unknown method or an option the method does not take.
        TypeError: ``method`` is not a string.
    """
    factory = _factory(method)
    _check_options(method, factory, options)
    drafter: Drafter = factory(model, **options)
    return drafter


def calibrated_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``method``'s defaults for calibrated trees (``capacity="auto"``) added
    where the caller gave none (a factory's ``calibrated_defaults``; e.g. RACER's shorter
    retrieval matches, :data:`racer_rs.drafters.racer.CALIBRATED_MIN_DEPTH`)."""
    defaults = getattr(_factory(method), "calibrated_defaults", {})
    return {**defaults, **options}


def accepted_options(method: str) -> tuple[str, ...]:
    """The option names ``method``'s drafter takes (its module is imported)."""
    factory = _factory(method)
    declared = getattr(factory, "accepted_options", None)
    if declared is not None:
        return tuple(declared)
    parameters = inspect.signature(factory).parameters.values()
    return tuple(p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "model")


def _factory(method: str) -> Any:
    if not isinstance(method, str):
        raise InvalidTypeError(f"method must be a string, got {type(method).__name__}")
    if method not in METHODS:
        raise InvalidArgumentError(f"method: unknown method {method!r}; available: {', '.join(METHODS)}")
    module_name, factory_name = METHODS[method].split(":")
    return getattr(importlib.import_module(module_name), factory_name)


def _check_options(method: str, factory: Any, options: dict[str, Any]) -> None:
    parameters = inspect.signature(factory).parameters.values()
    if getattr(factory, "accepted_options", None) is None and any(p.kind is p.VAR_KEYWORD for p in parameters):
        return  # the factory validates its own options
    accepted = accepted_options(method)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        names = ", ".join(sorted(accepted)) or "none"
        raise InvalidArgumentError(f"unknown option(s) {', '.join(unknown)} for method {method!r}; accepted: {names}")
