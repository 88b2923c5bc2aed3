#!/usr/bin/env bash
# The peer of issue 28, measured the way im_loadgen measures imserver
# (docs/benchmarks.md, "The peer (ejabberd)"): Debian's ejabberd with MUC
# rooms and mod_mam archiving them in PostgreSQL 15, 100 rooms x 5 members,
# every member online over XMPP over WebSocket (RFC 7395), N closed-loop
# senders (tests/bench/xmpp_loadgen.cpp).
#
# Usage (as root, from anywhere in the checkout):
#   tests/bench/peer/xmpp_peer.sh [--senders 16] [--warmup 3] [--window 10]
#                                 [--rooms 100] [--members 5] [--body 100]
#                                 [--sql-pool N] [--build DIR] [--keep]
#
# Everything lives in one temporary folder and goes with it (trap): a
# throwaway PostgreSQL 15 cluster (initdb, durable settings as imserver's
# embedded cluster: fsync, synchronous_commit and full_page_writes at their
# defaults, on), listening on a free loopback port; ejabberd's configuration,
# Mnesia spool, logs and Erlang cookie, started with Debian's
# /usr/sbin/ejabberdctl (as the `ejabberd` user) on another free port, never
# the system service; Erlang distribution on a fixed loopback port, no epmd.
# ejabberd and its PostgreSQL driver are installed with apt-get if missing.
# --keep leaves the folder (logs) in place; --sql-pool sets ejabberd's
# sql_pool_size (its default, 10, when not given).
set -euo pipefail

senders=16 warmup=3 window=10 rooms=100 members=5 body=100 keep=0 build=build sql_pool=
while [ $# -gt 0 ]; do
  case $1 in
    --senders) senders=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --window) window=$2; shift 2 ;;
    --rooms) rooms=$2; shift 2 ;;
    --members) members=$2; shift 2 ;;
    --body) body=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --sql-pool) sql_pool=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
  esac
done

say() { echo "$* [${SECONDS}s]"; }
cd "$(dirname "$0")/../../.."
root=$PWD
[ "$(id -u)" = 0 ] || { echo "xmpp_peer.sh: run it as root (ejabberdctl switches to the ejabberd user, initdb to postgres)" >&2; exit 2; }

# ---------------------------------------------------------------- packages
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
if ! installed ejabberd || ! installed erlang-p1-pgsql; then
  say "== installing ejabberd and its PostgreSQL driver (Debian packages)"
  # A Debian container's policy-rc.d keeps the system service from starting.
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends ejabberd erlang-p1-pgsql ||
    { apt-get update && apt-get install -y --no-install-recommends ejabberd erlang-p1-pgsql; }
fi
pgbin=/usr/lib/postgresql/15/bin
[ -x $pgbin/initdb ] || { echo "xmpp_peer.sh: no PostgreSQL 15 in $pgbin (apt-get install postgresql-15)" >&2; exit 1; }
schema=$(dpkg -L ejabberd | grep -E '/sql/pg\.sql$' | head -n1 || true)
[ -n "$schema" ] || { echo "xmpp_peer.sh: ejabberd's pg.sql not found in the package" >&2; exit 1; }

# ---------------------------------------------------------------- generator
say "== building xmpp_loadgen"
# shellcheck source=/dev/null
[ -f scripts/ccache-env.sh ] && source scripts/ccache-env.sh
cmake --build "$build" --target xmpp_loadgen > /tmp/xmpp_peer_build.$$.log 2>&1 ||
  { cat /tmp/xmpp_peer_build.$$.log; rm -f /tmp/xmpp_peer_build.$$.log; exit 1; }
