// The in-process fast path (fabric::Link::send_direct): between the two
// devices of this process, packets go without bytes while no fault rule is
// loaded, and the same workload gives the same completions, statuses and
// counters as over the packet path, which a rule that never fires forces.
// Switching paths in the middle of a stream keeps the PSNs consistent, and the
// responder's checks give the same remote errors on both paths.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "tests/faults/rc_pair.hpp"

namespace faults_test {
namespace {

// A packet rule that matches no device: loading it is enough to keep every
// packet on the packet path (FaultyLink::direct_ok).
constexpr const char* kNoopRule = "[[rule]]\nname = \"noop\"\ndevice = \"no-such-device\"\naction = \"drop\"\n";

softverbs_counters counters_of(const Side& s) {
  softverbs_counters c{};
  EXPECT_EQ(softverbs_device_counters(s.device.c_str(), &c, sizeof c), 0);
  return c;
}

// Under virtual time every in-process packet is a step of the virtual
// scheduler, so the fast path is off (this suite also runs there).
bool direct_expected() {
  const char* clock = std::getenv("SOFTVERBS_CLOCK");
  return !(clock && std::string(clock) == "virtual");
}

struct Outcome {
  std::vector<ibv_wc_status> status;
  std::vector<ibv_wc_opcode> opcode;
  std::vector<uint32_t> byte_len;
  uint64_t tx_packets = 0, rx_packets = 0, tx_bytes = 0, rx_bytes = 0, retransmits = 0, dups = 0, out_of_seq = 0,
           naks = 0, rx_direct = 0;
  bool operator==(const Outcome&) const = default;
};

// A local ACK timeout of about a second: on a loaded machine the default 1 ms
// fires now and then, and a retransmission would make the two runs differ.
QpParams slow_timeout() {
  QpParams p;
  p.timeout = 18;
  return p;
}

class DirectPath : public PairTest {
 protected:
  // A mixed workload from a to b: SEND with immediate, WRITE, READ and an
  // atomic, at sizes of one and several packets (path MTU 1024), every one
  // signaled; then the counters' deltas over it on both devices.
  Outcome run_mixed() {
    Outcome o;
    const softverbs_counters a0 = counters_of(a_), b0 = counters_of(b_);
    int expect_a = 0, expect_b = 0;
    for (uint32_t len : {8u, 1000u, 5000u}) {
      EXPECT_EQ(post_recv(b_, 8192), 0);
      EXPECT_EQ(post(a_, b_, IBV_WR_SEND, len, 1), 0);
      EXPECT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, len, 2, 0, 0, 8192), 0);
      EXPECT_EQ(post(a_, b_, IBV_WR_RDMA_READ, len, 3, 0, 0, 16384), 0);
      expect_a += 3;
      ++expect_b;
    }
    EXPECT_EQ(post(a_, b_, IBV_WR_ATOMIC_FETCH_AND_ADD, 8, 4, 0, 0, 32768), 0);
    ++expect_a;
    collect(a_, expect_a, o);
    collect(b_, expect_b, o);
    delta(a0, counters_of(a_), b0, counters_of(b_), o);
    return o;
  }

  static void collect(Side& s, int n, Outcome& o) {
    for (int i = 0; i < n; ++i) {
      ibv_wc wc{};
      ASSERT_TRUE(wait_wc(s.cq, &wc)) << "completion " << i << " of " << n << " missing";
      o.status.push_back(wc.status);
      o.opcode.push_back(wc.opcode);
      o.byte_len.push_back(wc.byte_len);
    }
  }

