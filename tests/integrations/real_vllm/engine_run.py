"""One offline vLLM engine on SmolLM2-135M-Instruct (float32, eager), run in its own process by
the real-engine tests: greedy answers to a few prompts at concurrency 1 and 4, then (with
``--method racer``) a request aborted midway and a prompt resent after it finished, with the
proposer's state counted at each point. Writes one JSON file.

    python tests/integrations/real_vllm/engine_run.py --method none|racer --model DIR --out FILE

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the proposer object
is reachable through ``collective_rpc``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
# The copy-logit rows are off by default in vLLM (they did not pay in its one chain per
# request); on here, so that the compute_logits wrapper and the attribution of its rows are
# tested in the real engine, the path with the most moving parts (the default, retrieval
# alone, is the same proposer without them).
os.environ.setdefault("RACER_RS_OPTIONS", '{"use_logits": true}')

DATA = Path(__file__).resolve().parents[3] / "data"
K = 8  # num_speculative_tokens
MAX_TOKENS = 40
PROPOSER = "racer_rs.integrations.vllm.RacerProposer"


def prompts(tokenizer: Any) -> list[list[int]]:
    """Chat-templated token ids: 2 Spec-Bench first turns and 2 HumanEval tasks."""
    rows = []
    for name, take in (("spec_bench.jsonl", (0, 40)), ("human_eval.jsonl", (0, 1))):
        lines = (DATA / name).read_text().splitlines()
        rows += [json.loads(lines[i])["turns"][0] for i in take]
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        for q in rows
    ]


def proposer_state(worker: Any) -> dict[str, Any]:
    """The proposer's counters and live state (run on the worker by ``collective_rpc``)."""
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    drafter = runner.drafter
    pool = drafter._pool
    return {"stats": dict(drafter.stats), "rows": len(drafter._rows), "pool": 0 if pool is None else len(pool)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", choices=("none", "racer"), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = None
    if args.method == "racer":
        spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K}
    llm = LLM(
        model=args.model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        max_num_seqs=4,
        seed=0,
        speculative_config=spec,
        disable_log_stats=False,
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    ids = prompts(llm.get_tokenizer())
    result: dict[str, Any] = {"method": args.method, "prompts": len(ids)}

    def generate(batch: list[list[int]]) -> list[list[int]]:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], greedy, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    result["c1"] = [generate([p])[0] for p in ids]
    result["c4"] = generate(ids)  # max_num_seqs=4: four at a time
    if args.method == "racer":
        result["after_generate"] = llm.collective_rpc(proposer_state)[0]
        result["abort"] = abort_scenario(llm, ids)
        result["metrics"] = spec_metrics(llm)
    Path(args.out).write_text(json.dumps(result))
    return 0


def abort_scenario(llm: Any, ids: list[list[int]]) -> dict[str, Any]:
    """Requests A and B run together; A is aborted after a few tokens; B runs to its end; then
    A's prompt is sent again, alone, and runs to its end."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    # Every step's output (LLM.generate's parameters report only finished requests).
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, output_kind=RequestOutputKind.CUMULATIVE)
    engine = llm.llm_engine

    def state() -> dict[str, Any]:
        result: dict[str, Any] = llm.collective_rpc(proposer_state)[0]
        return result

    out: dict[str, Any] = {}
    engine.add_request("a", {"prompt_token_ids": ids[0]}, greedy)
    engine.add_request("b", {"prompt_token_ids": ids[1]}, greedy)
    produced = 0
    b_tokens: list[int] = []
    for _ in range(200):  # bounded: a few steps reach 8 tokens
        for o in engine.step():
            if o.request_id == "a":
                produced = len(o.outputs[0].token_ids)
            if o.request_id == "b":
                b_tokens = list(o.outputs[0].token_ids)
        if produced >= 8:
            break
    out["a_tokens_before_abort"] = produced
    out["before_abort"] = state()
    engine.abort_request(["a"])
    steps = 0
    while engine.has_unfinished_requests() and steps < 500:
        for o in engine.step():
            if o.request_id == "b":
                b_tokens = list(o.outputs[0].token_ids)
        steps += 1
        if steps == 1:
            out["after_abort"] = state()  # the first propose after the abort
    out["b"] = b_tokens
    out["after_b"] = state()
    engine.add_request("a2", {"prompt_token_ids": ids[0]}, greedy)
    a_tokens: list[int] = []
    steps = 0
    while engine.has_unfinished_requests() and steps < 500:
        for o in engine.step():
            a_tokens = list(o.outputs[0].token_ids)
        steps += 1
    out["a_resent"] = a_tokens
    out["after_resend"] = state()
    return out


def spec_metrics(llm: Any) -> dict[str, float]:
    """vLLM's own speculative-decoding counters (``vllm:spec_decode_*``)."""
    found: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode") and hasattr(metric, "value"):
            found[metric.name] = float(metric.value)
    return found


if __name__ == "__main__":
    sys.exit(main())
