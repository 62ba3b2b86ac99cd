// libFuzzer target: wire::parse (with and without ICRC verification) and
// wire::build round trips on arbitrary bytes. The properties are in
// parse_check.cpp; a violation aborts with its description.
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/harness.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // SOFTVERBS_FUZZ_SEED_DIR: write the seed corpus there first (tests/fuzz/run.sh).
  if (const char* dir = std::getenv("SOFTVERBS_FUZZ_SEED_DIR"); dir && *dir) {
    if (!softverbs::fuzz::write_seeds(dir, softverbs::fuzz::parse_seeds())) std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto violations = softverbs::fuzz::check_parse({data, size});
  if (!violations.empty()) {
    for (const auto& v : violations) std::fprintf(stderr, "parse_fuzz: VIOLATION: %s\n", v.c_str());
    std::abort();
  }
  return 0;
}
