"""vLLM's synchronous speculative loop replayed without a server: the proposers' drafts and
acceptance at a steady concurrency, with no timing noise.

A server run (``vllm_cpu.py``) measures tokens/s, which this machine's drift blurs by a fifth
between minutes; the proposers' differences are a few percent. This script runs the very
proposers a server would (vLLM's own ``NgramProposer`` and ``SuffixDecodingProposer``, our
``RacerProposer`` or a variant class) through the loop of vLLM's V1 runner with asynchronous
scheduling off: at most C requests run, a request joins as soon as one ends (its prefill samples
its first token in that step), every step verifies each running request's last token and the
drafts proposed after the previous step by greedy chain verification, the target's logits for
those rows go through ``compute_logits`` (which ``RacerProposer`` wraps), and ``propose`` is
called with the runner's arrays (rows condensed in arrival order). The target is the same model
in transformers (float32, one forward per request and step with its own KV cache), so greedy
outputs equal plain decoding's, which the script checks against ``none``.

Time is modelled: a step costs ``a + b * d + p * f`` for ``d`` verified decode tokens and ``f``
prefill tokens (``--step-ms a,b,p``; the default is what ``RacerProposer`` fitted in the vLLM
server of ``vllm_cpu.py``, SmolLM2-135M float32 on this CPU: 60 ms and 2.1 ms), plus each
proposer's own measured time. ``RacerProposer`` learns its step cost from that modelled clock,
as it does from the server's in a real run. Outputs: tokens per step, drafted and accepted
tokens, and modelled tokens/s over ``none``'s, per method and concurrency; and the steady
rate, tokens/s over the steps with all C rows running (a long-running server's state): with a
few prompts per level the waves' tails take a large share of the time (at C = 8 with 16
prompts, a third of it), and which request ends last decides them as much as the drafts do.
Each level takes its own prompts, after those of the levels listed before it: compare methods
within a level of one command, not levels of commands that list different levels.

Run in the environment of ``.ci/vllm_stage.sh`` (vLLM and ArcticInference installed), from the
repository root, e.g.::

    PYTHONPATH=python:. /tmp/vstage/venv/bin/python benches/serving/vllm_replay.py \\
        --methods none,ngram,suffix,racer --concurrency 1,4,8 --prompts 8
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "python")]

from benches.serving.vllm_cpu import PROPOSER, load_prompts  # noqa: E402

MAX_MODEL_LEN = 2048


class Clock:
    """The replay's modelled time, read by ``RacerProposer`` as its ``time.perf_counter``."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@dataclass
class Request:
    index: int
    prompt: list[int]
    tokens: list[int]  # prompt and output so far
    cache: Any = None
    cached: int = 0  # tokens whose keys and values are in the cache
    drafts: list[int] = field(default_factory=list)

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt) :]


class Target:
    """The target model, one KV cache per request."""

    def __init__(self, folder: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, DynamicCache

        self.torch, self.cache_type = torch, DynamicCache
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.vocab = int(self.model.config.vocab_size)

    def forward(self, request: Request, new: list[int]) -> Any:
        """Logits ``[len(new), vocab]`` after each of ``new``, appended to the request's cache."""
        if request.cache is None:
            request.cache = self.cache_type()
        ids = self.torch.tensor([new])
        with self.torch.no_grad():
            out = self.model(input_ids=ids, past_key_values=request.cache, use_cache=True)
        request.cached += len(new)
        return out.logits[0].float()

    def crop(self, request: Request, length: int) -> None:
        if request.cached > length:
            request.cache.crop(length - request.cached)  # a negative count drops that many
        request.cached = length


def make_proposer(method: str, args: argparse.Namespace, vocab: int, clock: Clock) -> tuple[Any, Any]:
    """The proposer a server for ``method`` builds, with a config carrying what it reads, and
    the stand-in target model whose ``compute_logits`` the runner calls (``None``: unwrapped)."""
    spec = SimpleNamespace(
        num_speculative_tokens=args.k,
        prompt_lookup_min=2,
        prompt_lookup_max=5,
        suffix_decoding_max_tree_depth=24,
        suffix_decoding_max_cached_requests=10000,
        suffix_decoding_max_spec_factor=1.0,
        suffix_decoding_min_token_prob=0.1,
    )
    config = SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN, get_vocab_size=lambda: vocab),
        scheduler_config=SimpleNamespace(max_num_seqs=max(args.concurrency)),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )
    if method == "ngram":
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        return NgramProposer(config), None
    if method == "suffix":
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        return SuffixDecodingProposer(config), None
    variant = args.variants.get(method, {"class": PROPOSER} if method == "racer" else None)
    if variant is None:
        raise SystemExit(f"unknown method {method!r}")
    os.environ["RACER_RS_OPTIONS"] = json.dumps(variant.get("options", {}))
    module_name, _, class_name = variant.get("class", PROPOSER).rpartition(".")
    module = importlib.import_module(module_name)
    import racer_rs.integrations.vllm as integration

    for proposer_module in (integration, module):  # a variant's own module too
        if hasattr(proposer_module, "time"):
            proposer_module.time = clock  # its step-cost fit reads the modelled clock
    proposer = getattr(module, class_name)(config)
    model = SimpleNamespace(compute_logits=lambda logits: logits, config=SimpleNamespace(vocab_size=vocab))
    proposer.load_model(model)
    return proposer, model


