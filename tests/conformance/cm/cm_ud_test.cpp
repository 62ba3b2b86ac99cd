// rdma_cm conformance: UD ids (RDMA_PS_UDP). SIDR resolves the peer's QP
// number and Q_Key: ESTABLISHED carries rdma_ud_param (qp_num, qkey, an
// ah_attr usable with ibv_create_ah); a rejection and a missing listener end
// in UNREACHABLE with the SIDR_REP status (IBTA 12.11.3: 2 rejected, 1 no such
// service).
#include "tests/support/cm.hpp"

namespace cmtest {
namespace {

ibv_qp_init_attr ud_attr() {
  ibv_qp_init_attr a{};
  a.qp_type = IBV_QPT_UD;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.sq_sig_all = 1;
  return a;
}

class CmUd : public CmTest {
 protected:
  void SetUp() override {
    CmTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    port_ = next_port();
    ASSERT_EQ(rdma_create_id(passive_, &listen_.id, nullptr, RDMA_PS_UDP), 0);
    auto addr = v4(b_, port_);
    ASSERT_EQ(rdma_bind_addr(listen_, sa(addr)), 0);
    ASSERT_EQ(rdma_listen(listen_, 4), 0);
  }

  // An active UD id on a, its route to b:port resolved.
  void resolve(Id& id, uint16_t port) {
    ASSERT_EQ(rdma_create_id(active_, &id.id, nullptr, RDMA_PS_UDP), 0);
    auto src = v4(a_, 0);
    auto dst = v4(b_, port);
    ASSERT_EQ(rdma_resolve_addr(id, sa(src), sa(dst), 2000), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ADDR_RESOLVED));
    ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
    ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ROUTE_RESOLVED));
  }

  uint16_t port_ = 0;
  Id listen_;
};

