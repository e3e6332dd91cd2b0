"""`racer_rs.integrations.vllm.RacerProposer`: vLLM 0.33.0's `custom_class` contract, with the
runner's own types (`list[list[int]]` sampled ids with `[]` for discarded rows, `int32
[max_num_reqs]` lengths, `int32 [max_num_reqs, max_model_len]` token ids), checked against
fresh RACER trees' best chains and a restatement of vLLM's draft-length rule
(`engine_reference`). The last test builds the proposer through vLLM's own factory where vLLM
imports (skipped with the import error as the reason where it does not).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from racer_rs import Automaton, LogitsTable, build_draft_tree, optional_deps
from racer_rs.errors import InvalidArgumentError, MissingDependencyError
from racer_rs.integrations import vllm as integration
from racer_rs.integrations.options import ServingOptions
from racer_rs.integrations.vllm import RacerProposer
from tests.integrations.engine_reference import vllm_draft_bound

VOCAB = 64
ROWS = 8  # max_num_reqs


def code_like(seed: int, n: int) -> list[int]:
    rng = np.random.default_rng(seed)
    chunks = [rng.integers(1, VOCAB, int(rng.integers(4, 12))).tolist() for _ in range(5)]
    out: list[int] = []
    while len(out) < n:
        out.extend(chunks[int(rng.integers(len(chunks)))])
    return out[:n]


@pytest.fixture
def engine_free(monkeypatch):
    """The proposer's contract needs only numpy: where vLLM is not installed, let it be built
    all the same (its missing-vLLM error has its own test)."""
    real = optional_deps.require

    def require(extra: str, purpose: str) -> None:
        if extra != "vllm":
            real(extra, purpose)

    monkeypatch.setattr(optional_deps, "require", require)


def config(k: int, max_model_len: int | None = 128, vocab: int | None = VOCAB) -> SimpleNamespace:
    spec = SimpleNamespace(num_speculative_tokens=k, model="racer_rs.integrations.vllm.RacerProposer")
    if max_model_len is None:
        return SimpleNamespace(speculative_config=spec)
    model = SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: vocab)
    return SimpleNamespace(speculative_config=spec, model_config=model)


class Batch:
    """vLLM's InputBatch arrays: rows are slots holding one request's tokens each."""

    def __init__(self, max_model_len: int) -> None:
        self.token_ids_cpu = np.zeros((ROWS, max_model_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(ROWS, dtype=np.int32)
        self.rows: list[list[int]] = []

    def set(self, contexts: list[list[int]]) -> None:
        self.rows = [list(c) for c in contexts]
        self.token_ids_cpu[:] = 7  # stale cells past each row's length must never be read
        for i, c in enumerate(self.rows):
            self.token_ids_cpu[i, : len(c)] = c
            self.num_tokens_no_spec[i] = len(c)


class Reference:
    """A request's fresh RACER state (the `ServingOptions` defaults), driven by hand."""

    def __init__(self, context: list[int]) -> None:
        self.automaton = Automaton(ngram=10, max_nodes=10_000, min_depth=2)
        self.automaton.new_sequence()
        self.automaton.extend(np.asarray(context[:-1], dtype=np.int32))
        self.root = context[-1]
        self.table = LogitsTable(VOCAB, 8)

    def append(self, tokens: list[int]) -> None:
        self.automaton.extend(np.asarray([self.root, *tokens[:-1]], dtype=np.int32))
        self.root = tokens[-1]

    def chain(self, capacity: int, k: int) -> list[int]:
        """The deepest root-to-leaf path (smallest index among the deepest), at most k tokens."""
        tree = build_draft_tree(self.automaton, self.table, self.root, capacity, exempt_depth=1)
        depths, parents, tokens = tree.depths.tolist(), tree.parents.tolist(), tree.tokens.tolist()
        leaf = min(range(len(depths)), key=lambda i: (-depths[i], i))
        path = []
        while leaf > 0:
            path.append(tokens[leaf])
            leaf = parents[leaf]
        return path[::-1][:k]


