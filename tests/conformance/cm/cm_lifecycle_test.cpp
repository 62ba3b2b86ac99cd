// rdma_cm conformance: the ends of ids and connections. Destroying a
// connected id disconnects its peer; destroying a request's id before it is
// accepted rejects it (IB_CM_REJ_CONSUMER_DEFINED, as ib_cm's destroy does),
// and so does destroying the requester (IB_CM_REJ_TIMEOUT);
// a destroyed listener rejects the requests it holds; both sides may
// disconnect at once; an accept is taken once; requests beyond
// the listen backlog wait for the requester's resend; and 127.0.0.1
// reaches a wildcard listener of this host's devices.
#include "cm_connect.hpp"

namespace cmtest {
namespace {

TEST_F(CmConnect, DestroyingAConnectedIdDisconnectsThePeer) {
  connect_pair();
  if (HasFatalFailure()) return;
  client_.reset();
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_DISCONNECTED));
}

TEST_F(CmConnect, DestroyingAnUnacceptedRequestRejectsIt) {
  rdma_conn_param p{};
  p.qp_num = 0x2222;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  server_.reset();
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_REJECTED, 28));
}

// The requester gives up (destroys its id) before the request is answered:
// its REJ (IB_CM_REJ_TIMEOUT, 4) names only its own comm ID, and still reaches
// the request's id on the passive side.
TEST_F(CmConnect, DestroyingTheRequesterRejectsTheRequest) {
  rdma_conn_param p{};
  p.qp_num = 0x2222;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  client_.reset();
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_REJECTED, 4));
}

// A listener destroyed with a request the application never took: the request
// goes with it, rejected as unanswered (the kernel destroys such ids with the
// listener).
TEST_F(CmConnect, DestroyingAListenerRejectsTheRequestsItHolds) {
  rdma_conn_param p{};
  p.qp_num = 0x2222;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  pollfd pf{passive_->fd, POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, kEventTimeoutMs), 1) << "the request was not queued";
  listen_.reset();
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_REJECTED, 28));
  EXPECT_EQ(poll(&pf, 1, 0), 0) << "the request's event outlived its listener";
}

TEST_F(CmConnect, AcceptIsTakenOnce) {
  auto attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(client_, nullptr, &attr), 0);
  rdma_conn_param p{};
  p.responder_resources = p.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  errno = 0;
  EXPECT_EQ(rdma_connect(client_, &p), -1) << "a second connect";
  EXPECT_EQ(errno, EINVAL);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  errno = 0;
  EXPECT_EQ(rdma_accept(listen_, &p), -1) << "a listener accepts nothing";
  EXPECT_EQ(errno, EINVAL);
  attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(server_, nullptr, &attr), 0);
  ASSERT_EQ(rdma_accept(server_, &p), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ESTABLISHED));
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_ESTABLISHED));
  errno = 0;
  EXPECT_EQ(rdma_accept(server_, &p), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(CmConnect, BothSidesDisconnectAtOnce) {
  connect_pair();
  if (HasFatalFailure()) return;
  ASSERT_EQ(rdma_disconnect(client_), 0);
  ASSERT_EQ(rdma_disconnect(server_), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_DISCONNECTED));
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_DISCONNECTED));
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, 15000));
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, 15000));
}

// A backlog of 1 and three requests at once: the ones beyond the backlog are
// not rejected; the requesters' resends reach the listener as it takes them.
TEST_F(CmTest, RequestsBeyondTheBacklogArriveLater) {
  uint16_t port = next_port();
  Id listen(passive_);
  auto addr = v4(b_, port);
  ASSERT_EQ(rdma_bind_addr(listen, sa(addr)), 0);
  ASSERT_EQ(rdma_listen(listen, 1), 0);
  Id clients[3];
  for (Id& c : clients) {
    ASSERT_EQ(rdma_create_id(active_, &c.id, nullptr, RDMA_PS_TCP), 0);
    ASSERT_EQ(rdma_resolve_addr(c, nullptr, sa(addr), 2000), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
    ASSERT_EQ(rdma_resolve_route(c, 2000), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
  }
  for (Id& c : clients) {
    rdma_conn_param p{};
    p.qp_num = 0x100;
    ASSERT_EQ(rdma_connect(c, &p), 0);
  }
  for (int i = 0; i < 3; ++i) {
    rdma_cm_event* req = expect_event(passive_, RDMA_CM_EVENT_CONNECT_REQUEST);
    ASSERT_NE(req, nullptr) << "request " << i;
    rdma_cm_id* child = req->id;
    rdma_ack_cm_event(req);
    ASSERT_EQ(rdma_reject(child, nullptr, 0), 0);
    ASSERT_EQ(rdma_destroy_id(child), 0);
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_REJECTED, 28));
}

TEST_F(CmTest, LoopbackAddressReachesAWildcardListener) {
  uint16_t port = next_port();
  Id listen(passive_);
  auto any = v4("0.0.0.0", port);
  ASSERT_EQ(rdma_bind_addr(listen, sa(any)), 0);
  ASSERT_EQ(rdma_listen(listen, 4), 0);
  Id client(active_);
  auto dst = v4("127.0.0.1", port);
  ASSERT_EQ(rdma_resolve_addr(client, nullptr, sa(dst), 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
  ASSERT_EQ(rdma_resolve_route(client, 2000), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
  rdma_conn_param p{};
  p.qp_num = 0x3333;
  ASSERT_EQ(rdma_connect(client, &p), 0);
  rdma_cm_event* req = expect_event(passive_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req, nullptr);
  Id server;
  server.reset(req->id);
  EXPECT_EQ(req->listen_id, listen.id);
  rdma_ack_cm_event(req);
  ASSERT_EQ(rdma_reject(server, nullptr, 0), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_REJECTED, 28));
}

}  // namespace
}  // namespace cmtest
