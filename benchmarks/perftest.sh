#!/usr/bin/env bash
# Measures softverbs against this machine's limits, in one run, and writes the
# results into docs/performance.md.
#
#   benchmarks/perftest.sh [build-dir]      (default: <repo>/build)
#
# 1. perftest pairs between two processes on our libibverbs.so.1 (server in the
#    background, client to 127.0.0.1, each on its own emulated device emu0):
#    ib_write_bw / ib_send_bw / ib_read_bw at 64 KiB, ib_send_lat / ib_write_lat /
#    ib_read_lat at 8 B, and ibv_rc_pingpong; RUNS runs of each, medians kept.
# 2. engine_bench (in-process, two devices of one process), medians of RUNS.
# 3. limits_bench (memcpy, UDP loopback plain / GSO+GRO, busy-poll RTT).
# 4. The measured section of docs/performance.md (between the BEGIN/END
#    MEASURED markers) is replaced; the rest of the file is kept. Raw logs stay
#    in <build-dir>/perf-results/.
#
# Environment: RUNS (default 3), PERF_DOC (default <repo>/docs/performance.md),
# PORT_BASE (default derived from the PID), PERFTEST_PIN (default 1: perftest
# server on CPU 1, client on CPU 0; 0: unpinned). Needs perftest and ibverbs-utils
# (Debian packages), and the build's engine_bench and limits_bench
# (SOFTVERBS_BUILD_BENCHMARKS=ON). Takes 1-2 minutes and at most about 5:
# every program runs under a timeout and the perftest pairs share a time budget.
# Not part of the test suite.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(cd "${1:-$REPO/build}" 2>/dev/null && pwd) || { echo "perftest.sh: no build directory ${1:-$REPO/build}" >&2; exit 2; }
RUNS=${RUNS:-3}
DOC=${PERF_DOC:-$REPO/docs/performance.md}
PORT=${PORT_BASE:-$((20000 + ($$ % 400) * 100))}
LIB=$BUILD/lib
LOGS=$BUILD/perf-results
RUN_TIMEOUT=20       # seconds, per perftest process
# Server on CPU 1, client on CPU 0 (PERFTEST_PIN=0: let the scheduler place them).
# Both spin in ibv_poll_cq; on a busy 2-CPU machine the scheduler often put both
# on one CPU, and the "latency" became a 4 ms time slice.
SRV_PIN=() CLI_PIN=() PIN_NOTE="not pinned"
if [[ ${PERFTEST_PIN:-1} != 0 ]] && (($(nproc) >= 2)) && command -v taskset >/dev/null; then
  SRV_PIN=(taskset -c 1) CLI_PIN=(taskset -c 0) PIN_NOTE="server pinned to CPU 1, client to CPU 0"
fi
PERFTEST_BUDGET=150  # seconds for all perftest pairs; later runs are skipped

for f in "$LIB/libibverbs.so.1" "$BUILD/bin/engine_bench" "$BUILD/bin/limits_bench"; do
  [[ -e $f ]] || { echo "perftest.sh: $f missing (build with SOFTVERBS_BUILD_BENCHMARKS=ON)" >&2; exit 2; }
done
for t in ib_write_bw ib_send_bw ib_read_bw ib_send_lat ib_write_lat ib_read_lat ibv_rc_pingpong; do
  command -v "$t" >/dev/null || { echo "perftest.sh: $t not found (apt-get install perftest ibverbs-utils)" >&2; exit 2; }
done

rm -rf "$LOGS"
mkdir -p "$LOGS"
START=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
FAILURES=()

# Our library for every child; one emulated device per process (emu0 on an
# automatic 127.0.x.y address, distinct per process).
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset SOFTVERBS_DEVICES SOFTVERBS_LINK_LAYER SOFTVERBS_MTU SOFTVERBS_BACKEND SOFTVERBS_PCAP

median() {  # the median of the numbers on stdin; "n/a" when there are none
  sort -g | awk '{v[NR]=$1} END {if (NR==0) print "n/a"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'
}

wait_listen() {  # waits until something listens on TCP port $1 (at most 5 s)
  local i
  for ((i = 0; i < 100; i++)); do
    if command -v ss >/dev/null; then
      ss -Htln "sport = :$1" 2>/dev/null | grep -q . && return 0
    else
      sleep 0.3 && return 0
    fi
    sleep 0.05
  done
  return 1
}

