// One test per async event that needs the fault layer or a natural cause not
// covered by the conformance suite (docs/compatibility.md, "Async events"), and
// the CQ overrun semantics.
#include "tests/faults/rc_pair.hpp"

namespace faults_test {
namespace {

class Event : public PairTest {
 protected:
  // The next event of ctx is `type` (with the element checked by the caller).
  static ibv_async_event expect_event(ibv_context* ctx, ibv_event_type type) {
    ibv_async_event ev{};
    bool got = next_event(ctx, &ev);
    EXPECT_TRUE(got) << "no " << ibv_event_type_str(type) << " within " << kWaitMs << " ms";
    if (!got) return ev;
    EXPECT_EQ(ev.event_type, type) << ibv_event_type_str(ev.event_type);
    ibv_ack_async_event(&ev);
    return ev;
  }
  static ibv_port_state port_state(ibv_context* ctx) {
    ibv_port_attr pa{};
    EXPECT_EQ(ibv_query_port(ctx, 1, &pa), 0);
    return pa.state;
  }
};

// A CQ overrun, as on ConnectX: the completions that fit can be polled, the CQ
// reports IBV_EVENT_CQ_ERR once and takes no more completions, and the QP that
// could not write its completion suffers a catastrophic error: IBV_EVENT_QP_FATAL
// and the error state. No completion is lost without an event saying so.
TEST_F(Event, CqErrOnOverrunAndTheQpFails) {
  QpParams p;
  p.cq_depth = 1;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  ASSERT_EQ(a_.cq->cqe, 1);
  for (uint64_t i = 1; i <= 3; ++i) ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, i), 0);
  ibv_async_event ev = expect_event(a_.ctx, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev.element.cq, a_.cq);
  ev = expect_event(a_.ctx, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, a_.qp);
  EXPECT_EQ(query_state(a_.qp), IBV_QPS_ERR);
  ibv_wc wc[4];
  ASSERT_EQ(ibv_poll_cq(a_.cq, 4, wc), 1);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].wr_id, 1u);
  // The CQ stays in error: nothing more arrives, and no second CQ_ERR.
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 4), 0);
  EXPECT_EQ(ibv_poll_cq(a_.cq, 4, wc), 0);
  pollfd pf{a_.ctx->async_fd, POLLIN, 0};
  EXPECT_EQ(::poll(&pf, 1, 0), 0) << "a second event after the overrun";
}

TEST_F(Event, QpFatalByTheControlApi) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ASSERT_EQ(post_recv(a_, 64, 42), 0);
  ASSERT_EQ(softverbs_qp_force_error(a_.qp), 0);
  ibv_async_event ev = expect_event(a_.ctx, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, a_.qp);
  EXPECT_EQ(query_state(a_.qp), IBV_QPS_ERR);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc.wr_id, 42u);
}

// qp_error from a scenario: the second RDMA WRITE posted on the QP fails it.
TEST_F(Event, QpFatalByAPostSendRule) {
  ASSERT_NO_FATAL_FAILURE(setup());
  load("[[rule]]\nverb = \"post_send\"\nopcode = \"IBV_WR_RDMA_WRITE\"\nnth = 2\naction = \"qp_error\"\n");
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 1), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 2), 0);
  ibv_async_event ev = expect_event(a_.ctx, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, a_.qp);
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc.wr_id, 2u);
}

TEST_F(Event, PortErrAndPortActive) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ASSERT_EQ(softverbs_port_set_state(b_.device.c_str(), 1, 0), 0);
  ibv_async_event ev = expect_event(b_.ctx, IBV_EVENT_PORT_ERR);
  EXPECT_EQ(ev.element.port_num, 1);
  EXPECT_EQ(port_state(b_.ctx), IBV_PORT_DOWN);
  EXPECT_EQ(port_state(a_.ctx), IBV_PORT_ACTIVE) << "only the named device's port";
  ASSERT_EQ(softverbs_port_set_state(b_.device.c_str(), 1, 1), 0);
  ev = expect_event(b_.ctx, IBV_EVENT_PORT_ACTIVE);
  EXPECT_EQ(ev.element.port_num, 1);
  EXPECT_EQ(port_state(b_.ctx), IBV_PORT_ACTIVE);
  // Traffic flows again.
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  errno = 0;
  EXPECT_EQ(softverbs_port_set_state("nosuch", 1, 0), -1);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(softverbs_port_set_state(b_.device.c_str(), 2, 0), -1);
  EXPECT_EQ(errno, EINVAL);
}

