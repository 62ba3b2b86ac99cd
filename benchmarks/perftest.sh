#!/usr/bin/env bash
# Measures softverbs against this machine's limits, in one run, and writes the
# results into docs/performance.md.
#
#   benchmarks/perftest.sh [build-dir]      (default: <repo>/build)
#
# 1. perftest pairs between two processes on our libibverbs.so.1 (server in the
#    background, client to 127.0.0.1, each on its own emulated device emu0):
#    ib_write_bw / ib_send_bw / ib_read_bw at 64 KiB, ib_send_bw -c UD at the
#    port's MTU, ib_send_lat / ib_write_lat / ib_read_lat / ib_atomic_lat at 8 B,
#    ibv_rc_pingpong, and ib_write_bw at 64 KiB again with both processes
#    dropping 1 % of the packets they send (SOFTVERBS_FAULTS); RUNS runs of each,
#    medians kept.
# 2. engine_bench and scale_bench (in-process, two devices of one process),
#    medians of RUNS.
# 3. limits_bench (memcpy, UDP loopback plain / GSO+GRO, busy-poll RTT).
# 4. The measured section of docs/performance.md (between the BEGIN/END
#    MEASURED markers) is replaced, with a table of the targets P1-P6; the rest
#    of the file is kept. With gnuplot, plots of the scale benchmarks go to
#    docs/performance/*.svg (without it they are skipped, and the report says
#    so). Raw logs stay in <build-dir>/perf-results/.
#
# Environment: RUNS (default 3), PERF_DOC (default <repo>/docs/performance.md),
# PORT_BASE (default derived from the PID), PERFTEST_PIN (default 1: perftest
# server on CPU 1, client on CPU 0; 0: unpinned). Needs perftest, ibverbs-utils and
# python3 (Debian packages; gnuplot-nox for the plots), and the build's
# engine_bench, scale_bench and limits_bench (SOFTVERBS_BUILD_BENCHMARKS=ON). Takes
# 3-5 minutes and at most about 10: every program runs under a timeout and the
# perftest pairs share a time budget. Not part of the test suite.
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
PERFTEST_BUDGET=240  # seconds for all perftest pairs; later runs are skipped
PLOTS=$(dirname "$DOC")/performance  # the SVG plots, linked from the report

for f in "$LIB/libibverbs.so.1" "$BUILD/bin/engine_bench" "$BUILD/bin/scale_bench" "$BUILD/bin/limits_bench"; do
  [[ -e $f ]] || { echo "perftest.sh: $f missing (build with SOFTVERBS_BUILD_BENCHMARKS=ON)" >&2; exit 2; }
done
for t in ib_write_bw ib_send_bw ib_read_bw ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat ibv_rc_pingpong \
  ibv_devinfo python3; do
  command -v "$t" >/dev/null || { echo "perftest.sh: $t not found (apt-get install perftest ibverbs-utils python3)" >&2; exit 2; }
done
HAVE_GNUPLOT=1
command -v gnuplot >/dev/null || { HAVE_GNUPLOT=0; echo "perftest.sh: gnuplot not found (apt-get install gnuplot-nox): no plots this run" >&2; }

rm -rf "$LOGS"
mkdir -p "$LOGS"
START=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
# The source tree the build was configured from, and its state, before this
# run writes its report and plots into it.
SRC=$(awk -F= '/^CMAKE_HOME_DIRECTORY:/ {print $2; exit}' "$BUILD/CMakeCache.txt" 2>/dev/null)
SRC=${SRC:-$REPO}
COMMIT=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(git -C "$SRC" status --porcelain 2>/dev/null | awk '{print $2}' | cut -d/ -f1 | sort -u | paste -sd, -)
[[ -n $DIRTY ]] && DIRTY=" with uncommitted changes in: ${DIRTY//,/, }"
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

# pair NAME RUN TOOL ARGS... : one server/client pair; the client's log is $LOGS/NAME.RUN.client.
# PAIR_SRV_ENV and PAIR_CLI_ENV (arrays of VAR=value) are added to the server's
# and the client's environment.
PAIR_SRV_ENV=() PAIR_CLI_ENV=()
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
  "${SRV_PIN[@]}" env "${PAIR_SRV_ENV[@]}" timeout $RUN_TIMEOUT "$tool" "$@" -p "$port" >"$srv" 2>&1 &
  local spid=$!
  if ! wait_listen "$port"; then
    echo "server did not listen on port $port" >>"$cli"
  fi
  "${CLI_PIN[@]}" env "${PAIR_CLI_ENV[@]}" timeout $RUN_TIMEOUT "$tool" "$@" -p "$port" 127.0.0.1 >"$cli" 2>&1
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

