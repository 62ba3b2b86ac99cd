// ibv_modify_qp: the IBTA QP state machine through the API.
//
// The expectation table is transition_rule() (conformance.cpp), written from
// IBTA Vol 1 11.2.5.2 "Modify Queue Pair" and the Linux kernel's
// ib_modify_qp_is_ok(), which every kernel provider applies. Notable rows:
// RESET -> ERR is not a transition; SQE cannot be entered through the API (a
// QP gets there only on a send error of UC/UD), so no transition X -> SQE exists.
#include "conformance.hpp"

namespace conformance {
namespace {

constexpr ibv_qp_type kTypes[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};
constexpr ibv_qp_state kAllStates[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
                                       IBV_QPS_SQD,   IBV_QPS_SQE,  IBV_QPS_ERR};
// The states a QP can be brought to with ibv_modify_qp alone.
constexpr ibv_qp_state kReachable[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_ERR};
// enum ibv_qp_attr_mask bits 1..20 (0 is IBV_QP_STATE).
constexpr unsigned kFirstAttrBit = 1;
constexpr unsigned kLastAttrBit = 20;

std::string step(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next) {
  return std::string(qp_type_name(type)) + " " + qp_state_name(cur) + "->" + qp_state_name(next);
}

class QpStateTest : public VerbsCqTest {
 protected:
  // A new QP of the type, driven to state.
  Qp qp_in(ibv_qp_type type, ibv_qp_state state) {
    Qp qp = make_qp(type, cq_.get());
    if (qp && state != IBV_QPS_RESET) {
      int rc = move_to(qp.get(), state);
      EXPECT_EQ(rc, 0) << "driving a " << qp_type_name(type) << " QP to " << qp_state_name(state);
      if (rc) qp.reset();
    }
    return qp;
  }

  // A modify that must fail with EINVAL and leave the QP where it was.
  void expect_rejected(ibv_qp* qp, ibv_qp_attr attr, uint32_t mask, const std::string& what) {
    SCOPED_TRACE(what + " mask " + qp_mask_names(mask));
    const ibv_qp_state before = qp->state;
    EXPECT_EQ(ibv_modify_qp(qp, &attr, static_cast<int>(mask)), EINVAL);
    expect_state(qp, before);
  }

