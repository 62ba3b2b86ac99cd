// Alternate paths and path migration of RC QPs through the verbs API
// (ibv_modify_qp IBV_QP_ALT_PATH / IBV_QP_PATH_MIG_STATE, IBTA 17.2.8):
// loading an alternate path and reading it back, the REARM -> ARMED handshake,
// migration on request with IBV_EVENT_PATH_MIG at both ends, the failure of
// an unarmed QP with IBV_EVENT_PATH_MIG_ERR, and the attributes refused with
// EINVAL. Devices without IBV_DEVICE_AUTO_PATH_MIG are skipped. The two QPs
// share the port, so the alternate path is the primary one with another
// timeout, as on a single-port host.
#include "datapath.hpp"

namespace conformance {
namespace {

class PathMigrationTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    if (!(dattr_.device_cap_flags & IBV_DEVICE_AUTO_PATH_MIG)) GTEST_SKIP() << "no automatic path migration";
    make_region(4096, IBV_ACCESS_LOCAL_WRITE, &mem_);
  }
  void TearDown() override {
    mem_.mr.reset();  // before the fixture's PD goes
    DataPathTest::TearDown();
  }

  static ibv_qp_attr query(ibv_qp* qp) {
    ibv_qp_attr a{};
    ibv_qp_init_attr init{};
    EXPECT_EQ(ibv_query_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE, &init), 0);
    return a;
  }

  // Attributes loading the loopback path as the alternate one.
  ibv_qp_attr alt_attr(uint8_t alt_timeout, ibv_mig_state mig) const {
    ibv_qp_attr a{};
    a.alt_ah_attr = loopback_ah_attr();
    a.alt_port_num = kPort;
    a.alt_pkey_index = 0;
    a.alt_timeout = alt_timeout;
    a.path_mig_state = mig;
    return a;
  }

  int rearm(ibv_qp* qp, uint8_t alt_timeout = 9) {
    ibv_qp_attr a = alt_attr(alt_timeout, IBV_MIG_REARM);
    return ibv_modify_qp(qp, &a, IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE);
  }

  // One SEND from `from` to `to`, completed on both.
  void send_ok(Endpoint& from, Endpoint& to, uint64_t wr_id) {
    ibv_sge rs = mem_.sge(2048, 64);
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(to.qp.get(), wr_id, &rs, 1));
    ibv_sge ss = mem_.sge(0, 64);
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &ss;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    ASSERT_NO_FATAL_FAILURE(post_send_ok(from.qp.get(), &wr));
    auto wc = expect_wcs(from.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS) << describe(wc[0]);
    wc = expect_wcs(to.rcq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS) << describe(wc[0]);
  }

  // Both ends rearmed; one exchange carries each one's MigReq 0 to the other.
  void arm(Pair& p) {
    ASSERT_EQ(rearm(p.a.qp.get()), 0);
    ASSERT_EQ(rearm(p.b.qp.get()), 0);
    ASSERT_NO_FATAL_FAILURE(send_ok(p.a, p.b, 1));
    ASSERT_EQ(query(p.a.qp.get()).path_mig_state, IBV_MIG_ARMED);
    ASSERT_EQ(query(p.b.qp.get()).path_mig_state, IBV_MIG_ARMED);
  }

  Region mem_;
};
CONFORMANCE_INSTANTIATE(PathMigrationTest);

TEST_P(PathMigrationTest, AFreshQpIsMigratedWithoutAlternatePath) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  EXPECT_EQ(query(p.a.qp.get()).path_mig_state, IBV_MIG_MIGRATED);
}

TEST_P(PathMigrationTest, AlternatePathLoadedInRtsIsReportedByQuery) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ASSERT_EQ(rearm(p.a.qp.get(), 17), 0);
  const ibv_qp_attr q = query(p.a.qp.get());
  const ibv_ah_attr want = loopback_ah_attr();
  EXPECT_EQ(q.path_mig_state, IBV_MIG_REARM);
  EXPECT_EQ(q.alt_port_num, kPort);
  EXPECT_EQ(q.alt_pkey_index, 0);
  EXPECT_EQ(q.alt_timeout, 17);
  EXPECT_EQ(q.alt_ah_attr.port_num, kPort);
  EXPECT_EQ(q.alt_ah_attr.is_global, want.is_global);
  EXPECT_EQ(q.alt_ah_attr.dlid, want.dlid);
  if (want.is_global) {
    EXPECT_EQ(0, std::memcmp(q.alt_ah_attr.grh.dgid.raw, want.grh.dgid.raw, 16));
    EXPECT_EQ(q.alt_ah_attr.grh.sgid_index, want.grh.sgid_index);
  }
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
}

