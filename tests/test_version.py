"""One version: Cargo.toml's, which maturin writes into the wheel's metadata and the extension
reports as ``racer_rs.__version__``; ``racer --version`` and CHANGELOG.md agree with it.

Runs against the installed package (the CI wheel tests run it on every platform; numpy only).
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.version import Version

import racer_rs

ROOT = Path(__file__).resolve().parent.parent


def cargo_version() -> str:
    """``[package] version`` of Cargo.toml (the one place a version is written)."""
    text = (ROOT / "Cargo.toml").read_text(encoding="utf-8")
    package = text.split("[package]", 1)[1].split("\n[", 1)[0]
    match = re.search(r'^version\s*=\s*"([^"]+)"', package, re.MULTILINE)
    assert match, "Cargo.toml has no [package] version"
    return match.group(1)


def test_module_version_is_the_installed_metadata_version() -> None:
    installed = importlib.metadata.version("racer-rs")
    assert Version(racer_rs.__version__) == Version(installed)
    assert Version(installed) == Version(cargo_version())


def test_racer_version_prints_it() -> None:
    commands = [[sys.executable, "-m", "racer_rs", "--version"]]
    script = shutil.which("racer", path=str(Path(sys.executable).parent))
    if script is not None:  # the console script the wheel installs
        commands.append([script, "--version"])
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"racer (racer_rs) {racer_rs.__version__}"
    entry = next(iter(importlib.metadata.entry_points(group="console_scripts", name="racer")))
    assert entry.value == "racer_rs.cli:main"


def test_cargo_toml_is_the_only_version_source() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^dynamic\s*=\s*\[[^]]*"version"', project, re.MULTILINE), "version must stay dynamic"
    assert not re.search(r"^version\s*=", project, re.MULTILINE), "pyproject.toml must not set a version"
    python_files = (ROOT / "python" / "racer_rs").rglob("*.py")
    pinned = [p for p in python_files if re.search(r'^__version__\s*=\s*["\']', p.read_text(encoding="utf-8"), re.M)]
    assert pinned == [], f"a second version source: {pinned}"


def test_changelog_has_an_entry_for_the_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^]]+)\]", changelog, re.MULTILINE)
    assert headings[:1] == ["Unreleased"], "CHANGELOG.md starts with an Unreleased section"
    assert cargo_version() in headings, f"CHANGELOG.md has no '## [{cargo_version()}]' section"