rm -f /tmp/xmpp_peer_build.$$.log
case $build in /*) gen=$build ;; *) gen=$root/$build ;; esac
gen=$gen/tests/bench/xmpp_loadgen

# ---------------------------------------------------------------- the folder
tmp=$(mktemp -d /tmp/xmpp-peer.XXXXXX)
chmod 755 "$tmp"
pg=$tmp/pg ej=$tmp/ejabberd
mkdir -p "$pg/run" "$ej/logs" "$ej/spool"
chown -R postgres:postgres "$pg"
chown -R ejabberd:ejabberd "$ej"
ejabberd_job='' beam='' node=ejbench$$@localhost

free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 40000))
    grep -qi ":$(printf '%04X' "$p") " /proc/net/tcp /proc/net/tcp6 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
}

find_beam() { # the beam.smp of our node (its -sname is unique to this run)
  local p
  for p in $(pgrep -x beam.smp); do
    tr '\0' ' ' < /proc/"$p"/cmdline 2> /dev/null | grep -q -- "-sname $node " && { echo "$p"; return 0; }
  done
  return 0
}

cleanup() {
  local rc=$?
  set +e
  [ -z "$beam" ] && [ -n "$ejabberd_job" ] && beam=$(find_beam)
  if [ -n "$beam" ] && [ -d /proc/"$beam" ]; then
    kill -TERM "$beam" # init:stop(): ejabberd stops its listeners, rooms and pools
    for _ in $(seq 300); do [ -d /proc/"$beam" ] || break; sleep 0.1; done
    [ -d /proc/"$beam" ] && kill -KILL "$beam"
  fi
  [ -n "$ejabberd_job" ] && wait "$ejabberd_job" 2>/dev/null
  if [ -f "$pg/data/postmaster.pid" ]; then
    as_pg $pgbin/pg_ctl stop -w -m fast -D "$pg/data" > /dev/null
  fi
  if [ "$rc" != 0 ]; then
    echo "== failed (rc $rc); the end of the logs:" >&2
    for f in "$ej"/logs/*.log "$pg"/postgres.log; do
      [ -s "$f" ] && { echo "-- $f" >&2; tail -n 30 "$f" >&2; }
    done
  fi
  if [ "$keep" = 1 ]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
  say "== torn down"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

as_pg() { (cd "$tmp" && runuser -u postgres -- "$@"); }

# ---------------------------------------------------------------- PostgreSQL 15
pgport=$(free_port)
say "== PostgreSQL 15 in $pg, 127.0.0.1:$pgport"
as_pg $pgbin/initdb -D "$pg/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 --no-instructions \
  > "$pg/initdb.log" 2>&1 || { cat "$pg/initdb.log"; exit 1; }
cat >> "$pg/data/postgresql.conf" <<CONF

# written by xmpp_peer.sh: a throwaway cluster for the peer benchmark; the
# durability settings (fsync, synchronous_commit, full_page_writes) stay at
# their defaults, on, as in imserver's embedded cluster
listen_addresses = '127.0.0.1'
port = $pgport
unix_socket_directories = '$pg/run'
max_connections = 200
CONF
as_pg $pgbin/pg_ctl start -w -t 60 -D "$pg/data" -l "$pg/postgres.log" > /dev/null
psql_pg() { as_pg psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pgport" -U postgres "$@"; }
psql_pg -d postgres -c "CREATE DATABASE ejabberd"
psql_pg -d ejabberd -f "$schema" > /dev/null
# The users, in bulk (auth_method sql, plain passwords): u<room>-<member>.
psql_pg -d ejabberd -c "INSERT INTO users (username, password)
  SELECT 'u' || r || '-' || m, 'pw' FROM generate_series(0, $rooms - 1) r, generate_series(0, $members - 1) m"
db_url="host=127.0.0.1 port=$pgport user=postgres dbname=ejabberd"

# ---------------------------------------------------------------- ejabberd
wsport=$(free_port)
distport=$(free_port)
say "== ejabberd $(dpkg-query -W -f='${Version}' ejabberd) in $ej, ws://127.0.0.1:$wsport/ws, node $node, sql_pool_size ${sql_pool:-10 (the default)}"
cat > "$ej/ejabberd.yml" <<CONF
# written by xmpp_peer.sh: only what the benchmark uses (MUC, mod_mam on
# PostgreSQL, WebSocket, the HTTP API for the set-up), all on loopback.
hosts:
  - localhost
loglevel: warning
acme:
  auto: false
auth_method: sql
auth_password_format: plain
sql_type: pgsql
sql_server: "127.0.0.1"
sql_port: $pgport
sql_database: ejabberd
sql_username: postgres
sql_password: ""
$([ -n "$sql_pool" ] && echo "sql_pool_size: $sql_pool")
listen:
  -
    port: $wsport
    ip: "127.0.0.1"
    module: ejabberd_http
    backlog: 1024
    request_handlers:
      /ws: ejabberd_http_ws
      /api: mod_http_api
api_permissions:
  "set-up over loopback":
    from:
      - mod_http_api
    who:
      ip: 127.0.0.1/8
    what: "*"
modules:
  mod_http_api: {}
  mod_mam:
    db_type: sql
  mod_muc:
    default_room_options:
      persistent: true
      members_only: true
      mam: true
  mod_muc_admin: {}
CONF
cat > "$ej/ejabberdctl.cfg" <<CONF
# written by xmpp_peer.sh
ERLANG_NODE=$node
ERL_DIST_PORT=$distport
# The cookie is given here, so no ~/.erlang.cookie is read or written.
ERL_OPTIONS="-setcookie $(head -c 18 /dev/urandom | base64 | tr -dc A-Za-z0-9) -kernel inet_dist_use_interface {127,0,0,1}"
CONF
# ERL_INETRC points into the configuration folder: name resolution as usual.
echo '{lookup, [file, native]}.' > "$ej/inetrc"
chown -R ejabberd:ejabberd "$ej"
(
  cd "$ej"
  exec /usr/sbin/ejabberdctl --config-dir "$ej" --config "$ej/ejabberd.yml" --ctl-config "$ej/ejabberdctl.cfg" \
    --logs "$ej/logs" --spool "$ej/spool" foreground > "$ej/logs/console.log" 2>&1
) &
ejabberd_job=$!
api() { curl -s -X POST "http://127.0.0.1:$wsport/api/$1" -H 'Content-Type: application/json' -d "$2"; }
for i in $(seq 600); do
  [ "$(api status '{}' 2> /dev/null | head -c 30)" != "" ] && break
  kill -0 "$ejabberd_job" 2> /dev/null || { echo "ejabberd exited" >&2; exit 1; }
  [ "$i" = 600 ] && { echo "ejabberd did not answer in 60 s" >&2; exit 1; }
  sleep 0.1
done
beam=$(find_beam)
[ -n "$beam" ] || { echo "the beam.smp of $node not found" >&2; exit 1; }
echo "ejabberd is up: beam.smp pid $beam"

# The rooms, persistent, archived by mod_mam, with their members (affiliation
# member), through the HTTP API: one curl for all of it (keep-alive).
muc=conference.localhost
{
  for ((r = 0; r < rooms; r++)); do
    echo "url = \"http://127.0.0.1:$wsport/api/create_room_with_opts\""
    echo "data = \"{\\\"name\\\":\\\"r$r\\\",\\\"service\\\":\\\"$muc\\\",\\\"host\\\":\\\"localhost\\\",\\\"options\\\":[{\\\"name\\\":\\\"persistent\\\",\\\"value\\\":\\\"true\\\"},{\\\"name\\\":\\\"members_only\\\",\\\"value\\\":\\\"true\\\"},{\\\"name\\\":\\\"mam\\\",\\\"value\\\":\\\"true\\\"}]}\""
    echo 'header = "Content-Type: application/json"'
    printf '%s\n' 'write-out = " %{http_code}\n"'
    echo next
    for ((m = 0; m < members; m++)); do
      echo "url = \"http://127.0.0.1:$wsport/api/set_room_affiliation\""
      echo "data = \"{\\\"name\\\":\\\"r$r\\\",\\\"service\\\":\\\"$muc\\\",\\\"jid\\\":\\\"u$r-$m@localhost\\\",\\\"affiliation\\\":\\\"member\\\"}\""
      echo 'header = "Content-Type: application/json"'
      printf '%s\n' 'write-out = " %{http_code}\n"'
      echo next
    done
  done
} | sed '$d' > "$tmp/setup.curl"
t0=$(date +%s.%N)
curl -s -K "$tmp/setup.curl" > "$tmp/setup.out"
want=$((rooms * (members + 1)))
ok=$(grep -c '^0 200$' "$tmp/setup.out" || true)
if [ "$ok" != "$want" ]; then
  echo "room set-up: $ok of $want calls answered 0; the others:" >&2
  grep -v '^0 200$' "$tmp/setup.out" | sort | uniq -c | head >&2
  exit 1
fi
echo "$rooms rooms created with $members members each in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"

# ---------------------------------------------------------------- the load
say "== load"
"$gen" --port "$wsport" --db "$db_url" --server-pid "$beam" --domain localhost --muc "$muc" --password pw \
  --rooms "$rooms" --members "$members" --senders "$senders" --body "$body" --warmup "$warmup" --window "$window"
