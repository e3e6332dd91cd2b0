"""The sampling walk draws, on a CPU, only the nodes it reaches (the roots in the step's batched
draw, deeper nodes one by one in the walk): its path, bonus and exact redraws must be the ones
drawing every node up front gives (what it does on other devices), for any tree, filter and
generation position, including the positions past the budget's last uniform row."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from racer_rs import DraftTree  # noqa: E402
from racer_rs.drafters.base import Proposal  # noqa: E402
from racer_rs.engine.acceptance import SamplingWalk, StepInputs  # noqa: E402
from racer_rs.target.sampling import SamplingConfig, draw_uniforms, sample_nodes, uniform_rows  # noqa: E402

VOCAB = 10


def likely_tree(rng: np.random.Generator, logits: torch.Tensor, nodes: int) -> DraftTree:
    """A BFS tree whose children carry their parent's likeliest tokens (so walks go deep), with
    now and then an unlikely one."""
    tokens, parents = [int(rng.integers(VOCAB))], [-1]
    frontier = 0
    while len(tokens) < nodes and frontier < len(tokens):
        order = torch.argsort(logits[frontier], descending=True).tolist()
        for token in order[: int(rng.integers(1, 4))] + ([order[-1]] if rng.random() < 0.3 else []):
            if len(tokens) == nodes:
                break
            tokens.append(token)
            parents.append(frontier)
        frontier += 1
    return DraftTree(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32))


def every_node_drawn(step: StepInputs, config: SamplingConfig) -> dict[str, np.ndarray]:
    assert step.uniforms is not None
    rows = np.minimum(step.generated + 1 + step.proposal.tree.depths.astype(np.int64), len(step.uniforms) - 1)
    predicted, valid = sample_nodes(step.logits, config, step.uniforms[torch.from_numpy(rows), 0])
    host = {"predicted": predicted.numpy()}
    if valid is not None:
        host["valid"] = valid.long().numpy()
    return host


def root_drawn(step: StepInputs, config: SamplingConfig) -> dict[str, np.ndarray]:
    full = every_node_drawn(step, config)
    host = {"predicted": np.full(len(full["predicted"]), VOCAB, dtype=np.int64)}
    host["predicted"][0] = full["predicted"][0]
    if "valid" in full:
        host["valid"] = np.ones(len(full["valid"]), dtype=np.int64)
        host["valid"][0] = full["valid"][0]
    return host


@pytest.mark.parametrize("top_p", [1.0, 0.5])
@pytest.mark.parametrize("seed", range(30))
def test_drawing_the_reached_nodes_walks_as_drawing_every_node(seed, top_p):
    rng = np.random.default_rng(seed)
    nodes = int(rng.integers(1, 16))
    logits = torch.from_numpy(rng.normal(0.0, 2.5, (nodes, VOCAB))).float()
    tree = likely_tree(rng, logits, nodes)
    logits = logits[: len(tree)]
    config = SamplingConfig(temperature=0.7, top_p=top_p)
    budget = int(rng.integers(1, 12))  # rows of uniforms: deep nodes may pass the last one
    generated = int(rng.integers(0, budget))
    walks = []
    for drawn in (every_node_drawn, root_drawn):
        generator = torch.Generator().manual_seed(seed)
        uniforms = draw_uniforms(budget + 1, torch.Generator().manual_seed(seed + 1000))
        step = StepInputs(Proposal(tree), logits, generated, uniforms, generator)
        walks.append(SamplingWalk(config).accept(step, drawn(step, config)))
    assert walks[0] == walks[1]


def test_the_walks_go_deep_and_redraw():
    """The cases above include deep walks and exact redraws (else the equality says little)."""
    deepest = redraws = 0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        nodes = int(rng.integers(1, 16))
        logits = torch.from_numpy(rng.normal(0.0, 2.5, (nodes, VOCAB))).float()
        tree = likely_tree(rng, logits, nodes)
        config = SamplingConfig(temperature=0.7, top_p=0.5)
        uniforms = draw_uniforms(20, torch.Generator().manual_seed(seed + 1000))
        step = StepInputs(Proposal(tree), logits[: len(tree)], 0, uniforms, torch.Generator().manual_seed(seed))
        walk = SamplingWalk(config).accept(step, root_drawn(step, config))
        deepest, redraws = max(deepest, len(walk.path)), redraws + walk.resampled
    assert deepest >= 4 and redraws >= 3


def test_a_node_not_drawn_never_matches_a_token_beyond_the_vocabulary():
    """A drafted id at or past the vocabulary size is never a sample, so it is never accepted,
    also below a node the walk has not drawn yet."""
    tree = DraftTree(np.array([5, 3, VOCAB, VOCAB + 1], dtype=np.int32), np.array([-1, 0, 1, 1], dtype=np.int32))
    logits = torch.zeros(4, VOCAB)
    logits[0, 3] = 50.0  # the root's sample is 3: the walk reaches node 1 (not drawn up front)
    config = SamplingConfig(temperature=0.7)
    walks = []
    for drawn in (every_node_drawn, root_drawn):
        uniforms = draw_uniforms(8, torch.Generator().manual_seed(0))
        step = StepInputs(Proposal(tree), logits, 0, uniforms, torch.Generator().manual_seed(0))
        walks.append(SamplingWalk(config).accept(step, drawn(step, config)))
    assert walks[0] == walks[1]
    assert walks[1].path == [0, 1]


def test_a_node_samples_with_its_generation_position_s_row_clipped_at_the_last():
    """The root after ``g`` tokens predicts position ``g + 1``; deeper nodes one row further per
    depth; a node past the budget's last row reads the last (fails unclipped)."""
    depths = np.asarray([0, 1, 1, 2, 3, 4])
    assert uniform_rows(3, depths, positions=20).tolist() == [4, 5, 5, 6, 7, 8]
    assert uniform_rows(3, depths, positions=7).tolist() == [4, 5, 5, 6, 6, 6]
