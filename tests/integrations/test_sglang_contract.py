"""`racer_rs.integrations.sglang`: the corpus contract SGLang 0.5.23's `NGRAMWorker` relies on,
with SGLang's own input and output types (`array('q')` token ids, lists of tails, int64 numpy
drafts, a flat `[bs*N*N]` mask), checked against fresh RACER trees and against a pure-Python
restatement of SGLang's link reconstruction (`engine_reference`). The last tests run SGLang's
own registry, argument resolution and draft preparation where SGLang imports (skipped with the
import error as the reason where it does not).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from array import array
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from racer_rs import Automaton, LogitsTable, build_draft_tree, optional_deps
from racer_rs.errors import InvalidArgumentError, MissingDependencyError, UnsupportedError
from racer_rs.integrations import sglang as plugin
from racer_rs.integrations._shared import copy_logit_order
from racer_rs.integrations.options import ServingOptions
from racer_rs.integrations.sglang import RacerCorpus, resolve_server_args
from tests.integrations.engine_reference import check_sglang_tree_rows, sglang_links, verify_tree_greedy

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VOCAB = 64
TRIE_DEPTH = 18  # --speculative-ngram-max-trie-depth's default: what batch_get's tails hold


def code_like(seed: int, n: int) -> list[int]:
    """A repetitive token stream (chunks repeated, some mutated), so retrieval finds matches."""
    rng = np.random.default_rng(seed)
    chunks = [rng.integers(1, VOCAB, int(rng.integers(4, 12))).tolist() for _ in range(5)]
    out: list[int] = []
    while len(out) < n:
        chunk = list(chunks[int(rng.integers(len(chunks)))])
        if rng.random() < 0.3:
            chunk[int(rng.integers(len(chunk)))] = int(rng.integers(1, VOCAB))
        out.extend(chunk)
    return out[:n]


class Reference:
    """A request's fresh RACER state (the defaults of `ServingOptions`), driven by hand."""

    def __init__(self, context: list[int]) -> None:
        self.automaton = Automaton(ngram=10, max_nodes=10_000, min_depth=2)
        self.automaton.new_sequence()
        self.automaton.extend(np.asarray(context[:-1], dtype=np.int32))
        self.root = context[-1]
        self.table = LogitsTable(VOCAB, 8)

    def append(self, tokens: list[int]) -> None:
        self.automaton.extend(np.asarray([self.root, *tokens[:-1]], dtype=np.int32))
        self.root = tokens[-1]

    def layout(self, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """SGLang's layout of this request's tree with exactly `n` nodes, built here from the
        tree's parents: (tokens [n], mask [n, n], real nodes)."""
        tree = build_draft_tree(self.automaton, self.table, self.root, n, exempt_depth=1)
        m = len(tree)
        assert m <= n
        parents = [*tree.parents.tolist(), *([0] * (n - m))]
        tokens = np.array([*tree.tokens.tolist(), *([0] * (n - m))], dtype=np.int64)
        mask = np.zeros((n, n), dtype=bool)
        for i in range(n):
            j = i
            while j >= 0:
                mask[i, j] = True
                j = parents[j] if j else -1
        return tokens, mask, m


def tails_of(sequences: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """What `NGRAMWorker._prepare_draft_tokens` hands `batch_get` (sync mode): the last
    `max_trie_depth` tokens of prompt + outputs, and the full lengths."""
    return [s[-TRIE_DEPTH:] for s in sequences], [len(s) for s in sequences]


def get(corpus: RacerCorpus, rids: list[str], sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    tails, totals = tails_of(sequences)
    corpus.synchronize()
    return corpus.batch_get(rids, tails, totals)


@pytest.mark.parametrize("n", [1, 4, 12, 24])
def test_batch_get_gives_sglangs_padded_layout_of_fresh_racer_trees(n):
    corpus = RacerCorpus(n, VOCAB, ServingOptions())
    rids = ["req-0", "req-1", "req-2", "req-3", "short"]
    prompts = [code_like(seed, 40 + 30 * seed) for seed in range(4)] + [[7]]
    for rid, prompt in zip(rids, prompts, strict=True):
        corpus.sync(rid, array("q", prompt), array("q"))
    tokens, mask = get(corpus, rids, prompts)
    bs = len(rids)
    assert tokens.dtype == np.int64 and tokens.shape == (bs * n,) and tokens.flags.c_contiguous
    assert mask.shape == (bs * n * n,) and mask.dtype in (np.bool_, np.uint8, np.int64)
    check_sglang_tree_rows(mask, bs, n)
    seq_lens = [len(p) - 1 for p in prompts]  # the root is not in the KV cache yet
    links = sglang_links(mask, bs, n, seq_lens)
    bigger_than_n = 0
    for b, prompt in enumerate(prompts):
        ref = Reference(prompt)
        want_tokens, want_mask, m = ref.layout(n)
        assert tokens[b * n] == prompt[-1]
        assert tokens[b * n : (b + 1) * n].tolist() == want_tokens.tolist()
        assert (mask.reshape(bs, n, n)[b] == want_mask).all()
        depths = build_draft_tree(ref.automaton, ref.table, ref.root, n, exempt_depth=1).depths
        got_depths = links.positions[b * n : (b + 1) * n] - seq_lens[b]
        assert got_depths[:m].tolist() == depths.tolist()
        assert (got_depths[m:] == 1).all()  # padding: children of the root
        assert (links.parents[b, m:] == 0).all()
        assert links.retrieve_index[b].tolist() == list(range(b * n, (b + 1) * n))
        bigger_than_n += len(build_draft_tree(ref.automaton, ref.table, ref.root, 64, exempt_depth=1)) > n
    if n <= 12:
        assert bigger_than_n, "some request's tree must be bigger than N (cut to N nodes)"


def test_padding_follows_sglangs_convention():
    corpus = RacerCorpus(6, VOCAB, ServingOptions())
    corpus.sync("solo", array("q", [5]), array("q"))  # nothing to retrieve, empty table: root only
    tokens, mask = get(corpus, ["solo"], [[5]])
    assert tokens.tolist() == [5, 0, 0, 0, 0, 0]
    rows = mask.reshape(6, 6).astype(int)
    assert rows[0].tolist() == [1, 0, 0, 0, 0, 0]
    for i in range(1, 6):
        assert rows[i].tolist() == [1 if j in (0, i) else 0 for j in range(6)]


def test_requests_continue_finish_and_reused_ids_start_fresh():
    n = 8
    corpus = RacerCorpus(n, VOCAB, ServingOptions())
    seqs = {rid: code_like(seed, 50) for seed, rid in enumerate(["a", "b", "c"])}
    prompt_lens = {rid: len(s) for rid, s in seqs.items()}
    refs = {rid: Reference(s) for rid, s in seqs.items()}
    rng = np.random.default_rng(1)

    def step(rids: list[str]) -> None:
        for rid in rids:  # the worker's hook: full token ids, as array('q') like SGLang's
            s = seqs[rid]
            corpus.sync(rid, array("q", s[: prompt_lens[rid]]), array("q", s[prompt_lens[rid] :]))
        tokens, _ = get(corpus, rids, [seqs[r] for r in rids])
        for b, rid in enumerate(rids):
            assert tokens[b * n : (b + 1) * n].tolist() == refs[rid].layout(n)[0].tolist(), rid

    for _ in range(5):
        step(["a", "b", "c"])
        for rid in ["a", "b", "c"]:  # each step commits 1..n tokens
            new = rng.integers(1, VOCAB, int(rng.integers(1, n + 1))).tolist()
            seqs[rid] += new
            refs[rid].append(new)
    # "b" finishes: NGRAMWorker erases the ids that left the decode batch.
    corpus.erase_match_state(["b", "never-seen"])
    assert "b" not in corpus and "b" not in corpus.pool and len(corpus) == 2
    # "b" reused by a new request: a fresh state (nothing of the old "b" leaks).
    seqs["b"], prompt_lens["b"] = code_like(9, 30), 30
    refs["b"] = Reference(seqs["b"])
    # "c" reused before its old request was erased (a new prompt under a known id): fresh too.
    seqs["c"], prompt_lens["c"] = code_like(8, 35), 35
    refs["c"] = Reference(seqs["c"])
    restarted = corpus.stats["restarted"]
    step(["a", "b", "c"])
    assert corpus.stats["restarted"] == restarted + 1
    # A reused id whose new prompt starts with the old sequence's tokens is still told apart
    # by its prompt length.
    old = seqs["a"]
    seqs["a"], prompt_lens["a"] = [*old, 3], len(old) + 1
    refs["a"] = Reference(seqs["a"])
    step(["a"])
    corpus.reset()
    assert len(corpus) == 0 and len(corpus.pool) == 0


def test_batch_get_alone_follows_its_tails():
    """Without the worker's `sync` (SGLang's own call sequence only), a request starts from
    its first tail and extends from later tails; a tail that skips tokens restarts it."""
    n = 8
    corpus = RacerCorpus(n, VOCAB, ServingOptions())
    seq = code_like(3, 120)
    ref = Reference(seq[-TRIE_DEPTH:])
    tokens, _ = get(corpus, ["t"], [seq])
    assert tokens.tolist() == ref.layout(n)[0].tolist()
    for add in [1, 5, n, TRIE_DEPTH - 1]:
        new = code_like(4 + add, add)
        seq += new
        ref.append(new)
        tokens, _ = get(corpus, ["t"], [seq])
        assert tokens.tolist() == ref.layout(n)[0].tolist()
    seq += code_like(11, TRIE_DEPTH + 3)  # more new tokens than a tail holds
    tokens, _ = get(corpus, ["t"], [seq])
    assert tokens.tolist() == Reference(seq[-TRIE_DEPTH:]).layout(n)[0].tolist()


def test_verify_outcome_writes_copy_logit_rows_rejected_first_then_path():
    n = 8
    corpus = RacerCorpus(n, VOCAB, ServingOptions())
    seq = code_like(5, 60)
    corpus.sync("r", array("q", seq), array("q"))
    ref = Reference(seq)
    tokens, mask = get(corpus, ["r"], [seq])
    want_tokens, _, m = ref.layout(n)
    links = sglang_links(mask, 1, n, [len(seq) - 1])
    rng = np.random.default_rng(0)
    topk = rng.integers(0, VOCAB, (n, 8))
    # The target accepts the first child, then predicts a token no child has.
    predict = np.full((1, n), VOCAB - 1, dtype=np.int64)
    first_child = int(links.next_token[0, 0])
    predict[0, 0] = tokens[first_child]
    accept, bonus = verify_tree_greedy(tokens.reshape(1, n), links, predict, 0, n)
    committed = [int(tokens[i]) for i in accept[1:]] + [bonus]
    assert corpus.accepted_path(0, committed[:-1]) == accept
    assert corpus.observe_verify(["r"], [committed], topk)
    order = [i for i in range(m) if i not in accept] + accept
    ref.table.update(np.asarray(want_tokens[order], dtype=np.int32), topk[order])
    seq += committed
    ref.append(committed)
    corpus.sync("r", array("q", seq[:60]), array("q", seq[60:]))
    tokens, _ = get(corpus, ["r"], [seq])
    assert tokens.tolist() == ref.layout(n)[0].tolist()
    # A batch that is not the last layout's writes nothing.
    assert not corpus.observe_verify(["other"], [committed], topk)
    assert corpus.stats["logit_skips"] == 1


def test_a_batch_s_rows_are_written_as_one_call_per_request_would():
    """Every request's copy-logit rows in one pool call, each from its own verify rows, as one
    update per request writes them (a write that mixes up the rows is caught: the counterpart)."""
    n = 8
    seqs = {"a": code_like(5, 60), "b": code_like(9, 50)}

    def corpus_at_verify() -> tuple[RacerCorpus, np.ndarray]:
        made = RacerCorpus(n, VOCAB, ServingOptions())
        for rid, seq in seqs.items():
            made.sync(rid, array("q", seq), array("q"))
        tokens, _ = get(made, list(seqs), list(seqs.values()))
        return made, tokens.reshape(len(seqs), n)

    batched, tokens = corpus_at_verify()
    topk = np.random.default_rng(1).integers(0, VOCAB, (2 * n, 8))
    # "a" accepts its first node after the root (when it has one), "b" none: bonus tokens only.
    committed = [[int(tokens[0, 1]), 3] if batched._last.sizes[0] > 1 else [3], [4]]
    sizes = batched._last.sizes.copy()
    paths = [batched.accepted_path(b, c[:-1]) for b, c in enumerate(committed)]
    assert batched.observe_verify(list(seqs), committed, topk)
    references = []
    for shift in (0, 1):
        reference, _ = corpus_at_verify()
        for b, rid in enumerate(seqs):
            order = copy_logit_order(int(sizes[b]), paths[b])
            reference.pool.update_topk(rid, tokens[b, order], topk[(b * n + order + shift) % (2 * n)])
        references.append(reference)

    def drafts(corpus: RacerCorpus) -> list[list[int]]:
        return [corpus.pool.propose([rid], [t], 8).tree(0).tokens.tolist() for rid in seqs for t in range(VOCAB)]

    assert drafts(batched) == drafts(references[0])
    assert drafts(batched) != drafts(references[1])


def test_an_accepted_padding_node_writes_token_zeros_row():
    n = 4
    corpus = RacerCorpus(n, VOCAB, ServingOptions())
    corpus.sync("p", array("q", [9]), array("q"))
    tokens, _ = get(corpus, ["p"], [[9]])
    assert tokens.tolist() == [9, 0, 0, 0]
    topk = np.arange(n * 8).reshape(n, 8) % VOCAB
    # The target predicted 0 after the root: SGLang accepts the first padding node.
    assert corpus.accepted_path(0, [0]) == [0, 1]
    assert corpus.observe_verify(["p"], [[0, 17]], topk)
    ref = Reference([9])
    ref.table.update(np.array([9, 0], dtype=np.int32), topk[[0, 1]])
    ref.append([0, 17])
    corpus.sync("p", array("q", [9]), array("q", [0, 17]))
    tokens, _ = get(corpus, ["p"], [[9, 0, 17]])
    assert tokens.tolist() == ref.layout(n)[0].tolist()


def test_tokens_outside_the_vocabulary_draft_nothing():
    n = 4
    corpus = RacerCorpus(n, VOCAB, ServingOptions())
    corpus.sync("mm", array("q", [1, 2, VOCAB + 5, 1, 2]), array("q"))
    tokens, mask = get(corpus, ["mm"], [[1, 2, VOCAB + 5, 1, 2]])
    assert tokens.tolist() == [2, 0, 0, 0]
    check_sglang_tree_rows(mask, 1, n)
    assert "mm" not in corpus.pool
    assert corpus.observe_verify(["mm"], [[3]], np.zeros((n, 8), dtype=np.int64))


def test_bad_calls_raise_one_line_errors():
    corpus = RacerCorpus(4, VOCAB, ServingOptions())
    with pytest.raises(InvalidArgumentError, match=r"batch_tokens\[0\] \('x'\): empty token tail"):
        corpus.batch_get(["x"], [[]], [0])
    with pytest.raises(InvalidArgumentError, match="one entry per request"):
        corpus.batch_get(["x", "y"], [[1]], [1])
    with pytest.raises(InvalidArgumentError, match="shorter than its tail"):
        corpus.batch_get(["x"], [[1, 2]], [1])
    with pytest.raises(InvalidArgumentError, match="draft_token_num"):
        RacerCorpus(0, VOCAB)
    for call in (
        lambda: corpus.load_external_corpus_named("c", [[1, 2]]),
        lambda: corpus.commit_external_corpus_load("c", 2),
        lambda: corpus.remove_external_corpus("c"),
        corpus.list_external_corpora,
    ):
        with pytest.raises(UnsupportedError, match="no external corpus"):
            call()
    corpus.batch_put([[1, 2, 3]])  # accepted, nothing to do


def server_args(**overrides):
    values = {
        "device": "cuda",
        "disable_overlap_schedule": True,
        "max_running_requests": None,
        "enable_mixed_chunk": True,
        "speculative_num_draft_tokens": None,
        "speculative_num_steps": None,
        "speculative_eagle_topk": None,
        "speculative_ngram_max_bfs_breadth": 10,
        "speculative_ngram_external_corpus_path": None,
        "enable_dp_attention": False,
        "speculative_adaptive": False,
        "page_size": 1,
        "attention_backend": None,
    }
    values.update(overrides)
    return SimpleNamespace(**values)


def test_server_args_get_ngrams_defaults(monkeypatch):
    monkeypatch.delenv("RACER_RS_OPTIONS", raising=False)
    args = server_args()
    resolve_server_args(args)
    assert args.speculative_num_draft_tokens == 12
    assert args.max_running_requests == 48
    assert args.enable_mixed_chunk is False
    assert args.speculative_eagle_topk == 10
    assert args.speculative_num_steps == 1
    kept = server_args(speculative_num_draft_tokens=1, max_running_requests=8, speculative_num_steps=3)
    resolve_server_args(kept)
    assert (kept.speculative_num_draft_tokens, kept.max_running_requests, kept.speculative_num_steps) == (1, 8, 3)


def test_server_args_problems_are_one_clear_error(monkeypatch):
    monkeypatch.delenv("RACER_RS_OPTIONS", raising=False)
    with pytest.raises(InvalidArgumentError) as info:
        resolve_server_args(server_args(disable_overlap_schedule=False))
    message = str(info.value)
    assert message.startswith("--speculative-algorithm RACER_RS: overlap scheduling must be off")
    assert "--disable-overlap-schedule" in message and "\n" not in message
    monkeypatch.setenv("RACER_RS_OPTIONS", '{"breadht": 4}')
    with pytest.raises(InvalidArgumentError) as info:
        resolve_server_args(
            server_args(
                disable_overlap_schedule=False,
                speculative_num_draft_tokens=0,
                speculative_ngram_external_corpus_path="corpus.jsonl",
                enable_dp_attention=True,
                page_size=16,
                attention_backend="fa3",
            )
        )
    message = str(info.value)
    assert "\n" not in message
    for part in (
        "--disable-overlap-schedule",
        "--speculative-num-draft-tokens must be in 1..1024, got 0",
        "external corpus",
        "--enable-dp-attention",
        "--attention-backend flashinfer",
        "RACER_RS_OPTIONS: unknown option(s) breadht",
    ):
        assert part in message, part
    with pytest.raises(InvalidArgumentError, match="--device"):
        resolve_server_args(server_args(device="npu"))


def test_serving_options_from_the_environment():
    assert ServingOptions.from_env({}) == ServingOptions()
    got = ServingOptions.from_env({"RACER_RS_OPTIONS": '{"breadth": 4, "ngram": 12, "threads": 2, "tree": "scored"}'})
    assert (got.racer.breadth, got.racer.ngram, got.threads, got.tree) == (4, 12, 2, "scored")
    for text, match in [
        ("[1]", "must be a JSON object"),
        ("{", "must be a JSON object"),
        ('{"persistent": true}', "unknown option"),
        ('{"breadth": 0}', "breadth must be >= 1"),
        ('{"use_retrieval": false, "use_logits": false}', "cannot both be False"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match) as info:
            ServingOptions.from_env({"RACER_RS_OPTIONS": text})
        assert str(info.value).startswith("RACER_RS_OPTIONS")


def test_missing_sglang_is_one_line_naming_the_extra(monkeypatch):
    real = optional_deps.installed
    monkeypatch.setattr(optional_deps, "installed", lambda module: module != "sglang" and real(module))
    for use in (plugin.register, plugin.worker_class, plugin.algorithm_class):
        with pytest.raises(MissingDependencyError) as info:
            use()
        assert "'sglang' extra" in str(info.value) and "\n" not in str(info.value)


def test_importing_racer_rs_imports_no_engine():
    code = (
        "import sys, racer_rs, racer_rs.integrations.sglang, racer_rs.integrations.vllm\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'vllm', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_entry_point_registers_the_algorithm():
    text = (REPO / "pyproject.toml").read_text()
    section = re.search(r'^\[project\.entry-points\."sglang\.srt\.plugins"\]\n(.*?)(?:^\[|\Z)', text, flags=re.M | re.S)
    assert section is not None
    assert re.search(r'^racer_rs = "racer_rs\.integrations\.sglang:register"$', section.group(1), flags=re.M)
    assert re.search(r"^sglang = \[", text, flags=re.M) and re.search(r"^vllm = \[", text, flags=re.M)
    assert optional_deps.EXTRAS["sglang"] == ("sglang",) and optional_deps.EXTRAS["vllm"] == ("vllm",)
    assert callable(plugin.register)


# ---------------------------------------------------------------------------------------------
# SGLang itself (where it imports on this machine).


def test_sglangs_registry_resolves_racer_rs():
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    except Exception as exc:  # any import failure means: not on this machine
        pytest.skip(f"SGLang's speculative registry does not import here: {type(exc).__name__}: {exc}")
    plugin.register()
    plugin.register()  # idempotent, as load_plugins may run it again
    algo = SpeculativeAlgorithm.from_string("racer_rs")
    assert algo is SpeculativeAlgorithm.from_string("RACER_RS")
    assert isinstance(algo, plugin.algorithm_class())
    assert algo.name == "RACER_RS"
    assert algo.is_ngram() and not algo.has_draft_kv() and not algo.need_topk()
    assert not algo.carries_draft_hidden_states() and algo.get_platform_worker_cls() is None
    assert not algo.supports_overlap and not algo.supports_mixed_chunk()
    import torch

    future_map = algo.create_future_map(
        torch.device("cpu"), SimpleNamespace(req_to_token=torch.zeros(4, 8, dtype=torch.int32))
    )
    assert type(future_map).__name__ == "FutureMap"
    with pytest.raises(ValueError, match="does not support overlap scheduling"):
        algo.create_worker(SimpleNamespace(disable_overlap_schedule=False))


SGLANG_ENGINE_CHECK = textwrap.dedent(
    r"""
    import json, os, sys, types
    from array import array
    sys.path.insert(0, sys.argv[1])
    import sgl_kernel_stub  # noqa: F401
    try:
        from sglang.srt.plugins import load_plugins
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.speculative.ngram_worker import NGRAMWorker, _derive_tree_links
        from sglang.srt.server_args import prepare_server_args
    except Exception as exc:
        print("SKIP", json.dumps(f"{type(exc).__name__}: {exc}"))
        sys.exit(0)
    report = {}
    load_plugins()  # runs our entry point if this environment has racer_rs installed
    try:
        SpeculativeAlgorithm.from_string("RACER_RS")
        report["entry_point"] = True
    except ValueError:
        report["entry_point"] = False
    from racer_rs.integrations import sglang as plugin
    plugin.register()
    algo = SpeculativeAlgorithm.from_string("RACER_RS")
    worker_cls = algo.create_worker(types.SimpleNamespace(disable_overlap_schedule=True))
    report["subclass"] = issubclass(worker_cls, NGRAMWorker) and worker_cls.__name__

    # SGLang's own _prepare_draft_tokens / _update_ngram_corpus on our worker and corpus.
    n = int(sys.argv[2])
    worker = object.__new__(worker_cls)
    worker.enable_overlap, worker.max_trie_depth, worker.draft_token_num = False, 18, n
    worker.ngram_corpus = plugin.RacerCorpus(n, 64)
    class Req:
        def __init__(self, rid, prompt, output):
            self.rid = rid
            self.origin_input_ids_unpadded = array("q", prompt)
            self.output_ids = array("q", output)
    class Batch:
        spec_info = None
        def __init__(self, reqs):
            self.reqs = reqs
        def grammar_needs_sync(self):
            return False
    prompts = json.loads(sys.argv[3])
    batch = Batch([Req(f"r{i}", p[:-3], p[-3:]) for i, p in enumerate(prompts)])
    tokens, mask = worker._prepare_draft_tokens(batch)
    worker._update_ngram_corpus(batch)
    nxt, sib = _derive_tree_links(mask, len(prompts), n)
    report["tokens"], report["mask"] = tokens.tolist(), mask.astype(int).tolist()
    report["next_token"], report["next_sibling"] = nxt.tolist(), sib.tolist()
    report["tokens_dtype"] = str(tokens.dtype)
    report["prompt_indexed"] = len(worker.ngram_corpus) == len(prompts)

    # Server-argument resolution with the algorithm (a tiny local config, nothing downloaded).
    folder = sys.argv[4]
    base = ["--model-path", folder, "--skip-tokenizer-init", "--speculative-algorithm", "RACER_RS",
            "--device", "cpu"]
    try:
        prepare_server_args(base).resolve_once()
        report["overlap_error"] = None
    except ValueError as exc:
        report["overlap_error"] = str(exc)
    args = prepare_server_args([*base, "--disable-overlap-schedule"])
    args.resolve_once()
    from sglang.srt.arg_groups.overrides import resolving_view
    cfg = resolving_view(args)
    report["resolved"] = [cfg.speculative_algorithm, cfg.speculative_num_draft_tokens, cfg.speculative_eagle_topk,
                          cfg.speculative_num_steps, cfg.enable_mixed_chunk, cfg.max_running_requests]
    print("REPORT", json.dumps(report))
    """
)


def test_sglangs_own_code_drives_the_worker_and_resolves_the_arguments(tmp_path):
    """In a subprocess (it stubs `sgl_kernel`, the CUDA kernel package): SGLang's plugin loader,
    registry, `NGRAMWorker._prepare_draft_tokens`, `_derive_tree_links` and server-argument
    resolution, with our algorithm."""
    n = 6
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 256,
        "max_position_embeddings": 512,
        "torch_dtype": "float32",
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    prompts = [code_like(seed, 45) for seed in range(3)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # racer_rs as this interpreter has it installed
    env.pop("RACER_RS_OPTIONS", None)
    out = subprocess.run(
        [sys.executable, "-c", SGLANG_ENGINE_CHECK, str(HERE), str(n), json.dumps(prompts), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.stdout.splitlines() if " " in line}
    if "SKIP" in lines:
        pytest.skip(f"SGLang's worker does not import here (with sgl_kernel stubbed): {json.loads(lines['SKIP'])}")
    assert out.returncode == 0 and "REPORT" in lines, out.stderr[-4000:]
    report = json.loads(lines["REPORT"])
    assert report["subclass"] == "RacerRsWorker"
    assert report["prompt_indexed"]
    assert report["tokens_dtype"] == "int64"
    bs = len(prompts)
    tokens, mask = np.array(report["tokens"]), np.array(report["mask"])
    check_sglang_tree_rows(mask, bs, n)
    links = sglang_links(mask, bs, n, [len(p) - 1 for p in prompts])
    assert report["next_token"] == links.next_token.tolist()  # SGLang's host twin agrees
    assert report["next_sibling"] == links.next_sibling.tolist()
    for b, prompt in enumerate(prompts):  # the worker indexed the full prompt, not the tail
        assert tokens[b * n : (b + 1) * n].tolist() == Reference(prompt).layout(n)[0].tolist()
    assert "overlap scheduling must be off" in report["overlap_error"]
    assert "--disable-overlap-schedule" in report["overlap_error"]
    assert report["resolved"] == ["RACER_RS", 12, 10, 1, False, 48]
    # SGLang's plugin loader registered the algorithm through our entry point, wherever
    # racer_rs is installed with its metadata (not when it is only on the path).
    installed = {ep.name for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")}
    assert report["entry_point"] == ("racer_rs" in installed)
