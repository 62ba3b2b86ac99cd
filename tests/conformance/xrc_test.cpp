// XRC domains and XRC SRQs (ibv_open_xrcd(3), ibv_create_srq_ex(3),
// ibv_get_srq_num): objects, sharing by file and the errnos of refusals.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "conformance.hpp"

namespace conformance {
namespace {

class XrcTest : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    char path[] = "/tmp/sv_xrcd_XXXXXX";
    fd_ = mkstemp(path);
    ASSERT_GE(fd_, 0) << std::strerror(errno);
    path_ = path;
  }
  void TearDown() override {
    if (fd_ >= 0) close(fd_);
    if (!path_.empty()) unlink(path_.c_str());
    VerbsTest::TearDown();
  }

  ibv_xrcd* open_xrcd(int fd, int oflags, uint32_t comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS) {
    ibv_xrcd_init_attr attr{};
    attr.comp_mask = comp_mask;
    attr.fd = fd;
    attr.oflags = oflags;
    errno = 0;
    return ibv_open_xrcd(ctx_, &attr);
  }

  ibv_srq_init_attr_ex xrc_srq_attr(ibv_xrcd* xrcd, ibv_cq* cq) const {
    ibv_srq_init_attr_ex attr{};
    attr.attr.max_wr = 4;
    attr.attr.max_sge = 1;
    attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD;
    attr.srq_type = IBV_SRQT_XRC;
    attr.xrcd = xrcd;
    attr.cq = cq;
    attr.pd = pd_;
    return attr;
  }

  int fd_ = -1;
  std::string path_;
};
CONFORMANCE_INSTANTIATE(XrcTest);

TEST_P(XrcTest, OpenAndCloseAPrivateDomain) {
  ibv_xrcd* a = open_xrcd(-1, 0);
  ASSERT_NE(a, nullptr) << std::strerror(errno);
  ibv_xrcd* b = open_xrcd(-1, O_CREAT);
  ASSERT_NE(b, nullptr) << std::strerror(errno);
  EXPECT_EQ(a->context, ctx_);
  EXPECT_NE(a, b);
  EXPECT_EQ(ibv_close_xrcd(a), 0);
  EXPECT_EQ(ibv_close_xrcd(b), 0);
}

// ibv_open_xrcd(3): O_CREAT makes the file's domain if it has none; without it
// the domain must exist (the kernel answers EAGAIN); O_EXCL refuses an
// existing one (EINVAL).
TEST_P(XrcTest, FileDomainFollowsOflags) {
  ibv_xrcd* none = open_xrcd(fd_, 0);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(errno, EAGAIN);
  ibv_xrcd* first = open_xrcd(fd_, O_CREAT | O_EXCL);
  ASSERT_NE(first, nullptr) << std::strerror(errno);
  ibv_xrcd* excl = open_xrcd(fd_, O_CREAT | O_EXCL);
  EXPECT_EQ(excl, nullptr);
  EXPECT_EQ(errno, EINVAL);
  // A second descriptor of the same file opens the same domain.
  int fd2 = open(path_.c_str(), O_RDONLY);
  ASSERT_GE(fd2, 0);
  ibv_xrcd* second = open_xrcd(fd2, 0);
  ASSERT_NE(second, nullptr) << std::strerror(errno);
  EXPECT_NE(second, first);
  EXPECT_EQ(ibv_close_xrcd(first), 0);
  EXPECT_EQ(ibv_close_xrcd(second), 0);
  // The last close forgets the domain.
  ibv_xrcd* again = open_xrcd(fd2, 0);
  EXPECT_EQ(again, nullptr);
  EXPECT_EQ(errno, EAGAIN);
  close(fd2);
}

