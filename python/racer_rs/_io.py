"""Files a crash cannot leave half-written: write a temporary file beside the target, then rename.

A reader sees the old file or the whole new one, never part of one, and a failed write leaves
no temporary file behind. Shared by every cache and checkpoint writer of the package.

Portable: the POSIX-only calls each have a fallback (``file_lock``: ``flock``, else Windows'
``msvcrt.locking``, else none; ``sync_folder``: skipped where a folder cannot be synced;
``replace``: retried on Windows, where a file another process holds open cannot be replaced).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

_CHUNK = 1 << 20
_T = TypeVar("_T")


def _optional_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


fcntl = _optional_module("fcntl")  # POSIX
msvcrt = _optional_module("msvcrt")  # Windows

#: Windows: a file (or a folder holding one) that another process has open cannot be renamed or
#: replaced for as long as it stays open (a reader, an indexer, a virus scanner): wait that long.
WINDOWS = os.name == "nt"
_RETRY_DELAYS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
#: Opening a folder to fsync it is POSIX; Windows cannot open a folder as a file.
CAN_SYNC_FOLDERS = os.name == "posix"


def retry_while_in_use(action: Callable[[], _T]) -> _T:
    """``action()``, retried on Windows while it fails with ``PermissionError`` (about 4 s in all)."""
    for delay in _RETRY_DELAYS:
        try:
            return action()
        except PermissionError:
            if not WINDOWS:
                raise
            time.sleep(delay)
    return action()


def replace(source: Path | str, target: Path | str) -> None:
    """``os.replace(source, target)``, retried on Windows while ``target`` is held open elsewhere."""
    retry_while_in_use(lambda: os.replace(source, target))


def sync_folder(folder: Path) -> None:
    """Persist the renames done in ``folder`` (a no-op where folders cannot be synced)."""
    if not CAN_SYNC_FOLDERS:
        return
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:  # some file systems refuse to sync a folder: the rename stands regardless
        pass
    finally:
        os.close(handle)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if absent) for the body.

    POSIX ``flock``; on Windows ``msvcrt.locking`` of its first byte (polled: Windows' blocking
    mode gives up after 10 s). Without either, no lock: writers still stage and rename, so an
    entry is never half-written, and two processes may only do the same work twice.
    """
    with open(path, "a+b") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        elif msvcrt is not None:
            _msvcrt_lock(msvcrt, handle)
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            yield


def _msvcrt_lock(module: Any, handle: Any) -> None:
    while True:
        handle.seek(0)  # the lock covers the bytes from the current position ("a+" starts at the end)
        try:
            module.locking(handle.fileno(), module.LK_NBLCK, 1)
            return
        except OSError:  # held by another process
            time.sleep(0.1)


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

    The body writes it and ``replace``-s it into place (a rename within one file system).
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
        replace(temporary, path)


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
