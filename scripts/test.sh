#!/usr/bin/env bash
# Builds and runs every test, in stages (each builds only what it runs):
#   plain   build/        every ctest test but the benchmarks: unit, integration
#                         against real PostgreSQL clusters the tests start and
#                         remove themselves, SDK and demo-app tests (offscreen
#                         Qt), the acceptance lab with its negative controls,
#                         the scale-out lab, the packaging tests, the soak
#   bench   build/        compiles the thirteen benchmarks and runs each once, briefly
#   asan    build-asan/   ASan+UBSan (clang, -O1 -g1; the Beast-heavy files at -O0):
#                         the server's and the SDK's suites
#   tsan    build-tsan/   TSan (clang, as asan): the server suites whose threads
#                         meet: send workers and group commit, push fan-out,
#                         revocation across gateways, TLS reload
#   fuzz    build-asan/   libFuzzer with ASan+UBSan (-O1), in the ASan tree: kept
#                         regression inputs, then IM_FUZZ_SECONDS (75) per target,
#                         three at a time
# IM_TEST_STAGES (default "plain bench asan tsan fuzz") picks stages; what is
# left out is named in the summary. When both asan and tsan are selected they
# run side by side (the stage loop below says why). The fuzz stage, the only one that keeps
# both cores busy, runs last, so the background builds have the idle CPU of
# the stages before it.
#
# The asan, tsan and fuzz builds run in the background, one after another,
# at the lowest CPU priority (nice 19), from the start: they take the CPU the
# plain build and the tests leave idle (tests wait on fsyncs, sockets and
# timers), and give it back at once when a test needs it. Each of those
# stages first waits for its own build; its line in the summary says how long.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
all_stages="plain bench asan tsan fuzz"
stages="${IM_TEST_STAGES:-$all_stages}"
for s in $stages; do
    case " $all_stages " in *" $s "*) ;; *) echo "unknown stage $s (stages: $all_stages)"; exit 2 ;; esac
done
bash scripts/deps.sh test
source scripts/ccache-env.sh
export QT_QPA_PLATFORM=offscreen
jobs="$(nproc)"
status=0
logs="$(mktemp -d /tmp/imtest-logs-XXXXXX)"