TEST_F(CmUd, SidrAcceptGivesUdParamsAndASendWorks) {
  Id client;
  resolve(client, port_);
  if (HasFatalFailure()) return;
  auto attr = ud_attr();
  ASSERT_EQ(rdma_create_qp(client, nullptr, &attr), 0);
  const char hello[] = "sidr";
  rdma_conn_param p{};
  p.private_data = hello;
  p.private_data_len = sizeof hello;
  ASSERT_EQ(rdma_connect(client, &p), 0);
  rdma_cm_event* req = expect_event(passive_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req, nullptr);
  Id server;
  server.reset(req->id);
  EXPECT_STREQ(static_cast<const char*>(req->param.ud.private_data), hello);
  rdma_ack_cm_event(req);
  attr = ud_attr();
  ASSERT_EQ(rdma_create_qp(server, nullptr, &attr), 0);
  ASSERT_EQ(rdma_accept(server, nullptr), 0);

  rdma_cm_event* est = expect_event(active_, RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(est, nullptr);
  rdma_ud_param ud = est->param.ud;
  rdma_ack_cm_event(est);
  EXPECT_EQ(ud.qp_num, server->qp->qp_num);
  EXPECT_EQ(ud.qkey, RDMA_UDP_QKEY);
  ibv_ah* ah = ibv_create_ah(client->pd, &ud.ah_attr);
  ASSERT_NE(ah, nullptr) << strerror(errno);

  // A UD send to the resolved QP (the receive buffer has room for the GRH).
  char rbuf[64 + 40] = {}, sbuf[64] = "over UD";
  ibv_mr* rmr = ibv_reg_mr(server->pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* smr = ibv_reg_mr(client->pd, sbuf, sizeof sbuf, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(rmr, nullptr);
  ASSERT_NE(smr, nullptr);
  ibv_sge rsge{reinterpret_cast<uint64_t>(rbuf), sizeof rbuf, rmr->lkey};
  ibv_recv_wr rwr{}, *rbad = nullptr;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ASSERT_EQ(ibv_post_recv(server->qp, &rwr, &rbad), 0);
  ibv_sge ssge{reinterpret_cast<uint64_t>(sbuf), sizeof sbuf, smr->lkey};
  ibv_send_wr swr{}, *sbad = nullptr;
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  swr.wr.ud.ah = ah;
  swr.wr.ud.remote_qpn = ud.qp_num;
  swr.wr.ud.remote_qkey = ud.qkey;
  ASSERT_EQ(ibv_post_send(client->qp, &swr, &sbad), 0);
  ibv_wc wc{};
  pollfd none{-1, 0, 0};
  int got = 0;
  for (int i = 0; i < 500 && got == 0; ++i) {
    got = ibv_poll_cq(server->recv_cq, 1, &wc);
    if (!got) poll(&none, 0, 4);  // bounded poll of the CQ, 2 s in all
  }
  ASSERT_EQ(got, 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(rbuf + 40, "over UD");
  ibv_destroy_ah(ah);
  ibv_dereg_mr(rmr);
  ibv_dereg_mr(smr);
}

TEST_F(CmUd, RejectIsUnreachableWithStatusTwo) {
  Id client;
  resolve(client, port_);
  if (HasFatalFailure()) return;
  rdma_conn_param p{};
  ASSERT_EQ(rdma_connect(client, &p), 0);
  rdma_cm_event* req = expect_event(passive_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req, nullptr);
  Id server;
  server.reset(req->id);
  rdma_ack_cm_event(req);
  ASSERT_EQ(rdma_reject(server, nullptr, 0), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_UNREACHABLE, 2));
}

// A request destroyed before it is answered is rejected (ib_cm sends a
// SIDR_REP with IB_SIDR_REJECT from its destroy), not left to time out.
TEST_F(CmUd, DestroyingAnUnansweredRequestRejectsIt) {
  Id client;
  resolve(client, port_);
  if (HasFatalFailure()) return;
  rdma_conn_param p{};
  ASSERT_EQ(rdma_connect(client, &p), 0);
  rdma_cm_event* req = expect_event(passive_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req, nullptr);
  rdma_cm_id* child = req->id;
  rdma_ack_cm_event(req);
  ASSERT_EQ(rdma_destroy_id(child), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_UNREACHABLE, 2, 1000));
}

// The application answers a request later than the requester's SIDR
// response timeout: the resent SIDR_REQs are duplicates of the request it
// already has, not new requests (ib_cm drops them), and its answer still
// reaches the requester. The suite's response timeout (256 ms) gives a resend
// every 384 ms and 3 of them; the request is answered after 800 ms.
TEST_F(CmUd, ResentRequestIsNotANewRequest) {
  Id client;
  resolve(client, port_);
  if (HasFatalFailure()) return;
  rdma_conn_param p{};
  p.qp_num = 0x77;
  ASSERT_EQ(rdma_connect(client, &p), 0);
  rdma_cm_event* req = expect_event(passive_, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req, nullptr);
  Id server;
  server.reset(req->id);
  rdma_ack_cm_event(req);
  rdma_cm_event* again = next_event(passive_, 800);  // nothing may come: a bounded wait for an absence
  EXPECT_EQ(again, nullptr) << "a resent SIDR_REQ was reported as " << rdma_event_str(again->event);
  if (again) rdma_ack_cm_event(again);
  p.qp_num = 0x99;
  ASSERT_EQ(rdma_accept(server, &p), 0);
  rdma_cm_event* est = expect_event(active_, RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(est, nullptr);
  EXPECT_EQ(est->param.ud.qp_num, 0x99u);
  rdma_ack_cm_event(est);
}

TEST_F(CmUd, NoListenerIsUnreachableWithStatusOne) {
  Id client;
  resolve(client, next_port());
  if (HasFatalFailure()) return;
  rdma_conn_param p{};
  ASSERT_EQ(rdma_connect(client, &p), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_UNREACHABLE, 1));
}

}  // namespace
}  // namespace cmtest
