"""Check built distributions: a wheel holds the package and its one extension, nothing else; an
sdist holds what a source build needs and no tests, models or build outputs.

Usage: python .ci/check_dist.py [--release] WHEEL_OR_SDIST...   (exit 1 with one line per problem)
--release: also, exactly one sdist and one wheel per wheel tag the README's Install section lists.
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from pathlib import Path

#: A wheel over this is a mistake (a debug build, a bundled model): today's is about 1 MB.
MAX_WHEEL_BYTES = 4 * 1024 * 1024
EXTENSION = re.compile(r"racer_rs/_native(\.abi3\.so|\.pyd)$")
WHEEL_FILE = re.compile(r"racer_rs/[\w/]+\.(py|pyi)$|racer_rs/py\.typed$|racer_rs-[^/]+\.dist-info/[^/]+(/[^/]+)?$")
SDIST_NEEDS = ["Cargo.toml", "Cargo.lock", "pyproject.toml", "README.md", "rust/lib.rs", "python/racer_rs/__init__.py"]
#: The repository's own top-level folders (a package may have a ``target`` subpackage, and the crate
#: its declared ``rust/benches``), caches and binaries anywhere.
SDIST_FORBIDDEN = re.compile(
    r"^(tests|target|models|benches|data|\.ci|\.github)/|(^|/)__pycache__/|\.(so|pyd|pyc|whl|gguf)$"
)


def wheel_problems(path: Path) -> list[str]:
    names = zipfile.ZipFile(path).namelist()
    problems = [f"unexpected file in the wheel: {n}" for n in names if not (WHEEL_FILE.match(n) or EXTENSION.match(n))]
    extensions = [n for n in names if EXTENSION.match(n)]
    if len(extensions) != 1:
        problems.append(f"the wheel must hold exactly one extension module, has {extensions}")
    if path.stat().st_size > MAX_WHEEL_BYTES:
        problems.append(f"the wheel is {path.stat().st_size} bytes, over {MAX_WHEEL_BYTES}")
    return problems


def sdist_problems(path: Path) -> list[str]:
    with tarfile.open(path) as archive:
        names = [n.split("/", 1)[1] for n in archive.getnames() if "/" in n]
    problems = [f"the sdist lacks {need}" for need in SDIST_NEEDS if need not in names]
    return problems + [f"unexpected file in the sdist: {n}" for n in names if SDIST_FORBIDDEN.search(n)]


def readme_wheel_tags(readme: str) -> list[str]:
    """The wheel tags of the README's Install table (rows ending in a backticked tag)."""
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\|[^|`]+\| `([a-z0-9_]+)` \|$", section, re.MULTILINE)


def release_problems(paths: list[Path]) -> list[str]:
    tags = readme_wheel_tags((Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8"))
    wheels = [p.name for p in paths if p.suffix == ".whl"]
    problems = [] if sum(p.name.endswith(".tar.gz") for p in paths) == 1 else ["not exactly one sdist"]
    for tag in tags:
        matching = [w for w in wheels if tag in w.removesuffix(".whl").rsplit("-", 1)[1].split(".")]
        if len(matching) != 1:
            problems.append(f"the README promises a {tag} wheel; built: {matching}")
    if len(wheels) != len(tags):
        problems.append(f"{len(wheels)} wheels for the README's {len(tags)} platforms")
    return problems


def main(arguments: list[str]) -> int:
    release = "--release" in arguments
    paths = [a for a in arguments if a != "--release"]
    problems = release_problems([Path(p) for p in paths]) if release else []
    for name in paths:
        path = Path(name)
        found = wheel_problems(path) if path.suffix == ".whl" else sdist_problems(path)
        problems += [f"{path.name}: {problem}" for problem in found]
        print(f"{path.name}: {path.stat().st_size / 1e6:.2f} MB, {'ok' if not found else 'FAILED'}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