TEST_P(XrcTest, OpenRejectsBadAttributes) {
  ibv_xrcd* x = open_xrcd(-1, O_CREAT, IBV_XRCD_INIT_ATTR_FD);
  EXPECT_EQ(x, nullptr);
  EXPECT_EQ(errno, EINVAL);
  x = open_xrcd(-1, O_CREAT, IBV_XRCD_INIT_ATTR_RESERVED | IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS);
  EXPECT_EQ(x, nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  int closed = dup(fd_);
  close(closed);
  x = open_xrcd(closed, O_CREAT);
  EXPECT_EQ(x, nullptr);
  EXPECT_EQ(errno, EBADF);
}

TEST_P(XrcTest, XrcSrqHasANumberAndHoldsItsDomainAndCq) {
  Cq cq = make_cq();
  ibv_xrcd* xrcd = open_xrcd(-1, O_CREAT);
  ASSERT_NE(xrcd, nullptr) << std::strerror(errno);
  ibv_srq_init_attr_ex attr = xrc_srq_attr(xrcd, cq.get());
  ibv_srq* srq = ibv_create_srq_ex(ctx_, &attr);
  ASSERT_NE(srq, nullptr) << std::strerror(errno);
  EXPECT_EQ(srq->context, ctx_);
  EXPECT_EQ(srq->pd, pd_);
  ibv_srq_init_attr_ex attr2 = xrc_srq_attr(xrcd, cq.get());
  ibv_srq* srq2 = ibv_create_srq_ex(ctx_, &attr2);
  ASSERT_NE(srq2, nullptr) << std::strerror(errno);
  uint32_t n1 = 0, n2 = 0;
  ASSERT_EQ(ibv_get_srq_num(srq, &n1), 0);
  ASSERT_EQ(ibv_get_srq_num(srq2, &n2), 0);
  observe("srq_num", n1);
  EXPECT_NE(n1, n2);
  EXPECT_LE(n1, 0xFFFFFFu);
  // The domain and the CQ are in use while the SRQ exists.
  EXPECT_EQ(ibv_close_xrcd(xrcd), EBUSY);
  EXPECT_EQ(ibv_destroy_cq(cq.get()), EBUSY);
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_destroy_srq(srq2), 0);
  EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
}

