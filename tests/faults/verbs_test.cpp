// Verb-level fault rules: failing posts, lost and late completions, lost async
// events, and the scenario format of verb and timed rules.
#include <chrono>
#include <softverbs/faults.hpp>

#include "tests/faults/rc_pair.hpp"

namespace faults_test {
namespace {

class VerbFault : public PairTest {};

// The second RDMA WRITE of a chain fails the post with ENOMEM: the first is
// posted (and completes), bad_wr names the second, the third is not posted.
TEST_F(VerbFault, PostSendFailsWithTheRulesErrno) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load(
      "[[rule]]\nname = \"nomem\"\nverb = \"post_send\"\nopcode = \"IBV_WR_RDMA_WRITE\"\nnth = 2\n"
      "action = \"fail\"\nerrno = \"ENOMEM\"\n");
  ibv_sge sge{};
  ibv_send_wr wr[3];
  write_chain(a_, b_, sge, wr);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a_.qp, wr, &bad), ENOMEM);
  EXPECT_EQ(bad, &wr[1]);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(ibv_poll_cq(a_.cq, 1, &wc), 0) << "a work request after the failing one was posted";
  EXPECT_EQ(softverbs_fault_hits("nomem"), 1u);
  // The rule fired once (nth = 2): later posts go through.
  EXPECT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 4), 0);
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.wr_id, 4u);
}

// The same rule on an ibv_wr_* batch of three RDMA WRITEs: ibv_wr_complete
// returns the rule's errno and none of the batch is posted, not even the first.
TEST_F(VerbFault, WrCompleteFailsTheWholeBatchWithTheRulesErrno) {
  QpParams p;
  p.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  load(
      "[[rule]]\nname = \"again\"\nverb = \"post_send\"\nopcode = \"IBV_WR_RDMA_WRITE\"\nnth = 2\n"
      "action = \"fail\"\nerrno = \"EAGAIN\"\n");
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(a_.qp);
  ASSERT_NE(qpx, nullptr);
  auto batch = [&](uint64_t first_id, int n) {
    ibv_wr_start(qpx);
    for (int i = 0; i < n; ++i) {
      qpx->wr_id = first_id + static_cast<uint64_t>(i);
      qpx->wr_flags = IBV_SEND_SIGNALED;
      ibv_wr_rdma_write(qpx, b_.mr->rkey, reinterpret_cast<uintptr_t>(b_.buf.data()));
      ibv_wr_set_sge(qpx, a_.mr->lkey, reinterpret_cast<uintptr_t>(a_.buf.data()), 64);
    }
    return ibv_wr_complete(qpx);
  };
  EXPECT_EQ(batch(1, 3), EAGAIN);
  EXPECT_EQ(softverbs_fault_hits("again"), 1u);
  ibv_wc wc{};
  EXPECT_FALSE(wait_wc(a_.cq, &wc, 50)) << "wr_id " << wc.wr_id << " of the failed batch ran";
  // The rule fired once (nth = 2): the next batch goes through.
  EXPECT_EQ(batch(10, 1), 0);
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 10u);
}

TEST_F(VerbFault, PostRecvFailsOnlyOnTheNamedQp) {
  ASSERT_NO_FATAL_FAILURE(setup());
  softverbs_counters before{};
  ASSERT_EQ(softverbs_device_counters(b_.device.c_str(), &before, sizeof before), 0);
  load("[[rule]]\nverb = \"post_recv\"\nqpn = " + std::to_string(b_.qp->qp_num) +
       "\naction = \"fail\"\nerrno = \"EAGAIN\"\n");
  EXPECT_EQ(post_recv(b_, 64), EAGAIN);
  EXPECT_EQ(post_recv(a_, 64), 0);
  softverbs_counters c{};
  ASSERT_EQ(softverbs_device_counters(b_.device.c_str(), &c, sizeof c), 0);
  EXPECT_EQ(c.faults_verbs - before.faults_verbs, 1u);
}

// The first receive completion is lost: the application sees the second one only.
TEST_F(VerbFault, CompletionDropped) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load("[[rule]]\nverb = \"completion\"\nopcode = \"IBV_WC_RECV\"\ncount = 1\naction = \"drop\"\n");
  ASSERT_EQ(post_recv(b_, 64, 100), 0);
  ASSERT_EQ(post_recv(b_, 64, 101), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64, 1), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64, 2), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(b_.cq, &wc));
  EXPECT_EQ(wc.wr_id, 101u);
  for (uint64_t id : {1u, 2u}) {
    ASSERT_TRUE(wait_wc(a_.cq, &wc));
    EXPECT_EQ(wc.wr_id, id);
  }
}

