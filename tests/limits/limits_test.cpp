// The device's object limits, through the public verbs API: a program that
// creates PDs, MRs, MWs, CQs, SRQs, QPs or AHs until the maximum the device
// reports gets there, is refused one past it with ENOMEM (what ConnectX's
// firmware answers when its tables are full), and gets the object again once
// one is destroyed. Running out of memory is ENOMEM too, never an exception
// through the C interface, and a failed creation leaves nothing behind.
//
// The Limits.* tests run in the default suite (label conformance): each takes
// a few seconds at the device's real maximum. LimitsSlow.* (label limits, not
// in the default suite) reach the maxima that need tens of seconds: the
// millions of memory regions, each registration checking its pages.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

class Limits : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    list_ = ibv_get_device_list(&n);
    ASSERT_NE(list_, nullptr);
    ASSERT_GT(n, 0);
    ctx_ = ibv_open_device(list_[0]);
    ASSERT_NE(ctx_, nullptr);
    ASSERT_EQ(ibv_query_device(ctx_, &attr_), 0);
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
  }
  void TearDown() override {
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    if (list_) ibv_free_device_list(list_);
  }

  // Creates objects with make until `max` exist (`already` of them before the
  // first call), checks that one more is refused with ENOMEM, that destroying
  // one makes room for exactly one, then destroys them all.
  template <class T>
  void fill_to(int max, int already, const std::function<T*()>& make, const std::function<int(T*)>& destroy) {
    ASSERT_GT(max, already);
    std::vector<T*> objs;
    objs.reserve(static_cast<size_t>(max - already));
    for (int i = already; i < max; ++i) {
      T* o = make();
      if (!o) {
        ADD_FAILURE() << "object " << i << " of " << max << " refused: " << std::strerror(errno);
        break;
      }
      objs.push_back(o);
    }
    if (objs.size() == static_cast<size_t>(max - already)) {
      errno = 0;
      EXPECT_EQ(make(), nullptr) << "one past the maximum " << max;
      EXPECT_EQ(errno, ENOMEM);
      ASSERT_EQ(destroy(objs.back()), 0);
      objs.back() = make();
      EXPECT_NE(objs.back(), nullptr) << "a destroyed object's count is given back";
      if (!objs.back()) objs.pop_back();
      errno = 0;
      EXPECT_EQ(make(), nullptr);
      EXPECT_EQ(errno, ENOMEM);
    }
    for (T* o : objs) ASSERT_EQ(destroy(o), 0);
  }

  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_device_attr attr_{};
  ibv_pd* pd_ = nullptr;
};

using LimitsSlow = Limits;

// Every maximum is one a program can reach on a machine of a few GiB; none is
// the "no limit" INT_MAX.
TEST_F(Limits, MaximaAreReachableNumbers) {
  for (int max : {attr_.max_pd, attr_.max_mr, attr_.max_mw, attr_.max_cq, attr_.max_srq, attr_.max_qp, attr_.max_ah}) {
    EXPECT_GT(max, 0);
    EXPECT_LE(max, 1 << 24);
  }
  // Memory regions and windows share the 24-bit key index space.
  EXPECT_LT(static_cast<long>(attr_.max_mr) + attr_.max_mw, 1L << 24);
  EXPECT_EQ(attr_.max_res_rd_atom, attr_.max_qp * attr_.max_qp_rd_atom);
}

TEST_F(Limits, ProtectionDomains) {
  fill_to<ibv_pd>(attr_.max_pd, 1, [&] { return ibv_alloc_pd(ctx_); }, ibv_dealloc_pd);
}

TEST_F(Limits, AddressHandles) {
  ibv_port_attr port{};
  ASSERT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  ibv_ah_attr ah{};
  ah.port_num = 1;
  ah.is_global = 1;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 1, &ah.grh.dgid), 0);
  ah.grh.sgid_index = 1;
  ah.grh.hop_limit = 1;
  ah.dlid = port.lid ? port.lid : 1;
  fill_to<ibv_ah>(attr_.max_ah, 0, [&] { return ibv_create_ah(pd_, &ah); }, ibv_destroy_ah);
}

TEST_F(Limits, CompletionQueues) {
  fill_to<ibv_cq>(attr_.max_cq, 0, [&] { return ibv_create_cq(ctx_, 1, nullptr, nullptr, 0); }, ibv_destroy_cq);
}

TEST_F(Limits, SharedReceiveQueues) {
  ibv_srq_init_attr init{};
  init.attr.max_wr = 64;
  init.attr.max_sge = 1;
  fill_to<ibv_srq>(attr_.max_srq, 0, [&] {
    ibv_srq_init_attr a = init;
    return ibv_create_srq(pd_, &a);
  }, ibv_destroy_srq);
}

