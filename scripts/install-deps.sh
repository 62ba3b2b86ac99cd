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
  libboost-dev libisal-dev libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # unmodified RDMA programs the tests drive
  ibverbs-utils ibverbs-providers perftest rdmacm-utils python3-pyverbs
  # a tool that reads sysfs itself (ibstat), for the launcher's sysfs view
  infiniband-diags
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

# As root apt-get runs directly; otherwise through sudo, which must keep
# DEBIAN_FRONTEND (hence --preserve-env with the variable named).
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-deps: not root and no sudo; as root run: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  as_root=(sudo --preserve-env=DEBIAN_FRONTEND)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