# stage NAME COMMAND...: runs one stage, its output on the terminal and in
# $logs/NAME.log; its lines for the summary go to $logs/NAME.summary.
stage() {
    local name="$1"; shift
    local t0=$SECONDS
    echo "== stage $name ($(date -u +%H:%M:%S))"
    if "$@" 2>&1 | tee "$logs/$name.log"; then
        echo "$name: passed in $((SECONDS - t0)) s ($(tests_line "$name"))" > "$logs/$name.summary"
    else
        { echo "$name: FAILED after $((SECONDS - t0)) s ($(tests_line "$name"))"
          # ctest's list of failed tests, so the end of the output names them
          failed_tests "$name" | sed 's/^/    /'
        } > "$logs/$name.summary"
        return 1
    fi
}
tests_line() { # ctest's own count of what the stage ran
    grep -Eo '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$logs/$1.log" | tail -1 || true
}
failed_tests() { # the lines after ctest's "The following tests FAILED:", and a count that differs (run_ctest)
    sed -n '/The following tests FAILED:/,/^Errors while running CTest/p' "$logs/$1.log" |
        grep -E '^[[:space:]]*[0-9]+ - ' || true
    grep -E '^== ctest ran .* this stage declares' "$logs/$1.log" || true
}
# Background builds: build_<stage> for each selected stage of $bg_stages, in
# the order the stages run, in one niced job; each writes $logs/<stage>.build.log and then
# $logs/<stage>.built ("ok" or "failed", and its seconds).
bg_stages="asan tsan fuzz"
start_background_builds() {
    local todo=() s
    for s in $stages; do case " $bg_stages " in *" $s "*) todo+=("$s") ;; esac; done
    [ ${#todo[@]} -gt 0 ] || return 0
    echo "== building ${todo[*]} in the background (nice 19; logs $logs/<stage>.build.log)"
    set -m # its own process group, so cleanup (below) stops all of it
    (
        renice -n 19 -p "$BASHPID" > /dev/null # and so every compiler it starts
        for s in "${todo[@]}"; do
            t0=$SECONDS
            if "build_$s" > "$logs/$s.build.log" 2>&1; then r=ok; else r=failed; fi
            echo "$r $((SECONDS - t0))" > "$logs/$s.built.tmp" && mv "$logs/$s.built.tmp" "$logs/$s.built"
        done
    ) &
    bg_pid=$!
    set +m
}
# await_build STAGE: waits for STAGE's background build; its log on failure.
await_build() {
    local s="$1" t0=$SECONDS r secs
    echo "== waiting for the $s build ($(date -u +%H:%M:%S))"
    while [ ! -e "$logs/$s.built" ]; do
        kill -0 "$bg_pid" 2>/dev/null || { echo "the background builds stopped before $s's"; return 1; }
        sleep 1
    done
    read -r r secs < "$logs/$s.built"
    echo "== $s build: $r after $secs s in the background; waited $((SECONDS - t0)) s for it"
    if [ "$r" != ok ]; then tail -n 60 "$logs/$s.build.log"; return 1; fi
}

# run_ctest DIR N ARGS...: ctest ARGS in DIR with --no-tests=error, failing
# also unless ctest ran exactly N tests (its "... tests failed out of M"
# line). Each stage declares its N beside its call: a suite renamed out of a
# stage's -R/-L selection (or a new one that joins it) changes the count and
# fails the stage, instead of leaving it silently. When a suite is added or
# split on purpose, update the stage's number with it.
run_ctest() {
    local dir="$1" want="$2" out rc ran
    shift 2
    out="$(mktemp "$logs/ctest-XXXXXX")"
    (cd "$dir" && ctest --no-tests=error "$@") 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    ran="$(grep -Eo 'tests? failed out of [0-9]+' "$out" | tail -1 | grep -Eo '[0-9]+$' || true)"
    if [ "$ran" != "$want" ]; then
        echo "== ctest ran ${ran:-no} tests in $dir, this stage declares $want (ctest $*):" \
             "a suite left or joined the stage's selection; if that was meant, update the number in scripts/test.sh"
        return 1
    fi
    return "$rc"
}

configure_plain() {
    cmake -S . -B build "${im_build_flags[@]}" -DIM_BUILD_TESTS=ON >/dev/null
}

# Each stage chains its steps with && : inside `if` (stage), set -e is off.
plain() {
    configure_plain &&
    cmake --build build -j"$jobs" &&
    run_ctest build 59 -j"$plain_jobs" --output-on-failure --timeout 1200 -LE bench
}
# Three plain tests at a time on two cores: they wait on fsyncs, sockets and
# timers, so at -j2 both cores were 54-78 % busy (warm, once the background
# builds were done) and at -j3 84 %; the plain ctest took 326-363 s against
# 433-466 s. The CPU-heavy labs still never meet (RESOURCE_LOCK cpu_heavy).
# The sanitized suites stay at -j2: they kept both cores 93-98 % busy at -j3
# and gained 10-15 s, not worth their timing margins. IM_PLAIN_JOBS=2 is
# the previous schedule.
plain_jobs="${IM_PLAIN_JOBS:-3}"


bench() {
    configure_plain &&
    cmake --build build -j"$jobs" --target benchmarks &&
    run_ctest build 14 -j2 --output-on-failure -L bench
}

# Sanitizer builds with clang at -O1 -g1 (line tables: reports name files
# and lines), except the three files whose build is most of these trees'
# compile time and little of their tests' run time: ws_stream_tls.cpp,
# http_session.cpp (server/CMakeLists.txt) and the test harness
# (tests/CMakeLists.txt) build at -O0 (under ASan: 99, 52 and 34 s at -O1,
# 38, 23 and 14 s at -O0, of 504 s for the whole tree at -O1). The rest
# stays at -O1, since the sanitized tests spend their time in it (asan
# ctest 151 s with the whole tree at -O0; docs/acceptance.md, "Sanitizer
# stages"). The demo app is left out (its GUI test is in the plain stage).
# The fuzzers build in the ASan tree, at -O1 (tests/fuzz/CMakeLists.txt):
# the sanitizers they need are its own, and a tree of their own would
# compile the same files again.
sanitizer_flags=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 -DCMAKE_CXX_FLAGS_DEBUG=-g1 "${im_link_flags[@]}")
# A sanitizer tree that an older test.sh configured with gcc starts afresh.
clang_tree() {
    grep -qs '^CMAKE_CXX_COMPILER:.*clang' "$1/CMakeCache.txt" || rm -rf "$1/CMakeCache.txt" "$1/CMakeFiles"
}
# The fuzz stage runs its five targets three at a time, 75 s each: 300
# CPU-seconds of fuzzing in all, as five targets x 60 s two at a time did,
# in two rounds (150 s) instead of three (180 s, the last with one core
# idle). The first three get two thirds of a core each (50 CPU-s), the
# last two a core each (75 CPU-s).
fuzz_seconds="${IM_FUZZ_SECONDS:-75}"
configure_asan() {
    clang_tree build-asan &&
    cmake -S . -B build-asan "${sanitizer_flags[@]}" -DIM_SANITIZE=address,undefined -DIM_FUZZ=ON \
        -DIM_FUZZ_SECONDS="$fuzz_seconds" -DIM_BUILD_DEMO=OFF -DIM_BUILD_QML=OFF >/dev/null
}
build_asan() {
    configure_asan &&
    cmake --build build-asan -j"$jobs" --target imserver server_codec_test server_contract_test \
        server_resilience_test server_group_commit_test server_fuzz_test tst_codec tst_client_outbox tst_client_sync \
        tst_client_markers tst_client_session tst_kill tst_integration tst_obligations \
        tst_reconnect im_sdk_killhelper
}
asan() {
    await_build asan &&
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        LSAN_OPTIONS=suppressions="$root/tests/lsan.supp":print_suppressions=0 \
        run_ctest build-asan 14 -j2 --output-on-failure --timeout 1800 \
        -R '^(server_(codec|contract|resilience|group_commit|fuzz)_test|sdk\.tst_(codec|client_(outbox|sync|markers|session)|kill|integration|obligations|reconnect))$'
}

