"""Persistence of `Automaton`: save/load, to_bytes/from_bytes and pickling round trips against the
oracle, continued behaviour after a load (evictions included), and every kind of damaged file."""

from __future__ import annotations

import copy
import os
import pickle
import shutil
import struct
import tempfile
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from racer_rs import Automaton, LogitsTable, build_draft_tree
from racer_rs.errors import CorruptFileError, InvalidArgumentError, RacerError
from tests.reference import ReferenceIndex, tree_paths

settings.register_profile("fast", max_examples=25, deadline=None)
settings.register_profile("ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

ALPHABET = 5
token_lists = st.lists(st.integers(0, ALPHABET - 1), min_size=0, max_size=60)
workloads = st.lists(st.tuples(token_lists, st.booleans()), min_size=1, max_size=5)
HEADER = struct.Struct(
    "<8sIIIIQQIIII"
)  # magic, version, flags, ngram, min_depth, capacity, tick, slots, live, free, recent


def feed(a: Automaton, workload: list[tuple[list[int], bool]], ref: ReferenceIndex | None = None) -> None:
    for tokens, new_seq in workload:
        a.extend(np.asarray(tokens, dtype=np.int32))
        if ref is not None:
            ref.extend(tokens)
        if new_seq:
            a.new_sequence()
            if ref is not None:
                ref.new_sequence()


def full_table(vocab: int = ALPHABET, k: int = 2) -> LogitsTable:
    table = LogitsTable(vocab, k)
    ids = (np.arange(vocab * k).reshape(vocab, k) % vocab).astype(np.int32)
    probs = np.tile(np.array([0.6, 0.3][:k], dtype=np.float32), (vocab, 1))
    table.update(np.arange(vocab, dtype=np.int32), ids, probs)
    return table


def observe(a: Automaton, table: LogitsTable) -> tuple:
    """Everything a caller can see, computed on a copy so that the recency updates of the
    probes do not change `a`."""
    probe = Automaton.from_bytes(a.to_bytes())
    patterns = [[x] for x in range(ALPHABET)] + [[x, y] for x in range(ALPHABET) for y in range(ALPHABET)]
    out: list = [len(probe), probe.match_length, probe.ngram, probe.capacity, probe.min_depth]
    out.append([probe.count(p) for p in patterns if len(p) <= probe.ngram])
    for next_token in range(ALPHABET):
        tree = probe.retrieve(next_token, 20)
        out.append((tree.tokens.tolist(), tree.parents.tolist(), tree.cells.tolist()))
        for scored in (False, True):
            t = build_draft_tree(probe, table, next_token, 24, scored=scored)
            out.append((t.tokens.tolist(), t.parents.tolist(), t.cells.tolist()))
    return tuple(out)


def round_trips(a: Automaton, folder: Path) -> list[Automaton]:
    path = folder / "index.racer"
    a.save(path)
    return [
        Automaton.from_bytes(a.to_bytes()),
        Automaton.from_bytes(bytearray(a.to_bytes())),
        pickle.loads(pickle.dumps(a)),
        pickle.loads(pickle.dumps(a, protocol=2)),
        copy.deepcopy(a),
        Automaton.load(path),
        Automaton.load(str(path)),
    ]


@given(
    workloads, st.integers(2, 6), st.integers(0, 40), st.booleans(), st.lists(st.integers(0, ALPHABET - 1), max_size=40)
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_round_trips_preserve_everything_and_continued_behaviour(workload, ngram, extra, small, more):
    """Budgets small enough to force evictions: the copies see the same counts, retrievals and
    trees, and stay byte-identical to the original while both keep extending and evicting."""
    capacity = ngram * (ngram + 1) // 2 + extra if small else 100_000
    a = Automaton(ngram=ngram, capacity=capacity, min_depth=min(2, ngram))
    feed(a, workload)
    table = full_table()
    expected = observe(a, table)
    with tempfile.TemporaryDirectory() as folder:
        copies = round_trips(a, Path(folder))
    for b in copies:
        b.check_integrity()
        assert b.to_bytes() == a.to_bytes()
        assert observe(b, table) == expected
    b = copies[0]
    for i, t in enumerate(more):
        for x in (a, b):
            x.extend([t])
            if i % 13 == 12:
                x.new_sequence()
        assert a.retrieve(t, 10).tokens.tolist() == b.retrieve(t, 10).tokens.tolist()
        tree_a = build_draft_tree(a, table, t, 12, scored=bool(i % 2))
        tree_b = build_draft_tree(b, table, t, 12, scored=bool(i % 2))
        assert tree_a.tokens.tolist() == tree_b.tokens.tolist()
        assert tree_a.cells.tolist() == tree_b.cells.tolist()
        assert b.to_bytes() == a.to_bytes()  # same recency, same evictions, same slots
    b.check_integrity()
    assert len(b) <= capacity


@given(workloads, st.integers(2, 6), st.integers(0, ALPHABET - 1), st.integers(1, 60))
def test_a_loaded_automaton_matches_the_oracle(workload, ngram, next_token, budget):
    a = Automaton(ngram=ngram, capacity=100_000)
    ref = ReferenceIndex(ngram)
    feed(a, workload, ref)
    b = pickle.loads(pickle.dumps(a))
    for length in range(1, ngram + 1):
        for start in range(max(1, len(ref.sequences[-1]) - length + 1)):
            pattern = ref.sequences[-1][start : start + length] or [next_token]
            assert b.count(pattern) == ref.count(pattern)
    tree = b.retrieve(next_token, budget)
    allowed = ref.continuations(next_token)
    paths = tree_paths(tree.tokens, tree.parents)
    assert set(paths[1:]) <= allowed
    assert len(tree) == min(budget, len(allowed | {(next_token,)}))
    b.check_integrity()


def test_the_image_layout_and_checksum_are_as_documented():
    a = Automaton(ngram=4, capacity=12, min_depth=2)
    a.extend([1, 2, 3, 1, 2, 4, 1, 2, 3, 3, 3, 1])  # over budget: evictions happened
    image = a.to_bytes()
    magic, version, flags, ngram, min_depth, capacity, tick, slots, live, free, recent = HEADER.unpack_from(image)
    assert (magic, version, flags, ngram, min_depth, capacity) == (b"RACERIDX", 1, 0, 4, 2, 12)
    # An evicted slot is reused at once, so live nodes fill the slots with no gap.
    assert live == len(a) == 12 and slots == 1 + live and free == 0 and recent == 4 and tick > 0
    assert len(image) == HEADER.size + 4 * (recent + free) + 25 * live + 4
    assert struct.unpack_from("<4I", image, HEADER.size) == (3, 3, 3, 1)  # the recent tokens
    assert struct.unpack("<I", image[-4:])[0] == zlib.crc32(image[:-4])


def small_image() -> bytes:
    a = Automaton(ngram=3, capacity=8, min_depth=1)
    a.extend([0, 1, 2, 0, 1, 3, 0, 1])
    return a.to_bytes()


def expect_corrupt(data: bytes | bytearray, *words: str) -> CorruptFileError:
    with pytest.raises(CorruptFileError) as info:
        Automaton.from_bytes(data)
    message = str(info.value)
    assert message.startswith("data: ")
    for word in words:
        assert word in message, message
    return info.value


def test_every_truncation_is_a_corrupt_file_error():
    image = small_image()
    for cut in range(len(image)):
        expect_corrupt(image[:cut])
    expect_corrupt(image[:-1], "truncated")
    expect_corrupt(image[:30], "truncated")
    expect_corrupt(image + b"\0", "trailing")


def test_every_flipped_byte_is_a_corrupt_file_error():
    image = small_image()
    for i in range(len(image)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(image)
            damaged[i] ^= flip
            expect_corrupt(damaged)


def test_wrong_magic_future_version_empty_and_zero_filled_images():
    image = small_image()
    expect_corrupt(b"", "empty")
    expect_corrupt(bytes(len(image)), "not an automaton image")
    expect_corrupt(b"PK\x03\x04" + image[4:], "not an automaton image")
    expect_corrupt(b"RACER", "truncated")
    future = bytearray(image)
    future[8:12] = struct.pack("<I", 2)
    expect_corrupt(future, "version 2", "upgrade")
    zero = bytearray(image)
    zero[8:12] = struct.pack("<I", 0)
    expect_corrupt(zero, "version 0")
    # A zero-filled tail (a crash while writing without an atomic rename) is caught too.
    tail = bytearray(image)
    tail[len(image) // 2 :] = bytes(len(image) - len(image) // 2)
    expect_corrupt(tail, "damaged")


def reseal(image: bytearray) -> bytes:
    """An edited image with a valid checksum: what a buggy writer would produce."""
    return bytes(image[:-4]) + struct.pack("<I", zlib.crc32(image[:-4]))


def test_images_with_a_valid_checksum_are_still_checked_field_by_field():
    image = small_image()
    _, _, _, _, _, _, _, slots, _, free, recent = HEADER.unpack_from(image)
    nodes_at = HEADER.size + 4 * (recent + free)
    cases = {
        "flags": (12, struct.pack("<I", 1)),
        "configuration": (16, struct.pack("<I", 1)),  # ngram 1
        "slots": (40, struct.pack("<I", slots + 5)),
        "bad node": (nodes_at + 4, struct.pack("<I", 10_000)),  # first node's parent
        "beyond int32": (nodes_at, struct.pack("<I", 2**31)),  # first node's token
    }
    for words, (at, value) in cases.items():
        edited = bytearray(image)
        edited[at : at + len(value)] = value
        expect_corrupt(reseal(edited), words)
    loaded = 0
    for i in range(12, len(image) - 4):
        edited = bytearray(image)
        edited[i] ^= 0x01
        try:
            b = Automaton.from_bytes(reseal(edited))
        except CorruptFileError:
            continue
        b.check_integrity()  # another valid automaton (e.g. an older last use), never a broken one
        loaded += 1
    assert loaded < len(image) // 2


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.booleans())
def test_arbitrary_bytes_are_rejected_never_a_crash(data, with_magic):
    if with_magic:
        data = b"RACERIDX\x01\x00\x00\x00" + data
    with pytest.raises(CorruptFileError):
        Automaton.from_bytes(data)


def test_from_bytes_rejects_non_bytes():
    for bad in ("RACERIDX", memoryview(small_image()), None, 3):
        with pytest.raises(TypeError, match="data"):
            Automaton.from_bytes(bad)


def test_load_names_the_file_and_maps_os_errors(tmp_path: Path):
    damaged = tmp_path / "damaged.racer"
    data = bytearray(small_image())
    data[-10] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=r"damaged\.racer: is damaged: checksum") as info:
        Automaton.load(damaged)
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidArgumentError)
    empty = tmp_path / "empty.racer"
    empty.write_bytes(b"")
    with pytest.raises(CorruptFileError, match=r"empty\.racer: is empty"):
        Automaton.load(empty)
    with pytest.raises(FileNotFoundError) as missing:
        Automaton.load(tmp_path / "absent.racer")
    assert missing.value.filename == str(tmp_path / "absent.racer")
    with pytest.raises(IsADirectoryError):
        Automaton.load(tmp_path)
    with pytest.raises(NotADirectoryError):
        Automaton.load(damaged / "inside-a-file")
    with pytest.raises(TypeError, match="path"):
        Automaton.load(42)
    for error in (FileNotFoundError, IsADirectoryError):
        assert not issubclass(error, RacerError)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_an_unreadable_file_is_a_permission_error():
    folder = Path(tempfile.mkdtemp())
    try:
        folder.chmod(0o755)
        path = folder / "locked.racer"
        Automaton(ngram=3, capacity=10).save(path)
        path.chmod(0)
        if os.geteuid() != 0:
            with pytest.raises(PermissionError):
                Automaton.load(path)
            return
        # Root reads any file: a forked child (the extension already loaded) drops to nobody.
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            status = 3
            try:
                os.setgid(65534)
                os.setuid(65534)
                status = 2
                Automaton.load(path)
                status = 1
            except PermissionError as e:
                status = 0 if e.filename == str(path) else 4
            finally:
                os._exit(status)  # any other outcome keeps its failure code
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0, (
            f"child status {os.WEXITSTATUS(status)} (0 = PermissionError naming the file)"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_save_is_atomic_and_cleans_up_after_a_failure(tmp_path: Path):
    a = Automaton(ngram=3, capacity=50)
    a.extend([1, 2, 3, 1, 2])
    path = tmp_path / "index.racer"
    a.save(path)
    old = path.read_bytes()
    a.extend([4, 4, 4])
    a.save(path)  # replaces the file in one rename
    assert path.read_bytes() == a.to_bytes() != old
    with pytest.raises(FileNotFoundError) as missing:
        a.save(tmp_path / "no-folder" / "index.racer")
    assert missing.value.filename == str(tmp_path / "no-folder" / "index.racer")
    (tmp_path / "folder" / "child").mkdir(parents=True)
    with pytest.raises(OSError):  # noqa: PT011 - the errno differs by platform (EISDIR, ENOTEMPTY, EEXIST)
        a.save(tmp_path / "folder")  # a non-empty folder cannot be replaced by a file
    with pytest.raises(ValueError, match="path"):
        a.save(tmp_path / "..")
    with pytest.raises(TypeError, match="path"):
        a.save(b"\0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "index.racer"]  # no temporaries
    assert Automaton.load(path).to_bytes() == a.to_bytes()


@pytest.mark.timeout(60)
def test_saving_while_another_thread_extends_writes_consistent_images(tmp_path: Path):
    a = Automaton(ngram=5, capacity=300)
    errors: list[BaseException] = []
    done = threading.Event()

    def writer() -> None:
        rng = np.random.default_rng(0)
        try:
            while not done.is_set():
                a.extend(rng.integers(0, 20, size=100).astype(np.int32))
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for i in range(30):
            path = tmp_path / f"snapshot-{i % 3}.racer"
            a.save(path)
            b = Automaton.load(path)
            b.check_integrity()
            assert len(b) <= 300
    finally:
        done.set()
        thread.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    a.check_integrity()
