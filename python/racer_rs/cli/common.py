"""Arguments and checks shared by ``racer generate`` and ``racer bench``."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from racer_rs.cli.errors import CLIError
from racer_rs.cli.loading import DTYPES

#: Methods whose drafter is a separate draft model (passed as the ``draft_model`` option), and
#: transformers' assisted generation (a peer in ``racer bench``).
DRAFT_MODEL_METHODS = frozenset({"draft_model", "tts", "racer_tts", "hf_assisted"})


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def capacity(text: str) -> int | str:
    """argparse type: a tree capacity (an integer >= 1) or ``auto``."""
    from racer_rs._validate import capacity as capacity_rule
    from racer_rs.errors import RacerError

    try:
        return capacity_rule("capacity", text)
    except RacerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


#: The most CPU threads a run may ask for (the same bound as DraftPool's).
MAX_THREADS = 1024


def thread_count(text: str) -> int:
    """argparse type: a thread count in 0..MAX_THREADS (0: torch's own choice)."""
    value = non_negative_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_THREADS}, got {value}")
    return value


def seed(text: str) -> int:
    """argparse type: a random seed, an integer in [0, 2**64)."""
    value = non_negative_int(text)
    if value >= 2**64:
        raise argparse.ArgumentTypeError(f"must be < 2**64, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def probability(text: str) -> float:
    """argparse type: a float in (0, 1]."""
    value = _float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser, default_threads: int = 0) -> None:
    """Add --model, --draft-model, --dtype, --device, --no-pack-weights, --threads and --option.

    Args:
        parser: The subcommand's parser.
        default_threads: Default of --threads (0 keeps torch's own choice).
    """
    parser.add_argument(
        "--model",
        help="target model: a known name (smollm2-135m-instruct, pycode-target-7m), a checkpoint "
        "folder or a .gguf file (default: smollm2-135m-instruct)",
    )
    parser.add_argument(
        "--draft-model",
        help="draft model for draft_model/tts/racer_tts and hf_assisted: a name, folder or .gguf file; "
        "self:K (the target's first K layers) or a folder made by racer distill-draft",
    )
    parser.add_argument(
        "--dtype",
        choices=("auto", *DTYPES),
        default="auto",
        help="model dtype; auto: bfloat16 where the hardware computes it natively (a CUDA GPU that "
        "supports it, a CPU with AVX-512 BF16 or AMX), float16 on an older CUDA GPU, else float32 "
        "(default: auto)",
    )
    parser.add_argument("--device", default="auto", help="torch device, or auto (default: auto)")
    parser.add_argument(
        "--no-pack-weights",
        dest="pack_weights",
        action="store_false",
        help="keep torch's own linear layers: do not pack half-precision CPU weights once "
        "(racer_rs.pack_linear_weights; packed, multi-token forwards take up to half the time)",
    )
    parser.add_argument(
        "--threads",
        type=thread_count,
        default=default_threads,
        help=f"torch CPU threads, 0 = torch's choice (default: {default_threads})",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="method option passed to the drafter (JSON value); repeatable",
    )


def available_methods() -> list[str]:
    """The method names of the drafter registry."""
    from racer_rs import drafters

    return list(drafters.available_methods())


def check_index_method(label: str, method: str) -> None:
    """A METHOD+index label (``label``, naming ``method``) must name a method that takes a
    shared index."""
    from racer_rs import drafters
    from racer_rs.bench.hf_peers import PEERS

    if method in PEERS or "index" not in drafters.accepted_options(method):
        takers = [m for m in available_methods() if takes_index(m)]
        raise CLIError(
            f"--methods {label}: method {method!r} takes no shared index (those that do: {', '.join(takers)})"
        )


def takes_index(method: str) -> bool:
    """Whether ``method`` is importable and takes the ``index`` option."""
    from racer_rs import drafters

    if not method_importable(method):
        return False
    try:
        return "index" in drafters.accepted_options(method)
    except ImportError:
        return False


def method_importable(method: str) -> bool:
    """True when ``method`` is registered, its module can be found and the extra it needs (if
    any) is installed; nothing is imported (``find_spec`` only)."""
    import importlib.util

    from racer_rs import drafters
    from racer_rs.optional_deps import missing

    target = drafters.METHODS.get(method)
    if target is None:
        return False
    extra = drafters.METHOD_EXTRAS.get(method)
    if extra is not None and missing(extra):
        return False
    try:
        return importlib.util.find_spec(target.split(":")[0]) is not None
    except (ImportError, ValueError):
        return False


def check_methods(methods: Sequence[str], extra: Sequence[str] = ()) -> None:
    """Raise CLIError for an unknown or repeated method name (``extra``: more accepted names),
    or for a method whose optional extra is not installed (before any model is loaded)."""
    from racer_rs.drafters import METHOD_EXTRAS

    known = available_methods() + list(extra)
    for method in methods:
        if method not in known:
            raise CLIError(f"unknown method {method!r} (available: {', '.join(known)})")
    repeated = sorted({m for m in methods if list(methods).count(m) > 1})
    if repeated:
        raise CLIError(f"method {repeated[0]!r} is listed more than once")
    for method in methods:
        if method in METHOD_EXTRAS:
            require_extra(METHOD_EXTRAS[method], f"method {method!r}")


