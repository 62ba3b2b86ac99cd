// On-demand paging: the ODP capabilities ibv_query_device_ex reports, explicit
// and implicit ODP registration (IBV_ACCESS_ON_DEMAND), RDMA through ODP
// regions, ibv_advise_mr, and a remote access to a page that is not mapped,
// which must complete in error. Tests skip where the device reports no ODP.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "datapath.hpp"

namespace conformance {
namespace {

class OdpTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure()) return;
    ibv_device_attr_ex ex{};
    ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
    odp_ = ex.odp_caps;
    observe("odp.general_caps", odp_.general_caps);
    if (!(odp_.general_caps & IBV_ODP_SUPPORT)) GTEST_SKIP() << "the device has no ODP";
  }
  bool implicit() const { return odp_.general_caps & IBV_ODP_SUPPORT_IMPLICIT; }

  // One signalled work request from A, and its completion.
  ibv_wc run(Pair& p, ibv_send_wr& w) {
    post_send_ok(p.a.qp.get(), &w);
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
    return wc.empty() ? ibv_wc{} : wc[0];
  }

  ibv_odp_caps odp_{};
};
CONFORMANCE_INSTANTIATE(OdpTest);

constexpr unsigned kOdpAccess = kAllAccess | IBV_ACCESS_ON_DEMAND;

TEST_P(OdpTest, CapsCoverRcTransfers) {
  observe("odp.rc", odp_.per_transport_caps.rc_odp_caps);
  observe("odp.uc", odp_.per_transport_caps.uc_odp_caps);
  observe("odp.ud", odp_.per_transport_caps.ud_odp_caps);
  const uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
  EXPECT_EQ(odp_.per_transport_caps.rc_odp_caps & rc, rc);
  EXPECT_NE(odp_.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND, 0u);
}

TEST_P(OdpTest, ExplicitRegionTakesRdmaWriteAndRead) {
  Buffer odp_buf(8192), src_buf(8192);
  Mr odp(ibv_reg_mr(pd_, odp_buf.data(), odp_buf.size(), kOdpAccess));
  ASSERT_TRUE(odp) << errno_name(errno);
  EXPECT_EQ(odp->addr, odp_buf.data());
  EXPECT_EQ(odp->length, odp_buf.size());
  Region src;
  ASSERT_NO_FATAL_FAILURE(make_region(8192, kAllAccess, &src));
  fill_pattern(src.data(), 4096, 3);
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(PairOptions{}, &p));
  ibv_sge s = src.sge(0, 4096);
  ibv_send_wr w = send_wr(1, IBV_WR_RDMA_WRITE, &s, 1);
  w.wr.rdma.remote_addr = odp_buf.addr(1024);
  w.wr.rdma.rkey = odp->rkey;
  check_wc(run(p, w), WcExpect(1, IBV_WC_RDMA_WRITE, p.a.qpn()));
  EXPECT_EQ(first_pattern_mismatch(odp_buf.data() + 1024, 4096, 3), -1);
  // Read it back into the ODP region's own first page, through its lkey.
  ibv_sge l{odp_buf.addr(0), 1024, odp->lkey};
  ibv_send_wr r = send_wr(2, IBV_WR_RDMA_READ, &l, 1);
  r.wr.rdma.remote_addr = odp_buf.addr(1024);
  r.wr.rdma.rkey = odp->rkey;
  check_wc(run(p, r), WcExpect(2, IBV_WC_RDMA_READ, p.a.qpn()).len(1024));
  EXPECT_EQ(first_pattern_mismatch(odp_buf.data(), 1024, 3), -1);
  p.reset();
}

