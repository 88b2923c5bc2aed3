#!/usr/bin/env bash
# Grows the kept fuzz corpus (tests/fuzz/corpus/<target>/): fuzzes each target
# for SECONDS (default 300) from the kept corpus, the seeds and the dictionary,
# then merges (minimises) what it found into the kept corpus. Commit the result.
#   bash scripts/fuzz-corpus.sh [SECONDS] [TARGET ...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-300}"; shift || true
targets=("${@:-server_request sdk_frame}")
source scripts/ccache-env.sh
cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIM_FUZZ=ON \
    -DIM_BUILD_SERVER=OFF -DIM_BUILD_SDK=OFF -DIM_BUILD_DEMO=OFF >/dev/null
for t in ${targets[@]}; do
    cmake --build build-fuzz -j"$(nproc)" --target "fuzz_$t"
    bin="build-fuzz/tests/fuzz/fuzz_$t"
    kept="tests/fuzz/corpus/$t"
    scratch="$(mktemp -d)"
    mkdir -p "$kept"
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -dict=tests/fuzz/protocol.dict \
        "$scratch" "$kept" "build-fuzz/tests/fuzz/seeds/$t" 2>&1 | tail -2
    merged="$(mktemp -d)"
    "$bin" -merge=1 "$merged" "$kept" "$scratch" 2>&1 | tail -1
    rm -rf "$kept" && mv "$merged" "$kept"
    rm -rf "$scratch"
    echo "== $t: $(ls "$kept" | wc -l) inputs kept in $kept"
done
