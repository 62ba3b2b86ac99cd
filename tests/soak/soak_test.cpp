// Reliable-connection tests between two processes, each with its own emulated
// device on its own fixed loopback address, run as two instances of soak_peer
// (peer.cpp). The processes exchange their QP numbers, PSNs, GIDs and rkeys over a
// socketpair this test creates; every byte of data travels as RoCEv2 over UDP.
//
// TwoProcessSoak: both directions at once, a mix of SEND, RDMA WRITE (with and
// without immediate), RDMA READ, FETCH_AND_ADD and CMP_AND_SWAP, while each process's
// fault layer drops 5 %, duplicates 1 % and reorders 1 % of the packets it sends.
// The peers check every completion, message, READ and atomic result (peer.cpp);
// this test checks that both finished, and that the faults really happened.
//
// PeerKilled: one process is killed with SIGKILL while the other has large
// transfers outstanding; the survivor's requests must end in IBV_WC_RETRY_EXC_ERR
// (the oldest unacknowledged one) and IBV_WC_WR_FLUSH_ERR (everything after it),
// within the retry budget and without hanging.
//
// TwoProcessRnr, TwoProcessLostResponse: disabled reproductions of two engine
// problems the soak ran into (docs/faults.md, "Soak and failure tests").
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace softverbs::test {
namespace {

using namespace std::chrono_literals;

constexpr const char* kPeer = SV_SOAK_PEER;  // the soak_peer program
constexpr const char* kLibDir = SV_LIB_DIR;  // our libibverbs.so.1
constexpr milliseconds kGrace{10000};        // how long one peer may outlive the other's failure

// The environment of a peer: its device, and nothing else of softverbs' variables
// except the debugging aids SOFTVERBS_LOG, SOFTVERBS_FAULT_LOG and SOFTVERBS_PCAP
// (given a suffix per side, so that the two processes write separate files).
Env peer_env(const std::string& devices, const std::string& side) {
  Env e = Env::inherit();
  const auto log = e.get("SOFTVERBS_LOG"), fault_log = e.get("SOFTVERBS_FAULT_LOG"), pcap = e.get("SOFTVERBS_PCAP");
  e.unset_prefix("SOFTVERBS_");
  e.set("SOFTVERBS_DEVICES", devices);
  e.set("SOFTVERBS_LOG", log ? *log : "info");  // info: the device line and the counters at exit
  if (fault_log) e.set("SOFTVERBS_FAULT_LOG", *fault_log + "." + side);
  if (pcap) e.set("SOFTVERBS_PCAP", *pcap + "." + side);
  const auto path = e.get("LD_LIBRARY_PATH");
  e.set("LD_LIBRARY_PATH", std::string(kLibDir) + (path && !path->empty() ? ":" + *path : ""));
  e.set("LC_ALL", "C");
  return e;
}

std::string shown(const Env& e) { return e.describe({"SOFTVERBS_"}); }

// A connected pair of stream sockets, one end for each peer.
struct Control {
  int fd[2] = {-1, -1};
  Control() {
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd) != 0) fd[0] = fd[1] = -1;
  }
  ~Control() { close_all(); }
  void close_all() {
    for (int& f : fd) {
      if (f >= 0) ::close(f);
      f = -1;
    }
  }
  bool ok() const { return fd[0] >= 0 && fd[1] >= 0; }
};

// Starts argv with `fd` inherited (every other descriptor of this process is
// close-on-exec); "--fd=N" is appended.
Process spawn_with(std::vector<std::string> argv, const Env& env, int fd) {
  argv.push_back("--fd=" + std::to_string(fd));
  ::fcntl(fd, F_SETFD, 0);
  Process p(std::move(argv), env, shown(env));
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return p;
}

using Both = BothResult;

// Reads both processes' output until both have exited, each at most `limit` from now;
// once one has failed, the other gets kGrace more.
Both wait_both(Process& a, Process& b, milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  return softverbs::test::wait_both(a, deadline, b, deadline, kGrace);
}

// The lines of out that start with `tag`, printed for the record.
void print_lines(const std::string& out, const std::string& tag) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(tag + " ", 0) == 0) std::printf("%s\n", line.c_str());
}

// The key=value pairs of the stdout line that starts with `tag`.
std::map<std::string, std::string> summary(const std::string& out, const std::string& tag) {
  std::map<std::string, std::string> m;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(tag + " ", 0) != 0) continue;
    std::istringstream words(line.substr(tag.size() + 1));
    for (std::string w; words >> w;) {
      size_t eq = w.find('=');
      if (eq != std::string::npos) m[w.substr(0, eq)] = w.substr(eq + 1);
    }
  }
  return m;
}

double num(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? -1 : std::strtod(it->second.c_str(), nullptr);
}

