#!/usr/bin/env bash
# Cross-request memory: racer with a shared index (racer+index, learning every finished response)
# against racer without it and SuffixDecoding (suffix), on the workloads where state carried
# across requests pays (best_of_n, multi_request), and Spec-Bench single questions with the index
# on and off (where it should cost nothing). SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct,
# bfloat16 on the CPU (each run sized to stay under ~20 minutes on a shared, busy 2-core machine;
# on a quiet one, raise --limit / --samples / --max-new-tokens). Greedy MAT is deterministic, so
# it compares methods exactly even where timing noise leaves most requests "disturbed".
#
# Usage: bash benches/bench_cross_request.sh [RUN...]   (runs: smol_best_of_n smol_multi_request
#        smol_spec_bench qwen_best_of_n qwen_multi_request qwen_spec_bench; default: all)
# Reports go to bench_out/cross_request/<run>/bench.json; the load average is printed before
# each run and recorded (at its end) in the report's config.
set -euo pipefail
out=${OUT:-bench_out/cross_request}
common=(--dtype bfloat16 --no-plots)
declare -A runs=(
  [smol_best_of_n]="--model smollm2-135m-instruct --workload best_of_n --limit 4 --samples 4 --max-new-tokens 128 --methods ar,suffix,racer,racer+index"
  [smol_multi_request]="--model smollm2-135m-instruct --workload multi_request --limit 4 --max-new-tokens 128 --methods ar,suffix,racer,racer+index"
  [smol_spec_bench]="--model smollm2-135m-instruct --workload spec_bench --limit 2 --temperature 0 --max-new-tokens 128 --methods ar,racer,racer+index"
  [qwen_best_of_n]="--model qwen2.5-coder-0.5b-instruct --workload best_of_n --limit 2 --samples 3 --max-new-tokens 64 --methods ar,suffix,racer,racer+index"
  [qwen_multi_request]="--model qwen2.5-coder-0.5b-instruct --workload multi_request --limit 2 --max-new-tokens 64 --methods ar,suffix,racer,racer+index"
  [qwen_spec_bench]="--model qwen2.5-coder-0.5b-instruct --workload spec_bench --limit 1 --temperature 0 --max-new-tokens 64 --methods ar,racer,racer+index"
)
order=(smol_best_of_n smol_multi_request smol_spec_bench qwen_best_of_n qwen_multi_request qwen_spec_bench)
for run in "${@:-${order[@]}}"; do
  # shellcheck disable=SC2086
  set -- ${runs[$run]}
  echo "== $run: racer bench $* ${common[*]} --out $out/$run"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  start=$(date +%s)
  racer bench "$@" "${common[@]}" --out "$out/$run"
  echo "== $run took $(( $(date +%s) - start )) s; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
done