# The port's active MTU (UD messages are at most one MTU): "4096 (5)" -> 4096.
UD_SIZE=$(ibv_devinfo -d emu0 2>/dev/null | awk '/active_mtu:/ {print $2; exit}')
[[ $UD_SIZE =~ ^[0-9]+$ ]] || UD_SIZE=4096
# P6: each process drops 1 % of the packets it sends (its own seed), so a packet
# is lost with probability 1 % whichever way it goes.
LOSS_SCENARIO=$LOGS/drop-1pct-tx.toml
printf '[[rule]]\nname = "drop-1pct-tx"\ndirection = "tx"\nprobability = 0.01\naction = "drop"\n' >"$LOSS_SCENARIO"
LOSS_ITERS=1000  # messages of the lossy run (a tail loss waits for the 67 ms ACK timeout)

echo "== perftest pairs ($RUNS runs each; logs in $LOGS)"
for ((r = 1; r <= RUNS; r++)); do
  pair write_bw "$r" ib_write_bw -d emu0 -x 1 -s 65536
  PAIR_SRV_ENV=(SOFTVERBS_FAULTS="$LOSS_SCENARIO" SOFTVERBS_FAULT_SEED=$((100 + r)))
  PAIR_CLI_ENV=(SOFTVERBS_FAULTS="$LOSS_SCENARIO" SOFTVERBS_FAULT_SEED=$((200 + r)))
  pair write_bw_loss "$r" ib_write_bw -d emu0 -x 1 -s 65536 -n "$LOSS_ITERS"
  PAIR_SRV_ENV=() PAIR_CLI_ENV=()
  pair send_bw "$r" ib_send_bw -d emu0 -x 1 -s 65536
  pair ud_send_bw "$r" ib_send_bw -d emu0 -x 1 -c UD -s "$UD_SIZE"
  pair read_bw "$r" ib_read_bw -d emu0 -x 1 -s 65536
  pair send_lat "$r" ib_send_lat -d emu0 -x 1 -s 8
  pair write_lat "$r" ib_write_lat -d emu0 -x 1 -s 8
  pair read_lat "$r" ib_read_lat -d emu0 -x 1 -s 8
  pair atomic_lat "$r" ib_atomic_lat -d emu0 -x 1
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
ATOMIC_LAT=$(lat_col atomic_lat 5); ATOMIC_LAT_AVG=$(lat_col atomic_lat 6); ATOMIC_LAT_MIN=$(lat_col atomic_lat 3); ATOMIC_LAT_99=$(lat_col atomic_lat 8)
LOSS_BW=$(bw_gbps write_bw_loss); UD_BW=$(bw_gbps ud_send_bw); UD_MPPS=$(bw_mpps ud_send_bw)
PP_USEC=$(pp_usec); PP_MBIT=$(pp_mbit)

echo "== engine_bench (in-process, medians of $RUNS)"
timeout 90 "$BUILD/bin/engine_bench" --benchmark_min_time=0.2 --benchmark_repetitions="$RUNS" \
  --benchmark_report_aggregates_only=true --benchmark_format=csv \
  --benchmark_out="$LOGS/engine_bench.json" --benchmark_out_format=json >"$LOGS/engine_bench.csv" 2>"$LOGS/engine_bench.err"
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

echo "== scale_bench (in-process, medians of $RUNS)"
timeout 240 "$BUILD/bin/scale_bench" --benchmark_min_time=0.2 --benchmark_repetitions="$RUNS" \
  --benchmark_report_aggregates_only=true --benchmark_out="$LOGS/scale_bench.json" --benchmark_out_format=json \
  >"$LOGS/scale_bench.txt" 2>"$LOGS/scale_bench.err"
SRC_RC=$?
((SRC_RC == 0)) || FAILURES+=("scale_bench exit $SRC_RC; see $LOGS/scale_bench.txt and scale_bench.err")

