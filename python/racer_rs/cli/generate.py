"""``racer generate``: stream one completion to the terminal, drafted tokens highlighted."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from racer_rs.bench.prompting import encode_conversation, encode_text, has_chat_template
from racer_rs.cli import common
from racer_rs.cli.errors import CLIError, one_line
from racer_rs.cli.options import parse_options
from racer_rs.cli.streaming import TerminalStreamer, use_color
from racer_rs.errors import error_context
from racer_rs.loading.models import eos_token_ids

DESCRIPTION = """\
Generate text with speculative decoding, printing it as it is committed. Tokens that came from an
accepted draft are highlighted (on a terminal); a line of statistics ends the run (on stderr)."""


def add_parser(subparsers: Any) -> None:
    """Register the ``generate`` subcommand."""
    parser = subparsers.add_parser("generate", help="stream one completion", description=DESCRIPTION)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", help="file holding the prompt text (- for stdin)")
    parser.add_argument("--method", default="racer", help="drafting method (default: racer)")
    parser.add_argument("--max-new-tokens", type=common.positive_int, default=128)
    parser.add_argument("--temperature", type=common.non_negative_float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=common.probability, default=1.0)
    parser.add_argument("--top-k", type=common.non_negative_int, default=0, help="0 = off")
    parser.add_argument(
        "--capacity",
        type=common.capacity,
        default="auto",
        help="draft tree nodes, or auto (each step's size from this device's measured cost) (default: auto)",
    )
    parser.add_argument(
        "--max-capacity", type=common.positive_int, default=64, help="largest tree --capacity auto verifies"
    )
    parser.add_argument("--seed", type=common.seed, help="random seed for sampling")
    parser.add_argument(
        "--index",
        metavar="INDEX",
        help="a racer method also drafts from this shared index: a file made by racer index build "
        "(or memory: an empty in-memory one, the default of the methods that take one)",
    )
    parser.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="highlight drafted tokens")
    parser.add_argument("--no-color", dest="color", action="store_const", const="never")
    common.add_model_arguments(parser)
    parser.set_defaults(run=run)


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        text = str(args.prompt)
    elif args.prompt_file == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(f"cannot read --prompt-file {args.prompt_file}: {one_line(exc)}") from None
    if not text:
        raise CLIError("the prompt is empty")
    return text


def check_index_arg(spec: str, method: str) -> str:
    """``--index``: ``memory`` or an existing index file, for a method that takes one (checked
    before any model is loaded)."""
    from racer_rs import drafters

    if "index" not in drafters.accepted_options(method):
        raise CLIError(f"--index: method {method!r} takes no shared index (racer, racer_scored, racer_retrieval do)")
    return common.index_spec(spec)


def run(args: argparse.Namespace) -> int:
    """Run ``racer generate``; return the exit code."""
    common.require_extra("hf", "racer generate")
    with common.torch_threads(args.threads):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import torch

    from racer_rs import drafters
    from racer_rs.engine import generation

    prompt = _read_prompt(args)
    common.check_methods([args.method])
    options = parse_options(args.option, [args.method])[args.method]
    if args.index is not None:
        options = {"index": check_index_arg(args.index, args.method), **options}
    models = common.LoadedModels(args, [args.method])
    tokenizer = models.tokenizer

    if args.chat and has_chat_template(tokenizer):
        input_ids = encode_conversation(tokenizer, [prompt], [])
    else:
        if args.chat:
            print("racer: warning: the tokenizer has no chat template; using the raw prompt", file=sys.stderr)
        input_ids = encode_text(tokenizer, prompt)
    if not input_ids:
        raise CLIError("the prompt encodes to no tokens")

    with error_context(f"method {args.method}"):
        drafter = drafters.make_drafter(args.method, models.model, **models.method_options(args.method, options))

    if args.seed is not None:
        torch.manual_seed(args.seed)
    streamer = TerminalStreamer(tokenizer, sys.stdout, use_color(args.color, sys.stdout))
    start = time.perf_counter()
    result = generation.generate(
        models.model,
        input_ids,
        method=args.method,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        eos_token_id=eos_token_ids(models.model, tokenizer),
        capacity=args.capacity,
        max_capacity=args.max_capacity,
        seed=args.seed,
        streamer=streamer,
        drafter=drafter,
    )
    elapsed = time.perf_counter() - start
    new_tokens = len(result.tokens)
    print(
        f"new tokens: {new_tokens} | steps: {result.steps} | MAT: {result.mat:.2f} | "
        f"tokens/s: {new_tokens / elapsed if elapsed > 0 else float('inf'):.1f} | "
        f"drafted: {streamer.drafted_tokens} | method: {args.method}",
        file=sys.stderr,
    )
    return 0
