// One test per work completion status (docs/compatibility.md, "Completion
// statuses"). Statuses the transport produces are produced by their natural
// cause; those only reliable-datagram, memory-window or tag-matching hardware can
// produce are forced by a completion rule. The statuses the conformance suite
// already produces naturally (LOC_LEN_ERR, LOC_PROT_ERR, REM_INV_REQ_ERR,
// REM_ACCESS_ERR, REM_OP_ERR, RNR_RETRY_EXC_ERR, WR_FLUSH_ERR) are produced here
// too, so that this file covers every status in one place.
#include "tests/faults/rc_pair.hpp"

namespace faults_test {
namespace {

class Status : public PairTest {};

TEST_F(Status, Success) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ASSERT_EQ(post_recv(b_, 64), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  ASSERT_TRUE(wait_wc(b_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 64u);
}

// A SEND longer than the receive buffer: LOC_LEN_ERR at the receiver, the
// requester NAKed with invalid request: REM_INV_REQ_ERR.
TEST_F(Status, LocLenErrAndRemInvReqErr) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ASSERT_EQ(post_recv(b_, 16), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 100), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(b_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR) << ibv_wc_status_str(wc.status);
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(wc.status);
}

TEST_F(Status, LocProtErr) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 1, a_.mr->lkey ^ 0x5a5a00), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);
}

TEST_F(Status, WrFlushErr) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ibv_qp_attr x{};
  x.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(a_.qp, &x, IBV_QP_STATE), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 7), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 7u);
}

TEST_F(Status, RemAccessErr) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 1, 0, b_.mr->rkey ^ 0x100), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
}

// The receive WQE's lkey is invalid: LOC_PROT_ERR at the receiver, and the
// requester NAKed with remote operational error.
TEST_F(Status, RemOpErr) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ASSERT_EQ(post_recv(b_, 64, 100, b_.mr->lkey ^ 0x5a5a00), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_OP_ERR) << ibv_wc_status_str(wc.status);
  ASSERT_TRUE(wait_wc(b_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);
}

// The peer's port goes down (a lost link): the requester's retries run out.
TEST_F(Status, RetryExcErrWhenThePeersLinkIsLost) {
  QpParams p;
  p.retry_cnt = 2;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  softverbs_counters before{};
  ASSERT_EQ(softverbs_device_counters(a_.device.c_str(), &before, sizeof before), 0);
  ASSERT_EQ(softverbs_port_set_state(b_.device.c_str(), 1, 0), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 1), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 2), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 1u);
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(query_state(a_.qp), IBV_QPS_ERR);
  softverbs_counters c{};
  ASSERT_EQ(softverbs_device_counters(b_.device.c_str(), &c, sizeof c), 0);
  EXPECT_GT(c.port_down_drops, 0u);
  ASSERT_EQ(softverbs_device_counters(a_.device.c_str(), &c, sizeof c), 0);
  EXPECT_EQ(c.timeouts - before.timeouts, 3u) << "retry_cnt 2: the first transmission and two retries time out";
}

// The peer QP no longer exists: nothing answers, the retries run out.
TEST_F(Status, RetryExcErrWhenThePeerQpIsGone) {
  QpParams p;
  p.retry_cnt = 1;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  ASSERT_EQ(ibv_destroy_qp(b_.qp), 0);
  b_.qp = nullptr;
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << ibv_wc_status_str(wc.status);
}

TEST_F(Status, RnrRetryExcErr) {
  QpParams p;
  p.rnr_retry = 0;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64), 0);  // no receive posted at b
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR) << ibv_wc_status_str(wc.status);
}

// A response the requester cannot make sense of: here a NAK with a reserved
// code (AETH syndrome 0x6f), forged by the fault layer at the responder.
TEST_F(Status, BadRespErr) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load("[[rule]]\ndirection = \"rx\"\nclass = \"write\"\ncount = 1\naction = \"nak\"\nsyndrome = 0x6f\n");
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_BAD_RESP_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(query_state(a_.qp), IBV_QPS_ERR);
}

// A NAK with the invalid-RD-request code maps to its status.
TEST_F(Status, RemInvRdReqErrFromItsNak) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load(
      "[[rule]]\ndirection = \"rx\"\nclass = \"write\"\ncount = 1\naction = \"nak\"\n"
      "syndrome = \"invalid_rd_request\"\n");
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_RD_REQ_ERR) << ibv_wc_status_str(wc.status);
}

// ---- forced statuses ---------------------------------------------------------

struct Forced {
  ibv_wc_status status;
  const char* name;
};

class ForcedStatus : public PairTest, public ::testing::WithParamInterface<Forced> {};

// The first SEND completion is forced to the status: it is delivered with it,
// the QP then moves to the error state as after a real error completion, and the
// next work request is flushed.
TEST_P(ForcedStatus, IsDeliveredAndTheQpFails) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load(std::string("[[rule]]\nname = \"forced\"\nverb = \"completion\"\nopcode = \"IBV_WC_SEND\"\ncount = 1\n"
                   "action = \"status\"\nstatus = \"") +
       GetParam().name + "\"\n");
  ASSERT_EQ(post_recv(b_, 64, 100), 0);
  ASSERT_EQ(post_recv(b_, 64, 101), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64, 1), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, GetParam().status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.qp_num, a_.qp->qp_num);
  EXPECT_EQ(softverbs_fault_hits("forced"), 1u);
  // Entering the error state follows at once; bounded wait for it.
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
  while (query_state(a_.qp) != IBV_QPS_ERR && std::chrono::steady_clock::now() < end) {
  }
  ASSERT_EQ(query_state(a_.qp), IBV_QPS_ERR);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64, 2), 0);
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 2u);
}

#define SV_FORCED(s) \
  Forced { s, #s }
INSTANTIATE_TEST_SUITE_P(Statuses, ForcedStatus,
                         ::testing::Values(SV_FORCED(IBV_WC_LOC_QP_OP_ERR), SV_FORCED(IBV_WC_LOC_EEC_OP_ERR),
                                           SV_FORCED(IBV_WC_MW_BIND_ERR), SV_FORCED(IBV_WC_LOC_ACCESS_ERR),
                                           SV_FORCED(IBV_WC_LOC_RDD_VIOL_ERR), SV_FORCED(IBV_WC_REM_INV_RD_REQ_ERR),
                                           SV_FORCED(IBV_WC_REM_ABORT_ERR), SV_FORCED(IBV_WC_INV_EECN_ERR),
                                           SV_FORCED(IBV_WC_INV_EEC_STATE_ERR), SV_FORCED(IBV_WC_FATAL_ERR),
                                           SV_FORCED(IBV_WC_RESP_TIMEOUT_ERR), SV_FORCED(IBV_WC_GENERAL_ERR),
                                           SV_FORCED(IBV_WC_TM_ERR), SV_FORCED(IBV_WC_TM_RNDV_INCOMPLETE)),
                         [](const ::testing::TestParamInfo<Forced>& info) { return std::string(info.param.name + 7); });
#undef SV_FORCED

}  // namespace
}  // namespace faults_test
