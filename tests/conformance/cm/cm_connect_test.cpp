// rdma_cm conformance: RC connections between two devices of the process.
// Connect and accept with private data both ways, the CONNECT_REQUEST's
// parameters, data over the connected QPs, rejection, rdma_establish for an id
// without a QP, CONNECT_ERROR, disconnection and time-wait, destroy with
// events not acknowledged, and synchronous ids (rdma_create_ep/rdma_get_request).
#include "cm_connect.hpp"

#include <rdma/rdma_verbs.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace cmtest {
namespace {

TEST_F(CmConnect, PrivateDataParamsAndDataTransfer) {
  auto attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(client_, nullptr, &attr), 0);
  uint8_t req_data[56], rep_data[196];
  for (size_t i = 0; i < sizeof req_data; ++i) req_data[i] = static_cast<uint8_t>(i + 1);
  for (size_t i = 0; i < sizeof rep_data; ++i) rep_data[i] = static_cast<uint8_t>(0xff - i);
  rdma_conn_param p{};
  p.responder_resources = 2;
  p.initiator_depth = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;

  // The REQ carries 56 bytes on RDMA_PS_TCP (92 less the 36-byte CMA header).
  uint8_t too_long[57] = {};
  p.private_data = too_long;
  p.private_data_len = sizeof too_long;
  errno = 0;
  EXPECT_EQ(rdma_connect(client_, &p), -1);
  EXPECT_EQ(errno, EINVAL);

  p.private_data = req_data;
  p.private_data_len = sizeof req_data;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  const rdma_conn_param& rp = req->param.conn;
  EXPECT_EQ(rp.private_data_len, 56);
  ASSERT_NE(rp.private_data, nullptr);
  EXPECT_EQ(std::memcmp(rp.private_data, req_data, 56), 0);
  // The peer's view: what we answer for is what it initiates, and the reverse.
  EXPECT_EQ(rp.responder_resources, 1);
  EXPECT_EQ(rp.initiator_depth, 2);
  EXPECT_NE(server_->verbs, nullptr);
  EXPECT_EQ(reinterpret_cast<sockaddr_in*>(rdma_get_peer_addr(server_))->sin_addr.s_addr, a_.s_addr);
  EXPECT_EQ(reinterpret_cast<sockaddr_in*>(rdma_get_local_addr(server_))->sin_addr.s_addr, b_.s_addr);
  EXPECT_EQ(ntohs(rdma_get_src_port(server_)), port_);
  EXPECT_EQ(rdma_get_dst_port(server_), rdma_get_src_port(client_));
  rdma_ack_cm_event(req);

  attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(server_, nullptr, &attr), 0);
  rdma_conn_param ap{};
  ap.responder_resources = 1;
  ap.initiator_depth = 1;
  ap.private_data = rep_data;
  ap.private_data_len = sizeof rep_data;
  ASSERT_EQ(rdma_accept(server_, &ap), 0);
  rdma_cm_event* est = expect_event(active_, RDMA_CM_EVENT_ESTABLISHED);
  ASSERT_NE(est, nullptr);
  ASSERT_NE(est->param.conn.private_data, nullptr);
  EXPECT_GE(est->param.conn.private_data_len, 196);
  EXPECT_EQ(std::memcmp(est->param.conn.private_data, rep_data, 196), 0);
  rdma_ack_cm_event(est);
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_ESTABLISHED));
  EXPECT_EQ(ntohs(rdma_get_dst_port(client_)), port_);
  EXPECT_EQ(reinterpret_cast<sockaddr_in*>(rdma_get_peer_addr(client_))->sin_addr.s_addr, b_.s_addr);

  // SEND, RDMA WRITE and RDMA READ over the connected QPs.
  char cbuf[64] = "hello from a", sbuf[64] = {};
  ibv_mr* cmr = rdma_reg_msgs(client_, cbuf, sizeof cbuf);
  ibv_mr* smr = ibv_reg_mr(server_->pd, sbuf, sizeof sbuf,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(cmr, nullptr);
  ASSERT_NE(smr, nullptr);
  ASSERT_EQ(rdma_post_recv(server_, nullptr, sbuf, sizeof sbuf, smr), 0);
  ASSERT_EQ(rdma_post_send(client_, nullptr, cbuf, sizeof cbuf, cmr, 0), 0);
  ibv_wc wc{};
  ASSERT_EQ(rdma_get_send_comp(client_, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_EQ(rdma_get_recv_comp(server_, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(sbuf, "hello from a");

  std::strcpy(cbuf, "written by a");
  ASSERT_EQ(rdma_post_write(client_, nullptr, cbuf, sizeof cbuf, cmr, 0, reinterpret_cast<uint64_t>(sbuf), smr->rkey),
            0);
  ASSERT_EQ(rdma_get_send_comp(client_, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(sbuf, "written by a");
  std::strcpy(sbuf, "read by a");
  std::memset(cbuf, 0, sizeof cbuf);
  ASSERT_EQ(rdma_post_read(client_, nullptr, cbuf, sizeof cbuf, cmr, 0, reinterpret_cast<uint64_t>(sbuf), smr->rkey),
            0);
  ASSERT_EQ(rdma_get_send_comp(client_, &wc), 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_STREQ(cbuf, "read by a");

  ASSERT_EQ(rdma_disconnect(client_), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_DISCONNECTED));
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_DISCONNECTED));
  rdma_dereg_mr(cmr);
  ibv_dereg_mr(smr);
}

// A consumer reject: REJECTED with IB_CM_REJ_CONSUMER_DEFINED (28) and the
// rejecter's private data on the active side.
TEST_F(CmConnect, RejectWithPrivateData) {
  ASSERT_EQ(rdma_connect(client_, nullptr), -1) << "RDMA_PS_TCP without a QP needs parameters";
  rdma_conn_param p{};
  p.qp_num = 0x1234;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  const char why[] = "go away";
  ASSERT_EQ(rdma_reject(server_, why, sizeof why), 0);
  rdma_cm_event* ev = expect_event(active_, RDMA_CM_EVENT_REJECTED, 28);
  ASSERT_NE(ev, nullptr);
  ASSERT_NE(ev->param.conn.private_data, nullptr);
  EXPECT_GE(ev->param.conn.private_data_len, sizeof why);
  EXPECT_STREQ(static_cast<const char*>(ev->param.conn.private_data), why);
  rdma_ack_cm_event(ev);
}

// Nobody listens on the port: the passive CM answers IB_CM_REJ_INVALID_SERVICE_ID (8).
TEST_F(CmConnect, RejectedWhenNobodyListens) {
  Id other(active_);
  resolve(other, next_port());
  rdma_conn_param p{};
  p.qp_num = 0x1234;
  ASSERT_EQ(rdma_connect(other, &p), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_REJECTED, 8));
}

// An active id without a QP gets CONNECT_RESPONSE and finishes with rdma_establish.
TEST_F(CmConnect, ConnectResponseAndEstablishWithoutAQp) {
  rdma_conn_param p{};
  p.qp_num = 0x4321;
  p.responder_resources = p.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  auto attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(server_, nullptr, &attr), 0);
  ASSERT_EQ(rdma_accept(server_, &p), 0);
  rdma_cm_event* resp = expect_event(active_, RDMA_CM_EVENT_CONNECT_RESPONSE);
  ASSERT_NE(resp, nullptr);
  EXPECT_EQ(resp->param.conn.qp_num, server_->qp->qp_num);
  rdma_ack_cm_event(resp);
  ASSERT_EQ(rdma_establish(client_), 0);
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_ESTABLISHED));
  errno = 0;
  EXPECT_EQ(rdma_establish(client_), -1) << "only once";
  EXPECT_EQ(errno, EINVAL);
}