def runner_arrays(rows: list[Request]) -> tuple[np.ndarray, np.ndarray]:
    """The runner's ``num_tokens_no_spec`` and ``token_ids_cpu`` for the condensed rows (vLLM
    keeps them up to date as it goes: building them is not the proposer's time)."""
    num_tokens = np.zeros(len(rows), dtype=np.int32)
    token_ids = np.zeros((len(rows), MAX_MODEL_LEN), dtype=np.int32)
    for i, request in enumerate(rows):
        num_tokens[i] = len(request.tokens)
        token_ids[i, : len(request.tokens)] = request.tokens
    return num_tokens, token_ids


def propose(
    method: str,
    proposer: Any,
    rows: list[Request],
    sampled: list[list[int]],
    k: int,
    arrays: tuple[np.ndarray, np.ndarray],
) -> list[list[int]]:
    """One ``propose`` call with the runner's arrays for the condensed rows."""
    num_tokens, token_ids = arrays
    if method == "none":
        return [[] for _ in rows]
    if method == "ngram":
        return proposer.propose(k, sampled, num_tokens, token_ids)
    if method == "suffix":
        ids = [str(request.index) for request in rows]
        batch = SimpleNamespace(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            num_tokens_no_spec=num_tokens,
            token_ids_cpu=token_ids,
            num_prompt_tokens=np.array([len(r.prompt) for r in rows], dtype=np.int32),
        )
        return proposer.propose(k, batch, sampled)
    return proposer.propose(sampled, num_tokens, token_ids)


def run_level(
    method: str,
    proposer: tuple[Any, Any],
    target: Target,
    prompts: list[list[int]],
    concurrency: int,
    args: argparse.Namespace,
    clock: Clock,
) -> dict[str, Any]:
    """Every prompt through the loop at ``concurrency``; modelled seconds and counters."""
    drafter, model = proposer
    a, b, p = (x / 1e3 for x in args.step_ms)
    waiting = [Request(i, list(prompt), list(prompt)) for i, prompt in enumerate(prompts)]
    waiting.reverse()
    running: list[Request] = []
    done: dict[int, list[int]] = {}
    seconds = propose_seconds = 0.0
    steps = decode_rows = drafted = accepted = 0
    # Steps with every one of the C rows running: the steady state of a long-running server,
    # without the waves' tails (which request ends last decides those, more than the drafts).
    full_seconds, full_tokens = 0.0, 0
    while waiting or running:
        while waiting and len(running) < concurrency:
            running.append(waiting.pop())
        logit_rows, sampled, decode_tokens, prefill_tokens = [], [], 0, 0
        for request in running:
            if request.cached == 0:  # prefill: its first token
                logits = target.forward(request, request.tokens)
                prefill_tokens += len(request.tokens)
                logit_rows.append(logits[-1:])
                new = [int(logits[-1].argmax())]
            else:
                logits = target.forward(request, request.tokens[request.cached :] + request.drafts)
                logit_rows.append(logits)
                decode_tokens += len(logits)
                decode_rows += 1
                best = logits.argmax(dim=-1).tolist()
                n = 0
                while n < len(request.drafts) and request.drafts[n] == best[n]:
                    n += 1
                new = [*request.drafts[:n], best[n]]
                accepted += n
            budget = args.max_tokens - len(request.output)
            new = new[:budget]
            if target.eos in new:
                new = new[: new.index(target.eos) + 1]
            request.tokens += new
            target.crop(request, len(request.tokens) - 1)
            sampled.append(new)
        steps += 1
        step = a + b * decode_tokens + p * prefill_tokens
        clock.now += step
        full = len(running) == concurrency
        if method != "none":
            # The step's logits as one tensor, as the forward leaves them (not the proposer's time).
            logits = target.torch.cat(logit_rows)
            arrays = runner_arrays(running)
            proposer_start = time.perf_counter()
            if model is not None:  # the runner's compute_logits call on this step's rows
                model.compute_logits(logits)
            drafts = propose(method, drafter, running, sampled, args.k, arrays)
            spent = time.perf_counter() - proposer_start
            clock.now += spent
            propose_seconds += spent
        else:
            drafts = [[] for _ in running]
        seconds += step
        if full:
            full_seconds += step + (spent if method != "none" else 0.0)
            full_tokens += sum(len(new) for new in sampled)
        still = []
        for request, draft in zip(running, drafts, strict=True):
            if len(request.output) >= args.max_tokens or request.tokens[-1] == target.eos:
                done[request.index] = request.output
                continue
            request.drafts = [int(t) for t in draft][: MAX_MODEL_LEN - len(request.tokens) - 1]
            drafted += len(request.drafts)
            still.append(request)
        running = still
    tokens = sum(len(o) for o in done.values())
    return {
        "outputs": [done[i] for i in range(len(prompts))],
        "tokens": tokens,
        "steps": steps,
        "steady_tokens_per_s": full_tokens / full_seconds if full_seconds > 0 else 0.0,
        "steady_share": full_seconds / (seconds + propose_seconds),
        "seconds": seconds + propose_seconds,
        "propose_ms": 1e3 * propose_seconds / steps,
        "decode_rows": decode_rows,
        "tokens_per_step": (tokens - len(prompts)) / max(decode_rows, 1),
        "drafted": drafted,  # every draft is verified the next step
        "accepted": accepted,
    }


