#!/usr/bin/env bash
# The send-path cost of webhooks and of the rate limiter (issue 52), in
# alternated im_loadgen pairs at 16 and 64 closed-loop senders, one run:
#   workers0  --webhook-workers 0: no deliverer at all (as before webhooks)
#   idle      the default 2 webhook workers, no webhook registered
#   fast      one webhook, a receiver answering 200 at once
#   down      one webhook, the receiver refusing connections for the whole
#             window; it comes back after and the drain time is printed
#   limit-off --send-rate 0 (what test servers run)
#   limit-on  --send-rate 1000000 --send-burst 1000000: the limiter checks
#             every send and never refuses one (under the limit)
# Each pair runs its two in turn (A B, then B A in the next round), so a
# machine that gets busier or quieter during the run affects both alike.
#
#   bash tests/bench/webhook_cost.sh [BUILD_DIR]    (default build)
# WEBHOOK_COST_MODE picks how much:
#   pairs (default)  1 round of every pair at 16 and 64 senders, 10 s windows,
#                    the receiver down for a 10 s window
#   full             3 rounds, 20 s windows, and the receiver down for 10
#                    minutes (a 600 s window of its own at each size)
#   ci               what ctest's bench.webhook_cost runs: 16 senders over
#                    20 conversations, 2 s windows, the pair idle/fast and one
#                    run with the receiver down for its window (it fails only
#                    when a run fails, the durability check differs, or the
#                    backlog is not drained in order: figures this short are
#                    noise)
# WEBHOOK_COST_PAIRS (e.g. "idle:fast") runs only those pairs, WEBHOOK_COST_DOWN=0
# skips the receiver-down runs, WEBHOOK_COST_SIZES (e.g. "64") sets the sizes;
# IMSERVER_BIN picks the server (before/after comparisons of two builds);
# WEBHOOK_COST_QUIET_CONVS=N adds N conversations without traffic (im_loadgen
# --quiet-convs: a webhook's claims against many conversations, few busy).
# Prints one line per run (msg/s, ack p99) and per pair the ratio B/A.
set -euo pipefail
build="${1:-build}"
lg="${IM_LOADGEN:-$build/tests/bench/im_loadgen}"
[ -x "$lg" ] || { echo "no $lg: cmake --build $build --target im_loadgen"; exit 2; }
pairs="workers0:idle idle:fast limit-off:limit-on"
convs=100 down_pair=1
case "${WEBHOOK_COST_MODE:-pairs}" in
    pairs) rounds=1 window=10 warmup=2 down_window=10 sizes="16 64" ;;
    full) rounds=3 window=20 warmup=3 down_window=600 sizes="16 64" ;;
    ci) rounds=1 window=2 warmup=0.5 down_window=2 sizes="16" pairs="idle:fast" convs=20 down_pair=0 ;;
    *) echo "WEBHOOK_COST_MODE: pairs, full or ci"; exit 2 ;;
