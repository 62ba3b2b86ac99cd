// Memory windows (IBTA 10.6.7) on connected RC QPs: allocation, type 1 binding
// through ibv_bind_mw, type 2 binding with IBV_WR_BIND_MW, local and remote
// invalidation (IBV_WR_LOCAL_INV, SEND with Invalidate, IBTA 9.4.1), and remote
// access through a window: its bounds, its rights, the QP a type 2 window is
// bound to. The region behind every window grants no remote access itself, so
// whatever reaches it came through the window. Public API only; on a device
// without IBV_DEVICE_MEM_WINDOW the tests skip.
#include <arpa/inet.h>
#include <unistd.h>

#include "datapath.hpp"

namespace conformance {
namespace {

constexpr size_t kSize = 8192;
constexpr uint8_t kFill = 0xee;
// The region behind the windows: locally writable, windows may be bound to it,
// no remote access of its own.
constexpr unsigned kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
constexpr unsigned kRemoteRw = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
// Where the windows of these tests start in the region, and their length.
constexpr size_t kWinOff = 1024;
constexpr size_t kWinLen = 2048;

class MwTest : public DataPathTest {
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
    for (ibv_mw* mw : mws_) EXPECT_EQ(ibv_dealloc_mw(mw), 0);
    mws_.clear();
    target_ = Region{};
    local_ = Region{};
    DataPathTest::TearDown();
  }

  ibv_mw* alloc(ibv_mw_type type, ibv_pd* pd = nullptr) {
    ibv_mw* mw = ibv_alloc_mw(pd ? pd : pd_, type);
    EXPECT_NE(mw, nullptr) << "ibv_alloc_mw: " << std::strerror(errno);
    if (mw) mws_.push_back(mw);
    return mw;
  }
  void dealloc(ibv_mw* mw) {
    EXPECT_EQ(ibv_dealloc_mw(mw), 0);
    std::erase(mws_, mw);
  }

