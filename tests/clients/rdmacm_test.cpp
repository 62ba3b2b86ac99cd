// rdmacm-utils' and perftest's Debian binaries, unmodified, connecting through our
// librdmacm.so.1 and the emulated CM: a server and a client process on one host,
// each on its own emulated device (tests/clients/cm_pair.hpp), each run bounded in
// time, its output checked: rping's pings, ucmatose's and udaddy's "return status 0",
// rdma_server's and rdma_client's "end 0" (rdma_xserver's and rdma_xclient's
// too, over XRC), cmtime's table of steps, perftest -R's
// results row; and rping with no configuration at all (the loopback service).
//
// Not here: the rsockets programs (rstream, riostream, rcopy, udpong), in
// rsocket_clients_test.cpp. Nor mckey (UD multicast through the emulated CM):
// mckey_test.cpp runs it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "tests/clients/cm_pair.hpp"
#include "tests/clients/perftest_transfer.hpp"

namespace softverbs::test {
namespace {

constexpr milliseconds kCmLimit{40000};

std::string bin(const char* name) { return std::string("/usr/bin/") + name; }

// What the program prints on stderr when all went well, besides softverbs' info lines.
// The last one is rping's own race, with rdma-core's library as with ours: its CM
// thread acknowledges the DISCONNECTED event, which lets the main thread's
// rdma_destroy_id return and rdma_destroy_event_channel close the channel, and
// when the CM thread is descheduled until after that close its next
// rdma_get_cm_event finds the descriptor closed (EBADF). The pings and the exit
// status are still checked.
const std::vector<std::string> kRpingStderr = {"client DISCONNECT EVENT...", "server DISCONNECT EVENT...",
                                               "wait for RDMA_READ_ADV state 10",
                                               "rdma_get_cm_event: Bad file descriptor"};

// Both sides' devices were created where asked and received nothing corrupt.
void expect_clean_devices(const CmPair& r, bool server_counters = true) {
  DeviceReport c;
  EXPECT_TRUE(clean_device_report(r.client, "client", &c)) << r.describe();
  EXPECT_EQ(c.address, r.addrs.client) << r.describe();
  if (server_counters) {
    DeviceReport s;
    EXPECT_TRUE(clean_device_report(r.server, "server", &s)) << r.describe();
    EXPECT_EQ(s.address, r.addrs.server) << r.describe();
  }
}

void expect_stderr(const ProcessResult& p, const std::string& side, const std::vector<std::string>& allowed,
                   const CmPair& r) {
  auto extra = unexpected_stderr(p.err, allowed);
  EXPECT_TRUE(extra.empty()) << side << ": unexpected stderr:\n" << join_lines(extra) << r.describe();
}

// ---------------------------------------------------------------------------
// rping: -v prints every ping as "ping data: rdma-ping-N: " followed by the
// characters rping fills its buffer with, 'A' + N % 58 onwards, wrapping after 'z',
// up to size - 1 bytes in all.

std::string rping_text(int n, int size) {
  std::string s = "rdma-ping-" + std::to_string(n) + ": ";
  int c = 65 + n % 58;
  while (static_cast<int>(s.size()) < size - 1) {
    s += static_cast<char>(c);
    if (++c > 122) c = 65;
  }
  return s;
}

// The ping lines with the given prefix match pings 0..count-1 in order.
::testing::AssertionResult pings_match(const std::string& out, const std::string& prefix, int count, int size) {
  int n = 0;
  for (const std::string& line : lines_of(out)) {
    if (!line.starts_with(prefix)) continue;
    std::string want = rping_text(n, size);
    if (line.substr(prefix.size()) != want)
      return ::testing::AssertionFailure()
             << "ping " << n << ": got '" << line << "', expected '" << prefix << want << "'";
    ++n;
  }
  if (n != count) return ::testing::AssertionFailure() << n << " '" << prefix << "' lines, expected " << count;
  return ::testing::AssertionSuccess();
}

class Rping : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { ASSERT_TRUE(installed(bin("rping"), "rdmacm-utils")); }
};

TEST_P(Rping, ThousandPingsBetweenTwoDevices) {
  const int size = GetParam(), count = 1000;
  const std::string n = std::to_string(count), s = std::to_string(size);
  CmPair r = run_cm_pair(
      {.server = [&](const CmAddrs& a) -> std::vector<std::string> {
         return {bin("rping"), "-s", "-v", "-a", a.server, "-p", std::to_string(a.port), "-C", n, "-S", s};
       },
       .client = [&](const CmAddrs& a) -> std::vector<std::string> {
         return {bin("rping"), "-c", "-v", "-V", "-a", a.server, "-p", std::to_string(a.port), "-C", n, "-S", s};
       },
       .limit = kCmLimit});
  ASSERT_TRUE(r.both_succeeded()) << r.describe();
  EXPECT_TRUE(pings_match(r.client.out, "ping data: ", count, size)) << r.describe();
  EXPECT_TRUE(pings_match(r.server.out, "server ping data: ", count, size)) << r.describe();
  expect_stderr(r.client, "client", kRpingStderr, r);
  expect_stderr(r.server, "server", kRpingStderr, r);
  expect_clean_devices(r);
}

// 32: little more than the text; 100: rping's default; 4096 and 16384: several packets.
INSTANTIATE_TEST_SUITE_P(Sizes, Rping, ::testing::Values(32, 100, 4096, 16384),
                         [](const ::testing::TestParamInfo<int>& info) { return "S" + std::to_string(info.param); });

// The IPv6 address of the emulated device at IPv4 address `v4` (docs/rdma-cm.md,
// "Addresses": fd73:7665:7262::a.b.c.d), as 16 bytes and as text.
std::array<uint8_t, 16> device_ipv6_bytes(const std::string& v4) {
  in_addr a{};
  inet_pton(AF_INET, v4.c_str(), &a);
  std::array<uint8_t, 16> v6 = {0xfd, 0x73, 0x76, 0x65, 0x72, 0x62};
  std::memcpy(v6.data() + 12, &a.s_addr, 4);
  return v6;
}
std::string device_ipv6(const std::string& v4) {
  auto v6 = device_ipv6_bytes(v4);
  char text[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, v6.data(), text, sizeof text);
  return text;
}

// The frames of a pcap file (Ethernet link type, as SOFTVERBS_PCAP writes it,
// in this machine's byte order).
std::vector<std::string> pcap_frames(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string d((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> frames;
  for (size_t at = 24; d.size() >= 24 && at + 16 <= d.size();) {
    uint32_t len = 0;
    std::memcpy(&len, d.data() + at + 8, 4);
    if (at + 16 + len > d.size()) break;
    frames.push_back(d.substr(at + 16, len));
    at += 16 + len;
  }
  return frames;
}

// rping between two processes over the server device's IPv6 address: the server
// binds it, the client resolves it with no configuration beyond its own device.
// The client's capture shows what travels (docs/wire.md §1.1): IPv4/UDP frames
// between the two devices' IPv4 addresses, with the IPv6 GIDs inside the CM MADs.
TEST(RpingIpv6, HundredPingsToTheServersIpv6Address) {
  ASSERT_TRUE(installed(bin("rping"), "rdmacm-utils"));
  const std::string pcap = "/tmp/softverbs-rping6-" + std::to_string(getpid()) + ".pcap";
  CmPair r = run_cm_pair(
      {.server = [](const CmAddrs& a) -> std::vector<std::string> {
         return {bin("rping"), "-s", "-v", "-a", device_ipv6(a.server), "-p", std::to_string(a.port), "-C", "100"};
       },
       .client = [](const CmAddrs& a) -> std::vector<std::string> {
         return {bin("rping"), "-c", "-v", "-V", "-a", device_ipv6(a.server), "-p", std::to_string(a.port), "-C",
                 "100"};
       },
       .limit = kCmLimit,
       .client_pcap = pcap});
  std::vector<std::string> frames = pcap_frames(pcap);
  std::remove(pcap.c_str());
  ASSERT_TRUE(r.both_succeeded()) << r.describe();
  EXPECT_TRUE(pings_match(r.client.out, "ping data: ", 100, 64)) << r.describe();
  EXPECT_TRUE(pings_match(r.server.out, "server ping data: ", 100, 64)) << r.describe();
  expect_stderr(r.client, "client", kRpingStderr, r);
  expect_stderr(r.server, "server", kRpingStderr, r);
  expect_clean_devices(r);

  ASSERT_GT(frames.size(), 200u) << "100 pings are several frames each";
  in_addr s{}, c{};
  inet_pton(AF_INET, r.addrs.server.c_str(), &s);
  inet_pton(AF_INET, r.addrs.client.c_str(), &c);
  const auto s6 = device_ipv6_bytes(r.addrs.server), c6 = device_ipv6_bytes(r.addrs.client);
  auto holds = [](const std::string& frame, const std::array<uint8_t, 16>& gid) {
    return frame.find(std::string(reinterpret_cast<const char*>(gid.data()), gid.size())) != std::string::npos;
  };
  int with_gids = 0;
  for (const std::string& fr : frames) {
    ASSERT_GE(fr.size(), 34u);
    EXPECT_EQ(static_cast<uint8_t>(fr[12]), 0x08);  // EtherType IPv4
    EXPECT_EQ(static_cast<uint8_t>(fr[13]), 0x00);
    EXPECT_EQ(static_cast<uint8_t>(fr[14]) >> 4, 4);
    uint32_t src = 0, dst = 0;
    std::memcpy(&src, fr.data() + 26, 4);
    std::memcpy(&dst, fr.data() + 30, 4);
    EXPECT_TRUE((src == c.s_addr && dst == s.s_addr) || (src == s.s_addr && dst == c.s_addr))
        << "a frame between other addresses";
    if (holds(fr, s6) && holds(fr, c6)) ++with_gids;
  }
  // The REQ (path GIDs and the rdma_cm header's addresses) and the REP's retransmits, if any.
  EXPECT_GE(with_gids, 1) << "no CM MAD carries both devices' IPv6 addresses";
}

// rping between two processes on InfiniBand-link-layer devices: the CM routes
// by LID with the port GIDs (docs/rdma-cm.md, "InfiniBand link layer").
TEST(RpingIb, HundredPingsBetweenTwoIbDevices) {
  ASSERT_TRUE(installed(bin("rping"), "rdmacm-utils"));
  CmPair r = run_cm_pair({.server = [](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin("rping"), "-s", "-v", "-a", a.server, "-p", std::to_string(a.port), "-C", "100"};
                          },
                          .client = [](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin("rping"), "-c", "-v", "-V", "-a", a.server, "-p", std::to_string(a.port),
                                    "-C", "100"};
                          },
                          .limit = kCmLimit,
                          .link = "/ib"});
  ASSERT_TRUE(r.both_succeeded()) << r.describe();
  EXPECT_TRUE(pings_match(r.client.out, "ping data: ", 100, 64)) << r.describe();
  EXPECT_TRUE(pings_match(r.server.out, "server ping data: ", 100, 64)) << r.describe();
  expect_stderr(r.client, "client", kRpingStderr, r);
  expect_stderr(r.server, "server", kRpingStderr, r);
  expect_clean_devices(r);
}

// No SOFTVERBS_DEVICES anywhere: the server listens on every address (no -a), the
// client asks for 127.0.0.1, and the loopback service finds the server's device.
TEST(RpingUnconfigured, WildcardServerLoopbackClient) {
  ASSERT_TRUE(installed(bin("rping"), "rdmacm-utils"));
  CmPair r = run_cm_pair({.server = [](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin("rping"), "-s", "-v", "-p", std::to_string(a.port), "-C", "100"};
                          },
                          .client = [](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin("rping"),           "-c", "-v", "-V", "-a", "127.0.0.1", "-p",
                                    std::to_string(a.port), "-C", "100"};
                          },
                          .limit = kCmLimit,
                          .automatic_devices = true});
  ASSERT_TRUE(r.both_succeeded()) << r.describe();
  // rping's default size is 64 bytes (its manual page says 100).
  EXPECT_TRUE(pings_match(r.client.out, "ping data: ", 100, 64)) << r.describe();
  EXPECT_TRUE(pings_match(r.server.out, "server ping data: ", 100, 64)) << r.describe();
  DeviceReport s, c;
  ASSERT_TRUE(clean_device_report(r.server, "server", &s)) << r.describe();
  ASSERT_TRUE(clean_device_report(r.client, "client", &c)) << r.describe();
  EXPECT_NE(s.address, c.address) << r.describe();
  EXPECT_EQ(s.address, r.addrs.server) << r.describe();
}

