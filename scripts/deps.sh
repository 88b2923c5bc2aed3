#!/usr/bin/env bash
# Installs what building and testing need on Debian 12, only if missing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache
  qt6-base-dev qt6-websockets-dev libqt6sql6-sqlite libgl-dev qt6-qpa-plugins
  libboost1.81-dev libboost-json1.81-dev libpqxx-dev
  postgresql libgtest-dev
  libssl-dev libjwt-dev
  openssl
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
  libnats-dev
  linux-perf
  clang
  libfuzzer-14-dev
  qt6-declarative-dev
  qt6-declarative-dev-tools
  qml6-module-qtqml-workerscript
  qml6-module-qtquick
  qml6-module-qtquick-controls
  qml6-module-qtquick-layouts
  qml6-module-qtquick-templates
  qml6-module-qtquick-window
  qml6-module-qttest
)

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