  void check_state_table(ibv_qp_type type);
  void check_missing_required(ibv_qp_type type);
  void check_extra_attributes(ibv_qp_type type);
  void check_optional_attributes(ibv_qp_type type);
};
CONFORMANCE_INSTANTIATE(QpStateTest);

// ---- every transition with its minimal mask ---------------------------------

void QpStateTest::check_state_table(ibv_qp_type type) {
  for (ibv_qp_state from : kReachable) {
    for (ibv_qp_state to : kAllStates) {
      SCOPED_TRACE(step(type, from, to));
      Qp qp = qp_in(type, from);
      ASSERT_TRUE(qp);
      const TransitionRule rule = transition_rule(type, from, to);
      ibv_qp_attr attr = valid_attr(qp.get(), from, to);
      const uint32_t mask = IBV_QP_STATE | rule.required;
      const int rc = ibv_modify_qp(qp.get(), &attr, static_cast<int>(mask));
      if (rule.valid) {
        EXPECT_EQ(rc, 0) << "a valid transition was refused (mask " << qp_mask_names(mask) << ")";
        expect_state(qp.get(), rc == 0 ? to : from);
      } else {
        EXPECT_EQ(rc, EINVAL) << "an invalid transition was " << (rc == 0 ? "accepted" : "refused wrongly");
        expect_state(qp.get(), rc == 0 ? to : from);
      }
    }
  }
}

TEST_P(QpStateTest, StateTableRc) { check_state_table(IBV_QPT_RC); }
TEST_P(QpStateTest, StateTableUc) { check_state_table(IBV_QPT_UC); }
TEST_P(QpStateTest, StateTableUd) { check_state_table(IBV_QPT_UD); }

// ---- each required attribute is required -----------------------------------

void QpStateTest::check_missing_required(ibv_qp_type type) {
  for (ibv_qp_state from : kReachable) {
    Qp qp = qp_in(type, from);
    ASSERT_TRUE(qp);
    for (ibv_qp_state to : kAllStates) {
      const TransitionRule rule = transition_rule(type, from, to);
      if (!rule.valid) continue;
      for (unsigned bit = kFirstAttrBit; bit <= kLastAttrBit; ++bit) {
        const uint32_t b = 1u << bit;
        if (!(rule.required & b)) continue;
        expect_rejected(qp.get(), valid_attr(qp.get(), from, to), IBV_QP_STATE | (rule.required & ~b),
                        step(type, from, to) + " without " + qp_mask_names(b));
      }
    }
  }
}

TEST_P(QpStateTest, MissingRequiredAttributeRc) { check_missing_required(IBV_QPT_RC); }
TEST_P(QpStateTest, MissingRequiredAttributeUc) { check_missing_required(IBV_QPT_UC); }
TEST_P(QpStateTest, MissingRequiredAttributeUd) { check_missing_required(IBV_QPT_UD); }

// ---- attributes a transition does not take -----------------------------------

void QpStateTest::check_extra_attributes(ibv_qp_type type) {
  for (ibv_qp_state from : kReachable) {
    Qp qp = qp_in(type, from);
    ASSERT_TRUE(qp);
    for (ibv_qp_state to : kAllStates) {
      const TransitionRule rule = transition_rule(type, from, to);
      if (!rule.valid) continue;
      for (unsigned bit = kFirstAttrBit; bit <= kLastAttrBit; ++bit) {
        const uint32_t b = 1u << bit;
        if ((rule.required | rule.optional) & b) continue;
        expect_rejected(qp.get(), valid_attr(qp.get(), from, to), IBV_QP_STATE | rule.required | b,
                        step(type, from, to) + " with " + qp_mask_names(b));
      }
    }
  }
}

TEST_P(QpStateTest, NotAllowedAttributeRc) { check_extra_attributes(IBV_QPT_RC); }
TEST_P(QpStateTest, NotAllowedAttributeUc) { check_extra_attributes(IBV_QPT_UC); }
TEST_P(QpStateTest, NotAllowedAttributeUd) { check_extra_attributes(IBV_QPT_UD); }

// ---- optional attributes are accepted ------------------------------------------

void QpStateTest::check_optional_attributes(ibv_qp_type type) {
  // Alternate paths and path migration states are left out: they need an
  // alternate path valid_attr does not build, and REARM/MIGRATED depend on the
  // QP's migration state (path_migration_test.cpp covers them).
  constexpr uint32_t kSkip = IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
  for (ibv_qp_state from : kReachable) {
    for (ibv_qp_state to : kAllStates) {
      const TransitionRule rule = transition_rule(type, from, to);
      if (!rule.valid) continue;
      for (unsigned bit = kFirstAttrBit; bit <= kLastAttrBit; ++bit) {
        const uint32_t b = 1u << bit;
        if (!(rule.optional & b) || (b & kSkip)) continue;
        SCOPED_TRACE(step(type, from, to) + " with " + qp_mask_names(b));
        Qp qp = qp_in(type, from);
        ASSERT_TRUE(qp);
        ibv_qp_attr attr = valid_attr(qp.get(), from, to);
        EXPECT_EQ(ibv_modify_qp(qp.get(), &attr, static_cast<int>(IBV_QP_STATE | rule.required | b)), 0);
        expect_state(qp.get(), to);
      }
    }
  }
}

TEST_P(QpStateTest, OptionalAttributeRc) { check_optional_attributes(IBV_QPT_RC); }
TEST_P(QpStateTest, OptionalAttributeUc) { check_optional_attributes(IBV_QPT_UC); }
TEST_P(QpStateTest, OptionalAttributeUd) { check_optional_attributes(IBV_QPT_UD); }

// ---- named invalid transitions ----------------------------------------------

TEST_P(QpStateTest, InvalidTransitions) {
  struct Case {
    ibv_qp_state from, to;
  };
  const Case cases[] = {
      {IBV_QPS_RESET, IBV_QPS_RTR}, {IBV_QPS_RESET, IBV_QPS_RTS}, {IBV_QPS_RESET, IBV_QPS_SQD},
      {IBV_QPS_RESET, IBV_QPS_ERR}, {IBV_QPS_INIT, IBV_QPS_RTS},  {IBV_QPS_INIT, IBV_QPS_SQD},
      {IBV_QPS_RTR, IBV_QPS_INIT},  {IBV_QPS_RTR, IBV_QPS_RTR},   {IBV_QPS_RTR, IBV_QPS_SQD},
      {IBV_QPS_RTS, IBV_QPS_INIT},  {IBV_QPS_RTS, IBV_QPS_RTR},   {IBV_QPS_SQD, IBV_QPS_INIT},
      {IBV_QPS_ERR, IBV_QPS_INIT},  {IBV_QPS_ERR, IBV_QPS_RTS},   {IBV_QPS_RTS, IBV_QPS_SQE},
  };
  for (ibv_qp_type type : kTypes) {
    for (const Case& c : cases) {
      Qp qp = qp_in(type, c.from);
      ASSERT_TRUE(qp);
      // Offer every attribute the target could want: the transition itself is wrong.
      ibv_qp_attr attr = valid_attr(qp.get(), c.from, c.to);
      uint32_t mask = IBV_QP_STATE;
      for (ibv_qp_state via : kAllStates) mask |= transition_rule(type, via, c.to).required;
      expect_rejected(qp.get(), attr, mask, step(type, c.from, c.to));
      expect_rejected(qp.get(), attr, IBV_QP_STATE, step(type, c.from, c.to) + " (state only)");
    }
  }
}

TEST_P(QpStateTest, StateValuesBeyondErr) {
  Qp qp = qp_in(IBV_QPT_RC, IBV_QPS_RTR);
  ASSERT_TRUE(qp);
  ibv_qp_attr attr = valid_attr(qp.get(), IBV_QPS_RTR, IBV_QPS_RTS);
  const uint32_t rts = IBV_QP_STATE | transition_rule(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS).required;
  attr.qp_state = static_cast<ibv_qp_state>(IBV_QPS_ERR + 1);
  expect_rejected(qp.get(), attr, rts, "qp_state past ERR");
  attr.qp_state = IBV_QPS_UNKNOWN;
  expect_rejected(qp.get(), attr, rts, "qp_state UNKNOWN");
  attr.qp_state = IBV_QPS_RTS;
  attr.cur_qp_state = static_cast<ibv_qp_state>(99);
  expect_rejected(qp.get(), attr, rts | IBV_QP_CUR_STATE, "cur_qp_state 99");
}

// ---- any state to RESET and ERR -------------------------------------------------

TEST_P(QpStateTest, AnyStateToResetAndQpIsReusable) {
  for (ibv_qp_type type : kTypes) {
    for (ibv_qp_state from : kReachable) {
      SCOPED_TRACE(step(type, from, IBV_QPS_RESET));
      Qp qp = qp_in(type, from);
      ASSERT_TRUE(qp);
      ASSERT_EQ(modify_min(qp.get(), IBV_QPS_RESET), 0);
      expect_state(qp.get(), IBV_QPS_RESET);
      // From RESET the QP goes through the whole path again.
      ASSERT_EQ(move_to(qp.get(), IBV_QPS_RTS), 0);
      expect_state(qp.get(), IBV_QPS_RTS);
    }
  }
}

TEST_P(QpStateTest, AnyStateButResetToErr) {
  for (ibv_qp_type type : kTypes) {
    for (ibv_qp_state from : kReachable) {
      SCOPED_TRACE(step(type, from, IBV_QPS_ERR));
      Qp qp = qp_in(type, from);
      ASSERT_TRUE(qp);
      ibv_qp_attr attr = valid_attr(qp.get(), from, IBV_QPS_ERR);
      const int rc = ibv_modify_qp(qp.get(), &attr, IBV_QP_STATE);
      EXPECT_EQ(rc, from == IBV_QPS_RESET ? EINVAL : 0);
      expect_state(qp.get(), from == IBV_QPS_RESET ? IBV_QPS_RESET : IBV_QPS_ERR);
    }
  }
}

TEST_P(QpStateTest, ModifyWithoutStateStaysInState) {
  // A modify without IBV_QP_STATE changes attributes in the current state; the
  // same-state rows decide which (there is no RTR -> RTR row).
  Qp qp = qp_in(IBV_QPT_RC, IBV_QPS_INIT);
  ASSERT_TRUE(qp);
  ibv_qp_attr attr = valid_attr(qp.get(), IBV_QPS_INIT, IBV_QPS_INIT);
  attr.qp_access_flags = IBV_ACCESS_REMOTE_READ;
  ASSERT_EQ(ibv_modify_qp(qp.get(), &attr, IBV_QP_ACCESS_FLAGS), 0);
  expect_state(qp.get(), IBV_QPS_INIT);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, IBV_QP_ACCESS_FLAGS, &qi), 0);
  EXPECT_EQ(q.qp_access_flags, static_cast<unsigned>(IBV_ACCESS_REMOTE_READ));