// A timed rule takes the port down for 100 ms: PORT_ERR, then PORT_ACTIVE, and
// a request posted meanwhile gets through once the link is back (its retries
// outlast the outage).
TEST_F(Event, PortDownForATimeByATimedRule) {
  QpParams p;
  p.timeout = 14;  // about 67 ms: 7 retries outlast the 100 ms outage
  ASSERT_NO_FATAL_FAILURE(setup(p));
  load("[[rule]]\nname = \"outage\"\nat_ms = 0\ndevice = \"" + b_.device +
       "\"\naction = \"port_down\"\nduration_ms = 100\n");
  expect_event(b_.ctx, IBV_EVENT_PORT_ERR);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64), 0);
  expect_event(b_.ctx, IBV_EVENT_PORT_ACTIVE);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(softverbs_fault_hits("outage"), 1u);
}

struct PortEvent {
  ibv_event_type type;
  const char* name;
};

class RaisedPortEvent : public Event, public ::testing::WithParamInterface<PortEvent> {};

// LID, P_Key, GID and SM changes and client re-registration: raised through the
// control API and by a timed scenario rule, on every open context of the device
// with the port number as element. Only the event is raised: the port's
// attributes (emulated, fixed) do not change.
TEST_P(RaisedPortEvent, ByTheControlApiAndByAScenario) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ibv_context* second = ibv_open_device(list_[0]);  // another context of device a
  ASSERT_NE(second, nullptr);
  ibv_async_event raise{};
  raise.event_type = GetParam().type;
  raise.element.port_num = 1;
  ASSERT_EQ(softverbs_raise_async_event(a_.ctx, &raise), 0);
  for (ibv_context* c : {a_.ctx, second}) {
    ibv_async_event ev = expect_event(c, GetParam().type);
    EXPECT_EQ(ev.element.port_num, 1);
  }
  load("[[rule]]\nat_ms = 0\ndevice = \"" + a_.device + "\"\naction = \"event\"\nevent = \"" + GetParam().name +
       "\"\n");
  for (ibv_context* c : {a_.ctx, second}) expect_event(c, GetParam().type);
  pollfd pf{b_.ctx->async_fd, POLLIN, 0};
  EXPECT_EQ(::poll(&pf, 1, 0), 0) << "the other device got the event too";
  EXPECT_EQ(ibv_close_device(second), 0);
}

#define SV_PORT_EVENT(e) \
  PortEvent { e, #e }
INSTANTIATE_TEST_SUITE_P(Events, RaisedPortEvent,
                         ::testing::Values(SV_PORT_EVENT(IBV_EVENT_LID_CHANGE), SV_PORT_EVENT(IBV_EVENT_PKEY_CHANGE),
                                           SV_PORT_EVENT(IBV_EVENT_GID_CHANGE), SV_PORT_EVENT(IBV_EVENT_SM_CHANGE),
                                           SV_PORT_EVENT(IBV_EVENT_CLIENT_REREGISTER)),
                         [](const ::testing::TestParamInfo<PortEvent>& info) {
                           return std::string(info.param.name + 10);
                         });
#undef SV_PORT_EVENT

TEST_F(Event, SrqLimitReached) {
  QpParams p;
  p.with_srq = true;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  for (int i = 0; i < 4; ++i) ASSERT_EQ(post_recv(b_, 64, 100 + i), 0);
  ibv_srq_attr sa{};
  sa.srq_limit = 3;  // armed: fires when fewer than 3 receives remain
  ASSERT_EQ(ibv_modify_srq(b_.srq, &sa, IBV_SRQ_LIMIT), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64, 1), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 64, 2), 0);
  ibv_async_event ev = expect_event(b_.ctx, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.element.srq, b_.srq);
  // The limit disarms itself.
  ASSERT_EQ(ibv_query_srq(b_.srq, &sa), 0);
  EXPECT_EQ(sa.srq_limit, 0u);
}