  static void delta(const softverbs_counters& a0, const softverbs_counters& a1, const softverbs_counters& b0,
                    const softverbs_counters& b1, Outcome& o) {
    o.tx_packets = (a1.tx_packets - a0.tx_packets) + (b1.tx_packets - b0.tx_packets);
    o.rx_packets = (a1.rx_packets - a0.rx_packets) + (b1.rx_packets - b0.rx_packets);
    o.tx_bytes = (a1.tx_bytes - a0.tx_bytes) + (b1.tx_bytes - b0.tx_bytes);
    o.rx_bytes = (a1.rx_bytes - a0.rx_bytes) + (b1.rx_bytes - b0.rx_bytes);
    o.retransmits = (a1.retransmits - a0.retransmits) + (b1.retransmits - b0.retransmits);
    o.dups = (a1.duplicates - a0.duplicates) + (b1.duplicates - b0.duplicates);
    o.out_of_seq = (a1.out_of_seq_requests - a0.out_of_seq_requests) + (b1.out_of_seq_requests - b0.out_of_seq_requests);
    o.naks = (a1.naks_received - a0.naks_received) + (b1.naks_received - b0.naks_received);
    o.rx_direct = (a1.rx_direct - a0.rx_direct) + (b1.rx_direct - b0.rx_direct);
  }

  // Posts a list of twelve signaled RDMA WRITEs of `len` bytes from a to b (wr_id 1..12).
  void post_writes(uint32_t len = 64) {
    ibv_sge sge{};
    ibv_send_wr wr[12];
    write_chain(a_, b_, sge, wr, len);
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(a_.qp, wr, &bad), 0);
  }
  // Their completions: every one, in order, successful.
  void expect_writes_done() {
    for (uint64_t id = 1; id <= 12; ++id) {
      ibv_wc wc{};
      ASSERT_TRUE(wait_wc(a_.cq, &wc)) << "completion " << id << " missing";
      EXPECT_EQ(wc.wr_id, id);
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    }
  }

  // Fills a's buffer with a pattern and b's with zeros.
  void fill() {
    for (size_t i = 0; i < kBuf; ++i) a_.buf[i] = static_cast<uint8_t>(i * 7 + 3);
    std::memset(b_.buf.data(), 0, kBuf);
  }
};

TEST_F(DirectPath, SameCompletionsAndCountersAsThePacketPath) {
  ASSERT_NO_FATAL_FAILURE(setup(slow_timeout()));
  fill();
  Outcome direct = run_mixed();
  const std::vector<uint8_t> b_after_direct = b_.buf;
  const std::vector<uint8_t> a_after_direct = a_.buf;
  if (direct_expected()) {
    EXPECT_GT(direct.rx_direct, 0u);
  } else {
    EXPECT_EQ(direct.rx_direct, 0u);
  }
  for (ibv_wc_status s : direct.status) EXPECT_EQ(s, IBV_WC_SUCCESS);

  ASSERT_EQ(load(kNoopRule), 0);
  fill();
  Outcome packets = run_mixed();
  EXPECT_EQ(packets.rx_direct, 0u) << "a loaded rule must keep every packet on the packet path";
  // Everything but the data of the atomic's target (which adds again) matches.
  EXPECT_EQ(b_.buf.size(), b_after_direct.size());
  EXPECT_EQ(std::memcmp(b_.buf.data(), b_after_direct.data(), 32768), 0);
  EXPECT_EQ(std::memcmp(a_.buf.data(), a_after_direct.data(), 32768), 0);
  direct.rx_direct = packets.rx_direct = 0;
  EXPECT_EQ(direct, packets) << "completions, statuses or counters differ between the two paths";
}

