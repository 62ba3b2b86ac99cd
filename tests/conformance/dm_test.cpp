// Device memory (ibv_alloc_dm, ibv_free_dm, ibv_memcpy_to_dm/from_dm,
// ibv_reg_dm_mr): allocation within the budget query_device_ex reports, the
// copy ops' bounds, zero-based regions on it and remote RDMA into it. A device
// reporting max_dm_size 0 must refuse allocation with EOPNOTSUPP; the tests
// that need device memory skip there.
#include <cstring>

#include "datapath.hpp"

namespace conformance {
namespace {

constexpr unsigned kDmAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                               IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED;

// Frees a device memory allocation at scope exit, checking the result.
struct DmOwner {
  ibv_dm* dm = nullptr;
  DmOwner() = default;
  explicit DmOwner(ibv_dm* d) : dm(d) {}
  DmOwner(const DmOwner&) = delete;
  DmOwner& operator=(const DmOwner&) = delete;
  ~DmOwner() { reset(); }
  void reset() {
    if (dm) {
      EXPECT_EQ(ibv_free_dm(dm), 0);
    }
    dm = nullptr;
  }
  ibv_dm* get() const { return dm; }
};

ibv_dm* alloc_dm(ibv_context* ctx, uint64_t length, uint32_t log_align = 0, uint32_t comp_mask = 0) {
  ibv_alloc_dm_attr attr{};
  attr.length = length;
  attr.log_align_req = log_align;
  attr.comp_mask = comp_mask;
  errno = 0;
  return ibv_alloc_dm(ctx, &attr);
}

uint64_t max_dm_size(ibv_context* ctx) {
  ibv_device_attr_ex ex{};
  EXPECT_EQ(ibv_query_device_ex(ctx, nullptr, &ex), 0);
  return ex.max_dm_size;
}

class DmTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure()) return;
    max_ = max_dm_size(ctx_);
    observe("max_dm_size", max_);
    if (max_ == 0) {
      EXPECT_EQ(alloc_dm(ctx_, 64), nullptr);
      EXPECT_EQ(errno, EOPNOTSUPP);
      GTEST_SKIP() << "the device has no device memory";
    }
  }
  uint64_t max_ = 0;
};
CONFORMANCE_INSTANTIATE(DmTest);

TEST_P(DmTest, AllocAndFree) {
  DmOwner dm(alloc_dm(ctx_, 64));
  ASSERT_NE(dm.get(), nullptr) << errno_name(errno);
  EXPECT_EQ(dm.get()->context, ctx_);
  EXPECT_EQ(dm.get()->comp_mask, 0u);
  // A second allocation is another object.
  DmOwner dm2(alloc_dm(ctx_, 128, 7));
  ASSERT_NE(dm2.get(), nullptr) << errno_name(errno);
  EXPECT_NE(dm2.get()->handle, dm.get()->handle);
}