// An SRQ catastrophic error has no natural cause in the emulator: raised.
TEST_F(Event, SrqErrRaised) {
  QpParams p;
  p.with_srq = true;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  ibv_async_event raise{};
  raise.event_type = IBV_EVENT_SRQ_ERR;
  raise.element.srq = b_.srq;
  ASSERT_EQ(softverbs_raise_async_event(b_.ctx, &raise), 0);
  ibv_async_event ev = expect_event(b_.ctx, IBV_EVENT_SRQ_ERR);
  EXPECT_EQ(ev.element.srq, b_.srq);
  // An element of another context is refused.
  raise.element.srq = b_.srq;
  errno = 0;
  EXPECT_EQ(softverbs_raise_async_event(a_.ctx, &raise), -1);
  EXPECT_EQ(errno, EINVAL);
}

// DEVICE_FATAL on the third device (fc), which no other test uses: a failed
// device stays failed for the life of the process.
TEST_F(Event, DeviceFatal) {
  ASSERT_GE(list_.size(), 3) << "needs a third emulated device (SOFTVERBS_DEVICES=fa,fb,fc)";
  Side& c = a_;
  c.device = list_.name(2);
  c.ctx = ibv_open_device(list_[2]);
  ASSERT_NE(c.ctx, nullptr);
  c.pd = ibv_alloc_pd(c.ctx);
  c.cq = ibv_create_cq(c.ctx, 8, nullptr, nullptr, 0);
  c.mr = ibv_reg_mr(c.pd, c.buf.data(), kBuf, IBV_ACCESS_LOCAL_WRITE);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = c.cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {4, 4, 1, 1, 0};
  c.qp = ibv_create_qp(c.pd, &qa);
  ASSERT_TRUE(c.pd && c.cq && c.mr && c.qp);
  ibv_qp_attr x{};
  x.qp_state = IBV_QPS_INIT;
  x.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(c.qp, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  ASSERT_EQ(post_recv(c, 64, 9), 0);

  ASSERT_EQ(softverbs_device_fatal(c.device.c_str()), 0);
  expect_event(c.ctx, IBV_EVENT_DEVICE_FATAL);
  EXPECT_EQ(query_state(c.qp), IBV_QPS_ERR);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(c.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc.wr_id, 9u);
  EXPECT_EQ(port_state(c.ctx), IBV_PORT_DOWN);
  // No new resources; destroying still works (TearDown).
  errno = 0;
  EXPECT_EQ(ibv_alloc_pd(c.ctx), nullptr);
  EXPECT_EQ(errno, EIO);
  EXPECT_EQ(ibv_create_cq(c.ctx, 8, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EIO);
  // The port cannot come back.
  EXPECT_EQ(softverbs_port_set_state(c.device.c_str(), 1, 1), -1);
  EXPECT_EQ(errno, EIO);
}

// ---- QP events with a natural cause -------------------------------------------

// The responder cannot take a request (the SEND is longer than its receive
// buffer): IBV_EVENT_QP_REQ_ERR on its QP, which is now in error.
TEST_F(Event, QpReqErrAtTheResponder) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ASSERT_EQ(post_recv(b_, 16), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_SEND, 100), 0);
  ibv_async_event ev = expect_event(b_.ctx, IBV_EVENT_QP_REQ_ERR);
  EXPECT_EQ(ev.element.qp, b_.qp);
  EXPECT_EQ(query_state(b_.qp), IBV_QPS_ERR);
}

// An RDMA WRITE with a bad rkey: IBV_EVENT_QP_ACCESS_ERR at the responder.
TEST_F(Event, QpAccessErrAtTheResponder) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 1, 0, b_.mr->rkey ^ 0x100), 0);
  ibv_async_event ev = expect_event(b_.ctx, IBV_EVENT_QP_ACCESS_ERR);
  EXPECT_EQ(ev.element.qp, b_.qp);
}

