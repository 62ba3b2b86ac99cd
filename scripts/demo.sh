#!/usr/bin/env bash
# Installs, builds, and runs unmodified rdma-core programs on emulated devices.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${SOFTVERBS_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh"
sv="$build/bin/softverbs"

echo "== softverbs run -- ibv_devices"
"$sv" run -- ibv_devices
echo
echo "== softverbs run -- ibv_devinfo -v   (two emulated devices)"
SOFTVERBS_DEVICES=2 "$sv" run -- ibv_devinfo -v