  Qp rtr = qp_in(IBV_QPT_RC, IBV_QPS_RTR);
  ASSERT_TRUE(rtr);
  attr = valid_attr(rtr.get(), IBV_QPS_RTR, IBV_QPS_RTR);
  expect_rejected(rtr.get(), attr, IBV_QP_MIN_RNR_TIMER, "RTR attribute-only modify");

  Qp rts = qp_in(IBV_QPT_RC, IBV_QPS_RTS);
  ASSERT_TRUE(rts);
  attr = valid_attr(rts.get(), IBV_QPS_RTS, IBV_QPS_RTS);
  attr.min_rnr_timer = 20;
  ASSERT_EQ(ibv_modify_qp(rts.get(), &attr, IBV_QP_MIN_RNR_TIMER), 0);
  expect_state(rts.get(), IBV_QPS_RTS);
}

// ---- drive to RTS and read every attribute back -------------------------------

TEST_P(QpStateTest, RcPathReadsBack) {
  Qp qp = make_qp(IBV_QPT_RC, cq_.get());
  ASSERT_TRUE(qp);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  constexpr int kAll = 0x1fffff;

  ibv_qp_attr a = valid_attr(qp.get(), IBV_QPS_RESET, IBV_QPS_INIT);
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  expect_state(qp.get(), IBV_QPS_INIT);
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, kAll, &qi), 0);
  EXPECT_EQ(q.pkey_index, 0);
  EXPECT_EQ(q.port_num, kPort);
  EXPECT_EQ(q.qp_access_flags, a.qp_access_flags);

  a = valid_attr(qp.get(), IBV_QPS_INIT, IBV_QPS_RTR);
  a.rq_psn = 0x1abcdef;  // wider than 24 bits: kept modulo 2^24
  a.max_dest_rd_atomic = static_cast<uint8_t>(std::min(dattr_.max_qp_rd_atom, 4));
  a.min_rnr_timer = 12;
  a.ah_attr.sl = 0;
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            0);
  expect_state(qp.get(), IBV_QPS_RTR);
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, kAll, &qi), 0);
  EXPECT_EQ(q.path_mtu, pattr_.active_mtu);
  EXPECT_EQ(q.dest_qp_num, qp->qp_num);
  EXPECT_EQ(q.rq_psn, 0xabcdefu);
  EXPECT_EQ(q.max_dest_rd_atomic, a.max_dest_rd_atomic);
  EXPECT_EQ(q.min_rnr_timer, 12);
  EXPECT_EQ(q.ah_attr.port_num, kPort);
  EXPECT_EQ(q.ah_attr.is_global, a.ah_attr.is_global);
  if (a.ah_attr.is_global) {
    EXPECT_EQ(std::memcmp(&q.ah_attr.grh.dgid, &a.ah_attr.grh.dgid, sizeof(ibv_gid)), 0);
    EXPECT_EQ(q.ah_attr.grh.sgid_index, a.ah_attr.grh.sgid_index);
    EXPECT_EQ(q.ah_attr.grh.hop_limit, a.ah_attr.grh.hop_limit);
  } else {
    EXPECT_EQ(q.ah_attr.dlid, a.ah_attr.dlid);
  }
  EXPECT_EQ(q.pkey_index, 0);
  EXPECT_EQ(q.qp_access_flags,
            static_cast<unsigned>(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC));

  a = valid_attr(qp.get(), IBV_QPS_RTR, IBV_QPS_RTS);
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 6;
  a.sq_psn = 0xfedcba98;  // kept modulo 2^24
  a.max_rd_atomic = static_cast<uint8_t>(std::min(dattr_.max_qp_init_rd_atom, 4));
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a,
                          IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                              IBV_QP_MAX_QP_RD_ATOMIC),
            0);
  expect_state(qp.get(), IBV_QPS_RTS);
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, kAll, &qi), 0);
  EXPECT_EQ(q.timeout, 14);
  EXPECT_EQ(q.retry_cnt, 7);
  EXPECT_EQ(q.rnr_retry, 6);
  EXPECT_EQ(q.sq_psn, 0xdcba98u);
  EXPECT_EQ(q.max_rd_atomic, a.max_rd_atomic);
  EXPECT_EQ(q.dest_qp_num, qp->qp_num);
  EXPECT_EQ(q.path_mtu, pattr_.active_mtu);
}

