// The exchange the trace tests record (tests/trace/trace_test.py runs it with
// SOFTVERBS_TRACE set): two RC QPs on the test's two devices, a SEND and an
// RDMA WRITE whose last packet the fault layer drops once, so the requester's
// ACK timeout fires and the message is sent again. Every step waits for its
// completions (bounded), so the trace holds every record of the exchange.
#include <gtest/gtest.h>

#include "tests/faults/rc_pair.hpp"

namespace {

using faults_test::PairTest;
using faults_test::QpParams;
using faults_test::wait_wc;

class TraceExchange : public PairTest {};

TEST_F(TraceExchange, SendThenWriteWithRetransmission) {
  QpParams p;
  p.timeout = 8;  // about 1 ms: the lost packet costs little time
  ASSERT_NO_FATAL_FAILURE(setup(p));
  ASSERT_EQ(load("[[rule]]\nname = \"lost\"\ndirection = \"tx\"\nopcode = \"RC_RDMA_WRITE_LAST\"\n"
                 "count = 1\naction = \"drop\"\n"),
            0);

  ibv_wc wc{};
  ASSERT_EQ(post_recv(b_, 4096, 100), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 2048, 1), 0);
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 1u);
  ASSERT_TRUE(wait_wc(b_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 100u);

  // Three packets at MTU 1024; the last is lost once.
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 3000, 2), 0);
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 2u);
}

}  // namespace
