"""Slow, obviously correct pure-Python oracles for the Rust core."""

from __future__ import annotations

from collections.abc import Sequence


class ReferenceIndex:
    """Brute-force counterpart of `racer_rs.Automaton` (no eviction)."""

    def __init__(self, ngram: int, min_depth: int = 2) -> None:
        self.ngram = ngram
        self.min_depth = min_depth
        self.sequences: list[list[int]] = [[]]

    def extend(self, tokens: Sequence[int]) -> None:
        self.sequences[-1].extend(int(t) for t in tokens)

    def new_sequence(self) -> None:
        self.sequences.append([])

    def count(self, pattern: Sequence[int]) -> int:
        p = list(pattern)
        n = len(p)
        return sum(1 for s in self.sequences for i in range(len(s) - n + 1) if s[i : i + n] == p)

    def continuations(self, next_token: int) -> set[tuple[int, ...]]:
        """Every token path P (starting with next_token) such that s + P occurred in one
        sequence for a suffix s of the current sequence with a border deep enough."""
        return self.continuations_after(self.sequences[-1], next_token)

    def continuations_after(self, context: Sequence[int], next_token: int) -> set[tuple[int, ...]]:
        """Every token path P (starting with next_token) such that s + P occurred in one
        sequence for a suffix s of ``context`` (any tokens, e.g. another request's) with a
        border deep enough."""
        current = [int(t) for t in context]
        found: set[tuple[int, ...]] = set()
        for slen in range(self.min_depth - 1, min(len(current), self.ngram - 1) + 1):
            s = current[len(current) - slen :] if slen else []
            for seq in self.sequences:
                for i in range(len(seq) - slen):
                    if seq[i : i + slen] != s or seq[i + slen] != next_token:
                        continue
                    for plen in range(1, self.ngram - slen + 1):
                        if i + slen + plen > len(seq):
                            break
                        found.add(tuple(seq[i + slen : i + slen + plen]))
        return found

    def chain_after(self, context: Sequence[int], next_token: int, max_len: int) -> list[int]:
        """The longest-match chain after ``context + [next_token]`` (``Automaton.chain``): from
        the longest indexed string ``s + [next_token]`` (``s`` a suffix of ``context``, at
        least ``min_depth`` tokens in all), each step the most frequent continuation of the
        matched string (ties to the smaller id); a string without one (``ngram`` long, or never
        continued) gives way to its longest suffix that has one, of ``min_depth`` tokens or
        more."""
        current = [int(t) for t in context]
        matched: list[int] | None = None
        for slen in range(min(len(current), self.ngram - 1), self.min_depth - 2, -1):
            s = current[len(current) - slen :] if slen else []
            if slen + 1 >= self.min_depth and self.count([*s, next_token]):
                matched = [*s, next_token]
                break
        chain: list[int] = []
        while matched is not None and len(chain) < max_len:
            while matched and not self._continuations(matched):
                matched = matched[1:]
            if len(matched) < self.min_depth or not matched:
                break
            counts = self._continuations(matched)
            token = min(counts, key=lambda t: (-counts[t], t))
            chain.append(token)
            matched = [*matched, token]
        return chain

    def _continuations(self, string: list[int]) -> dict[int, int]:
        """Token -> count of ``string + [token]``, for the strings the index holds."""
        if len(string) >= self.ngram:
            return {}
        n = len(string)
        counts: dict[int, int] = {}
        for seq in self.sequences:
            for i in range(len(seq) - n):
                if seq[i : i + n] == string:
                    counts[seq[i + n]] = counts.get(seq[i + n], 0) + 1
        return counts


def tree_paths(tokens: Sequence[int], parents: Sequence[int]) -> list[tuple[int, ...]]:
    """Token path from the root to every node."""
    paths: list[tuple[int, ...]] = []
    for i, t in enumerate(tokens):
        p = parents[i]
        paths.append((int(t),) if p < 0 else (*paths[p], int(t)))
    return paths


def ancestor_mask(parents: Sequence[int]) -> list[list[bool]]:
    """Row i marks i and every ancestor of i, found by walking up."""
    n = len(parents)
    mask = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j >= 0:
            mask[i][j] = True
            j = parents[j]
    return mask


def greedy_walk(tokens: Sequence[int], parents: Sequence[int], predicted: Sequence[int]) -> tuple[list[int], int]:
    """Follow the child whose token equals the parent's prediction, from the root."""
    path = [0]
    while True:
        u = path[-1]
        nxt = [c for c in range(len(tokens)) if parents[c] == u and tokens[c] == predicted[u]]
        if not nxt:
            return path, int(predicted[u])
        path.append(nxt[0])