  // Checks the one completion a bind or invalidation makes on ep's send CQ.
  void expect_local(Endpoint& ep, uint64_t wr_id, ibv_wc_opcode op, ibv_wc_status status) {
    std::vector<ibv_wc> wc = expect_wcs(ep.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    if (status == IBV_WC_SUCCESS) {
      check_wc(wc[0], WcExpect(wr_id, op, ep.qpn()));
    } else {
      check_wc(wc[0], WcExpect::error(wr_id, status, ep.qpn()));
      EXPECT_EQ(query_state(ep.qp.get()), IBV_QPS_ERR);
    }
  }

  // Type 1: ibv_bind_mw on ep's QP, then its completion.
  void bind1(Endpoint& ep, ibv_mw* mw, ibv_mr* mr, uint64_t addr, uint64_t len, unsigned access,
             ibv_wc_status status = IBV_WC_SUCCESS) {
    ibv_mw_bind b{};
    b.wr_id = 500;
    b.send_flags = IBV_SEND_SIGNALED;
    b.bind_info = ibv_mw_bind_info{mr, addr, len, access};
    const uint32_t before = mw->rkey;
    ASSERT_EQ(ibv_bind_mw(ep.qp.get(), mw, &b), 0);
    // The key byte moves on with every bind; the index stays.
    EXPECT_EQ(mw->rkey, ibv_inc_rkey(before));
    ASSERT_NO_FATAL_FAILURE(expect_local(ep, 500, IBV_WC_BIND_MW, status));
  }

  // Type 2: an IBV_WR_BIND_MW work request with the window's next key byte;
  // returns the rkey the window then has.
  uint32_t bind2(Endpoint& ep, ibv_mw* mw, ibv_mr* mr, uint64_t addr, uint64_t len, unsigned access,
                 ibv_wc_status status = IBV_WC_SUCCESS) {
    ibv_send_wr w = send_wr(600, IBV_WR_BIND_MW, nullptr, 0);
    w.bind_mw.mw = mw;
    w.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    w.bind_mw.bind_info = ibv_mw_bind_info{mr, addr, len, access};
    post_send_ok(ep.qp.get(), &w);
    expect_local(ep, 600, IBV_WC_BIND_MW, status);
    return w.bind_mw.rkey;
  }

  void local_inv(Endpoint& ep, uint32_t rkey, ibv_wc_status status = IBV_WC_SUCCESS) {
    ibv_send_wr w = send_wr(700, IBV_WR_LOCAL_INV, nullptr, 0);
    w.invalidate_rkey = rkey;
    post_send_ok(ep.qp.get(), &w);
    expect_local(ep, 700, IBV_WC_LOCAL_INV, status);
  }

  // A's RDMA WRITE or READ of len bytes at (rkey, va) of B's side: its status.
  // A successful WRITE placed the pattern at target_ offset `at`; a READ
  // brought target_'s bytes at `at` into local_.
  ibv_wc_status rdma(Pair& p, ibv_wr_opcode op, uint32_t rkey, uint64_t va, uint32_t len, size_t at, uint32_t seed) {
    fill_pattern(local_.data(), len, seed);
    if (op == IBV_WR_RDMA_READ) fill_pattern(target_.data() + at, len, seed + 1);
    ibv_sge s = local_.sge(0, len);
    ibv_send_wr w = send_wr(800, op, &s, 1);
    w.wr.rdma.rkey = rkey;
    w.wr.rdma.remote_addr = va;
    post_send_ok(p.a.qp.get(), &w);
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
    if (wc.size() != 1) return IBV_WC_GENERAL_ERR;
    if (wc[0].status == IBV_WC_SUCCESS) {
      check_wc(wc[0], WcExpect(800, op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE, p.a.qpn()));
      if (op == IBV_WR_RDMA_READ) {
        EXPECT_EQ(first_pattern_mismatch(local_.data(), len, seed + 1), -1);
        std::memset(target_.data() + at, kFill, len);
      } else {
        EXPECT_EQ(first_pattern_mismatch(target_.data() + at, len, seed), -1);
        EXPECT_EQ(first_byte_not(target_.data(), at, kFill), -1) << "written before the window's range";
        EXPECT_EQ(first_byte_not(target_.data() + at + len, kSize - at - len, kFill), -1) << "written after it";
        std::memset(target_.data() + at, kFill, len);
      }
    } else {
      check_wc(wc[0], WcExpect::error(800, wc[0].status, p.a.qpn()));
    }
    return wc[0].status;
  }

  // A remote access that must be refused: A's REM_ACCESS_ERR, both QPs in
  // error, B's memory untouched.
  void expect_refused(Pair& p, ibv_wr_opcode op, uint32_t rkey, uint64_t va, uint32_t len) {
    ibv_sge s = local_.sge(0, len);
    ibv_send_wr w = send_wr(801, op, &s, 1);
    w.wr.rdma.rkey = rkey;
    w.wr.rdma.remote_addr = va;
    post_send_ok(p.a.qp.get(), &w);
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    check_wc(wc[0], WcExpect::error(801, IBV_WC_REM_ACCESS_ERR, p.a.qpn()));
    EXPECT_EQ(first_byte_not(target_.data(), kSize, kFill), -1) << "a refused access changed memory";
    EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_ERR);
    allow_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_ACCESS_ERR});
  }

  uint64_t win_va(size_t off = 0) const { return target_.addr(kWinOff + off); }

  Region target_;  // B's side: the region behind the windows
  Region local_;   // A's side
  std::vector<ibv_mw*> mws_;
};

// ---- allocation and capabilities -------------------------------------------

