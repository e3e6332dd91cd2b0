"""Hand the C heap's free memory back to the system between timed runs.

PyTorch's CPU tensors come from the C allocator. glibc keeps what a forward frees for the next
allocation rather than returning it, and batched runs of many shapes (prefills of every prompt
length, verification steps of every tree size) leave the freed memory fragmented where no later
allocation fits: a ``racer bench --concurrency 1 4 8 16`` process held 2.5 GB at the end of one
16-row level of which 1.6 GB was free (0.9 GB after ``malloc_trim``), and 5.2 GB after four
levels. Left alone, a benchmark's later runs pay for the earlier runs' heap (this VM reclaims
memory slowly, and prefills slowed by 2-3x in such runs), so every timed call starts from a
trimmed heap. Outside glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, TypeError):  # not glibc (musl, macOS; Windows takes no None)
        return None


def release_free_heap() -> bool:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim(0)``); whether it could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
