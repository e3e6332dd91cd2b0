#!/usr/bin/env bash
# The declared lower bounds of pyproject.toml, installed exactly and tested (not in .ci/run's
# default path: the model stage downloads torch 2.6 with its CUDA libraries, several GiB).
#
#   bash .ci/floor_versions.sh core     # numpy 1.24.0 and the test tools' floors, no torch:
#                                       # the core's tests on `pip install racer-rs` alone
#   bash .ci/floor_versions.sh models   # + torch 2.6.0, transformers 5.24.0 and the other
#                                       # extras' floors: the engine, drafters and CLI tests
#   bash .ci/floor_versions.sh          # both
#
# WHEEL=path/to/racer_rs-*.whl skips the build (else `maturin build --release` into the work dir).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
stages="${1:-core models}"

# One list of floors, read off pyproject.toml's lower bounds (pytest-timeout has no 2.0.0).
CORE_FLOORS=(numpy==1.24.0 pytest==8.0.0 hypothesis==6.100.0 pytest-timeout==2.0.1)
MODEL_FLOORS=(torch==2.6.0 transformers==5.24.0 safetensors==0.8.0 tqdm==4.60.0 gguf==0.10.0
    accelerate==1.1.0 matplotlib==3.6.0)
# The tests that need numpy only (every module here imports no torch, or skips without it).
CORE_TESTS=(tests/core tests/test_hostile_input_r2.py tests/test_argument_rules.py tests/test_errors.py
    tests/bench/test_stats.py)
# A representative part of the rest: decoding equals plain greedy, the drafters, the loading paths.
MODEL_TESTS=(tests/engine/test_generate.py tests/engine/test_verify.py tests/engine/test_generate_batch.py
    tests/drafters/test_shared_drafter.py tests/loading/test_model_loading.py tests/bench/test_api.py)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
wheel="${WHEEL:-}"
if [[ -z "$wheel" ]]; then
    maturin build --release --locked --out "$work/dist"
    wheel="$(ls "$work"/dist/racer_rs-*.whl)"
fi

python3 -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q "${CORE_FLOORS[@]}"
python -m pip install -q --no-deps "$wheel"
export HYPOTHESIS_PROFILE=ci

if [[ " $stages " == *" core "* ]]; then
    echo "== core tests on the floors, no torch: ${CORE_FLOORS[*]}"
    python - <<'PY'
import importlib.util, numpy
assert importlib.util.find_spec("torch") is None, "torch must not be installed for the core stage"
assert numpy.__version__ == "1.24.0", numpy.__version__
PY
    python -m pytest "${CORE_TESTS[@]}" -q -p no:cacheprovider -m "slow or not slow"
fi
if [[ " $stages " == *" models "* ]]; then
    echo "== model tests on the floors: ${MODEL_FLOORS[*]}"
    python -m pip install -q "${MODEL_FLOORS[@]}" "${CORE_FLOORS[@]}"
    python -m pip list 2>/dev/null | grep -Ei '^(numpy|torch|transformers|safetensors|tqdm|gguf|accelerate|matplotlib) '
    python -m pytest "${MODEL_TESTS[@]}" -q -p no:cacheprovider -m "slow or not slow"
fi
