#!/bin/sh
# The virtual-time acceptance run twice with SOFTVERBS_TRACE (docs/simulation.md,
# "Determinism"): both traces are non-empty, byte for byte the same, and hold the
# WRITE's completion with IBV_WC_RETRY_EXC_ERR. Usage: virtual_trace_replay.sh PROGRAM
set -eu
prog=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for run in 1 2; do
  SOFTVERBS_DEVICES=2 SOFTVERBS_CLOCK=virtual SOFTVERBS_TRACE="$dir/trace$run.json" "$prog" > "$dir/out$run" 2>&1 ||
    { cat "$dir/out$run"; echo "run $run failed"; exit 1; }
done
[ -s "$dir/trace1.json" ] || { echo "empty trace"; exit 1; }
cmp "$dir/trace1.json" "$dir/trace2.json" || { echo "the two traces differ"; exit 1; }
grep -q '"name":"completion"[^}]*"status":"IBV_WC_RETRY_EXC_ERR"' "$dir/trace1.json" ||
  { echo "no RETRY_EXC_ERR completion in the trace"; exit 1; }
echo "identical traces of $(wc -c < "$dir/trace1.json") bytes"
