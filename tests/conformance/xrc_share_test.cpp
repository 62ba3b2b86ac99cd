// XRC beyond one handle: a domain file shared by the contexts of a device
// (ibv_open_xrcd(3)), XRC_RECV QPs opened by number through the domain
// (ibv_open_qp(3)), and the ibv_wr_* API on an XRC_SEND QP
// (ibv_wr_set_xrc_srqn, ibv_wr_post(3)).
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "conformance.hpp"

namespace conformance {
namespace {

class XrcShareTest : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    if (HasFatalFailure()) return;
    char path[] = "/tmp/sv_xrcs_XXXXXX";
    fd_ = mkstemp(path);
    ASSERT_GE(fd_, 0) << std::strerror(errno);
    path_ = path;
    ctx2_ = ibv_open_device(device_);
    ASSERT_NE(ctx2_, nullptr) << std::strerror(errno);
    pd2_ = ibv_alloc_pd(ctx2_);
    ASSERT_NE(pd2_, nullptr);
  }
  void TearDown() override {
    if (pd2_) {
      EXPECT_EQ(ibv_dealloc_pd(pd2_), 0);
    }
    if (ctx2_) {
      EXPECT_EQ(ibv_close_device(ctx2_), 0);
    }
    if (fd_ >= 0) close(fd_);
    if (!path_.empty()) unlink(path_.c_str());
    VerbsTest::TearDown();
  }

  static ibv_xrcd* open_xrcd(ibv_context* ctx, int fd, int oflags) {
    ibv_xrcd_init_attr attr{};
    attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    attr.fd = fd;
    attr.oflags = oflags;
    errno = 0;
    return ibv_open_xrcd(ctx, &attr);
  }
  static ibv_qp* create_recv_qp(ibv_context* ctx, ibv_xrcd* xrcd) {
    ibv_qp_init_attr_ex ri{};
    ri.qp_type = IBV_QPT_XRC_RECV;
    ri.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    ri.xrcd = xrcd;
    return ibv_create_qp_ex(ctx, &ri);
  }
  static ibv_qp* open_qp(ibv_context* ctx, ibv_xrcd* xrcd, uint32_t qpn, void* qp_context = nullptr,
                         ibv_qp_type type = IBV_QPT_XRC_RECV,
                         uint32_t mask = IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_TYPE) {
    ibv_qp_open_attr attr{};
    attr.comp_mask = mask;
    attr.qp_num = qpn;
    attr.xrcd = xrcd;
    attr.qp_context = qp_context;
    attr.qp_type = type;
    errno = 0;
    return ibv_open_qp(ctx, &attr);
  }

  int fd_ = -1;
  std::string path_;
  ibv_context* ctx2_ = nullptr;
  ibv_pd* pd2_ = nullptr;
};
CONFORMANCE_INSTANTIATE(XrcShareTest);

