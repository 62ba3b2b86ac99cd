// Unmodified Debian programs on a lossy link: ibv_rc_pingpong (ibverbs-utils) and
// ib_write_bw (perftest) as a server and a client process, each with its own emulated
// device, both with SOFTVERBS_FAULTS naming drop-1pct.toml (1 % of the packets each
// device sends and receives are lost). RC's retransmissions must hide the loss: both
// programs finish as they do on a clean link, with their usual output. Each side
// logs the fault layer's decisions (SOFTVERBS_FAULT_LOG), which shows that the
// scenario was read and packets were really lost.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/clients/perftest_transfer.hpp"

namespace softverbs::test {
namespace {

constexpr const char* kScenario = SV_FAULT_SCENARIO;  // tests/clients/drop-1pct.toml
constexpr milliseconds kLimit{60000};

// A fresh directory for the fault logs of one test, removed at the end.
class LossyClients : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmpdir = std::getenv("TMPDIR");
    std::string t = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/softverbs-lossy-XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back('\0');
    char* made = ::mkdtemp(buf.data());
    ASSERT_NE(made, nullptr) << "mkdtemp " << t << ": " << std::strerror(errno);
    dir_ = made;
  }
  void TearDown() override {
    for (const char* side : {"server", "client"}) ::unlink(log_path(side).c_str());
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }

  std::string log_path(const std::string& side) const { return dir_ + "/" + side + ".faults"; }

  // The client environment plus the scenario; each side its own seed and log.
  Env env(const std::string& side) const {
    return client_env()
        .set("SOFTVERBS_LOG", "info")
        .set("SOFTVERBS_FAULTS", kScenario)
        .set("SOFTVERBS_FAULT_SEED", side == "server" ? "101" : "202")
        .set("SOFTVERBS_FAULT_LOG", log_path(side));
  }

  // Both fault logs: every decision is a drop by the scenario's rule, and there were
  // some. Returns the number of drops.
  uint64_t check_fault_logs(const std::string& all) const {
    uint64_t drops = 0;
    for (const char* side : {"server", "client"}) {
      std::ifstream in(log_path(side));
      EXPECT_TRUE(in.good()) << side << ": no fault log " << log_path(side) << " (scenario not loaded?)\n" << all;
      for (std::string line; std::getline(in, line);) {
        // "tx emu0 qpn=0x00bd00 psn=4198 opcode=RC_SEND_MIDDLE rule=drop-1pct action=drop"
        EXPECT_NE(line.find(" rule=drop-1pct action=drop"), std::string::npos) << side << ": " << line;
        EXPECT_TRUE(line.starts_with("tx emu0 ") || line.starts_with("rx emu0 ")) << side << ": " << line;
        ++drops;
      }
    }
    EXPECT_GT(drops, 0u) << "no packet was dropped: is " << kScenario << " a valid scenario?\n" << all;
    return drops;
  }

  // Both devices' exit counters: no corrupted or unparseable packet, and the transport
  // recovered from the loss (retransmissions or local ACK timeouts on some side).
  void check_devices(const PairResult& r, const std::string& all) const {
    DeviceReport sdev, cdev;
    ASSERT_TRUE(clean_device_report(r.server, "server", &sdev)) << all;
    ASSERT_TRUE(clean_device_report(r.client, "client", &cdev)) << all;
    EXPECT_GT(
        sdev.counter("retransmits") + cdev.counter("retransmits") + sdev.counter("timeouts") + cdev.counter("timeouts"),
        0u)
        << sdev.describe_counters() << " / " << cdev.describe_counters();
    ::testing::Test::RecordProperty("server_counters", sdev.describe_counters());
    ::testing::Test::RecordProperty("client_counters", cdev.describe_counters());
  }

  std::string dir_;
};

