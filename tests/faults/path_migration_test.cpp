// Automatic path migration under faults (IBTA 17.2.8; docs/faults.md `mig_req`):
// a rule that loses every packet of the primary path makes an armed RC QP
// exhaust its retries there, migrate to its alternate path and carry on, both
// ends raising IBV_EVENT_PATH_MIG; without an armed alternate path the same
// failure raises IBV_EVENT_PATH_MIG_ERR and ends in IBV_WC_RETRY_EXC_ERR.
#include "tests/faults/rc_pair.hpp"

namespace faults_test {
namespace {

class PathMigration : public PairTest {
 protected:
  static ibv_qp_attr query(const Side& s) {
    ibv_qp_attr a{};
    ibv_qp_init_attr init{};
    EXPECT_EQ(ibv_query_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_PATH_MIG_STATE | IBV_QP_AV | IBV_QP_ALT_PATH, &init), 0);
    return a;
  }

  // The alternate path is the primary one with another timeout: the only
  // other path a single-port device has.
  static int rearm(const Side& s, uint8_t alt_timeout) {
    ibv_qp_attr a = query(s);
    a.alt_ah_attr = a.ah_attr;
    a.alt_port_num = a.port_num;
    a.alt_pkey_index = a.pkey_index;
    a.alt_timeout = alt_timeout;
    a.path_mig_state = IBV_MIG_REARM;
    return ibv_modify_qp(s.qp, &a, IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE);
  }

  // The next async event of s must be `type`, for s's QP.
  static void expect_event(const Side& s, ibv_event_type type) {
    ibv_async_event ev{};
    ASSERT_TRUE(next_event(s.ctx, &ev)) << "no " << ibv_event_type_str(type) << " on " << s.device;
    EXPECT_EQ(ev.event_type, type) << ibv_event_type_str(ev.event_type);
    EXPECT_EQ(ev.element.qp, s.qp);
    ibv_ack_async_event(&ev);
  }

  static void expect_port_event(const Side& s, ibv_event_type type) {
    ibv_async_event ev{};
    ASSERT_TRUE(next_event(s.ctx, &ev)) << "no " << ibv_event_type_str(type) << " on " << s.device;
    EXPECT_EQ(ev.event_type, type) << ibv_event_type_str(ev.event_type);
    ibv_ack_async_event(&ev);
  }

