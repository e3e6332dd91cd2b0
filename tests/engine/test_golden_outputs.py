"""``generate``'s outputs before the engine became one engine for every batch size, kept.

``golden_outputs.json`` was recorded by this file's ``__main__`` with the two-engine code (commit
434daf7): every method (the draft-model ones with a tiny draft), greedy and seeded sampling, on the
five tiny families. The one engine must reproduce every token: greedy rows are plain greedy decoding
and a seeded sampled row draws what the old loop drew (the draft-model methods' chain sampling
included, whose output depends on the drafts). Re-record only for a deliberate change of outputs:
``python tests/engine/test_golden_outputs.py --record``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the engine needs torch (the hf extra)")

import racer_rs  # noqa: E402
from racer_rs.optional_deps import missing  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import random_prompt, tiny_llama, tiny_model  # noqa: E402

GOLDEN = Path(__file__).with_name("golden_outputs.json")
FAMILIES = ("llama", "qwen2", "qwen3", "gpt_neox", "phi")
#: Method -> its options (the draft-model methods get the draft in ``case_options``).
METHODS: dict[str, dict[str, Any]] = {
    "ar": {},
    "pld": {},
    "token_recycling": {},
    "racer": {},
    "racer_scored": {},
    "racer_retrieval": {},
    "racer_logits": {},
    "suffix": {},
    "suffix_chain": {},
    "draft_model": {"canvas": 4},
    "tts": {"canvas": 4, "update_every": 2, "lr": 1e-2, "asynchronous": False},
    "racer_tts": {"canvas": 4, "update_every": 2, "lr": 1e-2, "asynchronous": False},
}
DRAFT_METHODS = ("draft_model", "tts", "racer_tts")
MODES: dict[str, dict[str, Any]] = {
    "greedy": {},
    "sampled": {"temperature": 0.8, "top_p": 0.95, "seed": 7},
}


def case_key(family: str, method: str, mode: str) -> str:
    return f"{family}/{method}/{mode}"


def run_case(family: str, method: str, mode: str) -> list[int]:
    model = tiny_model(family)
    options = dict(METHODS[method])
    if method in DRAFT_METHODS:
        options["draft_model"] = tiny_llama(1)
    prompt = random_prompt(3, length=20)
    prompt = prompt + prompt[:12]  # a repeat, so retrieval drafts something
    result = racer_rs.generate(model, prompt, method=method, max_new_tokens=24, capacity=8, **MODES[mode], **options)
    return list(result.tokens)


def cases() -> list[tuple[str, str, str]]:
    return [(f, m, mode) for f in FAMILIES for m in METHODS for mode in MODES]


def _needs_suffix(method: str) -> bool:
    return method.startswith("suffix")


@pytest.fixture(scope="module")
def golden() -> dict[str, list[int]]:
    recorded: dict[str, list[int]] = json.loads(GOLDEN.read_text(encoding="utf-8"))
    return recorded


@pytest.mark.parametrize(("family", "method", "mode"), cases())
def test_generate_reproduces_the_recorded_outputs(
    golden: dict[str, list[int]], family: str, method: str, mode: str
) -> None:
    if _needs_suffix(method) and missing("suffix"):
        pytest.skip("arctic-inference (the suffix extra) is not installed")
    assert run_case(family, method, mode) == golden[case_key(family, method, mode)]


def test_the_record_covers_every_case(golden: dict[str, list[int]]) -> None:
    assert set(golden) == {case_key(*case) for case in cases()}
    # A record of nothing would compare nothing: every case produced its full budget or an EOS-free 24.
    assert all(len(tokens) == 24 for tokens in golden.values())


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        raise SystemExit("usage: python tests/engine/test_golden_outputs.py --record")
    record = {case_key(*case): run_case(*case) for case in cases()}
    GOLDEN.write_text(json.dumps(record, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    print(f"recorded {len(record)} cases in {GOLDEN}")
