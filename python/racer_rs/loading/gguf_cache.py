"""A GGUF file converted once to float weights, cached on disk.

transformers dequantizes a GGUF checkpoint on every ``from_pretrained(..., gguf_file=...)`` call
(about 30 s for a 135M model on a CPU) and refuses ``save_pretrained`` on the result. The first
load here converts the file once and stores an ordinary checkpoint folder (``model.safetensors``,
``config.json``, ``generation_config.json`` and the tokenizer) in a user cache folder, keyed by
the GGUF file's content alone (its SHA-256; a renamed or copied file finds the same entry), so
later loads read safetensors in seconds.

Safety:

- an entry is written into a temporary folder and renamed into place only when complete; its
  manifest, written last, records every file's size and SHA-256, and an entry is used only when
  every file matches. A half-written, truncated or corrupted entry is rebuilt, never loaded;
- converters of the same file serialise on a lock file, so two processes converting at once
  produce one entry and neither reads the other's partial output.

Speed: hashing a big GGUF and its float32 entry (6 GB for a 1.5B model) takes many seconds, so
after a full check a small *verified stamp* records each checked file's identity (size,
``mtime_ns``, ``ctime_ns``, inode, device) and the digest it was checked against. A later
process trusts a file whose identity still matches its stamp and re-hashes any other: a write,
a truncation, a copy or a replacement changes one of them (``ctime`` changes on every write,
also one that restores ``mtime`` afterwards). The GGUF file's own digest is remembered the same
way, per path, under ``gguf/sources/``.

Entries of earlier versions, named ``<file stem>-<digest[:16]>``, are still used: the first
load finds a valid one, checks it in full and renames it to the content-only name.

The cache folder is ``$RACER_RS_CACHE``, else ``$XDG_CACHE_HOME/racer_rs``, else
``~/.cache/racer_rs``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from racer_rs._io import file_digest, file_identity, file_lock, retry_while_in_use, write_text_atomically

CACHE_ENV = "RACER_RS_CACHE"
#: Bumped whenever an entry's layout changes; entries of another format are rebuilt.
FORMAT = 1
MANIFEST = "racer_rs_entry.json"
#: The verified stamp inside an entry (not listed in the manifest: written after it).
STAMP = "racer_rs_verified.json"
STAMP_FORMAT = 1
# Entries already checked by this process, keyed by their files' identities: loading checks an
# entry twice (before work starts, then to load it); check it once.
_verified: set[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]] = set()
_source_digests: dict[tuple[str, tuple[int, ...]], str] = {}


def cache_root() -> Path:
    """The user cache folder of racer_rs (see the module docstring)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "racer_rs"


# --- verified stamps ----------------------------------------------------------------------