TEST_P(MwTest, CapabilitiesAndAllocation) {
  EXPECT_GT(dattr_.max_mw, 0);
  observe("max_mw", dattr_.max_mw);
  observe("type_2b", (dattr_.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) ? "yes" : "no");
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  EXPECT_TRUE(ex.device_cap_flags_ex & IBV_DEVICE_MEM_WINDOW);
  ibv_mw* a = alloc(IBV_MW_TYPE_1);
  ibv_mw* b = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->type, IBV_MW_TYPE_1);
  EXPECT_EQ(b->type, IBV_MW_TYPE_2);
  EXPECT_EQ(a->pd, pd_);
  EXPECT_EQ(b->context, ctx_);
  EXPECT_NE(a->rkey >> 8, b->rkey >> 8) << "two windows share a key index";
  EXPECT_NE(a->rkey >> 8, target_.rkey() >> 8) << "a window shares a region's key index";
  errno = 0;
  EXPECT_EQ(ibv_alloc_mw(pd_, static_cast<ibv_mw_type>(3)), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // A PD with a window cannot go.
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  ibv_mw* c = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_dealloc_mw(c), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// ---- type 1 ------------------------------------------------------------------

TEST_P(MwTest, Type1BindGrantsWriteAndReadWithinTheWindow) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_1);
  ASSERT_TRUE(mw);
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw));
  EXPECT_EQ(rdma(p, IBV_WR_RDMA_WRITE, mw->rkey, win_va(), kWinLen, kWinOff, 1), IBV_WC_SUCCESS);
  EXPECT_EQ(rdma(p, IBV_WR_RDMA_WRITE, mw->rkey, win_va(100), 300, kWinOff + 100, 2), IBV_WC_SUCCESS);
  EXPECT_EQ(rdma(p, IBV_WR_RDMA_READ, mw->rkey, win_va(kWinLen - 64), 64, kWinOff + kWinLen - 64, 3),
            IBV_WC_SUCCESS);
  // The region's own rkey grants nothing remotely.
  expect_refused(p, IBV_WR_RDMA_WRITE, target_.rkey(), win_va(), 16);
}

TEST_P(MwTest, Type1AccessPastTheEndIsRefused) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_1);
  ASSERT_TRUE(mw);
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw));
  expect_refused(p, IBV_WR_RDMA_WRITE, mw->rkey, win_va(kWinLen - 8), 16);
}

TEST_P(MwTest, Type1AccessBeforeTheStartIsRefused) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_1);
  ASSERT_TRUE(mw);
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw));
  expect_refused(p, IBV_WR_RDMA_READ, mw->rkey, win_va() - 8, 16);
}

TEST_P(MwTest, Type1RightsAreTheWindowsOwn) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_1);
  ASSERT_TRUE(mw);
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, target_.mr.get(), win_va(), kWinLen, IBV_ACCESS_REMOTE_READ));
  EXPECT_EQ(rdma(p, IBV_WR_RDMA_READ, mw->rkey, win_va(), 128, kWinOff, 4), IBV_WC_SUCCESS);
  expect_refused(p, IBV_WR_RDMA_WRITE, mw->rkey, win_va(), 16);
}

TEST_P(MwTest, Type1RebindRetiresTheOldRkeyAndUnbindEndsAccess) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_1);
  ASSERT_TRUE(mw);
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw));
  const uint32_t first = mw->rkey;
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, target_.mr.get(), target_.addr(), 512, kRemoteRw));
  EXPECT_NE(mw->rkey, first);
  EXPECT_EQ(rdma(p, IBV_WR_RDMA_WRITE, mw->rkey, target_.addr(), 512, 0, 5), IBV_WC_SUCCESS);
  // Unbinding: no region, no length. The window keeps its index but grants nothing.
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, nullptr, 0, 0, 0));
  expect_refused(p, IBV_WR_RDMA_WRITE, mw->rkey, target_.addr(), 16);
}

TEST_P(MwTest, Type1StaleRkeyIsRefused) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_1);
  ASSERT_TRUE(mw);
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw));
  const uint32_t first = mw->rkey;
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw));
  expect_refused(p, IBV_WR_RDMA_WRITE, first, win_va(), 16);
}

