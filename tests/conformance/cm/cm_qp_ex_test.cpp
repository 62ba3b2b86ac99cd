// rdma_cm conformance: rdma_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
// makes a QP of the ibv_wr_* API (ibv_qp_to_qp_ex gives its ibv_qp_ex), and the
// extended post API works over the CM-connected QP; a comp_mask bit the verbs
// refuse fails rdma_create_qp_ex with the verbs' errno. Public API only.
#include <cstring>
#include <vector>

#include "cm_connect.hpp"
#include "tests/support/wait.hpp"

namespace cmtest {
namespace {

using softverbs::testkit::poll_completions;

constexpr int kCqTimeoutMs = 5000;

ibv_qp_init_attr_ex rc_attr_ex(ibv_pd* pd, uint64_t ops) {
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 8;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.sq_sig_all = 1;
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  a.pd = pd;
  a.send_ops_flags = ops;
  return a;
}

TEST_F(CmConnect, CreateQpExWithSendOpsPostsThroughTheWrApi) {
  ASSERT_NE(client_->pd, nullptr);
  auto cattr = rc_attr_ex(client_->pd, IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND);
  ASSERT_EQ(rdma_create_qp_ex(client_, &cattr), 0) << strerror(errno);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(client_->qp);
  ASSERT_NE(qpx, nullptr);
  EXPECT_EQ(static_cast<void*>(&qpx->qp_base), static_cast<void*>(client_->qp));

  rdma_conn_param p{};
  p.responder_resources = p.initiator_depth = 1;
  p.retry_count = 7;
  ASSERT_EQ(rdma_connect(client_, &p), 0);
  rdma_cm_event* req = take_request();
  ASSERT_NE(req, nullptr);
  rdma_ack_cm_event(req);
  ASSERT_NE(server_->pd, nullptr);
  auto sattr = rc_attr_ex(server_->pd, IBV_QP_EX_WITH_SEND);
  ASSERT_EQ(rdma_create_qp_ex(server_, &sattr), 0) << strerror(errno);
  EXPECT_NE(ibv_qp_to_qp_ex(server_->qp), nullptr);
  ASSERT_EQ(rdma_accept(server_, &p), 0);
  ASSERT_TRUE(ack_expected(active_, RDMA_CM_EVENT_ESTABLISHED));
  ASSERT_TRUE(ack_expected(passive_, RDMA_CM_EVENT_ESTABLISHED));

  // The server's memory: a target the client writes, a receive buffer.
  std::vector<uint8_t> target(1024, 0), rx(256, 0), src(1024);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  ibv_mr* tmr = ibv_reg_mr(server_->pd, target.data(), target.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_mr* rmr = ibv_reg_mr(server_->pd, rx.data(), rx.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* smr = ibv_reg_mr(client_->pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(tmr && rmr && smr) << strerror(errno);
  ibv_sge rs{reinterpret_cast<uintptr_t>(rx.data()), static_cast<uint32_t>(rx.size()), rmr->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = 9;
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_recv(server_->qp, &rwr, &bad), 0);

  // One batch: the WRITE, then the SEND that tells the peer it is there.
  ibv_wr_start(qpx);
  qpx->wr_id = 1;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(qpx, tmr->rkey, reinterpret_cast<uintptr_t>(target.data()));
  ibv_wr_set_sge(qpx, smr->lkey, reinterpret_cast<uintptr_t>(src.data()), 1024);
  qpx->wr_id = 2;
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, smr->lkey, reinterpret_cast<uintptr_t>(src.data()), 100);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);

  std::vector<ibv_wc> sent = poll_completions(client_->send_cq, 2, kCqTimeoutMs);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(sent[0].wr_id, 1u);
  EXPECT_EQ(sent[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(sent[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(sent[1].wr_id, 2u);
  EXPECT_EQ(sent[1].opcode, IBV_WC_SEND);
  std::vector<ibv_wc> got = poll_completions(server_->recv_cq, 1, kCqTimeoutMs);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].wr_id, 9u);
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(got[0].byte_len, 100u);
  EXPECT_EQ(std::memcmp(target.data(), src.data(), 1024), 0);
  EXPECT_EQ(std::memcmp(rx.data(), src.data(), 100), 0);

  EXPECT_EQ(ibv_dereg_mr(smr), 0);
  EXPECT_EQ(ibv_dereg_mr(rmr), 0);
  EXPECT_EQ(ibv_dereg_mr(tmr), 0);
}

// A comp_mask bit the verbs refuse (an XRC domain on an RC QP): rdma_create_qp_ex
// fails with what ibv_create_qp_ex answers, and the id keeps no QP. The verbs'
// answer comes from a context this process opens on the id's device (through
// the passthrough, the CM's own contexts belong to the library behind it).
TEST_F(CmConnect, CreateQpExWithUnsupportedCompMaskGivesTheVerbsErrno) {
  ASSERT_NE(client_->pd, nullptr);
  int verbs_errno = 0;
  {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ASSERT_NE(list, nullptr);
    ibv_context* ctx = nullptr;
    for (int i = 0; i < n && !ctx; ++i)
      if (std::strcmp(list[i]->name, client_->verbs->device->name) == 0) ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx, nullptr) << "the id's device " << client_->verbs->device->name;
    ibv_pd* pd = ibv_alloc_pd(ctx);
    ibv_cq* cq = ibv_create_cq(ctx, 8, nullptr, nullptr, 0);
    ASSERT_TRUE(pd && cq);
    auto attr = rc_attr_ex(pd, IBV_QP_EX_WITH_SEND);
    attr.comp_mask |= IBV_QP_INIT_ATTR_IND_TABLE;  // RSS: not offered
    attr.send_cq = attr.recv_cq = cq;
    errno = 0;
    ibv_qp* direct = ibv_create_qp_ex(ctx, &attr);
    EXPECT_EQ(direct, nullptr);
    verbs_errno = errno;
    if (direct) ibv_destroy_qp(direct);
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
    EXPECT_EQ(ibv_dealloc_pd(pd), 0);
    EXPECT_EQ(ibv_close_device(ctx), 0);
  }
  EXPECT_NE(verbs_errno, 0);

  auto attr = rc_attr_ex(client_->pd, IBV_QP_EX_WITH_SEND);
  attr.comp_mask |= IBV_QP_INIT_ATTR_IND_TABLE;  // RSS: not offered
  errno = 0;
  EXPECT_EQ(rdma_create_qp_ex(client_, &attr), -1);
  EXPECT_EQ(errno, verbs_errno);
  EXPECT_EQ(client_->qp, nullptr);
}

}  // namespace
}  // namespace cmtest