// The active QP cannot go to RTR when the REP arrives (the application moved
// it to ERR): CONNECT_ERROR on the active side, REJECTED on the passive side.
TEST_F(CmConnect, ConnectErrorWhenTheActiveQpCannotMove) {
  auto attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(client_, nullptr, &attr), 0);
  rdma_conn_param p{};
  p.responder_resources = p.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(client_->qp, &err, IBV_QP_STATE), 0);
  attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(server_, nullptr, &attr), 0);
  ASSERT_EQ(rdma_accept(server_, &p), 0);
  rdma_cm_event* ev = expect_event(active_, RDMA_CM_EVENT_CONNECT_ERROR, -EINVAL);
  ASSERT_NE(ev, nullptr);
  rdma_ack_cm_event(ev);
  rdma_cm_event* rej = next_event(passive_);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->event, RDMA_CM_EVENT_REJECTED);
  rdma_ack_cm_event(rej);
}

// DISCONNECTED on both sides, then TIMEWAIT_EXIT on each once the CM's time-wait
// (its response timeout, short in this suite) is over.
TEST_F(CmConnect, DisconnectThenTimewaitExit) {
  connect_pair();
  if (HasFatalFailure()) return;
  ASSERT_EQ(rdma_disconnect(server_), 0);
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_DISCONNECTED));
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_DISCONNECTED));
  // The side that received the DREQ answers it when it disconnects too (the
  // kernel sends the DREP from rdma_disconnect); then both are in time-wait.
  ASSERT_EQ(rdma_disconnect(client_), 0);
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, 15000));
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, 15000));
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(client_->qp, &qa, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_ERR) << "a disconnected id's QP is in the error state";
}

// rdma_destroy_id waits until every event reported on the id is acknowledged.
TEST_F(CmConnect, DestroyWaitsForUnackedEvents) {
  Id id(active_);
  auto dst = v4(b_, next_port());
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, sa(dst), 2000), 0);
  rdma_cm_event* ev = expect_event(active_, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_NE(ev, nullptr);
  rdma_cm_id* raw = id.release();
  std::promise<int> done;
  std::future<int> destroyed = done.get_future();
  std::thread t([&] { done.set_value(rdma_destroy_id(raw)); });
  // The destroy must still be waiting a while later (a bounded wait for an absence).
  EXPECT_EQ(destroyed.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "destroyed with an event not acknowledged";
  rdma_ack_cm_event(ev);
  ASSERT_EQ(destroyed.wait_for(std::chrono::milliseconds(kEventTimeoutMs)), std::future_status::ready)
      << "the destroy still waits after the acknowledgement";
  EXPECT_EQ(destroyed.get(), 0);
  t.join();
}

// rdma_notify(COMM_EST) on the passive id before the RTU: the connection
// counts as established; on other ids and events it is EINVAL.
TEST_F(CmConnect, NotifyCommEst) {
  errno = 0;
  EXPECT_EQ(rdma_notify(client_, IBV_EVENT_COMM_EST), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_conn_param p{};
  p.qp_num = 0x1111;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  auto attr = rc_attr();
  ASSERT_EQ(rdma_create_qp(server_, nullptr, &attr), 0);
  ASSERT_EQ(rdma_accept(server_, &p), 0);
  // The active side holds its RTU (no QP: it waits for rdma_establish).
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_CONNECT_RESPONSE));
  EXPECT_EQ(rdma_notify(server_, IBV_EVENT_COMM_EST), 0);
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_ESTABLISHED));
  errno = 0;
  EXPECT_EQ(rdma_notify(server_, IBV_EVENT_QP_FATAL), -1);
  EXPECT_EQ(errno, EINVAL);
}

