"""The proposers' own time on the calls of a replay: ``RacerProposer`` and vLLM's
``SuffixDecodingProposer`` fed the very ``propose`` inputs that ``vllm_replay.py`` gave them,
without the model, interleaved round by round.

The replay's ``propose ms/step`` comes from one run, beside the model's forwards; this replays
the recorded calls into fresh proposers as often as asked, with about 16 MB read between two
calls (as a forward evicts the proposer's data from the caches), so that a change to the
proposer's Python can be timed to a few microseconds, and its drafts compared with another
version's (``--drafts``; the step clock ``RacerProposer`` learns its cost from is modelled, so
its drafts are reproducible). Two steps, in the environment of ``.ci/vllm_stage.sh``::

    P=/tmp/vstage/venv/bin/python
    PYTHONPATH=python:. $P benches/serving/recorded_calls.py record calls.json -- \\
        --methods racer,suffix --concurrency 4,8 --prompts 16
    PYTHONPATH=python:. $P benches/serving/recorded_calls.py time calls.json --rounds 5

Prints milliseconds per call per method (median and min over the rounds), the command first.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "python")]

from benches.serving import vllm_replay  # noqa: E402

VOCAB, K = 49152, 8


def record(path: str, replay_args: list[str]) -> None:
    """Run the replay, keeping every ``propose`` call's sampled tokens and rows (request index,
    prompt length, tokens) per method and level."""
    calls: dict[str, list[Any]] = {}
    level = {"concurrency": 0}
    propose, run_level = vllm_replay.propose, vllm_replay.run_level

    def recording_propose(method: str, proposer: Any, rows: list[Any], sampled: list[list[int]], *rest: Any) -> Any:
        rows_now = [(f"{level['concurrency']}-{r.index}", len(r.prompt), list(r.tokens)) for r in rows]
        calls.setdefault(method, []).append([[list(s) for s in sampled], rows_now])
        return propose(method, proposer, rows, sampled, *rest)

    def level_run(method: str, proposer: Any, target: Any, prompts: Any, concurrency: int, *rest: Any) -> Any:
        level["concurrency"] = concurrency
        return run_level(method, proposer, target, prompts, concurrency, *rest)

    vllm_replay.propose, vllm_replay.run_level = recording_propose, level_run  # type: ignore[assignment]
    sys.argv = ["vllm_replay.py", *replay_args]
    try:
        vllm_replay.main()
    finally:
        Path(path).write_text(json.dumps(calls))
        print(f"recorded {', '.join(f'{m}: {len(c)} calls' for m, c in calls.items())} in {path}")


def replay(method: str, calls: list[Any], flush: np.ndarray) -> tuple[float, list[Any]]:
    """Seconds per call of a fresh proposer over ``calls`` (built and called as the replay
    does), and its drafts."""
    clock = vllm_replay.Clock()  # RacerProposer's step clock: 60 ms plus 2 ms a sampled token
    most_rows = max(len(rows) for _, rows in calls)
    settings = SimpleNamespace(k=K, concurrency=[most_rows], variants={})
    proposer, _ = vllm_replay.make_proposer(method, settings, VOCAB, clock)
    numbers: dict[str, int] = {}  # each recorded request key as the replay's request index
    spent, drafts = 0.0, []
    for sampled, rows in calls:
        requests = [
            vllm_replay.Request(numbers.setdefault(key, len(numbers)), tokens[:prompt], tokens)
            for key, prompt, tokens in rows
        ]
        arrays = vllm_replay.runner_arrays(requests)
        flush.sum()
        start = time.perf_counter()
        out = vllm_replay.propose(method, proposer, requests, sampled, K, arrays)
        spent += time.perf_counter() - start
        clock.now += 0.06 + 0.002 * sum(len(s) for s in sampled)
        drafts.append([list(map(int, d)) for d in out])
    return spent / len(calls), drafts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    rec = sub.add_parser("record", help="run vllm_replay.py (its arguments after --) and keep its calls")
    rec.add_argument("calls")
    rec.add_argument("replay_args", nargs=argparse.REMAINDER)
    timing = sub.add_parser("time", help="time the recorded calls")
    timing.add_argument("calls")
    timing.add_argument("--methods", default="racer,suffix")
    timing.add_argument("--rounds", type=int, default=5)
    timing.add_argument("--flush-mb", type=int, default=16, help="memory read between two calls")
    timing.add_argument("--drafts", help="write RacerProposer's drafts (the last round's) to this JSON file")
    args = parser.parse_args()
    print("command: python", shlex.join(sys.argv))
    if args.step == "record":
        record(args.calls, [a for a in args.replay_args if a != "--"])
        return 0
    recorded = json.loads(Path(args.calls).read_text())
    methods = args.methods.split(",")
    flush = np.ones(args.flush_mb * (1 << 20) // 8)
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.rounds):
        for method in methods:
            per_call, drafts = replay(method, recorded[method], flush)
            seconds[method].append(per_call)
            if method == "racer" and args.drafts:
                Path(args.drafts).write_text(json.dumps(drafts))
    for method in methods:
        ms = 1e3 * np.array(seconds[method])
        print(f"{method:7s} {len(recorded[method])} calls: {np.median(ms):.3f} ms a call (median; min {ms.min():.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
