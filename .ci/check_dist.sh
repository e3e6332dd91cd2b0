#!/usr/bin/env bash
# The distributions users install, checked here: the wheel's contents and size; the sdist built
# by maturin, checked, then compiled from source by pip in a fresh virtualenv (a Rust toolchain
# and pip, nothing else) with the numpy-only core tests run against it; twine check on both.
# Usage: .ci/check_dist.sh WHEEL   (run in a virtualenv that has maturin and twine)
set -euo pipefail
cd "$(dirname "$0")/.."
wheel="$1"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
maturin sdist --out "$out"
sdist="$(ls "$out"/racer_rs-*.tar.gz)"
python .ci/check_dist.py "$wheel" "$sdist"
python -m twine check --strict "$wheel" "$sdist"
# Compiled without the release profile's fat LTO and single codegen unit: the same code, a few
# minutes faster on CI's 2 cores (the wheels users get keep the full profile).
CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 sh .ci/test_wheel.sh "$sdist"
