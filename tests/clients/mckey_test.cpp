// rdmacm-utils' mckey, the Debian binary, between two processes through the
// `softverbs run` launcher: a receiver joins a group and waits for the
// sender's datagrams, which reach it as RoCEv2 multicast (docs/wire.md §1.6).
// Each side has a device of its own; the group and addresses are used by no
// other test.
#include <gtest/gtest.h>

#include <fstream>
#include <ostream>
#include <string>

#include "tests/clients/clients.hpp"

namespace softverbs::test {
namespace {

constexpr const char* kMckey = "/usr/bin/mckey";

// Whether the receiver's device has announced its membership of the group
// (its QP is attached): the abstract name fabric/mcast_directory.cpp binds.
bool attached(const std::string& group, const std::string& device) {
  const std::string name = "@softverbs/mcast/::ffff:" + group + "/" + device;
  std::ifstream in("/proc/net/unix");
  std::string line;
  while (std::getline(in, line))
    if (line.size() >= name.size() && line.compare(line.size() - name.size(), name.size(), name) == 0) return true;
  return false;
}

// -C, -S, and whether the sender joins as a send-only full member (-o).
struct Run {
  std::string count, size;
  bool send_only;
};
void PrintTo(const Run& r, std::ostream* os) { *os << "-C " << r.count << " -S " << r.size << (r.send_only ? " -o" : ""); }

class Mckey : public ::testing::TestWithParam<Run> {
 protected:
  void SetUp() override { ASSERT_TRUE(installed(kMckey, "rdmacm-utils")); }
};

// The receiver posts -C receives and exits 0 once that many datagrams arrived;
// the sender sends them 3 s after its join (mckey's own pause). A send-only
// sender (-o) is not attached to the group and reaches the receiver the same.
TEST_P(Mckey, ReceiverGetsEveryMessageOfTheSender) {
  const auto [count, size, send_only] = GetParam();
  // Addresses and group of this run alone (runs of the suite go in parallel).
  const std::string n = count;
  const std::string kGroup = "239.202.1." + n, kReceiverAddr = "127.0.202." + n,
                    kSenderAddr = "127.0.202." + std::to_string(std::stoi(n) + 1);
  Env recv_env = clean_env().set("SOFTVERBS_DEVICES", "mckr@" + kReceiverAddr);
  Env send_env = clean_env().set("SOFTVERBS_DEVICES", "mcks@" + kSenderAddr);
  Process receiver({kLauncher, "run", "--", kMckey, "-m", kGroup, "-b", kReceiverAddr, "-C", count, "-S", size},
                   recv_env, shown_env(recv_env));
  ASSERT_TRUE(receiver.started());
  // The sender's datagrams go to the members of the moment: start it once the
  // receiver is one.
  ASSERT_TRUE(receiver.wait_until([&] { return attached(kGroup, kReceiverAddr); }, milliseconds(20000)))
      << "the receiver never joined\n"
      << receiver.snapshot().describe();
  std::vector<std::string> argv = {kLauncher, "run", "--", kMckey, "-m", kGroup, "-b", kSenderAddr, "-s",
                                   "-C",       count, "-S", size};
  if (send_only) argv.push_back("-o");
  ProcessResult sender = run_client(argv, send_env, milliseconds(30000));
  ProcessResult r = receiver.wait(milliseconds(20000));
  ASSERT_TRUE(sender.exited_with(0)) << sender.describe();
  ASSERT_TRUE(r.exited_with(0)) << r.describe() << "\n=== sender ===\n" << sender.describe();
  const std::string joined = "mckey: joined dgid: ::ffff:" + kGroup + " mlid 0x0 sl 0";
  for (const ProcessResult* p : {&sender, &r}) {
    EXPECT_NE(p->out.find(joined), std::string::npos) << p->describe();
    EXPECT_NE(p->out.find("data transfers complete"), std::string::npos) << p->describe();
    EXPECT_NE(p->out.find("return status 0"), std::string::npos) << p->describe();
  }
  EXPECT_NE(r.out.find("receiving data transfers"), std::string::npos) << r.describe();
  EXPECT_NE(sender.out.find("initiating data transfers"), std::string::npos) << sender.describe();
}

INSTANTIATE_TEST_SUITE_P(Messages, Mckey,
                         ::testing::Values(Run{"10", "100", false}, Run{"50", "1000", false}, Run{"20", "64", true}),
                         [](const auto& info) {
                           return "C" + info.param.count + "_S" + info.param.size +
                                  (info.param.send_only ? "_SendOnly" : "");
                         });

}  // namespace
}  // namespace softverbs::test
