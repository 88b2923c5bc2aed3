#!/usr/bin/env bash
# Builds everything and runs every test, in four stages (each in its own
# build directory, the plain suite first so its result comes soonest):
#   1. build/        every test: unit, integration against real PostgreSQL
#                    clusters the tests start and remove themselves, SDK and
#                    demo-app tests (offscreen Qt), the acceptance lab with its
#                    negative controls, the 60 s invariant soak
#   2. build-fuzz/   libFuzzer (clang): request parser, SDK frame decoder, JWT parsing,
#                    kept regression inputs, then IM_FUZZ_SECONDS (60) each
#   3. build-asan/   ASan+UBSan: the server's and the SDK's test suites
#   4. build-tsan/   TSan: the server's contract, resilience and group-commit tests
# IM_TEST_STAGES (default "plain fuzz asan tsan") picks stages.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export QT_QPA_PLATFORM=offscreen
stages="${IM_TEST_STAGES:-plain fuzz asan tsan}"
jobs="$(nproc)"
status=0
summary=()

stage() { # name, then the command
    local name="$1"; shift
    local t0=$SECONDS
    echo "== stage $name"
    if "$@"; then
        summary+=("$name: passed in $((SECONDS - t0)) s")
    else
        summary+=("$name: FAILED after $((SECONDS - t0)) s")
        status=1
    fi
}

plain() {
    (cd build && ctest -j2 --output-on-failure --timeout 1200)
}

# Sanitizer builds: Debug-ish optimisation keeps reports readable and the
# build short; the demo app is left out (its GUI test is in the plain stage).
asan() {
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIM_SANITIZE=address,undefined \
        -DIM_BUILD_DEMO=OFF >/dev/null
    cmake --build build-asan -j"$jobs" --target imserver server_codec_test server_contract_test \
        server_resilience_test server_group_commit_test server_fuzz_test tst_codec tst_client tst_kill tst_integration tst_obligations \
        tst_reconnect im_sdk_killhelper
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ctest -j2 --output-on-failure --timeout 1800 \
        -R '^(server_(codec|contract|resilience|group_commit|fuzz)_test|sdk\.tst_(codec|client|kill|integration|obligations|reconnect))$')
}

tsan() {
    cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIM_SANITIZE=thread \
        -DIM_BUILD_SDK=OFF -DIM_BUILD_DEMO=OFF >/dev/null
    cmake --build build-tsan -j"$jobs" --target imserver server_contract_test server_resilience_test \
        server_group_commit_test
    (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
        ctest -j1 --output-on-failure --timeout 1800 -R '^server_(contract|resilience|group_commit)_test$')
}

fuzz() {
    cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIM_FUZZ=ON \
        -DIM_BUILD_SERVER=OFF -DIM_BUILD_SDK=OFF -DIM_BUILD_DEMO=OFF >/dev/null
    cmake --build build-fuzz -j"$jobs" --target fuzz_server_request fuzz_sdk_frame fuzz_jwt
    (cd build-fuzz && ctest -j2 --output-on-failure -L fuzz)
}

for s in $stages; do
    case "$s" in
        plain) stage plain plain ;;
        asan) stage asan+ubsan asan ;;
        tsan) stage tsan tsan ;;
        fuzz) stage fuzz fuzz ;;
        *) echo "unknown stage $s"; exit 2 ;;
    esac
done
echo "== summary (total $SECONDS s)"
printf '%s\n' "${summary[@]}"
exit $status
