#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in BUILD_DIR (a build tree of its own,
# configured with -DSOFTVERBS_FUZZ=ON and ASan+UBSan+libFuzzer instrumentation)
# and runs each for SECONDS, on a corpus kept in BUILD_DIR/corpus/<target>.
#
# Usage: tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]   (targets: parse receive)
#
# Exit status 0 when every run ends without a finding. A finding leaves its input
# in BUILD_DIR/artifacts/<target>/ and the run's log in BUILD_DIR/logs/; replay it
# with BUILD_DIR/bin/sv_<target>_fuzz <file>.
# Extra libFuzzer flags can be given in SOFTVERBS_FUZZ_FLAGS.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
fi
build="$1"
seconds="$2"
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(parse receive)
src="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$build"
build="$(cd "$build" && pwd)"

# clang with the libFuzzer and sanitizer runtimes (Debian: clang, libclang-rt-14-dev).
cxx="${SOFTVERBS_FUZZ_CXX:-clang++}"
cc="${SOFTVERBS_FUZZ_CC:-clang}"
missing="fuzz: needs clang++ with the libFuzzer runtime; install the Debian packages clang and libclang-rt-14-dev (scripts/install-deps.sh)"
if ! command -v "$cxx" >/dev/null 2>&1 || ! command -v "$cc" >/dev/null 2>&1; then
  echo "$missing ($cxx or $cc not found)" >&2
  exit 1
fi
probe="$build/probe"
mkdir -p "$probe"
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
  >"$probe/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" >"$probe/log" 2>&1; then
  echo "$missing (a test link with -fsanitize=fuzzer,address,undefined failed: $(head -c 300 "$probe/log"))" >&2
  exit 1
fi

jobs="$(nproc)"
# -O1 and line tables only: a quarter of the compile time of -O2 -g, and
# symbolized stacks all the same.
flags="-O1 -gline-tables-only -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
if [ ! -f "$build/build.ninja" ]; then
  echo "fuzz: configuring a clang build in $build"
  cmake -S "$src" -B "$build" -G Ninja \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DSOFTVERBS_FUZZ=ON -DSOFTVERBS_WERROR=OFF -DSOFTVERBS_BUILD_BENCHMARKS=OFF >"$build/configure.log" 2>&1 || {
    tail -n 30 "$build/configure.log" >&2
    exit 1
  }
fi
start=$(date +%s)
names=()
for t in "${targets[@]}"; do names+=("sv_${t}_fuzz"); done
if ! cmake --build "$build" -j "$jobs" --target "${names[@]}" >"$build/build.log" 2>&1; then
  grep -E "error|Error" "$build/build.log" | head -n 30 >&2
  echo "fuzz: the clang build failed (full log: $build/build.log)" >&2
  exit 1
fi
echo "fuzz: build took $(( $(date +%s) - start ))s"

status=0
mkdir -p "$build/logs"
for t in "${targets[@]}"; do
  bin="$build/bin/sv_${t}_fuzz"
  corpus="$build/corpus/$t"
  artifacts="$build/artifacts/$t"
  log="$build/logs/$t.log"
  mkdir -p "$corpus" "$artifacts"
  case "$t" in
    parse) max_len=4200 ;;
    *) max_len=8192 ;;
  esac
  echo "fuzz: $t for ${seconds}s (corpus $corpus)"
  # Leak checking is off: the devices, like the library's, live until exit.
  # SOFTVERBS_FUZZ_SEED_DIR makes the target write its seeds into the corpus.
  set +e
  SOFTVERBS_FUZZ_SEED_DIR="$corpus" \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:symbolize=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
    "$bin" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -detect_leaks=0 -max_len="$max_len" \
    -print_final_stats=1 -artifact_prefix="$artifacts/" ${SOFTVERBS_FUZZ_FLAGS:-} "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  summary=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  echo "fuzz: $t: ${summary:-no progress line}"
  grep -E '^(stat::|receive_fuzz:)' "$log" | grep -v VIOLATION | sed "s/^/fuzz: $t: /" || true
  if [ $rc -ne 0 ]; then
    status=1
    echo "fuzz: $t FOUND A PROBLEM (exit $rc); log $log; input(s):" >&2
    ls -1 "$artifacts" >&2 || true
    grep -E 'VIOLATION|ERROR: AddressSanitizer|runtime error|SUMMARY|Test unit written' "$log" | head -n 20 >&2 || true
  fi
done
exit $status