build_tsan() {
    clang_tree build-tsan &&
    cmake -S . -B build-tsan "${sanitizer_flags[@]}" -DIM_SANITIZE=thread \
        -DIM_BUILD_SDK=OFF -DIM_BUILD_DEMO=OFF >/dev/null &&
    cmake --build build-tsan -j"$jobs" --target imserver server_contract_test server_resilience_test \
        server_group_commit_test server_push_test server_safety_test server_tls_test \
        server_hardening_test server_robustness_test server_ephemeral_test
}
tsan() {
    await_build tsan &&
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
        run_ctest build-tsan 9 -j2 --output-on-failure --timeout 1800 \
        -R '^server_((contract|resilience|group_commit|push|safety|tls|ephemeral)_test|(hardening|robustness)_test\.revocation)$'
}

build_fuzz() {
    configure_asan &&
    cmake --build build-asan -j"$jobs" --target fuzz_server_request fuzz_sdk_frame fuzz_jwt fuzz_sdk_apply fuzz_session
}
fuzz() {
    await_build fuzz &&
    run_ctest build-asan 10 -j3 --output-on-failure -L fuzz
}

# asan and tsan run side by side when both are selected: one after the
# other, each ended with its longest suite alone on a core. Side by side
# (both builds cached) both cores stay 98-99 % busy and the two stages take
# 327 s against 212 + 163 s (README, Timings). The second starts with the
# first and waits for its own background build; its output is printed when
# it ends (it is in its log meanwhile).
stage_label() { case "$1" in asan) echo asan+ubsan ;; *) echo "$1" ;; esac; }
run_stage() { stage "$(stage_label "$1")" "$1" || status=1; }
side_pid=""
start_beside() { # STAGE: starts it in the background, output to its log only
    echo "== stage $(stage_label "$1") runs beside it from $(date -u +%H:%M:%S); its output follows when it ends (log $logs/$(stage_label "$1").log)"
    set -m # its own process group, for cleanup
    ( stage "$(stage_label "$1")" "$1" > /dev/null ) &
    side_pid=$!
    set +m
}
finish_beside() { # STAGE: waits for the stage start_beside started
    local rc=0
    wait "$side_pid" || rc=1
    side_pid=""
    echo "== stage $(stage_label "$1") (ran beside the stage before; its output:)"
    cat "$logs/$(stage_label "$1").log"
    [ $rc = 0 ] || status=1
}
cleanup() {
    [ -z "${bg_pid:-}" ] || kill -- -"$bg_pid" 2>/dev/null || true
    [ -z "$side_pid" ] || kill -- -"$side_pid" 2>/dev/null || true
}
trap cleanup EXIT

start_background_builds
ran=" "
for s in $stages; do
    case "$ran" in *" $s "*) continue ;; esac
    pair=""
    case "$s" in asan) pair=tsan ;; tsan) pair=asan ;; esac
    if [ -n "$pair" ] && [[ " $stages " == *" $pair "* ]]; then
        start_beside "$pair"
        run_stage "$s"
        finish_beside "$pair"
        ran+="$s $pair "
    else
        run_stage "$s"
        ran+="$s "
    fi
done
left_out=()
for s in $all_stages; do
    case " $stages " in *" $s "*) ;; *) left_out+=("$s") ;; esac
done
wait "${bg_pid:-}" 2>/dev/null || true
echo "== summary (total $SECONDS s; logs in $logs)"
for s in $stages; do cat "$logs/$(stage_label "$s").summary" 2>/dev/null || echo "$s: did not run"; done
if [ ${#left_out[@]} -gt 0 ]; then
    echo "left out by IM_TEST_STAGES: ${left_out[*]} (the whole proof is all of: $all_stages)"
fi
ccache -s 2>/dev/null | grep -E "Hits|Misses" | head -3 || true
exit $status
