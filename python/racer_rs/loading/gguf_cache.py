"""A GGUF file converted once to float weights, cached on disk.

transformers dequantizes a GGUF checkpoint on every ``from_pretrained(..., gguf_file=...)`` call
(about 30 s for a 135M model on a CPU) and refuses ``save_pretrained`` on the result. The first
load here converts the file once and stores an ordinary checkpoint folder (``model.safetensors``,
``config.json``, ``generation_config.json`` and the tokenizer) in a user cache folder, keyed by
the GGUF file's content, so later loads read safetensors in seconds.

Safety:

- an entry is written into a temporary folder and renamed into place only when complete; its
  manifest, written last, records every file's size and SHA-256, and an entry is used only when
  every file matches. A half-written, truncated or corrupted entry is rebuilt, never loaded;
- converters of the same file serialise on a lock file, so two processes converting at once
  produce one entry and neither reads the other's partial output.

The cache folder is ``$RACER_RS_CACHE``, else ``$XDG_CACHE_HOME/racer_rs``, else
``~/.cache/racer_rs``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from racer_rs._io import file_digest

CACHE_ENV = "RACER_RS_CACHE"
#: Bumped whenever an entry's layout changes; entries of another format are rebuilt.
FORMAT = 1
MANIFEST = "racer_rs_entry.json"
# Entries already hashed by this process, keyed by their files' (name, size, mtime): loading
# checks an entry twice (before work starts, then to load it); hash it once.
_verified: set[tuple[str, tuple[tuple[str, int, int], ...]]] = set()


def cache_root() -> Path:
    """The user cache folder of racer_rs (see the module docstring)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "racer_rs"


_source_digests: dict[tuple[str, int, int], str] = {}


def source_digest(gguf_path: Path) -> str:
    """:func:`file_digest` of a GGUF file, computed once per process per (path, size, mtime)."""
    stat = gguf_path.stat()
    key = (str(gguf_path), stat.st_size, stat.st_mtime_ns)
    if key not in _source_digests:
        _source_digests[key] = file_digest(gguf_path)
    return _source_digests[key]


def entry_folder(gguf_path: Path, digest: str, root: Path | None = None) -> Path:
    """Where the converted checkpoint of a GGUF file with content ``digest`` lives."""
    return (root or cache_root()) / "gguf" / f"{gguf_path.stem}-{digest[:16]}"


def is_valid_entry(entry: Path, digest: str) -> bool:
    """True when ``entry`` is a complete conversion of the GGUF file with content ``digest``.

    Every file the manifest lists must exist with its recorded size and SHA-256.
    """
    try:
        manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT or manifest.get("source", {}).get("sha256") != digest:
            return False
        files = manifest["files"]
        if not files or "model.safetensors" not in files:
            return False
        stats = {name: (entry / name).stat() for name in files}
        if any(stats[name].st_size != expected["size"] for name, expected in files.items()):
            return False
        signature = (str(entry), tuple(sorted((n, s.st_size, s.st_mtime_ns) for n, s in stats.items())))
        if signature in _verified:
            return True
        if any(file_digest(entry / name) != expected["sha256"] for name, expected in files.items()):
            return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    _verified.add(signature)
    return True


def cached_entry(gguf_path: str | Path, root: Path | None = None) -> Path | None:
    """The valid cache entry of ``gguf_path``, or ``None`` if it has to be converted first."""
    gguf_path = Path(gguf_path).resolve()
    digest = source_digest(gguf_path)
    entry = entry_folder(gguf_path, digest, root)
    return entry if is_valid_entry(entry, digest) else None


Converter = Callable[[Path, Path], None]


def converted_checkpoint(gguf_path: str | Path, root: Path | None = None, convert: Converter | None = None) -> Path:
    """A checkpoint folder holding ``gguf_path`` converted to float weights, converting once.

    Args:
        gguf_path: the ``.gguf`` file.
        root: the cache folder (default :func:`cache_root`).
        convert: ``convert(gguf_path, folder)`` writes the checkpoint files into ``folder``
            (default :func:`convert_gguf`, which needs the ``gguf`` extra).

    Returns:
        The entry folder; ``transformers`` loads it with ``from_pretrained``.
    """
    gguf_path = Path(gguf_path).resolve()
    digest = source_digest(gguf_path)
    entry = entry_folder(gguf_path, digest, root)
    if is_valid_entry(entry, digest):
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with _locked(entry.with_name(entry.name + ".lock")):
        if is_valid_entry(entry, digest):  # another process finished it while we waited
            return entry
        for leftover in entry.parent.glob(f".{entry.name}.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)  # a crashed converter's (we hold the lock)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
        try:
            (convert or convert_gguf)(gguf_path, staging)
            _write_manifest(staging, gguf_path, digest)
            if entry.exists():  # an invalid entry: move it aside, then replace it
                stale = entry.with_name(f".{entry.name}.tmp-stale-{os.getpid()}")
                entry.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
            staging.rename(entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return entry


def _write_manifest(folder: Path, gguf_path: Path, digest: str) -> None:
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
            files[str(path.relative_to(folder))] = {"size": path.stat().st_size, "sha256": file_digest(path)}
    manifest = {
        "format": FORMAT,
        "source": {"path": str(gguf_path), "size": gguf_path.stat().st_size, "sha256": digest},
        "files": files,
    }
    target = folder / MANIFEST
    target.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    with open(target, "rb") as handle:
        os.fsync(handle.fileno())


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (POSIX ``flock``; elsewhere the rename alone protects)."""
    with open(path, "a+b") as handle:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            yield
            return
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def convert_gguf(gguf_path: Path, folder: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and write it to ``folder`` in float32.

    Writes ``model.safetensors`` (tied weights stored once), ``config.json`` (without the GGUF
    quantization entry), ``generation_config.json`` and the tokenizer files.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tensors: dict[str, torch.Tensor] = {}
    stored: set[int] = set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in stored:  # a tied weight (e.g. the LM head): the model re-ties it
            continue
        stored.add(tensor.data_ptr())
        tensors[name] = tensor.detach().contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
