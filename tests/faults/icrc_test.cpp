// The ICRC of packets between two devices of this process (fabric/link.hpp,
// Link::needs_icrc): without a capture they go through the in-process queue
// with the ICRC uncomputed and unchecked, and traffic works as before; a
// corrupting fault rule still gets its packet dropped by the receiver's ICRC
// check and counted there (docs/faults.md "corrupt").
#include <softverbs/faults.hpp>

#include "tests/faults/rc_pair.hpp"

namespace faults_test {
namespace {

class InProcessIcrc : public PairTest {};

TEST_F(InProcessIcrc, ExchangeWorksWithoutTheIcrc) {
  ASSERT_NO_FATAL_FAILURE(setup());
  const softverbs_counters before = softverbs::counters(b_.device);
  for (size_t i = 0; i < 4096; ++i) a_.buf[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_EQ(post_recv(b_, 4096), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 4096, 1), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 4096, 2, 0, 0, 8192), 0);
  ibv_wc wc{};
  for (uint64_t id : {1u, 2u}) {
    ASSERT_TRUE(wait_wc(a_.cq, &wc)) << "work request " << id << " never completed";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, id);
  }
  ASSERT_TRUE(wait_wc(b_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 4096u);
  EXPECT_EQ(std::memcmp(a_.buf.data(), b_.buf.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(a_.buf.data() + 8192, b_.buf.data() + 8192, 4096), 0);
  const softverbs_counters after = softverbs::counters(b_.device);
  EXPECT_GT(after.rx_packets, before.rx_packets);
  EXPECT_EQ(after.rx_icrc_errors, before.rx_icrc_errors);
}

// A sent packet corrupted by the fault layer carries no computed ICRC on this
// path, but goes on marked as one that does: the receiver checks it, drops it
// as damaged and counts it; the requester's retransmission then delivers it.
TEST_F(InProcessIcrc, CorruptedPacketIsStillDroppedByTheIcrcCheck) {
  QpParams p;
  p.timeout = 4;  // about 64 us: the lost SEND is sent again soon
  ASSERT_NO_FATAL_FAILURE(setup(p));
  const softverbs_counters before = softverbs::counters(b_.device);
  const softverbs_counters sender_before = softverbs::counters(a_.device);
  for (size_t i = 0; i < 256; ++i) a_.buf[i] = static_cast<uint8_t>(i ^ 0x5A);
  load("[[rule]]\nname = \"bad\"\ndirection = \"tx\"\nopcode = \"RC_SEND_ONLY\"\ncount = 1\naction = \"corrupt\"\n");
  ASSERT_EQ(post_recv(b_, 256), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 256, 1), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  ASSERT_TRUE(wait_wc(b_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(a_.buf.data(), b_.buf.data(), 256), 0);
  EXPECT_EQ(softverbs_fault_hits("bad"), 1u);
  const softverbs_counters after = softverbs::counters(b_.device);
  EXPECT_EQ(after.rx_icrc_errors, before.rx_icrc_errors + 1);
  EXPECT_EQ(softverbs::counters(a_.device).faults_corrupted, sender_before.faults_corrupted + 1);
}

}  // namespace
}  // namespace faults_test
