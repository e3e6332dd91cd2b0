"""The step time of a real vLLM server per verified-token count: a ``RacerProposer`` that logs
each timed step (running requests, verified tokens, seconds since the previous call), and a
summary of those logs.

The proposer's own cut reads these times (:meth:`racer_rs.integrations._payoff.StepCost.measured`);
this shows them. In the environment of ``.ci/vllm_stage.sh``, from the repository root::

    P=/tmp/vstage/venv/bin/python
    STEP_LOG=/tmp/steps PYTHONPATH=python:. $P benches/serving/vllm_cpu.py --methods steps \\
        --variant 'steps={"class": "benches.serving.step_log.StepLog"}' --concurrency 8 --dtype bfloat16
    PYTHONPATH=python:. $P benches/serving/step_log.py /tmp/steps.*

Each server process writes ``$STEP_LOG.<pid>`` (JSON: ``[rows, tokens, seconds]`` per step),
every 100 steps and at exit. The summary prints, per running-request count, the median step
milliseconds per verified-token count.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from racer_rs.integrations.vllm import RacerProposer


class StepLog(RacerProposer):
    """``RacerProposer`` logging every timed step's running requests, tokens and seconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[tuple[int, int, float]] = []
        self._running = 0
        self._path = Path(f"{os.environ.get('STEP_LOG', '/tmp/step_log')}.{os.getpid()}")
        atexit.register(self._write)

    def _write(self) -> None:
        self._path.write_text(json.dumps(self.steps))

    def propose(self, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> list[list[int]]:
        self._running = sum(1 for sampled in sampled_token_ids if sampled)
        return super().propose(sampled_token_ids, *args, **kwargs)

    def _time_step(self, now: float, tokens: int) -> None:
        assert self._last_call is not None
        self.steps.append((self._running, tokens, now - self._last_call))
        if len(self.steps) % 100 == 0:
            self._write()
        super()._time_step(now, tokens)


def main(paths: list[str]) -> int:
    print("command: python benches/serving/step_log.py", " ".join(paths))
    by_rows: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        for rows, tokens, seconds in json.loads(Path(path).read_text()):
            by_rows[rows][tokens].append(1e3 * seconds)
    for rows in sorted(by_rows):
        cells = []
        for tokens, times in sorted(by_rows[rows].items()):
            times.sort()
            cells.append(f"{tokens}: {times[len(times) // 2]:.1f} ({len(times)})")
        print(f"{rows} running, tokens: median ms (steps): " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
