"""Tests of the self-draft checkpoint and of the offline distillation (library level).

Checkpoint: a saved draft loads back identical; a missing, unfinished, truncated or corrupt
checkpoint, or one made for another target, is refused with one clear error; an interrupted save
leaves the previous checkpoint loadable. Distillation: the teacher rows line up with the draft's
positions (the target itself as the draft has KL ~0 and full agreement; shifted by one it has
not), training lowers the KL, the time budget is kept, and an interrupted run resumes without
redoing finished work, in the data phase and in the training phase.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from racer_rs.selfdraft.checkpoint import DraftCheckpointError, load_self_draft, save_self_draft  # noqa: E402
from racer_rs.selfdraft.distillation import DistillError, DistillSettings, distill_self_draft  # noqa: E402
from racer_rs.selfdraft.distillation.data import generate_shard  # noqa: E402
from racer_rs.selfdraft.distillation.training import (  # noqa: E402
    Batch,
    draft_columns,
    evaluate,
    make_batch,
    train_step,
    trainable_parameters,
)
from racer_rs.selfdraft.model import self_draft  # noqa: E402
from tests.helpers import DEEP_LLAMA, tiny_llama  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 96
KEPT = [*list(range(0, VOCAB, 2)), 1]
IDS = [3, 17, 42, 8, 55, 3, 17, 9]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(**DEEP_LLAMA)


def prompts(count: int = 8) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, VOCAB, (6 + i % 3,), generator=generator).tolist() for i in range(count)]


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([IDS])).logits[0]


def trained_draft(target: torch.nn.Module, vocab=KEPT) -> torch.nn.Module:
    """A self-draft whose layers differ from the target's (as after distillation)."""
    draft = self_draft(target, 2, vocab=vocab)
    with torch.no_grad():
        for param in trainable_parameters(draft):
            param.add_(0.01)
    return draft


# --- checkpoint ---------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [None, KEPT], ids=["full_vocab", "reduced_vocab"])
def test_a_saved_draft_loads_back_identical(target, tmp_path, vocab) -> None:
    draft = trained_draft(target, vocab)
    save_self_draft(draft, target, tmp_path / "ckpt", target_name="tiny")
    loaded = load_self_draft(target, tmp_path / "ckpt")
    torch.testing.assert_close(logits(loaded), logits(draft), rtol=0, atol=0)
    assert loaded.model.embed_tokens is target.model.embed_tokens
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert manifest["layers"] == 2 and manifest["vocab"] == (None if vocab is None else len(KEPT))
    assert manifest["target"]["name"] == "tiny"
    # Only what the target does not hold: no embedding or LM head in the file.
    weights = tmp_path / "ckpt" / manifest["weights"]["file"]
    from safetensors.torch import load_file

    assert not any("embed" in key or "lm_head" in key for key in load_file(str(weights)))


def test_a_bfloat16_copy_of_the_target_still_matches(target, tmp_path) -> None:
    save_self_draft(trained_draft(target), target, tmp_path / "ckpt", target_name="tiny")
    half = tiny_llama(**DEEP_LLAMA).to(torch.bfloat16)
    loaded = load_self_draft(half, tmp_path / "ckpt")
    assert next(loaded.model.layers.parameters()).dtype == torch.bfloat16


def test_missing_checkpoint_is_refused(target, tmp_path) -> None:
    with pytest.raises(DraftCheckpointError, match="not found"):
        load_self_draft(target, tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftCheckpointError, match=r"no manifest\.json"):
        load_self_draft(target, tmp_path / "empty")


def test_unfinished_distillation_says_so(target, tmp_path) -> None:
    (tmp_path / "run" / "work").mkdir(parents=True)
    with pytest.raises(DraftCheckpointError, match="unfinished distillation"):
        load_self_draft(target, tmp_path / "run")


