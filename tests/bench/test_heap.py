"""Timed benchmark calls start from a trimmed C heap (racer_rs.bench.heap)."""

from __future__ import annotations

import ctypes
import sys

import pytest

from racer_rs.bench import heap

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or heap._malloc_trim() is None, reason="malloc_trim is glibc's"
)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@glibc
def test_freed_heap_memory_in_the_middle_of_the_heap_goes_back_to_the_system() -> None:
    """256 MB in 64 KB blocks (below glibc's mmap threshold, so on the heap), all freed but every
    16th: the kept blocks pin the heap, so glibc keeps the freed 240 MB resident until trimmed."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    block = 64 * 1024
    blocks = [libc.malloc(block) for _ in range(4096)]
    try:
        for address in blocks:
            ctypes.memset(address, 1, block)  # touched: resident
        for i, address in enumerate(blocks):
            if i % 16:
                libc.free(address)
        before = _resident_bytes()
        assert heap.release_free_heap()
        after = _resident_bytes()
        assert before - after > 150 * 2**20, (before, after)
    finally:
        for address in blocks[::16]:
            libc.free(address)


def test_without_glibc_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.release_free_heap() is False
