// The memory window bookkeeping of emu/memory/window.hpp on one emulated device:
// rkeys (key index and key byte), the binding rules, invalidation, and what an
// rkey resolves to on remote access, checked below the transport.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <mutex>
#include <vector>

#include "emu/memory/sge.hpp"
#include "emu/memory/window.hpp"
#include "emu/objects/objects.hpp"
#include "emu/provider.hpp"
#include "tests/unit/qp_harness.hpp"

namespace softverbs::emu {
namespace {

static_assert(window_rkey(0x123456, 0x1ff) == 0x123456ff);
static_assert(rebound_rkey(0x12345601, 0xabcdef02) == 0x12345602);

constexpr unsigned kRemoteRw = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;

class WindowTest : public ::testing::Test, public harness::TwoDevices {
 protected:
  void SetUp() override {
    EmuProvider& p = EmuProvider::instance();
    ctx_ = p.open_device(dev(0).ibv());
    ASSERT_NE(ctx_, nullptr);
    pd_ = p.alloc_pd(ctx_);
    other_pd_ = p.alloc_pd(ctx_);
    buf_.assign(8192, 0);
    mr_ = p.reg_mr_iova2(pd_, buf_.data(), buf_.size(), reinterpret_cast<uintptr_t>(buf_.data()),
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    ASSERT_TRUE(pd_ && other_pd_ && mr_);
  }
  void TearDown() override {
    EmuProvider& p = EmuProvider::instance();
    for (ibv_mw* mw : mws_) EXPECT_EQ(ibv_dealloc_mw(mw), 0);
    EXPECT_EQ(p.dereg_mr(mr_), 0);
    EXPECT_EQ(p.dealloc_pd(other_pd_), 0);
    EXPECT_EQ(p.dealloc_pd(pd_), 0);
    EXPECT_EQ(p.close_device(ctx_), 0);
  }

  Mw& alloc(ibv_mw_type type, ibv_pd* pd = nullptr) {
    ibv_mw* mw = ibv_alloc_mw(pd ? pd : pd_, type);
    EXPECT_NE(mw, nullptr);
    mws_.push_back(mw);
    return *Mw::from(mw);
  }
  uint64_t va(size_t off) const { return reinterpret_cast<uintptr_t>(buf_.data()) + off; }
  Mr& mr() const { return *Mr::from(mr_); }
  const Pd& pd() const { return *Pd::from(pd_); }

  bool bind(Mw& mw, uint32_t qpn, uint32_t rkey, Mr* region, uint64_t addr, uint64_t len, unsigned access) {
    std::unique_lock lock(dev(0).mr_lock());
    return bind_window(pd(), qpn, BindRequest{&mw, rkey, region, addr, len, access});
  }
  uint8_t* access(uint32_t qpn, uint32_t rkey, uint64_t at, uint64_t len, unsigned what) {
    std::shared_lock lock(dev(0).mr_lock());
    return check_rkey(dev(0), pd(), qpn, kRemoteRw | IBV_ACCESS_REMOTE_ATOMIC, rkey, at, len, what);
  }
  bool invalidate(uint32_t qpn, uint32_t rkey, Invalidation how) {
    std::unique_lock lock(dev(0).mr_lock());
    return invalidate_window(dev(0), pd(), qpn, rkey, how);
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_pd* other_pd_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::vector<uint8_t> buf_;
  std::vector<ibv_mw*> mws_;
};

TEST_F(WindowTest, KeysAreIndexesOfTheirOwnWithAKeyByte) {
  Mw& a = alloc(IBV_MW_TYPE_1);
  Mw& b = alloc(IBV_MW_TYPE_2);
  EXPECT_EQ(a.rkey & 0xff, 0u);
  EXPECT_EQ(a.ibv()->rkey, a.rkey);
  EXPECT_NE(a.rkey >> 8, b.rkey >> 8);
  EXPECT_NE(a.rkey >> 8, mr_->rkey >> 8);
  {
    std::shared_lock lock(dev(0).mr_lock());
    EXPECT_EQ(dev(0).find_mw_locked(a.rkey | 0x42), &a) << "a window is found by its index";
    EXPECT_EQ(dev(0).find_mr_locked(a.rkey), nullptr);
  }
  // A bind changes the key byte only; the old rkey then resolves to nothing.
  const uint32_t first = ibv_inc_rkey(a.rkey);
  ASSERT_TRUE(bind(a, 7, first, &mr(), va(0), 4096, kRemoteRw));
  EXPECT_EQ(a.rkey, first);
  EXPECT_EQ(mr().bound_windows, 1u);
  EXPECT_EQ(access(7, first, va(16), 16, IBV_ACCESS_REMOTE_WRITE), buf_.data() + 16);
  const uint32_t second = ibv_inc_rkey(first);
  ASSERT_TRUE(bind(a, 9, second | 0xabcd0000, &mr(), va(4096), 64, kRemoteRw));
  EXPECT_EQ(a.rkey, second) << "only the requested key byte is taken";
  EXPECT_EQ(mr().bound_windows, 1u) << "rebinding moves the window, it does not add one";
  EXPECT_EQ(access(7, first, va(4096), 16, IBV_ACCESS_REMOTE_WRITE), nullptr);
  // Type 1 windows work through any QP of the PD.
  EXPECT_EQ(access(123, second, va(4096), 64, IBV_ACCESS_REMOTE_READ), buf_.data() + 4096);
  EXPECT_EQ(access(123, second, va(4096), 65, IBV_ACCESS_REMOTE_READ), nullptr);
  EXPECT_EQ(access(123, second, va(4095), 1, IBV_ACCESS_REMOTE_READ), nullptr);
  EXPECT_EQ(access(123, second, va(4096), 8, IBV_ACCESS_REMOTE_ATOMIC), nullptr) << "right not granted";
  // Key byte wrap-around: 0xff goes to 0x00 in the same index.
  EXPECT_EQ(ibv_inc_rkey(window_rkey(5, 0xff)), window_rkey(5, 0));
  // Unbind: no region, length 0.
  ASSERT_TRUE(bind(a, 9, ibv_inc_rkey(second), nullptr, 0, 0, 0));
  EXPECT_EQ(mr().bound_windows, 0u);
  EXPECT_EQ(access(9, a.rkey, va(4096), 1, IBV_ACCESS_REMOTE_READ), nullptr);
}

TEST_F(WindowTest, Type2IsQpBoundZeroBasedCapableAndInvalidatable) {
  Mw& w = alloc(IBV_MW_TYPE_2);
  const uint32_t rkey = ibv_inc_rkey(w.rkey);
  EXPECT_FALSE(bind(w, 7, rkey, nullptr, 0, 0, 0)) << "o10-37.2.40";
  ASSERT_TRUE(bind(w, 7, rkey, &mr(), va(1000), 100, kRemoteRw | IBV_ACCESS_ZERO_BASED));
  EXPECT_FALSE(bind(w, 7, ibv_inc_rkey(rkey), &mr(), va(0), 10, kRemoteRw)) << "bound: not free";
  EXPECT_EQ(access(7, rkey, 0, 100, IBV_ACCESS_REMOTE_WRITE), buf_.data() + 1000);
  EXPECT_EQ(access(7, rkey, 99, 2, IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(access(8, rkey, 0, 1, IBV_ACCESS_REMOTE_WRITE), nullptr) << "type 2B: another QP";
  EXPECT_FALSE(invalidate(8, rkey, Invalidation::remote)) << "remote: only by the bound QP";
  EXPECT_FALSE(invalidate(7, ibv_inc_rkey(rkey), Invalidation::local)) << "stale key byte";
  EXPECT_TRUE(invalidate(7, rkey, Invalidation::remote));
  EXPECT_FALSE(invalidate(7, rkey, Invalidation::local)) << "already free";
  EXPECT_EQ(access(7, rkey, 0, 1, IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(mr().bound_windows, 0u);
  // Free again, it binds with a new key byte; a local invalidation frees it too.
  ASSERT_TRUE(bind(w, 8, ibv_inc_rkey(rkey), &mr(), va(0), 10, kRemoteRw));
  EXPECT_TRUE(invalidate(1, w.rkey, Invalidation::local));
}

TEST_F(WindowTest, BindRulesAndRegionLifetime) {
  EmuProvider& p = EmuProvider::instance();
  Mw& t1 = alloc(IBV_MW_TYPE_1);
  EXPECT_FALSE(bind(t1, 1, 1, &mr(), va(0), 16, kRemoteRw | IBV_ACCESS_ZERO_BASED)) << "o10-36.2.2";
  EXPECT_FALSE(bind(t1, 1, 1, &mr(), va(8192 - 8), 16, kRemoteRw)) << "C10-75";
  EXPECT_FALSE(bind(t1, 1, 1, &mr(), va(0) - 8, 16, kRemoteRw)) << "C10-75";
  Mw& foreign = alloc(IBV_MW_TYPE_2, other_pd_);
  EXPECT_FALSE(bind(foreign, 1, 1, &mr(), va(0), 16, kRemoteRw)) << "C10-72";
  std::vector<uint8_t> plain(4096);
  ibv_mr* no_bind = p.reg_mr_iova2(pd_, plain.data(), plain.size(), reinterpret_cast<uintptr_t>(plain.data()),
                                   IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* read_only = p.reg_mr_iova2(pd_, plain.data(), plain.size(), reinterpret_cast<uintptr_t>(plain.data()),
                                     IBV_ACCESS_MW_BIND);
  ASSERT_TRUE(no_bind && read_only);
  EXPECT_FALSE(bind(t1, 1, 1, Mr::from(no_bind), reinterpret_cast<uintptr_t>(plain.data()), 16, kRemoteRw))
      << "C10-73";
  EXPECT_FALSE(bind(t1, 1, 1, Mr::from(read_only), reinterpret_cast<uintptr_t>(plain.data()), 16, kRemoteRw))
      << "C10-74";
  EXPECT_TRUE(bind(t1, 1, 1, Mr::from(read_only), reinterpret_cast<uintptr_t>(plain.data()), 16,
                   IBV_ACCESS_REMOTE_READ));
  EXPECT_EQ(t1.rkey & 0xff, 1u) << "a refused bind changes nothing, a successful one the key byte";
  EXPECT_EQ(p.dereg_mr(read_only), EINVAL) << "a window is bound to it";
  {
    std::unique_lock lock(dev(0).mr_lock());
    unbind_window(t1);
  }
  EXPECT_EQ(p.dereg_mr(read_only), 0);
  EXPECT_EQ(p.dereg_mr(no_bind), 0);
}

}  // namespace
}  // namespace softverbs::emu
