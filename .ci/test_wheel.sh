#!/bin/sh
# Install one built distribution (a wheel, or an sdist compiled here) into a fresh virtualenv
# with numpy and the test extra only (no torch), check that `import racer_rs` works, and run the
# numpy-only core tests listed in .ci/core_tests (the automaton's hypothesis suite among them)
# against it. POSIX sh: it also runs in Alpine (musllinux) and in Git Bash (Windows).
# Usage: .ci/test_wheel.sh DIST [PYTHON]
set -eu
cd "$(dirname "$0")/.."
dist="$1"
python="${2:-python3}"
env_dir="$(mktemp -d)"
trap 'rm -rf "$env_dir"' EXIT
"$python" -m venv "$env_dir"
py="$env_dir/bin/python"
[ -x "$py" ] || py="$env_dir/Scripts/python.exe"  # Windows
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$py" -m pip install -q "${dist}[test]"
"$py" - <<'PY'
import importlib.metadata, importlib.util, sys
import racer_rs
from racer_rs import Automaton
for heavy in ("torch", "transformers"):
    assert importlib.util.find_spec(heavy) is None, f"{heavy} is installed: not a numpy-only environment"
    assert heavy not in sys.modules
assert "site-packages" in racer_rs.__file__, racer_rs.__file__
print("racer_rs", racer_rs.__version__, "(metadata", importlib.metadata.version("racer-rs") + ") from", racer_rs.__file__)
automaton = Automaton(ngram=4, max_nodes=100)
automaton.extend([1, 2, 3, 1, 2, 4])
assert automaton.count([1, 2]) == 2
PY
# shellcheck disable=SC2046  # one path per line, no spaces
HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" "$py" -m pytest -q -p no:cacheprovider $(tr -d '\r' < .ci/core_tests)
