"""``racer distill-draft``: distil a self-draft from the target, within a time budget, resumably."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from racer_rs.cli import common
from racer_rs.cli.loading import DTYPES
from racer_rs.errors import error_context

DESCRIPTION = """\
Make a draft model for a target that has none: the target's first --layers decoder layers (its
embedding and LM head shared), trained to match the target's next-token distributions on text
the target generates from the prompt files (by default the shipped MGSM, HumanEval and code
prompts, never the benchmark's). The whole run takes about --minutes (data generation and
training; model loading excluded), prints progress with the time left, and saves its work as it
goes: interrupted, the same command resumes it; rerun with more --minutes, it trains further.
Use the result with --draft-model OUT."""

DEFAULT_DATA = ("data/mgsm.jsonl", "data/human_eval.jsonl", "data/code_completion.jsonl")


def add_parser(subparsers: Any) -> None:
    """Register the ``distill-draft`` subcommand."""
    parser = subparsers.add_parser("distill-draft", help="distil a self-draft from the target", description=DESCRIPTION)
    parser.add_argument("--layers", type=common.positive_int, required=True, help="decoder layers of the draft (K)")
    parser.add_argument("--minutes", type=positive_float, required=True, help="time budget of the whole distillation")
    parser.add_argument("--out", required=True, help="output folder (the checkpoint; resumes what it holds)")
    parser.add_argument(
        "--vocab", type=common.positive_int, help="reduced draft vocabulary: keep the N most frequent tokens"
    )
    parser.add_argument(
        "--data",
        action="append",
        help="prompt file (.jsonl, Spec-Bench format); repeatable (default: " + ", ".join(DEFAULT_DATA) + ")",
    )
    parser.add_argument("--batch-size", type=common.positive_int, default=8, help="prompts per generation batch")
    parser.add_argument("--new-tokens", type=common.positive_int, default=256, help="tokens generated per prompt")
    parser.add_argument("--data-share", type=share, default=0.5, help="share of the budget for data generation")
    parser.add_argument("--temperature", type=common.non_negative_float, default=0.8, help="of the data generation")
    parser.add_argument("--top-p", type=common.probability, default=0.95, help="of the data generation")
    parser.add_argument("--lr", type=positive_float, default=3e-4, help="Adam learning rate")
    parser.add_argument("--seed", type=common.seed, default=0)
    parser.add_argument("--model", help="target model (default: smollm2-135m-instruct)")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="of the target and the trained draft (default: float32)"
    )
    parser.add_argument("--device", default="auto", help="torch device, or auto (default: auto)")
    parser.add_argument("--threads", type=common.thread_count, default=0, help="torch CPU threads, 0 = torch's choice")
    parser.set_defaults(run=run)


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = common.non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def share(text: str) -> float:
    """argparse type: a float in (0, 1)."""
    value = common.non_negative_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    """Run ``racer distill-draft``; return the exit code."""
    common.require_extra("hf", "racer distill-draft")
    from racer_rs.selfdraft.distillation.run import check_output_folder

    with error_context("--out"):
        check_output_folder(args.out)
    prompts_files = _prompt_files(args)
    with common.torch_threads(args.threads):
        return _run(args, prompts_files)


def _prompt_files(args: argparse.Namespace) -> list[str]:
    from racer_rs.bench.prompts import load_questions
    from racer_rs.cli.resources import resolve_shipped

    files = args.data or [resolve_shipped(path, "--data") for path in DEFAULT_DATA]
    for path in files:
        load_questions(path)  # a missing or malformed file fails before the model loads
    return files


def _run(args: argparse.Namespace, files: list[str]) -> int:
    from racer_rs.cli.loading import check_model, load_model
    from racer_rs.cli.resources import DEFAULT_TARGET_MODEL
    from racer_rs.loading.devices import resolve_device
    from racer_rs.loading.models import eos_token_ids
    from racer_rs.selfdraft.distillation import DistillSettings, distill_self_draft

    spec = args.model or DEFAULT_TARGET_MODEL
    check_model(spec, "--model")
    device = resolve_device(args.device)
    settings = DistillSettings(
        layers=args.layers,
        minutes=args.minutes,
        vocab=args.vocab,
        data_share=args.data_share,
        batch_size=args.batch_size,
        new_tokens=args.new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        lr=args.lr,
        seed=args.seed,
    )
    model, tokenizer = load_model(spec, args.dtype, device)
    prompts = _encode_prompts(tokenizer, files)
    eos = eos_token_ids(model, tokenizer) or []
    special = [int(i) for i in getattr(tokenizer, "all_special_ids", [])]

    header = [f"{len(prompts)} prompts from {', '.join(files)}; budget {args.minutes:g} min; output {args.out}"]

    def say(line: str) -> None:
        # The header waits for the first report, so that bad input prints only its error line.
        for text in [*header, line]:
            print(f"racer: distill-draft: {text}", file=sys.stderr, flush=True)
        header.clear()

    try:
        result = distill_self_draft(
            model,
            prompts,
            args.out,
            settings,
            target_name=spec,
            eos_token_ids=eos,
            keep_tokens=special,
            progress=say,
        )
    except KeyboardInterrupt:
        say(f"interrupted; the work done so far is saved in {args.out}: run the same command to resume")
        raise
    print(f"{result.checkpoint}  (use: --draft-model {result.checkpoint})")
    return 0


def _encode_prompts(tokenizer: Any, files: list[str]) -> list[list[int]]:
    from racer_rs.bench.prompting import encode_conversation, encode_text
    from racer_rs.bench.prompts import load_questions

    prompts = []
    for path in files:
        for question in load_questions(path):
            if question.mode == "completion":
                prompts.append(encode_text(tokenizer, question.turns[0]))
            else:
                prompts.append(encode_conversation(tokenizer, [question.turns[0]], []))
    return prompts