TEST_P(MwTest, BindVerbArgumentChecks) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Qp ud = make_qp(IBV_QPT_UD, cq.get());
  ASSERT_TRUE(ud);
  ASSERT_EQ(move_to(ud.get(), IBV_QPS_RTS), 0);
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* t1 = alloc(IBV_MW_TYPE_1);
  ibv_mw* t2 = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(t1 && t2);
  ibv_mw_bind b{};
  b.send_flags = IBV_SEND_SIGNALED;
  b.bind_info = ibv_mw_bind_info{target_.mr.get(), win_va(), kWinLen, kRemoteRw};
  // ibv_bind_mw is for type 1 windows; a type 2 window is bound by a work request.
  EXPECT_EQ(ibv_bind_mw(p.b.qp.get(), t2, &b), EINVAL);
  // A type 1 window is never zero-based (o10-36.2.2).
  b.bind_info.mw_access_flags = kRemoteRw | IBV_ACCESS_ZERO_BASED;
  EXPECT_EQ(ibv_bind_mw(p.b.qp.get(), t1, &b), EINVAL);
  b.bind_info.mw_access_flags = kRemoteRw;
  // No region but a range.
  b.bind_info.mr = nullptr;
  EXPECT_EQ(ibv_bind_mw(p.b.qp.get(), t1, &b), EINVAL);
  // A UD QP binds nothing.
  b.bind_info.mr = target_.mr.get();
  EXPECT_EQ(ibv_bind_mw(ud.get(), t1, &b), EINVAL);
  // A work request cannot bind a type 1 window.
  ibv_send_wr w = send_wr(1, IBV_WR_BIND_MW, nullptr, 0);
  w.bind_mw.mw = t1;
  w.bind_mw.rkey = ibv_inc_rkey(t1->rkey);
  w.bind_mw.bind_info = b.bind_info;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(p.b.qp.get(), &w, &bad), EINVAL);
  EXPECT_EQ(bad, &w);
  expect_no_wc(p.b.scq.get());
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_RTS);
}

// ---- bind errors (IBTA 10.6.7.2): IBV_WC_MW_BIND_ERR, QP in error ----------

TEST_P(MwTest, BindToRegionWithoutMwBindFails) {
  Region plain;
  ASSERT_NO_FATAL_FAILURE(make_region(kSize, kAllAccess, &plain));
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_1);
  ASSERT_TRUE(mw);
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, plain.mr.get(), plain.addr(), 64, kRemoteRw, IBV_WC_MW_BIND_ERR));
}

TEST_P(MwTest, BindOutsideTheRegionFails) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  bind2(p.b, mw, target_.mr.get(), target_.addr(kSize - 64), 128, kRemoteRw, IBV_WC_MW_BIND_ERR);
}

TEST_P(MwTest, WritableWindowOnReadOnlyRegionFails) {
  Region ro;
  ASSERT_NO_FATAL_FAILURE(make_region(kSize, IBV_ACCESS_MW_BIND, &ro));
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_1);
  ASSERT_TRUE(mw);
  // C10-74: remote write needs a locally writable region.
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, ro.mr.get(), ro.addr(), 64, kRemoteRw, IBV_WC_MW_BIND_ERR));
}

TEST_P(MwTest, Type2BoundByQpOfAnotherPdFails) {
  ibv_pd* other = ibv_alloc_pd(ctx_);
  ASSERT_NE(other, nullptr);
  {
    Region r;
    ASSERT_NO_FATAL_FAILURE(make_region(kSize, kMrAccess, &r, other));
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
    ibv_mw* mw = alloc(IBV_MW_TYPE_2, other);
    ASSERT_TRUE(mw);
    bind2(p.b, mw, r.mr.get(), r.addr(), 64, kRemoteRw, IBV_WC_MW_BIND_ERR);  // C10-72
    dealloc(mw);
  }
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

TEST_P(MwTest, Type2BindOfABoundWindowFails) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  const uint32_t rkey = bind2(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw);
  // o10-37.2.30: only a free window is bound.
  ibv_send_wr w = send_wr(601, IBV_WR_BIND_MW, nullptr, 0);
  w.bind_mw.mw = mw;
  w.bind_mw.rkey = ibv_inc_rkey(rkey);
  w.bind_mw.bind_info = ibv_mw_bind_info{target_.mr.get(), win_va(), 64, kRemoteRw};
  post_send_ok(p.b.qp.get(), &w);
  expect_local(p.b, 601, IBV_WC_BIND_MW, IBV_WC_MW_BIND_ERR);
}

