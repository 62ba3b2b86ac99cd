// Reliability cases that need a fault at one exact place.
#include "tests/faults/rc_pair.hpp"

namespace faults_test {
namespace {

class Reliability : public PairTest {};

// The only response of an RDMA READ is lost and the WRITE behind it is
// acknowledged: the ACK covers the READ's PSN, which tells the requester its
// response will not come. The READ is requested again at once (no local ACK
// timeout is configured: timeout 0 waits forever), and both complete in order.
TEST_F(Reliability, ReadWhoseResponseIsLostBehindALaterAck) {
  QpParams p;
  p.timeout = 0;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  for (size_t i = 0; i < 64; ++i) b_.buf[i] = static_cast<uint8_t>(i * 3 + 1);
  load("[[rule]]\nname = \"lost\"\nclass = \"read_response\"\ncount = 1\naction = \"drop\"\n");
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_READ, 64, 1), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 2, 0, 0, 4096), 0);
  ibv_wc wc{};
  for (uint64_t id : {1u, 2u}) {
    ASSERT_TRUE(wait_wc(a_.cq, &wc)) << "work request " << id << " never completed";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, id);
  }
  EXPECT_EQ(softverbs_fault_hits("lost"), 1u);
  EXPECT_EQ(std::memcmp(a_.buf.data(), b_.buf.data(), 64), 0);
}

// The same with an atomic: its response (the atomic ACK) is lost, a later
// request is acknowledged; the atomic is asked again and answered from the
// responder's cache, so it is executed once.
TEST_F(Reliability, AtomicWhoseResponseIsLostBehindALaterAck) {
  QpParams p;
  p.timeout = 0;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  uint64_t counter = 5;
  std::memcpy(b_.buf.data(), &counter, 8);
  load("[[rule]]\nname = \"lost\"\nclass = \"atomic_ack\"\ncount = 1\naction = \"drop\"\n");
  ASSERT_EQ(post(a_, b_, IBV_WR_ATOMIC_FETCH_AND_ADD, 8, 1), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 2, 0, 0, 4096), 0);
  ibv_wc wc{};
  for (uint64_t id : {1u, 2u}) {
    ASSERT_TRUE(wait_wc(a_.cq, &wc)) << "work request " << id << " never completed";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, id);
  }
  uint64_t fetched = 0, now = 0;
  std::memcpy(&fetched, a_.buf.data(), 8);
  std::memcpy(&now, b_.buf.data(), 8);
  EXPECT_EQ(fetched, 5u);
  EXPECT_EQ(now, 6u) << "the atomic ran twice";
}

}  // namespace
}  // namespace faults_test