TEST_P(DmTest, LimitsAndErrnos) {
  // Larger than max_dm_size, an unknown comp_mask bit, an alignment beyond
  // the device's: EINVAL, as ConnectX.
  EXPECT_EQ(alloc_dm(ctx_, max_ + 1), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(alloc_dm(ctx_, 64, 0, 1), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(alloc_dm(ctx_, 64, 63), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // The whole budget at once; then nothing is left (ENOMEM) until it is freed.
  DmOwner all(alloc_dm(ctx_, max_));
  ASSERT_NE(all.get(), nullptr) << errno_name(errno);
  EXPECT_EQ(alloc_dm(ctx_, 64), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  all.reset();
  DmOwner again(alloc_dm(ctx_, 64));
  EXPECT_NE(again.get(), nullptr) << errno_name(errno);
}

TEST_P(DmTest, MemcpyRoundTripAndBounds) {
  DmOwner dm(alloc_dm(ctx_, 256));
  ASSERT_NE(dm.get(), nullptr) << errno_name(errno);
  uint8_t in[256], out[256];
  fill_pattern(in, sizeof in, 7);
  EXPECT_EQ(ibv_memcpy_to_dm(dm.get(), 0, in, sizeof in), 0);
  std::memset(out, 0, sizeof out);
  EXPECT_EQ(ibv_memcpy_from_dm(out, dm.get(), 0, sizeof out), 0);
  EXPECT_EQ(std::memcmp(in, out, sizeof in), 0);
  // A part at an offset.
  std::memset(out, 0, sizeof out);
  EXPECT_EQ(ibv_memcpy_from_dm(out, dm.get(), 64, 32), 0);
  EXPECT_EQ(std::memcmp(in + 64, out, 32), 0);
  // Past the end: EFAULT (mlx5); not a multiple of 4 bytes: EINVAL (mlx5).
  EXPECT_EQ(ibv_memcpy_to_dm(dm.get(), 252, in, 8), EFAULT);
  EXPECT_EQ(ibv_memcpy_from_dm(out, dm.get(), 256, 4), EFAULT);
  EXPECT_EQ(ibv_memcpy_from_dm(out, dm.get(), UINT64_MAX - 2, 4), EFAULT);
  EXPECT_EQ(ibv_memcpy_to_dm(dm.get(), 2, in, 4), EINVAL);
  EXPECT_EQ(ibv_memcpy_from_dm(out, dm.get(), 0, 6), EINVAL);
}

TEST_P(DmTest, RegDmMrRulesAndBusyFree) {
  DmOwner dm(alloc_dm(ctx_, 4096));
  ASSERT_NE(dm.get(), nullptr) << errno_name(errno);
  // rdma-core requires zero-based access; flags beyond mlx5's are EINVAL.
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(pd_, dm.get(), 0, 4096, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(pd_, dm.get(), 0, 4096, kDmAccess | IBV_ACCESS_MW_BIND), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // Outside the allocation.
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(pd_, dm.get(), 4096 - 64, 128, kDmAccess), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_mr* mr = ibv_reg_dm_mr(pd_, dm.get(), 1024, 2048, kDmAccess);
  ASSERT_NE(mr, nullptr) << errno_name(errno);
  EXPECT_EQ(mr->addr, nullptr);
  EXPECT_EQ(mr->length, 2048u);
  EXPECT_EQ(mr->pd, pd_);
  // A region still uses it.
  EXPECT_EQ(ibv_free_dm(dm.get()), EBUSY);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

// A peer writes into device memory through the region's rkey, reads it back and
// adds to it atomically; the region's addresses are offsets into its part of
// the DM.
TEST_P(DmTest, RemoteWriteReadAndAtomicOnDm) {
  constexpr size_t kLen = 1024;
  constexpr uint64_t kMrOffset = 512;
  DmOwner dm(alloc_dm(ctx_, 4096));
  ASSERT_NE(dm.get(), nullptr) << errno_name(errno);
  Mr dm_mr(ibv_reg_dm_mr(pd_, dm.get(), kMrOffset, 2048, kDmAccess));
  ASSERT_TRUE(dm_mr) << errno_name(errno);
  Region src, back;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &src));
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &back));
  fill_pattern(src.data(), kLen, 11);
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(PairOptions{}, &p));

  ibv_sge s = src.sge(0, kLen);
  ibv_send_wr w = send_wr(1, IBV_WR_RDMA_WRITE, &s, 1);
  w.wr.rdma.remote_addr = 64;  // zero-based: DM offset kMrOffset + 64
  w.wr.rdma.rkey = dm_mr->rkey;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_RDMA_WRITE, p.a.qpn()));
  std::vector<uint8_t> seen(kLen);
  ASSERT_EQ(ibv_memcpy_from_dm(seen.data(), dm.get(), kMrOffset + 64, kLen), 0);
  EXPECT_EQ(first_pattern_mismatch(seen.data(), kLen, 11), -1);

  ibv_sge b = back.sge(0, kLen);
  ibv_send_wr r = send_wr(2, IBV_WR_RDMA_READ, &b, 1);
  r.wr.rdma.remote_addr = 64;
  r.wr.rdma.rkey = dm_mr->rkey;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &r));
  wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(2, IBV_WC_RDMA_READ, p.a.qpn()).len(kLen));
  EXPECT_EQ(first_pattern_mismatch(back.data(), kLen, 11), -1);

  // Fetch-and-add on the first 8 bytes of the region.
  const uint64_t start = 40;
  ASSERT_EQ(ibv_memcpy_to_dm(dm.get(), kMrOffset, &start, sizeof start), 0);
  ibv_sge f = back.sge(2048, 8);
  ibv_send_wr a = send_wr(3, IBV_WR_ATOMIC_FETCH_AND_ADD, &f, 1);
  a.wr.atomic.remote_addr = 0;
  a.wr.atomic.rkey = dm_mr->rkey;
  a.wr.atomic.compare_add = 2;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &a));
  wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(3, IBV_WC_FETCH_ADD, p.a.qpn()).len(8u));
  uint64_t old = 0, now = 0;
  std::memcpy(&old, back.data() + 2048, 8);
  EXPECT_EQ(old, start);
  ASSERT_EQ(ibv_memcpy_from_dm(&now, dm.get(), kMrOffset, 8), 0);
  EXPECT_EQ(now, start + 2);

  // Beyond the region (not the DM): a remote access error.
  ibv_send_wr bad = send_wr(4, IBV_WR_RDMA_WRITE, &s, 1);
  bad.wr.rdma.remote_addr = 2048 - 8;
  bad.wr.rdma.rkey = dm_mr->rkey;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &bad));
  wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR) << describe(wc[0]);
  p.reset();
}

}  // namespace
}  // namespace conformance