# pair NAME RUN TOOL ARGS... : one server/client pair; the client's log is $LOGS/NAME.RUN.client
pair() {
  local name=$1 run=$2 tool=$3
  shift 3
  if (($(date +%s) - START > PERFTEST_BUDGET)); then
    FAILURES+=("$name run $run: skipped, the perftest time budget (${PERFTEST_BUDGET}s) was used up")
    return
  fi
  local port=$PORT
  PORT=$((PORT + 1))
  local srv=$LOGS/$name.$run.server cli=$LOGS/$name.$run.client
  "${SRV_PIN[@]}" timeout $RUN_TIMEOUT "$tool" "$@" -p "$port" >"$srv" 2>&1 &
  local spid=$!
  if ! wait_listen "$port"; then
    echo "server did not listen on port $port" >>"$cli"
  fi
  "${CLI_PIN[@]}" timeout $RUN_TIMEOUT "$tool" "$@" -p "$port" 127.0.0.1 >"$cli" 2>&1
  local crc=$?
  wait $spid
  local src=$?
  if ((crc != 0 || src != 0)); then
    FAILURES+=("$name run $run: client exit $crc, server exit $src (124 = timed out after ${RUN_TIMEOUT}s); logs $cli")
  fi
  printf '  %-14s run %d: client %d server %d\n' "$name" "$run" "$crc" "$src"
}

# The result line of a perftest report: the first line after the "#bytes" header.
result_line() { awk '/#bytes/ {getline; print; exit}' "$1"; }

echo "== perftest pairs ($RUNS runs each; logs in $LOGS)"
for ((r = 1; r <= RUNS; r++)); do
  pair write_bw "$r" ib_write_bw -d emu0 -x 1 -s 65536
  pair send_bw "$r" ib_send_bw -d emu0 -x 1 -s 65536
  pair read_bw "$r" ib_read_bw -d emu0 -x 1 -s 65536
  pair send_lat "$r" ib_send_lat -d emu0 -x 1 -s 8
  pair write_lat "$r" ib_write_lat -d emu0 -x 1 -s 8
  pair read_lat "$r" ib_read_lat -d emu0 -x 1 -s 8
  pair rc_pingpong "$r" ibv_rc_pingpong -d emu0 -g 1
done

# bw: column 4 is BW average in MB/sec, where perftest's MB is 2^20 bytes.
bw_gbps() { for f in "$LOGS/$1".*.client; do result_line "$f" | awk 'NF>=4 {printf "%.6f\n", $4*1048576/1e9}'; done | median; }
bw_mpps() { for f in "$LOGS/$1".*.client; do result_line "$f" | awk 'NF>=5 {print $5}'; done | median; }
# lat: t_min t_max t_typical t_avg t_stdev 99% 99.9% are columns 3..9 (µs).
lat_col() { for f in "$LOGS/$1".*.client; do result_line "$f" | awk -v c="$2" 'NF>=9 {print $c}'; done | median; }
pp_usec() { for f in "$LOGS/rc_pingpong".*.client; do awk '/usec\/iter/ {print $(NF-1)}' "$f"; done | median; }
pp_mbit() { for f in "$LOGS/rc_pingpong".*.client; do awk '/Mbit\/sec/ {print $(NF-1)}' "$f"; done | median; }

WRITE_BW=$(bw_gbps write_bw); WRITE_MPPS=$(bw_mpps write_bw)
SEND_BW=$(bw_gbps send_bw); SEND_MPPS=$(bw_mpps send_bw)
READ_BW=$(bw_gbps read_bw); READ_MPPS=$(bw_mpps read_bw)
SEND_LAT=$(lat_col send_lat 5); SEND_LAT_AVG=$(lat_col send_lat 6); SEND_LAT_MIN=$(lat_col send_lat 3); SEND_LAT_99=$(lat_col send_lat 8)
WRITE_LAT=$(lat_col write_lat 5); WRITE_LAT_AVG=$(lat_col write_lat 6); WRITE_LAT_MIN=$(lat_col write_lat 3); WRITE_LAT_99=$(lat_col write_lat 8)
READ_LAT=$(lat_col read_lat 5); READ_LAT_AVG=$(lat_col read_lat 6); READ_LAT_MIN=$(lat_col read_lat 3); READ_LAT_99=$(lat_col read_lat 8)
PP_USEC=$(pp_usec); PP_MBIT=$(pp_mbit)

echo "== engine_bench (in-process, medians of $RUNS)"
timeout 90 "$BUILD/bin/engine_bench" --benchmark_min_time=0.2 --benchmark_repetitions="$RUNS" \
  --benchmark_report_aggregates_only=true --benchmark_format=csv >"$LOGS/engine_bench.csv" 2>"$LOGS/engine_bench.err"
