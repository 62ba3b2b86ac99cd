#!/usr/bin/env bash
# Installs the Debian 12 packages softverbs needs to build and test, if missing.
# Usage: scripts/install-deps.sh   (as root, or with sudo available)
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build pkg-config binutils clang libclang-rt-14-dev
  # rdma-core headers (the ABI we implement; the real libraries are not linked)
  libibverbs-dev librdmacm-dev
  # libraries
  libboost-dev libisal-dev libtomlplusplus-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # unmodified RDMA programs the tests drive
  ibverbs-utils ibverbs-providers perftest rdmacm-utils python3-pyverbs
  # capture decoding
  tshark
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo -E apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
