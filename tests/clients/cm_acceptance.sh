#!/usr/bin/env bash
# rdma_cm acceptance: the unmodified rdmacm-utils and perftest -R programs, each as a
# server and a client process through `softverbs run --`, the server on device
# s@127.0.0.20 (bound to 127.0.0.20), the client on c@127.0.0.21; then our
# librdmacm.so.1's export table against rdma-core 44's (tests/abi/rdmacm_exports.txt).
# One line per check: "PASS" or "FAIL" (with the logs' tail). Exit status 0 when
# nothing failed.
#
#   tests/clients/cm_acceptance.sh [build-dir]        (default: <repo>/build)
#
# Environment: CM_SERVER_ADDR, CM_CLIENT_ADDR (defaults 127.0.0.20, 127.0.0.21),
# CM_LOGS (default: a temporary directory, removed unless something failed).
# Every program runs under a 60 s timeout; the whole script takes about 15-30 s.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "${1:-$REPO/build}" 2>/dev/null && pwd) || { echo "cm_acceptance: no build directory ${1:-$REPO/build}" >&2; exit 2; }
LAUNCHER=$BUILD/bin/softverbs
LIBRDMACM=$BUILD/lib/librdmacm.so.1
EXPORTS=$REPO/tests/abi/rdmacm_exports.txt
S=${CM_SERVER_ADDR:-127.0.0.20}
C=${CM_CLIENT_ADDR:-127.0.0.21}
LIMIT=60      # seconds, per process
ATTEMPTS=10   # runs of a pair whose client came before the server listened
LOGS=${CM_LOGS:-$(mktemp -d /tmp/cm_acceptance.XXXXXX)}
mkdir -p "$LOGS"
FAILED=0

for f in "$LAUNCHER" "$LIBRDMACM" "$EXPORTS"; do
  [[ -e $f ]] || { echo "cm_acceptance: $f missing" >&2; exit 2; }
done
for p in rping ucmatose udaddy rdma_server rdma_client cmtime rstream riostream udpong mckey ib_send_bw ib_write_lat objdump; do
  command -v "$p" >/dev/null || { echo "cm_acceptance: $p not found (apt-get install rdmacm-utils perftest binutils)" >&2; exit 2; }
done

# The children get only what `softverbs run` sets, plus the device and the log level.
unset LD_PRELOAD LD_LIBRARY_PATH SOFTVERBS_DEVICES SOFTVERBS_BACKEND SOFTVERBS_FAULTS SOFTVERBS_PCAP SOFTVERBS_LINK_LAYER

now_ms() { date +%s%3N; }

# The client was turned away because the server did not listen yet: REJ reason 8,
# or SIDR_REP status 1 for UD, in each program's words.
rejected() { grep -Eq "REJECTED|Connection refused|UNREACHABLE[;,] error:? 1\b|Unexpected CM event bl blka 8\b" "$1"; }

