#!/usr/bin/env bash
# Installs what is missing, builds, and runs unmodified rdma-core programs on
# emulated devices: each program gets its own device with its own loopback
# address, and they talk RoCEv2 over UDP.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${SOFTVERBS_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh"
sv="$build/bin/softverbs"

# Waits (bounded) until something listens on TCP port $1 of this host.
wait_listen() {
  local hex
  hex=$(printf '%04X' "$1")
  for _ in $(seq 1 200); do
    if grep -q ":$hex 00000000:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "demo: nothing listens on port $1" >&2
  return 1
}

# Runs "$@" as a server and the same command with 127.0.0.1 as its client.
pair() {
  local port=$1
  shift
  "$sv" run -- "$@" -p "$port" > "$tmp/server.out" 2>&1 &
  local server=$!
  wait_listen "$port"
  local rc=0
  "$sv" run -- "$@" -p "$port" 127.0.0.1 || rc=$?
  wait "$server" || rc=$?
  echo "-- server side:"
  tail -n 3 "$tmp/server.out"
  return $rc
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== softverbs run -- ibv_devinfo   (one emulated device per process)"
"$sv" run -- ibv_devinfo
echo
echo "== ibv_rc_pingpong -g 1: two processes, RC over RoCEv2"
pair 18515 ibv_rc_pingpong -g 1 -n 1000
echo
echo "== ibv_ud_pingpong -g 1: two processes, UD datagrams"
pair 18517 ibv_ud_pingpong -g 1 -n 1000
echo
echo "== ib_write_bw: perftest, RDMA WRITE bandwidth between two processes"
pair 18516 ib_write_bw -d emu0 -x 1
