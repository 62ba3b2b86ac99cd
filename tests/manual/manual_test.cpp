// The example programs of the "RDMA Aware Networks Programming User Manual"
// (rc_verbs.c: 7.2, mcast_cm_verbs.c: 7.4, mcast_rdma_verbs.c: 8.2, srq.c: 8.3),
// compiled from the printed text (tests/manual/CMakeLists.txt) and run on our
// libraries as the manual says to run them: a server and a client, or a receiver
// and a sender, as two processes, each on an emulated device of its own. Each run
// is bounded in time; the checks are the exit statuses and the lines that show the
// data went through (the RC example's "Message is: ..." and buffer contents, the
// multicast receivers' completion counts, the SRQ example's receive counts per QP).
//
// Addresses: devices 127.204.0.1-127.204.0.14 and groups 239.204.0.1-239.204.0.5,
// one set per case (ctest runs cases in parallel), used by no other test; the SRQ pairs take free 127.77.x.y addresses (cm_pair.hpp).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/clients/cm_pair.hpp"
#include "tests/clients/program_pair.hpp"

namespace softverbs::test {
namespace {

constexpr const char* kRcVerbs = SV_MANUAL_RC_VERBS;
constexpr const char* kMcastCmVerbs = SV_MANUAL_MCAST_CM_VERBS;
constexpr const char* kMcastRdmaVerbs = SV_MANUAL_MCAST_RDMA_VERBS;
constexpr const char* kSrq = SV_MANUAL_SRQ;

constexpr milliseconds kLimit{60000};

bool contains(const std::string& text, const std::string& piece) { return text.find(piece) != std::string::npos; }

// The lines that start with prefix, in order.
std::vector<std::string> lines_starting(const std::string& text, const std::string& prefix) {
  std::vector<std::string> v;
  for (const std::string& line : lines_of(text))
    if (line.starts_with(prefix)) v.push_back(line);
  return v;
}

// A multicast sender's device: it joined as a full member, so it gets its own
// datagrams back and drops them for want of receives (dropped), or, once it has
// left, as packets for no QP (unknown_qp); none of them is damaged.
void expect_sender_device_undamaged(const ProcessResult& p) {
  std::vector<DeviceReport> devs = parse_device_reports(p.err);
  ASSERT_EQ(devs.size(), 1u) << p.describe();
  ASSERT_FALSE(devs[0].counters.empty()) << p.describe();
  EXPECT_EQ(devs[0].counter("icrc_err"), 0u) << devs[0].describe_counters();
  EXPECT_EQ(devs[0].counter("malformed"), 0u) << devs[0].describe_counters();
}

void expect_only_info_on_stderr(const ProcessResult& p, const std::string& side,
                                const std::vector<std::string>& allowed = {}) {
  auto extra = unexpected_stderr(p.err, allowed);
  EXPECT_TRUE(extra.empty()) << side << ": unexpected stderr:\n" << join_lines(extra) << p.describe();
}

// ---------------------------------------------------------------------------
// 7.2: RC over verbs, the QPs' details exchanged over TCP. The server (no host
// argument) sends "SEND operation "; the client receives it, RDMA-reads the
// server's buffer ("RDMA read operation ") and RDMA-writes "RDMA write operation"
// into it, which the server prints once the client is done.

struct RcCase {
  std::string name;
  std::string link;                // "" (RoCE) or "/ib"
  std::vector<std::string> extra;  // -g on RoCE: its address vectors need a GRH
  std::string saddr, caddr;        // the devices
  std::string remote_id_line;      // what the client prints about the server's port
};
void PrintTo(const RcCase& c, std::ostream* os) { *os << c.name; }

class RcVerbs : public ::testing::TestWithParam<RcCase> {};

TEST_P(RcVerbs, SendReadWriteBetweenTwoDevices) {
  const RcCase& c = GetParam();
  const std::string &saddr = c.saddr, &caddr = c.caddr;
  Env senv = client_env().set("SOFTVERBS_LOG", "info").set("SOFTVERBS_DEVICES", "s@" + saddr + c.link);
  Env cenv = client_env().set("SOFTVERBS_LOG", "info").set("SOFTVERBS_DEVICES", "c@" + caddr + c.link);
  PairResult r = run_pair(
      [&](uint16_t port) {
        std::vector<std::string> argv = {kRcVerbs, "-p", std::to_string(port)};
        argv.insert(argv.end(), c.extra.begin(), c.extra.end());
        return argv;
      },
      senv, cenv, kLimit);
  ASSERT_TRUE(r.both_succeeded()) << r.describe();

  const std::string& co = r.client.out;
  EXPECT_TRUE(contains(co, "Message is: 'SEND operation '\n")) << r.describe();
  EXPECT_TRUE(contains(co, "Contents of server's buffer: 'RDMA read operation '\n")) << r.describe();
  EXPECT_TRUE(contains(co, "Now replacing it with: 'RDMA write operation'\n")) << r.describe();
  EXPECT_TRUE(contains(co, c.remote_id_line)) << r.describe();
  EXPECT_TRUE(contains(co, "\ntest result is 0\n")) << r.describe();
  // One RECV, one RDMA Read and one RDMA Write completion, each successful.
  EXPECT_EQ(lines_starting(co, "completion was found in CQ with status 0x0").size(), 3u) << r.describe();

  const std::string& so = r.server.out;
  EXPECT_TRUE(contains(so, "going to send the message: 'SEND operation '\n")) << r.describe();
  EXPECT_TRUE(contains(so, "Send Request was posted\n")) << r.describe();
  EXPECT_TRUE(contains(so, "Contents of server buffer: 'RDMA write operation'\n")) << r.describe();
  EXPECT_TRUE(contains(so, "\ntest result is 0\n")) << r.describe();
  EXPECT_EQ(lines_starting(so, "completion was found in CQ with status 0x0").size(), 1u) << r.describe();

  DeviceReport s, cl;
  EXPECT_TRUE(clean_device_report(r.server, "server", &s)) << r.describe();
  EXPECT_TRUE(clean_device_report(r.client, "client", &cl)) << r.describe();
  EXPECT_EQ(s.address, saddr) << r.describe();
  EXPECT_EQ(cl.address, caddr) << r.describe();
  expect_only_info_on_stderr(r.server, "server");
  expect_only_info_on_stderr(r.client, "client");
}

// On RoCE, GID index 1 is the IPv4-mapped GID of the device's address and GID
// index 0 its link-local GID (fe80:: and the EUI-64 of MAC 02:00:7f:cc:00:0d); the
// IB case's addresses give LIDs 3 and 4.
INSTANTIATE_TEST_SUITE_P(
    Links, RcVerbs,
    ::testing::Values(RcCase{"RoCE", "", {"-g", "1"}, "127.204.0.1", "127.204.0.2",
                             "Remote GID =00:00:00:00:00:00:00:00:00:00:ff:ff:7f:cc:00:01\n"},
                      RcCase{"RoCE_LinkLocalGid", "", {"-g", "0"}, "127.204.0.13", "127.204.0.14",
                             "Remote GID =fe:80:00:00:00:00:00:00:00:00:7f:ff:fe:cc:00:0d\n"},
                      RcCase{"InfiniBand", "/ib", {}, "127.204.0.3", "127.204.0.4", "Remote LID = 0x3\n"}),
    [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------
// Multicast: the receiver starts first; the sender's datagrams go to the group's
// members of the moment, so it starts once the receiver's QP is attached (the
// abstract name fabric/mcast_directory.cpp binds for a member).

bool attached(const std::string& group, const std::string& device_addr) {
  const std::string name = "@softverbs/mcast/::ffff:" + group + "/" + device_addr;
  std::ifstream in("/proc/net/unix");
  for (std::string line; std::getline(in, line);)
    if (line.ends_with(name)) return true;
  return false;
}

struct McastRun {
  ProcessResult receiver, sender;
  std::string describe() const {
    return "=== receiver ===\n" + receiver.describe() + "\n=== sender ===\n" + sender.describe();
  }
};

McastRun run_mcast(const std::vector<std::string>& receiver_argv, const std::vector<std::string>& sender_argv,
                   const std::string& group, const std::string& raddr, const std::string& saddr) {
  McastRun m;
  Env renv = client_env().set("SOFTVERBS_LOG", "info").set("SOFTVERBS_DEVICES", "r@" + raddr);
  Env senv = client_env().set("SOFTVERBS_LOG", "info").set("SOFTVERBS_DEVICES", "s@" + saddr);
  Process receiver(receiver_argv, renv, shown_env(renv));
  if (!receiver.wait_until([&] { return attached(group, raddr); }, kListenTimeout)) {
    m.receiver = receiver.wait(kPeerGrace);
    m.receiver.err += "\n[test] the receiver never joined " + group;
    return m;
  }
  m.sender = run_client(sender_argv, senv, kLimit);
  m.receiver = receiver.wait(m.sender.exited_with(0) ? kLimit : kPeerGrace);
  return m;
}

// 7.4 (mckey): "-b <IP address>" names the device (7.3, note 4). The receiver
// posts -C receives and reports "data transfers complete" once it has polled -C
// completions; the sender posts its -C sends 3 s after its join.
struct MckeyCase {
  std::string name, group;
  std::vector<std::string> options;  // -C/-S, or none: the defaults, 10 messages of 100 bytes
  int count;
  std::string raddr, saddr;  // the devices
};
void PrintTo(const MckeyCase& c, std::ostream* os) { *os << c.name; }

class McastCmVerbs : public ::testing::TestWithParam<MckeyCase> {};

TEST_P(McastCmVerbs, ReceiverCompletesEveryMessage) {
  const MckeyCase& c = GetParam();
  const std::string &raddr = c.raddr, &saddr = c.saddr;
  std::vector<std::string> rargv = {kMcastCmVerbs, "-m", c.group, "-b", raddr};
  std::vector<std::string> sargv = {kMcastCmVerbs, "-m", c.group, "-b", saddr, "-s"};
  rargv.insert(rargv.end(), c.options.begin(), c.options.end());
  sargv.insert(sargv.end(), c.options.begin(), c.options.end());
  McastRun m = run_mcast(rargv, sargv, c.group, raddr, saddr);
  ASSERT_TRUE(m.sender.exited_with(0)) << m.describe();
  ASSERT_TRUE(m.receiver.exited_with(0)) << m.describe();
  const std::string joined = "mckey: joined dgid: ::ffff:" + c.group + "\n";
  EXPECT_TRUE(contains(m.receiver.out, "mckey: starting server\n")) << m.describe();
  EXPECT_TRUE(contains(m.sender.out, "mckey: starting client\n")) << m.describe();
  for (const ProcessResult* p : {&m.receiver, &m.sender}) {
    EXPECT_TRUE(contains(p->out, joined)) << m.describe();
    EXPECT_TRUE(contains(p->out, "data transfers complete\ntest complete\nreturn status 0\n")) << m.describe();
  }
  EXPECT_TRUE(contains(m.receiver.out, "receiving data transfers\n")) << m.describe();
  EXPECT_TRUE(contains(m.sender.out, "initiating data transfers\n")) << m.describe();
  // The receiver's device took in every datagram, none of them damaged.
  DeviceReport d;
  ASSERT_TRUE(clean_device_report(m.receiver, "receiver", &d)) << m.describe();
  EXPECT_EQ(d.address, raddr);
  EXPECT_GE(d.counter("rx"), static_cast<uint64_t>(c.count)) << d.describe_counters();
  expect_sender_device_undamaged(m.sender);
  expect_only_info_on_stderr(m.receiver, "receiver");
  expect_only_info_on_stderr(m.sender, "sender");
}

INSTANTIATE_TEST_SUITE_P(Messages, McastCmVerbs,
                         ::testing::Values(MckeyCase{"Defaults", "239.204.0.1", {}, 10, "127.204.0.5", "127.204.0.6"},
                                           MckeyCase{"C40_S1024", "239.204.0.2", {"-C", "40", "-S", "1024"}, 40,
                                                     "127.204.0.9", "127.204.0.10"}),
                         [](const auto& info) { return info.param.name; });

// 8.2 (mc.c): run as its header says, "-m" alone (each process has one device),
// the sender with "-s". The receiver prints "received message N" for each
// completion it polls.
//
// The count is at most 3, below the default 4: the program gives its CQ 2 entries
// (3 here, as rxe rounds them) for -c receives, and our ibv_poll_cq hands up every
// datagram waiting on the device's socket at once, so 4 that arrived together
// overrun that CQ (IBTA 11.4.2.1) and the receiver waits for its 4th message
// forever. docs/compatibility.md, "The manual's example programs".
class McastRdmaVerbs : public ::testing::TestWithParam<int> {};

TEST_P(McastRdmaVerbs, ReceiverGetsEveryMessage) {
  const int count = GetParam();
  const std::string group = "239.204.0." + std::to_string(2 + count);  // .4 and .5
  // Devices .7/.8 for -c 2, .11/.12 for -c 3.
  const std::string raddr = "127.204.0." + std::to_string(count == 2 ? 7 : 11),
                    saddr = "127.204.0." + std::to_string(count == 2 ? 8 : 12), n = std::to_string(count);
  McastRun m = run_mcast({kMcastRdmaVerbs, "-m", group, "-c", n}, {kMcastRdmaVerbs, "-s", "-m", group, "-c", n},
                         group, raddr, saddr);
  ASSERT_TRUE(m.sender.exited_with(0)) << m.describe();
  ASSERT_TRUE(m.receiver.exited_with(0)) << m.describe();
  const std::string joined = "joined dgid: ::ffff:" + group + ", mlid 0x0, sl 0\n";
  std::string received = joined + "waiting for messages...\n", sent = joined;
  for (int i = 1; i <= count; ++i) {
    received += "received message " + std::to_string(i) + "\n";
    sent += "sent message " + std::to_string(i) + "\n";
  }
  EXPECT_EQ(m.receiver.out, received) << m.describe();
  EXPECT_EQ(m.sender.out, sent) << m.describe();
  DeviceReport d;
  ASSERT_TRUE(clean_device_report(m.receiver, "receiver", &d)) << m.describe();
  EXPECT_EQ(d.address, raddr);
  EXPECT_EQ(d.counter("rx"), static_cast<uint64_t>(count)) << d.describe_counters();
  expect_sender_device_undamaged(m.sender);
  // The program's CM thread reads main()'s local context through a pointer, also
  // once main() has returned and exit() reuses that stack: a thread that gets to
  // its rdma_get_cm_event only then passes whatever lies there now, which is no
  // event channel (EINVAL here; rdma-core reads through it). The program's own
  // undefined behaviour, harmless to its exit status (mcast_rdma_verbs.c).
  const std::vector<std::string> late_thread = {"rdma_get_cm_event returned -1 errno 22"};
  expect_only_info_on_stderr(m.receiver, "receiver", late_thread);
  expect_only_info_on_stderr(m.sender, "sender", late_thread);
}

INSTANTIATE_TEST_SUITE_P(Counts, McastRdmaVerbs, ::testing::Values(2, 3),
                         [](const auto& info) { return "C" + std::to_string(info.param); });

// ---------------------------------------------------------------------------
// 8.3 (srq.c): the server "-s -a <its address>", the client "-a <the server's
// address>". The client sends -c messages of -l bytes over -q connected QPs in
// rounds of -w, each send on the next QP; the server receives them all through one
// SRQ and answers each round with one send, which the client's SRQ receives.

struct SrqCase {
  std::string name;
  std::vector<std::string> options;
  int messages, qps, rounds;
};
void PrintTo(const SrqCase& c, std::ostream* os) { *os << c.name; }

class Srq : public ::testing::TestWithParam<SrqCase> {};

// The numbers after "<key>: " in the lines that start with prefix.
std::vector<long> numbers_after(const std::vector<std::string>& lines, const std::string& key) {
  std::vector<long> v;
  for (const std::string& line : lines) {
    size_t at = line.find(key + ": ");
    if (at != std::string::npos) v.push_back(std::stol(line.substr(at + key.size() + 2)));
  }
  return v;
}

TEST_P(Srq, EveryMessageThroughTheSharedReceiveQueue) {
  const SrqCase& c = GetParam();
  auto with = [&](std::vector<std::string> argv) {
    argv.insert(argv.end(), c.options.begin(), c.options.end());
    return argv;
  };
  CmPairSpec spec{.server = [&](const CmAddrs& a) -> std::vector<std::string> {
                    return with({kSrq, "-s", "-a", a.server, "-p", std::to_string(a.port)});
                  },
                  .client = [&](const CmAddrs& a) -> std::vector<std::string> {
                    return with({kSrq, "-a", a.server, "-p", std::to_string(a.port)});
                  },
                  .limit = kLimit};
  // The server's "waiting for connection" line is block-buffered: a client that
  // came before the server listened is refused ("rdma_connect returned -1 errno
  // 111", ECONNREFUSED) and the pair is run again.
  CmPair r;
  for (int attempt = 1; attempt <= 5; ++attempt) {
    r = run_cm_pair(spec);
    if (r.both_succeeded() || !contains(r.client.err, "rdma_connect returned -1 errno 111")) break;
  }
  ASSERT_TRUE(r.both_succeeded()) << r.describe();

  // Server: every message received, numbered 1..N, over all the client's QPs.
  const auto srecv = lines_starting(r.server.out, "recv count: ");
  std::vector<long> expected(static_cast<size_t>(c.messages));
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<long>(i) + 1;
  EXPECT_EQ(numbers_after(srecv, "recv count"), expected) << r.describe();
  const auto sqps = numbers_after(srecv, "qp_num");
  EXPECT_EQ(std::set<long>(sqps.begin(), sqps.end()).size(), static_cast<size_t>(c.qps)) << r.describe();
  std::vector<long> rounds(static_cast<size_t>(c.rounds));
  for (size_t i = 0; i < rounds.size(); ++i) rounds[i] = static_cast<long>(i) + 1;
  EXPECT_EQ(numbers_after(lines_starting(r.server.out, "send count: "), "send count"), rounds) << r.describe();

  // Client: every send completed, round-robin over its QPs; one receive per round.
  const auto csend = lines_starting(r.client.out, "send count: ");
  EXPECT_EQ(numbers_after(csend, "send count"), expected) << r.describe();
  const auto cqps = numbers_after(csend, "qp_num");
  EXPECT_EQ(std::set<long>(cqps.begin(), cqps.end()).size(), static_cast<size_t>(c.qps)) << r.describe();
  EXPECT_EQ(numbers_after(lines_starting(r.client.out, "recv count: "), "recv count"), rounds) << r.describe();

  DeviceReport s, cl;
  EXPECT_TRUE(clean_device_report(r.server, "server", &s)) << r.describe();
  EXPECT_TRUE(clean_device_report(r.client, "client", &cl)) << r.describe();
  expect_only_info_on_stderr(r.server, "server");
  expect_only_info_on_stderr(r.client, "client");
}

INSTANTIATE_TEST_SUITE_P(
    Runs, Srq,
    ::testing::Values(
        // The defaults: 100 messages of 100000 bytes, 4 QPs, rounds of 64.
        SrqCase{"Defaults", {}, 100, 4, 2},
        // Rounds of 4 on 3 QPs: 4 + 4 + 2 messages, so the round-robin does not line
        // up with the rounds and the last round is short.
        SrqCase{"C10_L1000_Q3_W4", {"-c", "10", "-l", "1000", "-q", "3", "-w", "4"}, 10, 3, 3}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace softverbs::test
