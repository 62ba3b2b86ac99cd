// What engine_bench and scale_bench share: their health (why the setup failed,
// whether an earlier benchmark left the QPs untrustworthy), the two emulated
// devices of this process they run between, and their main().
//
// Header-only: each benchmark program is one translation unit.
#pragma once

#include <benchmark/benchmark.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace softverbs::bench {

// A benchmark that sees no completion for this long reports a stall and stops.
constexpr auto kStallLimit = std::chrono::seconds(10);

// The program's health. error: why the setup is unusable, or empty (written
// before any benchmark runs). broken: a benchmark stalled or failed, so the
// QPs are not trustworthy and later benchmarks skip; benchmarks of several
// threads may set it at once, hence the atomic.
struct Health {
  std::string error;
  std::atomic<bool> broken{false};
};
inline Health health;

// Records why the setup failed, with errno's text; returns false.
inline bool fail(const std::string& what) {
  health.error = what + ": " + std::strerror(errno);
  return false;
}

// Whether a benchmark may run: skips it with the reason otherwise.
inline bool usable(benchmark::State& state) {
  if (!health.error.empty()) {
    state.SkipWithError(health.error.c_str());
    return false;
  }
  if (health.broken.load()) {
    state.SkipWithError("skipped: an earlier benchmark stalled or failed");
    return false;
  }
  return true;
}

// A benchmark failed: it stops with the reason, and the later ones skip.
inline void stop(benchmark::State& state, const std::string& why) {
  health.broken.store(true);
  state.SkipWithError(why.c_str());
}

// The device list, holding at least two devices (the benchmarks run from the
// first to the second); nullptr with health.error set otherwise.
inline ibv_device** two_devices() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    fail("ibv_get_device_list");
    return nullptr;
  }
  if (n < 2) {
    health.error = "need two emulated devices (SOFTVERBS_DEVICES), found " + std::to_string(n);
    ibv_free_device_list(list);
    return nullptr;
  }
  return list;
}

// The QPs' max_rd_atomic and max_dest_rd_atomic: what the device allows, at
// most 16; 0 with health.error set when the device cannot be queried.
inline uint8_t max_rd_atomic_of(ibv_context* ctx) {
  ibv_device_attr da{};
  if (ibv_query_device(ctx, &da)) {
    fail("ibv_query_device");
    return 0;
  }
  return static_cast<uint8_t>(std::min(16, std::max(1, da.max_qp_rd_atom)));
}

// A benchmark program's main: two devices unless the environment says
// otherwise (read by the library at the first ibv_get_device_list, so set
// first), setup(), an optional check of the data path, the benchmarks,
// teardown(). Exit status 1 when the setup failed or a benchmark broke.
inline int run_main(int argc, char** argv, const char* program, bool (*setup)(), bool (*check)(),
                    void (*teardown)()) {
  setenv("SOFTVERBS_DEVICES", "2", 0);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!setup()) {
    std::fprintf(stderr, "%s: setup failed: %s\n", program, health.error.c_str());
  } else if (check && !check()) {
    std::fprintf(stderr, "%s: %s\n", program, health.error.c_str());
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  teardown();
  return health.error.empty() && !health.broken.load() ? 0 : 1;
}

}  // namespace softverbs::bench
