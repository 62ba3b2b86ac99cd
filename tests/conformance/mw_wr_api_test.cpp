// Memory windows through the extended post API (ibv_wr_bind_mw, ibv_wr_local_inv,
// ibv_wr_send_inv; man page ibv_wr_post(3)) on RC QPs created with the matching
// IBV_QP_EX_WITH_* operations: a type 2 window bound by ibv_wr_bind_mw lets the
// peer's RDMA WRITE in, ibv_wr_local_inv closes it (IBTA 10.6.7.2.3), and a
// re-bound window is closed by the peer's SEND with Invalidate (IBTA 9.4.1),
// whose receive completion names the rkey. Public API only; on a device without
// IBV_DEVICE_MEM_WINDOW the test skips.
#include <cstring>

#include "datapath.hpp"

namespace conformance {
namespace {

constexpr size_t kSize = 8192;
constexpr uint8_t kFill = 0xee;
// The region behind the window grants no remote access of its own: whatever
// reaches it came through the window.
constexpr unsigned kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
constexpr size_t kWinOff = 1024;
constexpr size_t kWinLen = 2048;
constexpr uint64_t kOps = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV |
                          IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND;

class MwWrApiTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure()) return;
    if (!(dattr_.device_cap_flags & IBV_DEVICE_MEM_WINDOW)) GTEST_SKIP() << "no memory windows";
    ASSERT_NO_FATAL_FAILURE(make_region(kSize, kMrAccess, &target_));
    ASSERT_NO_FATAL_FAILURE(make_region(kSize, kAllAccess, &local_));
    std::memset(target_.data(), kFill, kSize);
  }
  void TearDown() override {
    if (mw_) {
      EXPECT_EQ(ibv_dealloc_mw(mw_), 0);
    }
    mw_ = nullptr;
    target_ = Region{};
    local_ = Region{};
    DataPathTest::TearDown();
  }

  void make(Pair* p) {
    PairOptions o;
    o.extended = true;
    o.send_ops_flags = kOps;
    ASSERT_NO_FATAL_FAILURE(make_pair(o, p));
    ASSERT_NE(p->a.qpx, nullptr);
    ASSERT_NE(p->b.qpx, nullptr);
  }

  // One signaled completion on ep's send CQ.
  void expect_local(Endpoint& ep, uint64_t wr_id, ibv_wc_opcode op) {
    std::vector<ibv_wc> wc = expect_wcs(ep.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    check_wc(wc[0], WcExpect(wr_id, op, ep.qpn()));
  }

  // B binds the window over [kWinOff, kWinOff + kWinLen) of target_ with the
  // given rkey, remote write only.
  void bind(Endpoint& b, uint32_t rkey) {
    ibv_wr_start(b.qpx);
    b.qpx->wr_id = 10;
    b.qpx->wr_flags = IBV_SEND_SIGNALED;
    const ibv_mw_bind_info info{target_.mr.get(), target_.addr(kWinOff), kWinLen, IBV_ACCESS_REMOTE_WRITE};
    ibv_wr_bind_mw(b.qpx, mw_, rkey, &info);
    ASSERT_EQ(ibv_wr_complete(b.qpx), 0);
    expect_local(b, 10, IBV_WC_BIND_MW);
  }

  // A writes len pattern bytes at offset `off` of the window: A's status.
  ibv_wc_status write(Pair& p, uint32_t rkey, size_t off, uint32_t len, uint32_t seed) {
    fill_pattern(local_.data(), len, seed);
    ibv_wr_start(p.a.qpx);
    p.a.qpx->wr_id = 20;
    p.a.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(p.a.qpx, rkey, target_.addr(kWinOff + off));
    ibv_wr_set_sge(p.a.qpx, local_.lkey(), local_.addr(), len);
    EXPECT_EQ(ibv_wr_complete(p.a.qpx), 0);
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
    if (wc.size() != 1) return IBV_WC_GENERAL_ERR;
    if (wc[0].status == IBV_WC_SUCCESS) {
      check_wc(wc[0], WcExpect(20, IBV_WC_RDMA_WRITE, p.a.qpn()));
      EXPECT_EQ(first_pattern_mismatch(target_.data() + kWinOff + off, len, seed), -1);
      std::memset(target_.data() + kWinOff + off, kFill, len);
    } else {
      check_wc(wc[0], WcExpect::error(20, wc[0].status, p.a.qpn()));
    }
    return wc[0].status;
  }

  // A's write through a closed window: REM_ACCESS_ERR, memory untouched, B's
  // QP in error.
  void expect_refused(Pair& p, uint32_t rkey) {
    EXPECT_EQ(write(p, rkey, 0, 64, 99), IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(first_byte_not(target_.data(), kSize, kFill), -1) << "a refused write changed memory";
    EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_ERR);
    allow_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_ACCESS_ERR});
  }

  Region target_;  // B's side: the region behind the window
  Region local_;   // A's side
  ibv_mw* mw_ = nullptr;
};
CONFORMANCE_INSTANTIATE(MwWrApiTest);

