// libFuzzer target: the receive path of two emulated devices fed packets through
// Device::inject, with live RC and UC QPs, posted work and guarded memory
// regions. The input format and the properties are in harness.hpp and
// receive_harness.cpp; a violation aborts with its description.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/harness.hpp"

namespace {

void print_stats() { std::fprintf(stderr, "receive_fuzz: %s\n", softverbs::fuzz::receive_stats().c_str()); }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("SOFTVERBS_FUZZ_SEED_DIR"); dir && *dir) {
    if (!softverbs::fuzz::write_seeds(dir, softverbs::fuzz::receive_seeds())) std::abort();
  }
  // Devices, QPs and regions are built once, before the first input.
  (void)softverbs::fuzz::check_receive({});
  std::atexit(print_stats);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto violations = softverbs::fuzz::check_receive({data, size});
  if (!violations.empty()) {
    for (const auto& v : violations) std::fprintf(stderr, "receive_fuzz: VIOLATION: %s\n", v.c_str());
    std::abort();
  }
  return 0;
}