def stamp_matches(stamp: Path, files: Mapping[str, Path], digest: str) -> bool:
    """True when ``stamp`` vouches for exactly ``files`` (name -> path) as they are now, checked
    against ``digest``; any unreadable stamp or changed identity is a mismatch."""
    try:
        recorded = json.loads(stamp.read_text(encoding="utf-8"))
        if recorded.get("format") != STAMP_FORMAT or recorded.get("sha256") != digest:
            return False
        identities = recorded["files"]
        if set(identities) != set(files):
            return False
        return all(tuple(identities[name]) == file_identity(path) for name, path in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def write_stamp(stamp: Path, files: Mapping[str, Path], digest: str) -> None:
    """Record that ``files`` were just checked in full against ``digest`` (best effort: a
    read-only cache only loses the fast path)."""
    try:
        identities = {name: list(file_identity(path)) for name, path in files.items()}
        payload = {"format": STAMP_FORMAT, "sha256": digest, "files": identities}
        write_text_atomically(stamp, json.dumps(payload, indent=1) + "\n")
    except OSError:
        pass


def _forget_process_state() -> None:
    """Forget what this process has checked (tests: behave like a new process)."""
    _verified.clear()
    _source_digests.clear()


# --- the source file's digest -------------------------------------------------------------


def _source_stamp(gguf_path: Path, root: Path | None) -> Path:
    key = hashlib.sha256(str(gguf_path).encode("utf-8")).hexdigest()[:32]
    return (root or cache_root()) / "gguf" / "sources" / f"{key}.json"


def source_digest(gguf_path: Path, root: Path | None = None) -> str:
    """:func:`file_digest` of a GGUF file, hashed once per file identity.

    Within a process the digest is memoised; across processes a stamp under ``gguf/sources/``
    remembers it for the path while the file's identity (:func:`file_identity`) is unchanged.
    """
    gguf_path = Path(gguf_path)
    identity = file_identity(gguf_path)
    key = (str(gguf_path), identity)
    if key in _source_digests:
        return _source_digests[key]
    stamp = _source_stamp(gguf_path, root)
    digest = None
    try:
        recorded = json.loads(stamp.read_text(encoding="utf-8"))
        if recorded.get("path") == str(gguf_path) and tuple(recorded.get("identity", ())) == identity:
            digest = str(recorded["sha256"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    if digest is None:
        digest = file_digest(gguf_path)
        if file_identity(gguf_path) == identity:  # not changed while we read it
            with contextlib.suppress(OSError):
                stamp.parent.mkdir(parents=True, exist_ok=True)
                payload = {"path": str(gguf_path), "identity": list(identity), "sha256": digest}
                write_text_atomically(stamp, json.dumps(payload) + "\n")
    _source_digests[key] = digest
    return digest


# --- entries ------------------------------------------------------------------------------


def entry_folder(digest: str, root: Path | None = None) -> Path:
    """Where the converted checkpoint of a GGUF file with content ``digest`` lives (the content
    alone names it: any copy of the file, under any name, shares the entry)."""
    return (root or cache_root()) / "gguf" / digest[:32]


def _legacy_entries(digest: str, root: Path | None) -> list[Path]:
    """Entries of earlier versions for this content: ``<file stem>-<digest[:16]>``."""
    folder = (root or cache_root()) / "gguf"
    try:
        return sorted(p for p in folder.glob(f"*-{digest[:16]}") if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def is_valid_entry(entry: Path, digest: str) -> bool:
    """True when ``entry`` is a complete conversion of the GGUF file with content ``digest``.

    Every file the manifest lists must exist with its recorded size and SHA-256; a matching
    verified stamp (see the module docstring) stands in for re-hashing them.
    """
    try:
        manifest_path = entry / MANIFEST
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT or manifest.get("source", {}).get("sha256") != digest:
            return False
        files = manifest["files"]
        if not files or "model.safetensors" not in files:
            return False
        paths = {name: entry / name for name in files}
        if any(paths[name].stat().st_size != expected["size"] for name, expected in files.items()):
            return False
        checked = {**paths, MANIFEST: manifest_path}
        signature = (str(entry), tuple(sorted((n, file_identity(p)) for n, p in checked.items())))
        if signature in _verified:
            return True
        if not stamp_matches(entry / STAMP, checked, digest):
            if any(file_digest(paths[name]) != expected["sha256"] for name, expected in files.items()):
                return False
            write_stamp(entry / STAMP, checked, digest)
            signature = (str(entry), tuple(sorted((n, file_identity(p)) for n, p in checked.items())))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    _verified.add(signature)
    return True


def valid_entry(digest: str, root: Path | None = None) -> Path | None:
    """The valid entry for content ``digest`` (no GGUF file needed), or ``None``."""
    entry = entry_folder(digest, root)
    return entry if is_valid_entry(entry, digest) else None


def cached_entry(gguf_path: str | Path, root: Path | None = None, digest: str | None = None) -> Path | None:
    """The valid cache entry of ``gguf_path``, or ``None`` if it has to be converted first.

    ``digest``: the file's SHA-256 when the caller has already verified it (else it is computed,
    or taken from the source stamp). An entry of an earlier version counts (it is moved to the
    current name on the next :func:`converted_checkpoint`).
    """
    digest = digest or source_digest(Path(gguf_path).resolve(), root)
    entry = valid_entry(digest, root)
    if entry is not None:
        return entry
    return next((old for old in _legacy_entries(digest, root) if is_valid_entry(old, digest)), None)


Converter = Callable[[Path, Path], None]


def converted_checkpoint(
    gguf_path: str | Path, root: Path | None = None, convert: Converter | None = None, digest: str | None = None
) -> Path:
    """A checkpoint folder holding ``gguf_path`` converted to float weights, converting once.

    Args:
        gguf_path: the ``.gguf`` file.
        root: the cache folder (default :func:`cache_root`).
        convert: ``convert(gguf_path, folder)`` writes the checkpoint files into ``folder``
            (default :func:`convert_gguf`, which needs the ``gguf`` extra).
        digest: the file's SHA-256, when the caller has verified the file itself.

    Returns:
        The entry folder; ``transformers`` loads it with ``from_pretrained``.
    """
    gguf_path = Path(gguf_path).resolve()
    digest = digest or source_digest(gguf_path, root)
    entry = entry_folder(digest, root)
    if is_valid_entry(entry, digest):
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(entry.with_name(entry.name + ".lock")):
        if is_valid_entry(entry, digest):  # another process finished it while we waited
            return entry
        for leftover in entry.parent.glob(f".{entry.name}.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)  # a crashed converter's (we hold the lock)
        legacy = next((old for old in _legacy_entries(digest, root) if is_valid_entry(old, digest)), None)
        if legacy is not None:  # an earlier version's entry of this content: adopt it
            _replace(entry, legacy)
            return entry
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
        try:
            (convert or convert_gguf)(gguf_path, staging)
            _write_manifest(staging, gguf_path, digest)
            _replace(entry, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        # Every file was just hashed for the manifest: stamp the entry as verified.
        files = {name: entry / name for name in json.loads((entry / MANIFEST).read_text(encoding="utf-8"))["files"]}
        write_stamp(entry / STAMP, {**files, MANIFEST: entry / MANIFEST}, digest)
    return entry


def _replace(entry: Path, new: Path) -> None:
    """Rename ``new`` to ``entry``, first moving an existing (invalid) ``entry`` aside."""
    if entry.exists():
        stale = entry.with_name(f".{entry.name}.tmp-stale-{os.getpid()}")
        retry_while_in_use(lambda: entry.rename(stale))
        shutil.rmtree(stale, ignore_errors=True)
    retry_while_in_use(lambda: new.rename(entry))


def _write_manifest(folder: Path, gguf_path: Path, digest: str) -> None:
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
            files[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": file_digest(path)}
    manifest = {
        "format": FORMAT,
        "source": {"path": str(gguf_path), "size": gguf_path.stat().st_size, "sha256": digest},
        "files": files,
    }
    target = folder / MANIFEST
    target.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    with open(target, "rb") as handle:
        os.fsync(handle.fileno())


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