// rdma_init_qp_attr: the attributes for each state of the connected id's QP.
TEST_F(CmConnect, InitQpAttrInEachState) {
  connect_pair();
  if (HasFatalFailure()) return;
  for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
    ibv_qp_attr qa{};
    int mask = 0;
    qa.qp_state = s;
    ASSERT_EQ(rdma_init_qp_attr(client_, &qa, &mask), 0) << s;
    EXPECT_TRUE(mask & IBV_QP_STATE);
    if (s == IBV_QPS_INIT) {
      EXPECT_TRUE(mask & IBV_QP_PORT);
      EXPECT_TRUE(mask & IBV_QP_ACCESS_FLAGS);
    }
    if (s == IBV_QPS_RTR) {
      EXPECT_TRUE(mask & IBV_QP_DEST_QPN);
      EXPECT_EQ(qa.dest_qp_num, server_->qp->qp_num);
      EXPECT_TRUE(mask & IBV_QP_PATH_MTU);
      EXPECT_TRUE(mask & IBV_QP_AV);
    }
    if (s == IBV_QPS_RTS) {
      EXPECT_TRUE(mask & IBV_QP_SQ_PSN);
      EXPECT_TRUE(mask & IBV_QP_TIMEOUT);
    }
  }
}

// Synchronous ids (a NULL channel), as rdma_server/rdma_client use them:
// rdma_create_ep, rdma_listen, rdma_get_request, rdma_accept, rdma_connect.
TEST_F(CmTest, SynchronousEndpoints) {
  char port[8];
  snprintf(port, sizeof port, "%u", next_port());
  char host_b[INET_ADDRSTRLEN], host_a[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &b_, host_b, sizeof host_b);
  inet_ntop(AF_INET, &a_, host_a, sizeof host_a);

  rdma_addrinfo hints{}, *res = nullptr;
  hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  ASSERT_EQ(rdma_getaddrinfo(host_b, port, &hints, &res), 0);
  ibv_qp_init_attr attr = rc_attr();
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_ep(&listen, res, nullptr, &attr), 0);
  rdma_freeaddrinfo(res);
  ASSERT_EQ(rdma_listen(listen, 1), 0);

  std::atomic<int> server_rc{-1};
  std::thread server([&] {
    rdma_cm_id* conn = nullptr;
    if (rdma_get_request(listen, &conn) != 0) return;
    int rc = conn->qp ? rdma_accept(conn, nullptr) : -1;
    if (rc == 0) {
      // Wait for the client's disconnect (bounded by the client's own wait).
      rdma_cm_event* ev = nullptr;
      pollfd p{conn->channel->fd, POLLIN, 0};
      if (poll(&p, 1, kEventTimeoutMs) == 1 && rdma_get_cm_event(conn->channel, &ev) == 0) {
        rc = ev->event == RDMA_CM_EVENT_DISCONNECTED ? 0 : -2;
        rdma_ack_cm_event(ev);
      } else {
        rc = -3;
      }
    }
    server_rc = rc;
    rdma_destroy_ep(conn);
  });

  hints.ai_flags = RAI_NUMERICHOST;
  ASSERT_EQ(rdma_getaddrinfo(host_b, port, &hints, &res), 0);
  sockaddr_in src = v4(a_, 0);
  res->ai_src_addr = static_cast<sockaddr*>(malloc(sizeof src));
  std::memcpy(res->ai_src_addr, &src, sizeof src);
  res->ai_src_len = sizeof src;
  rdma_cm_id* client = nullptr;
  attr = rc_attr();
  ASSERT_EQ(rdma_create_ep(&client, res, nullptr, &attr), 0);
  rdma_freeaddrinfo(res);
  ASSERT_NE(client->qp, nullptr);
  EXPECT_EQ(rdma_connect(client, nullptr), 0);
  EXPECT_EQ(rdma_disconnect(client), 0);
  server.join();
  EXPECT_EQ(server_rc.load(), 0);
  rdma_destroy_ep(client);
  rdma_destroy_ep(listen);
}

}  // namespace
}  // namespace cmtest
