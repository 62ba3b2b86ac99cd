// ibverbs-utils' ibv_xsrq_pingpong (the Debian binary, unmodified) as a server
// and a client process, each on its own emulated device: XRC domains, XRC SRQs
// and their numbers, XRC_SEND and XRC_RECV QPs, and sends that carry the
// target's SRQ number in an XRCETH, over RoCEv2 (GID index 1) and over the
// InfiniBand link layer (LID addressing).
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "tests/clients/program_pair.hpp"

namespace softverbs::test {
namespace {

constexpr milliseconds kXsrqLimit{60000};

struct XsrqCase {
  const char* name;
  bool ib;
  uint32_t size;
  uint32_t iters;
  bool events;
};

void PrintTo(const XsrqCase& c, std::ostream* os) { *os << c.name; }

// "   local: LID 0000, QPN RECV 000012 SEND 000013, PSN 5a1f00, SRQN 000001, GID ::ffff:127.0.0.2"
struct XsrqAddress {
  std::string recv_qpn, send_qpn, srqn;
};

std::vector<XsrqAddress> addresses(const std::string& out, const std::string& which) {
  static const std::regex line(R"(\s*(local|remote): LID [0-9a-f]+, QPN RECV ([0-9a-f]+) SEND ([0-9a-f]+), PSN [0-9a-f]+, SRQN ([0-9a-f]+), GID .*)");
  std::vector<XsrqAddress> v;
  std::smatch m;
  for (const std::string& l : lines_of(out))
    if (std::regex_match(l, m, line) && m[1] == which) v.push_back({m[2], m[3], m[4]});
  return v;
}

class XsrqPingpong : public ::testing::TestWithParam<XsrqCase> {
 protected:
  void SetUp() override { ASSERT_TRUE(installed(kPath, "ibverbs-utils")); }
  static constexpr const char* kPath = "/usr/bin/ibv_xsrq_pingpong";
};

TEST_P(XsrqPingpong, ExchangesOverXrc) {
  const XsrqCase& c = GetParam();
  Env e = client_env().set("SOFTVERBS_LOG", "info");
  if (c.ib) e.set("SOFTVERBS_LINK_LAYER", "ib");
  auto argv = [&](uint16_t port) {
    std::vector<std::string> v{kPath, "-p", std::to_string(port), "-s", std::to_string(c.size), "-n",
                               std::to_string(c.iters)};
    if (!c.ib) v.insert(v.end(), {"-g", "1"});
    if (c.events) v.push_back("-e");
    return v;
  };
  PairResult r = run_pair(argv, e, e, kXsrqLimit);
  ASSERT_TRUE(r.both_succeeded()) << r.describe();
  for (const ProcessResult* p : {&r.server, &r.client}) {
    EXPECT_TRUE(unexpected_stderr(p->err).empty()) << join_lines(unexpected_stderr(p->err)) << r.describe();
    auto bad = lines_containing(p->out, {"Failed", "Couldn't", "Invalid"});
    EXPECT_TRUE(bad.empty()) << join_lines(bad) << r.describe();
  }
  // What one side sent (its QPNs and SRQ number) is what the other received.
  auto sl = addresses(r.server.out, "local"), sr = addresses(r.server.out, "remote");
  auto cl = addresses(r.client.out, "local"), cr = addresses(r.client.out, "remote");
  ASSERT_EQ(sl.size(), 1u) << r.describe();
  ASSERT_EQ(sr.size(), 1u) << r.describe();
  ASSERT_EQ(cl.size(), 1u) << r.describe();
  ASSERT_EQ(cr.size(), 1u) << r.describe();
  EXPECT_EQ(sl[0].srqn, cr[0].srqn);
  EXPECT_EQ(cl[0].srqn, sr[0].srqn);
  EXPECT_EQ(sl[0].recv_qpn, cr[0].recv_qpn);
  EXPECT_EQ(cl[0].send_qpn, sr[0].send_qpn);
  EXPECT_NE(sl[0].srqn, "000000");
  DeviceReport sdev, cdev;
  ASSERT_TRUE(clean_device_report(r.server, "server", &sdev)) << r.describe();
  ASSERT_TRUE(clean_device_report(r.client, "client", &cdev)) << r.describe();
  EXPECT_NE(sdev.address, cdev.address) << r.describe();
  // Every message of both sides went out and was acknowledged.
  for (const DeviceReport* d : {&sdev, &cdev}) EXPECT_GE(d->counter("tx"), uint64_t{c.iters}) << d->describe_counters();
}

INSTANTIATE_TEST_SUITE_P(Runs, XsrqPingpong,
                         ::testing::Values(XsrqCase{"Roce", false, 4096, 5, false},
                                           XsrqCase{"Roce_Events_SmallMessages", false, 64, 50, true},
                                           XsrqCase{"Ib", true, 4096, 20, false}),
                         [](const ::testing::TestParamInfo<XsrqCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace softverbs::test
