"""Files a crash cannot leave half-written: write a temporary file beside the target, then rename.

A reader sees the old file or the whole new one, never part of one, and a failed write leaves
no temporary file behind. Shared by every cache and checkpoint writer of the package.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_CHUNK = 1 << 20


def file_identity(path: Path) -> tuple[int, ...]:
    """What changes whenever a file's content may have changed: size, mtime, ctime, inode, device.

    ``ctime`` changes on every write and cannot be set back, and a replacement has a new inode,
    so a different file of the same size with the old ``mtime`` restored still differs.
    """
    stat = path.stat()
    return (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev)


@contextmanager
def staged_file(directory: Path, prefix: str) -> Iterator[Path]:
    """A new empty temporary file in ``directory``, removed on exit unless renamed away.

    The body writes it and ``os.replace``-s it into place (a rename within one file system).
    """
    handle, temporary = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    os.close(handle)
    try:
        yield Path(temporary)
    finally:
        Path(temporary).unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8), synced to disk before the rename."""
    with staged_file(path.parent, f".{path.name}-") as temporary:
        with open(temporary, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)


def file_digest(path: Path) -> str:
    """SHA-256 of a file's content, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_writable_folder(folder: Path, what: str) -> None:
    """Raise unless ``folder`` exists or can be created, and a file can be written in it.

    Checked before any work starts, so that an unwritable output (a read-only folder, a path
    under a file) is not discovered only after a long run. Folders it had to create for the
    check are removed again: nothing is left behind if the run then fails for another reason.

    Raises:
        InvalidArgumentError: naming ``what`` and the operating system's reason.
    """
    from racer_rs.errors import InvalidArgumentError

    if folder.exists() and not folder.is_dir():
        raise InvalidArgumentError(f"{what} {folder} exists and is not a folder")
    created = [parent for parent in [folder, *folder.parents] if not parent.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with staged_file(folder, ".racer-write-check-"):
            pass
    except OSError as exc:
        raise InvalidArgumentError(f"{what} {folder}: cannot write there ({exc.strerror or exc})") from None
    finally:
        for parent in created:  # deepest first
            with contextlib.suppress(OSError):
                parent.rmdir()


def write_or_fall_back(path: Path, text: str) -> tuple[Path, str | None]:
    """Write ``text`` to ``path`` atomically; if that fails, to a file in the temporary folder.

    Returns:
        ``(where it was written, the first write's error or None)``; results are never lost
        to a full disk or a folder that became unwritable during a run.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, text)
        return path, None
    except OSError as exc:
        handle, fallback = tempfile.mkstemp(prefix=f"racer-{path.stem}-", suffix=path.suffix or ".txt")
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        return Path(fallback), str(exc.strerror or exc)
