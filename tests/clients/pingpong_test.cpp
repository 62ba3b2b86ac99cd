// ibverbs-utils' ibv_rc_pingpong, ibv_uc_pingpong, ibv_srq_pingpong and ibv_ud_pingpong, the Debian
// binaries, as a server and a client process on one host, each with its own emulated
// device: RoCEv2 with GID index 1, and InfiniBand link layer with LID addressing.
//
// Each side prints the address it sent and the one it received; the test checks them
// against each other and against the device softverbs reports (SOFTVERBS_LOG=info),
// then the transfer line ("2*size*iters bytes in") and the packet counters the library
// prints at exit.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <ostream>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "tests/clients/program_pair.hpp"

namespace softverbs::test {
namespace {

using namespace std::chrono_literals;

constexpr milliseconds kPingpongLimit{60000};

enum class Link { roce, ib };

struct PingpongCase {
  const char* name;     // test name suffix
  const char* program;  // ibv_rc_pingpong, ibv_uc_pingpong, ibv_srq_pingpong or ibv_ud_pingpong
  Link link;
  uint32_t size;
  uint32_t iters;
  uint32_t mtu;  // 0: the program's default (1024)
  bool events = false;
  bool check = false;       // -c: the receiver validates the buffer
  bool timestamps = false;  // -t: completion timestamps (ibv_create_cq_ex)
  int gid_index = 1;        // -g on RoCE: 1 the IPv4-mapped GID, 0 the link-local one
};

// The link-local RoCE GID of the device at `address`: fe80:: and the EUI-64 of its
// MAC 02:00:a:b:c:d, as inet_ntop prints it.
std::string link_local_gid(const std::string& address) {
  in_addr a{};
  if (inet_pton(AF_INET, address.c_str(), &a) != 1) return "?";
  const auto* b = reinterpret_cast<const uint8_t*>(&a.s_addr);
  uint8_t raw[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x00, b[0], 0xff, 0xfe, b[1], b[2], b[3]};
  char text[INET6_ADDRSTRLEN];
  return inet_ntop(AF_INET6, raw, text, sizeof text) ? text : "?";
}

// "  local address:  LID 0x0000, QPN 0x496c00, PSN 0x34dd53, GID ::ffff:127.0.73.108"
struct PingpongAddress {
  uint32_t lid = 0, qpn = 0, psn = 0;
  std::string gid;
  bool operator==(const PingpongAddress&) const = default;
};

std::string to_string(const PingpongAddress& a) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "LID 0x%04x QPN 0x%06x PSN 0x%06x GID ", a.lid, a.qpn, a.psn);
  return buf + a.gid;
}

struct PingpongOutput {
  std::vector<PingpongAddress> local, remote;
  std::optional<uint64_t> bytes;  // "N bytes in S seconds = R Mbit/sec"
  std::optional<uint32_t> iters;  // "N iters in S seconds = U usec/iter"
  double usec_per_iter = 0;
  // With -t: "Max|Min|Average receive completion clock cycles = N", the spacing of
  // the receive completions' timestamps.
  std::map<std::string, double> completion_cycles;
};

PingpongOutput parse_pingpong(const std::string& out) {
  static const std::regex address(
      // ibv_ud_pingpong prints "PSN 0x…: GID" for its local address.
      R"(^  (local|remote) address: +LID 0x([0-9a-f]{4}), QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6})[,:] GID (\S+)$)");
  static const std::regex bytes(R"(^(\d+) bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$)");
  static const std::regex iters(R"(^(\d+) iters in \d+\.\d\d seconds = (\d+\.\d\d) usec/iter$)");
  static const std::regex cycles(R"(^(Max|Min|Average) receive completion clock cycles = (\d+(\.\d+)?)$)");
  PingpongOutput p;
  for (const std::string& line : lines_of(out)) {
    std::smatch m;
    if (std::regex_match(line, m, address)) {
      PingpongAddress a{static_cast<uint32_t>(std::stoul(m[2], nullptr, 16)),
                        static_cast<uint32_t>(std::stoul(m[3], nullptr, 16)),
                        static_cast<uint32_t>(std::stoul(m[4], nullptr, 16)), m[5]};
      (m[1] == "local" ? p.local : p.remote).push_back(a);
    } else if (std::regex_match(line, m, bytes)) {
      p.bytes = std::stoull(m[1]);
    } else if (std::regex_match(line, m, iters)) {
      p.iters = static_cast<uint32_t>(std::stoul(m[1]));
      p.usec_per_iter = std::stod(m[2]);
    } else if (std::regex_match(line, m, cycles)) {
      p.completion_cycles[m[1]] = std::stod(m[2]);
    }
  }
  return p;
}