// ---- type 2 ------------------------------------------------------------------

TEST_P(MwTest, Type2BindsWithTheConsumersKeyByte) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  const uint32_t rkey = bind2(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw | IBV_ACCESS_REMOTE_ATOMIC);
  EXPECT_EQ(rkey >> 8, mw->rkey >> 8);
  EXPECT_EQ(rdma(p, IBV_WR_RDMA_WRITE, rkey, win_va(8), 1000, kWinOff + 8, 6), IBV_WC_SUCCESS);
  EXPECT_EQ(rdma(p, IBV_WR_RDMA_READ, rkey, win_va(), 256, kWinOff, 7), IBV_WC_SUCCESS);
  // An atomic through the window.
  uint64_t v = 40;
  std::memcpy(target_.data() + kWinOff + 64, &v, 8);
  ibv_sge s = local_.sge(0, 8);
  ibv_send_wr w = send_wr(900, IBV_WR_ATOMIC_FETCH_AND_ADD, &s, 1);
  w.wr.atomic.remote_addr = win_va(64);
  w.wr.atomic.rkey = rkey;
  w.wr.atomic.compare_add = 2;
  post_send_ok(p.a.qp.get(), &w);
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(900, IBV_WC_FETCH_ADD, p.a.qpn()).len(8));
  uint64_t orig = 0, now = 0;
  std::memcpy(&orig, local_.data(), 8);
  std::memcpy(&now, target_.data() + kWinOff + 64, 8);
  EXPECT_EQ(orig, 40u);
  EXPECT_EQ(now, 42u);
}

// Windows are bound on UC QPs too, and RDMA WRITEs reach memory through them.
TEST_P(MwTest, Type2BindAndWriteOnUc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_UC}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  const uint32_t rkey = bind2(p.b, mw, target_.mr.get(), win_va(), kWinLen, IBV_ACCESS_REMOTE_WRITE);
  fill_pattern(local_.data(), 700, 17);
  ibv_sge s = local_.sge(0, 700);
  ibv_send_wr w = send_wr(18, IBV_WR_RDMA_WRITE, &s, 1);
  w.wr.rdma.rkey = rkey;
  w.wr.rdma.remote_addr = win_va(32);
  post_send_ok(p.a.qp.get(), &w);
  // A UC write completes when sent: a SEND behind it, received, says it has landed.
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 19, nullptr, 0));
  ibv_send_wr sync = send_wr(20, IBV_WR_SEND, nullptr, 0);
  post_send_ok(p.a.qp.get(), &sync);
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  check_wc(wc[0], WcExpect(18, IBV_WC_RDMA_WRITE, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(19, IBV_WC_RECV, p.b.qpn()).len(0));
  EXPECT_EQ(first_pattern_mismatch(target_.data() + kWinOff + 32, 700, 17), -1);
  EXPECT_EQ(first_byte_not(target_.data(), kWinOff + 32, kFill), -1);
  EXPECT_EQ(first_byte_not(target_.data() + kWinOff + 732, kSize - kWinOff - 732, kFill), -1);
  ASSERT_NO_FATAL_FAILURE(local_inv(p.b, rkey));
}

TEST_P(MwTest, Type2AccessPastTheEndIsRefused) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  const uint32_t rkey = bind2(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw);
  expect_refused(p, IBV_WR_RDMA_READ, rkey, win_va(kWinLen - 4), 8);
}

