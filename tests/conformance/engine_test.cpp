// Data-path behaviours where an engine may follow the letter of the IBTA or a
// real adapter and applications depend on the adapter's choice: which PD an
// SRQ's receive buffers belong to, what becomes of the receive WQE a failed
// RDMA WRITE with immediate consumed, and the like. The expected outcome is
// ConnectX's (mlx5), or rxe's where both agree.
#include <arpa/inet.h>


#include "datapath.hpp"

namespace conformance {
namespace {

constexpr uint8_t kFill = 0xee;

class EngineTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &src_));
    ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &dst_));
    fill_pattern(src_.data(), src_.size(), 1);
    std::memset(dst_.data(), kFill, dst_.size());
  }
  void TearDown() override {
    src_ = Region{};
    dst_ = Region{};
    DataPathTest::TearDown();
  }

  void post_recvs(ibv_qp* qp, uint64_t first, int n, size_t offset = 0, uint32_t len = 256) {
    for (int i = 0; i < n; ++i) {
      ibv_sge s = dst_.sge(offset + len * static_cast<size_t>(i), len);
      ASSERT_NO_FATAL_FAILURE(post_recv_ok(qp, first + static_cast<uint64_t>(i), &s, 1));
    }
  }

  Region src_;
  Region dst_;
};
CONFORMANCE_INSTANTIATE(EngineTest);

// The receive WQEs of an SRQ are posted to the SRQ, so their lkeys are checked
// against the SRQ's PD, not against the PD of the QP that takes them (IBTA
// 10.2.9: an SRQ has a PD of its own; mlx5 and rxe check the SRQ's).
TEST_P(EngineTest, SrqReceiveBuffersBelongToTheSrqsPd) {
  Pd other(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(other);
  Region landing;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &landing, other.get()));
  std::memset(landing.data(), kFill, landing.size());
  ibv_srq_init_attr sattr{};
  sattr.attr.max_wr = 8;
  sattr.attr.max_sge = 1;
  Srq srq(ibv_create_srq(other.get(), &sattr));
  ASSERT_TRUE(srq) << std::strerror(errno);

  PairOptions o{.type = IBV_QPT_RC};
  Endpoint a, b;
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &a));
  b.scq = make_cq(o.cqe);
  b.rcq = make_cq(o.cqe);
  ASSERT_TRUE(b.scq && b.rcq);
  ibv_qp_init_attr init{};
  init.qp_type = IBV_QPT_RC;
  init.send_cq = b.scq.get();
  init.recv_cq = b.rcq.get();
  init.srq = srq.get();
  init.cap.max_send_wr = 4;
  init.cap.max_send_sge = 1;
  b.qp.reset(ibv_create_qp(pd_, &init));
  ASSERT_TRUE(b.qp) << std::strerror(errno);
  ASSERT_NO_FATAL_FAILURE(connect(a, b.qpn(), o, true));
  ASSERT_NO_FATAL_FAILURE(connect(b, a.qpn(), o, false));

  ibv_sge rs = landing.sge(0, 256);
  ibv_recv_wr rwr{};
  rwr.wr_id = 7;
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_srq_recv(srq.get(), &rwr, &bad), 0);
  fill_pattern(src_.data(), 100, 9);
  ibv_sge s = src_.sge(0, 100);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_SEND, a.qpn()));
  wc = expect_wcs(b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(7, IBV_WC_RECV, b.qpn()).len(100));
  EXPECT_EQ(first_pattern_mismatch(landing.data(), 100, 9), -1);
  a.reset();
  b.reset();
}

// An RDMA WRITE with immediate whose R_Key the responder refuses consumes the
// receive WQE it would have completed: that WQE completes with
// IBV_WC_REM_ACCESS_ERR, the ones behind it are flushed (rxe's responder takes
// the WQE before it checks the R_Key and completes it with that status).
TEST_P(EngineTest, WriteWithImmAndBadRkeyConsumesItsReceiveWqeRc) {
  PairOptions o{.type = IBV_QPT_RC};
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(o, &p));
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 40, 2));
  ibv_sge s = src_.sge(0, 64);
  ibv_send_wr w = send_wr(1, IBV_WR_RDMA_WRITE_WITH_IMM, &s, 1);
  w.imm_data = htonl(0x1234);
  w.wr.rdma.remote_addr = dst_.addr(8192);
  w.wr.rdma.rkey = dst_.rkey() ^ 0x80;  // another key variant: names no region
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(1, IBV_WC_REM_ACCESS_ERR, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  check_wc(wc[0], WcExpect::error(40, IBV_WC_REM_ACCESS_ERR, p.b.qpn()));
  check_wc(wc[1], WcExpect::error(41, IBV_WC_WR_FLUSH_ERR, p.b.qpn()));
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_ERR);
  expect_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_ACCESS_ERR});
  EXPECT_EQ(first_byte_not(dst_.data(), dst_.size(), kFill), -1) << "the target region was modified";
}
}  // namespace
}  // namespace conformance
