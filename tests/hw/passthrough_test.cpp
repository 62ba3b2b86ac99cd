// The passthrough over a second copy of softverbs' own library (lib-hwtest/):
// SOFTVERBS_BACKEND=hw, SOFTVERBS_HW_LIBIBVERBS=<build>/lib-hwtest/libibverbs.so.1.
// The inner copy, in its own link namespace, serves emulated devices; everything
// the application gets comes from it, through the forwarding layer.
#include <fcntl.h>
#include <gnu/lib-names.h>
#include <infiniband/verbs.h>
#include <link.h>
#include <softverbs/faults.h>
#include <sys/single_threaded.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "hw_test.hpp"

namespace {

using hwtest::file_of;
using hwtest::same_file;

class Passthrough : public ::testing::Test {
 protected:
  void SetUp() override {
    HWTEST_REQUIRE_ENV("SOFTVERBS_BACKEND", "hw");
    HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", SV_HWTEST_LIB);
    int num = 0;
    list_ = ibv_get_device_list(&num);
    ASSERT_NE(list_, nullptr);
    ASSERT_GE(num, 1) << "the inner copy lists no devices";
    ctx_ = ibv_open_device(list_[0]);
    ASSERT_NE(ctx_, nullptr) << std::strerror(errno);
    ASSERT_EQ(ibv_query_device(ctx_, &dattr_), 0);
  }
  void TearDown() override {
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    if (list_) ibv_free_device_list(list_);
  }

  // Code that lives in the inner copy (the library loaded as "the real one").
  static bool in_inner(const void* fn) { return same_file(file_of(fn), SV_HWTEST_LIB); }
  // Code that lives in the library the test linked (ours, the forwarding layer).
  static bool in_outer(const void* fn) { return same_file(file_of(fn), SV_IBVERBS_FILE); }

  // The namespace's own libc, found from a function of the inner copy.
  static void* namespace_libc(const void* inner_fn) {
    Dl_info info{};
    link_map* map = nullptr;
    if (!dladdr1(inner_fn, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) || !map) return nullptr;
    Lmid_t lmid = LM_ID_BASE;
    if (dlinfo(map, RTLD_DI_LMID, &lmid) != 0 || lmid == LM_ID_BASE) return nullptr;
    return dlmopen(lmid, LIBC_SO, RTLD_NOW | RTLD_NOLOAD);
  }

  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_device_attr dattr_{};
};

TEST_F(Passthrough, DevicesAreTheInnerLibrarysEmulatedDevices) {
  // SOFTVERBS_DEVICES reaches the inner copy through the namespace's
  // environment; the names it lists are the ones configured.
  std::vector<std::string> names;
  for (int i = 0; list_[i]; ++i) names.emplace_back(ibv_get_device_name(list_[i]));
  EXPECT_EQ(names, (std::vector<std::string>{"hw_roce", "hw_ib"}));
  EXPECT_NE(ibv_get_device_guid(list_[0]), 0u);
  EXPECT_EQ(ibv_get_device_index(list_[0]), 0);
  EXPECT_EQ(ibv_get_device_index(list_[1]), 1);
  EXPECT_EQ(ctx_->device, list_[0]) << "the context is the real library's, returned untouched";
}

TEST_F(Passthrough, DataPathJumpsStraightIntoTheInnerLibrary) {
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &init);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  ASSERT_EQ(qp->context, ctx_);

  // What the inline ibv_post_send/ibv_poll_cq/... call: the inner library's own
  // functions, with no softverbs code of the outer copy in between.
  EXPECT_TRUE(in_inner(reinterpret_cast<void*>(qp->context->ops.post_send))) << file_of((void*)ctx_->ops.post_send);
  EXPECT_TRUE(in_inner(reinterpret_cast<void*>(qp->context->ops.post_recv)));
  EXPECT_TRUE(in_inner(reinterpret_cast<void*>(cq->context->ops.poll_cq)));
  EXPECT_TRUE(in_inner(reinterpret_cast<void*>(cq->context->ops.req_notify_cq)));
  EXPECT_TRUE(in_inner(reinterpret_cast<void*>(ctx_->ops.post_srq_recv)));