// With the queue sizes a test program typically asks for: the queues are
// allocated at the first post, so idle QPs stay small.
TEST_F(Limits, QueuePairs) {
  ibv_cq* cq = ibv_create_cq(ctx_, 256, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = init.cap.max_recv_wr = 128;
  init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = 64;
  fill_to<ibv_qp>(attr_.max_qp, 0, [&] {
    ibv_qp_init_attr a = init;
    return ibv_create_qp(pd_, &a);
  }, ibv_destroy_qp);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(LimitsSlow, MemoryRegions) {
  static char buf[64];
  fill_to<ibv_mr>(attr_.max_mr, 0, [&] { return ibv_reg_mr(pd_, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE); },
                  ibv_dereg_mr);
}

TEST_F(Limits, MemoryWindows) {
  fill_to<ibv_mw>(attr_.max_mw, 0, [&] { return ibv_alloc_mw(pd_, IBV_MW_TYPE_2); }, ibv_dealloc_mw);
}

// ---- out of memory ---------------------------------------------------------

// The process's address space now, from /proc/self/status (kB).
long vm_size_kb() {
  FILE* f = std::fopen("/proc/self/status", "re");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmSize: %ld kB", &kb) == 1) break;
  std::fclose(f);
  return kb;
}

// Run in a child (EXPECT_EXIT): with the address space capped a little above
// what the process uses, creations that need more memory than that fail with
// ENOMEM, and what they leave behind can still be destroyed. Returns 0, or the
// number of the first check that failed.
int out_of_memory_checks() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0) return 1;
  ibv_context* ctx = ibv_open_device(list[0]);
  if (!ctx) return 2;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  if (!pd || !cq) return 3;
  ibv_device_attr attr{};
  if (ibv_query_device(ctx, &attr)) return 4;
  // A QP whose queues, allocated at the first post, need tens of MiB each.
  ibv_qp_init_attr qinit{};
  qinit.send_cq = qinit.recv_cq = cq;
  qinit.qp_type = IBV_QPT_RC;
  qinit.cap.max_send_wr = qinit.cap.max_recv_wr = static_cast<uint32_t>(attr.max_qp_wr);
  qinit.cap.max_send_sge = qinit.cap.max_recv_sge = static_cast<uint32_t>(attr.max_sge);
  qinit.cap.max_inline_data = 512;
  ibv_qp* qp = ibv_create_qp(pd, &qinit);
  if (!qp) return 5;

  const long kb = vm_size_kb();
  if (kb <= 0) return 6;
  rlimit lim{};
  lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(kb + 8 * 1024) * 1024;  // 8 MiB of room
  if (setrlimit(RLIMIT_AS, &lim)) return 7;

  // The largest CQ (4194303 entries) and SRQ need far more than 8 MiB.
  errno = 0;
  if (ibv_create_cq(ctx, attr.max_cqe, nullptr, nullptr, 0) || errno != ENOMEM) return 10;
  ibv_cq_init_attr_ex cqx{};
  cqx.cqe = static_cast<uint32_t>(attr.max_cqe);
  cqx.wc_flags = IBV_WC_STANDARD_FLAGS;
  errno = 0;
  if (ibv_create_cq_ex(ctx, &cqx) || errno != ENOMEM) return 11;
  if (ibv_resize_cq(cq, attr.max_cqe) != ENOMEM) return 12;
  ibv_srq_init_attr sinit{};
  sinit.attr.max_wr = static_cast<uint32_t>(attr.max_srq_wr);
  sinit.attr.max_sge = static_cast<uint32_t>(attr.max_srq_sge);
  ibv_srq* srq = ibv_create_srq(pd, &sinit);
  if (srq) {
    // Allocated at the first post instead: that post fails with ENOMEM.
    char buf[8];
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf), sizeof buf, 0};
    ibv_recv_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_srq_recv(srq, &wr, &bad) != ENOMEM || bad != &wr) return 13;
    if (ibv_destroy_srq(srq)) return 14;
  } else if (errno != ENOMEM) {
    return 15;
  }
  // The QP's first post needs its queues: ENOMEM, and nothing is queued.
  ibv_recv_wr rwr{};
  ibv_recv_wr* rbad = nullptr;
  if (ibv_post_recv(qp, &rwr, &rbad) != ENOMEM || rbad != &rwr) return 16;
  ibv_send_wr swr{};
  swr.opcode = IBV_WR_SEND;
  ibv_send_wr* sbad = nullptr;
  if (ibv_post_send(qp, &swr, &sbad) != ENOMEM || sbad != &swr) return 17;
  // Every failed creation left its PD and CQ free of users.
  if (ibv_destroy_qp(qp)) return 20;
  if (ibv_destroy_cq(cq)) return 21;
  if (ibv_dealloc_pd(pd)) return 22;
  if (ibv_close_device(ctx)) return 23;
  ibv_free_device_list(list);
  return 0;
}

TEST(LimitsMemory, OutOfMemoryIsEnomem) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(out_of_memory_checks()), ::testing::ExitedWithCode(0), "");
}

}  // namespace