// The same past a device of the host that never answers (a UDP socket on port 4791
// that nothing reads, as the device of a process that does not run the CM): bound
// after the server's device, it is the first device of the host the loopback service
// tries (the kernel lists the newest socket first). It is passed over after one
// unanswered REQ (emu/cm/protocol.cpp), not after all of the CM's retries (minutes).
TEST(RpingUnconfigured, LoopbackClientPassesASilentDevice) {
  ASSERT_TRUE(installed(bin("rping"), "rdmacm-utils"));
  int silent = -1;
  std::string silent_addr;
  auto bind_silent = [&](const CmAddrs&) {
    if (silent >= 0) ::close(silent);
    silent_addr = unused_device_address();
    silent = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(4791);
    ::inet_pton(AF_INET, silent_addr.c_str(), &a.sin_addr);
    ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << silent_addr;
  };
  CmPair r =
      run_cm_pair({.server = [](const CmAddrs& a) -> std::vector<std::string> {
                     return {bin("rping"), "-s", "-v", "-p", std::to_string(a.port), "-C", "10"};
                   },
                   .client = [](const CmAddrs& a) -> std::vector<std::string> {
                     return {bin("rping"), "-c", "-v", "-a", "127.0.0.1", "-p", std::to_string(a.port), "-C", "10"};
                   },
                   .limit = kCmLimit,
                   .automatic_devices = true,
                   .before_client = bind_silent});
  if (silent >= 0) ::close(silent);
  ASSERT_TRUE(r.both_succeeded()) << "silent device " << silent_addr << "\n" << r.describe();
  EXPECT_TRUE(pings_match(r.client.out, "ping data: ", 10, 64)) << r.describe();
  // One retry interval (1.5 response timeouts, 6.4 s by default) for the silent
  // device, not its 15 retries.
  EXPECT_LT(r.client.elapsed, milliseconds(20000)) << r.describe();
}