TEST_P(QpStateTest, UcPathReadsBack) {
  Qp qp = make_qp(IBV_QPT_UC, cq_.get());
  ASSERT_TRUE(qp);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ibv_qp_attr a = valid_attr(qp.get(), IBV_QPS_RESET, IBV_QPS_INIT);
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  expect_state(qp.get(), IBV_QPS_INIT);
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, IBV_QP_ACCESS_FLAGS | IBV_QP_PORT, &qi), 0);
  EXPECT_EQ(q.qp_access_flags, static_cast<unsigned>(IBV_ACCESS_REMOTE_WRITE));
  EXPECT_EQ(q.port_num, kPort);

  a = valid_attr(qp.get(), IBV_QPS_INIT, IBV_QPS_RTR);
  a.rq_psn = 0x42;
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN),
            0);
  expect_state(qp.get(), IBV_QPS_RTR);
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, IBV_QP_RQ_PSN | IBV_QP_DEST_QPN | IBV_QP_PATH_MTU | IBV_QP_AV, &qi), 0);
  EXPECT_EQ(q.rq_psn, 0x42u);
  EXPECT_EQ(q.dest_qp_num, qp->qp_num);
  EXPECT_EQ(q.path_mtu, pattr_.active_mtu);
  EXPECT_EQ(q.ah_attr.port_num, kPort);

  a = valid_attr(qp.get(), IBV_QPS_RTR, IBV_QPS_RTS);
  a.sq_psn = 0x1000007;
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  expect_state(qp.get(), IBV_QPS_RTS);
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, IBV_QP_SQ_PSN, &qi), 0);
  EXPECT_EQ(q.sq_psn, 7u);
}