def reserved_options() -> frozenset[str]:
    """``racer_rs.generate``'s own keyword arguments (they have flags; a drafter option of the same
    name would clash inside generate), plus ``draft_model`` (``--draft-model``)."""
    import inspect

    from racer_rs.engine.generation import generate

    parameters = inspect.signature(generate).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is not p.VAR_KEYWORD) | {"draft_model"}


def check_options(options: dict[str, Any], method: str) -> None:
    """Reject --option keys that have their own flag (they would clash inside generate)."""
    reserved = reserved_options()
    for key in options:
        if key in reserved:
            raise CLIError(f"--option {key!r} (method {method}): use the dedicated flag instead")


def index_spec(spec: str | None) -> str:
    """``--index``: ``memory`` (also when not given) or an existing index file, checked before
    any model is loaded (the file's content is checked when it is loaded).

    Raises:
        CLIError: a missing file, or a folder.
    """
    from pathlib import Path

    from racer_rs.drafters.index import MEMORY

    if spec is None or spec == MEMORY:
        return MEMORY
    path = Path(spec).expanduser()
    if not path.exists():
        raise CLIError(f"--index: file not found: {spec}")
    if path.is_dir():
        raise CLIError(f"--index: {spec} is a folder, not an index file (made by racer index build)")
    return spec


def require_extra(extra: str, purpose: str) -> None:
    """Raise CLIError naming the extra to install when one of its packages is missing."""
    from racer_rs.optional_deps import MissingDependencyError, require

    try:
        require(extra, purpose)
    except MissingDependencyError as exc:
        raise CLIError(str(exc)) from None


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch intra-op threads (0: leave as is), then restore."""
    import torch

    previous = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def bench_eos_ids(args: argparse.Namespace, models: LoadedModels) -> list[int] | None:
    """The ids a benchmark's requests end at: the model's EOS ids, none with ``--ignore-eos``
    (every request then generates its ``--max-new-tokens`` in full)."""
    from racer_rs.loading.models import eos_token_ids

    return None if getattr(args, "ignore_eos", False) else eos_token_ids(models.model, models.tokenizer)


class LoadedModels:
    """The target model, its tokenizer and (when a method needs one) the draft model.

    Every spec and the packages its loading needs are checked before anything is loaded.

    Attributes:
        model_path: The target's spec (a short name, folder or ``.gguf`` file).
        draft_path: The draft's spec, or None when no method needs one.
        device: The resolved torch device string.
    """

    def __init__(self, args: argparse.Namespace, methods: Sequence[str], draft_required: bool = True) -> None:
        from racer_rs.cli.loading import check_model, load_model
        from racer_rs.cli.resources import DEFAULT_DRAFTS, DEFAULT_TARGET_MODEL
        from racer_rs.loading.devices import resolve_device, resolve_dtype
        from racer_rs.target.packed_linear import packed_layers

        self.model_path: str = args.model or DEFAULT_TARGET_MODEL
        check_model(self.model_path, "--model")
        self.draft_path: str | None = args.draft_model
        if self.draft_path is None and draft_required and DRAFT_MODEL_METHODS.intersection(methods):
            self.draft_path = DEFAULT_DRAFTS.get(self.model_path)
            if self.draft_path is None:
                needing = ", ".join(m for m in methods if m in DRAFT_MODEL_METHODS)
                raise CLIError(f"method(s) {needing} need a draft model: pass --draft-model")
        from racer_rs.cli.self_drafts import build_self_draft, is_self_draft

        self_made = is_self_draft(self.draft_path)  # built from the target once it is loaded
        if self.draft_path is not None and not self_made:
            check_model(self.draft_path, "--draft-model")

        self.device = resolve_device(args.device)
        self.dtype: str = resolve_dtype(args.dtype, self.device)
        pack = getattr(args, "pack_weights", True)
        self.model, self.tokenizer = load_model(self.model_path, self.dtype, self.device, pack_weights=pack)
        #: Linear layers with packed weights (0: none; see ``--no-pack-weights``).
        self.packed_layers = packed_layers(self.model)
        self.draft_model = None
        if self.draft_path is not None and self_made:
            self.draft_model = build_self_draft(self.draft_path, self.model)
        elif self.draft_path is not None:
            self.draft_model, _ = load_model(
                self.draft_path, self.dtype, self.device, "--draft-model", pack_weights=pack
            )

    def method_options(self, method: str, options: dict[str, Any]) -> dict[str, Any]:
        """Options to build ``method``'s drafter with: the user's plus the draft model if needed."""
        check_options(options, method)
        if method in DRAFT_MODEL_METHODS:
            return {**options, "draft_model": self.draft_model}
        return dict(options)