// ---------------------------------------------------------------------------
// ucmatose (RC) and udaddy (UD): N connections, 10 messages each way on each.

struct CmatoseCase {
  const char* program;
  const char* connections;
};

class Cmatose : public ::testing::TestWithParam<CmatoseCase> {
 protected:
  void SetUp() override { ASSERT_TRUE(installed(bin(GetParam().program), "rdmacm-utils")); }
};

TEST_P(Cmatose, ReturnsStatusZero) {
  const CmatoseCase& c = GetParam();
  CmPair r = run_cm_pair({.server = [&](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin(c.program), "-b", a.server, "-c", c.connections};
                          },
                          .client = [&](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin(c.program), "-s", a.server, "-c", c.connections};
                          },
                          .limit = kCmLimit});
  ASSERT_TRUE(r.both_succeeded()) << r.describe();
  for (const auto& [side, p] : {std::pair{"server", &r.server}, std::pair{"client", &r.client}}) {
    EXPECT_NE(p->out.find("data transfers complete"), std::string::npos) << side << "\n" << r.describe();
    EXPECT_NE(p->out.find("return status 0"), std::string::npos) << side << "\n" << r.describe();
    expect_stderr(*p, side, {}, r);
  }
  expect_clean_devices(r);
}

INSTANTIATE_TEST_SUITE_P(Programs, Cmatose,
                         ::testing::Values(CmatoseCase{"ucmatose", "10"}, CmatoseCase{"udaddy", "10"}),
                         [](const ::testing::TestParamInfo<CmatoseCase>& info) {
                           return std::string(info.param.program);
                         });