// Type 2B: the window works only through the QP that bound it.
TEST_P(MwTest, Type2IsBoundToItsQp) {
  if (!(dattr_.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B)) GTEST_SKIP() << "no type 2B windows";
  Pair bound, other;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &bound));
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &other));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  const uint32_t rkey = bind2(bound.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw);
  expect_refused(other, IBV_WR_RDMA_WRITE, rkey, win_va(), 16);
  EXPECT_EQ(rdma(bound, IBV_WR_RDMA_WRITE, rkey, win_va(), 16, kWinOff, 8), IBV_WC_SUCCESS);
}

TEST_P(MwTest, Type2ZeroBasedWindowIsAddressedFromZero) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  const uint32_t rkey = bind2(p.b, mw, target_.mr.get(), win_va(), 256, kRemoteRw | IBV_ACCESS_ZERO_BASED);
  observe("zero_based", "bound");
  EXPECT_EQ(rdma(p, IBV_WR_RDMA_WRITE, rkey, 16, 64, kWinOff + 16, 9), IBV_WC_SUCCESS);
  expect_refused(p, IBV_WR_RDMA_WRITE, rkey, 250, 16);
}

TEST_P(MwTest, LocalInvalidateFreesAType2Window) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  uint32_t rkey = bind2(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw);
  ASSERT_NO_FATAL_FAILURE(local_inv(p.b, rkey));
  // Free again: it binds anew, with another key byte.
  mw->rkey = rkey;
  const uint32_t next = bind2(p.b, mw, target_.mr.get(), win_va(), 64, kRemoteRw);
  EXPECT_NE(next, rkey);
  EXPECT_EQ(rdma(p, IBV_WR_RDMA_WRITE, next, win_va(), 64, kWinOff, 10), IBV_WC_SUCCESS);
  ASSERT_NO_FATAL_FAILURE(local_inv(p.b, next));
  expect_refused(p, IBV_WR_RDMA_WRITE, next, win_va(), 16);
}

TEST_P(MwTest, LocalInvalidateOfAType1WindowFails) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_1);
  ASSERT_TRUE(mw);
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw));
  ASSERT_NO_FATAL_FAILURE(local_inv(p.b, mw->rkey, IBV_WC_LOC_QP_OP_ERR));  // o10-37.2.26
}

TEST_P(MwTest, LocalInvalidateWithAStaleKeyByteFails) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  const uint32_t rkey = bind2(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw);
  ASSERT_NO_FATAL_FAILURE(local_inv(p.b, ibv_inc_rkey(rkey), IBV_WC_LOC_QP_OP_ERR));
}

TEST_P(MwTest, LocalInvalidateOfARegionFails) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ASSERT_NO_FATAL_FAILURE(local_inv(p.b, target_.rkey(), IBV_WC_LOC_QP_OP_ERR));
}

TEST_P(MwTest, SendWithInvalidateFreesTheWindow) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  const uint32_t rkey = bind2(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw);
  Region rx;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &rx));
  ibv_sge rs = rx.sge(0, 4096);
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 11, &rs, 1));
  fill_pattern(local_.data(), 1500, 12);
  ibv_sge ss = local_.sge(0, 1500);  // more than one packet at every MTU
  ibv_send_wr w = send_wr(12, IBV_WR_SEND_WITH_INV, &ss, 1);
  w.invalidate_rkey = rkey;
  post_send_ok(p.a.qp.get(), &w);
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(12, IBV_WC_SEND, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(11, IBV_WC_RECV, p.b.qpn()).len(1500).flags(IBV_WC_WITH_INV));
  EXPECT_EQ(wc[0].invalidated_rkey, rkey);
  EXPECT_EQ(first_pattern_mismatch(rx.data(), 1500, 12), -1);
  // The window is free: nothing reaches memory through it.
  expect_refused(p, IBV_WR_RDMA_WRITE, rkey, win_va(), 16);
}