# Waits up to 20 s for the server's device line: the device exists, and the
# program listens a moment later.
wait_device() {
  local log=$1 pid=$2
  for _ in $(seq 400); do
    grep -q "device s: $S:4791" "$log" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# With READY set, also waits up to 20 s until that abstract socket name is listed
# in /proc/net/unix: a multicast receiver must have joined (its device announces
# the membership under that name, docs/wire.md §1.6) before the sender sends.
# With READY_UDP set (a port), waits the same way until /proc/net/udp lists it: a
# datagram rsocket's server is bound (udpong prints nothing before a client logs in).
READY=""
READY_UDP=""
wait_ready() {
  local log=$1 pid=$2
  [[ -z $READY && -z $READY_UDP ]] && return 0
  for _ in $(seq 400); do
    if [[ -n $READY ]]; then
      grep -q "$READY\$" /proc/net/unix 2>/dev/null && return 0
    else
      grep -q ":$(printf %04X "$READY_UDP") " /proc/net/udp 2>/dev/null && return 0
    fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# pair NAME MODE EXPECT_SERVER EXPECT_CLIENT -- SERVER ARGS... -- CLIENT ARGS...
#   MODE: "exit" (the server ends by itself) or "kill" (stopped once the client is done)
#   EXPECT_*: an extended regular expression the side's stdout must match ("" = none)
# A client rejected with reason 8, or a UD client answered with SIDR status 1
# (its REQ came before the server listened, as a kernel CM also answers it), is run
# again with a fresh server, at most ATTEMPTS runs: perftest -R meets this often, its
# client connecting a second time right after a handshake on the first connection
# while the server only then listens again (and perftest 4.5-0.17's own retry
# reuses the ids it has just destroyed). So is a perftest run that could not time
# the host's clock.
pair() {
  local name=$1 mode=$2 want_s=$3 want_c=$4
  shift 4
  [[ $1 == -- ]] && shift
  local -a srv=() cli=()
  while [[ $# -gt 0 && $1 != -- ]]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  local slog=$LOGS/$name.server.log clog=$LOGS/$name.client.log
  local start attempt spid src crc why=""
  start=$(now_ms)
  for ((attempt = 1; attempt <= ATTEMPTS; attempt++)); do
    SOFTVERBS_DEVICES=s@$S SOFTVERBS_LOG=info timeout -k 5 $LIMIT "$LAUNCHER" run -- "${srv[@]}" >"$slog" 2>&1 &
    spid=$!
    if ! wait_device "$slog" "$spid" || ! wait_ready "$slog" "$spid"; then
      kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
      why="the server's device s@$S never appeared"
      break
    fi
    SOFTVERBS_DEVICES=c@$C SOFTVERBS_LOG=info timeout -k 5 $LIMIT "$LAUNCHER" run -- "${cli[@]}" >"$clog" 2>&1
    crc=$?
    if [[ $mode == kill ]]; then
      kill -0 "$spid" 2>/dev/null && kill "$spid"
      wait "$spid"; src=$?
      [[ $src == 143 || $src == 124 ]] && src=0  # stopped by us, as intended
    else
      # The server ends after the client; a failed client leaves it 2 s at most,
      # a rejected one none (its server still waits for a REQ).
      if ((crc != 0)); then
        if ! rejected "$clog"; then
          for _ in $(seq 40); do kill -0 "$spid" 2>/dev/null || break; sleep 0.05; done
        fi
        kill "$spid" 2>/dev/null
      fi
      wait "$spid"; src=$?
    fi
    why=""
    ((crc == 0)) || why="client exit status $crc"
    ((src == 0)) || why="${why:+$why, }server exit status $src"
    if [[ -z $why ]]; then
      [[ -z $want_c ]] || grep -Eq "$want_c" "$clog" || why="client output lacks /$want_c/"
      [[ -z $want_s ]] || grep -Eq "$want_s" "$slog" || why="${why:+$why, }server output lacks /$want_s/"
    fi
    [[ -z $why ]] && break
    if rejected "$clog" || grep -q "Can't produce a report" "$slog" "$clog"; then
      cp "$clog" "$clog.attempt$attempt"
      # A burst of load makes several runs in a row lose: back off 0.1 s, 0.2 s, ...
      sleep "$((attempt / 10)).$((attempt % 10))"
      continue
    fi
    break
  done
  local ms=$(($(now_ms) - start))
  if [[ -z $why ]]; then
    printf 'PASS  %-18s %6d ms%s\n' "$name" "$ms" "$( ((attempt > 1)) && echo " (attempt $attempt: the client came before the server listened)")"
  else
    printf 'FAIL  %-18s %6d ms: %s\n' "$name" "$ms" "$why"
    echo "  --- server (tail of $slog)"; tail -n 8 "$slog" | sed 's/^/  /'
    echo "  --- client (tail of $clog)"; tail -n 8 "$clog" | sed 's/^/  /'
    FAILED=$((FAILED + 1))
  fi
}

echo "rdma_cm acceptance: server s@$S, client c@$C, library $LIBRDMACM"

pair rping exit 'server ping data: rdma-ping-49: ' '^ping data: rdma-ping-49: ' \
  -- rping -s -a "$S" -C 50 -v -- rping -c -a "$S" -C 50 -v
pair ucmatose exit 'return status 0' 'return status 0' \
  -- ucmatose -b "$S" -c 4 -C 20 -- ucmatose -s "$S" -c 4 -C 20
pair udaddy exit 'return status 0' 'return status 0' \
  -- udaddy -b "$S" -c 4 -C 20 -- udaddy -s "$S" -c 4 -C 20
pair rdma_server exit 'rdma_server: end 0' 'rdma_client: end 0' \
  -- rdma_server -s "$S" -- rdma_client -s "$S"
pair cmtime kill '' '^connect +: +[0-9.]+' \
  -- cmtime -b "$S" -c 20 -- cmtime -s "$S" -c 20
PERF_ROW='^[[:space:]]+[0-9]+[[:space:]]+[0-9]+([[:space:]]+[0-9.]+){3}'
pair ib_send_bw_R exit '' "$PERF_ROW" \
  -- ib_send_bw -R -d s -x 1 -- ib_send_bw -R -d c -x 1 "$S"
pair ib_write_lat_R exit '' "$PERF_ROW" \
  -- ib_write_lat -R -d s -x 1 -- ib_write_lat -R -d c -x 1 "$S"
pair ib_send_bw_R_UD exit '' "$PERF_ROW" \
  -- ib_send_bw -R -c UD -d s -x 1 -- ib_send_bw -R -c UD -d c -x 1 "$S"

XFER_ROW='^custom +4k +100 +1 '
pair rstream exit "$XFER_ROW" "$XFER_ROW" \
  -- rstream -b "$S" -S 4096 -C 100 -- rstream -s "$S" -S 4096 -C 100
pair riostream exit "$XFER_ROW" "$XFER_ROW" \
  -- riostream -b "$S" -S 4096 -C 100 -- riostream -s "$S" -S 4096 -C 100
# udpong's server answers until it is stopped; a custom run (its default suite
# repeats echoes late by over 1 ms, which a loaded host makes take minutes).
READY_UDP=7174
pair udpong kill "client login from $C" '^custom +1000 +[0-9]+' \
  -- stdbuf -oL udpong -b "$S" -- udpong -s "$S" -S 1000 -C 100
READY_UDP=""
READY="@softverbs/mcast/::ffff:239.1.1.1/$S"
pair mckey exit 'receiving data transfers' 'initiating data transfers' \
  -- mckey -m 239.1.1.1 -b "$S" -- mckey -m 239.1.1.1 -b "$C" -s
READY=""

# rdma-core 44's default-version exports (NODE NAME lines), ours from objdump -T.
ours=$LOGS/exports.ours
objdump -T "$LIBRDMACM" | awk '$0 !~ /\*UND\*/ && NF >= 7 && $(NF-1) !~ /^\(/ && $(NF-1) ~ /^RDMACM_/ {print $(NF-1), $NF}' | sort -u >"$ours"
missing=$(grep -v '^#' "$EXPORTS" | sort -u | comm -23 - "$ours")
if [[ -z $missing ]]; then
  printf 'PASS  %-18s 0 missing of %d (%s)\n' exports "$(grep -vc '^#' "$EXPORTS")" "${EXPORTS#"$REPO"/}"
else
  printf 'FAIL  %-18s missing: %s\n' exports "$(echo $missing)"
  FAILED=$((FAILED + 1))
fi


if ((FAILED)); then
  echo "rdma_cm acceptance: $FAILED failed; logs in $LOGS"
  exit 1
fi
[[ -n ${CM_LOGS:-} ]] || rm -rf "$LOGS"
echo "rdma_cm acceptance: all passed"