void PrintTo(const PingpongCase& c, std::ostream* os) { *os << c.name; }

class Pingpong : public ::testing::TestWithParam<PingpongCase> {
 protected:
  void SetUp() override { ASSERT_TRUE(installed(path(), "ibverbs-utils")); }
  std::string path() const { return std::string("/usr/bin/") + GetParam().program; }

  std::vector<std::string> argv(uint16_t port) const {
    const PingpongCase& c = GetParam();
    std::vector<std::string> v{
        path(), "-p", std::to_string(port), "-s", std::to_string(c.size), "-n", std::to_string(c.iters)};
    if (c.link == Link::roce) v.insert(v.end(), {"-g", std::to_string(c.gid_index)});
    if (c.mtu) v.insert(v.end(), {"-m", std::to_string(c.mtu)});
    if (c.events) v.push_back("-e");
    if (c.check) v.push_back("-c");
    if (c.timestamps) v.push_back("-t");
    return v;
  }

  Env env() const {
    Env e = client_env().set("SOFTVERBS_LOG", "info");
    if (GetParam().link == Link::ib) e.set("SOFTVERBS_LINK_LAYER", "ib");
    return e;
  }
};

TEST_P(Pingpong, ExchangesAndReports) {
  const PingpongCase& c = GetParam();
  const bool uc = std::string(c.program) == "ibv_uc_pingpong";
  const bool ud = std::string(c.program) == "ibv_ud_pingpong";
  const size_t qps = std::string(c.program) == "ibv_srq_pingpong" ? 16 : 1;  // srq_pingpong's default -q
  const Env e = env();
  PairResult r = run_pair([&](uint16_t port) { return argv(port); }, e, e, kPingpongLimit);
  ASSERT_TRUE(r.both_succeeded()) << r.describe();

  // Nothing on stderr but softverbs' info lines; no failure printed on stdout.
  for (const ProcessResult* p : {&r.server, &r.client}) {
    EXPECT_TRUE(unexpected_stderr(p->err).empty()) << join_lines(unexpected_stderr(p->err)) << r.describe();
    auto bad = lines_containing(p->out, {"invalid data", "Failed", "Couldn't", "Completion for unknown"});
    EXPECT_TRUE(bad.empty()) << join_lines(bad) << r.describe();
  }

  DeviceReport sdev, cdev;
  ASSERT_TRUE(clean_device_report(r.server, "server", &sdev)) << r.describe();
  ASSERT_TRUE(clean_device_report(r.client, "client", &cdev)) << r.describe();
  const char* link = c.link == Link::ib ? "InfiniBand link layer" : "RoCEv2";
  EXPECT_EQ(sdev.link, link) << r.describe();
  EXPECT_EQ(cdev.link, link) << r.describe();
  EXPECT_NE(sdev.address, cdev.address) << "each process has its own device address\n" << r.describe();

  PingpongOutput s = parse_pingpong(r.server.out), cl = parse_pingpong(r.client.out);
  ASSERT_EQ(s.local.size(), qps) << r.describe();
  ASSERT_EQ(s.remote.size(), qps) << r.describe();
  ASSERT_EQ(cl.local.size(), qps) << r.describe();
  ASSERT_EQ(cl.remote.size(), qps) << r.describe();
  for (size_t i = 0; i < qps; ++i) {
    // What one side sent is what the other received.
    EXPECT_EQ(s.local[i], cl.remote[i]) << to_string(s.local[i]) << " vs " << to_string(cl.remote[i]);
    EXPECT_EQ(cl.local[i], s.remote[i]) << to_string(cl.local[i]) << " vs " << to_string(s.remote[i]);
    for (const auto& [side, a, dev] :
         {std::tuple{"server", s.local[i], sdev}, std::tuple{"client", cl.local[i], cdev}}) {
      EXPECT_NE(a.qpn, 0u) << side;
      if (c.link == Link::roce) {
        // GID index 1 is the IPv4-mapped RoCEv2 GID of the device's address, index 0
        // the link-local one of its MAC; no LID on Ethernet.
        const std::string gid = c.gid_index == 0 ? link_local_gid(dev.address) : "::ffff:" + dev.address;
        EXPECT_EQ(a.gid, gid) << side << "\n" << r.describe();
        EXPECT_EQ(a.lid, 0u) << side << "\n" << r.describe();
      } else {
        // No -g: addressed by LID alone (the program prints an all-zero GID).
        EXPECT_EQ(a.lid, dev.lid()) << side << ": LID must be the low 16 bits of " << dev.address << "\n"
                                    << r.describe();
        EXPECT_NE(a.lid, 0u) << side;
        EXPECT_EQ(a.gid, "::") << side << "\n" << r.describe();
      }
    }
  }
  if (qps > 1) {
    EXPECT_NE(s.local[0].qpn, s.local[1].qpn) << r.describe();
  }

  // Each side sent `iters` messages and received as many: 2 * size * iters bytes.
  for (const auto& [side, o] : {std::pair{"server", s}, std::pair{"client", cl}}) {
    ASSERT_TRUE(o.bytes.has_value()) << side << ": no 'bytes in' line\n" << r.describe();
    ASSERT_TRUE(o.iters.has_value()) << side << ": no 'iters in' line\n" << r.describe();
    EXPECT_EQ(*o.bytes, 2ull * c.size * c.iters) << side << "\n" << r.describe();
    EXPECT_EQ(*o.iters, c.iters) << side << "\n" << r.describe();
    EXPECT_GT(o.usec_per_iter, 0.0) << side << "\n" << r.describe();
  }

  if (c.timestamps) {
    // Timestamps in nanoseconds (a 1 GHz core clock) that increase from one receive
    // completion to the next.
    for (const auto& [side, o] : {std::pair{"server", s}, std::pair{"client", cl}}) {
      auto cyc = o.completion_cycles;
      ASSERT_EQ(cyc.size(), 3u) << side << ": no completion clock lines\n" << r.describe();
      EXPECT_GT(cyc["Min"], 0.0) << side << "\n" << r.describe();
      EXPECT_LE(cyc["Min"], cyc["Average"]) << side << "\n" << r.describe();
      EXPECT_LE(cyc["Average"], cyc["Max"]) << side << "\n" << r.describe();
      EXPECT_LT(cyc["Max"], 60e9) << side << ": more than a minute between completions\n" << r.describe();
    }
  }

  // Packets on the wire: each side sends `iters` messages of ceil(size / MTU) packets.
  // ibv_srq_pingpong keeps one message in flight on each of its QPs and stops counting
  // at `iters`: up to one more message per QP may go out.
  // A datagram is one packet (ibv_ud_pingpong keeps its messages within the MTU).
  const uint64_t mtu = c.mtu ? c.mtu : 1024;
  const uint64_t per_message = ud ? 1 : (c.size + mtu - 1) / mtu;
  const uint64_t data = uint64_t{c.iters} * per_message;
  const uint64_t data_max = (uint64_t{c.iters} + (qps > 1 ? qps : 0)) * per_message;
  // A retransmission by either side makes the other answer the duplicates again.
  const bool repaired = sdev.counter("retransmits") + sdev.counter("timeouts") + cdev.counter("retransmits") +
                            cdev.counter("timeouts") >
                        0;
  for (const auto& [side, d] : {std::pair{"server", sdev}, std::pair{"client", cdev}}) {
    if (uc || ud) {
      // UC and UD: no acknowledgements, no retransmissions, and a lost packet would
      // have stalled the exchange: the counts are exact.
      EXPECT_EQ(d.counter("tx"), data) << side << ": " << d.describe_counters();
      EXPECT_EQ(d.counter("rx"), data) << side << ": " << d.describe_counters();
      EXPECT_EQ(d.counter("retransmits"), 0u) << side << ": " << d.describe_counters();
    } else {
      // RC: the data plus at least one acknowledgement, at most one per data packet
      // unless something was retransmitted (by either side).
      EXPECT_GE(d.counter("tx"), data + 1) << side << ": " << d.describe_counters();
      EXPECT_GE(d.counter("rx"), data + 1) << side << ": " << d.describe_counters();
      if (!repaired) {
        EXPECT_LE(d.counter("tx"), 2 * data_max) << side << ": " << d.describe_counters();
      }
    }
  }
}

