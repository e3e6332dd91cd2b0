#!/usr/bin/env bash
# Instructions per call (valgrind --tool=callgrind; repeatable on a loaded machine, unlike
# timings) of the core's calls beside SuffixDecoding's on the code stream of
# benches/bench_suffix_core.py, Python call included, and of the Rust core alone
# (rust/benches/core.rs --once). A call's count is the difference between a run with it and a
# run without any call, divided by the calls made.
#
#   benches/callgrind_core.sh [TOKENS]      (default 60000; needs valgrind and arctic-inference)
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-60000}
out=$(mktemp -d)
refs() { valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$@" 2>&1 | sed -n 's/.*I *refs: *//p' | tr -d ,; }

echo "reproduce: benches/callgrind_core.sh $tokens"
steps=$(( (tokens - 516 + 2) / 3 ))  # len(range(512, tokens - 4, 3))
base=$(refs python benches/bench_suffix_core.py --tokens "$tokens" --only none)
for call in SuffixTree.extend_ndarray Automaton.extend DraftPool.extend \
    "SuffixTree.speculate_ndarray tree" "build_draft_tree retrieval" \
    "build_draft_tree retrieval+logits" DraftPool.propose; do
    n=$(refs python benches/bench_suffix_core.py --tokens "$tokens" --only "$call")
    printf '%-36s %8d instructions per call (%d steps of 3 tokens)\n' "$call" $(( (n - base) / steps )) "$steps"
done

cargo bench --quiet --no-default-features --bench core --no-run 2>/dev/null
bench=$(ls -t target/release/deps/core-* | grep -v '\.d$' | head -1)
setup=$(refs "$bench" --once setup)
extend=$(refs "$bench" --once extend)
all=$(refs "$bench" --once steps)
rust_steps=$(( (60000 - 516 + 2) / 3 ))
echo "Rust core alone (rust/benches/core.rs, its own 60K-token stream):"
echo "  Automaton::extend   $(( (extend - setup) / rust_steps / 3 )) instructions per token"
echo "  build_draft_tree 16 $(( (all - extend) / rust_steps )) instructions per call"
rm -rf "$out"
