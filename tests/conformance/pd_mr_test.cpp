// Protection domains and memory regions.
#include <sys/mman.h>
#include <unistd.h>

#include <set>

#include "conformance.hpp"

namespace conformance {
namespace {

// Page-aligned anonymous memory, unmapped at scope exit.
class Mapping {
 public:
  explicit Mapping(size_t len, int prot = PROT_READ | PROT_WRITE) : len_(len) {
    void* p = ::mmap(nullptr, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    addr_ = p == MAP_FAILED ? nullptr : p;
  }
  ~Mapping() {
    if (addr_) ::munmap(addr_, len_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* get() const { return addr_; }
  char* bytes() const { return static_cast<char*>(addr_); }
  size_t size() const { return len_; }

 private:
  void* addr_ = nullptr;
  size_t len_;
};

size_t page_size() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

// Registers with a run-time access value (the ibv_reg_mr macro then goes
// through ibv_reg_mr_iova2, as applications with computed flags do).
ibv_mr* reg(ibv_pd* pd, void* addr, size_t len, unsigned access) {
  volatile unsigned a = access;
  return ibv_reg_mr(pd, addr, len, static_cast<int>(a));
}

class PdTest : public VerbsTest {};
CONFORMANCE_INSTANTIATE(PdTest);
class MrTest : public VerbsTest {
 protected:
  // Whether the device re-registers MRs at all: a rereg that changes nothing
  // (the same access) succeeds, or fails with a command error and EOPNOTSUPP on
  // a device without it (rxe). Recorded either way.
  static bool rereg_supported(ibv_mr* mr) {
    errno = 0;
    const int rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE);
    const bool unsupported = rc == IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP;
    observe("mr.rereg", rc == 0 ? std::string("ok") : std::to_string(rc) + "/" + errno_name(errno));
    return !unsupported;
  }
};
CONFORMANCE_INSTANTIATE(MrTest);

// Skips a rereg test on a device that has no rereg_mr (the observation says so).
#define REQUIRE_REREG(mr) \
  if (!rereg_supported(mr)) GTEST_SKIP() << "the device does not support ibv_rereg_mr (EOPNOTSUPP)"

// ---- PD -------------------------------------------------------------------

TEST_P(PdTest, AllocAndDealloc) {
  ibv_pd* a = ibv_alloc_pd(ctx_);
  ASSERT_NE(a, nullptr) << std::strerror(errno);
  ibv_pd* b = ibv_alloc_pd(ctx_);
  ASSERT_NE(b, nullptr) << std::strerror(errno);
  EXPECT_NE(a, b);
  EXPECT_EQ(a->context, ctx_);
  EXPECT_EQ(b->context, ctx_);
  EXPECT_EQ(ibv_dealloc_pd(a), 0);
  EXPECT_EQ(ibv_dealloc_pd(b), 0);
}

TEST_P(PdTest, DeallocWithMrIsBusy) {
  Pd pd(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(pd);
  Mapping buf(page_size());
  ibv_mr* mr = ibv_reg_mr(pd.get(), buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  errno = 0;
  EXPECT_EQ(pd.destroy(), EBUSY);
  EXPECT_EQ(errno, EBUSY);  // the kernel's errno, left by rdma-core
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(pd.destroy(), 0);
}

TEST_P(PdTest, DeallocWithQpIsBusy) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Pd pd(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(pd);
  ibv_qp_init_attr init = qp_init_attr(IBV_QPT_RC, cq.get());
  ibv_qp* qp = ibv_create_qp(pd.get(), &init);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  errno = 0;
  EXPECT_EQ(pd.destroy(), EBUSY);
  EXPECT_EQ(errno, EBUSY);  // the kernel's errno, left by rdma-core
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(pd.destroy(), 0);
}

TEST_P(PdTest, DeallocWithAhIsBusy) {
  // (On a ConnectX InfiniBand port the AH lives in user space only and the
  // kernel PD does not see it; RoCE AHs are kernel objects.)
  Pd pd(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(pd);
  ibv_ah_attr attr = loopback_ah_attr();
  ibv_ah* ah = ibv_create_ah(pd.get(), &attr);
  ASSERT_NE(ah, nullptr) << std::strerror(errno);
  errno = 0;
  EXPECT_EQ(pd.destroy(), EBUSY);
  EXPECT_EQ(errno, EBUSY);  // the kernel's errno, left by rdma-core
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  EXPECT_EQ(pd.destroy(), 0);
}

TEST_P(PdTest, DeallocWithSrqIsBusy) {
  Pd pd(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(pd);
  ibv_srq_init_attr attr{};
  attr.attr.max_wr = 4;
  attr.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd.get(), &attr);
  ASSERT_NE(srq, nullptr) << std::strerror(errno);
  errno = 0;
  EXPECT_EQ(pd.destroy(), EBUSY);
  EXPECT_EQ(errno, EBUSY);  // the kernel's errno, left by rdma-core
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(pd.destroy(), 0);
}

// ---- reg_mr ---------------------------------------------------------------

TEST_P(MrTest, RegMrEveryAccessCombination) {
  static constexpr unsigned kFlags[] = {IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ,
                                        IBV_ACCESS_REMOTE_ATOMIC};
  Mapping buf(4 * page_size());
  ASSERT_NE(buf.get(), nullptr);
  std::vector<Mr> mrs;
  std::set<uint32_t> lkeys, rkeys;
  for (unsigned combo = 0; combo < 16; ++combo) {
    unsigned access = 0;
    for (unsigned b = 0; b < 4; ++b)
      if (combo & (1u << b)) access |= kFlags[b];
    SCOPED_TRACE("access 0x" + std::to_string(access));
    // Remote write and remote atomic need local write (IBTA 10.6.3.1).
    const bool valid =
        !(access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) || (access & IBV_ACCESS_LOCAL_WRITE);
    errno = 0;
    ibv_mr* mr = reg(pd_, buf.get(), buf.size(), access);
    if (!valid) {
      EXPECT_EQ(mr, nullptr);
      EXPECT_EQ(errno, EINVAL);
      if (mr) ibv_dereg_mr(mr);
      continue;
    }
    ASSERT_NE(mr, nullptr) << std::strerror(errno);
    mrs.emplace_back(mr);
    EXPECT_EQ(mr->addr, buf.get());
    EXPECT_EQ(mr->length, buf.size());
    EXPECT_EQ(mr->pd, pd_);
    EXPECT_EQ(mr->context, ctx_);
    // Every MR has its own lkey, and its own rkey when remote access is allowed.
    // The rkey of a local-only MR is never used; ConnectX and emu give a unique
    // one anyway, rxe gives 0 (recorded, not required).
    EXPECT_TRUE(lkeys.insert(mr->lkey).second) << "lkey reused";
    if (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC))
      EXPECT_TRUE(rkeys.insert(mr->rkey).second) << "rkey reused";
    else
      observe("mr.local_only_rkey", mr->rkey == 0 ? "0" : "nonzero");
  }
  EXPECT_EQ(mrs.size(), 10u);  // 16 combinations, 6 of them remote write/atomic without local write
}

TEST_P(MrTest, RegMrConstantAccessUsesTheClassicEntryPoint) {
  Mapping buf(page_size());
  // A compile-time constant access without optional bits calls the exported
  // ibv_reg_mr symbol itself.
  Mr mr(ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
  ASSERT_TRUE(mr) << std::strerror(errno);
  EXPECT_EQ(mr->addr, buf.get());
  EXPECT_EQ(mr->length, buf.size());
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_P(MrTest, RegMrSubRangeNotPageAligned) {
  Mapping buf(2 * page_size());
  Mr mr(reg(pd_, buf.bytes() + 100, 1000, IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr) << std::strerror(errno);
  EXPECT_EQ(mr->addr, buf.bytes() + 100);
  EXPECT_EQ(mr->length, 1000u);
}

// IBV_ACCESS_MW_BIND only allows memory windows to be bound to the region
// later; the kernel and ConnectX accept it alone or with any other access, for
// registration and for a change of access.
TEST_P(MrTest, RegMrWithMwBindIsAccepted) {
  Mapping buf(page_size());
  for (unsigned access : {unsigned{IBV_ACCESS_MW_BIND}, unsigned{IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND},
                          unsigned{IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                   IBV_ACCESS_MW_BIND}}) {
    SCOPED_TRACE("access " + std::to_string(access));
    Mr mr(reg(pd_, buf.get(), buf.size(), access));
    ASSERT_TRUE(mr) << std::strerror(errno);
    EXPECT_EQ(mr->addr, buf.get());
    EXPECT_EQ(mr->length, buf.size());
  }
  // The constant form reaches the exported ibv_reg_mr itself.
  Mr mr(ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND));
  ASSERT_TRUE(mr) << std::strerror(errno);
  REQUIRE_REREG(mr.get());
  EXPECT_EQ(ibv_rereg_mr(mr.get(), IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND),
            0)
      << std::strerror(errno);
}

TEST_P(MrTest, RegMrUnknownAccessBitsAreRejected) {
  Mapping buf(page_size());
  for (unsigned bit : {10u, 12u, 15u, 19u, 30u, 31u}) {
    SCOPED_TRACE("access bit " + std::to_string(bit));
    errno = 0;
    ibv_mr* mr = reg(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE | (1u << bit));
    EXPECT_EQ(mr, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (mr) ibv_dereg_mr(mr);
  }
}

TEST_P(MrTest, RegMrOptionalAccessBitsAreBestEffort) {
  // Bits 20..29 are optional: a device that does not implement one ignores it.
  Mapping buf(page_size());
  Mr relaxed(reg(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING));
  EXPECT_TRUE(relaxed) << std::strerror(errno);
  Mr unknown_optional(reg(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE | (1u << 25)));
  EXPECT_TRUE(unknown_optional) << std::strerror(errno);
}

TEST_P(MrTest, RegMrOnDemandFollowsOdpCaps) {
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  Mapping buf(page_size());
  errno = 0;
  Mr mr(reg(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND));
  observe("ibv_reg_mr.on_demand", outcome(mr.get()));
  if (ex.odp_caps.general_caps & IBV_ODP_SUPPORT) {
    EXPECT_TRUE(mr) << std::strerror(errno);
  } else {
    // Kernels since 6.2 answer EOPNOTSUPP, older ones EINVAL.
    EXPECT_FALSE(mr);
    EXPECT_TRUE(errno == EOPNOTSUPP || errno == EINVAL) << std::strerror(errno);
  }
}

TEST_P(MrTest, RegMrZeroLength) {
  Mapping buf(page_size());
  errno = 0;
  ibv_mr* mr = reg(pd_, buf.get(), 0, IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(mr, nullptr);
  EXPECT_EQ(errno, EINVAL);
  if (mr) ibv_dereg_mr(mr);
}

TEST_P(MrTest, RegMrUnmappedMemory) {
  void* p = ::mmap(nullptr, page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(::munmap(p, page_size()), 0);
  for (unsigned access : {0u, unsigned{IBV_ACCESS_LOCAL_WRITE}, unsigned{IBV_ACCESS_REMOTE_READ}}) {
    SCOPED_TRACE("access " + std::to_string(access));
    errno = 0;
    ibv_mr* mr = reg(pd_, p, page_size(), access);
    EXPECT_EQ(mr, nullptr);
    EXPECT_EQ(errno, EFAULT);
    if (mr) ibv_dereg_mr(mr);
  }
  // Page 0 is never mapped.
  errno = 0;
  ibv_mr* mr = reg(pd_, nullptr, page_size(), IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(mr, nullptr);
  EXPECT_EQ(errno, EFAULT);
  if (mr) ibv_dereg_mr(mr);
}

TEST_P(MrTest, RegMrPartlyUnmappedRange) {
  Mapping buf(2 * page_size());
  ASSERT_EQ(::munmap(buf.bytes() + page_size(), page_size()), 0);
  errno = 0;
  ibv_mr* mr = reg(pd_, buf.get(), 2 * page_size(), IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(mr, nullptr);
  EXPECT_EQ(errno, EFAULT);
  if (mr) ibv_dereg_mr(mr);
  // (Mapping's munmap of the whole range is harmless for the hole.)
}

TEST_P(MrTest, RegMrReadOnlyMapping) {
  Mapping ro(page_size(), PROT_READ);
  ASSERT_NE(ro.get(), nullptr);
  // Writable access pins for writing: EFAULT on a read-only mapping.
  for (unsigned access : {unsigned{IBV_ACCESS_LOCAL_WRITE}, unsigned{IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE},
                          unsigned{IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC}}) {
    SCOPED_TRACE("access " + std::to_string(access));
    errno = 0;
    ibv_mr* mr = reg(pd_, ro.get(), ro.size(), access);
    EXPECT_EQ(mr, nullptr);
    EXPECT_EQ(errno, EFAULT);
    if (mr) ibv_dereg_mr(mr);
  }
  // Read-only access is fine.
  Mr remote_read(reg(pd_, ro.get(), ro.size(), IBV_ACCESS_REMOTE_READ));
  EXPECT_TRUE(remote_read) << std::strerror(errno);
  Mr local_read(reg(pd_, ro.get(), ro.size(), 0));
  EXPECT_TRUE(local_read) << std::strerror(errno);
}

TEST_P(MrTest, RegMrIova) {
  Mapping buf(2 * page_size());
  const uint64_t iova = 0x7000000000ull;  // same offset in the page as buf (0)
  Mr a(ibv_reg_mr_iova(pd_, buf.get(), buf.size(), iova, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
  ASSERT_TRUE(a) << std::strerror(errno);
  // The application-visible fields describe the process's buffer, not the iova.
  EXPECT_EQ(a->addr, buf.get());
  EXPECT_EQ(a->length, buf.size());
  EXPECT_EQ(a->pd, pd_);
  Mr b(ibv_reg_mr_iova2(pd_, buf.bytes() + 64, 128, iova + 64, IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(b) << std::strerror(errno);
  EXPECT_EQ(b->addr, buf.bytes() + 64);
  EXPECT_EQ(b->length, 128u);
  EXPECT_NE(a->lkey, b->lkey);
  // Zero-based style iova 0 is valid too.
  Mr c(ibv_reg_mr_iova2(pd_, buf.get(), buf.size(), 0, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_TRUE(c) << std::strerror(errno);
}

TEST_P(MrTest, RegMrIovaMustKeepThePageOffset) {
  // The kernel maps iova and address page by page: their offsets in the page
  // must agree.
  Mapping buf(2 * page_size());
  errno = 0;
  ibv_mr* mr = ibv_reg_mr_iova2(pd_, buf.bytes() + 64, 128, 0x7000000000ull, IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(mr, nullptr);
  EXPECT_EQ(errno, EINVAL);
  if (mr) ibv_dereg_mr(mr);
}

TEST_P(MrTest, RegMrIovaErrors) {
  Mapping buf(page_size());
  errno = 0;
  ibv_mr* mr = ibv_reg_mr_iova2(pd_, buf.get(), buf.size(), 0x1000, IBV_ACCESS_REMOTE_ATOMIC);
  EXPECT_EQ(mr, nullptr);
  EXPECT_EQ(errno, EINVAL);
  if (mr) ibv_dereg_mr(mr);
  errno = 0;
  mr = ibv_reg_mr_iova(pd_, buf.get(), 0, 0x1000, IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(mr, nullptr);
  EXPECT_EQ(errno, EINVAL);
  if (mr) ibv_dereg_mr(mr);
}

TEST_P(MrTest, DeregMr) {
  Mapping buf(page_size());
  ibv_mr* mr = ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  // The same range can be registered again.
  Mr again(ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  EXPECT_TRUE(again);
}

// ---- rereg_mr -------------------------------------------------------------

TEST_P(MrTest, ReregChangeTranslation) {
  Mapping a(page_size()), b(3 * page_size());
  Mr mr(ibv_reg_mr(pd_, a.get(), a.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr);
  REQUIRE_REREG(mr.get());
  ASSERT_EQ(ibv_rereg_mr(mr.get(), IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, b.get(), b.size(), 0), 0)
      << std::strerror(errno);
  EXPECT_EQ(mr->addr, b.get());
  EXPECT_EQ(mr->length, b.size());
  EXPECT_EQ(mr->pd, pd_);
  EXPECT_EQ(mr->context, ctx_);
}

TEST_P(MrTest, ReregChangePdMovesTheMr) {
  Pd old_pd(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(old_pd);
  Mapping buf(page_size());
  Mr mr(ibv_reg_mr(old_pd.get(), buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr);
  REQUIRE_REREG(mr.get());
  EXPECT_EQ(old_pd.destroy(), EBUSY);
  ASSERT_EQ(ibv_rereg_mr(mr.get(), IBV_REREG_MR_CHANGE_PD, pd_, nullptr, 0, 0), 0) << std::strerror(errno);
  EXPECT_EQ(mr->pd, pd_);
  EXPECT_EQ(mr->context, ctx_);
  EXPECT_EQ(mr->addr, buf.get());
  EXPECT_EQ(mr->length, buf.size());
  // The old PD is free now; the new one holds the MR.
  EXPECT_EQ(old_pd.destroy(), 0);
}

TEST_P(MrTest, ReregChangeAccess) {
  Mapping buf(page_size());
  Mr mr(ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr);
  REQUIRE_REREG(mr.get());
  ASSERT_EQ(ibv_rereg_mr(mr.get(), IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
            0)
      << std::strerror(errno);
  EXPECT_EQ(mr->addr, buf.get());
  EXPECT_EQ(mr->length, buf.size());
  EXPECT_EQ(mr->pd, pd_);
}

TEST_P(MrTest, ReregAllAtOnce) {
  Pd other(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(other);
  Mapping a(page_size()), b(2 * page_size());
  Mr mr(ibv_reg_mr(pd_, a.get(), a.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr);
  REQUIRE_REREG(mr.get());
  ASSERT_EQ(
      ibv_rereg_mr(mr.get(), IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS,
                   other.get(), b.get(), b.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
      0)
      << std::strerror(errno);
  EXPECT_EQ(mr->pd, other.get());
  EXPECT_EQ(mr->addr, b.get());
  EXPECT_EQ(mr->length, b.size());
  EXPECT_EQ(other.destroy(), EBUSY);
  mr.reset();
  EXPECT_EQ(other.destroy(), 0);
}

TEST_P(MrTest, ReregInputErrorsLeaveTheMrIntact) {
  Mapping buf(page_size()), other(page_size());
  Mr mr(ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr);
  struct Case {
    const char* what;
    int flags;
    void* addr;
    size_t length;
    int access;
  };
  const Case cases[] = {
      {"unknown flag", 1 << 3, nullptr, 0, 0},
      {"unknown flag with known ones", IBV_REREG_MR_CHANGE_ACCESS | (1 << 5), nullptr, 0, IBV_ACCESS_LOCAL_WRITE},
      {"translation without address", IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, page_size(), 0},
      {"translation without length", IBV_REREG_MR_CHANGE_TRANSLATION, other.get(), 0, 0},
      {"access without CHANGE_ACCESS", IBV_REREG_MR_CHANGE_PD, nullptr, 0, IBV_ACCESS_LOCAL_WRITE},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    errno = 0;
    EXPECT_EQ(ibv_rereg_mr(mr.get(), c.flags, pd_, c.addr, c.length, c.access), IBV_REREG_MR_ERR_INPUT);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(mr->addr, buf.get());
    EXPECT_EQ(mr->length, buf.size());
    EXPECT_EQ(mr->pd, pd_);
  }
}

TEST_P(MrTest, ReregWithoutFlagsIsRefusedByTheDevice) {
  // rdma-core passes flags == 0 on to the kernel, which refuses it: a command
  // error, not an input error.
  Mapping buf(page_size());
  Mr mr(ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr);
  REQUIRE_REREG(mr.get());
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr.get(), 0, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_CMD);
  EXPECT_EQ(errno, EINVAL);
}

TEST_P(MrTest, ReregInvalidAccessIsRefusedByTheDevice) {
  // The library does not look at the access value; the kernel's access check
  // refuses remote write without local write.
  Mapping buf(page_size());
  Mr mr(ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr);
  REQUIRE_REREG(mr.get());
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr.get(), IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE),
            IBV_REREG_MR_ERR_CMD);
  EXPECT_EQ(errno, EINVAL);
}

TEST_P(MrTest, ReregTranslationToReadOnlyMemoryWithLocalWrite) {
  Mapping buf(page_size()), ro(page_size(), PROT_READ);
  Mr mr(ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr);
  REQUIRE_REREG(mr.get());
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr.get(), IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, ro.get(), ro.size(), 0),
            IBV_REREG_MR_ERR_CMD);
  EXPECT_EQ(errno, EFAULT);
  // After a command error the MR may no longer be used, but it can be deregistered.
}

TEST_P(MrTest, ReregChangePdToNullIsAnError) {
  // rdma-core 44 hands the PD straight to the kernel command (pd->handle), so
  // a NULL PD is an application bug there. Run it in a child process so that a
  // crash is reported as this test's failure and nothing else is affected.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Mapping buf(page_size());
  Mr mr(ibv_reg_mr(pd_, buf.get(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr);
  EXPECT_EXIT(
      {
        int rc = ibv_rereg_mr(mr.get(), IBV_REREG_MR_CHANGE_PD, nullptr, nullptr, 0, 0);
        // Still registered, still on the fixture's PD.
        bool intact = mr->pd == pd_ && mr->addr == buf.get();
        std::_Exit(rc < 0 && intact ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace conformance