ERC=$?
((ERC == 0)) || FAILURES+=("engine_bench exit $ERC; see $LOGS/engine_bench.csv and engine_bench.err")
# CSV: name,iterations,real_time,cpu_time,time_unit,bytes_per_second,items_per_second,label,error_occurred,error_message,...
engine() {  # engine NAME COLUMN [AGGREGATE] : the median (or other aggregate) of benchmark NAME
  # With RUNS=1 there are no aggregates: the single run stands for the median.
  awk -F, -v n="\"$1/real_time_${3:-median}\"" -v single="\"$1/real_time\"" -v agg="${3:-median}" -v c="$2" '
    $1==n {print $c; found=1; exit}
    $1==single && agg=="median" {v=$c; have=1}
    END {if (!found && have) print v}' "$LOGS/engine_bench.csv"
}
E_ROUND=$(engine BM_RcSendRound8B/0 3); E_ROUND_PT=$(engine BM_RcSendRound8B/1 3)
E_ROUND_UNIT=$(engine BM_RcSendRound8B/0 5)
E_RATE16=$(engine BM_MsgRate64B/16 7); E_RATE64=$(engine BM_MsgRate64B/64 7)
E_RATE16_CV=$(engine BM_MsgRate64B/16 7 cv); E_RATE64_CV=$(engine BM_MsgRate64B/64 7 cv)
sizes=(64 256 1024 4096 16384 65536 262144 1048576)

echo "== limits_bench (medians of $((RUNS > 5 ? RUNS : 5)))"
timeout 60 "$BUILD/bin/limits_bench" --reps "$((RUNS > 5 ? RUNS : 5))" --seconds 0.5 >"$LOGS/limits.txt" 2>&1
LRC=$?
((LRC == 0)) || FAILURES+=("limits_bench exit $LRC; see $LOGS/limits.txt")
cat "$LOGS/limits.txt"
limit() { awk -v k="$1" '$1==k {print $2; exit}' "$LOGS/limits.txt"; }
L_M4K=$(limit memcpy_4k_gbps); L_M64K=$(limit memcpy_64k_gbps); L_M1M=$(limit memcpy_1m_gbps)
L_UDP_PPS=$(limit udp_plain_4k_mpps); L_UDP_BW=$(limit udp_plain_4k_gbps)
L_GSO_PPS=$(limit udp_gso_gro_4128_mpps); L_GSO_BW=$(limit udp_gso_gro_4128_gbps)
L_RTT=$(limit udp_busypoll_rtt_8b_us); L_HALF=$(limit udp_busypoll_half_rtt_8b_us)

# ---- the report --------------------------------------------------------------
num() { [[ $1 =~ ^-?[0-9.]+([eE][-+]?[0-9]+)?$ ]]; }
fmt() {  # fmt VALUE PRINTF-FORMAT
  if num "$1"; then awk -v v="$1" -v f="$2" 'BEGIN {printf f, v}'; else printf 'n/a'; fi
}
ratio() {  # ratio A B : A/B
  if num "$1" && num "$2" && awk -v b="$2" 'BEGIN {exit !(b != 0)}'; then awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a/b}'; else printf 'n/a'; fi
}
verdict() {  # verdict RATIO ge|le TARGET
  if ! num "$1"; then printf 'not measured'; return; fi
  if awk -v r="$1" -v op="$2" -v t="$3" 'BEGIN {exit !((op=="ge" && r>=t) || (op=="le" && r<=t))}'; then printf 'met'; else printf '**not met**'; fi
}
pct() { if num "$1"; then awk -v r="$1" 'BEGIN {printf "%.1f %%", r*100}'; else printf 'n/a'; fi; }

R_BW=$(ratio "$WRITE_BW" "$L_GSO_BW")
R_LAT=$(ratio "$SEND_LAT" "$L_HALF")
R_RATE=$(ratio "$E_RATE64" 10000000)
CPU=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
# The source tree the build was configured from, and its state.
SRC=$(awk -F= '/^CMAKE_HOME_DIRECTORY:/ {print $2; exit}' "$BUILD/CMakeCache.txt" 2>/dev/null)
SRC=${SRC:-$REPO}
COMMIT=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(git -C "$SRC" status --porcelain 2>/dev/null | awk '{print $2}' | cut -d/ -f1 | sort -u | paste -sd, -)
[[ -n $DIRTY ]] && DIRTY=" with uncommitted changes in: ${DIRTY//,/, }"

