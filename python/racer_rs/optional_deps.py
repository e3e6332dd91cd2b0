"""Optional dependencies, grouped into the package's extras, checked before any work starts.

``import racer_rs`` needs only numpy. Everything else belongs to an extra of ``pyproject.toml``;
a feature that needs one calls :func:`require` up front, so a missing package is reported as one
line naming the extra to install instead of a traceback halfway through a run. Checks use
``importlib.util.find_spec``: nothing is imported.
"""

from __future__ import annotations

import importlib.util

from racer_rs.errors import MissingDependencyError

__all__ = ["EXTRAS", "INSTALL_COMMANDS", "MissingDependencyError", "install_hint", "installed", "missing", "require"]

#: Extra name -> the import names it provides (must match ``[project.optional-dependencies]``).
EXTRAS: dict[str, tuple[str, ...]] = {
    "hf": ("torch", "transformers", "safetensors", "tqdm"),
    "gguf": ("gguf", "accelerate"),
    "plots": ("matplotlib",),
    "suffix": ("arctic_inference",),
    # The serving-engine integrations (racer_rs.integrations.sglang / .vllm).
    "sglang": ("sglang",),
    "vllm": ("vllm",),
}

#: Extras whose plain ``pip install`` is not the way to get them: the exact commands instead.
#: arctic-inference (0.3.0) ships only a source distribution and declares no runtime
#: dependencies; a plain (build-isolated) ``pip install`` first installs torch>=2.10 with its
#: CUDA libraries (3.5 GB here) into a throwaway build environment, about 14 minutes on two
#: cores. Built against the torch already installed, with the build tools it needs, it takes
#: about a minute.
INSTALL_COMMANDS: dict[str, str] = {
    "suffix": (
        "pip install 'setuptools>=70.1' nanobind==2.9.2 cmake ninja grpcio-tools protobuf==5.29.6 && "
        "pip install --no-build-isolation --no-deps arctic-inference==0.3.0 "
        "(or pip install 'racer-rs[suffix]', whose isolated build first downloads torch)"
    ),
}


def installed(module: str) -> bool:
    """True when the top-level module ``module`` can be imported (it is not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that are not installed."""
    return [module for module in EXTRAS[extra] if not installed(module)]


def install_hint(extra: str) -> str:
    """The pip command(s) that install ``extra``."""
    if extra in INSTALL_COMMANDS:
        return INSTALL_COMMANDS[extra]
    return f"pip install 'racer-rs[{extra}]' (from a checkout: pip install '.[{extra}]')"


def require(extra: str, purpose: str) -> None:
    """Raise :class:`MissingDependencyError` unless every module of ``extra`` is installed.

    Args:
        extra: a key of :data:`EXTRAS`.
        purpose: what needs it, e.g. ``"loading a .gguf file"``.
    """
    absent = missing(extra)
    if absent:
        raise MissingDependencyError(
            f"{purpose} needs the '{extra}' extra ({', '.join(absent)} not installed): {install_hint(extra)}"
        )