TEST_P(PathMigrationTest, AlternatePathLoadedAtInitToRtr) {
  PairOptions o;
  Endpoint ep;
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &ep));
  ASSERT_EQ(move_to(ep.qp.get(), IBV_QPS_INIT), 0);
  ibv_qp_attr a = valid_attr(ep.qp.get(), IBV_QPS_INIT, IBV_QPS_RTR);
  const ibv_qp_attr alt = alt_attr(11, IBV_MIG_MIGRATED);
  a.alt_ah_attr = alt.alt_ah_attr;
  a.alt_port_num = alt.alt_port_num;
  a.alt_pkey_index = alt.alt_pkey_index;
  a.alt_timeout = alt.alt_timeout;
  const int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH;
  ASSERT_EQ(ibv_modify_qp(ep.qp.get(), &a, mask), 0);
  const ibv_qp_attr q = query(ep.qp.get());
  EXPECT_EQ(q.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(q.alt_timeout, 11);
  EXPECT_EQ(q.alt_port_num, kPort);
  // Loaded, not yet armed: the state is still MIGRATED.
  EXPECT_EQ(q.path_mig_state, IBV_MIG_MIGRATED);
}

TEST_P(PathMigrationTest, RequestedMigrationRaisesPathMigAtBothEnds) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ASSERT_NO_FATAL_FAILURE(arm(p));
  ibv_qp_attr m{};
  m.path_mig_state = IBV_MIG_MIGRATED;
  ASSERT_EQ(ibv_modify_qp(p.a.qp.get(), &m, IBV_QP_PATH_MIG_STATE), 0);
  ASSERT_NO_FATAL_FAILURE(expect_qp_async_event(p.a.qp.get(), {IBV_EVENT_PATH_MIG}));
  const ibv_qp_attr qa = query(p.a.qp.get());
  EXPECT_EQ(qa.path_mig_state, IBV_MIG_MIGRATED);
  EXPECT_EQ(qa.timeout, 9) << "the alternate path became the primary one";
  // B learns of it from A's next packet.
  ASSERT_NO_FATAL_FAILURE(send_ok(p.a, p.b, 2));
  ASSERT_NO_FATAL_FAILURE(expect_qp_async_event(p.b.qp.get(), {IBV_EVENT_PATH_MIG}));
  EXPECT_EQ(query(p.b.qp.get()).path_mig_state, IBV_MIG_MIGRATED);
  // Traffic goes on both ways on the new path.
  ASSERT_NO_FATAL_FAILURE(send_ok(p.b, p.a, 3));
  // The QPs may be armed again with a new alternate path.
  ASSERT_EQ(rearm(p.a.qp.get(), 10), 0);
  ASSERT_EQ(rearm(p.b.qp.get(), 10), 0);
  ASSERT_NO_FATAL_FAILURE(send_ok(p.a, p.b, 4));
  EXPECT_EQ(query(p.a.qp.get()).path_mig_state, IBV_MIG_ARMED);
  expect_no_async_event(0);
}

TEST_P(PathMigrationTest, UcQpsArmAndMigrateToo) {
  // UC has no acknowledgements: each end arms on the other's SEND.
  PairOptions o;
  o.type = IBV_QPT_UC;
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(o, &p));
  ASSERT_EQ(rearm(p.a.qp.get()), 0);
  ASSERT_EQ(rearm(p.b.qp.get()), 0);
  ASSERT_NO_FATAL_FAILURE(send_ok(p.a, p.b, 1));
  EXPECT_EQ(query(p.b.qp.get()).path_mig_state, IBV_MIG_ARMED);
  EXPECT_EQ(query(p.a.qp.get()).path_mig_state, IBV_MIG_REARM) << "A has heard nothing from B yet";
  ASSERT_NO_FATAL_FAILURE(send_ok(p.b, p.a, 2));
  ASSERT_EQ(query(p.a.qp.get()).path_mig_state, IBV_MIG_ARMED);
  ibv_qp_attr m{};
  m.path_mig_state = IBV_MIG_MIGRATED;
  ASSERT_EQ(ibv_modify_qp(p.a.qp.get(), &m, IBV_QP_PATH_MIG_STATE), 0);
  ASSERT_NO_FATAL_FAILURE(expect_qp_async_event(p.a.qp.get(), {IBV_EVENT_PATH_MIG}));
  ASSERT_NO_FATAL_FAILURE(send_ok(p.a, p.b, 3));
  ASSERT_NO_FATAL_FAILURE(expect_qp_async_event(p.b.qp.get(), {IBV_EVENT_PATH_MIG}));
  EXPECT_EQ(query(p.b.qp.get()).path_mig_state, IBV_MIG_MIGRATED);
}

