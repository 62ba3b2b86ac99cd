// Determinism of virtual time (docs/simulation.md, "Determinism"): the
// single-threaded workload of virtual_replay.c, run three times under
// SOFTVERBS_CLOCK=virtual with the same fault seed and fixed device addresses,
// prints the same completions at the same virtual times and writes the same
// capture, byte for byte (packet order, contents and timestamps). A different
// seed gives a different run, so the comparison is not vacuous.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "tests/support/process.hpp"

namespace softverbs::test {
namespace {

struct Replay {
  std::string out;
  std::string pcap;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

Replay run_once(const std::string& seed, int index) {
  const std::string pcap =
      ::testing::TempDir() + "sv_virtual_replay_" + std::to_string(::getpid()) + "_" + std::to_string(index) + ".pcap";
  Env env = Env::inherit()
                .set("SOFTVERBS_CLOCK", "virtual")
                .set("SOFTVERBS_DEVICES", "emu0@127.0.201.10,emu1@127.0.201.11")
                .set("SOFTVERBS_FAULT_SEED", seed)
                .set("SOFTVERBS_PCAP", pcap)
                .unset("SOFTVERBS_FAULTS");
  ProcessResult r = run({SV_VIRTUAL_REPLAY}, env, std::chrono::seconds(60));
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  Replay out{r.out, slurp(pcap)};
  ::unlink(pcap.c_str());
  return out;
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

}  // namespace
}  // namespace softverbs::test
