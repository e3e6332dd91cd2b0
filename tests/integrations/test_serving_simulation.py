"""Serving loops simulated on the CPU with a tiny model: the engines' verify semantics step by
step, requests joining, finishing and ids being reused, with our integrations drafting.

- SGLang (0.5.23, sync mode): what `NGRAMWorker.forward_batch_generation` does per decode step,
  with our worker's two hooks (`RacerCorpus.sync` before drafting, `feed_verify_result` after
  the verify) and the verify logits read through our wrapper of the target worker's
  `forward_batch_generation`; the padded N-node trees verified by `TreeVerifier` at the
  positions and with the links SGLang rebuilds from the mask, accepted by SGLang's greedy walk
  (first child / next sibling), `erase_match_state` for the ids that left the batch.
- vLLM (0.33.0, V1 runner, sync): the runner's slots (`token_ids_cpu`, `num_tokens_no_spec`),
  chunked prefills giving `[]`, rows condensed and swapped, drafts cut by the scheduler, the
  target's `compute_logits` called on every step's rows, greedy chain verification, and
  `propose` after bookkeeping.

Every request's output must equal its plain greedy decoding. Then: the drafts are byte-identical
across processes with different hash seeds and thread counts.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from array import array
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from racer_rs import optional_deps  # noqa: E402
from racer_rs.integrations.options import ServingOptions  # noqa: E402
from racer_rs.integrations.sglang import RacerCorpus, _wrap_target_worker, feed_verify_result  # noqa: E402
from racer_rs.integrations.vllm import RacerProposer  # noqa: E402
from racer_rs.target.verifier import TreeVerifier  # noqa: E402
from tests.helpers import REPEATING_PROMPT, VOCAB, plain_greedy, random_prompt, tiny_model  # noqa: E402
from tests.integrations.engine_reference import sglang_links, verify_tree_greedy, vllm_draft_bound  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TRIE_DEPTH = 18


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0)


def workload() -> list[tuple[str, list[int], int]]:
    """(request id, prompt, max new tokens): six requests, four in flight at a time; the fifth
    reuses the id of the first to finish."""
    loop = [5, 9, 5, 9, 5, 9, 5, 9, 21]
    return [
        ("r0", REPEATING_PROMPT, 12),
        ("r1", random_prompt(1, 20), 40),
        ("r2", [*REPEATING_PROMPT, *random_prompt(2, 8)], 33),
        ("r3", loop * 3, 27),
        ("r0", random_prompt(5, 30), 30),  # r0's id again, after it ended
        ("r5", random_prompt(6, 11) * 2, 25),
    ]


# ---------------------------------------------------------------------------------------------
# SGLang


class SimTargetWorker:
    """Stands in for SGLang's `TpModelWorker`: its `forward_batch_generation(batch, ...,
    is_verify=True)` runs every request's N draft nodes through its `TreeVerifier` and returns
    `logits_output.next_token_logits` as `[bs * N, vocab]` float32, row `b * N + t` after node t."""

    def forward_batch_generation(self, batch, forward_batch=None, pp_proxy_tensors=None, is_verify=False, **kwargs):
        assert is_verify
        rows = []
        for b, req in enumerate(batch.reqs):
            n = batch.n
            tokens = batch.draft_tokens[b * n : (b + 1) * n]
            depths = batch.positions[b * n : (b + 1) * n] - req.verifier.length
            ancestors = batch.mask.reshape(len(batch.reqs), n, n)[b].astype(bool)
            rows.append(req.verifier.forward_tree(tokens.astype(np.int32), depths.astype(np.int32), ancestors))
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=torch.cat(rows).float()))


class SimWorker:
    """The two attributes of our SGLang worker the target-worker wrapper uses."""

    def __init__(self) -> None:
        self._target_worker = SimTargetWorker()
        self._racer_verify_topk = None


class SimReq:
    """The fields of SGLang's `Req` the worker reads."""

    def __init__(self, rid: str, prompt: list[int], max_new: int, model) -> None:
        self.rid = rid
        self.origin_input_ids_unpadded = array("q", prompt)
        self.output_ids = array("q")
        self.max_new = max_new
        self.verifier = TreeVerifier(model)

    def finished(self) -> bool:
        return len(self.output_ids) >= self.max_new


def test_sglang_serving_loop_is_lossless(model):
    n, in_flight = 8, 4
    corpus = RacerCorpus(n, VOCAB, ServingOptions())
    worker = SimWorker()
    _wrap_target_worker(worker, corpus.pool.breadth, False)
    waiting = [SimReq(rid, prompt, max_new, model) for rid, prompt, max_new in workload()]
    running: list[SimReq] = []
    done: list[SimReq] = []
    prev_rids: set[str] = set()
    verifies = committed_total = decode_steps = 0
    while waiting or running:
        # Extend (prefill) batch: new requests get their first token from the prompt's logits.
        while waiting and len(running) < in_flight and waiting[0].rid not in {r.rid for r in running}:
            req = waiting.pop(0)
            first = int(
                req.verifier.prefill(np.asarray(req.origin_input_ids_unpadded, dtype=np.int32)).last_logits.argmax()
            )
            req.output_ids.append(first)
            running.append(req)
        # Decode: NGRAMWorker._prepare_draft_tokens with our worker's sync first.
        batch = SimpleNamespace(reqs=[r for r in running if not r.finished()], n=n)
        for req in batch.reqs:
            corpus.sync(req.rid, req.origin_input_ids_unpadded, req.output_ids)
        if batch.reqs:
            corpus.synchronize()
            tails = [
                list((req.origin_input_ids_unpadded[-TRIE_DEPTH:] + req.output_ids[-TRIE_DEPTH:])[-TRIE_DEPTH:])
                for req in batch.reqs
            ]
            totals = [len(req.origin_input_ids_unpadded) + len(req.output_ids) for req in batch.reqs]
            rids = [req.rid for req in batch.reqs]
            tokens, mask = corpus.batch_get(rids, tails, totals)
            bs = len(rids)
            assert tokens.shape == (bs * n,) and tokens.dtype == np.int64
            seq_lens = [req.verifier.length for req in batch.reqs]
            assert seq_lens == [t - 1 for t in totals]  # the root is not in the KV cache
            links = sglang_links(mask, bs, n, seq_lens)
            batch.draft_tokens, batch.mask, batch.positions = tokens, mask, links.positions
            # The verify forward (through the wrapped target worker), then eagle_sample's greedy walk.
            result = worker._target_worker.forward_batch_generation(batch, pp_proxy_tensors=None, is_verify=True)
            target_predict = result.logits_output.next_token_logits.argmax(-1).numpy().reshape(bs, n)
            candidates = tokens.reshape(bs, n)
            next_token_ids = np.full(bs * n, -7, dtype=np.int32)  # padding past accept_lens
            accept_lens = np.zeros(bs, dtype=np.int32)
            commits = []
            for b, req in enumerate(batch.reqs):
                accept, bonus = verify_tree_greedy(candidates, links, target_predict, b, n)
                path = [i - b * n for i in accept]
                step = [int(candidates[b, t]) for t in path[1:]] + [bonus]
                next_token_ids[b * n : b * n + len(step)] = step
                accept_lens[b] = len(step)
                commits.append((req, path, step))
            sglang_result = SimpleNamespace(
                accept_lens=torch.from_numpy(accept_lens), next_token_ids=torch.from_numpy(next_token_ids)
            )
            captured, worker._racer_verify_topk = worker._racer_verify_topk, None
            assert captured is not None and captured[0].shape == (bs * n, corpus.pool.breadth)
            assert feed_verify_result(corpus, rids, sglang_result, captured)
            decode_steps += 1
            for req, path, step in commits:
                req.verifier.commit(np.asarray(path))
                req.output_ids.extend(step[: req.max_new - len(req.output_ids)])
                verifies += 1
                committed_total += len(step)
            corpus.batch_put(tails)
            cur = set(rids)
            departed = prev_rids - cur
            if departed:
                corpus.erase_match_state(sorted(departed))
            prev_rids = cur
        for req in [r for r in running if r.finished()]:
            running.remove(req)
            done.append(req)
    assert len(done) == 6
    for req in done:
        want = plain_greedy(model, list(req.origin_input_ids_unpadded), req.max_new)
        assert list(req.output_ids) == want, req.rid
    assert committed_total / verifies > 1.3, "drafts should be accepted on these repetitive outputs"
    assert corpus.stats["logit_steps"] == decode_steps and corpus.stats["logit_skips"] == 0
    assert corpus.stats["erased"] >= 4 and len(corpus) <= in_flight


# ---------------------------------------------------------------------------------------------
# vLLM


class SimTarget:
    """The target model vLLM hands `load_model`: its `compute_logits` maps the sampled rows'
    hidden states to logits; here the 'hidden states' are already the verifier's logits."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(vocab_size=VOCAB)

    def compute_logits(self, hidden_states):
        return hidden_states


class VllmReq:
    def __init__(self, prompt: list[int], max_new: int, model) -> None:
        self.prompt = prompt
        self.max_new = max_new
        self.verifier = TreeVerifier(model)
        self.output: list[int] = []
        self.prefilled = 0  # prompt tokens "computed" so far (chunked prefill)
        self.drafts: list[int] = []


@pytest.fixture
def engine_free(monkeypatch):
    real = optional_deps.require
    monkeypatch.setattr(
        optional_deps, "require", lambda extra, purpose: None if extra == "vllm" else real(extra, purpose)
    )


def test_vllm_serving_loop_is_lossless(model, engine_free):
    k, max_model_len, max_num_reqs, chunk, in_flight = 4, 64, 6, 16, 4
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: VOCAB),
    )
    proposer = RacerProposer(vllm_config, options=ServingOptions(adaptive=False, use_logits=True))
    target = SimTarget()
    proposer.load_model(target)
    token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
    num_tokens_no_spec = np.zeros(max_num_reqs, dtype=np.int32)
    # The last request cannot finish its 40 tokens within max_model_len (stops at 64 tokens).
    waiting = [VllmReq(prompt, max_new, model) for _, prompt, max_new in workload()]
    waiting.append(VllmReq(random_prompt(9, 30), 40, model))
    rows: list[VllmReq] = []
    done: list[VllmReq] = []
    step_index = 0
    accepted_total = drafted_total = 0

    def put_row(i: int, req: VllmReq) -> None:
        context = [*req.prompt, *req.output]
        token_ids_cpu[i] = 3  # stale cells past the context
        token_ids_cpu[i, : len(context)] = context
        num_tokens_no_spec[i] = len(context)

    while waiting or rows:
        step_index += 1
        # _update_states: finished requests leave, the last rows fill their slots (condense).
        for req in [r for r in rows if len(r.output) >= r.max_new or len(r.prompt) + len(r.output) >= max_model_len]:
            rows.remove(req)
            done.append(req)
        for i, req in enumerate(rows):
            put_row(i, req)
        while waiting and len(rows) < in_flight:
            rows.append(waiting.pop(0))
            put_row(len(rows) - 1, rows[-1])
        if step_index % 5 == 0 and len(rows) > 2:  # the runner reorders rows (swap_states)
            rows[0], rows[2] = rows[2], rows[0]
            put_row(0, rows[0])
            put_row(2, rows[2])
        if not rows:
            continue
        sampled_token_ids: list[list[int]] = []
        logits_rows = []
        for req in rows:
            if req.prefilled < len(req.prompt):  # a prefill chunk
                req.prefilled = min(len(req.prompt), req.prefilled + chunk)
                if req.prefilled < len(req.prompt):
                    sampled_token_ids.append([])  # partial chunk: the sample is discarded
                    logits_rows.append(torch.zeros(1, VOCAB))
                    continue
                last = req.verifier.prefill(np.asarray(req.prompt, dtype=np.int32)).last_logits
                logits_rows.append(last.unsqueeze(0).float())
                sampled_token_ids.append([int(last.argmax())])
                continue
            n = len(req.prompt) + len(req.output)
            drafts = req.drafts[: vllm_draft_bound(k, max_model_len, n)]
            if step_index % 7 == 0:  # the token budget cuts this request's drafts
                drafts = drafts[: len(drafts) // 2]
            chain = np.array([req.output[-1], *drafts], dtype=np.int32)
            ancestors = np.tril(np.ones((len(chain), len(chain)), dtype=bool))
            logits = req.verifier.forward_tree(chain, np.arange(len(chain), dtype=np.int32), ancestors)
            logits_rows.append(logits.float())
            predicted = logits.argmax(-1).tolist()
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == predicted[accepted]:
                accepted += 1
            req.verifier.commit(np.arange(accepted + 1))
            sampled_token_ids.append([*drafts[:accepted], predicted[accepted]])
            accepted_total += accepted
            drafted_total += len(drafts)
        # The runner's logits for the step, request-major in row order, then bookkeeping.
        target.compute_logits(torch.cat(logits_rows))
        for i, (req, sampled) in enumerate(zip(rows, sampled_token_ids, strict=True)):
            if sampled:
                start = int(num_tokens_no_spec[i])
                assert start + len(sampled) <= max_model_len
                token_ids_cpu[i, start : start + len(sampled)] = sampled
                num_tokens_no_spec[i] = start + len(sampled)
                req.output.extend(sampled)
        drafts = proposer.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)
        assert len(drafts) == len(rows)
        for i, (req, row) in enumerate(zip(rows, drafts, strict=True)):
            assert all(type(t) is int for t in row)
            assert len(row) <= vllm_draft_bound(k, max_model_len, int(num_tokens_no_spec[i]))
            if not sampled_token_ids[i]:
                assert row == []
            req.drafts = row
    assert len(done) == 7
    for req in done:
        want = plain_greedy(model, req.prompt, min(req.max_new, max_model_len - len(req.prompt)))
        assert req.output[: len(want)] == want
    assert done[-1].prompt == random_prompt(9, 30) and len(done[-1].prompt) + len(done[-1].output) == max_model_len
    assert accepted_total > 20 and drafted_total > accepted_total
    assert proposer.stats["logit_steps"] > 5 and proposer.stats["logit_skips"] > 0


# ---------------------------------------------------------------------------------------------
# Determinism


DETERMINISM_SCRIPT = textwrap.dedent(
    r"""
    import hashlib, sys
    from array import array
    from types import SimpleNamespace
    import numpy as np
    from racer_rs import optional_deps
    from racer_rs.integrations.sglang import RacerCorpus
    from racer_rs.integrations.vllm import RacerProposer

    optional_deps.require = lambda extra, purpose: None  # the proposer needs only numpy
    digest = hashlib.sha256()
    rng = np.random.default_rng(7)
    vocab, n = 97, 64
    chunks = [rng.integers(0, vocab, int(rng.integers(4, 14))).tolist() for _ in range(12)]

    def stream(length):
        out = []
        while len(out) < length:
            out += chunks[int(rng.integers(len(chunks)))]
        return out[:length]

    corpus = RacerCorpus(n, vocab)  # threads from RACER_RS_OPTIONS
    seqs = {f"req-{i}": stream(int(rng.integers(20, 300))) for i in range(40)}
    for step in range(6):
        rids = sorted(seqs)
        for rid in rids:
            corpus.sync(rid, array("q", seqs[rid][:20]), array("q", seqs[rid][20:]))
        tokens, mask = corpus.batch_get(rids, [seqs[r][-18:] for r in rids], [len(seqs[r]) for r in rids])
        digest.update(tokens.tobytes()); digest.update(mask.tobytes())
        topk = rng.integers(0, vocab, (len(rids) * n, 8))
        committed = [tokens[b * n + 1 : b * n + 1 + int(rng.integers(0, 4))].tolist() + [int(rng.integers(vocab))]
                     for b in range(len(rids))]
        corpus.observe_verify(rids, committed, topk)
        for rid, c in zip(rids, committed):
            seqs[rid] += c
        gone = {rid for rid in rids if rng.random() < 0.1}  # a set: its order follows the hash seed
        corpus.erase_match_state(list(gone))
        for rid in sorted(gone):  # (the script's own random draws in a fixed order)
            seqs[rid] = stream(int(rng.integers(20, 200)))

    proposer = RacerProposer(SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=6),
        model_config=SimpleNamespace(max_model_len=512, get_vocab_size=lambda: vocab)))
    contexts = [stream(int(rng.integers(20, 300))) for _ in range(40)]
    sampled = [[c[-1]] for c in contexts]
    for step in range(6):
        ids = np.zeros((48, 512), dtype=np.int32)
        lens = np.zeros(48, dtype=np.int32)
        for i, c in enumerate(contexts):
            ids[i, : len(c)] = c
            lens[i] = len(c)
        out = proposer.propose(sampled, lens, ids)
        digest.update(repr(out).encode())
        sampled = [[*row[: int(rng.integers(0, len(row) + 1))], int(rng.integers(vocab))] for row in out]
        contexts = [c + s for c, s in zip(contexts, sampled)]
        order = rng.permutation(len(contexts))
        contexts = [contexts[i] for i in order]
        sampled = [sampled[i] for i in order]
    print(digest.hexdigest())
    """
)


def run_determinism(hash_seed: str, threads: int) -> str:
    env = {
        **os.environ,
        "PYTHONHASHSEED": hash_seed,
        # capacity 64 (vLLM's trees; SGLang's have N = 64): 40 requests then split across threads.
        "RACER_RS_OPTIONS": f'{{"threads": {threads}, "capacity": 64, "adaptive": false}}',
    }
    out = subprocess.run(
        [sys.executable, "-c", DETERMINISM_SCRIPT], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_drafts_are_byte_identical_across_processes_hash_seeds_and_threads():
    first = run_determinism("0", 1)
    second = run_determinism("2718281", 4)
    assert len(first) == len(hashlib.sha256().hexdigest())
    assert first == second