  // The extended CQ: created through the (wrapped) create_cq_ex slot, polled
  // through its own function pointers, which are the inner library's.
  ibv_cq_init_attr_ex cq_attr{};
  cq_attr.cqe = 8;
  cq_attr.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &cq_attr);
  ASSERT_NE(cqx, nullptr) << std::strerror(errno);
  for (const void* fn :
       {reinterpret_cast<const void*>(cqx->start_poll), reinterpret_cast<const void*>(cqx->next_poll),
        reinterpret_cast<const void*>(cqx->end_poll), reinterpret_cast<const void*>(cqx->read_opcode),
        reinterpret_cast<const void*>(cqx->read_byte_len), reinterpret_cast<const void*>(cqx->read_wc_flags)})
    EXPECT_TRUE(in_inner(fn)) << file_of(fn);
  ibv_poll_cq_attr poll_attr{};
  EXPECT_EQ(ibv_start_poll(cqx, &poll_attr), ENOENT) << "an empty CQ, polled through the inner library";

  // The extended QP: forwarded ibv_qp_to_qp_ex gives what the inner library
  // gives: NULL for a QP created without send ops flags; for one created
  // through the (wrapped) create_qp_ex slot with them, an ibv_qp_ex whose
  // ibv_wr_* pointers are the inner library's.
  EXPECT_EQ(ibv_qp_to_qp_ex(qp), nullptr);
  ibv_qp_init_attr_ex init_ex{};
  init_ex.send_cq = init_ex.recv_cq = cq;
  init_ex.qp_type = IBV_QPT_RC;
  init_ex.cap = {4, 4, 1, 1, 0};
  init_ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  init_ex.pd = pd;
  init_ex.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
  ibv_qp* qp_ex = ibv_create_qp_ex(ctx_, &init_ex);
  ASSERT_NE(qp_ex, nullptr) << std::strerror(errno);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp_ex);
  ASSERT_NE(qpx, nullptr);
  EXPECT_TRUE(in_inner(reinterpret_cast<void*>(qpx->wr_start)));
  EXPECT_TRUE(in_inner(reinterpret_cast<void*>(qpx->wr_send)));
  EXPECT_TRUE(in_inner(reinterpret_cast<void*>(qpx->wr_complete)));
  EXPECT_EQ(ibv_destroy_qp(qp_ex), 0);

  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