// ---------------------------------------------------------------------------
// rdma_server / rdma_client: the synchronous librdmacm calls (rdma_getaddrinfo,
// rdma_create_ep, rdma_get_request, rdma_post_send/recv).

TEST(RdmaServerClient, EndZero) {
  ASSERT_TRUE(installed(bin("rdma_server"), "rdmacm-utils"));
  CmPair r = run_cm_pair({.server = [](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin("rdma_server"), "-s", a.server, "-p", std::to_string(a.port)};
                          },
                          .client = [](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin("rdma_client"), "-s", a.server, "-p", std::to_string(a.port)};
                          },
                          .limit = kCmLimit});
  ASSERT_TRUE(r.both_succeeded()) << r.describe();
  EXPECT_NE(r.server.out.find("rdma_server: end 0"), std::string::npos) << r.describe();
  EXPECT_NE(r.client.out.find("rdma_client: end 0"), std::string::npos) << r.describe();
  expect_stderr(r.server, "server", {}, r);
  expect_stderr(r.client, "client", {}, r);
  expect_clean_devices(r);
}

// rdma_xserver / rdma_xclient -c x: the same calls over XRC (RDMA_PS_IB,
// IBV_QPT_XRC_RECV and XRC_SEND from rdma_getaddrinfo): the CM's XRC REQ, the
// target QP on the device's XRC domain, an XRC SRQ from rdma_create_srq whose
// number travels in the REP's private data, and one inline send naming it.
// RoCE and InfiniBand link layers. "-c r" runs the same exchange over RC: its
// 16 inline bytes go on a QP created with max_inline_data 0 and one SGE, which
// takes them because the inline room is at least the SGEs' descriptors, as on
// ConnectX and rxe (docs/compatibility.md, "Queue pairs").
class RdmaXServerClient : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(RdmaXServerClient, EndZero) {
  ASSERT_TRUE(installed(bin("rdma_xserver"), "rdmacm-utils"));
  const std::string type = GetParam().first;
  CmPair r = run_cm_pair({.server = [&](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin("rdma_xserver"), "-c", type, "-p", std::to_string(a.port)};
                          },
                          .client = [&](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin("rdma_xclient"), "-c", type, "-s", a.server, "-p", std::to_string(a.port)};
                          },
                          .limit = kCmLimit,
                          .link = GetParam().second});
  ASSERT_TRUE(r.both_succeeded()) << r.describe();
  EXPECT_NE(r.server.out.find("rdma_xserver: end 0"), std::string::npos) << r.describe();
  EXPECT_NE(r.client.out.find("rdma_xclient: end 0"), std::string::npos) << r.describe();
  expect_stderr(r.server, "server", {}, r);
  expect_stderr(r.client, "client", {}, r);
  expect_clean_devices(r);
}

