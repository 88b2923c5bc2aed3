#!/usr/bin/env bash
# Builds everything and runs every test: unit, integration against real
# PostgreSQL clusters that the tests start and remove themselves, the SDK and
# demo-app tests (offscreen Qt), and the acceptance lab.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
export QT_QPA_PLATFORM=offscreen
ctest -j2 --output-on-failure --timeout 1200