TEST_F(LossyClients, RcPingpongCompletes) {
  const std::string program = "/usr/bin/ibv_rc_pingpong";
  ASSERT_TRUE(installed(program, "ibverbs-utils"));
  constexpr uint64_t kSize = 4096, kIters = 200;
  auto argv = [&](uint16_t port) {
    // -c: the receiver checks the contents of every message.
    return std::vector<std::string>{
        program, "-p", std::to_string(port), "-g", "1", "-s", std::to_string(kSize), "-n", std::to_string(kIters),
        "-c"};
  };
  PairResult r = run_pair(argv, env("server"), env("client"), kLimit);
  const std::string all = r.describe();
  ASSERT_TRUE(r.both_succeeded()) << all;

  static const std::regex bytes(R"(^(\d+) bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$)");
  static const std::regex iters(R"(^(\d+) iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$)");
  for (const auto& [side, p] : {std::pair{"server", &r.server}, std::pair{"client", &r.client}}) {
    EXPECT_TRUE(unexpected_stderr(p->err).empty()) << side << ":\n" << join_lines(unexpected_stderr(p->err)) << all;
    auto bad = lines_containing(p->out, {"invalid data", "Failed", "Couldn't", "Completion for unknown", "error"});
    EXPECT_TRUE(bad.empty()) << side << ":\n" << join_lines(bad) << all;
    int bytes_lines = 0, iters_lines = 0;
    for (const std::string& line : lines_of(p->out)) {
      std::smatch m;
      if (std::regex_match(line, m, bytes)) {
        ++bytes_lines;
        EXPECT_EQ(std::stoull(m[1]), 2 * kSize * kIters) << side << ": " << line;
      } else if (std::regex_match(line, m, iters)) {
        ++iters_lines;
        EXPECT_EQ(std::stoull(m[1]), kIters) << side << ": " << line;
      }
    }
    EXPECT_EQ(bytes_lines, 1) << side << ": no 'bytes in ... seconds' line\n" << all;
    EXPECT_EQ(iters_lines, 1) << side << ": no 'iters in ... seconds' line\n" << all;
  }
  check_devices(r, all);
  RecordProperty("drops", std::to_string(check_fault_logs(all)));
}

TEST_F(LossyClients, WriteBwCompletes) {
  const PerftestCase c = make_case("Lossy_ib_write_bw", "ib_write_bw",
                                   {"-d", "emu0", "-x", "1", "-n", "200", "-s", "65536"}, Link::roce, {65536}, 200);
  ASSERT_TRUE(installed(perftest_path(c), "perftest"));
  PairResult r = run_pair([&](uint16_t port) { return perftest_argv(c, port); }, env("server"), env("client"), kLimit);
  const std::string all = r.describe();
  ASSERT_TRUE(r.both_succeeded()) << all;

  for (const auto& [side, p] : {std::pair{"server", &r.server}, std::pair{"client", &r.client}}) {
    auto extra = unexpected_stderr(p->err, kPerftestStderr);
    EXPECT_TRUE(extra.empty()) << side << ": unexpected stderr:\n" << join_lines(extra) << all;
    auto bad = lines_containing(p->out + p->err,
                                {"Completion with error", "Failed", "failed", "Couldn't", "Unable", "ERROR", "Error"});
    EXPECT_TRUE(bad.empty()) << side << ":\n" << join_lines(bad) << all;
  }
  PerftestOutput s = parse_perftest(r.server.out), cl = parse_perftest(r.client.out);
  for (const auto& [side, o] : {std::pair{"server", &s}, std::pair{"client", &cl}}) {
    EXPECT_EQ(o->header["Connection type"], "RC") << side << "\n" << all;
    EXPECT_EQ(o->header["Device"], "emu0") << side << "\n" << all;
    ASSERT_EQ(o->local.size(), 1u) << side << "\n" << all;
    ASSERT_EQ(o->remote.size(), 1u) << side << "\n" << all;
  }
  EXPECT_EQ(s.local[0].qpn, cl.remote[0].qpn) << all;
  EXPECT_EQ(cl.local[0].qpn, s.remote[0].qpn) << all;
  // The client's results table: one row, 65536 bytes, 200 iterations, sane values.
  check_rows(c, cl.rows, "client", all);
  check_devices(r, all);
  RecordProperty("drops", std::to_string(check_fault_logs(all)));
}

}  // namespace
}  // namespace softverbs::test
