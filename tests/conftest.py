"""Shared test setup: single-threaded torch, a cache folder of the session's own and the shared reference models."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# The suite never reads or writes the user's cache: what capacity="auto" learned on this machine
# (cost curves, calibrations) would change the trees the tests see. CI sets its own folder.
os.environ.setdefault("RACER_RS_CACHE", tempfile.mkdtemp(prefix="racer_rs_test_cache_"))


def shared_dir() -> Path:
    """``$RACER_SHARED_DIR``, defaulting to ``../shared`` next to the repository root."""
    return Path(os.environ.get("RACER_SHARED_DIR", REPO_ROOT.parent / "shared"))


def reference_file(relative: str) -> Path:
    """A reference model or data path: the copy shipped in the repository, else the shared one."""
    shipped = REPO_ROOT / relative
    return shipped if shipped.exists() else shared_dir() / relative


def reference_model_dir() -> Path:
    """Folder of the reference target model (pycode-target-7m)."""
    return reference_file("models/pycode-target-7m")


try:
    import torch

    # Tests share two cores with other jobs; one thread keeps timings and numerics stable.
    torch.set_num_threads(1)
except ImportError:  # torch-free test runs (the core tests)
    pass


@pytest.fixture(scope="session")
def reference_model():  # type: ignore[no-untyped-def]
    """The reference target and its tokenizer; skipped only when the shared folder is absent."""
    folder = reference_model_dir()
    if not folder.is_dir():
        pytest.skip(f"reference model folder {folder} is absent (set RACER_SHARED_DIR to the shared folder)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder)


@pytest.fixture
def arctic() -> None:
    """Skip a SuffixDecoding test without arctic-inference (the ``suffix`` extra); under
    ``RACER_REQUIRE_SUFFIX=1`` (CI) fail it instead."""
    from racer_rs import optional_deps

    if optional_deps.installed("arctic_inference"):
        return
    reason = f"arctic-inference not installed ({optional_deps.INSTALL_COMMANDS['suffix']})"
    if os.environ.get("RACER_REQUIRE_SUFFIX") == "1":
        pytest.fail(f"RACER_REQUIRE_SUFFIX=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _fresh_drafting_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with no measured drafting modes and no learned drafted-step price: the
    process-wide switches and prices learn from timings, and one test's timings must not decide
    another's steps."""
    if "racer_rs.engine.capacity" in sys.modules:
        monkeypatch.setattr(sys.modules["racer_rs.engine.capacity"], "_switches", {})
        monkeypatch.setattr(sys.modules["racer_rs.engine.capacity"], "_draft_prices", {})
