// The fault layer's verb rules on the hw backend (docs/hardware.md, "Faults on
// hw"), exercised through the passthrough against a second copy of softverbs
// standing in for rdma-core: the rules act in the outer library, above the
// "real" provider, which knows nothing of them.
#include <infiniband/verbs.h>
#include <softverbs/faults.h>

#include <chrono>

#include "hw_test.hpp"
#include "tests/faults/rc_pair.hpp"

namespace {

using faults_test::kWaitMs;
using faults_test::next_event;
using faults_test::wait_wc;
using hwtest::file_of;
using hwtest::same_file;

class HwFaults : public faults_test::PairTest {
 protected:
  void SetUp() override { HWTEST_REQUIRE_ENV("SOFTVERBS_BACKEND", "hw"); }
  static bool in_inner(const void* fn) { return same_file(file_of(fn), SV_HWTEST_LIB); }
  static bool in_outer(const void* fn) { return same_file(file_of(fn), SV_IBVERBS_FILE); }
};

// Without verb rules the data path is the real provider's; while rules exist it
// goes through the hooks; clearing the rules puts the real functions back.
TEST_F(HwFaults, DataPathIsHookedOnlyWhileVerbRulesExist) {
  ASSERT_NO_FATAL_FAILURE(setup());
  auto fn = [&] { return reinterpret_cast<const void*>(a_.ctx->ops.post_send); };
  EXPECT_TRUE(in_inner(fn())) << file_of(fn());
  load("[[rule]]\nverb = \"post_send\"\nnth = 1000\naction = \"fail\"\nerrno = \"EIO\"\n");
  EXPECT_TRUE(in_outer(fn())) << file_of(fn());
  EXPECT_TRUE(in_outer(reinterpret_cast<const void*>(a_.ctx->ops.poll_cq)));
  softverbs_faults_clear();
  EXPECT_TRUE(in_inner(fn())) << file_of(fn());
  // A packet rule alone hooks nothing (packets are the device's business).
  load("[[rule]]\naction = \"drop\"\nprobability = 0\n");
  EXPECT_TRUE(in_inner(fn())) << file_of(fn());
}

TEST_F(HwFaults, PostSendFailsWithTheRulesErrno) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load("[[rule]]\nverb = \"post_send\"\nnth = 2\naction = \"fail\"\nerrno = \"ENOMEM\"\n");
  ibv_sge sge{};
  ibv_send_wr wr[3];
  write_chain(a_, b_, sge, wr);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a_.qp, wr, &bad), ENOMEM);
  EXPECT_EQ(bad, &wr[1]);
  EXPECT_EQ(wr[0].next, &wr[1]) << "the chain must be left as it was";
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(ibv_poll_cq(a_.cq, 1, &wc), 0);
}

TEST_F(HwFaults, PostRecvFails) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load("[[rule]]\nverb = \"post_recv\"\naction = \"fail\"\nerrno = \"EAGAIN\"\ncount = 1\n");
  EXPECT_EQ(post_recv(b_, 64), EAGAIN);
  EXPECT_EQ(post_recv(b_, 64), 0);
}

// An error completion injected on ibv_poll_cq: the device's successful SEND
// completion is reported with the rule's status.
TEST_F(HwFaults, CompletionStatusIsRewritten) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load(
      "[[rule]]\nverb = \"completion\"\nopcode = \"IBV_WC_SEND\"\naction = \"status\"\n"
      "status = \"IBV_WC_REM_ABORT_ERR\"\n");
  ASSERT_EQ(post_recv(b_, 64), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64, 9), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ABORT_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 9u);
  ASSERT_TRUE(wait_wc(b_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "the receive side is not a SEND completion";
}

TEST_F(HwFaults, CompletionDroppedAndDelayed) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load(
      "[[rule]]\nverb = \"completion\"\nopcode = \"IBV_WC_RDMA_WRITE\"\nnth = 1\naction = \"drop\"\n"
      "[[rule]]\nverb = \"completion\"\nopcode = \"IBV_WC_RDMA_WRITE\"\naction = \"delay\"\ndelay_ms = 40\n");
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 1), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 2), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.wr_id, 2u) << "the first completion is lost";
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40));
  EXPECT_EQ(ibv_poll_cq(a_.cq, 1, &wc), 0);
}

// Injected events come from ibv_get_async_event; acknowledging one does not
// touch the real library's counts, so destroying its element does not wait.
TEST_F(HwFaults, RaisedEventAndForcedQpError) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ibv_async_event raise{};
  raise.event_type = IBV_EVENT_PATH_MIG;
  raise.element.qp = a_.qp;
  ASSERT_EQ(softverbs_raise_async_event(a_.ctx, &raise), 0);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(a_.ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_PATH_MIG);
  EXPECT_EQ(ev.element.qp, a_.qp);
  ibv_ack_async_event(&ev);

  ASSERT_EQ(post_recv(a_, 64, 77), 0);
  ASSERT_EQ(softverbs_qp_force_error(a_.qp), 0);
  EXPECT_EQ(faults_test::query_state(a_.qp), IBV_QPS_ERR);
  ASSERT_EQ(ibv_get_async_event(a_.ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
  ibv_ack_async_event(&ev);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc.wr_id, 77u);
  EXPECT_EQ(ibv_destroy_qp(a_.qp), 0);
  a_.qp = nullptr;
  // Port and device actions need the emulator.
  errno = 0;
  EXPECT_EQ(softverbs_port_set_state(ibv_get_device_name(a_.ctx->device), 1, 0), -1);
  EXPECT_EQ(errno, ENODEV);
}

// A device event dropped by a rule: of two QP_LAST_WQE_REACHED events (two QPs
// on an SRQ entering the error state), the first is dropped, the second arrives.
TEST_F(HwFaults, DeviceEventDropped) {
  faults_test::QpParams p;
  p.with_srq = true;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = b_.cq;
  qa.srq = b_.srq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {4, 0, 1, 0, 0};
  ibv_qp* second = ibv_create_qp(b_.pd, &qa);
  ASSERT_NE(second, nullptr);
  load(
      "[[rule]]\nverb = \"async_event\"\non_event = \"IBV_EVENT_QP_LAST_WQE_REACHED\"\ncount = 1\n"
      "action = \"drop\"\n");
  ibv_qp_attr x{};
  x.qp_state = IBV_QPS_INIT;
  x.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(second, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  x = {};
  x.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(b_.qp, &x, IBV_QP_STATE), 0);
  ASSERT_EQ(ibv_modify_qp(second, &x, IBV_QP_STATE), 0);
  ibv_async_event ev{};
  ASSERT_TRUE(next_event(b_.ctx, &ev, kWaitMs));
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev.element.qp, second);
  ibv_ack_async_event(&ev);
  EXPECT_EQ(ibv_destroy_qp(second), 0);
}

}  // namespace
