"""The fallbacks of racer_rs._io for what is POSIX-only: file locks, folder fsync, os.replace.

Each fallback runs here by pretending to be another platform (monkeypatching the module's
``fcntl``, ``msvcrt``, ``WINDOWS`` and ``CAN_SYNC_FOLDERS``); the CI workflow also runs this file
on macOS and Windows, where the real calls are exercised. Needs numpy only (no torch).
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from racer_rs import _io
from racer_rs.loading import gguf_cache


class FakeMsvcrt:
    """``msvcrt.locking`` semantics: non-blocking byte-range lock, OSError when held elsewhere."""

    LK_UNLCK, LK_LOCK, LK_NBLCK = 0, 1, 2

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self.holder: int | None = None
        self.refusals = 0
        self.calls: list[tuple[int, int]] = []

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        position = os.lseek(fd, 0, os.SEEK_CUR)
        assert position == 0 and nbytes == 1, "the lock must cover the file's first byte"
        self.calls.append((fd, mode))
        with self._guard:
            if mode == self.LK_UNLCK:
                assert self.holder == fd, "unlocking a lock this handle does not hold"
                self.holder = None
            elif self.holder is not None:
                self.refusals += 1
                raise OSError(errno.EACCES, "locked")
            else:
                self.holder = fd


def _contend(lock_path: Path) -> list[str]:
    """Two threads take the lock; the second asks while the first holds it."""
    lock_path.write_bytes(b"not empty: a handle opened for appending starts at its end")
    order: list[str] = []
    first_in = threading.Event()
    release_first = threading.Event()

    def first() -> None:
        with _io.file_lock(lock_path):
            order.append("first in")
            first_in.set()
            release_first.wait(10)
            order.append("first out")

    def second() -> None:
        first_in.wait(10)
        asked.set()
        with _io.file_lock(lock_path):
            order.append("second in")

    asked = threading.Event()
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    asked.wait(10)
    release_first.set()
    for thread in threads:
        thread.join(20)
    return order


@pytest.mark.skipif(_io.fcntl is None, reason="flock is POSIX")
def test_flock_excludes(tmp_path: Path) -> None:
    assert _contend(tmp_path / "x.lock") == ["first in", "first out", "second in"]


@pytest.mark.skipif(_io.msvcrt is None, reason="msvcrt is Windows'")
def test_msvcrt_lock_excludes(tmp_path: Path) -> None:
    assert _contend(tmp_path / "x.lock") == ["first in", "first out", "second in"]


def test_windows_lock_fallback_excludes_and_releases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeMsvcrt()
    monkeypatch.setattr(_io, "fcntl", None)
    monkeypatch.setattr(_io, "msvcrt", fake)
    assert _contend(tmp_path / "x.lock") == ["first in", "first out", "second in"]
    assert fake.holder is None
    assert [mode for _, mode in fake.calls].count(FakeMsvcrt.LK_UNLCK) == 2


def test_windows_lock_released_when_the_body_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeMsvcrt()
    monkeypatch.setattr(_io, "fcntl", None)
    monkeypatch.setattr(_io, "msvcrt", fake)
    with pytest.raises(RuntimeError, match="boom"), _io.file_lock(tmp_path / "x.lock"):
        raise RuntimeError("boom")
    assert fake.holder is None
    with _io.file_lock(tmp_path / "x.lock"):  # and it can be taken again
        assert fake.holder is not None


def test_no_lock_primitive_still_runs_the_body(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_io, "fcntl", None)
    monkeypatch.setattr(_io, "msvcrt", None)
    ran = []
    with _io.file_lock(tmp_path / "x.lock"):
        ran.append(True)
    assert ran == [True] and (tmp_path / "x.lock").is_file()


def test_cache_conversion_serialises_on_the_windows_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads converting one GGUF under the msvcrt fallback: one converts, the other waits
    on the lock and then finds the finished entry."""
    fake = FakeMsvcrt()
    monkeypatch.setattr(_io, "fcntl", None)
    monkeypatch.setattr(_io, "msvcrt", fake)
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF" + bytes(range(64)))
    converting = threading.Event()
    conversions = []

    def convert(gguf: Path, folder: Path) -> None:
        conversions.append(gguf)
        converting.set()
        for _ in range(1000):  # until the other thread polls the lock (at most 10 s)
            if fake.refusals:
                break
            threading.Event().wait(0.01)
        (folder / "model.safetensors").write_bytes(b"w" * 10)
        (folder / "tokenizer").mkdir()
        (folder / "tokenizer" / "vocab.json").write_text("{}", encoding="utf-8")

    root = tmp_path / "cache"
    results: list[Path] = []

    def run() -> None:
        results.append(gguf_cache.converted_checkpoint(source, root, convert=convert))

    threads = [threading.Thread(target=run), threading.Thread(target=lambda: (converting.wait(10), run()))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(conversions) == 1 and len(results) == 2 and results[0] == results[1]
    manifest = (results[0] / gguf_cache.MANIFEST).read_text(encoding="utf-8")
    assert '"tokenizer/vocab.json"' in manifest  # manifest keys use "/" on every platform


def test_sync_folder_skipped_where_folders_cannot_be_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("os.open called on a platform that cannot open folders")

    monkeypatch.setattr(_io, "CAN_SYNC_FOLDERS", False)
    monkeypatch.setattr(_io.os, "open", refuse)
    _io.sync_folder(tmp_path)


def test_sync_folder_tolerates_a_refused_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []

    def fsync(handle: int) -> None:
        synced.append(handle)
        raise OSError(errno.EINVAL, "Invalid argument")

    def open_folder(path: Any, flags: int) -> int:  # as POSIX does (Windows cannot open a folder)
        if not Path(path).is_dir():
            raise FileNotFoundError(path)
        return 12345

    monkeypatch.setattr(_io, "CAN_SYNC_FOLDERS", True)
    monkeypatch.setattr(_io.os, "open", open_folder)
    monkeypatch.setattr(_io.os, "close", lambda handle: None)
    monkeypatch.setattr(_io.os, "fsync", fsync)
    _io.sync_folder(tmp_path)
    _io.sync_folder(tmp_path / "absent")  # cannot be opened: skipped too
    assert len(synced) == 1


class FlakyReplace:
    """``os.replace`` refused with PermissionError ``failures`` times (Windows: the target is open)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts = 0
        self.real = os.replace

    def __call__(self, source: Any, target: Any) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise PermissionError(errno.EACCES, "Access is denied", str(target))
        self.real(source, target)


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(_io.time, "sleep", slept.append)
    return slept


def test_replace_retries_on_windows_while_the_target_is_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_sleep: list[float]
) -> None:
    flaky = FlakyReplace(failures=3)
    monkeypatch.setattr(_io, "WINDOWS", True)
    monkeypatch.setattr(_io.os, "replace", flaky)
    target = tmp_path / "state.json"
    target.write_text("old", encoding="utf-8")
    _io.write_text_atomically(target, "new")
    assert target.read_text(encoding="utf-8") == "new"
    assert flaky.attempts == 4 and len(no_sleep) == 3
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_replace_gives_up_on_windows_after_the_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_sleep: list[float]
) -> None:
    flaky = FlakyReplace(failures=1000)
    monkeypatch.setattr(_io, "WINDOWS", True)
    monkeypatch.setattr(_io.os, "replace", flaky)
    target = tmp_path / "state.json"
    with pytest.raises(PermissionError):
        _io.write_text_atomically(target, "new")
    assert flaky.attempts == len(no_sleep) + 1 and sum(no_sleep) < 10
    assert list(tmp_path.iterdir()) == []


def test_replace_does_not_retry_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_sleep: list[float]
) -> None:
    flaky = FlakyReplace(failures=1)
    monkeypatch.setattr(_io, "WINDOWS", False)
    monkeypatch.setattr(_io.os, "replace", flaky)
    with pytest.raises(PermissionError):
        _io.write_text_atomically(tmp_path / "state.json", "new")
    assert flaky.attempts == 1 and no_sleep == []