def test_truncated_weights_are_refused(target, tmp_path) -> None:
    save_self_draft(trained_draft(target), target, tmp_path / "ckpt", target_name="tiny")
    weights = next((tmp_path / "ckpt").glob("draft-*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(DraftCheckpointError, match="truncated or corrupt"):
        load_self_draft(target, tmp_path / "ckpt")
    weights.unlink()
    with pytest.raises(DraftCheckpointError, match="missing"):
        load_self_draft(target, tmp_path / "ckpt")


def test_edited_weights_are_refused(target, tmp_path) -> None:
    save_self_draft(trained_draft(target), target, tmp_path / "ckpt", target_name="tiny")
    weights = next((tmp_path / "ckpt").glob("draft-*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # same size, one byte flipped
    weights.write_bytes(bytes(data))
    with pytest.raises(DraftCheckpointError, match="checksum"):
        load_self_draft(target, tmp_path / "ckpt")


@pytest.mark.parametrize(
    "content", ["{not json", '{"format": "other"}', '{"format": "racer-self-draft", "version": 9}']
)
def test_corrupt_manifest_is_refused(target, tmp_path, content) -> None:
    save_self_draft(trained_draft(target), target, tmp_path / "ckpt", target_name="tiny")
    (tmp_path / "ckpt" / "manifest.json").write_text(content)
    with pytest.raises(DraftCheckpointError):
        load_self_draft(target, tmp_path / "ckpt")


def test_another_architecture_is_refused(target, tmp_path) -> None:
    save_self_draft(trained_draft(target), target, tmp_path / "ckpt", target_name="tiny")
    with pytest.raises(DraftCheckpointError, match=r"num_hidden_layers=4.*the target has num_hidden_layers=3"):
        load_self_draft(tiny_llama(**{**DEEP_LLAMA, "layers": 3}), tmp_path / "ckpt")


def test_another_target_of_the_same_architecture_is_refused(target, tmp_path) -> None:
    save_self_draft(trained_draft(target), target, tmp_path / "ckpt", target_name="tiny")
    with pytest.raises(DraftCheckpointError, match="weights differ"):
        load_self_draft(tiny_llama(5, **DEEP_LLAMA), tmp_path / "ckpt")


def test_an_interrupted_save_leaves_the_previous_checkpoint(target, tmp_path, monkeypatch) -> None:
    first = trained_draft(target)
    save_self_draft(first, target, tmp_path / "ckpt", target_name="tiny")
    import safetensors.torch

    def crash(tensors, path):  # writes half a file, then dies
        Path(path).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        save_self_draft(self_draft(target, 2, vocab=KEPT), target, tmp_path / "ckpt", target_name="tiny")
    monkeypatch.undo()
    torch.testing.assert_close(logits(load_self_draft(target, tmp_path / "ckpt")), logits(first), rtol=0, atol=0)
    assert not list((tmp_path / "ckpt").glob(".*.tmp"))  # no temporary file left behind


# --- the distillation's pieces ----------------------------------------------------------------


def test_teacher_rows_line_up_with_the_drafts_positions(target) -> None:
    # Full top-k, so the renormalised teacher is the whole distribution.
    shard = generate_shard(
        target, prompts(4), new_tokens=12, temperature=0.8, top_p=0.95, teacher_top_k=VOCAB, eos_token_ids=[], seed=0
    )
    samples = list(shard.samples())
    same = evaluate(self_draft(target, 4), samples, None, batch_size=2)
    assert same["kl"] < 1e-4 and same["agreement"] == 1.0  # float16 storage of the teacher
    # The counterpart: rows shifted by one position (the classic off-by-one of this loss).
    draft = self_draft(target, 4)
    batch = make_batch(samples, None, torch.device("cpu"), generated_only=True)
    shifted = Batch(batch.input_ids, (batch.rows[0], batch.rows[1] + 1), batch.teacher_ids, batch.teacher_logp)
    from racer_rs.selfdraft.distillation.training import batch_kl, student_logits

    with torch.no_grad():
        kl, _, agree = batch_kl(student_logits(draft, shifted), shifted)
    assert float(agree.float().mean()) < 0.5 and float(kl.mean()) > 10 * max(same["kl"], 1e-4)


def test_left_padded_generation_matches_unpadded_forwards(target) -> None:
    shard = generate_shard(
        target, prompts(3), new_tokens=10, temperature=0.0, top_p=1.0, teacher_top_k=5, eos_token_ids=[], seed=0
    )
    for sample in shard.samples():
        with torch.no_grad():
            log_p = torch.log_softmax(target(input_ids=sample.ids[None]).logits[0, :-1], dim=-1)
        top = log_p.topk(5, dim=-1)
        assert torch.equal(top.indices, sample.teacher_ids)
        torch.testing.assert_close(top.values, sample.teacher_logp, atol=5e-3, rtol=0)  # stored in float16
        # Greedy data: each generated token is the argmax of its row.
        generated = sample.ids[sample.prompt_length :]
        assert torch.equal(generated, sample.teacher_ids[sample.prompt_length - 1 :, 0])


def test_generation_stops_at_the_end_of_sequence_token(target) -> None:
    free = generate_shard(
        target, prompts(2), new_tokens=12, temperature=0.0, top_p=1.0, teacher_top_k=4, eos_token_ids=[], seed=0
    )
    first = next(free.samples())
    eos = int(first.ids[first.prompt_length + 3])
    cut = next(
        generate_shard(
            target, prompts(2), new_tokens=12, temperature=0.0, top_p=1.0, teacher_top_k=4, eos_token_ids=[eos], seed=0
        ).samples()
    )
    generated = first.ids[first.prompt_length :].tolist()
    assert cut.ids[cut.prompt_length :].tolist() == generated[: generated.index(eos) + 1]
    assert cut.teacher_ids.shape[0] == len(cut.ids) - 1


def test_training_lowers_the_kl(target) -> None:
    shard = generate_shard(
        target, prompts(4), new_tokens=16, temperature=0.8, top_p=0.95, teacher_top_k=16, eos_token_ids=[], seed=0
    )
    samples = list(shard.samples())
    draft = self_draft(target, 1, vocab=KEPT)
    columns = draft_columns(torch.tensor(KEPT), VOCAB)
    optimizer = torch.optim.Adam(trainable_parameters(draft), lr=1e-2)
    before = evaluate(draft, samples, columns, 4)["kl"]
    for _ in range(30):
        train_step(draft, optimizer, make_batch(samples, columns, torch.device("cpu")))
    assert evaluate(draft, samples, columns, 4)["kl"] < 0.7 * before
    assert all(not p.requires_grad for p in target.parameters() if p is target.model.embed_tokens.weight)


# --- the whole distillation: budget, resume, errors ------------------------------------------

FAST = {"batch_size": 2, "new_tokens": 8, "teacher_top_k": 16, "save_every": 0.05, "report_every": 0.05}


def run(target, out: Path, progress=None, **overrides) -> object:
    settings = {"layers": 2, "minutes": 0.02, "vocab": 40} | FAST | overrides
    return distill_self_draft(target, prompts(), out, eos_token_ids=[0], progress=progress, **settings)


def test_a_distillation_keeps_its_budget_and_writes_a_loadable_checkpoint(target, tmp_path) -> None:
    lines: list[str] = []
    start = time.perf_counter()
    result = run(target, tmp_path / "out", lines.append)
    elapsed = time.perf_counter() - start
    budget = 0.02 * 60
    assert budget <= result.spent < budget + 3 and elapsed < budget + 5
    assert result.steps >= 1 and result.shards >= 2
    draft = load_self_draft(target, tmp_path / "out")
    assert draft.lm_head.kept_ids.numel() == 40 and 0 in draft.lm_head.kept_ids.tolist()  # EOS always kept
    assert any(line.startswith("data: shard 1 (held out") for line in lines)
    assert all("ETA" in line for line in lines if line.startswith(("data:", "train:")))
    assert lines[-1].startswith("done:")
    # Rerunning a finished distillation does nothing; a larger budget trains further.
    again: list[str] = []
    assert run(target, tmp_path / "out", again.append).steps == result.steps
    assert again == [f"already finished: {tmp_path / 'out'} " + again[0].split(" ", 3)[3]]
    longer = run(target, tmp_path / "out", minutes=0.04)
    assert longer.steps > result.steps and longer.shards == result.shards


class Interrupt:
    """A progress callback that interrupts the run at the first line starting with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if line.startswith(self.prefix):
            raise KeyboardInterrupt


def test_an_interrupted_data_phase_resumes_without_regenerating_shards(target, tmp_path) -> None:
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run(target, out, Interrupt("data: shard 2"), minutes=0.05)
    work = out / "work"
    state = json.loads((work / "state.json").read_text())
    assert state["shards"] == 2 and not state["data_done"] and not (out / "manifest.json").exists()
    kept = {name: (work / name).stat().st_mtime_ns for name in ("shard-00000.pt", "shard-00001.pt")}
    lines: list[str] = []
    result = run(target, out, lines.append, minutes=0.05)
    assert lines[0].startswith("resuming: 2 shard(s) and 0 training step(s) done")
    assert {name: (work / name).stat().st_mtime_ns for name in kept} == kept  # not made again
    assert result.shards >= 2 and (out / "manifest.json").exists()


def test_an_interrupted_training_phase_resumes_from_its_saved_steps(target, tmp_path, monkeypatch) -> None:
    from racer_rs.selfdraft.distillation import run as distill_run

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run(target, out, Interrupt("train:"), minutes=0.05)
    saved = torch.load(out / "work" / "train.pt", weights_only=True)
    assert saved["steps"] >= 1 and not (out / "manifest.json").exists()
    # The resumed run's first step starts from the saved weights and optimiser state.
    first: dict[str, object] = {}
    real_step = distill_run.train_step

    def record(draft, optimizer, batch, *args):
        if not first:
            first["params"] = {n: p.detach().clone() for n, p in draft.named_parameters() if p.requires_grad}
            first["adam_step"] = float(next(iter(optimizer.state.values()))["step"])
        return real_step(draft, optimizer, batch, *args)

    monkeypatch.setattr(distill_run, "train_step", record)
    lines: list[str] = []
    result = run(target, out, lines.append, minutes=0.05)
    assert first["adam_step"] == saved["steps"]
    for name, value in saved["params"].items():
        torch.testing.assert_close(first["params"][name], value, rtol=0, atol=0)
    assert lines[0].startswith("resuming: ") and f"and {saved['steps']} training step(s) done" in lines[0]
    assert not any(line.startswith("eval: undistilled") for line in lines)  # measured once, kept
    assert result.steps > saved["steps"]
    load_self_draft(target, out)


def test_resuming_with_other_settings_or_another_target_is_refused(target, tmp_path) -> None:
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run(target, out, Interrupt("data: shard 2"))
    with pytest.raises(DistillError, match=r"other settings.*layers"):
        run(target, out, layers=1)
    with pytest.raises(DistillError, match=r"other settings.*vocab"):
        run(target, out, vocab=30)
    with pytest.raises(DistillError, match="another target"):
        run(tiny_llama(3, **DEEP_LLAMA), out)
    (out / "work" / "plan.json").write_text("{broken")
    with pytest.raises(DistillError, match="unreadable"):
        run(target, out)


def test_output_folder_errors(target, tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(DistillError, match="not a folder"):
        run(target, tmp_path / "file")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(DistillError, match="not empty"):
        run(target, tmp_path / "busy")
    save_self_draft(trained_draft(target), target, tmp_path / "ckpt", target_name="tiny")
    with pytest.raises(DistillError, match="without its work folder"):
        run(target, tmp_path / "ckpt")


@pytest.mark.parametrize(
    ("overrides", "error", "fragment"),
    [
        ({"layers": 5}, ValueError, "layers must be <= 4"),
        ({"vocab": VOCAB + 1}, ValueError, "vocab must be <= 96"),
        ({"minutes": 0}, ValueError, "minutes must be > 0"),
        ({"minutes": float("nan")}, ValueError, "minutes must be finite"),
        ({"layers": 0}, ValueError, "layers must be >= 1"),
        ({"layers": 1.5}, TypeError, "layers must be an int"),
        ({"top_p": 0}, ValueError, "top_p"),
        ({"data_share": 1.0}, ValueError, "data_share"),
        ({"batch_size": 5}, ValueError, "need at least 10 prompts"),
    ],
)
def test_bad_settings_are_rejected(target, tmp_path, overrides, error, fragment) -> None:
    with pytest.raises(error, match=fragment):
        run(target, tmp_path / "out", **overrides)
    assert not (tmp_path / "out").exists()


def test_bad_prompts_and_targets_are_rejected(target, tmp_path) -> None:
    settings = DistillSettings(layers=1, minutes=0.01, **FAST)
    with pytest.raises(ValueError, match="non-empty"):
        distill_self_draft(target, [[1, 2], []] * 4, tmp_path / "a", settings)
    with pytest.raises(TypeError, match="sequence"):
        distill_self_draft(target, "not prompts", tmp_path / "a", settings)
    from tests.helpers import tiny_model

    with pytest.raises(TypeError, match="Llama-style"):
        distill_self_draft(tiny_model("gpt_neox"), prompts(), tmp_path / "a", settings)
    with pytest.raises(TypeError, match="either settings or keyword"):
        distill_self_draft(target, prompts(), tmp_path / "a", settings, layers=2)


def test_reduced_vocabulary_takes_half_by_data_frequency_and_half_by_merge_order() -> None:
    from racer_rs.selfdraft.distillation.data import frequent_tokens

    mass = torch.zeros(20)
    mass[[15, 12, 19, 3]] = torch.tensor([5.0, 4.0, 3.0, 2.0])
    # The always-kept 7, the most frequent (15, 12, 19) up to half of 8, then the lowest free ids.
    assert frequent_tokens(mass, 8, always=[7]).tolist() == [0, 1, 2, 3, 7, 12, 15, 19]
    assert frequent_tokens(mass, 3, always=[7, 9, 11, 13]).tolist() == [7, 9, 11]  # never over size
    assert frequent_tokens(mass, 50).tolist() == list(range(20))