// An explicit ODP region needs no mapping at registration: its range is
// faulted in (here: checked) at each access.
TEST_P(OdpTest, UnmappedPageGivesRemoteAccessError) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* base = static_cast<uint8_t*>(m);
  Mr odp(ibv_reg_mr(pd_, base, 3 * page, kOdpAccess));
  ASSERT_TRUE(odp) << errno_name(errno);
  Region src;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &src));
  Pair p, q;
  ASSERT_NO_FATAL_FAILURE(make_pair(PairOptions{}, &p));
  ASSERT_NO_FATAL_FAILURE(make_pair(PairOptions{}, &q));
  // The first page is still mapped and takes the write.
  ibv_sge s = src.sge(0, 64);
  ibv_send_wr ok = send_wr(1, IBV_WR_RDMA_WRITE, &s, 1);
  ok.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(base);
  ok.wr.rdma.rkey = odp->rkey;
  check_wc(run(p, ok), WcExpect(1, IBV_WC_RDMA_WRITE, p.a.qpn()));
  // Unmapped last, so that no later mapping of the test fills the hole.
  ASSERT_EQ(::munmap(base + page, page), 0);
  ibv_send_wr bad = send_wr(2, IBV_WR_RDMA_WRITE, &s, 1);
  bad.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(base + page + 8);
  bad.wr.rdma.rkey = odp->rkey;
  ibv_wc wc = run(p, bad);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << describe(wc);
  // The unmapped page as the local source of a write: a local protection error.
  ibv_sge l{reinterpret_cast<uintptr_t>(base + page), 64, odp->lkey};
  ibv_send_wr local = send_wr(3, IBV_WR_RDMA_WRITE, &l, 1);
  local.wr.rdma.remote_addr = src.addr(0);
  local.wr.rdma.rkey = src.rkey();
  post_send_ok(q.a.qp.get(), &local);
  std::vector<ibv_wc> lw = expect_wcs(q.a.scq.get(), 1);
  ASSERT_EQ(lw.size(), 1u);
  EXPECT_EQ(lw[0].status, IBV_WC_LOC_PROT_ERR) << describe(lw[0]);
  q.reset();
  p.reset();
  odp.reset();
  ::munmap(base, page);
  ::munmap(base + 2 * page, page);
}

TEST_P(OdpTest, ImplicitRegionReachesAnyAddress) {
  if (!implicit()) GTEST_SKIP() << "no implicit ODP";
  Mr all(ibv_reg_mr(pd_, nullptr, SIZE_MAX, kOdpAccess));
  ASSERT_TRUE(all) << errno_name(errno);
  EXPECT_EQ(all->length, SIZE_MAX);
  // Plain, unregistered memory on both sides.
  Buffer src(4096), dst(4096), back(4096);
  fill_pattern(src.data(), 2048, 9);
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(PairOptions{}, &p));
  ibv_sge s{src.addr(0), 2048, all->lkey};
  ibv_send_wr w = send_wr(1, IBV_WR_RDMA_WRITE, &s, 1);
  w.wr.rdma.remote_addr = dst.addr(512);
  w.wr.rdma.rkey = all->rkey;
  check_wc(run(p, w), WcExpect(1, IBV_WC_RDMA_WRITE, p.a.qpn()));
  EXPECT_EQ(first_pattern_mismatch(dst.data() + 512, 2048, 9), -1);
  ibv_sge b{back.addr(0), 2048, all->lkey};
  ibv_send_wr r = send_wr(2, IBV_WR_RDMA_READ, &b, 1);
  r.wr.rdma.remote_addr = dst.addr(512);
  r.wr.rdma.rkey = all->rkey;
  check_wc(run(p, r), WcExpect(2, IBV_WC_RDMA_READ, p.a.qpn()).len(2048));
  EXPECT_EQ(first_pattern_mismatch(back.data(), 2048, 9), -1);
  // An implicit region starts at I/O address 0: another iova is EINVAL.
  errno = 0;
  EXPECT_EQ(ibv_reg_mr_iova(pd_, nullptr, SIZE_MAX, 4096, kOdpAccess), nullptr);
  EXPECT_EQ(errno, EINVAL);
  p.reset();
}

TEST_P(OdpTest, AdviseMr) {
  Buffer buf(8192);
  Mr odp(ibv_reg_mr(pd_, buf.data(), buf.size(), kOdpAccess));
  ASSERT_TRUE(odp) << errno_name(errno);
  Mr ro(ibv_reg_mr(pd_, buf.data(), buf.size(), IBV_ACCESS_ON_DEMAND));
  ASSERT_TRUE(ro) << errno_name(errno);
  Region plain;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &plain));
  ibv_sge s{buf.addr(0), 4096, odp->lkey};
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &s, 1), 0);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &s, 1), 0);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &s, 1), 0);
  // Flags beyond FLUSH, an empty list.
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &s, 1), EOPNOTSUPP);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &s, 0), EINVAL);
  // Not an ODP region, or a write prefetch on a read-only one: ENOENT (the kernel).
  ibv_sge p{plain.addr(0), 64, plain.lkey()};
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &p, 1), ENOENT);
  ibv_sge r{buf.addr(0), 64, ro->lkey};
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &r, 1), ENOENT);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &r, 1), 0);
}

}  // namespace
}  // namespace conformance