TEST_F(DirectPath, SwitchingPathsMidStreamKeepsPsnsConsistent) {
  ASSERT_NO_FATAL_FAILURE(setup(slow_timeout()));
  const softverbs_counters a0 = counters_of(a_), b0 = counters_of(b_);
  // Three rounds: direct, packets (a rule loaded), direct again; each round
  // posts multi-packet WRITEs and SENDs and loads or clears the rule while some
  // are still outstanding.
  int completed = 0, received = 0, posted = 0, recvs = 0;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 5; ++i) {  // at most 14 outstanding: the queues hold 16
      ASSERT_EQ(post_recv(b_, 4096), 0);
      ++recvs;
      ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 3000, 10 + i), 0);
      ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 9000, 20 + i, 0, 0, 8192), 0);
      posted += 2;
    }
    if (round == 0) {
      ASSERT_EQ(load(kNoopRule), 0);
    }
    if (round == 1) softverbs_faults_clear();
    for (; completed < posted - 4; ++completed) {
      ibv_wc wc{};
      ASSERT_TRUE(wait_wc(a_.cq, &wc));
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    }
  }
  for (; completed < posted; ++completed) {
    ibv_wc wc{};
    ASSERT_TRUE(wait_wc(a_.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  }
  for (; received < recvs; ++received) {
    ibv_wc wc{};
    ASSERT_TRUE(wait_wc(b_.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.byte_len, 3000u);
  }
  const softverbs_counters a1 = counters_of(a_), b1 = counters_of(b_);
  // One PSN space: no request was found out of sequence or duplicated, and
  // nothing was resent.
  EXPECT_EQ(b1.out_of_seq_requests - b0.out_of_seq_requests, 0u);
  EXPECT_EQ(b1.dup_requests - b0.dup_requests, 0u);
  EXPECT_EQ(a1.retransmits - a0.retransmits, 0u);
  EXPECT_EQ(a1.seq_naks_received - a0.seq_naks_received, 0u);
  if (direct_expected()) {
    EXPECT_GT(b1.rx_direct - b0.rx_direct, 0u);
  }
}

// A remote error on the fast path: the same completion status as over packets.
struct RemoteCase {
  const char* name;
  ibv_wr_opcode op;
  bool bad_rkey;
  uint64_t offset;  // past the region: out of bounds
  ibv_wc_status want;
};

class DirectPathErrors : public DirectPath, public ::testing::WithParamInterface<std::tuple<RemoteCase, bool>> {};

TEST_P(DirectPathErrors, SameRemoteError) {
  const auto& [c, packets] = GetParam();
  ASSERT_NO_FATAL_FAILURE(setup(slow_timeout()));
  if (packets) {
    ASSERT_EQ(load(kNoopRule), 0);
  }
  const softverbs_counters b0 = counters_of(b_);
  const uint32_t len = 64;
  ibv_sge sge{reinterpret_cast<uintptr_t>(a_.buf.data()), len, a_.mr->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = 7;
  wr.opcode = c.op;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  const uint64_t addr = reinterpret_cast<uintptr_t>(b_.buf.data()) + c.offset;
  const uint32_t rkey = c.bad_rkey ? b_.mr->rkey ^ 0x5500 : b_.mr->rkey;
  if (c.op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    wr.wr.atomic.remote_addr = addr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = 1;
  } else {
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
  }
  ASSERT_EQ(ibv_post_send(a_.qp, &wr, &bad), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, c.want) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 7u);
  const softverbs_counters b1 = counters_of(b_);
  EXPECT_EQ(b1.naks_sent - b0.naks_sent, 1u);
  if (packets || !direct_expected()) {
    EXPECT_EQ(b1.rx_direct - b0.rx_direct, 0u);
  } else {
    EXPECT_GT(b1.rx_direct - b0.rx_direct, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    BothPaths, DirectPathErrors,
    ::testing::Combine(::testing::Values(RemoteCase{"write_bad_rkey", IBV_WR_RDMA_WRITE, true, 0, IBV_WC_REM_ACCESS_ERR},
                                         RemoteCase{"write_out_of_bounds", IBV_WR_RDMA_WRITE, false, kBuf - 32,
                                                    IBV_WC_REM_ACCESS_ERR},
                                         RemoteCase{"read_bad_rkey", IBV_WR_RDMA_READ, true, 0, IBV_WC_REM_ACCESS_ERR},
                                         RemoteCase{"atomic_misaligned", IBV_WR_ATOMIC_FETCH_AND_ADD, false, 4,
                                                    IBV_WC_REM_INV_REQ_ERR}),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) + (std::get<1>(info.param) ? "_packets" : "_direct");
    });

// One posted list of RDMA WRITEs: on the fast path the responder's ACKs for
// it reach the requester within the post, where a run of them is taken as one
// (coalesced, emu/qp/direct.cpp). Every work request still completes, in
// order, with its own status: those before a NAKed one succeed, the NAKed one
// fails with the remote error and the rest are flushed, as over packets.
class DirectPathList : public DirectPath, public ::testing::WithParamInterface<std::tuple<int, bool>> {};

TEST_P(DirectPathList, EveryCompletionInOrderWithItsStatus) {
  const auto& [bad_at, packets] = GetParam();  // bad_at: wr_id with a bad rkey (0: none)
  ASSERT_NO_FATAL_FAILURE(setup(slow_timeout()));
  if (packets) {
    ASSERT_EQ(load(kNoopRule), 0);
  }
  const softverbs_counters a0 = counters_of(a_), b0 = counters_of(b_);
  ibv_sge sge{};
  ibv_send_wr wr[12];
  write_chain(a_, b_, sge, wr);
  if (bad_at) wr[bad_at - 1].wr.rdma.rkey = b_.mr->rkey ^ 0x5500;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a_.qp, wr, &bad), 0);
  for (uint64_t id = 1; id <= 12; ++id) {
    ibv_wc wc{};
    ASSERT_TRUE(wait_wc(a_.cq, &wc)) << "completion " << id << " missing";
    EXPECT_EQ(wc.wr_id, id);
    const ibv_wc_status want = !bad_at || static_cast<int>(id) < bad_at ? IBV_WC_SUCCESS
                               : static_cast<int>(id) == bad_at      ? IBV_WC_REM_ACCESS_ERR
                                                                     : IBV_WC_WR_FLUSH_ERR;
    EXPECT_EQ(wc.status, want) << "wr_id " << id << ": " << ibv_wc_status_str(wc.status);
  }
  ibv_wc extra{};
  EXPECT_EQ(ibv_poll_cq(a_.cq, 1, &extra), 0);
  const softverbs_counters a1 = counters_of(a_), b1 = counters_of(b_);
  EXPECT_EQ(b1.naks_sent - b0.naks_sent, bad_at ? 1u : 0u);
  EXPECT_EQ(a1.retransmits - a0.retransmits, 0u);
  if (packets || !direct_expected()) {
    EXPECT_EQ(a1.rx_direct - a0.rx_direct, 0u);
  } else {
    EXPECT_GT(a1.rx_direct - a0.rx_direct, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(BothPaths, DirectPathList, ::testing::Combine(::testing::Values(0, 1, 8, 12), ::testing::Bool()),
                         [](const auto& info) {
                           return "bad_at_" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_packets" : "_direct");
                         });

// A posted list goes to its receiver as one direct session (emu/qp/direct.cpp):
// its first packet finds the receiver through the link, the others go to it
// straight while the list is sent. When ibv_post_send returns, every packet
// of the list is counted on both ports, and the receiver is free again: its
// QP takes a receive from another thread and is destroyed, both within a
// bounded wait.
TEST_F(DirectPath, AListIsCountedAndItsReceiverFreedWhenThePostReturns) {
  if (!direct_expected()) GTEST_SKIP() << "virtual time: every in-process packet is a scheduler step";
  ASSERT_NO_FATAL_FAILURE(setup(slow_timeout()));
  const softverbs_counters a0 = counters_of(a_), b0 = counters_of(b_);
  ASSERT_NO_FATAL_FAILURE(post_writes());
  const softverbs_counters a1 = counters_of(a_), b1 = counters_of(b_);
  EXPECT_EQ(a1.tx_packets - a0.tx_packets, 12u) << "every request of the list, counted when the post returns";
  EXPECT_EQ(b1.rx_packets - b0.rx_packets, 12u);
  EXPECT_EQ(b1.rx_direct - b0.rx_direct, 12u);
  EXPECT_EQ(a1.tx_bytes - a0.tx_bytes, b1.rx_bytes - b0.rx_bytes);
  const uint64_t wire = 28 + 12 + 16 + 64 + 4;  // IPv4 + UDP, BTH + RETH, payload, ICRC
  EXPECT_EQ(a1.tx_bytes - a0.tx_bytes, 12 * wire);
  ASSERT_NO_FATAL_FAILURE(expect_writes_done());
  // 48 packets (4096-byte WRITEs at a path MTU of 1024) in one send loop: a
  // session hands over at most 32, so a second one takes the rest.
  const softverbs_counters a2 = counters_of(a_), b2 = counters_of(b_);
  ASSERT_NO_FATAL_FAILURE(post_writes(4096));
  const softverbs_counters a3 = counters_of(a_), b3 = counters_of(b_);
  EXPECT_EQ(a3.tx_packets - a2.tx_packets, 48u);
  EXPECT_EQ(b3.rx_direct - b2.rx_direct, 48u);
  // Each WRITE: four packets of 1024 bytes, the first with a RETH.
  EXPECT_EQ(a3.tx_bytes - a2.tx_bytes, 12u * (4 * (28 + 12 + 1024 + 4) + 16));
  EXPECT_EQ(b3.rx_bytes - b2.rx_bytes, a3.tx_bytes - a2.tx_bytes);
  auto recv = std::async(std::launch::async, [this] { return post_recv(b_, 64); });
  ASSERT_EQ(recv.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "the receiver's QP is still held";
  EXPECT_EQ(recv.get(), 0);
  ASSERT_NO_FATAL_FAILURE(expect_writes_done());
  ibv_qp* qp = std::exchange(b_.qp, nullptr);
  auto destroyed = std::async(std::launch::async, [qp] { return ibv_destroy_qp(qp); });
  ASSERT_EQ(destroyed.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "the receiver is still pinned";
  EXPECT_EQ(destroyed.get(), 0);
}

// Rules of the way out decide on each packet's headers (fabric::FaultyLink):
// the packets they do not hit stay on the fast path, a dropped one is lost
// and recovered by go-back-N, a duplicated one is built and sent twice (the
// responder sees a duplicate), each decided once. Every work request of the
// list completes, in order, successfully.
class DirectPathTxRule : public DirectPath, public ::testing::WithParamInterface<const char*> {};

TEST_P(DirectPathTxRule, OthersStayOnTheFastPathAndTheListCompletes) {
  const std::string action = GetParam();
  ASSERT_NO_FATAL_FAILURE(setup(slow_timeout()));
  ASSERT_EQ(load("[[rule]]\nname = \"third\"\ndirection = \"tx\"\ndevice = \"" + a_.device +
                 "\"\nclass = \"write\"\nnth = 3\naction = \"" + action + "\"\n"),
            0);
  const softverbs_counters a0 = counters_of(a_), b0 = counters_of(b_);
  ASSERT_NO_FATAL_FAILURE(post_writes());
  ASSERT_NO_FATAL_FAILURE(expect_writes_done());
  EXPECT_EQ(softverbs_fault_hits("third"), 1u) << "each packet is decided once";
  const softverbs_counters a1 = counters_of(a_), b1 = counters_of(b_);
  if (action == "drop") {
    EXPECT_GE(a1.retransmits - a0.retransmits, 1u);
  } else {
    EXPECT_EQ(b1.duplicates - b0.duplicates, 1u);
  }
  if (direct_expected()) {
    EXPECT_GE(b1.rx_direct - b0.rx_direct, 2u) << "the writes before the rule's hit go without bytes";
  }
}

INSTANTIATE_TEST_SUITE_P(Actions, DirectPathTxRule, ::testing::Values("drop", "duplicate"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace faults_test