SECTION=$LOGS/section.md
{
  echo "<!-- BEGIN MEASURED: written by benchmarks/perftest.sh; edits here are overwritten -->"
  echo "## Measured"
  echo
  echo "Run of $(date -u '+%Y-%m-%d %H:%M UTC'); library built from commit \`$COMMIT\`$DIRTY; build type $(awk -F= '/^CMAKE_BUILD_TYPE:/ {print $2}' "$BUILD/CMakeCache.txt" 2>/dev/null)."
  echo "Machine: $(nproc) CPUs, \`$CPU\`, kernel \`$(uname -r)\`, load average before the run $LOAD_BEFORE, after $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Every figure is the median of $RUNS runs (limits_bench: $((RUNS > 5 ? RUNS : 5)); its per-run values are in perf-results/limits.txt)."
  if [[ ${SOFTVERBS_HOST_LINK:-unix} == udp ]]; then
    echo "perftest: two processes ($PIN_NOTE), one emulated device each, RoCEv2 over UDP loopback (SOFTVERBS_HOST_LINK=udp);"
  else
    echo "perftest: two processes ($PIN_NOTE), one emulated device each, packets over the lossless same-host path (AF_UNIX);"
  fi
  echo "bandwidth is perftest's \"BW average\" (its MB is 2^20 bytes, converted here to GB/s = 10^9 bytes/s); latency is perftest's"
  echo "t_typical (the median sample; ib_send_lat and ib_write_lat report half the round trip, ib_read_lat the whole read)."
  echo
  echo "### Targets"
  echo
  echo "| target | softverbs | limit (same run) | ratio | goal | verdict |"
  echo "|---|---|---|---|---|---|"
  echo "| inter-process RDMA WRITE bandwidth, 64 KiB (ib_write_bw) vs UDP GSO+GRO loopback | $(fmt "$WRITE_BW" '%.3f') GB/s | $(fmt "$L_GSO_BW" '%.3f') GB/s | $(pct "$R_BW") | ≥ 80 % | $(verdict "$R_BW" ge 0.8) |"
  echo "| 8-byte SEND latency (ib_send_lat t_typical) vs UDP busy-poll half round trip | $(fmt "$SEND_LAT" '%.2f') µs | $(fmt "$L_HALF" '%.2f') µs | $(fmt "$R_LAT" '%.2f') × | ≤ 1.5 × | $(verdict "$R_LAT" le 1.5) |"
  echo "| in-process 64-byte message rate (engine_bench, window 64) vs 10 M/s | $(fmt "$E_RATE64" '%.0f') msg/s | 10 000 000 msg/s | $(pct "$R_RATE") | ≥ 100 % | $(verdict "$R_RATE" ge 1) |"
  echo
  echo "### Inter-process (perftest on softverbs)"
  echo
  echo "| test | size | result | also |"
  echo "|---|---|---|---|"
  echo "| ib_write_bw | 64 KiB | $(fmt "$WRITE_BW" '%.3f') GB/s | $(fmt "$WRITE_MPPS" '%.4f') M msg/s; $(pct "$(ratio "$WRITE_BW" "$L_GSO_BW")") of GSO+GRO, $(pct "$(ratio "$WRITE_BW" "$L_UDP_BW")") of plain UDP |"
  echo "| ib_send_bw | 64 KiB | $(fmt "$SEND_BW" '%.3f') GB/s | $(fmt "$SEND_MPPS" '%.4f') M msg/s |"
  echo "| ib_read_bw | 64 KiB | $(fmt "$READ_BW" '%.3f') GB/s | $(fmt "$READ_MPPS" '%.4f') M msg/s |"
  echo "| ib_send_lat | 8 B | $(fmt "$SEND_LAT" '%.2f') µs typical | min $(fmt "$SEND_LAT_MIN" '%.2f'), avg $(fmt "$SEND_LAT_AVG" '%.2f'), 99 % $(fmt "$SEND_LAT_99" '%.2f') µs |"
  echo "| ib_write_lat | 8 B | $(fmt "$WRITE_LAT" '%.2f') µs typical | min $(fmt "$WRITE_LAT_MIN" '%.2f'), avg $(fmt "$WRITE_LAT_AVG" '%.2f'), 99 % $(fmt "$WRITE_LAT_99" '%.2f') µs |"
  echo "| ib_read_lat | 8 B | $(fmt "$READ_LAT" '%.2f') µs typical | min $(fmt "$READ_LAT_MIN" '%.2f'), avg $(fmt "$READ_LAT_AVG" '%.2f'), 99 % $(fmt "$READ_LAT_99" '%.2f') µs; $(fmt "$(ratio "$READ_LAT" "$L_RTT")" '%.2f') × the UDP busy-poll RTT |"
  echo "| ibv_rc_pingpong | 4096 B, 1000 iters | $(fmt "$PP_USEC" '%.2f') µs/iter | $(fmt "$PP_MBIT" '%.2f') Mbit/s |"
  echo
  echo "### In-process (engine_bench: two devices of one process, one thread polling both CQs)"
  echo
  echo "| benchmark | result |"
  echo "|---|---|"
  echo "| 8-byte RC SEND round: post_send + poll until send and receive completions | $(fmt "$E_ROUND" '%.2f') $E_ROUND_UNIT |"
  echo "| the same, polling only the sender's CQ (responder on the progress thread) | $(fmt "$E_ROUND_PT" '%.2f') $E_ROUND_UNIT |"
  echo "| 64-byte SEND message rate, window 16 | $(fmt "$E_RATE16" '%.0f') msg/s (cv $(pct "$E_RATE16_CV")) |"
  echo "| 64-byte SEND message rate, window 64 | $(fmt "$E_RATE64" '%.0f') msg/s (cv $(pct "$E_RATE64_CV")) |"
  echo
  echo "| size | RDMA WRITE GB/s | RDMA READ GB/s |"
  echo "|---|---|---|"
  for s in "${sizes[@]}"; do
    w=$(engine "BM_WriteBw/$s" 6); rd=$(engine "BM_ReadBw/$s" 6)
    num "$w" && w=$(awk -v v="$w" 'BEGIN {printf "%.3f", v/1e9}')
    num "$rd" && rd=$(awk -v v="$rd" 'BEGIN {printf "%.3f", v/1e9}')
    if ((s >= 1048576)); then lbl="$((s / 1048576)) MiB"; elif ((s >= 1024)); then lbl="$((s / 1024)) KiB"; else lbl="$s B"; fi
    echo "| $lbl | ${w:-n/a} | ${rd:-n/a} |"
  done
  echo
  echo "### This machine's limits (limits_bench, same run)"
  echo
  echo "| limit | value |"
  echo "|---|---|"
  echo "| memcpy 4 KiB / 64 KiB / 1 MiB | $(fmt "$L_M4K" '%.1f') / $(fmt "$L_M64K" '%.1f') / $(fmt "$L_M1M" '%.1f') GB/s |"
  echo "| UDP loopback, plain send/recv, 4 KiB datagrams | $(fmt "$L_UDP_PPS" '%.3f') Mpps, $(fmt "$L_UDP_BW" '%.3f') GB/s |"
  echo "| UDP loopback, GSO sender + GRO receiver, 4128 B segments | $(fmt "$L_GSO_PPS" '%.3f') Mpps, $(fmt "$L_GSO_BW" '%.3f') GB/s |"
  echo "| UDP busy-poll ping-pong, 8 B, two threads pinned to CPUs 0 and 1 | RTT $(fmt "$L_RTT" '%.2f') µs (half: $(fmt "$L_HALF" '%.2f') µs) |"
  if ((${#FAILURES[@]})); then
    echo
    echo "### Failures in this run"
    echo
    for f in "${FAILURES[@]}"; do echo "- $f"; done
  fi
  echo "<!-- END MEASURED -->"
} >"$SECTION"

# Splice the section into the document, keeping everything outside the markers.
mkdir -p "$(dirname "$DOC")"
if [[ -f $DOC ]] && grep -q '^<!-- BEGIN MEASURED' "$DOC" && grep -q '^<!-- END MEASURED' "$DOC"; then
  awk -v sec="$SECTION" '
    /^<!-- BEGIN MEASURED/ {while ((getline l < sec) > 0) print l; skip=1; next}
    /^<!-- END MEASURED/ {skip=0; next}
    !skip {print}' "$DOC" >"$DOC.tmp" && mv "$DOC.tmp" "$DOC"
else
  { [[ -f $DOC ]] && cat "$DOC" && echo || printf '# Performance\n\nRun `benchmarks/perftest.sh [build-dir]` to measure.\n\n'; cat "$SECTION"; } >"$DOC.tmp" && mv "$DOC.tmp" "$DOC"
fi

echo
cat "$SECTION"
echo
echo "perftest.sh: wrote $DOC in $(($(date +%s) - START)) s"
if ((${#FAILURES[@]})); then
  printf 'perftest.sh: %d failure(s):\n' "${#FAILURES[@]}" >&2
  printf '  %s\n' "${FAILURES[@]}" >&2
  exit 1
fi