def test_propose_follows_vllms_types_and_length_rule(engine_free):
    k, max_len = 5, 96
    proposer = RacerProposer(config(k, max_len), options=ServingOptions(adaptive=False))
    assert proposer.k == k and proposer.max_model_len == max_len and proposer.capacity == 16
    contexts = [
        code_like(0, 40),
        code_like(1, 61),
        code_like(2, 20),  # a prefill chunk: its sample is discarded
        code_like(3, max_len - 3),  # room for 2 drafts
        code_like(4, max_len - 1),  # none
        code_like(5, max_len - 6),
    ]
    batch = Batch(max_len)
    batch.set(contexts)
    sampled = [[c[-1]] for c in contexts]
    sampled[2] = []
    out = proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu, slot_mappings=None)
    assert isinstance(out, list) and len(out) == len(contexts)
    for i, (row, context) in enumerate(zip(out, contexts, strict=True)):
        assert isinstance(row, list) and all(type(t) is int for t in row)
        bound = vllm_draft_bound(k, max_len, len(context))
        assert len(row) <= bound
        if not sampled[i] or bound == 0:
            assert row == []
        else:
            assert row == Reference(context).chain(proposer.capacity, k)[:bound], i
    assert any(len(row) == k for row in out)
    assert len(out[3]) <= 2 and out[4] == []


def test_requests_are_followed_by_content_across_rows_and_freed(engine_free):
    k, max_len = 4, 200
    proposer = RacerProposer(config(k, max_len), options=ServingOptions(adaptive=False))
    batch = Batch(max_len)
    seqs = {name: code_like(seed, 30 + 10 * seed) for seed, name in enumerate("ABCD")}
    refs = {name: Reference(s) for name, s in seqs.items()}
    order = ["A", "B", "C", "D"]
    batch.set([seqs[r] for r in order])
    out = proposer.propose([[seqs[r][-1]] for r in order], batch.num_tokens_no_spec, batch.token_ids_cpu)
    rng = np.random.default_rng(0)
    for step in range(6):
        # Every request commits 1..k+1 tokens; rows get reordered (vLLM condenses and swaps).
        sampled = {}
        for r in order:
            new = rng.integers(1, VOCAB, int(rng.integers(1, k + 2))).tolist()
            seqs[r] += new
            refs[r].append(new)
            sampled[r] = new
        if step == 2:
            order = order[::-1]
        if step == 4:  # "B" finishes; a new request "E" takes a slot
            order.remove("B")
            seqs["E"] = code_like(9, 33)
            refs["E"] = Reference(seqs["E"])
            sampled["E"] = [seqs["E"][-1]]
            order.insert(1, "E")
        batch.set([seqs[r] for r in order])
        started = proposer.stats["started"]
        out = proposer.propose([sampled[r] for r in order], batch.num_tokens_no_spec, batch.token_ids_cpu)
        for i, r in enumerate(order):
            assert out[i] == refs[r].chain(proposer.capacity, k), (step, r)
        assert proposer.stats["started"] == started + (step == 4)
    assert proposer._pool is not None and len(proposer._pool) == len(order)  # B's state was freed
    assert proposer.stats["started"] == 5 and proposer.stats["continued"] == 6 * 4 - 1


