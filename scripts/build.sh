#!/usr/bin/env bash
# Configures and builds ./build: everything (server, SDK, demo app, QML
# example, tests; benchmarks only with the `benchmarks` target), or only the
# targets named on the command line:
#   bash scripts/build.sh                      # all of it (needs scripts/deps.sh test)
#   bash scripts/build.sh imserver imdemo      # just these
# IM_BUILD_TESTS=OFF configures without the tests (what scripts/run.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${IM_BUILD_TESTS:-ON}" = "OFF" ]; then bash scripts/deps.sh run; else bash scripts/deps.sh test; fi
source scripts/ccache-env.sh
echo "== configuring build/ (tests ${IM_BUILD_TESTS:-ON})"
cmake -S . -B build "${im_build_flags[@]}" -DIM_BUILD_TESTS="${IM_BUILD_TESTS:-ON}" >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
echo "== building ${*:-everything} ($(nproc) jobs; ccache: $(ccache -s 2>/dev/null | awk '/Hits:/{print $2 " hits so far"; exit}'))"
cmake --build build -j"$(nproc)" "${targets[@]}"