def summary(method: str, concurrency: int, result: dict[str, Any], none: dict[str, Any] | None) -> str:
    """One method's line at one level (over ``none``'s when it ran first)."""
    speed = result["tokens"] / result["seconds"]
    line = f"{method:>10} c={concurrency}: {speed:.2f} tokens/s modelled"
    if none is not None:
        same = sum(x == y for x, y in zip(result["outputs"], none["outputs"], strict=True))
        line += f" ({speed / (none['tokens'] / none['seconds']):.3f}x none, same output {same}/{len(none['outputs'])})"
    steady = result["steady_tokens_per_s"]
    line += f"; steady {steady:.2f}"
    if none is not None and none["steady_tokens_per_s"] > 0:
        line += f" ({steady / none['steady_tokens_per_s']:.3f}x none)"
    line += f" over {100 * result['steady_share']:.0f}% of the time"
    line += (
        f", tokens/step {result['tokens_per_step']:.3f}, drafted {result['drafted']}, accepted {result['accepted']},"
        f" propose {result['propose_ms']:.2f} ms/step"
    )
    if "proposer" in result:
        line += "\n            " + json.dumps(result["proposer"])
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="HF folder (default: SmolLM2-135M-Instruct from our cache)")
    parser.add_argument("--methods", default="none,ngram,suffix,racer")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--prompts", type=int, default=8, help="measured prompts per set (x2 sets) and level")
    parser.add_argument("--skip", type=int, default=1, help="prompts per set skipped (a server run's warm-up)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up prompts per set, at concurrency 1")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    parser.add_argument(
        "--step-ms", default="60,2.1,0.5", help="a,b,p: modelled ms per step, per decode token, per prefill token"
    )
    parser.add_argument("--variant", action="append", default=[], help='NAME={"class": ..., "options": {...}}')
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.step_ms = [float(x) for x in args.step_ms.split(",")]
    args.variants = {}
    for text in args.variant:
        name, _, spec = text.partition("=")
        args.variants[name] = json.loads(spec)
    methods = args.methods.split(",")
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]), flush=True)
    if args.model is None:
        from racer_rs.loading.models import checkpoint_folder, resolve_model

        args.model = checkpoint_folder(resolve_model("smollm2-135m-instruct"))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    target = Target(args.model)
    target.eos = int(tokenizer.eos_token_id)
    warmup = load_prompts(tokenizer, args.warmup, 0) if args.warmup else []
    levels = {}
    skip = args.skip
    for c in args.concurrency:
        levels[c] = load_prompts(tokenizer, args.prompts, skip)
        skip += args.prompts
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for c, prompts in levels.items():
        for method in methods:
            clock = Clock()
            proposer = (None, None) if method == "none" else make_proposer(method, args, target.vocab, clock)
            if warmup:
                run_level(method, proposer, target, warmup, 1, args, clock)
            result = run_level(method, proposer, target, prompts, c, args, clock)
            drafter = proposer[0]
            if hasattr(drafter, "timing"):  # RacerProposer: its fitted step cost and its counters
                scales = drafter.source_scales().round(3).tolist() if hasattr(drafter, "source_scales") else None
                result["proposer"] = {
                    **drafter.stats,
                    **drafter.timing(),
                    "scale": drafter.calibration.extra_scale(),
                    "source_scales": scales,
                }
            results.setdefault(method, {})[c] = result
            print(summary(method, c, result, results.get("none", {}).get(c)), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
