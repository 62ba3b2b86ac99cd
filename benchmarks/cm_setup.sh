#!/usr/bin/env bash
# Connection setup rate over the emulated CM: rdmacm-utils' cmtime, unmodified, as a
# server and a client process on one host (server device s@SERVER_ADDR, client
# c@CLIENT_ADDR, each through `softverbs run --`), RUNS runs of CONNS connections.
# Prints, as a Markdown table, the median over the runs of each step's figures as
# cmtime reports them (total ms for all connections, at once; max ms of one; us per
# connection), then connections per second: connected (the connect step alone)
# and set up (create id to connected: the sum of the steps before disconnect).
#
#   benchmarks/cm_setup.sh [build-dir]      (default: <repo>/build)
#
# Environment: RUNS (default 5), CONNS (default 100), SERVER_ADDR (127.0.0.20),
# CLIENT_ADDR (127.0.0.21). cmtime's server (rdma-core 44) never exits: it is
# stopped after each run. Not part of the test suite; docs/performance.md,
# "Connection setup", has its figures.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(cd "${1:-$REPO/build}" 2>/dev/null && pwd) || { echo "cm_setup.sh: no build directory ${1:-$REPO/build}" >&2; exit 2; }
LAUNCHER=$BUILD/bin/softverbs
RUNS=${RUNS:-5}
CONNS=${CONNS:-100}
S=${SERVER_ADDR:-127.0.0.20}
C=${CLIENT_ADDR:-127.0.0.21}
LOGS=$(mktemp -d /tmp/cm_setup.XXXXXX)
command -v cmtime >/dev/null || { echo "cm_setup.sh: cmtime not found (apt-get install rdmacm-utils)" >&2; exit 2; }
[[ -x $LAUNCHER ]] || { echo "cm_setup.sh: $LAUNCHER missing" >&2; exit 2; }
unset LD_PRELOAD LD_LIBRARY_PATH SOFTVERBS_DEVICES SOFTVERBS_FAULTS SOFTVERBS_PCAP SOFTVERBS_LOG

ok=0
for ((run = 1; run <= RUNS; run++)); do
  SOFTVERBS_DEVICES=s@$S SOFTVERBS_LOG=info timeout 60 "$LAUNCHER" run -- cmtime -b "$S" -c "$CONNS" >"$LOGS/server.$run" 2>&1 &
  spid=$!
  for _ in $(seq 400); do
    grep -q "device s: $S:4791" "$LOGS/server.$run" && break
    sleep 0.05
  done
  # The server listens a moment after its device exists: a rejected client is repeated.
  for _ in 1 2 3; do
    SOFTVERBS_DEVICES=c@$C timeout 60 "$LAUNCHER" run -- cmtime -s "$S" -c "$CONNS" >"$LOGS/client.$run" 2>&1 && break
    grep -q REJECTED "$LOGS/client.$run" || break
  done
  rc=$?
  kill "$spid" 2>/dev/null
  wait "$spid" 2>/dev/null
  if grep -q '^connect ' "$LOGS/client.$run"; then
    ok=$((ok + 1))
  else
    echo "cm_setup.sh: run $run failed (exit $rc); logs in $LOGS" >&2
  fi
done
((ok > 0)) || exit 1

# Each client log: "step : total_ms max_ms min_us us/conn"; the median of each over the runs.
awk -v runs="$ok" -v conns="$CONNS" '
  function median(key,   n, i, j, t, v) {
    n = split(vals[key], v, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  /^[a-z ]+: +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$/ {
    split($0, parts, ":")
    step = parts[1]; sub(/ +$/, "", step)
    n = split(parts[2], f, " ")
    if (!(step in seen)) { seen[step] = 1; order[++steps] = step }
    for (i = 1; i <= 4; i++) vals[step, i] = vals[step, i] " " f[i]
  }
  END {
    printf "cmtime, %d connections, median of %d runs\n\n", conns, runs
    print "| step | total ms | max ms | min us | us / conn |"
    print "|---|---:|---:|---:|---:|"
    for (s = 1; s <= steps; s++) {
      st = order[s]
      printf "| %s | %.2f | %.2f | %.0f | %.1f |\n", st, median(st SUBSEP 1), median(st SUBSEP 2), median(st SUBSEP 3), median(st SUBSEP 4)
      if (st != "disconnect" && st != "destroy") setup += median(st SUBSEP 1)
    }
    connect = median("connect" SUBSEP 1)
    rate_connect = connect > 0 ? conns * 1000 / connect : 0
    rate_setup = setup > 0 ? conns * 1000 / setup : 0
    printf "\nconnected: %.0f connections/s (connect step); set up: %.0f connections/s (create id to connected, %.1f ms)\n", rate_connect, rate_setup, setup
  }' "$LOGS"/client.*
rm -rf "$LOGS"