TEST_P(MwWrApiTest, BindInvalidateLocallyRebindInvalidateRemotely) {
  mw_ = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
  ASSERT_NE(mw_, nullptr) << std::strerror(errno);

  // Bind, write through the window, invalidate locally: the window is closed.
  const uint32_t rkey1 = ibv_inc_rkey(mw_->rkey);
  {
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make(&p));
    ASSERT_NO_FATAL_FAILURE(bind(p.b, rkey1));
    EXPECT_EQ(write(p, rkey1, 0, kWinLen, 1), IBV_WC_SUCCESS);
    EXPECT_EQ(write(p, rkey1, 100, 300, 2), IBV_WC_SUCCESS);
    ibv_wr_start(p.b.qpx);
    p.b.qpx->wr_id = 30;
    p.b.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_local_inv(p.b.qpx, rkey1);
    ASSERT_EQ(ibv_wr_complete(p.b.qpx), 0);
    ASSERT_NO_FATAL_FAILURE(expect_local(p.b, 30, IBV_WC_LOCAL_INV));
    ASSERT_NO_FATAL_FAILURE(expect_refused(p, rkey1));
  }

  // The refused write left that pair in error: the window, free again, is
  // re-bound by a new pair's QP with the next key byte.
  const uint32_t rkey2 = ibv_inc_rkey(rkey1);
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make(&p));
  {
    // A bind is posted in user space and reads no object number (no command
    // names the window), so a garbled `handle` does not stop it.
    const uint32_t saved = mw_->handle;
    mw_->handle = 0x7ffffff0u;
    bind(p.b, rkey2);
    mw_->handle = saved;
    ASSERT_FALSE(HasFatalFailure());
  }
  // The new key byte names the window.
  EXPECT_EQ(write(p, rkey2, 0, 512, 3), IBV_WC_SUCCESS);

  // A's SEND with Invalidate closes it from the peer's side.
  Buffer rx(256);
  Mr rx_mr(ibv_reg_mr(pd_, rx.data(), rx.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(rx_mr) << std::strerror(errno);
  const ibv_sge rs{rx.addr(), 256, rx_mr->lkey};
  post_recv_ok(p.b.qp.get(), 40, &rs, 1);
  fill_pattern(local_.data(), 200, 4);
  ibv_wr_start(p.a.qpx);
  p.a.qpx->wr_id = 41;
  p.a.qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_inv(p.a.qpx, rkey2);
  ibv_wr_set_sge(p.a.qpx, local_.lkey(), local_.addr(), 200);
  ASSERT_EQ(ibv_wr_complete(p.a.qpx), 0);
  ASSERT_NO_FATAL_FAILURE(expect_local(p.a, 41, IBV_WC_SEND));
  std::vector<ibv_wc> wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(40, IBV_WC_RECV, p.b.qpn()).len(200).flags(IBV_WC_WITH_INV));
  EXPECT_EQ(wc[0].invalidated_rkey, rkey2);
  EXPECT_EQ(first_pattern_mismatch(rx.data(), 200, 4), -1);
  ASSERT_NO_FATAL_FAILURE(expect_refused(p, rkey2));
}

}  // namespace
}  // namespace conformance