// The fault seed of side a (b gets the next one); SOFTVERBS_SOAK_SEED replaces the
// default, to explore other packet fates.
uint64_t base_seed() {
  const char* s = std::getenv("SOFTVERBS_SOAK_SEED");
  return s && *s ? std::strtoull(s, nullptr, 0) : 11;
}

// ops operations from each side (2 * ops in all) under 5 % drop, 1 % duplication
// and 1 % reordering of every packet sent.
void soak(uint64_t ops, const std::string& addr_a, const std::string& addr_b, std::chrono::seconds limit) {
  Control ctl;
  ASSERT_TRUE(ctl.ok()) << "socketpair: " << std::strerror(errno);
  const uint64_t seed = base_seed();
  auto argv = [&](int side) {
    return std::vector<std::string>{kPeer,
                                    "--role=soak",
                                    "--side=" + std::to_string(side),
                                    "--ops=" + std::to_string(ops),
                                    "--limit-s=" + std::to_string(limit.count()),
                                    "--drop=0.05",
                                    "--dup=0.01",
                                    "--reorder=0.01",
                                    "--fault-seed=" + std::to_string(seed + side)};
  };
  Process a = spawn_with(argv(0), peer_env("soak_a@" + addr_a, "a"), ctl.fd[0]);
  Process b = spawn_with(argv(1), peer_env("soak_b@" + addr_b, "b"), ctl.fd[1]);
  ctl.close_all();  // only the peers hold the ends: one's exit is the other's end of file
  ASSERT_TRUE(a.started()) << a.snapshot().describe();
  ASSERT_TRUE(b.started()) << b.snapshot().describe();
  Both r = wait_both(a, b, limit + 60s);
  const std::string all = r.describe();
  ASSERT_TRUE(r.a.exited_with(0) && r.b.exited_with(0)) << all;

  uint64_t retransmits = 0;
  for (const auto& [name, p] : {std::pair{"a", &r.a}, std::pair{"b", &r.b}}) {
    print_lines(p->out, "soak");
    auto s = summary(p->out, "soak");
    ASSERT_FALSE(s.empty()) << name << ": no summary line\n" << all;
    EXPECT_EQ(num(s, "completed"), static_cast<double>(ops)) << name << "\n" << all;
    // SENDs and WRITEs with immediate: two operations of every six.
    EXPECT_EQ(num(s, "received"), static_cast<double>((ops + 5) / 6 + (ops + 3) / 6)) << name << "\n" << all;
    // The faults really happened, on both sides' packets.
    EXPECT_GT(num(s, "hits_drop"), 0) << name << "\n" << all;
    EXPECT_GT(num(s, "hits_dup"), 0) << name << "\n" << all;
    EXPECT_GT(num(s, "hits_reorder"), 0) << name << "\n" << all;
    EXPECT_EQ(num(s, "icrc_err"), 0) << name << "\n" << all;
    EXPECT_EQ(num(s, "malformed"), 0) << name << "\n" << all;
    retransmits += static_cast<uint64_t>(num(s, "retransmits"));
    ::testing::Test::RecordProperty(std::string("elapsed_ms_") + name, s["elapsed_ms"]);
    ::testing::Test::RecordProperty(std::string("retransmits_") + name, s["retransmits"]);
    ::testing::Test::RecordProperty(std::string("timeouts_") + name, s["timeouts"]);
  }
  // and the transport recovered from them.
  EXPECT_GT(retransmits, 0u) << all;
}

// Addresses outside the automatic range (127.0.1.1-127.0.191.255) and unused by other
// tests, one pair per test: ctest runs tests in parallel.
TEST(TwoProcessSoak, TwentyThousandOperations) { soak(10000, "127.2.1.1", "127.2.1.2", 150s); }

TEST(TwoProcessSoak, LongMillionOperations) { soak(500000, "127.2.2.1", "127.2.2.2", 3000s); }