// A completion delayed by 50 ms is not there before and arrives after.
TEST_F(VerbFault, CompletionDelayed) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load("[[rule]]\nverb = \"completion\"\nopcode = \"IBV_WC_RDMA_WRITE\"\naction = \"delay\"\ndelay_ms = 50\n");
  // Measured on the device's clock (the completion timestamps' one), so that the
  // test holds on real and on virtual time (SOFTVERBS_CLOCK).
  auto device_ns = [this] {
    ibv_values_ex v{};
    v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
    EXPECT_EQ(ibv_query_rt_values_ex(a_.ctx, &v), 0);
    return static_cast<uint64_t>(v.raw_clock.tv_sec) * 1000000000ull + static_cast<uint64_t>(v.raw_clock.tv_nsec);
  };
  const uint64_t start = device_ns();
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 5), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_GE(device_ns() - start, 50000000u);
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// A lost async event: PORT_ERR never arrives, PORT_ACTIVE does.
TEST_F(VerbFault, AsyncEventDropped) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load("[[rule]]\nverb = \"async_event\"\non_event = \"IBV_EVENT_PORT_ERR\"\naction = \"drop\"\n");
  ASSERT_EQ(softverbs_port_set_state(a_.device.c_str(), 1, 0), 0);
  ASSERT_EQ(softverbs_port_set_state(a_.device.c_str(), 1, 1), 0);
  ibv_async_event ev{};
  ASSERT_TRUE(next_event(a_.ctx, &ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE) << ibv_event_type_str(ev.event_type);
  ibv_ack_async_event(&ev);
}

// An async event can set off a device change: here, the QP_FATAL of a failed QP
// takes the port down.
TEST_F(VerbFault, AsyncEventTakesThePortDown) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load("[[rule]]\nverb = \"async_event\"\non_event = \"IBV_EVENT_QP_FATAL\"\naction = \"port_down\"\n");
  ASSERT_EQ(softverbs_qp_force_error(a_.qp), 0);
  ibv_async_event ev{};
  ASSERT_TRUE(next_event(a_.ctx, &ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
  ibv_ack_async_event(&ev);
  ASSERT_TRUE(next_event(a_.ctx, &ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ERR);
  ibv_ack_async_event(&ev);
}

// The same seed and the same calls give the same decisions.
TEST_F(VerbFault, ProbabilityIsSeeded) {
  ASSERT_NO_FATAL_FAILURE(setup());
  auto run = [&] {
    softverbs_faults_clear();
    load("seed = 99\n[[rule]]\nverb = \"post_recv\"\nprobability = 0.5\naction = \"fail\"\nerrno = \"ENOMEM\"\n");
    std::string pattern;
    // 8 posts per run: two runs stay within the receive queue's 16 entries.
    for (int i = 0; i < 8; ++i) pattern += post_recv(b_, 64, static_cast<uint64_t>(i)) ? 'x' : '.';
    return pattern;
  };
  const std::string first = run();
  const std::string second = run();
  EXPECT_EQ(first, second);
  EXPECT_NE(first.find('x'), std::string::npos) << first;
  EXPECT_NE(first.find('.'), std::string::npos) << first;
}

}  // namespace
}  // namespace faults_test

// The C++ API (include/softverbs/faults.hpp): a scenario holds while it is in
// scope, malformed text throws with the reason, errors of the direct actions
// throw std::system_error.
namespace faults_test {
namespace {

TEST_F(VerbFault, CppScenarioHoldsWhileInScope) {
  ASSERT_NO_FATAL_FAILURE(setup());
  {
    softverbs::Scenario s("[[rule]]\nname = \"busy\"\nverb = \"post_recv\"\naction = \"fail\"\nerrno = \"EBUSY\"\n");
    EXPECT_EQ(post_recv(b_, 64), EBUSY);
    EXPECT_EQ(s.hits("busy"), 1u);
  }
  EXPECT_EQ(post_recv(b_, 64), 0) << "the rule outlived its scenario";
  try {
    softverbs::Scenario bad("[[rule]]\naction = \"dorp\"\n");
    ADD_FAILURE() << "a malformed scenario was accepted";
  } catch (const softverbs::ScenarioError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown action"), std::string::npos) << e.what();
  }
  try {
    (void)softverbs::counters("nosuch");
    ADD_FAILURE() << "counters of an unknown device";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENODEV);
  }
  const uint64_t before = softverbs::counters(b_.device).faults_verbs;
  softverbs::set_port_active(b_.device, false);
  softverbs::set_port_active(b_.device, true);
  ibv_async_event ev{};
  ASSERT_TRUE(next_event(b_.ctx, &ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ERR);
  ibv_ack_async_event(&ev);
  ASSERT_TRUE(next_event(b_.ctx, &ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE);
  ibv_ack_async_event(&ev);
  EXPECT_EQ(softverbs::counters(b_.device).faults_verbs, before) << "direct actions are not rules";
}

}  // namespace
}  // namespace faults_test