def test_a_finished_requests_row_and_prompt_reused_start_fresh(engine_free):
    k, max_len = 4, 200
    proposer = RacerProposer(config(k, max_len), options=ServingOptions(adaptive=False))
    batch = Batch(max_len)
    prompt = code_like(3, 40)
    batch.set([prompt])
    proposer.propose([[prompt[-1]]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    longer = [*prompt, 5, 6, 7]
    batch.set([longer])
    proposer.propose([[5, 6, 7]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert proposer.stats == {**proposer.stats, "started": 1, "continued": 1}
    # The request ends; a new one with the same prompt lands in the same row.
    batch.set([prompt])
    out = proposer.propose([[prompt[-1]]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert proposer.stats["started"] == 2
    assert out[0] == Reference(prompt).chain(proposer.capacity, k)
    # Tokens that do not match the row's tail: a new request too.
    batch.set([[*prompt, 9]])
    proposer.propose([[8]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert proposer.stats["started"] == 3 and len(proposer._pool) == 1


class FakeTarget:
    """A target model whose `compute_logits` returns its input (tests pass logits as the
    'hidden states'), as vLLM calls it: `model.compute_logits(hidden_states[logits_indices])`."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(vocab_size=VOCAB)
        self.calls = 0

    def compute_logits(self, hidden):
        self.calls += 1
        return hidden


def test_verify_logits_are_attributed_exactly_or_skipped(engine_free):
    torch = pytest.importorskip("torch")
    k, max_len = 4, 200
    proposer = RacerProposer(config(k, max_len), options=ServingOptions(adaptive=False, use_logits=True))
    target = FakeTarget()
    proposer.load_model(target)
    assert hasattr(target.compute_logits, "__wrapped__")
    batch = Batch(max_len)
    seqs = [code_like(s, 50) for s in range(3)] + [code_like(7, 12)]  # row 3: a prefill chunk
    refs = [Reference(s) for s in seqs]
    generator = torch.Generator().manual_seed(0)

    def logits(rows: int):
        return torch.randn(rows, VOCAB, generator=generator)

    batch.set(seqs)
    target.compute_logits(logits(4))  # step 0: one row per request
    drafts = proposer.propose([[s[-1]] for s in seqs[:3]] + [[]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert proposer.stats["logit_steps"] == 0 and drafts[3] == []
    assert all(drafts[:3])
    for cut, expect_written in [(False, True), (True, False), (False, True)]:
        scheduled = [list(d) for d in drafts[:3]]
        if cut:  # the scheduler's token budget cut one request's drafts
            longest = max(range(3), key=lambda b: len(scheduled[b]))
            assert scheduled[longest]
            scheduled[longest] = scheduled[longest][:-1]
        counts = [len(d) + 1 for d in scheduled] + [1]
        rows = logits(sum(counts))
        target.compute_logits(rows)
        target.compute_logits(logits(17))  # e.g. prompt logprobs: another row count
        ids = torch.topk(rows, 8, dim=-1).indices.numpy()
        sampled, first = [], 0
        for b, d in enumerate(scheduled):
            # Accept a prefix of the drafts, then a bonus token (the next draft token: the
            # stream stays repetitive, so drafting goes on).
            accepted = len(d) // 2
            new = [*d[:accepted], d[accepted] if accepted < len(d) else seqs[b][-1]]
            if expect_written:
                nodes = np.array([refs[b].root, *d], dtype=np.int32)
                order = [*range(accepted + 1, len(d) + 1), *range(accepted + 1)]
                refs[b].table.update(nodes[order], ids[first + np.array(order)])
            seqs[b] += new
            refs[b].append(new)
            sampled.append(new)
            first += counts[b]
        batch.set(seqs)
        written = proposer.stats["logit_steps"]
        drafts = proposer.propose([*sampled, []], batch.num_tokens_no_spec, batch.token_ids_cpu)
        assert proposer.stats["logit_steps"] == written + expect_written
        for b in range(3):  # a skipped step wrote no rows, and neither did the references
            assert drafts[b] == refs[b].chain(proposer.capacity, k), b
    assert proposer.stats["logit_skips"] == 1
    # Two calls with the right count: ambiguous, skipped.
    counts = [len(d) + 1 for d in drafts[:3]] + [1]
    target.compute_logits(logits(sum(counts)))
    target.compute_logits(logits(sum(counts)))
    sampled = []
    for b in range(3):
        seqs[b] += [3]
        sampled.append([3])
    batch.set(seqs)
    proposer.propose([*sampled, []], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert proposer.stats["logit_skips"] == 2


def test_a_steps_copy_logit_rows_are_written_as_one_call_per_request_would(engine_free):
    """Every continued request's rows in one pool call: the rejected drafts' rows, then the
    accepted ones', each from its own logits row; the same as one update per request (and a
    write that mixes up the rows is caught: the counterpart)."""
    torch = pytest.importorskip("torch")
    from racer_rs import DraftPool
    from racer_rs.integrations._shared import copy_logit_order

    proposer = RacerProposer(config(4, 200), options=ServingOptions(adaptive=False, use_logits=True))
    proposer.load_model(FakeTarget())
    rng = np.random.default_rng(3)

    def pool() -> DraftPool:
        made = DraftPool(VOCAB, breadth=8, use_retrieval=False)
        for key in (1, 2):
            made.add(key, [5, 6, 7])
        return made

    requests = [integration._Request(key, np.zeros(8, dtype=np.int32), 0, True) for key in (1, 2)]
    # Request 1 drafted 3 tokens and accepted 1 (then its bonus); request 2 drafted 2, accepted 2.
    continued = [
        integration._Continued(requests[0], [11, 40], 0, 9, [11, 9, 13], 0),
        integration._Continued(requests[1], [20, 21, 42], 4, 9, [20, 21], 1),
    ]
    ids = torch.from_numpy(rng.integers(0, VOCAB, (7, 8)))
    batched, reference, mixed = pool(), pool(), pool()
    proposer._write_logits(batched, [(ids, None)], continued, 7)
    for target, shift in ((reference, 0), (mixed, 1)):
        for c in continued:
            nodes = np.array([c.root, *c.chain], dtype=np.int64)
            order = copy_logit_order(len(nodes), range(len(c.sampled)))
            rows = (c.first_row + order + shift) % 7
            target.update_topk(c.request.key, nodes[order], ids.numpy()[rows])

    def drafts(made: DraftPool) -> list[list[int]]:
        return [made.propose([key], [t], 8).tree(0).tokens.tolist() for key in (1, 2) for t in range(VOCAB)]

    assert proposer.stats["logit_steps"] == 1
    assert drafts(batched) == drafts(reference)
    assert drafts(batched) != drafts(mixed)


def test_config_without_model_config_drafts_from_retrieval(engine_free):
    proposer = RacerProposer(config(3, max_model_len=None))  # vLLM's own test passes only this
    assert proposer.max_model_len is None and proposer.vocab_size is None
    batch = Batch(64)
    context = code_like(2, 40)
    batch.set([context])
    out = proposer.propose([[context[-1]]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert proposer.vocab_size == integration.FALLBACK_VOCAB and not proposer._pool.use_logits
    assert out[0] == Reference(context).chain(proposer.capacity, 3)
    with pytest.raises(InvalidArgumentError, match="num_speculative_tokens"):
        RacerProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=0)))


def test_tokens_outside_the_vocabulary_draft_nothing(engine_free):
    proposer = RacerProposer(config(3, 64), options=ServingOptions(adaptive=False))
    batch = Batch(64)
    batch.set([[1, 2, VOCAB + 3, 1, 2], [1, 2, 3, 1, 2]])
    out = proposer.propose([[2], [2]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert out[0] == [] and out[1] == Reference([1, 2, 3, 1, 2]).chain(proposer.capacity, 3) == [3, 1]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_requests_continue_whatever_the_runners_id_dtype(engine_free, dtype):
    # The proposer's buffers hold int32 (vLLM's `token_ids_cpu` too): another dtype compares
    # by value, not by bytes.
    k, max_len = 3, 64
    proposer = RacerProposer(config(k, max_len), options=ServingOptions(adaptive=False))
    seqs = [code_like(1, 20), code_like(2, 25)]
    refs = [Reference(s) for s in seqs]
    ids = np.zeros((ROWS, max_len), dtype=dtype)
    lengths = np.zeros(ROWS, dtype=dtype)
    rng = np.random.default_rng(3)
    sampled = [[s[-1]] for s in seqs]
    for step in range(4):
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
            lengths[i] = len(s)
        out = proposer.propose(sampled, lengths, ids)
        assert out == [ref.chain(proposer.capacity, k) for ref in refs], step
        assert proposer.stats["continued"] == 2 * step and proposer.stats["started"] == 2
        sampled = [rng.integers(1, VOCAB, int(rng.integers(1, k + 2))).tolist() for _ in seqs]
        for s, ref, new in zip(seqs, refs, sampled, strict=True):
            s += new
            ref.append(new)


@pytest.mark.parametrize(("bad", "dtype"), [(VOCAB, np.int32), (-1, np.int32), (2**40, np.int64)])
def test_a_sampled_token_outside_the_vocabulary_stops_only_its_request(engine_free, bad, dtype):
    k, max_len = 3, 64
    proposer = RacerProposer(config(k, max_len), options=ServingOptions(adaptive=False))
    seqs = [code_like(1, 20), code_like(2, 25)]
    ids = np.zeros((ROWS, max_len), dtype=dtype)
    lengths = np.zeros(ROWS, dtype=np.int32)

    def propose(sampled: list[list[int]]) -> list[list[int]]:
        for i, s in enumerate(seqs):
            ids[i, : len(s)], lengths[i] = s, len(s)
        return proposer.propose(sampled, lengths, ids)

    propose([[s[-1]] for s in seqs])
    seqs = [seqs[0] + [5, bad], seqs[1] + [5, 6]]
    out = propose([[5, bad], [5, 6]])
    assert out[0] == [] and out[1] == Reference(seqs[1]).chain(proposer.capacity, k)
    assert proposer.stats["continued"] == 2 and proposer.stats["started"] == 2
    assert proposer._pool is not None and len(proposer._pool) == 1  # its state freed
    seqs = [seqs[0] + [7], seqs[1] + [8]]
    out = propose([[7], [8]])  # it drafts no more; the other request goes on
    assert out[0] == [] and out[1] == Reference(seqs[1]).chain(proposer.capacity, k)
    assert proposer._pool is not None and len(proposer._pool) == 1


def test_missing_vllm_is_one_line_naming_the_extra(monkeypatch):
    real = optional_deps.installed
    monkeypatch.setattr(optional_deps, "installed", lambda module: module != "vllm" and real(module))
    with pytest.raises(MissingDependencyError) as info:
        RacerProposer(config(2))
    assert "'vllm' extra" in str(info.value) and "\n" not in str(info.value)


def test_vllms_factory_builds_the_proposer():
    try:
        from vllm.config.speculative import SpeculativeConfig
        from vllm.v1.spec_decode.custom_class_proposer import create_custom_proposer
    except Exception as exc:  # any import failure means: not on this machine
        pytest.skip(f"vLLM's custom_class factory does not import here: {type(exc).__name__}: {exc}")
    path = "racer_rs.integrations.vllm.RacerProposer"
    assert SpeculativeConfig._is_custom_proposer_path(path)
    # As vLLM's own test (tests/v1/spec_decode/test_custom_class_proposer.py) builds it.
    vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(model=path, num_speculative_tokens=3))
    proposer = create_custom_proposer(vllm_config)
    assert isinstance(proposer, RacerProposer) and proposer.vllm_config is vllm_config and proposer.k == 3
    batch = Batch(64)
    context = code_like(1, 30)
    batch.set([context, [4]])
    out = proposer.propose([[context[-1]], []], batch.num_tokens_no_spec, batch.token_ids_cpu, slot_mappings=None)
    assert out[0] == Reference(context).chain(proposer.capacity, 3) and out[1] == []
    # vLLM's builtin n-gram proposer takes the same arrays and returns the same shape.
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    ngram = NgramProposer(
        SimpleNamespace(
            speculative_config=SimpleNamespace(prompt_lookup_min=2, prompt_lookup_max=3, num_speculative_tokens=3),
            model_config=SimpleNamespace(max_model_len=64),
            scheduler_config=SimpleNamespace(max_num_seqs=ROWS),
            parallel_config=SimpleNamespace(tensor_parallel_size=1),
        )
    )
    theirs = ngram.propose(3, [[context[-1]], []], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert len(theirs) == len(out) and theirs[1] == []


@pytest.mark.parametrize(
    ("env", "logits"),
    [
        ("", False),  # vLLM's default: one chain per request, where the rows did not pay
        ('{"use_logits": true}', True),
        ('{"use_logits": null}', False),
        ('{"use_retrieval": false}', True),  # the only source left
        ('{"use_logits": false}', False),
    ],
)
def test_copy_logit_rows_are_off_by_default_in_vllm_and_on_when_asked(engine_free, monkeypatch, env, logits):
    """vLLM's proposer drafts from the copy-logit tables (and wraps ``compute_logits``) only when
    asked, or when retrieval is off; SGLang's worker keeps them on by default."""
    monkeypatch.setenv("RACER_RS_OPTIONS", env)
    proposer = RacerProposer(config(3, 64))
    target = FakeTarget()
    proposer.load_model(target)
    assert hasattr(target.compute_logits, "__wrapped__") is logits
    batch = Batch(64)
    batch.set([code_like(1, 30)])
    proposer.propose([[batch.token_ids_cpu[0, 29]]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert proposer._pool.use_logits is logits
    # SGLang's worker builds its pool as options.pool(vocab): on unless turned off.
    assert ServingOptions.from_env({"RACER_RS_OPTIONS": env}).pool(VOCAB).use_logits is (env != '{"use_logits": false}')


def test_both_sources_off_is_one_clear_error():
    with pytest.raises(InvalidArgumentError, match="cannot both be False"):
        ServingOptions.from_env({"RACER_RS_OPTIONS": '{"use_logits": false, "use_retrieval": false}'})
