"""The release workflow builds and tests exactly the wheels the README's Install section promises,
publishes them the trusted way, and every workflow pins its actions; the core test list that the
workflows run on every platform needs numpy only."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    return data


def check_dist() -> Any:
    spec = importlib.util.spec_from_file_location("check_dist", ROOT / ".ci" / "check_dist.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def matrix_tags(job: dict[str, Any]) -> list[str]:
    return [platform["tag"] for platform in job["strategy"]["matrix"]["platform"]]


def arch(tag: str) -> str:
    return "aarch64" if tag.endswith(("aarch64", "arm64")) else "x86_64"


def test_built_and_tested_wheels_are_the_ones_the_readme_promises() -> None:
    jobs = load("release.yml")["jobs"]
    promised = check_dist().readme_wheel_tags(readme())
    assert len(promised) == 7, promised  # the table parsed at all
    built, tested = matrix_tags(jobs["wheels"]), matrix_tags(jobs["test"])
    assert sorted(built) == sorted(set(built)) == sorted(promised), "release.yml builds other wheels than README lists"
    assert sorted(tested) == sorted(promised), "release.yml tests other wheels than README lists"
    assert set(jobs["test"]["strategy"]["matrix"]["python"]) >= {"3.10"}, "the abi3 floor is tested"


def test_each_wheel_is_built_for_its_tag_and_tested_on_its_platform() -> None:
    jobs = load("release.yml")["jobs"]
    for build in jobs["wheels"]["strategy"]["matrix"]["platform"]:
        tag = build["tag"]
        target = {"x86_64": ("x86_64", "x64"), "aarch64": ("aarch64",)}[arch(tag)]
        assert build["target"] in target, build
        if tag.startswith("manylinux_2_17"):
            assert build["manylinux"] == "2014", build
        elif tag.startswith("musllinux_1_2"):
            assert build["manylinux"] == "musllinux_1_2", build
        elif tag.startswith("macosx"):
            assert build["runner"].startswith("macos") and tag.startswith(f"macosx_{build['macos'].replace('.', '_')}_")
        else:
            assert tag == "win_amd64" and build["runner"].startswith("windows"), build
    for test in jobs["test"]["strategy"]["matrix"]["platform"]:
        tag, runner = test["tag"], test["runner"]
        if tag.startswith(("manylinux", "musllinux")):
            assert runner.startswith("ubuntu") and runner.endswith("-arm") == (arch(tag) == "aarch64"), test
            assert bool(test.get("alpine")) == tag.startswith("musllinux"), test
        elif tag.startswith("macosx"):
            assert runner.startswith("macos") and runner.endswith("-intel") == (arch(tag) == "x86_64"), test
        else:
            assert runner.startswith("windows"), test


def test_every_wheel_and_the_sdist_run_the_core_tests_in_a_clean_environment() -> None:
    jobs = load("release.yml")["jobs"]
    runs = lambda job: "\n".join(step.get("run", "") for step in jobs[job]["steps"])  # noqa: E731
    assert runs("test").count("sh .ci/test_wheel.sh dist/*.whl python") == 2  # native and Alpine
    assert "sh .ci/test_wheel.sh dist/*.tar.gz python" in runs("sdist")
    assert "twine check --strict dist/*" in runs("check")
    assert "check_dist.py --release dist/*" in runs("check")
    ci = load("ci.yml")["jobs"]
    assert any("bash .ci/run" in step.get("run", "") for step in ci["linux"]["steps"])
    oses = {entry["os"].split("-")[0] for entry in ci["core"]["strategy"]["matrix"]["include"]}
    assert oses == {"macos", "windows"}
    assert any("sh .ci/test_wheel.sh dist/*.whl" in step.get("run", "") for step in ci["core"]["steps"])


def test_publishing_is_trusted_attested_and_only_on_tags() -> None:
    workflow = load("release.yml")
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as True
    assert on["push"] == {"tags": ["v*"]}
    assert workflow["permissions"] == {"contents": "read"}
    publish = workflow["jobs"]["publish"]
    assert publish["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert publish["environment"]["name"] == "pypi"
    assert publish["permissions"] == {"id-token": "write", "attestations": "write"}
    assert set(publish["needs"]) == {"test", "check"}
    uses = [step.get("uses", "").split("@")[0] for step in publish["steps"]]
    assert "actions/attest-build-provenance" in uses and "pypa/gh-action-pypi-publish" in uses
    pypi = next(s for s in publish["steps"] if s.get("uses", "").startswith("pypa/gh-action-pypi-publish"))
    assert not {"password", "user"} & set(pypi.get("with", {})), "trusted publishing uses no token"
    release = workflow["jobs"]["github-release"]
    assert release["permissions"] == {"contents": "write"} and release["needs"] == "publish"


@pytest.mark.parametrize("name", ["ci.yml", "release.yml"])
def test_actions_are_pinned_to_full_commit_shas(name: str) -> None:
    text = (WORKFLOWS / name).read_text(encoding="utf-8")
    uses = re.findall(r"^\s*(?:- )?uses: (\S+)(.*)$", text, re.MULTILINE)
    assert uses
    for action, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), f"{action} is not pinned to a commit"
        assert re.fullmatch(r" # v\d+(\.\d+)*", comment), f"{action}: say its release in a comment"


def test_readme_extras_are_the_package_extras() -> None:
    section = readme().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    listed = {name for cell in re.findall(r"^\| (`[^|]+`) \|", section, re.M) for name in re.findall(r"`(\w+)`", cell)}
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    extras = pyproject.split("\n[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    assert listed == set(re.findall(r"^([\w-]+) = \[", extras, re.MULTILINE))


def test_the_core_tests_need_numpy_only() -> None:
    """Collect the core test list with torch and transformers unimportable (what the wheel
    tests on every platform run, in environments without them)."""
    paths = (ROOT / ".ci" / "core_tests").read_text(encoding="utf-8").split()
    assert paths and all((ROOT / p).exists() for p in paths)
    code = (
        "import sys, pytest\n"
        "for name in ('torch', 'transformers', 'safetensors', 'yaml'): sys.modules[name] = None\n"
        "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', *sys.argv[1:]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *paths], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"\d+ tests? collected", done.stdout), done.stdout[-500:]


def _wheel(path: Path, names: list[str]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, "x")
    return path


def _sdist(path: Path, names: list[str]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as archive:
        for name in names:
            info = tarfile.TarInfo(f"racer_rs-0.1.0/{name}")
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))
    return path


WHEEL_FILES = [
    "racer_rs/__init__.py",
    "racer_rs/engine/generation.py",
    "racer_rs/_native.pyi",
    "racer_rs/_native.abi3.so",
    "racer_rs-0.1.0.dist-info/METADATA",
    "racer_rs-0.1.0.dist-info/licenses/LICENSE",
]
SDIST_FILES = ["Cargo.toml", "Cargo.lock", "pyproject.toml", "README.md", "rust/lib.rs", "python/racer_rs/__init__.py"]


def test_check_dist_rejects_stray_files(tmp_path: Path) -> None:
    checks = check_dist()
    assert checks.wheel_problems(_wheel(tmp_path / "ok.whl", WHEEL_FILES)) == []
    assert checks.sdist_problems(_sdist(tmp_path / "ok.tar.gz", SDIST_FILES)) == []
    # A subpackage named like a build folder and the crate's declared benches belong in the sdist.
    nested = [*SDIST_FILES, "python/racer_rs/target/verifier.py", "rust/benches/core.rs"]
    assert checks.sdist_problems(_sdist(tmp_path / "nested.tar.gz", nested)) == []
    for extra in ["tests/test_core.py", "racer_rs/__pycache__/x.cpython-311.pyc", "racer_rs/libextra.so", "target/x"]:
        assert checks.wheel_problems(_wheel(tmp_path / "bad.whl", [*WHEEL_FILES, extra])), extra
    assert checks.wheel_problems(_wheel(tmp_path / "none.whl", WHEEL_FILES[:3]))  # no extension
    for extra in ["tests/test_x.py", "models/m/model.safetensors", "target/release/x", "x.so"]:
        assert checks.sdist_problems(_sdist(tmp_path / "bad.tar.gz", [*SDIST_FILES, extra])), extra
    assert checks.sdist_problems(_sdist(tmp_path / "lock.tar.gz", SDIST_FILES[:1] + SDIST_FILES[2:]))
