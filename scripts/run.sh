#!/usr/bin/env bash
# The main job: install what it needs, build the server, start it on its
# embedded PostgreSQL (./var) with the demo users and conversations, build
# the demo app and the QML example while it serves, and say how to start
# them. Ctrl-C (or SIGTERM) stops imserver and its PostgreSQL.
# The tests' packages and binaries are scripts/test.sh's business.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
export IM_BUILD_TESTS=OFF
echo "== [1/3] imserver"
bash scripts/build.sh imserver
STATE_DIR="${IM_STATE_DIR:-$PWD/var}"
LISTEN="${IM_LISTEN:-127.0.0.1:8080}"
tokens=$(./build/server/imserver admin --state-dir "$STATE_DIR" demo --server "ws://$LISTEN/v1/ws")
server_flags=(--state-dir "$STATE_DIR" --listen "$LISTEN")
if [ "${IM_ENABLE_FAULTS:-}" = "1" ]; then server_flags+=(--enable-faults); fi
./build/server/imserver "${server_flags[@]}" &
server=$!
stop() { kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; }
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
healthz() { # HTTP GET /healthz with bash alone (a fresh machine may lack curl)
  exec 3<>"/dev/tcp/${LISTEN%:*}/${LISTEN##*:}" || return 1
  printf 'GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n' "$LISTEN" >&3
  local status; read -r -t 5 status <&3 || status=""
  exec 3>&-
  [[ "$status" == *" 200 "* ]]
}
until healthz 2>/dev/null; do
  kill -0 "$server" 2>/dev/null || { echo "imserver exited; see its log above" >&2; exit 1; }
  sleep 0.2
done
echo "== imserver answers on http://$LISTEN/healthz ($((SECONDS - t0)) s after the command)"
echo "== [2/3] the demo app and [3/3] the QML example, built while imserver serves"
if ! bash scripts/build.sh imdemo qmlchat; then
  echo "== building the apps failed (imserver keeps serving; Ctrl-C stops it)" >&2
fi
cat <<MSG

== Demo data is ready: users ana, ben, cy; conversations ana-ben (direct) and team (group).
   Tokens: $tokens
== imserver serves ws://$LISTEN/v1/ws ($((SECONDS - t0)) s since the command). Start the demo app in another
   terminal (one window per user):
   ./build/demo-app/imdemo --server ws://$LISTEN/v1/ws --token-file $tokens --user ana
   ./build/demo-app/imdemo --server ws://$LISTEN/v1/ws --token-file $tokens --user ben
   (IM_ENABLE_FAULTS=1 bash scripts/run.sh starts imserver with --enable-faults for the fault panel's server faults)
== Or the QML example (import ImSdk):
   ./build/examples/qml-chat/qmlchat --token-file $tokens --user cy
== Ctrl-C stops imserver and its PostgreSQL.

MSG
wait "$server"
