"""Fixtures shared by the engine's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def same_drafts_as_generate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows compared with their own ``generate`` draft from the same state: the optional prompt
    top-k (left out above one row, see ``test_prompt_topk.py``) is computed in batches too."""
    from racer_rs.engine import decode_engine

    monkeypatch.setattr(decode_engine, "PROMPT_TOPK_MAX_ROWS", 1 << 30)