std::vector<PingpongCase> cases() {
  std::vector<PingpongCase> v;
  auto add = [&](const char* name, const char* program, Link link, uint32_t size, uint32_t iters, uint32_t mtu,
                 bool events = false, bool check = false, bool timestamps = false) {
    v.push_back({name, program, link, size, iters, mtu, events, check, timestamps, 1});
  };
  for (const char* program : {"ibv_rc_pingpong", "ibv_uc_pingpong"}) {
    const bool rc = std::string(program) == "ibv_rc_pingpong";
    add(rc ? "Rc_Size1" : "Uc_Size1", program, Link::roce, 1, 300, 0);
    add(rc ? "Rc_Size4096" : "Uc_Size4096", program, Link::roce, 4096, 300, 0);
    add(rc ? "Rc_Size8000" : "Uc_Size8000", program, Link::roce, 8000, 300, 0);
    add(rc ? "Rc_Size65536" : "Uc_Size65536", program, Link::roce, 65536, 100, 0);
    add(rc ? "Rc_Events" : "Uc_Events", program, Link::roce, 8000, 200, 0, true);
    add(rc ? "Rc_Mtu256" : "Uc_Mtu256", program, Link::roce, 8000, 100, 256);
    add(rc ? "Rc_Mtu1024" : "Uc_Mtu1024", program, Link::roce, 8000, 100, 1024);
    add(rc ? "Rc_Mtu4096" : "Uc_Mtu4096", program, Link::roce, 8000, 100, 4096);
    add(rc ? "Rc_Validate" : "Uc_Validate", program, Link::roce, 8000, 200, 0, false, true);
    add(rc ? "Rc_IbLid" : "Uc_IbLid", program, Link::ib, 8000, 200, 0);
    add(rc ? "Rc_IbLidEventsValidate" : "Uc_IbLidEventsValidate", program, Link::ib, 5000, 100, 2048, true, true);
  }
  add("Rc_CompletionTimestamps", "ibv_rc_pingpong", Link::roce, 4096, 200, 0, false, false, true);
  // -g 0: each side connects from its link-local GID to the other's.
  add("Rc_LinkLocalGid", "ibv_rc_pingpong", Link::roce, 8000, 100, 0, false, true);
  v.back().gid_index = 0;
  add("Ud_LinkLocalGid", "ibv_ud_pingpong", Link::roce, 1024, 100, 0, false, true);
  v.back().gid_index = 0;
  add("Srq_Size8000", "ibv_srq_pingpong", Link::roce, 8000, 200, 0);
  add("Srq_EventsValidate", "ibv_srq_pingpong", Link::roce, 4096, 100, 4096, true, true);
  add("Srq_IbLid", "ibv_srq_pingpong", Link::ib, 8000, 100, 0);
  add("Ud_Size2048", "ibv_ud_pingpong", Link::roce, 2048, 300, 0);
  add("Ud_EventsValidate", "ibv_ud_pingpong", Link::roce, 1024, 200, 0, true, true);
  add("Ud_IbLid", "ibv_ud_pingpong", Link::ib, 2048, 200, 0);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Runs, Pingpong, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<PingpongCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace softverbs::test
