// rdma_cm over XRC (RDMA_PS_IB with IBV_QPT_XRC_SEND / IBV_QPT_XRC_RECV), as
// rdma_xserver and rdma_xclient use it, between two RoCE devices of the
// process: rdma_create_ep gives the initiator an XRC_SEND QP and the target's
// request id an XRC_RECV QP on the device's XRC domain; rdma_create_srq on
// that id makes an XRC SRQ completing into the id's receive CQ; the SRQ
// number reaches the initiator in the REP's private data. Public API only.
#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_verbs.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "tests/conformance/cm/cm_connect.hpp"
#include "tests/support/wait.hpp"

namespace cmtest {
namespace {

rdma_addrinfo* xrc_addrinfo(in_addr host, uint16_t port, ibv_qp_type type, bool passive) {
  char name[INET_ADDRSTRLEN], service[8];
  inet_ntop(AF_INET, &host, name, sizeof name);
  snprintf(service, sizeof service, "%u", port);
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST | (passive ? RAI_PASSIVE : 0);
  hints.ai_port_space = RDMA_PS_IB;
  hints.ai_qp_type = type;
  rdma_addrinfo* res = nullptr;
  if (rdma_getaddrinfo(name, service, &hints, &res) != 0) return nullptr;
  return res;
}

TEST_F(CmTest, XrcEndpointsDeliverIntoTheSrqTheRepNames) {
  const uint16_t port = next_port();
  rdma_addrinfo* res = xrc_addrinfo(b_, port, IBV_QPT_XRC_RECV, true);
  ASSERT_NE(res, nullptr);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_IB);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_XRC_RECV);
  ibv_qp_init_attr attr{};
  attr.cap.max_recv_wr = 1;
  attr.cap.max_recv_sge = 1;
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_ep(&listen, res, nullptr, &attr), 0) << strerror(errno);
  rdma_freeaddrinfo(res);
  ASSERT_EQ(rdma_listen(listen, 1), 0);

  // The target side, synchronous as rdma_xserver. Each step's outcome is kept
  // and checked on the test's thread; waits are bounded.
  uint8_t rbuf[16] = {};
  std::atomic<int> step{0};
  std::atomic<bool> types_ok{false};
  std::thread server([&] {
    rdma_cm_id* conn = nullptr;
    pollfd pfd{listen->channel->fd, POLLIN, 0};  // bounded: a refused REQ never reaches the listener
    if (poll(&pfd, 1, kEventTimeoutMs) != 1 || rdma_get_request(listen, &conn) != 0) return;
    step = 1;
    types_ok = conn->qp_type == IBV_QPT_XRC_RECV && conn->qp && conn->qp->qp_type == IBV_QPT_XRC_RECV && conn->pd;
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = 1;
    sa.attr.max_sge = 1;
    uint32_t srqn = 0;
    ibv_mr* mr = nullptr;
    if (rdma_create_srq(conn, nullptr, &sa) == 0 && conn->srq && ibv_get_srq_num(conn->srq, &srqn) == 0 &&
        (mr = rdma_reg_msgs(conn, rbuf, sizeof rbuf)) && rdma_post_recv(conn, nullptr, rbuf, sizeof rbuf, mr) == 0) {
      step = 2;
      const uint32_t be = htonl(srqn);
      rdma_conn_param p{};
      p.private_data = &be;
      p.private_data_len = sizeof be;
      if (rdma_accept(conn, &p) == 0) {
        step = 3;
        std::vector<ibv_wc> wc = softverbs::testkit::poll_completions(conn->recv_cq, 1, kEventTimeoutMs);
        if (wc.size() == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].byte_len == sizeof rbuf &&
            wc[0].qp_num == conn->qp->qp_num)
          step = 4;
        rdma_cm_event* ev = next_event(conn->channel);  // the initiator's disconnect
        if (ev) {
          if (ev->event == RDMA_CM_EVENT_DISCONNECTED) step = step == 4 ? 5 : step.load();
          rdma_ack_cm_event(ev);
        }
      }
    }
    if (mr) rdma_dereg_mr(mr);
    rdma_destroy_ep(conn);
  });

  res = xrc_addrinfo(b_, port, IBV_QPT_XRC_SEND, false);
  ASSERT_NE(res, nullptr);
  sockaddr_in src = v4(a_, 0);
  res->ai_src_addr = static_cast<sockaddr*>(malloc(sizeof src));
  std::memcpy(res->ai_src_addr, &src, sizeof src);
  res->ai_src_len = sizeof src;
  attr = ibv_qp_init_attr{};
  attr.cap.max_send_wr = 1;
  attr.cap.max_send_sge = 1;
  attr.sq_sig_all = 1;
  rdma_cm_id* client = nullptr;
  ASSERT_EQ(rdma_create_ep(&client, res, nullptr, &attr), 0) << strerror(errno);
  rdma_freeaddrinfo(res);
  ASSERT_NE(client->qp, nullptr);
  EXPECT_EQ(client->qp->qp_type, IBV_QPT_XRC_SEND);
  uint8_t sbuf[16];
  for (size_t i = 0; i < sizeof sbuf; ++i) sbuf[i] = static_cast<uint8_t>(0xA0 + i);
  ibv_mr* smr = rdma_reg_msgs(client, sbuf, sizeof sbuf);
  ASSERT_NE(smr, nullptr);
  EXPECT_EQ(rdma_connect(client, nullptr), 0) << strerror(errno);
  ASSERT_NE(client->event, nullptr);
  ASSERT_GE(client->event->param.conn.private_data_len, 4);
  uint32_t be = 0;
  std::memcpy(&be, client->event->param.conn.private_data, sizeof be);
  const uint32_t srqn = ntohl(be);
  EXPECT_NE(srqn, 0u);

  ibv_sge sge{reinterpret_cast<uintptr_t>(sbuf), sizeof sbuf, smr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 0x42;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.qp_type.xrc.remote_srqn = srqn;
  ASSERT_EQ(ibv_post_send(client->qp, &wr, &bad), 0);
  std::vector<ibv_wc> sent = softverbs::testkit::poll_completions(client->send_cq, 1, kEventTimeoutMs);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(sent[0].status);
  EXPECT_EQ(sent[0].wr_id, 0x42u);
  // The send's completion means the target delivered it (reliable service):
  // its receive completion is on its CQ whatever the disconnect does next.
  EXPECT_EQ(rdma_disconnect(client), 0);
  server.join();
  EXPECT_TRUE(types_ok.load());
  EXPECT_EQ(step.load(), 5) << "1 request, 2 SRQ posted, 3 accepted, 4 received, 5 disconnected";
  EXPECT_EQ(std::memcmp(rbuf, sbuf, sizeof sbuf), 0);
  EXPECT_EQ(rdma_dereg_mr(smr), 0);
  rdma_destroy_ep(client);
  rdma_destroy_ep(listen);
}

}  // namespace
}  // namespace cmtest