# Google Benchmark's JSON, flattened to "run-name aggregate key value" lines (the
# run name without /real_time and /iterations:N; aggregate "single" without
# repetitions), for awk.
flatten() {
  python3 - "$@" <<'PY'
import json, re, sys
for path in sys.argv[1:]:
    try:
        bench = json.load(open(path))["benchmarks"]
    except (OSError, ValueError, KeyError):
        continue
    for b in bench:
        name = re.sub(r"/(real_time|iterations:\d+)", "", b.get("run_name", b["name"]))
        agg = b.get("aggregate_name", "single") if b.get("run_type") == "aggregate" else "single"
        for k, v in b.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                print(name, agg, k, v)
PY
}
flatten "$LOGS/engine_bench.json" "$LOGS/scale_bench.json" >"$LOGS/bench.tsv"
bench() {  # bench NAME KEY [AGGREGATE] : the median (or other aggregate) of a benchmark's KEY
  awk -v n="$1" -v k="$2" -v agg="${3:-median}" '
    $1==n && $3==k && $2==agg {print $4; found=1; exit}
    $1==n && $3==k && $2=="single" && agg=="median" {v=$4; have=1}
    END {if (!found && have) print v}' "$LOGS/bench.tsv"
}

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
# P3: the best in-process 64-byte message rate of any engine_bench benchmark
# named *MsgRate* (the windowed one, one that batches posts and polls, or the
# batched one with a thread per QP pair, whose rate is the threads' sum); the
# table names the benchmark it took.
read -r P3_NAME P3_RATE < <(awk '$1 ~ /MsgRate/ && $3=="items_per_second" && ($2=="median" || $2=="single") {
  if ($4 > best) {best=$4; name=$1}} END {if (name != "") print name, best; else print "n/a n/a"}' "$LOGS/bench.tsv")
R_RATE=$(ratio "$P3_RATE" 10000000)
E_BATCH=$(bench BM_MsgRate64BBatch/512 items_per_second)
E_THREADS1=$(bench BM_MsgRate64BThreads/512/threads:1 items_per_second)
E_THREADS2=$(bench BM_MsgRate64BThreads/512/threads:2 items_per_second)
# P2: each latency test's 99th percentile against its typical latency.
R_P99_SEND=$(ratio "$SEND_LAT_99" "$SEND_LAT"); R_P99_WRITE=$(ratio "$WRITE_LAT_99" "$WRITE_LAT")
R_P99_READ=$(ratio "$READ_LAT_99" "$READ_LAT"); R_P99_ATOMIC=$(ratio "$ATOMIC_LAT_99" "$ATOMIC_LAT")
# P4: in-process bandwidth against memcpy of the same size; atomics against half the P3 rate.
E_W1M=$(bench BM_WriteBw/1048576 bytes_per_second); E_R1M=$(bench BM_ReadBw/1048576 bytes_per_second)
S_FADD=$(bench BM_AtomicRate/0 items_per_second); S_CAS=$(bench BM_AtomicRate/1 items_per_second)
S_UD=$(bench BM_UdSendBw bytes_per_second); S_UD_LOST=$(bench BM_UdSendBw lost)
gbs() { if num "$1"; then awk -v v="$1" 'BEGIN {printf "%.6f", v/1e9}'; else printf 'n/a'; fi; }
R_W1M=$(ratio "$(gbs "$E_W1M")" "$L_M1M"); R_R1M=$(ratio "$(gbs "$E_R1M")" "$L_M1M")
R_FADD=$(ratio "$S_FADD" 10000000); R_UD=$(ratio "$(gbs "$S_UD")" "$L_M4K")
# P5: each series against its first point; the largest deviation, as a fraction.
series() {  # series NAME-PREFIX NAME-SUFFIX KEY N... : "N value" lines
  local pre=$1 suf=$2 key=$3 n
  shift 3
  for n in "$@"; do echo "$n $(bench "$pre$n$suf" "$key")"; done
}
deviation() {  # the largest |v/v_first - 1| of "N value" lines on stdin; n/a if any value is missing
  awk 'NR==1 {ref=$2} $2 !~ /^[0-9.eE+-]+$/ {bad=1} {v[NR]=$2}
    END {if (bad || NR==0 || ref==0) {print "n/a"; exit}; m=0
      for (i=1; i<=NR; i++) {d=v[i]/ref-1; if (d<0) d=-d; if (d>m) m=d}; printf "%.4f\n", m}'
}
QPS=(1 4 16 64 256 1024) MRS=(1 10 100 1000 10000) WRS=(1 4 16 64 256 1024 4096)
series BM_QpScale/ /64 items_per_second "${QPS[@]}" >"$LOGS/qp_rate.dat"
series BM_QpScale/ /65536 bytes_per_second "${QPS[@]}" >"$LOGS/qp_bw.dat"
series BM_MrScale/ /64 items_per_second "${MRS[@]}" >"$LOGS/mr_rate.dat"
series BM_MrScale/ /65536 bytes_per_second "${MRS[@]}" >"$LOGS/mr_bw.dat"
series BM_OutstandingWr/ "" items_per_second "${WRS[@]}" >"$LOGS/wr_rate.dat"
series BM_OutstandingWr/ "" cpu_ns_per_wr "${WRS[@]}" >"$LOGS/wr_cost.dat"
D_QP_RATE=$(deviation <"$LOGS/qp_rate.dat"); D_QP_BW=$(deviation <"$LOGS/qp_bw.dat")
D_MR_RATE=$(deviation <"$LOGS/mr_rate.dat"); D_MR_BW=$(deviation <"$LOGS/mr_bw.dat")
# Outstanding WRs: from 16 on, where the window keeps both sides busy (with 1 or 4
# in flight a WR's CPU time is mostly polling for its own round trip).
D_WR_COST=$(awk '$1 >= 16' "$LOGS/wr_cost.dat" | deviation)
S_QP_HEAP=$(bench BM_IdleQpMemory heap_bytes_per_qp); S_QP_RSS=$(bench BM_IdleQpMemory rss_bytes_per_qp)
S_QP_MEM=$(awk -v a="$S_QP_HEAP" -v b="$S_QP_RSS" 'BEGIN {if (a ~ /^[0-9.eE+-]+$/ && b ~ /^[0-9.eE+-]+$/) print (a > b ? a : b); else print "n/a"}')
R_QP_MEM=$(ratio "$S_QP_MEM" 65536)
# P6: bandwidth under 1 % loss against the lossless figure of the same run.
S_LOSS0=$(bench BM_LossBw/0 bytes_per_second); S_LOSS1=$(bench BM_LossBw/1 bytes_per_second)
R_LOSS_IN=$(ratio "$S_LOSS1" "$S_LOSS0"); R_LOSS_X=$(ratio "$LOSS_BW" "$WRITE_BW")
lossctr() { fmt "$(bench BM_LossBw/1 "$1")" '%.0f'; }

