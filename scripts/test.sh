#!/usr/bin/env bash
# Installs, builds and runs the whole default test suite (soak and long fuzz
# runs, and the limits tests that need minutes, have their own labels and are
# not part of it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${SOFTVERBS_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure -j "$(nproc)" -LE 'soak|limits|fuzz-long' "$@"
