#!/usr/bin/env bash
# Installs, only if missing, the Debian 12 packages one of the two jobs needs:
#   bash scripts/deps.sh run    build and run the server, the demo app and the QML example
#   bash scripts/deps.sh test   the above, plus what the tests and their stages use
# (no argument: test, i.e. everything).
set -euo pipefail

run_packages=(
  build-essential cmake ninja-build pkg-config ccache lld
  qt6-base-dev qt6-websockets-dev libqt6sql6-sqlite libgl-dev qt6-qpa-plugins
  libboost1.81-dev libboost-json1.81-dev libpqxx-dev
  postgresql
  libssl-dev libjwt-dev
  openssl
  libnats-dev
  qt6-declarative-dev
  qt6-declarative-dev-tools
  qml6-module-qtqml-workerscript
  qml6-module-qtquick
  qml6-module-qtquick-controls
  qml6-module-qtquick-layouts
  qml6-module-qtquick-templates
  qml6-module-qtquick-window
)

# The test command's own needs: GoogleTest, the packaging test (dpkg-dev,
# file, lintian, man-db, systemd for systemd-analyze), the scale-out lab
# (HAProxy, Patroni with etcd, NATS), the fuzz stage (clang, libFuzzer),
# the QML test, and perf for the benchmarks' profiles.
test_packages=(
  libgtest-dev
  python3
  dpkg-dev
  file
  lintian
  man-db
  systemd
  haproxy
  patroni
  python3-etcd
  python3-psycopg2
  etcd-server
  nats-server
  linux-perf
  clang
  libfuzzer-14-dev
  libclang-rt-14-dev
  qml6-module-qttest
)

case "${1:-test}" in
  run) packages=("${run_packages[@]}") ;;
  test) packages=("${run_packages[@]}" "${test_packages[@]}") ;;
  *) echo "usage: deps.sh [run|test]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