esac
pairs="${WEBHOOK_COST_PAIRS:-$pairs}" sizes="${WEBHOOK_COST_SIZES:-$sizes}" down_runs="${WEBHOOK_COST_DOWN:-1}"
# The deliverer's backoff ceiling for the down runs: 2 s, so the drain
# measures delivery, not the wait for the next attempt (10 min by default).
declare -A args=(
    [workers0]="--server-arg --webhook-workers --server-arg 0"
    [idle]=""
    [fast]="--webhook fast"
    [down]="--webhook down --server-arg --webhook-retry-max-ms --server-arg 2000"
    [limit-off]=""
    [limit-on]="--server-arg --send-rate --server-arg 1000000 --server-arg --send-burst --server-arg 1000000"
)
# Each run's whole output: $WEBHOOK_COST_LOGS (default a temporary directory).
logs="${WEBHOOK_COST_LOGS:-$(mktemp -d /tmp/webhook_cost.XXXXXX)}"
mkdir -p "$logs"
# A temporary directory goes when everything passed; kept (and named) otherwise.
[ -n "${WEBHOOK_COST_LOGS:-}" ] || trap '[ "$status" = 0 ] && rm -rf "$logs"' EXIT
status=0
n=0
run() { # CONFIG SENDERS WINDOW: one im_loadgen run, its figures on one line
    local out rate p99 extra cpu log db
    log="$logs/$((++n))-$1-$2.log"
    # shellcheck disable=SC2086
    out=$("$lg" --convs "$convs" ${WEBHOOK_COST_QUIET_CONVS:+--quiet-convs "$WEBHOOK_COST_QUIET_CONVS"} --members 5 --senders "$2" --skip-baselines --warmup "$warmup" --window "$3" \
        ${args[$1]} 2>&1 | tee "$log") || { echo "run $1 at $2 senders failed:"; tail -20 "$log"; status=1; return; }
    rate=$(awk '/^imserver over WebSocket/ {print $4}' <<<"$out")
    p99=$(awk '/^imserver over WebSocket/ {print $7}' <<<"$out")
    # imserver + PostgreSQL CPU per acknowledged send (ms of one core): less
    # moved by the machine's other load than msg/s is.
    cpu=$(sed -n 's/^CPU during the server window.*imserver \([0-9]*\)%, postgres \([0-9]*\)%.*/\1 \2/p' <<<"$out")
    cpu=$(awk -v r="$rate" -v c="$cpu" 'BEGIN { split(c, x, " "); if (r > 0) printf "%.3f", (x[1] + x[2]) * 10 / r; else print "?" }')
    extra=$(grep -E '^webhook \((fast|down) receiver\)' <<<"$out" || true)
    grep -q 'durability: .*equal' <<<"$out" || { echo "run $1 at $2: durability not equal"; status=1; }
    case "$extra" in *"NOT drained"*|*VIOLATED*) status=1 ;; esac
    # The database's transactions and rows read per acknowledged send (every session's).
    db=$(sed -n 's/^database during the window.*per acknowledged send: \([0-9.]*\) transactions, \([0-9.]*\) rows read.*/\1 tx, \2 rows/p' <<<"$out")
    printf '%-9s %3s senders: %7s msg/s, ack p99 %7s ms, CPU %s ms/send, %s per send%s\n' "$1" "$2" "$rate" "$p99" "$cpu" \
        "${db:-?}" "${extra:+; $extra}"
    eval "last_$(tr - _ <<<"$1")=$rate"
}
pair() { # A B SENDERS ROUND
    local a=$1 b=$2 first second
    if [ $(($4 % 2)) = 1 ]; then first=$a second=$b; else first=$b second=$a; fi
    run "$first" "$3" "$window"
    run "$second" "$3" "$window"
    local ra rb
    ra=$(eval echo "\${last_$(tr - _ <<<"$a"):-0}") rb=$(eval echo "\${last_$(tr - _ <<<"$b"):-0}")
    awk -v a="$a" -v b="$b" -v ra="$ra" -v rb="$rb" -v s="$3" \
        'BEGIN { if (ra > 0) printf "  pair %s/%s at %s senders: %.3f\n", b, a, s, rb / ra }'
}
echo "webhook_cost (${WEBHOOK_COST_MODE:-pairs}): $rounds round(s), ${window} s windows, sizes $sizes, logs $logs ($(date -u +%FT%TZ), $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?'))"
for round in $(seq 1 "$rounds"); do
    for s in $sizes; do
        for p in $pairs; do pair "${p%%:*}" "${p#*:}" "$s" "$round"; done
    done
done
# The receiver down: sends during the outage (against a run with no
# webhook of the same length), then the drain once it is back.
for s in $sizes; do
    [ "$down_runs" = 0 ] && break
    if [ "$down_pair" = 0 ]; then run down "$s" "$down_window"; continue; fi
    run idle "$s" "$down_window"
    run down "$s" "$down_window"
    awk -v ra="${last_idle:-0}" -v rb="${last_down:-0}" -v s="$s" \
        'BEGIN { if (ra > 0) printf "  pair down/idle at %s senders: %.3f\n", s, rb / ra }'
done
exit $status
