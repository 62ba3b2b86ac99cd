// The manual's APM example (apm.c) run as the manual says: the server (-s)
// first, then the client (-a server) with -m, which migrates the path by
// ibv_modify_qp after a number of sends. Each process is on an emulated device
// of its own (tests/clients/cm_pair.hpp); the alternate path both load is the
// primary one (a single-port device offers no other), which IBTA allows.
// Checked: both exit 0, both load the alternate path, both report the
// migration (IBV_EVENT_PATH_MIG: the client's own request, the server on the
// client's first packet with MigReq set), no migration error, and every send
// and receive completes on both sides.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/clients/clients.hpp"
#include "tests/clients/cm_pair.hpp"

namespace softverbs::test {
namespace {

constexpr const char* kApm = SV_MANUAL_APM;

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

TEST(ManualApm, ClientMigratesByModifyAndTheSendsComplete) {
  // apm sleeps 500 ms before each send (its -w option is not in its getopt
  // string): six round trips, the migration after the third.
  const std::string count = "6";
  CmPair r = run_cm_pair({.server = [&](const CmAddrs& a) -> std::vector<std::string> {
                            return {kApm, "-s", "-p", std::to_string(a.port), "-c", count};
                          },
                          .client = [&](const CmAddrs& a) -> std::vector<std::string> {
                            return {kApm, "-a", a.server, "-p", std::to_string(a.port), "-c", count, "-m", "2"};
                          },
                          .limit = milliseconds(60000)});
  ASSERT_TRUE(r.both_succeeded()) << r.describe();
  for (const ProcessResult* p : {&r.server, &r.client}) {
    const std::string& out = p->out;
    EXPECT_NE(out.find("loading alt path - local port: 1, dlid: 0"), std::string::npos) << r.describe();
    EXPECT_EQ(count_of(out, "QP path migrated\n"), 1u) << r.describe();
    EXPECT_EQ(out.find("QP path migration error"), std::string::npos) << r.describe();
    EXPECT_EQ(out.find("Async Event"), std::string::npos) << r.describe();
    EXPECT_NE(out.find("send: 6\n"), std::string::npos) << r.describe();
    EXPECT_NE(out.find("recv: 6\n"), std::string::npos) << r.describe();
    EXPECT_EQ(out.find("returned"), std::string::npos) << r.describe();  // VERB_ERR's words
  }
  // The client migrated after its third round trip, before its fourth send.
  const std::string& c = r.client.out;
  const size_t migrated = c.find("QP path migrated");
  EXPECT_LT(c.find("recv: 3\n"), migrated) << r.describe();
}

}  // namespace
}  // namespace softverbs::test