TEST(PeerKilled, OutstandingRequestsFailWithRetryExceededThenFlush) {
  Control ctl;
  ASSERT_TRUE(ctl.ok()) << "socketpair: " << std::strerror(errno);
  Process victim = spawn_with({kPeer, "--role=victim"}, peer_env("victim@127.2.3.2", "victim"), ctl.fd[1]);
  ASSERT_TRUE(victim.started()) << victim.snapshot().describe();
  Process survivor = spawn_with({kPeer, "--role=survivor", "--peer-pid=" + std::to_string(victim.pid())},
                                peer_env("survivor@127.2.3.1", "survivor"), ctl.fd[0]);
  ctl.close_all();
  ASSERT_TRUE(survivor.started()) << survivor.snapshot().describe();
  Both r = wait_both(survivor, victim, 60s);
  const std::string all = r.describe();
  ASSERT_TRUE(r.a.exited_with(0)) << "the survivor failed\n" << all;
  EXPECT_EQ(r.b.term_signal, SIGKILL) << "the victim should have been killed by the survivor\n" << all;

  print_lines(r.a.out, "survivor");
  auto s = summary(r.a.out, "survivor");
  ASSERT_FALSE(s.empty()) << "no summary line\n" << all;
  // The local ACK timeout: 4.096 us * 2^timeout (at least 1 ms). The oldest request
  // fails at the (retry_cnt + 1)th timeout in a row without a packet from the peer,
  // the timeouts at least one timeout apart. The peer answered until just before the
  // kill (the survivor kills it as soon as a request of the transfer completed), so
  // the failure comes at least (retry_cnt + 1) timeouts after the kill.
  const double timeout_ms = std::max(4.096e-3 * static_cast<double>(1ull << static_cast<int>(num(s, "timeout"))), 1.0);
  const double min_ms = (num(s, "retry_cnt") + 1) * timeout_ms;
  EXPECT_GE(num(s, "error_ms"), min_ms) << "the request failed too early\n" << all;
  EXPECT_LE(num(s, "error_ms"), 10000) << "the request failed too late\n" << all;
  EXPECT_LE(num(s, "last_flush_ms"), 10000) << all;
  EXPECT_GE(num(s, "timeouts"), num(s, "retry_cnt") + 1) << all;
  RecordProperty("error_ms", s["error_ms"]);
  RecordProperty("succeeded", s["succeeded"]);
  RecordProperty("in_flight_at_kill", s["in_flight_at_kill"]);
}

// A receiver that posts its receives late, while the sender's second message reaches
// it well after the first (held back 300 us by the sender's fault layer): the
// responder answers the first with an RNR NAK every round, and must drop the second
// silently meanwhile (a PSN sequence NAK for it would start a competing
// retransmission that the requester counts against retry_cnt). With rnr_retry 7
// the sender waits for the receiver as long as it takes, and both SENDs succeed.
TEST(TwoProcessRnr, SlowReceiverDoesNotExhaustRetries) {
  Control ctl;
  ASSERT_TRUE(ctl.ok()) << "socketpair: " << std::strerror(errno);
  Process sender = spawn_with({kPeer, "--role=rnr-sender"}, peer_env("rnr_s@127.2.4.1", "sender"), ctl.fd[0]);
  Process receiver = spawn_with({kPeer, "--role=rnr-receiver"}, peer_env("rnr_r@127.2.4.2", "receiver"), ctl.fd[1]);
  ctl.close_all();
  ASSERT_TRUE(sender.started()) << sender.snapshot().describe();
  ASSERT_TRUE(receiver.started()) << receiver.snapshot().describe();
  Both r = wait_both(sender, receiver, 60s);
  print_lines(r.a.out, "rnr-sender");
  EXPECT_TRUE(r.a.exited_with(0) && r.b.exited_with(0)) << r.describe();
  auto s = summary(r.a.out, "rnr-sender");
  EXPECT_GT(num(s, "delayed"), 0) << "the fault rule never fired\n" << r.describe();
}

// A FETCH_AND_ADD whose response is lost twice (the original and the first replay),
// followed by one-packet RDMA WRITEs of which each go-back-N round loses one, so that
// every round ends in a PSN sequence NAK for a later PSN: the responder answers and
// progresses every round. Each such NAK must ask for the atomic response again (the
// responder answers it from its cache), so the FETCH_AND_ADD completes, once, with
// the right value, instead of the NAKs spending retry_cnt without progress.
TEST(TwoProcessLostResponse, AtomicResponseLostDuringGoBackRounds) {
  Control ctl;
  ASSERT_TRUE(ctl.ok()) << "socketpair: " << std::strerror(errno);
  Process requester =
      spawn_with({kPeer, "--role=lost-requester"}, peer_env("lost_q@127.2.5.1", "requester"), ctl.fd[0]);
  Process responder =
      spawn_with({kPeer, "--role=lost-responder"}, peer_env("lost_r@127.2.5.2", "responder"), ctl.fd[1]);
  ctl.close_all();
  ASSERT_TRUE(requester.started()) << requester.snapshot().describe();
  ASSERT_TRUE(responder.started()) << responder.snapshot().describe();
  Both r = wait_both(requester, responder, 60s);
  print_lines(r.a.out, "lost-requester");
  print_lines(r.b.out, "lost-responder");
  EXPECT_TRUE(r.a.exited_with(0) && r.b.exited_with(0)) << r.describe();
  auto q = summary(r.a.out, "lost-requester");
  EXPECT_EQ(num(q, "writes_lost"), 8) << r.describe();
}

}  // namespace
}  // namespace softverbs::test
