"""Files a crash cannot leave half-written: write a temporary file beside the target, then rename.

A reader sees the old file or the whole new one, never part of one, and a failed write leaves
no temporary file behind. Shared by every cache and checkpoint writer of the package.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_CHUNK = 1 << 20


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