TEST_P(MwTest, SendWithInvalidateOfAStaleRkeyIsAnInvalidRequest) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  const uint32_t rkey = bind2(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw);
  ibv_sge rs = local_.sge(4096, 256);
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 13, &rs, 1));
  ibv_sge ss = local_.sge(0, 16);
  ibv_send_wr w = send_wr(14, IBV_WR_SEND_WITH_INV, &ss, 1);
  w.invalidate_rkey = ibv_inc_rkey(rkey);
  post_send_ok(p.a.qp.get(), &w);
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(14, IBV_WC_REM_INV_REQ_ERR, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_NE(wc[0].status, IBV_WC_SUCCESS);
  allow_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR});
}

// The invalidated rkey through the extended CQ (ibv_wc_read_invalidated_rkey).
TEST_P(MwTest, InvalidatedRkeyThroughTheExtendedCq) {
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 16;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* rcq = ibv_create_cq_ex(ctx_, &ca);
  ASSERT_NE(rcq, nullptr);
  PairOptions o;
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &p.a));
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &p.b));
  {
    // B again, receiving into the extended CQ.
    ibv_qp_init_attr init = qp_init_attr(IBV_QPT_RC, p.b.scq.get());
    init.recv_cq = ibv_cq_ex_to_cq(rcq);
    p.b.qp.reset(ibv_create_qp(pd_, &init));
    ASSERT_TRUE(p.b.qp);
  }
  ASSERT_NO_FATAL_FAILURE(connect(p.a, p.b.qpn(), o, true));
  ASSERT_NO_FATAL_FAILURE(connect(p.b, p.a.qpn(), o, false));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  const uint32_t rkey = bind2(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw);
  ibv_sge rs = local_.sge(4096, 256);
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 15, &rs, 1));
  ibv_sge ss = local_.sge(0, 32);
  ibv_send_wr w = send_wr(16, IBV_WR_SEND_WITH_INV, &ss, 1);
  w.invalidate_rkey = rkey;
  post_send_ok(p.a.qp.get(), &w);
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  ibv_poll_cq_attr pa{};
  int rc = ENOENT;
  for (int i = 0; i < 5000 && rc == ENOENT; ++i) {
    rc = ibv_start_poll(rcq, &pa);
    if (rc == ENOENT) usleep(1000);
  }
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(rcq->status, IBV_WC_SUCCESS);
  EXPECT_EQ(rcq->wr_id, 15u);
  EXPECT_EQ(ibv_wc_read_opcode(rcq), IBV_WC_RECV);
  EXPECT_TRUE(ibv_wc_read_wc_flags(rcq) & IBV_WC_WITH_INV);
  EXPECT_EQ(ibv_wc_read_invalidated_rkey(rcq), rkey);
  ibv_end_poll(rcq);
  p.b.qp.reset();
  p.reset();
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(rcq)), 0);
}

// ---- lifetime ------------------------------------------------------------------

TEST_P(MwTest, RegionWithBoundWindowsStaysUntilTheyGo) {
  Region r;
  ASSERT_NO_FATAL_FAILURE(make_region(kSize, kMrAccess, &r));
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_2);
  ASSERT_TRUE(mw);
  bind2(p.b, mw, r.mr.get(), r.addr(), 64, kRemoteRw);
  const int rc = ibv_dereg_mr(r.mr.get());
  observe("ibv_dereg_mr.bound", errno_name(rc));
  EXPECT_NE(rc, 0) << "a region with a bound window was deregistered";
  // A bound window may be deallocated; the region then goes.
  dealloc(mw);
  EXPECT_EQ(ibv_dereg_mr(r.mr.release()), 0);
}

TEST_P(MwTest, DeallocatedWindowGrantsNothing) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({}, &p));
  ibv_mw* mw = alloc(IBV_MW_TYPE_1);
  ASSERT_TRUE(mw);
  ASSERT_NO_FATAL_FAILURE(bind1(p.b, mw, target_.mr.get(), win_va(), kWinLen, kRemoteRw));
  const uint32_t rkey = mw->rkey;
  dealloc(mw);
  expect_refused(p, IBV_WR_RDMA_WRITE, rkey, win_va(), 16);
}

CONFORMANCE_INSTANTIATE(MwTest);

}  // namespace
}  // namespace conformance