// The kernel keeps one domain per inode per device: a second context of the
// device finds the first one's, with the same oflags rules.
TEST_P(XrcShareTest, ContextsOfTheDeviceShareTheFilesDomain) {
  EXPECT_EQ(open_xrcd(ctx2_, fd_, 0), nullptr);
  EXPECT_EQ(errno, EAGAIN);
  ibv_xrcd* first = open_xrcd(ctx_, fd_, O_CREAT);
  ASSERT_NE(first, nullptr) << std::strerror(errno);
  int fd2 = open(path_.c_str(), O_RDONLY);
  ASSERT_GE(fd2, 0);
  ibv_xrcd* second = open_xrcd(ctx2_, fd2, 0);
  ASSERT_NE(second, nullptr) << std::strerror(errno);
  EXPECT_EQ(second->context, ctx2_);
  EXPECT_EQ(open_xrcd(ctx2_, fd2, O_CREAT | O_EXCL), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // fd -1 is a private domain whatever the oflags.
  ibv_xrcd* priv = open_xrcd(ctx2_, -1, O_EXCL);
  ASSERT_NE(priv, nullptr) << std::strerror(errno);
  EXPECT_EQ(open_xrcd(ctx2_, -7, O_CREAT), nullptr);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(ibv_close_xrcd(first), 0);
  EXPECT_EQ(ibv_close_xrcd(second), 0);
  EXPECT_EQ(ibv_close_xrcd(priv), 0);
  close(fd2);
}

// ibv_open_qp(3) and the kernel's ib_open_qp: comp_mask must name the domain,
// the number and the type; a number no XRC_RECV QP of that domain has, a
// type other than XRC_RECV or a domain of another context give EINVAL.
TEST_P(XrcShareTest, OpenQpRefusesWhatTheKernelRefuses) {
  ibv_xrcd* x1 = open_xrcd(ctx_, fd_, O_CREAT);
  ASSERT_NE(x1, nullptr);
  ibv_xrcd* x2 = open_xrcd(ctx2_, fd_, 0);
  ASSERT_NE(x2, nullptr);
  ibv_xrcd* other = open_xrcd(ctx2_, -1, O_CREAT);
  ASSERT_NE(other, nullptr);
  ibv_qp* qp = create_recv_qp(ctx_, x1);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  const uint32_t qpn = qp->qp_num;
  struct Case {
    const char* what;
    ibv_xrcd* xrcd;
    uint32_t qpn;
    ibv_qp_type type;
    uint32_t mask;
    int err;
  };
  constexpr uint32_t kAll = IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_TYPE;
  const Case cases[] = {
      {"no XRCD bit", x2, qpn, IBV_QPT_XRC_RECV, kAll & ~IBV_QP_OPEN_ATTR_XRCD, EINVAL},
      {"no NUM bit", x2, qpn, IBV_QPT_XRC_RECV, kAll & ~IBV_QP_OPEN_ATTR_NUM, EINVAL},
      {"no TYPE bit", x2, qpn, IBV_QPT_XRC_RECV, kAll & ~IBV_QP_OPEN_ATTR_TYPE, EINVAL},
      {"unknown bit", x2, qpn, IBV_QPT_XRC_RECV, kAll | IBV_QP_OPEN_ATTR_RESERVED, EOPNOTSUPP},
      {"wrong number", x2, qpn ^ 0x5a, IBV_QPT_XRC_RECV, kAll, EINVAL},
      {"RC type", x2, qpn, IBV_QPT_RC, kAll, EINVAL},
      {"XRC_SEND type", x2, qpn, IBV_QPT_XRC_SEND, kAll, EINVAL},
      {"another domain", other, qpn, IBV_QPT_XRC_RECV, kAll, EINVAL},
      {"another context's handle", x1, qpn, IBV_QPT_XRC_RECV, kAll, EINVAL},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ibv_qp* o = open_qp(ctx2_, c.xrcd, c.qpn, nullptr, c.type, c.mask);
    EXPECT_EQ(o, nullptr);
    EXPECT_EQ(errno, c.err);
    if (o) ibv_destroy_qp(o);
  }
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  // Gone with its last handle: the number opens nothing any more.
  EXPECT_EQ(open_qp(ctx2_, x2, qpn), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_close_xrcd(other), 0);
  EXPECT_EQ(ibv_close_xrcd(x2), 0);
  EXPECT_EQ(ibv_close_xrcd(x1), 0);
}

// An opened handle is a QP of the opener's context that queries and modifies
// the shared QP; the opener's domain handle is in use while it exists.
TEST_P(XrcShareTest, OpenedHandleQueriesAndModifiesTheSharedQp) {
  ibv_xrcd* x1 = open_xrcd(ctx_, fd_, O_CREAT);
  ibv_xrcd* x2 = open_xrcd(ctx2_, fd_, 0);
  ASSERT_NE(x1, nullptr);
  ASSERT_NE(x2, nullptr);
  ibv_qp* qp = create_recv_qp(ctx_, x1);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  int tag = 0;
  ibv_qp* o = open_qp(ctx2_, x2, qp->qp_num, &tag);
  ASSERT_NE(o, nullptr) << std::strerror(errno);
  EXPECT_NE(o, qp);
  EXPECT_EQ(o->context, ctx2_);
  EXPECT_EQ(o->qp_num, qp->qp_num);
  EXPECT_EQ(o->qp_type, IBV_QPT_XRC_RECV);
  EXPECT_EQ(o->qp_context, &tag);
  EXPECT_EQ(o->state, IBV_QPS_RESET);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = kPort;
  ASSERT_EQ(ibv_modify_qp(o, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  EXPECT_EQ(o->state, IBV_QPS_INIT);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_INIT);  // the creator's handle sees the same QP
  ASSERT_EQ(ibv_query_qp(o, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(qi.qp_context, &tag);  // each handle answers its own qp_context
  EXPECT_EQ(qi.qp_type, IBV_QPT_XRC_RECV);
  EXPECT_EQ(ibv_close_xrcd(x2), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(o), 0);
  EXPECT_EQ(ibv_close_xrcd(x2), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_close_xrcd(x1), 0);
}

// The QP outlives its creator's handle while an opened one remains, and keeps
// delivering into the SRQs of the domain: here an SRQ of the second context,
// fed by an XRC_SEND QP of the first built with the ibv_wr_* API.
TEST_P(XrcShareTest, QpLivesOnWithItsLastHandleAndDeliversAcrossContexts) {
  ibv_xrcd* x1 = open_xrcd(ctx_, fd_, O_CREAT);
  ibv_xrcd* x2 = open_xrcd(ctx2_, fd_, 0);
  ASSERT_NE(x1, nullptr);
  ASSERT_NE(x2, nullptr);
  ibv_cq* cq2 = ibv_create_cq(ctx2_, 8, nullptr, nullptr, 0);
  ASSERT_NE(cq2, nullptr);
  ibv_srq_init_attr_ex sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD;
  sa.srq_type = IBV_SRQT_XRC;
  sa.xrcd = x2;
  sa.cq = cq2;
  sa.pd = pd2_;
  ibv_srq* srq = ibv_create_srq_ex(ctx2_, &sa);
  ASSERT_NE(srq, nullptr) << std::strerror(errno);
  uint32_t srqn = 0;
  ASSERT_EQ(ibv_get_srq_num(srq, &srqn), 0);
  std::vector<uint8_t> rbuf(256, 0), sbuf(256, 0);
  for (size_t i = 0; i < sbuf.size(); ++i) sbuf[i] = static_cast<uint8_t>(i * 5 + 3);
  ibv_mr* rmr = ibv_reg_mr(pd2_, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* smr = ibv_reg_mr(pd_, sbuf.data(), sbuf.size(), 0);
  ASSERT_NE(rmr, nullptr);
  ASSERT_NE(smr, nullptr);

  ibv_qp* creator = create_recv_qp(ctx_, x1);
  ASSERT_NE(creator, nullptr) << std::strerror(errno);
  const uint32_t tgt = creator->qp_num;
  ibv_qp* o = open_qp(ctx2_, x2, tgt);
  ASSERT_NE(o, nullptr) << std::strerror(errno);
  ASSERT_EQ(ibv_destroy_qp(creator), 0);
  EXPECT_EQ(ibv_close_xrcd(x1), EBUSY);  // the QP still holds its creator's domain handle

  Cq scq = make_cq();
  ibv_qp_init_attr_ex si{};
  si.qp_type = IBV_QPT_XRC_SEND;
  si.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  si.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
  si.pd = pd_;
  si.send_cq = scq.get();
  si.cap.max_send_wr = 4;
  si.cap.max_send_sge = 1;
  ibv_qp* sqp = ibv_create_qp_ex(ctx_, &si);
  ASSERT_NE(sqp, nullptr) << std::strerror(errno);
  ibv_qp_ex* sqx = ibv_qp_to_qp_ex(sqp);
  ASSERT_NE(sqx, nullptr);

  // Connect the opened target and the initiator through the port (loopback).
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = kPort;
  constexpr int kInit = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  ASSERT_EQ(ibv_modify_qp(o, &a, kInit), 0);
  ASSERT_EQ(ibv_modify_qp(sqp, &a, kInit), 0);
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = sqp->qp_num;
  a.rq_psn = 7;
  a.min_rnr_timer = 1;
  a.max_dest_rd_atomic = 1;
  a.ah_attr = loopback_ah_attr();
  constexpr int kRtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  ASSERT_EQ(ibv_modify_qp(o, &a, kRtr | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), 0);
  a.dest_qp_num = tgt;
  ASSERT_EQ(ibv_modify_qp(sqp, &a, kRtr), 0);
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.sq_psn = 7;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  ASSERT_EQ(ibv_modify_qp(sqp, &a,
                          IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                              IBV_QP_MAX_QP_RD_ATOMIC),
            0);
  EXPECT_EQ(o->state, IBV_QPS_RTR);

  ibv_sge rsge{reinterpret_cast<uintptr_t>(rbuf.data()), static_cast<uint32_t>(rbuf.size()), rmr->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = 0x51;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(ibv_post_srq_recv(srq, &rwr, &rbad), 0);

  ibv_wr_start(sqx);
  sqx->wr_id = 0x77;
  sqx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(sqx);
  ibv_wr_set_xrc_srqn(sqx, srqn);
  ibv_wr_set_sge(sqx, smr->lkey, reinterpret_cast<uintptr_t>(sbuf.data()), 200);
  ASSERT_EQ(ibv_wr_complete(sqx), 0);

  std::vector<ibv_wc> sent = poll_completions(scq.get(), 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(sent[0].status);
  EXPECT_EQ(sent[0].wr_id, 0x77u);
  std::vector<ibv_wc> got = poll_completions(cq2, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].wr_id, 0x51u);
  EXPECT_EQ(got[0].byte_len, 200u);
  EXPECT_EQ(got[0].qp_num, tgt);
  for (size_t i = 0; i < 200; ++i) ASSERT_EQ(rbuf[i], sbuf[i]) << i;
  // The first request in RTR established communication, but the QP's events
  // went to its creator's handle, which is gone: nothing reached either context.
  pollfd pfd[2] = {{ctx_->async_fd, POLLIN, 0}, {ctx2_->async_fd, POLLIN, 0}};
  EXPECT_EQ(poll(pfd, 2, 0), 0);

  EXPECT_EQ(ibv_destroy_qp(sqp), 0);
  scq = Cq();
  EXPECT_EQ(ibv_destroy_qp(o), 0);  // the last handle: the QP goes, and its creator's domain handle is free
  EXPECT_EQ(ibv_close_xrcd(x1), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_dereg_mr(rmr), 0);
  EXPECT_EQ(ibv_dereg_mr(smr), 0);
  EXPECT_EQ(ibv_destroy_cq(cq2), 0);
  EXPECT_EQ(ibv_close_xrcd(x2), 0);
}

// ibv_wr_* on XRC, as mlx5 offers it: the RC operations on XRC_SEND, each
// work request needing its SRQ number; nothing on XRC_RECV.
TEST_P(XrcShareTest, WrApiOnXrcSendNeedsTheSrqNumber) {
  Cq scq = make_cq();
  ibv_qp_init_attr_ex si{};
  si.qp_type = IBV_QPT_XRC_SEND;
  si.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  si.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_SEND_WITH_INV |
                      IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                      IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
                      IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;
  si.pd = pd_;
  si.send_cq = scq.get();
  si.cap.max_send_wr = 4;
  si.cap.max_send_sge = 1;
  ibv_qp* sqp = ibv_create_qp_ex(ctx_, &si);
  ASSERT_NE(sqp, nullptr) << std::strerror(errno);
  ibv_qp_ex* sqx = ibv_qp_to_qp_ex(sqp);
  ASSERT_NE(sqx, nullptr);
  ASSERT_EQ(move_to(sqp, IBV_QPS_INIT), 0);
  uint8_t byte = 0;
  // Without the SRQ number the work request is incomplete.
  ibv_wr_start(sqx);
  ibv_wr_send(sqx);
  ibv_wr_set_inline_data(sqx, &byte, 0);
  EXPECT_EQ(ibv_wr_complete(sqx), EINVAL);
  // Twice is refused too.
  ibv_wr_start(sqx);
  ibv_wr_send(sqx);
  ibv_wr_set_xrc_srqn(sqx, 1);
  ibv_wr_set_xrc_srqn(sqx, 2);
  EXPECT_EQ(ibv_wr_complete(sqx), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(sqp), 0);

  // Operations mlx5 has no XRC form of, and any send ops on XRC_RECV.
  si.send_ops_flags = IBV_QP_EX_WITH_TSO;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &si), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_xrcd* x = open_xrcd(ctx_, -1, O_CREAT);
  ASSERT_NE(x, nullptr);
  ibv_qp_init_attr_ex ri{};
  ri.qp_type = IBV_QPT_XRC_RECV;
  ri.comp_mask = IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ri.send_ops_flags = IBV_QP_EX_WITH_SEND;
  ri.xrcd = x;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &ri), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(ibv_close_xrcd(x), 0);

  // An RC QP has no SRQ number to set.
  ibv_qp_init_attr_ex rc{};
  rc.qp_type = IBV_QPT_RC;
  rc.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  rc.send_ops_flags = IBV_QP_EX_WITH_SEND;
  rc.pd = pd_;
  rc.send_cq = rc.recv_cq = scq.get();
  rc.cap.max_send_wr = rc.cap.max_recv_wr = 2;
  rc.cap.max_send_sge = rc.cap.max_recv_sge = 1;
  ibv_qp* rqp = ibv_create_qp_ex(ctx_, &rc);
  ASSERT_NE(rqp, nullptr) << std::strerror(errno);
  ibv_qp_ex* rqx = ibv_qp_to_qp_ex(rqp);
  ibv_wr_start(rqx);
  ibv_wr_send(rqx);
  ibv_wr_set_xrc_srqn(rqx, 1);
  ibv_wr_set_inline_data(rqx, &byte, 0);
  EXPECT_EQ(ibv_wr_complete(rqx), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(rqp), 0);
}

}  // namespace
}  // namespace conformance