TEST_F(Passthrough, ControlPathSlotsAreWrappedDataPathSlotsAreNot) {
  verbs_context* vctx = verbs_get_ctx(ctx_);
  ASSERT_NE(vctx, nullptr);
  // The slots the inner library set that report failure through errno now lead
  // to the forwarding layer's trampolines, in our file.
  EXPECT_TRUE(in_outer(reinterpret_cast<void*>(vctx->create_cq_ex))) << file_of((void*)vctx->create_cq_ex);
  EXPECT_TRUE(in_outer(reinterpret_cast<void*>(vctx->query_device_ex)));
  EXPECT_TRUE(in_outer(reinterpret_cast<void*>(vctx->query_port)));
  EXPECT_TRUE(in_outer(reinterpret_cast<void*>(vctx->open_xrcd)));
  EXPECT_TRUE(in_outer(reinterpret_cast<void*>(vctx->alloc_td)));
  EXPECT_TRUE(in_outer(reinterpret_cast<void*>(vctx->alloc_parent_domain)));
  EXPECT_TRUE(in_outer(reinterpret_cast<void*>(vctx->open_qp)));
  // Slots the inner library left empty stay empty: the inline verb still
  // answers EOPNOTSUPP on its own, without a call.
  EXPECT_EQ(vctx->create_wq, nullptr);
  EXPECT_FALSE(in_outer(reinterpret_cast<void*>(ctx_->ops.post_send)));
  EXPECT_FALSE(in_outer(reinterpret_cast<void*>(ctx_->ops.poll_cq)));

  // And they still work.
  ibv_device_attr_ex attr{};
  EXPECT_EQ(ibv_query_device_ex(ctx_, nullptr, &attr), 0);
  EXPECT_EQ(attr.orig_attr.max_qp, dattr_.max_qp);
  ibv_port_attr port{};
  EXPECT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  // A wrapped slot's errno reaches the application (no FD/OFLAGS: EINVAL)...
  errno = 0;
  ibv_xrcd_init_attr xattr{};
  EXPECT_EQ(ibv_open_xrcd(ctx_, &xattr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // ...and an empty one answers EOPNOTSUPP from the inline verb itself.
  errno = 0;
  ibv_wq_init_attr wattr{};
  EXPECT_EQ(ibv_create_wq(ctx_, &wattr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(Passthrough, TheNamespaceHasItsOwnErrno) {
  // The premise of the errno bridge: without it the application would read a
  // different variable than the one the inner library sets.
  void* libc = namespace_libc(reinterpret_cast<void*>(ctx_->ops.post_send));
  ASSERT_NE(libc, nullptr) << "the inner library is not in a link namespace of its own";
  auto ns_errno = reinterpret_cast<int* (*)()>(dlsym(libc, "__errno_location"));
  ASSERT_NE(ns_errno, nullptr);
  EXPECT_NE(ns_errno(), &errno);
  dlclose(libc);
}

TEST_F(Passthrough, OurLibcKnowsTheProcessIsMultiThreaded) {
  // This process creates no thread itself; the inner library's progress thread
  // is created by the namespace's libc, yet ld.so allocates its dynamic TLS with
  // our libc's malloc, which locks only once __libc_single_threaded is false.
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, nullptr, 0);  // starts the inner progress thread
  ASSERT_NE(cq, nullptr);
  EXPECT_FALSE(__libc_single_threaded);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(Passthrough, ErrnoOfAnExportedVerbReachesTheApplication) {
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, dattr_.max_cqe + 1, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);

  errno = 0;
  ibv_srq_init_attr srq_attr{};
  srq_attr.attr.max_wr = static_cast<uint32_t>(dattr_.max_srq_wr) + 1;
  srq_attr.attr.max_sge = 1;
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  EXPECT_EQ(ibv_create_srq(pd, &srq_attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

TEST_F(Passthrough, ErrnoOfAnInlineVerbReachesTheApplication) {
  // ibv_create_cq_ex is inline: it calls the create_cq_ex slot directly, so only
  // the trampoline can bring the namespace's errno back.
  ibv_cq_init_attr_ex attr{};
  attr.cqe = static_cast<uint32_t>(dattr_.max_cqe) + 1;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(Passthrough, SuccessLeavesTheApplicationsErrnoAlone) {
  // The namespace sees our errno on entry, so a verb that succeeds without
  // touching errno leaves it as it was, as it would in one namespace.
  errno = 0;
  ASSERT_EQ(ibv_create_cq(ctx_, dattr_.max_cqe + 1, nullptr, nullptr, 0), nullptr);  // namespace errno = EINVAL
  errno = EDOM;
  ibv_port_attr port{};
  EXPECT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  EXPECT_EQ(errno, EDOM);
}

TEST_F(Passthrough, TheNamespaceSeesOurEnvironmentWithTheBackendPinnedToEmu) {
  void* libc = namespace_libc(reinterpret_cast<void*>(ctx_->ops.post_send));
  ASSERT_NE(libc, nullptr);
  auto ns_getenv = reinterpret_cast<char* (*)(const char*)>(dlsym(libc, "getenv"));
  ASSERT_NE(ns_getenv, nullptr);
  ibv_device_attr attr{};

  // The inner copy must serve emulated devices, not load a namespace of its own.
  ASSERT_NE(ns_getenv("SOFTVERBS_BACKEND"), nullptr);
  EXPECT_STREQ(ns_getenv("SOFTVERBS_BACKEND"), "emu");
  EXPECT_STREQ(ns_getenv("SOFTVERBS_DEVICES"), std::getenv("SOFTVERBS_DEVICES"));

  // A variable the application sets later is seen from the next call on.
  ASSERT_EQ(setenv("SV_HW_TEST_LATE", "1", 1), 0);
  EXPECT_EQ(ibv_query_device(ctx_, &attr), 0);
  ASSERT_NE(ns_getenv("SV_HW_TEST_LATE"), nullptr);
  EXPECT_STREQ(ns_getenv("SV_HW_TEST_LATE"), "1");
  ASSERT_EQ(setenv("SV_HW_TEST_LATE", "2", 1), 0);
  EXPECT_EQ(ibv_query_device(ctx_, &attr), 0);
  EXPECT_STREQ(ns_getenv("SV_HW_TEST_LATE"), "2");
  ASSERT_EQ(unsetenv("SV_HW_TEST_LATE"), 0);
  EXPECT_EQ(ibv_query_device(ctx_, &attr), 0);
  EXPECT_EQ(ns_getenv("SV_HW_TEST_LATE"), nullptr);
  // Changing ours does not unpin the namespace's backend.
  ASSERT_EQ(setenv("SOFTVERBS_BACKEND", "both", 1), 0);
  EXPECT_EQ(ibv_query_device(ctx_, &attr), 0);
  EXPECT_STREQ(ns_getenv("SOFTVERBS_BACKEND"), "emu");
  ASSERT_EQ(setenv("SOFTVERBS_BACKEND", "hw", 1), 0);
  dlclose(libc);
}

TEST_F(Passthrough, EventFdsAreTheRealOnes) {
  ibv_comp_channel* channel = ibv_create_comp_channel(ctx_);
  ASSERT_NE(channel, nullptr);
  EXPECT_GE(fcntl(channel->fd, F_GETFD), 0);
  EXPECT_EQ(channel->context, ctx_);
  EXPECT_GE(fcntl(ctx_->async_fd, F_GETFD), 0);
  ibv_cq* cq = ibv_create_cq(ctx_, 4, this, channel, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(cq->channel, channel);
  EXPECT_EQ(ibv_req_notify_cq(cq, 0), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(channel), EBUSY) << "the real library's channel reference count";
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
}

TEST_F(Passthrough, ContextsOpenAndCloseRepeatedly) {
  // A closed context's saved slots are dropped; a new context, possibly at the
  // same address, gets its own.
  for (int round = 0; round < 4; ++round) {
    ibv_context* ctx = ibv_open_device(list_[round % 2]);
    ASSERT_NE(ctx, nullptr);
    ibv_cq_init_attr_ex attr{};
    attr.cqe = 4;
    ibv_cq_ex* cqx = ibv_create_cq_ex(ctx, &attr);
    ASSERT_NE(cqx, nullptr) << std::strerror(errno);
    EXPECT_EQ(ibv_cq_ex_to_cq(cqx)->context, ctx);
    EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
    EXPECT_EQ(ibv_close_device(ctx), 0);
  }
}

TEST_F(Passthrough, DeviceListsAreTheRealLibrarysAndAreReleasedThroughIt) {
  for (int i = 0; i < 8; ++i) {
    int num = 0;
    ibv_device** list = ibv_get_device_list(&num);
    ASSERT_NE(list, nullptr);
    ASSERT_EQ(num, 2);
    EXPECT_EQ(list[0], list_[0]) << "the real library's device objects, as they are";
    EXPECT_EQ(list[2], nullptr);
    ibv_free_device_list(list);
  }
}

TEST_F(Passthrough, ForkInitIsForwarded) { EXPECT_EQ(ibv_fork_init(), 0); }

}  // namespace

// Exported by libibverbs for providers; declared in rdma-core's driver.h, which
// Debian does not install.
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);

namespace {

// Sockets among this process's open descriptors.
int open_sockets() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    char link[64], target[128];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = ::readlink(link, target, sizeof target - 1);
    if (len <= 0) continue;
    target[len] = '\0';
    if (std::strncmp(target, "socket:", 7) == 0) ++n;
  }
  return n;
}

// With SOFTVERBS_BACKEND=hw the outer library serves no emulated devices, and
// nothing creates them: not the sysfs helper, not the control API (each would
// claim a UDP endpoint on port 4791, which a kernel RoCE driver may hold).
TEST_F(Passthrough, NoEmulatedDevicesAreCreatedOutside) {
  const int before = open_sockets();
  char buf[64];
  EXPECT_EQ(ibv_read_sysfs_file("/nonexistent/softverbs", "node_type", buf, sizeof buf), -1);
  softverbs_counters c{};
  errno = 0;
  EXPECT_EQ(softverbs_device_counters(ibv_get_device_name(list_[0]), &c, sizeof c), -1);
  EXPECT_EQ(errno, ENODEV);
  EXPECT_EQ(open_sockets(), before) << "an emulated device was created in the outer library";
}

}  // namespace