TEST_P(QpStateTest, UdPathReadsBack) {
  Qp qp = make_qp(IBV_QPT_UD, cq_.get());
  ASSERT_TRUE(qp);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ibv_qp_attr a = valid_attr(qp.get(), IBV_QPS_RESET, IBV_QPS_INIT);
  a.qkey = 0x12345678;
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
  expect_state(qp.get(), IBV_QPS_INIT);
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, IBV_QP_QKEY | IBV_QP_PORT | IBV_QP_PKEY_INDEX, &qi), 0);
  EXPECT_EQ(q.qkey, 0x12345678u);
  EXPECT_EQ(q.port_num, kPort);
  EXPECT_EQ(q.pkey_index, 0);

  // UD needs nothing to become ready to receive.
  a = valid_attr(qp.get(), IBV_QPS_INIT, IBV_QPS_RTR);
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a, IBV_QP_STATE), 0);
  expect_state(qp.get(), IBV_QPS_RTR);

  a = valid_attr(qp.get(), IBV_QPS_RTR, IBV_QPS_RTS);
  a.sq_psn = 0x333;
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  expect_state(qp.get(), IBV_QPS_RTS);
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, IBV_QP_SQ_PSN | IBV_QP_QKEY, &qi), 0);
  EXPECT_EQ(q.sq_psn, 0x333u);
  EXPECT_EQ(q.qkey, 0x12345678u);

  // The Q_Key can be changed in RTS.
  a = valid_attr(qp.get(), IBV_QPS_RTS, IBV_QPS_RTS);
  a.qkey = 0x0badcafe;
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a, IBV_QP_QKEY), 0);
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, IBV_QP_QKEY, &qi), 0);
  EXPECT_EQ(q.qkey, 0x0badcafeu);
}

// ---- send queue drain -------------------------------------------------------

TEST_P(QpStateTest, RtsToSqdWithDrainedEventAndBack) {
  // (ConnectX does not implement the SQD state; this is the IBTA behaviour.)
  Qp qp = qp_in(IBV_QPT_RC, IBV_QPS_RTS);
  ASSERT_TRUE(qp);
  ibv_qp_attr a = valid_attr(qp.get(), IBV_QPS_RTS, IBV_QPS_SQD);
  a.en_sqd_async_notify = 1;
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
  ASSERT_TRUE(wait_readable(ctx_->async_fd)) << "no SQ drained event within " << kEventTimeoutMs << " ms";
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_SQ_DRAINED) << ibv_event_type_str(ev.event_type);
  EXPECT_EQ(ev.element.qp, qp.get());
  ibv_ack_async_event(&ev);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_SQD);
  EXPECT_EQ(q.sq_draining, 0) << "the drained event came while still draining";

  a = valid_attr(qp.get(), IBV_QPS_SQD, IBV_QPS_RTS);
  ASSERT_EQ(ibv_modify_qp(qp.get(), &a, IBV_QP_STATE), 0);
  expect_state(qp.get(), IBV_QPS_RTS);
  EXPECT_EQ(qp.destroy(), 0);
}

