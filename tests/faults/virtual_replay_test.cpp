// Determinism of virtual time (docs/simulation.md, "Determinism"): the
// single-threaded workload of virtual_replay.c (RC WRITE, READ, SEND, atomics
// and RNR waits, UD SENDs, under seeded drops, duplicates, reordering and
// delays), run under SOFTVERBS_CLOCK=virtual with the same fault seed and fixed
// device addresses, prints the same completions at the same virtual times and
// writes the same capture and the same trace, byte for byte (packet order,
// contents and timestamps): three times in SameSeedSameRun, a hundred times in
// HundredRunsSameTrace. A different seed gives a different run, so the
// comparison is not vacuous. The capture of that in-process pair also shows
// every packet with a correct ICRC, although in-process packets go without one
// when nothing shows them (fabric/link.hpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/support/process.hpp"
#include "wire/icrc.hpp"

namespace softverbs::test {
namespace {

struct Replay {
  std::string out;
  std::string pcap;
  std::string trace;  // empty unless asked for
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The devices' fixed addresses (the QPNs, GIDs and ICRCs follow them): the same
// for every run of this test process, and its own (from its process id, in
// 127.201/16, which automatic addresses do not use), so that other copies of the
// suite running at the same time on this host do not take them.
std::string devices() {
  static const std::string list = [] {
    const unsigned pid = static_cast<unsigned>(::getpid());
    const std::string net = "127.201." + std::to_string((pid / 127) % 256) + ".";
    const unsigned host = 2 * (pid % 127) + 1;
    return "emu0@" + net + std::to_string(host) + ",emu1@" + net + std::to_string(host + 1);
  }();
  return list;
}

// One run of the workload with this seed; with traced, under SOFTVERBS_TRACE too.
Replay run_once(const std::string& seed, int index, bool traced = false) {
  const std::string base =
      ::testing::TempDir() + "sv_virtual_replay_" + std::to_string(::getpid()) + "_" + std::to_string(index);
  const std::string pcap = base + ".pcap", trace = base + ".json";
  Env env = Env::inherit()
                .set("SOFTVERBS_CLOCK", "virtual")
                .set("SOFTVERBS_DEVICES", devices())
                .set("SOFTVERBS_FAULT_SEED", seed)
                .set("SOFTVERBS_PCAP", pcap)
                .unset("SOFTVERBS_FAULTS")
                .unset("SOFTVERBS_TRACE");
  if (traced) env.set("SOFTVERBS_TRACE", trace);
  ProcessResult r = run({SV_VIRTUAL_REPLAY}, env, std::chrono::seconds(60));
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  Replay out{r.out, slurp(pcap), traced ? slurp(trace) : std::string()};
  ::unlink(pcap.c_str());
  if (traced) ::unlink(trace.c_str());
  return out;
}

// Frames of a capture (wire/pcap.cpp: microsecond pcap, host byte order,
// Ethernet + IPv4 without options + UDP) whose ICRC does not verify, and the
// number of frames.
struct IcrcTally {
  size_t frames = 0, bad = 0;
};

IcrcTally check_icrcs(const std::string& d) {
  IcrcTally t;
  constexpr size_t kFileHeader = 24, kRecord = 16, kEth = 14, kIp = 20, kUdp = 8;
  size_t at = kFileHeader;
  while (at + kRecord <= d.size()) {
    uint32_t len = 0;
    std::memcpy(&len, d.data() + at + 8, 4);
    at += kRecord;
    if (at + len > d.size() || len < kEth + kIp + kUdp + 4) break;
    const auto* ip = reinterpret_cast<const uint8_t*>(d.data() + at + kEth);
    const uint8_t* udp = ip + kIp;
    softverbs::wire::Ipv4Flow f;
    std::memcpy(f.saddr.data(), ip + 12, 4);
    std::memcpy(f.daddr.data(), ip + 16, 4);
    f.id = static_cast<uint16_t>(ip[4] << 8 | ip[5]);
    f.frag_off = static_cast<uint16_t>(ip[6] << 8 | ip[7]);
    f.sport = static_cast<uint16_t>(udp[0] << 8 | udp[1]);
    f.dport = static_cast<uint16_t>(udp[2] << 8 | udp[3]);
    const size_t payload = len - kEth - kIp - kUdp;
    const uint8_t* p = udp + kUdp;
    const uint32_t stored = static_cast<uint32_t>(p[payload - 4]) | p[payload - 3] << 8 | p[payload - 2] << 16 |
                            static_cast<uint32_t>(p[payload - 1]) << 24;
    ++t.frames;
    if (softverbs::wire::icrc(softverbs::wire::IcrcFlow{f}, std::span<const uint8_t>(p, payload - 4)) != stored) ++t.bad;
    at += len;
  }
  return t;
}

TEST(VirtualTime, CaptureOfAnInProcessPairCarriesValidIcrcs) {
  const Replay run = run_once("7", 10);
  const IcrcTally t = check_icrcs(run.pcap);
  EXPECT_GT(t.frames, 10u);
  EXPECT_EQ(t.bad, 0u) << t.bad << " of " << t.frames << " frames with a wrong ICRC";
}

TEST(VirtualTime, SameSeedSameRun) {
  const Replay first = run_once("7", 0);
  ASSERT_FALSE(first.out.empty());
  ASSERT_GT(first.pcap.size(), 24u);  // more than the file header
  std::cout << first.out;
  for (int i = 1; i < 3; ++i) {
    const Replay again = run_once("7", i);
    EXPECT_EQ(again.out, first.out) << "run " << i;
    EXPECT_TRUE(again.pcap == first.pcap)
        << "run " << i << ": the captures differ (" << again.pcap.size() << " and " << first.pcap.size() << " bytes)";
  }
  const Replay other = run_once("8", 3);
  EXPECT_NE(other.out, first.out);
}

// The acceptance figure of determinism: 100 runs of the workload (120
// operations, every kind of operation and fault) with the same seed write the
// same trace and the same capture, byte for byte; another seed makes other
// fault decisions, so its trace differs. A few seconds (docs/simulation.md).
TEST(VirtualTime, HundredRunsSameTrace) {
  constexpr int kRuns = 100;
  const Replay first = run_once("11", 100, true);
  ASSERT_GT(first.trace.size(), 1000u);
  ASSERT_NE(first.trace.find("\"fault\":\"drop\""), std::string::npos) << "the seed drops no packet";
  ASSERT_NE(first.trace.find("rnr_wait armed"), std::string::npos) << "no RNR wait";
  ASSERT_NE(first.trace.find("\"UD_SEND_ONLY\""), std::string::npos) << "no UD datagram";
  int differ = 0;
  for (int i = 1; i < kRuns && differ < 3; ++i) {  // three differing runs say enough
    const Replay again = run_once("11", 100 + i, true);
    const bool same = again.trace == first.trace && again.pcap == first.pcap && again.out == first.out;
    if (!same) ++differ;
    EXPECT_TRUE(again.trace == first.trace)
        << "run " << i << ": the traces differ (" << again.trace.size() << " and " << first.trace.size() << " bytes)";
    EXPECT_TRUE(again.pcap == first.pcap) << "run " << i << ": the captures differ";
    EXPECT_EQ(again.out, first.out) << "run " << i;
  }
  const Replay other = run_once("12", 200, true);
  EXPECT_NE(other.trace, first.trace) << "another seed, the same fault decisions";
}

}  // namespace
}  // namespace softverbs::test
