"""``racer index``: build a shared index from text files (``build``) and describe one (``info``).

``racer index build FILES... --model M --out INDEX`` tokenizes every file with the model's
tokenizer (only the tokenizer is loaded, never the weights) and indexes each document as one
sequence of a :class:`racer_rs.Automaton` (``extend`` + ``new_sequence``), saved atomically with
``Automaton.save``. A ``.jsonl`` file holds one JSON object per line: Spec-Bench rows, each turn a
document (``--field turns``), or a ``text`` string per row (``--field text``); by default a row's
``turns`` when it has them, else its ``text``. Any other file is plain UTF-8 text, one document.
Text is tokenized without special tokens (the index holds text a response may continue).

The index is used by the racer methods' ``index`` option: ``racer generate --index INDEX``,
``racer bench --methods racer,racer+index --index INDEX``, ``generate(..., index="INDEX")``.

Every check that can fail runs before the tokenizer is loaded: ``--out`` must be a file in a
writable folder (a probe file is created and removed), every input readable, every JSONL row
well formed (the error names ``file:line``), the index settings valid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from racer_rs.cli import common
from racer_rs.cli.errors import CLIError, one_line

FIELDS = ("turns", "text")
DEFAULT_NGRAM = 10
DEFAULT_MIN_DEPTH = 2


def _default_max_nodes() -> int:
    from racer_rs.drafters.index import INDEX_MAX_NODES

    return INDEX_MAX_NODES


def add_parser(subparsers: Any) -> None:
    """Register the ``index`` subcommand and its ``build`` and ``info`` subcommands."""
    parser = subparsers.add_parser(
        "index", help="build or describe a shared index", description=(__doc__ or "").split("\n\n")[0]
    )
    actions = parser.add_subparsers(dest="index_command", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build",
        help="build a shared index from text or JSONL files",
        description="Tokenize text or JSONL files with a model's tokenizer and save them as a shared index "
        "(an Automaton) for the racer methods' index option (racer generate --index, racer bench --index).",
    )
    build.add_argument("files", nargs="+", metavar="FILE", help="plain text files or .jsonl files")
    build.add_argument(
        "--model", required=True, help="the model whose tokenizer indexes the text (name, folder, .gguf)"
    )
    build.add_argument("--out", required=True, metavar="INDEX", help="the index file to write (replaced atomically)")
    build.add_argument(
        "--ngram",
        type=common.positive_int,
        default=DEFAULT_NGRAM,
        help=f"longest n-gram indexed, 2..64 (default: {DEFAULT_NGRAM}, racer's)",
    )
    build.add_argument(
        "--max-nodes",
        type=common.positive_int,
        default=None,
        help="node budget, LRU eviction beyond it (about 110 bytes a node; default: 1000000)",
    )
    build.add_argument(
        "--min-depth",
        type=common.positive_int,
        default=DEFAULT_MIN_DEPTH,
        help=f"shortest context suffix a retrieval may match (default: {DEFAULT_MIN_DEPTH})",
    )
    build.add_argument(
        "--field",
        choices=FIELDS,
        default=None,
        help="what a JSONL row holds: turns (each turn a document) or text (default: turns when a row has them, "
        "else text)",
    )
    build.add_argument("--no-progress", action="store_true", help="no progress bar")
    build.set_defaults(run=run_build)
    info = actions.add_parser("info", help="describe a saved index", description="Print a saved index's settings.")
    info.add_argument("index", metavar="INDEX", help="an index file")
    info.set_defaults(run=run_info)


@dataclass(frozen=True)
class Document:
    """One text to index as a sequence, and where it came from (``file`` or ``file:line``)."""

    text: str
    where: str


def check_out(out: str, inputs: list[str]) -> Path:
    """``--out`` as a path to write, checked before any work.

    Raises:
        CLIError: a folder, an input file, or a folder that is missing or not writable.
    """
    path = Path(out).expanduser()
    if path.is_dir():
        raise CLIError(f"--out {out} is a folder; give the index file's path")
    if path.exists() and any(path.resolve() == Path(name).expanduser().resolve() for name in inputs):
        raise CLIError(f"--out {out} is one of the input files")
    folder = path.parent
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise CLIError(f"--out {out}: the folder {folder} {what}")
    try:  # a real probe: permission bits say little for root or a read-only mount
        handle, probe = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".probe", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise CLIError(f"--out {out}: cannot write in {folder}: {exc.strerror or one_line(exc)}") from None
    return path


def read_documents(files: list[str], field: str | None) -> list[Document]:
    """Every document of the input files, in order.

    Raises:
        CLIError: a file that is missing or unreadable, not UTF-8, or a bad JSONL row (the message
            names ``file:line``), or no text at all.
    """
    documents: list[Document] = []
    for name in files:
        path = Path(name).expanduser()
        if path.is_dir():
            raise CLIError(f"{name} is a folder, not a text or JSONL file")
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CLIError(f"file not found: {name}") from None
        except UnicodeDecodeError:
            raise CLIError(f"{name} is not UTF-8 text") from None
        except OSError as exc:
            raise CLIError(f"cannot read {name}: {exc.strerror or one_line(exc)}") from None
        if path.suffix.lower() == ".jsonl":
            documents.extend(_jsonl_documents(name, text, field))
        elif text.strip():
            documents.append(Document(text, name))
    if not documents:
        raise CLIError("no text to index in " + ", ".join(files))
    return documents


def _jsonl_documents(name: str, text: str, field: str | None) -> list[Document]:
    documents: list[Document] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CLIError(f"{where}: invalid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise CLIError(f"{where}: expected a JSON object, got {type(row).__name__}")
        use = field or ("turns" if "turns" in row else "text")
        if use not in row:
            wanted = f"no {use!r} field" if field else "neither a 'turns' nor a 'text' field"
            raise CLIError(f"{where}: {wanted}")
        value = row[use]
        if use == "turns":
            if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
                raise CLIError(f"{where}: 'turns' must be a non-empty list of strings")
            documents.extend(Document(turn, where) for turn in value if turn.strip())
        else:
            if not isinstance(value, str):
                raise CLIError(f"{where}: 'text' must be a string, got {type(value).__name__}")
            if value.strip():
                documents.append(Document(value, where))
    return documents


def run_build(args: argparse.Namespace) -> int:
    """Run ``racer index build``; return the exit code."""
    from racer_rs import Automaton
    from racer_rs.cli.loading import check_model
    from racer_rs.errors import error_context

    out = check_out(args.out, list(args.files))
    max_nodes = args.max_nodes if args.max_nodes is not None else _default_max_nodes()
    with error_context("index settings"):
        automaton = Automaton(ngram=args.ngram, max_nodes=max_nodes, min_depth=args.min_depth)
    check_model(args.model, "--model")
    documents = read_documents(list(args.files), args.field)
    if not args.no_progress:
        common.require_extra("hf", "the progress bar of racer index build (or pass --no-progress)")

    from racer_rs.loading.models import load_tokenizer

    with error_context("--model"):
        tokenizer = load_tokenizer(args.model)
    bar: Any = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(documents), desc="index", unit="doc", file=sys.stderr, dynamic_ncols=True)
    tokens = 0
    try:
        for document in documents:
            ids = tokenizer(document.text, add_special_tokens=False, verbose=False)["input_ids"]
            if ids:
                automaton.extend(ids)
                automaton.new_sequence()
                tokens += len(ids)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(tokens=tokens, nodes=len(automaton), refresh=False)
    finally:
        if bar is not None:
            bar.close()
    try:
        automaton.save(out)
    except OSError as exc:
        raise CLIError(f"cannot write --out {args.out}: {exc.strerror or one_line(exc)}") from None
    print(
        f"wrote {out}: {len(documents)} documents, {tokens} tokens, {len(automaton)} nodes "
        f"(budget {automaton.max_nodes}, ngram {automaton.ngram}, min_depth {automaton.min_depth}), "
        f"{out.stat().st_size} bytes"
    )
    if len(automaton) >= automaton.max_nodes:
        print(
            f"racer: warning: the index filled its node budget ({automaton.max_nodes}): the least recently "
            "used n-grams were evicted; pass a larger --max-nodes to keep the whole text",
            file=sys.stderr,
        )
    return 0


def run_info(args: argparse.Namespace) -> int:
    """Run ``racer index info``; return the exit code."""
    from racer_rs import Automaton
    from racer_rs.errors import error_context

    path = Path(args.index).expanduser()
    if not path.is_file():
        raise CLIError(f"index file not found: {args.index}" if not path.exists() else f"{args.index} is not a file")
    try:
        with error_context("index"):
            automaton = Automaton.load(path)
    except OSError as exc:
        raise CLIError(f"cannot read index {args.index}: {exc.strerror or one_line(exc)}") from None
    print(
        f"{args.index}: {len(automaton)} nodes (budget {automaton.max_nodes}), ngram {automaton.ngram}, "
        f"min_depth {automaton.min_depth}, {path.stat().st_size} bytes"
    )
    return 0