TEST_P(QpStateTest, RtsToSqdWithoutNotifyRaisesNoEvent) {
  Qp qp = qp_in(IBV_QPT_RC, IBV_QPS_RTS);
  ASSERT_TRUE(qp);
  ASSERT_EQ(modify_min(qp.get(), IBV_QPS_SQD), 0);
  expect_state(qp.get(), IBV_QPS_SQD);
  EXPECT_FALSE(wait_readable(ctx_->async_fd, 0)) << "an async event although none was asked for";
}

// ---- attribute values ------------------------------------------------------

TEST_P(QpStateTest, BadPortAndPkeyAtInit) {
  for (ibv_qp_type type : kTypes) {
    Qp qp = make_qp(type, cq_.get());
    ASSERT_TRUE(qp);
    const uint32_t mask = IBV_QP_STATE | transition_rule(type, IBV_QPS_RESET, IBV_QPS_INIT).required;
    const std::string s = step(type, IBV_QPS_RESET, IBV_QPS_INIT);
    ibv_qp_attr a = valid_attr(qp.get(), IBV_QPS_RESET, IBV_QPS_INIT);
    a.port_num = 0;
    expect_rejected(qp.get(), a, mask, s + " port_num 0");
    a.port_num = static_cast<uint8_t>(dattr_.phys_port_cnt + 1);
    expect_rejected(qp.get(), a, mask, s + " port_num past the last port");
    a = valid_attr(qp.get(), IBV_QPS_RESET, IBV_QPS_INIT);
    a.pkey_index = pattr_.pkey_tbl_len;
    expect_rejected(qp.get(), a, mask, s + " pkey_index past the table");
    // And INIT -> INIT checks them too.
    ASSERT_EQ(modify_min(qp.get(), IBV_QPS_INIT), 0);
    a = valid_attr(qp.get(), IBV_QPS_INIT, IBV_QPS_INIT);
    a.port_num = 0;
    expect_rejected(qp.get(), a, IBV_QP_STATE | IBV_QP_PORT, "INIT->INIT port_num 0");
    a = valid_attr(qp.get(), IBV_QPS_INIT, IBV_QPS_INIT);
    a.pkey_index = pattr_.pkey_tbl_len;
    expect_rejected(qp.get(), a, IBV_QP_STATE | IBV_QP_PKEY_INDEX, "INIT->INIT pkey_index past the table");
  }
}

TEST_P(QpStateTest, BadValuesAtRtr) {
  for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC}) {
    Qp qp = qp_in(type, IBV_QPS_INIT);
    ASSERT_TRUE(qp);
    const uint32_t mask = IBV_QP_STATE | transition_rule(type, IBV_QPS_INIT, IBV_QPS_RTR).required;
    const std::string s = step(type, IBV_QPS_INIT, IBV_QPS_RTR);
    auto fresh = [&] { return valid_attr(qp.get(), IBV_QPS_INIT, IBV_QPS_RTR); };
    ibv_qp_attr a = fresh();

    // Path MTU: an ibv_mtu value no larger than the port's active MTU. (ConnectX
    // checks only the 256..4096 range.)
    if (pattr_.active_mtu < IBV_MTU_4096) {
      a.path_mtu = static_cast<ibv_mtu>(pattr_.active_mtu + 1);
      expect_rejected(qp.get(), a, mask, s + " path_mtu above active_mtu");
    }
    a.path_mtu = static_cast<ibv_mtu>(0);
    expect_rejected(qp.get(), a, mask, s + " path_mtu 0");
    a.path_mtu = static_cast<ibv_mtu>(IBV_MTU_4096 + 1);
    expect_rejected(qp.get(), a, mask, s + " path_mtu past 4096");

    a = fresh();
    a.dest_qp_num = 1u << 24;
    expect_rejected(qp.get(), a, mask, s + " dest_qp_num wider than 24 bits");

    a = fresh();
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(std::min(pattr_.gid_tbl_len, 255));
    a.ah_attr.is_global = 1;
    if (pattr_.gid_tbl_len <= 255) expect_rejected(qp.get(), a, mask, s + " sgid_index past the GID table");

    a = fresh();
    a.ah_attr.port_num = 0;
    expect_rejected(qp.get(), a, mask, s + " AV port_num 0");
    a.ah_attr.port_num = static_cast<uint8_t>(dattr_.phys_port_cnt + 1);
    expect_rejected(qp.get(), a, mask, s + " AV port_num past the last port");

    if (is_ethernet()) {
      // RoCE addresses are GIDs: an address vector without a GRH is unusable.
      a = fresh();
      a.ah_attr.is_global = 0;
      a.ah_attr.dlid = 1;
      expect_rejected(qp.get(), a, mask, s + " AV without GRH on Ethernet");
    }

    if (type == IBV_QPT_RC) {
      a = fresh();
      a.min_rnr_timer = 32;
      expect_rejected(qp.get(), a, mask, s + " min_rnr_timer 32 (5 bits)");
      if (dattr_.max_qp_rd_atom < 255) {
        a = fresh();
        a.max_dest_rd_atomic = static_cast<uint8_t>(dattr_.max_qp_rd_atom + 1);
        expect_rejected(qp.get(), a, mask, s + " max_dest_rd_atomic above max_qp_rd_atom");
      }
    }
    // The QP is still usable afterwards.
    ASSERT_EQ(modify_min(qp.get(), IBV_QPS_RTR), 0);
  }
}

