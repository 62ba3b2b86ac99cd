// perftest's Debian binaries load on our libraries. Every one of them is BIND_NOW and
// pulls in the real libmlx5.so.1 and libefa.so.1, which bind to our libibverbs.so.1
// and need its IBVERBS_PRIVATE_34 symbols, and librdmacm.so.1, which is ours too; a
// gap shows up as a loader error before main() runs.
#include <gtest/gtest.h>

#include <string>

#include "tests/clients/clients.hpp"

namespace softverbs::test {
namespace {

class Perftest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { ASSERT_TRUE(installed(path(), "perftest")); }
  std::string path() const { return std::string("/usr/bin/") + GetParam(); }
};

TEST_P(Perftest, ResolvesLibibverbsAndLibrdmacmToOurs) {
  ProcessResult r = run_client({path()}, client_env().set("LD_TRACE_LOADED_OBJECTS", "1"));
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_NE(r.out.find(std::string("libibverbs.so.1 => ") + kLibDir + "/libibverbs.so.1"), std::string::npos)
      << r.describe();
  EXPECT_NE(r.out.find(std::string("librdmacm.so.1 => ") + kLibDir + "/librdmacm.so.1"), std::string::npos)
      << r.describe();
  for (const char* lib : {"libmlx5.so.1 => ", "libefa.so.1 => "})
    EXPECT_NE(r.out.find(lib), std::string::npos) << lib << "missing\n" << r.describe();
  EXPECT_EQ(r.out.find("not found"), std::string::npos) << r.describe();
  EXPECT_TRUE(loader_errors(r.err).empty()) << r.describe();
}

TEST_P(Perftest, HelpRuns) {
  // perftest prints its usage to stdout and exits with 1 after -h (rdma-core's own
  // library gives the same); a loader failure would exit with 127 before main().
  ProcessResult r = run_client({path(), "-h"}, client_env());
  EXPECT_TRUE(r.exited_with(1)) << r.describe();
  EXPECT_NE(r.out.find("Usage:"), std::string::npos) << r.describe();
  EXPECT_NE(r.out.find(GetParam()), std::string::npos) << r.describe();
  EXPECT_TRUE(loader_errors(r.err).empty()) << join_lines(loader_errors(r.err)) << r.describe();
  EXPECT_EQ(r.err, "") << r.describe();
}

TEST_P(Perftest, UnknownDeviceIsReportedNotALoadFailure) {
  // ctx_find_dev: "IB device %s not found" when the list has devices but none matches.
  ProcessResult r = run_client({path(), "-d", "nosuch"}, client_env());
  ASSERT_TRUE(r.started) << r.describe();
  EXPECT_FALSE(r.timed_out) << r.describe();
  EXPECT_TRUE(r.exited && r.exit_code != 0 && r.exit_code != 127) << r.describe();
  EXPECT_TRUE(loader_errors(r.err).empty()) << join_lines(loader_errors(r.err)) << r.describe();
  EXPECT_NE(r.err.find("IB device nosuch not found"), std::string::npos) << r.describe();
  EXPECT_EQ(r.err.find("Did not detect devices"), std::string::npos) << "the emulated device was not listed\n"
                                                                     << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Binaries, Perftest,
                         ::testing::Values("ib_send_bw", "ib_write_bw", "ib_read_bw", "ib_atomic_bw", "ib_send_lat",
                                           "ib_write_lat", "ib_read_lat", "ib_atomic_lat"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace softverbs::test
