#!/usr/bin/env bash
# The main job: build, start imserver on its embedded PostgreSQL (./var) with
# the demo users and conversations, and say how to start the demo app.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
STATE_DIR="${IM_STATE_DIR:-$PWD/var}"
LISTEN="${IM_LISTEN:-127.0.0.1:8080}"
tokens=$(./build/server/imserver admin --state-dir "$STATE_DIR" demo --server "ws://$LISTEN/v1/ws")
cat <<MSG

== Demo data is ready: users ana, ben, cy; conversations ana-ben (direct) and team (group).
   Tokens: $tokens
== Start the demo app in another terminal (one window per user):
   ./build/demo-app/imdemo --server ws://$LISTEN/v1/ws --token-file $tokens --user ana
   ./build/demo-app/imdemo --server ws://$LISTEN/v1/ws --token-file $tokens --user ben
   (add --enable-faults to this script's imserver via IM_ENABLE_FAULTS=1 to use the fault panel's server faults)
== Or the QML example (import ImSdk):
   ./build/examples/qml-chat/qmlchat --token-file $tokens --user cy
== Starting imserver on $LISTEN (Ctrl-C stops it and its PostgreSQL)

MSG
exec ./build/server/imserver --state-dir "$STATE_DIR" --listen "$LISTEN"