INSTANTIATE_TEST_SUITE_P(Types, RdmaXServerClient,
                         ::testing::Values(std::pair{"x", ""}, std::pair{"x", "/ib"}, std::pair{"r", ""},
                                           std::pair{"r", "/ib"}),
                         [](const ::testing::TestParamInfo<std::pair<const char*, const char*>>& info) {
                           return std::string(info.param.first[0] == 'x' ? "Xrc" : "Rc") +
                                  (info.param.second[0] ? "Ib" : "Roce");
                         });

// ---------------------------------------------------------------------------
// cmtime: 100 connections set up and torn down, each step timed. rdma-core 44's
// server never exits: it is stopped once the client is done.

TEST(Cmtime, HundredConnections) {
  ASSERT_TRUE(installed(bin("cmtime"), "rdmacm-utils"));
  CmPair r = run_cm_pair({.server = [](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin("cmtime"), "-b", a.server, "-c", "100", "-p", std::to_string(a.port)};
                          },
                          .client = [](const CmAddrs& a) -> std::vector<std::string> {
                            return {bin("cmtime"), "-s", a.server, "-c", "100", "-p", std::to_string(a.port)};
                          },
                          .limit = kCmLimit,
                          .kill_server = true});
  ASSERT_TRUE(r.client_succeeded()) << r.describe();
  EXPECT_TRUE(r.server_killed) << "the server ended by itself\n" << r.describe();
  EXPECT_TRUE(r.both_succeeded()) << r.describe();
  // "connect      :       38.75      37.66   31600.00     387.52"
  static const std::regex row(R"(^([a-z ]+?)\s*:\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$)");
  std::vector<std::string> steps;
  for (const std::string& line : lines_of(r.client.out)) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    steps.push_back(m[1]);
    EXPECT_GE(std::stod(m[2]), 0.0) << line;
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"create id", "resolve addr", "resolve route", "create qp", "connect",
                                             "disconnect", "destroy"}))
      << r.describe();
  expect_stderr(r.client, "client", {}, r);
  expect_clean_devices(r, /*server_counters=*/false);  // a stopped server prints none
}