# Plots (gnuplot, SVG): rate and bandwidth against QPs and MRs; rate and CPU time
# per WR against outstanding WRs.
PLOT_NOTE=""
if ((HAVE_GNUPLOT)); then
  mkdir -p "$PLOTS"
  plot2() {  # plot2 OUT TITLE XLABEL LEFT-DATA LEFT-LABEL LEFT-SCALE RIGHT-DATA RIGHT-LABEL RIGHT-SCALE
    gnuplot <<GP 2>>"$LOGS/gnuplot.err"
set terminal svg size 640,400 dynamic font "sans,11"
set output "$1"
set title "$2"
set xlabel "$3"
set logscale x
set grid
set key below
set ylabel "$5"
set y2label "$8"
set yrange [0:*]
set y2range [0:*]
set ytics nomirror
set y2tics
plot "$4" using 1:(\$2/$6) with linespoints axes x1y1 title "$5", \
     "$7" using 1:(\$2/$9) with linespoints axes x1y2 title "$8"
GP
  }
  plot2 "$PLOTS/qp_scale.svg" "In-process RDMA WRITE against QP pairs in use (round robin)" "QP pairs" \
    "$LOGS/qp_rate.dat" "64 B rate, M msg/s" 1e6 "$LOGS/qp_bw.dat" "64 KiB bandwidth, GB/s" 1e9
  plot2 "$PLOTS/mr_scale.svg" "In-process RDMA WRITE against MRs the work is spread over" "MRs per side" \
    "$LOGS/mr_rate.dat" "64 B rate, M msg/s" 1e6 "$LOGS/mr_bw.dat" "64 KiB bandwidth, GB/s" 1e9
  plot2 "$PLOTS/outstanding_wr.svg" "In-process 64 B RDMA WRITE against outstanding WRs" "outstanding WRs" \
    "$LOGS/wr_rate.dat" "rate, M msg/s" 1e6 "$LOGS/wr_cost.dat" "CPU time per WR, µs" 1e3
  [[ -s $LOGS/gnuplot.err ]] && FAILURES+=("gnuplot reported errors; see $LOGS/gnuplot.err")