TEST_P(PathMigrationTest, MigratingAnUnarmedQpIsEinval) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ASSERT_EQ(rearm(p.a.qp.get()), 0);  // REARM: the peer has not answered
  ibv_qp_attr m{};
  m.path_mig_state = IBV_MIG_MIGRATED;
  EXPECT_EQ(ibv_modify_qp(p.a.qp.get(), &m, IBV_QP_PATH_MIG_STATE), EINVAL);
  EXPECT_EQ(query(p.a.qp.get()).path_mig_state, IBV_MIG_REARM);
  expect_no_async_event(0);
}

TEST_P(PathMigrationTest, ArmingWithoutAnAlternatePathIsEinval) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  for (ibv_mig_state s : {IBV_MIG_REARM, IBV_MIG_ARMED}) {
    ibv_qp_attr m{};
    m.path_mig_state = s;
    EXPECT_EQ(ibv_modify_qp(p.a.qp.get(), &m, IBV_QP_PATH_MIG_STATE), EINVAL) << s;
  }
  EXPECT_EQ(query(p.a.qp.get()).path_mig_state, IBV_MIG_MIGRATED);
}

TEST_P(PathMigrationTest, InvalidAlternatePathIsEinval) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_qp* qp = p.a.qp.get();
  const int mask = IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
  ibv_qp_attr a = alt_attr(9, IBV_MIG_REARM);
  a.alt_port_num = 2;  // no such port
  a.alt_ah_attr.port_num = 2;
  EXPECT_EQ(ibv_modify_qp(qp, &a, mask), EINVAL) << "alt_port_num 2";
  a = alt_attr(9, IBV_MIG_REARM);
  a.alt_port_num = 0;
  EXPECT_EQ(ibv_modify_qp(qp, &a, mask), EINVAL) << "alt_port_num 0";
  a = alt_attr(32, IBV_MIG_REARM);
  EXPECT_EQ(ibv_modify_qp(qp, &a, mask), EINVAL) << "alt_timeout 32";
  a = alt_attr(9, IBV_MIG_REARM);
  a.alt_pkey_index = static_cast<uint16_t>(pattr_.pkey_tbl_len);
  EXPECT_EQ(ibv_modify_qp(qp, &a, mask), EINVAL) << "alt_pkey_index past the table";
  a = alt_attr(9, IBV_MIG_REARM);
  a.alt_ah_attr.static_rate = 1;
  EXPECT_EQ(ibv_modify_qp(qp, &a, mask), EINVAL) << "static_rate 1";
  if (is_ethernet()) {
    a = alt_attr(9, IBV_MIG_REARM);
    a.alt_ah_attr.is_global = 0;
    EXPECT_EQ(ibv_modify_qp(qp, &a, mask), EINVAL) << "no GRH on RoCE";
    a = alt_attr(9, IBV_MIG_REARM);
    a.alt_ah_attr.grh.sgid_index = static_cast<uint8_t>(pattr_.gid_tbl_len);
    EXPECT_EQ(ibv_modify_qp(qp, &a, mask), EINVAL) << "sgid_index past the table";
  }
  a = alt_attr(9, IBV_MIG_REARM);
  std::memset(&a.path_mig_state, 0x7f, sizeof a.path_mig_state);
  EXPECT_EQ(ibv_modify_qp(qp, &a, mask), EINVAL) << "undefined path_mig_state";
  // Nothing of the refused calls stuck.
  const ibv_qp_attr q = query(qp);
  EXPECT_EQ(q.path_mig_state, IBV_MIG_MIGRATED);
  EXPECT_EQ(q.alt_port_num, 0);
}

TEST_P(PathMigrationTest, PrimaryFailureWithoutArmedPathRaisesPathMigErr) {
  PairOptions o;
  o.retry_cnt = 1;
  o.timeout = 10;  // about 4 ms a try
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(o, &p));
  ASSERT_EQ(rearm(p.a.qp.get()), 0);
  // B is gone: nothing A sends is answered.
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(p.b.qp.get(), &r, IBV_QP_STATE), 0);
  ibv_sge ss = mem_.sge(0, 64);
  ibv_send_wr wr{};
  wr.wr_id = 7;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &ss;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &wr));
  auto wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(7, IBV_WC_RETRY_EXC_ERR, p.a.qpn()));
  ASSERT_NO_FATAL_FAILURE(expect_qp_async_event(p.a.qp.get(), {IBV_EVENT_PATH_MIG_ERR}));
  EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
}

}  // namespace
}  // namespace conformance
