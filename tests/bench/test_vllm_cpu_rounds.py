"""``benches/serving/vllm_cpu.py --rounds``: every method's server up at once, each round on its
own prompts with the methods in alternating order, and each round's ratios taken against that
round's own no-speculation level (no vLLM here: the servers and levels are stand-ins)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benches" / "serving" / "vllm_cpu.py"


@pytest.fixture
def vllm_cpu():
    spec = importlib.util.spec_from_file_location("vllm_cpu_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rounds_alternate_the_order_use_new_prompts_and_pair_each_round_with_its_own_none(
    vllm_cpu, tmp_path, monkeypatch
):
    calls: list[tuple[str, int, int]] = []
    ports: list[int] = []
    stopped: list[str] = []

    class FakeServer:
        def __init__(self, args: argparse.Namespace, method: str, log: Path, port: int | None = None) -> None:
            self.method = method
            ports.append(port or args.port)

        def wait_ready(self) -> None:
            pass

        def stop(self) -> None:
            stopped.append(self.method)

    speed = [1.0, 1.5, 0.8]  # the machine's drift: each round's seconds per level

    def fake_level(server: FakeServer, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict[str, Any]:
        if prompts == warmup:
            return {}
        calls.append((server.method, concurrency, prompts[0][0]))
        wall = speed[prompts[0][0] // 100] * (1.0 if server.method == "none" else 0.8)  # racer: 1.25x
        requests = [{"text": "x", "tokens": 10, "seconds": wall} for _ in prompts]
        spec = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
        return {"wall": wall, "requests": requests, "spec": spec}

    monkeypatch.setattr(vllm_cpu, "Server", FakeServer)
    monkeypatch.setattr(vllm_cpu, "run_level", fake_level)
    warmup = [[999]]
    rounds = [{1: [[100 * r + 1]], 4: [[100 * r + 4]], 8: [[100 * r + 8]]} for r in range(3)]
    args = argparse.Namespace(port=9000, max_tokens=8)
    methods = ["none", "racer"]
    methods_order = [m for r in range(3) for _ in (1, 4, 8) for m in (methods if r % 2 == 0 else methods[::-1])]
    assert vllm_cpu.run_rounds(args, methods, rounds, warmup, tmp_path, (0.0, 0.0, 0.0)) == 0

    assert ports == [9000, 9001] and sorted(stopped) == methods
    assert [c[0] for c in calls] == methods_order
    for r in range(3):  # every method answers each round's own prompts
        assert {c[2] for c in calls[6 * r : 6 * r + 6]} == {100 * r + 1, 100 * r + 4, 100 * r + 8}
    result = json.loads((tmp_path / "results.json").read_text())
    assert len(result["runs"]) == 3
    racer_rows = [row for row in result["table"] if row["method"] == "racer"]
    assert len(racer_rows) == 3
    for row in racer_rows:
        assert row["runs"] == 3
        assert row["throughput_vs_none"] == pytest.approx([1.25, 1.25, 1.25])


def test_engine_steps_give_every_method_its_step_time_and_output_per_step(vllm_cpu):
    def level(wall: float, steps: float) -> dict[str, Any]:
        requests = [{"text": "x", "tokens": 30, "seconds": wall} for _ in range(2)]
        spec = {"num_drafts": 10.0, "num_draft_tokens": 40.0, "num_accepted_tokens": 20.0, "engine_steps": steps}
        return {"wall": wall, "requests": requests, "spec": spec}

    row = vllm_cpu.summarize([level(2.0, 100.0), level(1.0, 20.0)], None)
    assert row["engine_step_ms"] == pytest.approx(1e3 * 3.0 / 120.0)  # walls over steps, both rounds
    assert row["output_per_engine_step"] == pytest.approx(120.0 / 120.0)
    assert row["tokens_per_step"] == pytest.approx(120.0 / 80.0)
    old = level(2.0, 0.0)  # a server whose /metrics had no step count: no figure rather than a wrong one
    assert "engine_step_ms" not in vllm_cpu.summarize([old], None)