else
  PLOT_NOTE="No plots in this run: gnuplot was not found (Debian package gnuplot-nox)."
fi
CPU=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)

# Table rows of the report.
p5_deviation_row() {  # p5_deviation_row WHAT DEVIATION : a P5 target row, at most 10 %
  echo "| P5 | $1: deviation | $(pct "$2") | | | ≤ 10 % | $(verdict "$2" le 0.1) |"
}
series_rows() {  # series_rows LEFT SCALE FORMAT RIGHT SCALE FORMAT N... : "| N | left/scale | right/scale |"
  # LEFT and RIGHT are series() files in $LOGS (LEFT.dat, RIGHT.dat).
  local left=$1 lscale=$2 lfmt=$3 right=$4 rscale=$5 rfmt=$6 n
  shift 6
  for n in "$@"; do
    echo "| $n | $(fmt "$(awk -v n="$n" -v s="$lscale" '$1==n {print $2/s}' "$LOGS/$left.dat")" "$lfmt") |" \
      "$(fmt "$(awk -v n="$n" -v s="$rscale" '$1==n {print $2/s}' "$LOGS/$right.dat")" "$rfmt") |"
  done
}

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
  echo "P1 inter-process bandwidth, P2 latency and its tail, P3 in-process message rate, P4 in-process bandwidth,"
  echo "P5 flat at scale, P6 bandwidth under loss: each figure against a limit measured in the same run (details in the"
  echo "tables below). A P5 deviation is the largest distance of a series from its first point (1 QP pair, 1 MR, 16 WRs"
  echo "outstanding); the P4 atomics goal, half the P3 rate, is this page's reading of \"in proportion\"."
  echo
  echo "| | target | softverbs | limit (same run) | ratio | goal | verdict |"
  echo "|---|---|---|---|---|---|---|"
  echo "| P1 | inter-process RDMA WRITE bandwidth, 64 KiB (ib_write_bw) vs UDP GSO+GRO loopback | $(fmt "$WRITE_BW" '%.3f') GB/s | $(fmt "$L_GSO_BW" '%.3f') GB/s | $(pct "$R_BW") | ≥ 80 % | $(verdict "$R_BW" ge 0.8) |"
  echo "| P2 | 8-byte SEND latency (ib_send_lat t_typical) vs UDP busy-poll half round trip | $(fmt "$SEND_LAT" '%.2f') µs | $(fmt "$L_HALF" '%.2f') µs | $(fmt "$R_LAT" '%.2f') × | ≤ 1.5 × | $(verdict "$R_LAT" le 1.5) |"
  echo "| P2 | ib_send_lat 99th percentile vs its typical | $(fmt "$SEND_LAT_99" '%.2f') µs | $(fmt "$SEND_LAT" '%.2f') µs | $(fmt "$R_P99_SEND" '%.2f') × | ≤ 3 × | $(verdict "$R_P99_SEND" le 3) |"
  echo "| P2 | ib_write_lat 99th percentile vs its typical | $(fmt "$WRITE_LAT_99" '%.2f') µs | $(fmt "$WRITE_LAT" '%.2f') µs | $(fmt "$R_P99_WRITE" '%.2f') × | ≤ 3 × | $(verdict "$R_P99_WRITE" le 3) |"
  echo "| P2 | ib_read_lat 99th percentile vs its typical | $(fmt "$READ_LAT_99" '%.2f') µs | $(fmt "$READ_LAT" '%.2f') µs | $(fmt "$R_P99_READ" '%.2f') × | ≤ 3 × | $(verdict "$R_P99_READ" le 3) |"
  echo "| P2 | ib_atomic_lat (fetch and add) 99th percentile vs its typical | $(fmt "$ATOMIC_LAT_99" '%.2f') µs | $(fmt "$ATOMIC_LAT" '%.2f') µs | $(fmt "$R_P99_ATOMIC" '%.2f') × | ≤ 3 × | $(verdict "$R_P99_ATOMIC" le 3) |"
  echo "| P3 | in-process 64-byte message rate (best of engine_bench's \`*MsgRate*\`: \`$P3_NAME\`) vs 10 M/s | $(fmt "$P3_RATE" '%.0f') msg/s | 10 000 000 msg/s | $(pct "$R_RATE") | ≥ 100 % | $(verdict "$R_RATE" ge 1) |"
  echo "| P4 | in-process RDMA WRITE bandwidth, 1 MiB (engine_bench) vs memcpy 1 MiB | $(fmt "$(gbs "$E_W1M")" '%.3f') GB/s | $(fmt "$L_M1M" '%.1f') GB/s | $(pct "$R_W1M") | ≥ 50 % | $(verdict "$R_W1M" ge 0.5) |"
  echo "| P4 | in-process RDMA READ bandwidth, 1 MiB (engine_bench) vs memcpy 1 MiB | $(fmt "$(gbs "$E_R1M")" '%.3f') GB/s | $(fmt "$L_M1M" '%.1f') GB/s | $(pct "$R_R1M") | ≥ 50 % | $(verdict "$R_R1M" ge 0.5) |"
  echo "| P4 | in-process 8-byte fetch-and-add rate (scale_bench) vs half the P3 goal | $(fmt "$S_FADD" '%.0f') ops/s | 5 000 000 ops/s | $(pct "$R_FADD") of 10 M/s | ≥ 50 % | $(verdict "$R_FADD" ge 0.5) |"
  echo "| P4 | in-process UD SEND bandwidth at the MTU, $UD_SIZE B (scale_bench) vs memcpy 4 KiB | $(fmt "$(gbs "$S_UD")" '%.3f') GB/s | $(fmt "$L_M4K" '%.1f') GB/s | $(pct "$R_UD") | ≥ 50 % | $(verdict "$R_UD" ge 0.5) |"
  p5_deviation_row "64 B RDMA WRITE rate, 1 → 1024 QP pairs" "$D_QP_RATE"
  p5_deviation_row "64 KiB RDMA WRITE bandwidth, 1 → 1024 QP pairs" "$D_QP_BW"
  p5_deviation_row "64 B RDMA WRITE rate, 1 → 10 000 MRs" "$D_MR_RATE"
  p5_deviation_row "64 KiB RDMA WRITE bandwidth, 1 → 10 000 MRs" "$D_MR_BW"
  p5_deviation_row "CPU time per 64 B WRITE, 16 → 4096 outstanding (engine_bench \`BM_OutstandingWr\`)" "$D_WR_COST"
  echo "| P5 | memory per idle connected RC QP (larger of heap and RSS growth over 1000 QPs) vs 64 KiB | $(fmt "$S_QP_MEM" '%.0f') B | 65 536 B | $(pct "$R_QP_MEM") | ≤ 100 % | $(verdict "$R_QP_MEM" le 1) |"
  echo "| P6 | in-process 64 KiB RDMA WRITE bandwidth, 1 % of packets dropped, vs lossless (scale_bench) | $(fmt "$(gbs "$S_LOSS1")" '%.3f') GB/s | $(fmt "$(gbs "$S_LOSS0")" '%.3f') GB/s | $(pct "$R_LOSS_IN") | ≥ 50 % | $(verdict "$R_LOSS_IN" ge 0.5) |"
  echo "| P6 | inter-process ib_write_bw 64 KiB, 1 % of packets dropped, vs lossless | $(fmt "$LOSS_BW" '%.3f') GB/s | $(fmt "$WRITE_BW" '%.3f') GB/s | $(pct "$R_LOSS_X") | ≥ 50 % | $(verdict "$R_LOSS_X" ge 0.5) |"
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
  echo "| ib_atomic_lat | 8 B fetch and add | $(fmt "$ATOMIC_LAT" '%.2f') µs typical | min $(fmt "$ATOMIC_LAT_MIN" '%.2f'), avg $(fmt "$ATOMIC_LAT_AVG" '%.2f'), 99 % $(fmt "$ATOMIC_LAT_99" '%.2f') µs |"
  echo "| ib_send_bw -c UD | $UD_SIZE B | $(fmt "$UD_BW" '%.3f') GB/s | $(fmt "$UD_MPPS" '%.4f') M msg/s; $(pct "$(ratio "$UD_BW" "$L_GSO_BW")") of GSO+GRO |"
  echo "| ib_write_bw, 1 % loss | 64 KiB, $LOSS_ITERS iters | $(fmt "$LOSS_BW" '%.3f') GB/s | both processes drop 1 % of the packets they send (SOFTVERBS_FAULTS, direction tx); $(pct "$R_LOSS_X") of the lossless ib_write_bw |"
  echo "| ibv_rc_pingpong | 4096 B, 1000 iters | $(fmt "$PP_USEC" '%.2f') µs/iter | $(fmt "$PP_MBIT" '%.2f') Mbit/s |"
  echo
  echo "### In-process (engine_bench: two devices of one process, one thread polling both CQs unless a row says otherwise)"
  echo
  echo "| benchmark | result |"
  echo "|---|---|"
  echo "| 8-byte RC SEND round: post_send + poll until send and receive completions | $(fmt "$E_ROUND" '%.2f') $E_ROUND_UNIT |"
  echo "| the same, polling only the sender's CQ (responder on the progress thread) | $(fmt "$E_ROUND_PT" '%.2f') $E_ROUND_UNIT |"
  echo "| 64-byte SEND message rate, window 16 | $(fmt "$E_RATE16" '%.0f') msg/s (cv $(pct "$E_RATE16_CV")) |"
  echo "| 64-byte SEND message rate, window 64 | $(fmt "$E_RATE64" '%.0f') msg/s (cv $(pct "$E_RATE64_CV")) |"
  echo "| the same batched (lists of 32 per post and poll), window 512 | $(fmt "$E_BATCH" '%.0f') msg/s |"
  echo "| the same, 1 thread driving a QP pair of its own | $(fmt "$E_THREADS1" '%.0f') msg/s |"
  echo "| the same, 2 threads, a QP pair each (sum of both) | $(fmt "$E_THREADS2" '%.0f') msg/s |"
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
  echo "### In-process at scale (scale_bench)"
  echo
  echo "RDMA WRITEs, every one signaled, 64 outstanding in all for 64 B and 32 for 64 KiB; QPs: posted round robin over"
  echo "the pairs (one CQ per side); MRs: the k-th WR uses local and remote MR k mod N (64 KiB each)."
  echo
  echo "| QP pairs | 64 B M msg/s | 64 KiB GB/s |"
  echo "|---|---|---|"
  series_rows qp_rate 1e6 '%.3f' qp_bw 1e9 '%.3f' "${QPS[@]}"
  echo
  echo "| MRs per side | 64 B M msg/s | 64 KiB GB/s |"
  echo "|---|---|---|"
  series_rows mr_rate 1e6 '%.3f' mr_bw 1e9 '%.3f' "${MRS[@]}"
  echo
  echo "| outstanding 64 B WRITEs (engine_bench) | M msg/s | CPU ns per WR |"
  echo "|---|---|---|"
  series_rows wr_rate 1e6 '%.3f' wr_cost 1 '%.0f' "${WRS[@]}"
  echo
  echo "| other | result |"
  echo "|---|---|"
  echo "| memory per idle RC QP (queues of 128, connected, 1000 QPs) | heap $(fmt "$S_QP_HEAP" '%.0f') B, resident $(fmt "$S_QP_RSS" '%.0f') B |"
  echo "| 8-byte atomics, 16 outstanding | fetch and add $(fmt "$S_FADD" '%.0f') ops/s, compare and swap $(fmt "$S_CAS" '%.0f') ops/s |"
  echo "| UD SEND, $UD_SIZE B, 64 outstanding | $(fmt "$(gbs "$S_UD")" '%.3f') GB/s, $(fmt "$S_UD_LOST" '%.0f') datagrams lost |"
  echo "| 64 KiB RDMA WRITE, 32 outstanding, lossless | $(fmt "$(gbs "$S_LOSS0")" '%.3f') GB/s |"
  echo "| the same, 1 % of packets dropped | $(fmt "$(gbs "$S_LOSS1")" '%.3f') GB/s; per repetition (median): $(lossctr dropped) dropped, $(lossctr seq_naks) sequence NAKs, $(lossctr retransmits) retransmissions, $(lossctr timeouts) ACK timeouts |"
  echo
  if [[ -n $PLOT_NOTE ]]; then
    echo "$PLOT_NOTE"
  else
    echo "![rate and bandwidth against QP pairs](performance/qp_scale.svg)"
    echo "![rate and bandwidth against MRs](performance/mr_scale.svg)"
    echo "![rate and CPU time per WR against outstanding WRs](performance/outstanding_wr.svg)"
  fi
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