// ---------------------------------------------------------------------------
// perftest -R: the connection and the exchange of addresses through rdma_cm.

struct CmPerftestCase {
  std::string name, program;
  std::vector<std::string> args;
  std::string connection = "RC";
};

void PrintTo(const CmPerftestCase& c, std::ostream* os) { *os << c.name; }

class PerftestRdmaCm : public ::testing::TestWithParam<CmPerftestCase> {
 protected:
  void SetUp() override { ASSERT_TRUE(installed(bin(GetParam().program.c_str()), "perftest")); }
};

TEST_P(PerftestRdmaCm, ReportsAResult) {
  const CmPerftestCase& c = GetParam();
  auto argv = [&](const CmAddrs& a, bool server) {
    std::vector<std::string> v{bin(c.program.c_str()), "-R", "-d", server ? "s" : "c", "-x", "1", "-p",
                               std::to_string(a.port)};
    v.insert(v.end(), c.args.begin(), c.args.end());
    if (!server) v.push_back(a.server);
    return v;
  };
  CmPair r = run_cm_pair({.server = [&](const CmAddrs& a) { return argv(a, true); },
                          .client = [&](const CmAddrs& a) { return argv(a, false); },
                          .limit = kPerftestLimit});
  ASSERT_TRUE(r.both_succeeded()) << r.describe();
  PerftestOutput s = parse_perftest(r.server.out), cl = parse_perftest(r.client.out);
  for (const auto& [side, o, p] : {std::tuple{"server", &s, &r.server}, std::tuple{"client", &cl, &r.client}}) {
    EXPECT_EQ(o->header["Data ex. method"], "rdma_cm") << side << "\n" << r.describe();
    EXPECT_EQ(o->header["Connection type"], c.connection) << side << "\n" << r.describe();
    ASSERT_EQ(o->local.size(), 1u) << side << "\n" << r.describe();
    ASSERT_EQ(o->remote.size(), 1u) << side << "\n" << r.describe();
    std::vector<std::string> allowed = kPerftestStderr;
    if (c.connection == "UD") {
      // ib_send_bw -c UD without -s: its default size is larger than a datagram.
      allowed.insert(allowed.end(), {" Max msg size in UD is MTU *", " Changing to this MTU"});
    }
    expect_stderr(*p, side, allowed, r);
  }
  // Each side's GID is its device's address, and what one sent the other got.
  EXPECT_EQ(gid_ipv4(s.local[0].gid), r.addrs.server) << r.describe();
  EXPECT_EQ(gid_ipv4(cl.local[0].gid), r.addrs.client) << r.describe();
  EXPECT_EQ(s.local[0].qpn, cl.remote[0].qpn) << r.describe();
  EXPECT_EQ(cl.local[0].qpn, s.remote[0].qpn) << r.describe();
  // The result line: one row with positive figures.
  ASSERT_EQ(cl.rows.size(), 1u) << r.describe();
  const Row& row = cl.rows[0];
  EXPECT_GT(row.bytes, 0u) << r.describe();
  EXPECT_GT(row.iters, 0u) << r.describe();
  ASSERT_GE(row.values.size(), 3u) << r.describe();
  EXPECT_GT(row.values[c.program.ends_with("_lat") ? 0 : 2], 0.0) << "t_min or the message rate\n" << r.describe();
  expect_clean_devices(r);
}

INSTANTIATE_TEST_SUITE_P(
    Programs, PerftestRdmaCm,
    ::testing::Values(CmPerftestCase{"SendBw", "ib_send_bw", {}}, CmPerftestCase{"SendLat", "ib_send_lat", {}},
                      CmPerftestCase{"WriteBw", "ib_write_bw", {}}, CmPerftestCase{"WriteLat", "ib_write_lat", {}},
                      CmPerftestCase{"ReadBw", "ib_read_bw", {}}, CmPerftestCase{"ReadLat", "ib_read_lat", {}},
                      CmPerftestCase{"SendBwUd", "ib_send_bw", {"-c", "UD"}, "UD"}),
    [](const ::testing::TestParamInfo<CmPerftestCase>& info) { return info.param.name; });

}  // namespace
}  // namespace softverbs::test