// The first request a QP receives while in RTR establishes the connection:
// IBV_EVENT_COMM_EST (the application may then move it to RTS).
TEST_F(Event, CommEstOnTheFirstRequestInRtr) {
  ASSERT_NO_FATAL_FAILURE(setup());
  // Put b back to RTR: reset and reconnect it without the RTS step.
  ibv_qp_attr x{};
  x.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(b_.qp, &x, IBV_QP_STATE), 0);
  x = {};
  x.qp_state = IBV_QPS_INIT;
  x.port_num = 1;
  x.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_modify_qp(b_.qp, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  x = {};
  x.qp_state = IBV_QPS_RTR;
  x.path_mtu = IBV_MTU_1024;
  x.dest_qp_num = a_.qp->qp_num;
  x.rq_psn = 0;
  x.max_dest_rd_atomic = 1;
  x.min_rnr_timer = 1;
  x.ah_attr.is_global = 1;
  x.ah_attr.grh.dgid = a_.gid;
  x.ah_attr.grh.sgid_index = 1;
  x.ah_attr.grh.hop_limit = 64;
  x.ah_attr.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(b_.qp, &x,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            0);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64), 0);
  ibv_async_event ev = expect_event(b_.ctx, IBV_EVENT_COMM_EST);
  EXPECT_EQ(ev.element.qp, b_.qp);
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// ---- events without a natural cause in the emulator: raised -----------------

struct RaisedEvent {
  ibv_event_type type;
  const char* name;
};

class RaisedQpEvent : public Event, public ::testing::WithParamInterface<RaisedEvent> {};

// Path migration (no alternate paths in the emulator), and QP_FATAL / CQ_ERR
// raised without their cause: the element is the named QP or CQ, the event goes to
// its context only, and only the event happens (the QP stays in RTS).
TEST_P(RaisedQpEvent, ReachesItsElement) {
  ASSERT_NO_FATAL_FAILURE(setup());
  ibv_async_event raise{};
  raise.event_type = GetParam().type;
  if (GetParam().type == IBV_EVENT_CQ_ERR)
    raise.element.cq = a_.cq;
  else
    raise.element.qp = a_.qp;
  ASSERT_EQ(softverbs_raise_async_event(a_.ctx, &raise), 0);
  ibv_async_event ev = expect_event(a_.ctx, GetParam().type);
  if (GetParam().type == IBV_EVENT_CQ_ERR)
    EXPECT_EQ(ev.element.cq, a_.cq);
  else
    EXPECT_EQ(ev.element.qp, a_.qp);
  EXPECT_EQ(query_state(a_.qp), IBV_QPS_RTS);
  pollfd pf{b_.ctx->async_fd, POLLIN, 0};
  EXPECT_EQ(::poll(&pf, 1, 0), 0);
  // A scenario raises QP events on the QP its rule matched.
  load(std::string("[[rule]]\nverb = \"post_send\"\ncount = 1\naction = \"event\"\nevent = \"") + GetParam().name +
       "\"\n");
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64), 0);
  ev = expect_event(a_.ctx, GetParam().type);
  if (GetParam().type == IBV_EVENT_CQ_ERR)
    EXPECT_EQ(ev.element.cq, a_.cq);
  else
    EXPECT_EQ(ev.element.qp, a_.qp);
}

#define SV_EVENT(e) \
  RaisedEvent { e, #e }
INSTANTIATE_TEST_SUITE_P(Events, RaisedQpEvent,
                         ::testing::Values(SV_EVENT(IBV_EVENT_PATH_MIG), SV_EVENT(IBV_EVENT_PATH_MIG_ERR),
                                           SV_EVENT(IBV_EVENT_QP_FATAL), SV_EVENT(IBV_EVENT_CQ_ERR)),
                         [](const ::testing::TestParamInfo<RaisedEvent>& info) {
                           return std::string(info.param.name + 10);
                         });
#undef SV_EVENT

}  // namespace
}  // namespace faults_test
