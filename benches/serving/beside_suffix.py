"""RacerProposer that also runs vLLM's ``SuffixDecodingProposer`` on every call, on the same
requests and tokens, and counts where the two drafts would have committed different numbers of
tokens: where SuffixDecoding's extra accepted tokens come from.

A ``--variant`` class of ``vllm_replay.py`` (the repository root on ``PYTHONPATH``); the counts
are printed as one ``beside suffix`` JSON line per proposer when the process ends, e.g.::

    PYTHONPATH=python:. /tmp/vstage/venv/bin/python benches/serving/vllm_replay.py --methods md2,beside \\
        --variant 'beside={"class": "benches.serving.beside_suffix.BesideSuffix"}' \\
        --variant 'md2={"class": "benches.serving.beside_suffix.BesideSuffix", "options": {"min_depth": 2}}' \\
        --concurrency 8 --skip 17 --prompts 8

Each row-step compares what each draft matched of the tokens the target sampled after it. Ours
was verified; SuffixDecoding's was not, so where it matched every sampled token it is credited
with those only (``suffix_censored`` counts such rows). Where SuffixDecoding's would have
committed more, the row is sorted by why ours did not: ``cut`` (our chosen chain held the tokens
and the cut dropped them), ``choice`` (another of our candidates held them) or ``missing`` (none
did). ``ours_empty_*``: the rows where we drafted nothing, SuffixDecoding's drafts there and
what they would have committed.
"""

from __future__ import annotations

import atexit
import json
from collections import Counter
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from racer_rs.integrations.vllm import RacerProposer, _Continued


def matched(chain: Sequence[int], sampled: Sequence[int]) -> int:
    """How many of ``chain``'s first tokens equal the sampled ones."""
    n = 0
    while n < min(len(chain), len(sampled)) and chain[n] == sampled[n]:
        n += 1
    return n


class BesideSuffix(RacerProposer):
    def __init__(self, vllm_config: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, **kwargs)
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        self.suffix = SuffixDecodingProposer(vllm_config)
        self.counts: Counter[str] = Counter()
        self._suffix_drafts: dict[int, list[int]] = {}  # request key -> the last call's draft
        label = f"beside suffix (min_depth {self.options.racer.min_depth}):"
        atexit.register(lambda: print(label, json.dumps(dict(sorted(self.counts.items()))), flush=True))

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
        **kwargs: Any,
    ) -> list[list[int]]:
        out = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings, **kwargs)
        # SuffixDecoding wants request ids and prompt lengths: ours, as this proposer tracks them.
        rows = range(len(sampled_token_ids))
        ids = [str(self._rows[i].key) if i in self._rows else f"row{i}" for i in rows]
        batch = SimpleNamespace(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            num_tokens_no_spec=num_tokens_no_spec,
            token_ids_cpu=token_ids_cpu,
            num_prompt_tokens=np.array([self._rows[i].output if i in self._rows else 0 for i in rows]),
        )
        drafts = self.suffix.propose(self.k, batch, [list(s) for s in sampled_token_ids])
        self._suffix_drafts = {self._rows[i].key: list(d) for i, d in enumerate(drafts) if i in self._rows}
        return out

    def _learn(self, continued: list[_Continued]) -> None:
        for c in continued:
            theirs = self._suffix_drafts.get(c.request.key)
            if theirs is None:
                continue
            ours, theirs_n = matched(c.chain, c.sampled), matched(theirs, c.sampled)
            n = self.counts
            n["rows"] += 1
            n["ours_drafted"] += len(c.chain)
            n["ours_committed"] += ours
            n["suffix_drafted"] += len(theirs)
            n["suffix_committed"] += theirs_n
            n["suffix_censored"] += int(theirs_n == len(c.sampled) < len(theirs))
            if not c.chain:
                n["ours_empty"] += 1
                n["ours_empty_suffix_rows"] += int(bool(theirs))
                n["ours_empty_suffix_drafted"] += len(theirs)
                n["ours_empty_suffix_committed"] += theirs_n
            if theirs_n > ours:
                n["suffix_more_rows"] += 1
                n["suffix_more_tokens"] += theirs_n - ours
                n["suffix_more_ours_empty"] += int(not c.chain)
                if c.slot >= 0 and self._candidates is not None:
                    tokens = self._candidates[0][:, c.slot].tolist()
                    held = [matched([t for t in chain if t >= 0], c.sampled) for chain in tokens]
                    chosen = int(self._best[c.slot])
                    n["cut" if held[chosen] >= theirs_n else "choice" if max(held) >= theirs_n else "missing"] += 1
            elif ours > theirs_n:
                n["ours_more_rows"] += 1
                n["ours_more_tokens"] += ours - theirs_n
        super()._learn(continued)