  // One SEND a -> b, completed on both sides.
  void send_ok(uint64_t wr_id) {
    ASSERT_EQ(post_recv(b_, 64, 100 + wr_id), 0);
    ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64, wr_id), 0);
    ibv_wc wc{};
    ASSERT_TRUE(wait_wc(a_.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, wr_id);
    ASSERT_TRUE(wait_wc(b_.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  }
};

TEST_F(PathMigration, LosingThePrimaryPathMigratesBothEnds) {
  QpParams p;
  p.retry_cnt = 2;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  ASSERT_EQ(rearm(a_, 9), 0);
  ASSERT_EQ(rearm(b_, 9), 0);
  // One exchange carries the MigReq 0 of both ends to the other: both arm.
  ASSERT_NO_FATAL_FAILURE(send_ok(1));
  ASSERT_EQ(query(a_).path_mig_state, IBV_MIG_ARMED);
  ASSERT_EQ(query(b_).path_mig_state, IBV_MIG_ARMED);

  // Every packet A sends before it migrates (MigReq 0) is lost.
  ASSERT_EQ(load("[[rule]]\nname = \"primary\"\ndevice = \"" + a_.device +
                 "\"\ndirection = \"tx\"\nmig_req = false\naction = \"drop\"\n"),
            0);
  ASSERT_NO_FATAL_FAILURE(send_ok(2));
  EXPECT_GE(softverbs_fault_hits("primary"), p.retry_cnt + 1u);
  ASSERT_NO_FATAL_FAILURE(expect_event(a_, IBV_EVENT_PATH_MIG));
  ASSERT_NO_FATAL_FAILURE(expect_event(b_, IBV_EVENT_PATH_MIG));
  for (const Side* s : {&a_, &b_}) {
    const ibv_qp_attr q = query(*s);
    EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(q.path_mig_state, IBV_MIG_MIGRATED);
    EXPECT_EQ(q.timeout, 9) << "the alternate path is the primary one now";
  }
  // The connection goes on, on the new path.
  ASSERT_NO_FATAL_FAILURE(send_ok(3));
}

TEST_F(PathMigration, LosingTheAcknowledgementsMigratesThroughADuplicate) {
  // B's side of the primary path fails: B executes A's SEND but its ACKs are
  // lost, so A's retries run out and A migrates. Its resend is a duplicate
  // for B, and still carries MigReq 1: B migrates on it and acknowledges on
  // the alternate path.
  QpParams p;
  p.retry_cnt = 2;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  ASSERT_EQ(rearm(a_, 9), 0);
  ASSERT_EQ(rearm(b_, 9), 0);
  ASSERT_NO_FATAL_FAILURE(send_ok(1));
  ASSERT_EQ(load("[[rule]]\nname = \"acks\"\ndevice = \"" + b_.device +
                 "\"\ndirection = \"tx\"\nmig_req = false\naction = \"drop\"\n"),
            0);
  ASSERT_NO_FATAL_FAILURE(send_ok(2));
  EXPECT_GE(softverbs_fault_hits("acks"), p.retry_cnt + 1u);
  ASSERT_NO_FATAL_FAILURE(expect_event(a_, IBV_EVENT_PATH_MIG));
  ASSERT_NO_FATAL_FAILURE(expect_event(b_, IBV_EVENT_PATH_MIG));
  EXPECT_EQ(query(b_).path_mig_state, IBV_MIG_MIGRATED);
}

TEST_F(PathMigration, APortDownLongerThanThePrimaryRetriesMigratesAndTheConnectionSurvives) {
  // A single-port device's alternate path is on the same port: a port that
  // goes down shows as the primary path's retries running out (1 ms each
  // here); the QP migrates, and the alternate path's longer timeout (about
  // 268 ms) outlasts the outage.
  QpParams p;
  p.retry_cnt = 2;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  ASSERT_EQ(rearm(a_, 16), 0);
  ASSERT_EQ(rearm(b_, 16), 0);
  ASSERT_NO_FATAL_FAILURE(send_ok(1));
  ASSERT_EQ(query(a_).path_mig_state, IBV_MIG_ARMED);

  ASSERT_EQ(softverbs_port_set_state(a_.device.c_str(), 1, 0), 0);
  ASSERT_NO_FATAL_FAILURE(expect_port_event(a_, IBV_EVENT_PORT_ERR));
  ASSERT_EQ(post_recv(b_, 64, 102), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64, 2), 0);
  ASSERT_NO_FATAL_FAILURE(expect_event(a_, IBV_EVENT_PATH_MIG));
  EXPECT_EQ(query(a_).qp_state, IBV_QPS_RTS);
  ASSERT_EQ(softverbs_port_set_state(a_.device.c_str(), 1, 1), 0);
  ASSERT_NO_FATAL_FAILURE(expect_port_event(a_, IBV_EVENT_PORT_ACTIVE));
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  ASSERT_TRUE(wait_wc(b_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  ASSERT_NO_FATAL_FAILURE(expect_event(b_, IBV_EVENT_PATH_MIG));
}

TEST_F(PathMigration, WithoutAnArmedAlternatePathTheFailureIsPathMigErr) {
  QpParams p;
  p.retry_cnt = 1;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  // A loads an alternate path; B never does, so A cannot arm.
  ASSERT_EQ(rearm(a_, 9), 0);
  ASSERT_EQ(load("[[rule]]\ndevice = \"" + a_.device + "\"\ndirection = \"tx\"\naction = \"drop\"\n"), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64, 5), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << ibv_wc_status_str(wc.status);
  ASSERT_NO_FATAL_FAILURE(expect_event(a_, IBV_EVENT_PATH_MIG_ERR));
  EXPECT_EQ(query(a_).qp_state, IBV_QPS_ERR);
  EXPECT_EQ(query(a_).path_mig_state, IBV_MIG_REARM);
}

TEST_F(PathMigration, MigReqRuleKeyIsABoolean) {
  char err[256] = {};
  EXPECT_EQ(softverbs_faults_load("[[rule]]\nmig_req = 1\naction = \"drop\"\n", err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("mig_req"), std::string::npos) << err;
  EXPECT_EQ(softverbs_faults_load("[[rule]]\nverb = \"post_send\"\nmig_req = true\naction = \"fail\"\nerrno = \"EIO\"\n",
                                  err, sizeof err),
            -1);
}

}  // namespace
}  // namespace faults_test
