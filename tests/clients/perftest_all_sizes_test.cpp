// perftest's RC benchmarks over RoCEv2 (-x 1) with every message size from 2 bytes to
// 8 MiB (-a), 20 iterations each; the atomic tests have a fixed size and are not
// here. The checks are those of perftest_transfer.hpp.
//
// perftest recalibrates its clock for every size (about half a second of busy
// waiting, twice per size), so each run takes 10-35 s; ctest runs them one at a time
// (RESOURCE_LOCK in CMakeLists.txt) so that two of them never compete for the CPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/clients/perftest_transfer.hpp"

namespace softverbs::test {
namespace {

TEST_P(PerftestTransfer, CompletesWithResults) { run_and_check(GetParam()); }

std::vector<PerftestCase> cases() {
  std::vector<PerftestCase> v;
  for (const char* p : {"ib_send_bw", "ib_write_bw", "ib_read_bw", "ib_send_lat", "ib_write_lat", "ib_read_lat"})
    v.push_back(make_case(p, p, {"-d", "emu0", "-x", "1", "-a", "-n", "20"}, Link::roce, all_sizes(), 20));
  return v;
}

INSTANTIATE_TEST_SUITE_P(RcAllSizes, PerftestTransfer, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<PerftestCase>& info) { return info.param.name; });

}  // namespace
}  // namespace softverbs::test
