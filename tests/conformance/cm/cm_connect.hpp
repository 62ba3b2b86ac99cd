// The RC connection fixture of the rdma_cm conformance tests: a listener on
// device b, an active id on device a with its route resolved, and the steps
// of a connection (public rdma_cm API only).
#pragma once

#include "tests/support/cm.hpp"

namespace cmtest {

inline ibv_qp_init_attr rc_attr() {
  ibv_qp_init_attr a{};
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 8;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.sq_sig_all = 1;
  return a;
}

// A listener on b and an active id on a whose route is resolved (QPs are
// created by each test, with rdma_create_qp on the CM's PD).
class CmConnect : public CmTest {
 protected:
  void SetUp() override {
    CmTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    port_ = next_port();
    listen_.reset();
    ASSERT_EQ(rdma_create_id(passive_, &listen_.id, nullptr, RDMA_PS_TCP), 0);
    auto addr = v4(b_, port_);
    ASSERT_EQ(rdma_bind_addr(listen_, sa(addr)), 0);
    ASSERT_EQ(rdma_listen(listen_, 8), 0);
    ASSERT_EQ(rdma_create_id(active_, &client_.id, nullptr, RDMA_PS_TCP), 0);
    resolve(client_, port_);
  }

  void resolve(rdma_cm_id* id, uint16_t port) {
    auto src = v4(a_, 0);
    auto dst = v4(b_, port);
    ASSERT_EQ(rdma_resolve_addr(id, sa(src), sa(dst), 2000), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
    ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
  }

  // The passive side's CONNECT_REQUEST; its id is kept in server_.
  rdma_cm_event* take_request() {
    rdma_cm_event* ev = expect_event(passive_, RDMA_CM_EVENT_CONNECT_REQUEST);
    if (ev) {
      EXPECT_EQ(ev->listen_id, listen_.id);
      server_.reset(ev->id);
    }
    return ev;
  }

  // Connect with a QP on each side; both reach ESTABLISHED.
  void connect_pair() {
    auto attr = rc_attr();
    ASSERT_EQ(rdma_create_qp(client_, nullptr, &attr), 0);
    rdma_conn_param p{};
    p.responder_resources = p.initiator_depth = 1;
    p.retry_count = 7;
    ASSERT_EQ(rdma_connect(client_, &p), 0);
    rdma_cm_event* req = take_request();
    ASSERT_NE(req, nullptr);
    rdma_ack_cm_event(req);
    attr = rc_attr();
    ASSERT_EQ(rdma_create_qp(server_, nullptr, &attr), 0);
    ASSERT_EQ(rdma_accept(server_, &p), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ESTABLISHED));
    ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_ESTABLISHED));
  }

  uint16_t port_ = 0;
  Id listen_, client_, server_;
};

}  // namespace cmtest