TEST_P(XrcTest, CreateSrqExRejectsIncompleteXrcAttributes) {
  Cq cq = make_cq();
  ibv_xrcd* xrcd = open_xrcd(-1, O_CREAT);
  ASSERT_NE(xrcd, nullptr) << std::strerror(errno);
  struct Case {
    const char* what;
    uint32_t drop_mask;
  };
  const Case cases[] = {{"no XRCD", IBV_SRQ_INIT_ATTR_XRCD}, {"no CQ", IBV_SRQ_INIT_ATTR_CQ}, {"no PD", IBV_SRQ_INIT_ATTR_PD}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ibv_srq_init_attr_ex attr = xrc_srq_attr(xrcd, cq.get());
    attr.comp_mask &= ~c.drop_mask;
    errno = 0;
    ibv_srq* srq = ibv_create_srq_ex(ctx_, &attr);
    EXPECT_EQ(srq, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (srq) ibv_destroy_srq(srq);
  }
  ibv_srq_init_attr_ex tm = xrc_srq_attr(xrcd, cq.get());
  tm.srq_type = IBV_SRQT_TM;
  errno = 0;
  ibv_srq* srq = ibv_create_srq_ex(ctx_, &tm);
  EXPECT_EQ(srq, nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
}

TEST_P(XrcTest, BasicSrqHasANumberToo) {
  ibv_srq_init_attr attr{};
  attr.attr.max_wr = 4;
  attr.attr.max_sge = 1;
  Srq srq(ibv_create_srq(pd_, &attr));
  ASSERT_TRUE(srq);
  uint32_t n = 0;
  EXPECT_EQ(ibv_get_srq_num(srq.get(), &n), 0);
  EXPECT_NE(n, 0u);
}

// XRC QPs: an XRC_SEND QP on the PD and an XRC_RECV QP on the domain,
// connected to each other through the port itself (loopback), with two XRC
// SRQs each completing into a CQ of its own.
class XrcTrafficTest : public XrcTest {
 protected:
  void SetUp() override {
    XrcTest::SetUp();
    if (HasFatalFailure()) return;
    scq_ = make_cq();
    cqa_ = make_cq();
    cqb_ = make_cq();
    xrcd_ = open_xrcd(fd_, O_CREAT);
    ASSERT_NE(xrcd_, nullptr) << std::strerror(errno);
    ibv_srq_init_attr_ex a = xrc_srq_attr(xrcd_, cqa_.get());
    srqa_ = ibv_create_srq_ex(ctx_, &a);
    ibv_srq_init_attr_ex b = xrc_srq_attr(xrcd_, cqb_.get());
    srqb_ = ibv_create_srq_ex(ctx_, &b);
    ASSERT_NE(srqa_, nullptr);
    ASSERT_NE(srqb_, nullptr);
    ASSERT_EQ(ibv_get_srq_num(srqa_, &srqna_), 0);
    ASSERT_EQ(ibv_get_srq_num(srqb_, &srqnb_), 0);
    buf_.assign(8192, 0);
    mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(),
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(mr_, nullptr);

    ibv_qp_init_attr_ex ri{};
    ri.qp_type = IBV_QPT_XRC_RECV;
    ri.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    ri.xrcd = xrcd_;
    recv_qp_ = ibv_create_qp_ex(ctx_, &ri);
    ASSERT_NE(recv_qp_, nullptr) << std::strerror(errno);
    ibv_qp_init_attr_ex si{};
    si.qp_type = IBV_QPT_XRC_SEND;
    si.comp_mask = IBV_QP_INIT_ATTR_PD;
    si.pd = pd_;
    si.send_cq = scq_.get();
    si.cap.max_send_wr = 8;
    si.cap.max_send_sge = 1;
    send_qp_ = ibv_create_qp_ex(ctx_, &si);
    ASSERT_NE(send_qp_, nullptr) << std::strerror(errno);
    EXPECT_EQ(recv_qp_->pd, nullptr);
    EXPECT_EQ(recv_qp_->qp_type, IBV_QPT_XRC_RECV);
    EXPECT_EQ(send_qp_->pd, pd_);
    connect();
  }

  void TearDown() override {
    if (send_qp_) {
      EXPECT_EQ(ibv_destroy_qp(send_qp_), 0);
    }
    if (recv_qp_) {
      EXPECT_EQ(ibv_destroy_qp(recv_qp_), 0);
    }
    if (srqa_) {
      EXPECT_EQ(ibv_destroy_srq(srqa_), 0);
    }
    if (srqb_) {
      EXPECT_EQ(ibv_destroy_srq(srqb_), 0);
    }
    if (mr_) {
      EXPECT_EQ(ibv_dereg_mr(mr_), 0);
    }
    if (xrcd_) {
      EXPECT_EQ(ibv_close_xrcd(xrcd_), 0);
    }
    scq_ = Cq();
    cqa_ = Cq();
    cqb_ = Cq();
    XrcTest::TearDown();
  }

  // The masks ibv_xsrq_pingpong uses: the target takes no send queue
  // attributes beyond timeout and SQ PSN, the initiator no receive ones.
  void connect() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = kPort;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    ASSERT_EQ(ibv_modify_qp(recv_qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    a.qp_access_flags = 0;
    ASSERT_EQ(ibv_modify_qp(send_qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = send_qp_->qp_num;
    a.rq_psn = 0x100;
    a.min_rnr_timer = 1;
    a.max_dest_rd_atomic = 1;
    a.ah_attr = loopback_ah_attr();
    ASSERT_EQ(ibv_modify_qp(recv_qp_, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    a.dest_qp_num = recv_qp_->qp_num;
    ASSERT_EQ(ibv_modify_qp(send_qp_, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN),
              0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.sq_psn = 0x200;
    ASSERT_EQ(ibv_modify_qp(recv_qp_, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN), 0);
    a.sq_psn = 0x100;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    ASSERT_EQ(ibv_modify_qp(send_qp_, &a,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }

  void post_srq_recv(ibv_srq* srq, uint64_t wr_id, size_t offset, uint32_t len) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data() + offset), len, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
  }

  int post(ibv_wr_opcode op, uint32_t srqn, uint64_t wr_id, size_t offset, uint32_t len, size_t remote_offset = 0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data() + offset), len, mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.qp_type.xrc.remote_srqn = srqn;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf_.data() + remote_offset);
    wr.wr.rdma.rkey = mr_->rkey;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(send_qp_, &wr, &bad);
  }

  Cq scq_, cqa_, cqb_;
  ibv_xrcd* xrcd_ = nullptr;
  ibv_srq* srqa_ = nullptr;
  ibv_srq* srqb_ = nullptr;
  uint32_t srqna_ = 0, srqnb_ = 0;
  std::vector<uint8_t> buf_;
  ibv_mr* mr_ = nullptr;
  ibv_qp* recv_qp_ = nullptr;
  ibv_qp* send_qp_ = nullptr;
};
CONFORMANCE_INSTANTIATE(XrcTrafficTest);

TEST_P(XrcTrafficTest, SendsReachTheSrqTheyName) {
  for (size_t i = 0; i < 3000; ++i) buf_[i] = static_cast<uint8_t>(i * 7 + 1);
  post_srq_recv(srqa_, 0xA, 4096, 2048);
  post_srq_recv(srqb_, 0xB, 6144, 2048);
  // 1500 bytes: two packets at MTU 1024, each with the XRCETH.
  ASSERT_EQ(post(IBV_WR_SEND, srqnb_, 1, 0, 1500), 0);
  ASSERT_EQ(post(IBV_WR_SEND, srqna_, 2, 1500, 100), 0);
  std::vector<ibv_wc> sent = poll_completions(scq_.get(), 2);
  ASSERT_EQ(sent.size(), 2u);
  for (const ibv_wc& wc : sent) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.opcode, IBV_WC_SEND);
    EXPECT_EQ(wc.qp_num, send_qp_->qp_num);
  }
  std::vector<ibv_wc> b = poll_completions(cqb_.get(), 1);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(b[0].wr_id, 0xBu);
  EXPECT_EQ(b[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(b[0].byte_len, 1500u);
  EXPECT_EQ(b[0].qp_num, recv_qp_->qp_num);  // the XRC_RECV QP it arrived on
  std::vector<ibv_wc> a = poll_completions(cqa_.get(), 1);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].wr_id, 0xAu);
  EXPECT_EQ(a[0].byte_len, 100u);
  for (size_t i = 0; i < 1500; ++i) ASSERT_EQ(buf_[6144 + i], buf_[i]) << i;
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(buf_[4096 + i], buf_[1500 + i]) << i;
}

TEST_P(XrcTrafficTest, RdmaWriteGoesThroughTheSrqsPd) {
  for (size_t i = 0; i < 2000; ++i) buf_[i] = static_cast<uint8_t>(i * 3 + 5);
  ASSERT_EQ(post(IBV_WR_RDMA_WRITE, srqna_, 7, 0, 2000, 4096), 0);
  std::vector<ibv_wc> sent = poll_completions(scq_.get(), 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(sent[0].status);
  EXPECT_EQ(sent[0].opcode, IBV_WC_RDMA_WRITE);
  for (size_t i = 0; i < 2000; ++i) ASSERT_EQ(buf_[4096 + i], buf_[i]) << i;
}

// IBTA 9.5: a request naming no XRC SRQ of the target's domain is an invalid
// request: NAK, and the sender's work request fails.
TEST_P(XrcTrafficTest, UnknownSrqNumberIsAnInvalidRequest) {
  ASSERT_EQ(post(IBV_WR_SEND, 0xFFFFF0, 9, 0, 16), 0);
  std::vector<ibv_wc> sent = poll_completions(scq_.get(), 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(sent[0].status);
}

TEST_P(XrcTrafficTest, QueuesTheServiceDoesNotHaveAreRefused) {
  ibv_recv_wr rwr{};
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(ibv_post_recv(send_qp_, &rwr, &rbad), EINVAL);
  EXPECT_EQ(ibv_post_recv(recv_qp_, &rwr, &rbad), EINVAL);
  ibv_send_wr swr{};
  swr.opcode = IBV_WR_SEND;
  ibv_send_wr* sbad = nullptr;
  EXPECT_EQ(ibv_post_send(recv_qp_, &swr, &sbad), EINVAL);
  // The domain is in use by the XRC_RECV QP and the SRQs.
  EXPECT_EQ(ibv_close_xrcd(xrcd_), EBUSY);
}

TEST_P(XrcTest, XrcRecvQpNeedsItsDomain) {
  ibv_qp_init_attr_ex ri{};
  ri.qp_type = IBV_QPT_XRC_RECV;
  ri.comp_mask = IBV_QP_INIT_ATTR_PD;
  ri.pd = pd_;
  errno = 0;
  ibv_qp* qp = ibv_create_qp_ex(ctx_, &ri);
  EXPECT_EQ(qp, nullptr);
  EXPECT_EQ(errno, EINVAL);
  if (qp) ibv_destroy_qp(qp);
}

}  // namespace
}  // namespace conformance