TEST_P(QpStateTest, BadValuesAtRts) {
  Qp qp = qp_in(IBV_QPT_RC, IBV_QPS_RTR);
  ASSERT_TRUE(qp);
  const uint32_t mask = IBV_QP_STATE | transition_rule(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS).required;
  auto fresh = [&] { return valid_attr(qp.get(), IBV_QPS_RTR, IBV_QPS_RTS); };
  // IBTA field widths: timeout and RNR timer 5 bits, retry counters 3 bits.
  ibv_qp_attr a = fresh();
  a.timeout = 32;
  expect_rejected(qp.get(), a, mask, "timeout 32");
  a = fresh();
  a.retry_cnt = 8;
  expect_rejected(qp.get(), a, mask, "retry_cnt 8");
  a = fresh();
  a.rnr_retry = 8;
  expect_rejected(qp.get(), a, mask, "rnr_retry 8");
  if (dattr_.max_qp_init_rd_atom < 255) {
    a = fresh();
    a.max_rd_atomic = static_cast<uint8_t>(dattr_.max_qp_init_rd_atom + 1);
    expect_rejected(qp.get(), a, mask, "max_rd_atomic above max_qp_init_rd_atom");
  }
  a = fresh();
  a.min_rnr_timer = 32;
  expect_rejected(qp.get(), a, mask | IBV_QP_MIN_RNR_TIMER, "optional min_rnr_timer 32");
  ASSERT_EQ(modify_min(qp.get(), IBV_QPS_RTS), 0);
  // The same checks apply in RTS -> RTS.
  a = valid_attr(qp.get(), IBV_QPS_RTS, IBV_QPS_RTS);
  a.min_rnr_timer = 32;
  expect_rejected(qp.get(), a, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER, "RTS->RTS min_rnr_timer 32");
}

TEST_P(QpStateTest, PsnsAreKeptModulo2To24) {
  Qp qp = qp_in(IBV_QPT_RC, IBV_QPS_INIT);
  ASSERT_TRUE(qp);
  ibv_qp_attr a = valid_attr(qp.get(), IBV_QPS_INIT, IBV_QPS_RTR);
  a.rq_psn = 0xffffffff;
  ASSERT_EQ(
      ibv_modify_qp(qp.get(), &a,
                    static_cast<int>(IBV_QP_STATE | transition_rule(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR).required)),
      0);
  a = valid_attr(qp.get(), IBV_QPS_RTR, IBV_QPS_RTS);
  a.sq_psn = 0x1000001;
  ASSERT_EQ(
      ibv_modify_qp(qp.get(), &a,
                    static_cast<int>(IBV_QP_STATE | transition_rule(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS).required)),
      0);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp.get(), &q, IBV_QP_RQ_PSN | IBV_QP_SQ_PSN, &qi), 0);
  EXPECT_EQ(q.rq_psn, 0xffffffu);
  EXPECT_EQ(q.sq_psn, 1u);
}

}  // namespace
}  // namespace conformance
