// Struct layouts that the inline verbs of rdma-core 44's verbs.h and the applications
// compiled against it rely on, and the same layout observed at run time on a context
// opened from our library.
//
// The compile-time part pins the headers we build against (x86_64, rdma-core 44); the
// run-time part checks that our objects are laid out the way that inline code reads them
// (verbs_context before ibv_context, the ops slots, the verbs_device tail of a device).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <stdlib.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace {

// The ops member of rdma-core's struct verbs_device follows the public ibv_device.
constexpr size_t kVerbsDeviceOpsOffset = 664;

// ---------------------------------------------------------------------------
// Compile time: what the inline code in verbs.h was compiled with.

#define SV_EXPECT_SIZE(type, size) EXPECT_EQ(sizeof(type), size_t{size}) << "sizeof(" #type ")"
#define SV_EXPECT_OFFSET(type, member, off) \
  EXPECT_EQ(offsetof(type, member), size_t{off}) << "offsetof(" #type ", " #member ")"

// The few facts every object layout of the library depends on; a header that breaks
// them cannot be used at all.
static_assert(sizeof(verbs_context) == 648);
static_assert(offsetof(verbs_context, context) == 320);
static_assert(offsetof(verbs_context, sz) == 312);
static_assert(offsetof(ibv_context, abi_compat) == 320);
static_assert(sizeof(ibv_device) == kVerbsDeviceOpsOffset);

TEST(HeaderLayout, VerbsContext) {
  SV_EXPECT_SIZE(verbs_context, 648);
  SV_EXPECT_OFFSET(verbs_context, context, 320);
  SV_EXPECT_OFFSET(verbs_context, sz, 312);
  SV_EXPECT_OFFSET(verbs_context, query_port, 0);
  SV_EXPECT_OFFSET(verbs_context, advise_mr, 8);
  SV_EXPECT_OFFSET(verbs_context, alloc_null_mr, 16);
  SV_EXPECT_OFFSET(verbs_context, read_counters, 24);
  SV_EXPECT_OFFSET(verbs_context, attach_counters_point_flow, 32);
  SV_EXPECT_OFFSET(verbs_context, create_counters, 40);
  SV_EXPECT_OFFSET(verbs_context, destroy_counters, 48);
  SV_EXPECT_OFFSET(verbs_context, reg_dm_mr, 56);
  SV_EXPECT_OFFSET(verbs_context, alloc_dm, 64);
  SV_EXPECT_OFFSET(verbs_context, free_dm, 72);
  SV_EXPECT_OFFSET(verbs_context, modify_flow_action_esp, 80);
  SV_EXPECT_OFFSET(verbs_context, destroy_flow_action, 88);
  SV_EXPECT_OFFSET(verbs_context, create_flow_action_esp, 96);
  SV_EXPECT_OFFSET(verbs_context, modify_qp_rate_limit, 104);
  SV_EXPECT_OFFSET(verbs_context, alloc_parent_domain, 112);
  SV_EXPECT_OFFSET(verbs_context, dealloc_td, 120);
  SV_EXPECT_OFFSET(verbs_context, alloc_td, 128);
  SV_EXPECT_OFFSET(verbs_context, modify_cq, 136);
  SV_EXPECT_OFFSET(verbs_context, post_srq_ops, 144);
  SV_EXPECT_OFFSET(verbs_context, destroy_rwq_ind_table, 152);
  SV_EXPECT_OFFSET(verbs_context, create_rwq_ind_table, 160);
  SV_EXPECT_OFFSET(verbs_context, destroy_wq, 168);
  SV_EXPECT_OFFSET(verbs_context, modify_wq, 176);
  SV_EXPECT_OFFSET(verbs_context, create_wq, 184);
  SV_EXPECT_OFFSET(verbs_context, query_rt_values, 192);
  SV_EXPECT_OFFSET(verbs_context, create_cq_ex, 200);
  SV_EXPECT_OFFSET(verbs_context, priv, 208);
  SV_EXPECT_OFFSET(verbs_context, query_device_ex, 216);
  SV_EXPECT_OFFSET(verbs_context, ibv_destroy_flow, 224);
  SV_EXPECT_OFFSET(verbs_context, ABI_placeholder2, 232);
  SV_EXPECT_OFFSET(verbs_context, ibv_create_flow, 240);
  SV_EXPECT_OFFSET(verbs_context, ABI_placeholder1, 248);
  SV_EXPECT_OFFSET(verbs_context, open_qp, 256);
  SV_EXPECT_OFFSET(verbs_context, create_qp_ex, 264);
  SV_EXPECT_OFFSET(verbs_context, get_srq_num, 272);
  SV_EXPECT_OFFSET(verbs_context, create_srq_ex, 280);
  SV_EXPECT_OFFSET(verbs_context, open_xrcd, 288);
  SV_EXPECT_OFFSET(verbs_context, close_xrcd, 296);
  SV_EXPECT_OFFSET(verbs_context, _ABI_placeholder3, 304);
}

TEST(HeaderLayout, ContextAndOps) {
  SV_EXPECT_SIZE(ibv_context_ops, 256);
  SV_EXPECT_OFFSET(ibv_context_ops, alloc_mw, 56);
  SV_EXPECT_OFFSET(ibv_context_ops, bind_mw, 64);
  SV_EXPECT_OFFSET(ibv_context_ops, dealloc_mw, 72);
  SV_EXPECT_OFFSET(ibv_context_ops, poll_cq, 88);
  SV_EXPECT_OFFSET(ibv_context_ops, req_notify_cq, 96);
  SV_EXPECT_OFFSET(ibv_context_ops, post_srq_recv, 160);
  SV_EXPECT_OFFSET(ibv_context_ops, post_send, 200);
  SV_EXPECT_OFFSET(ibv_context_ops, post_recv, 208);

  SV_EXPECT_SIZE(ibv_context, 328);
  SV_EXPECT_OFFSET(ibv_context, device, 0);
  SV_EXPECT_OFFSET(ibv_context, ops, 8);
  SV_EXPECT_OFFSET(ibv_context, cmd_fd, 264);
  SV_EXPECT_OFFSET(ibv_context, async_fd, 268);
  SV_EXPECT_OFFSET(ibv_context, num_comp_vectors, 272);
  SV_EXPECT_OFFSET(ibv_context, mutex, 280);
  SV_EXPECT_OFFSET(ibv_context, abi_compat, 320);
}

TEST(HeaderLayout, Device) {
  SV_EXPECT_SIZE(ibv_device, 664);
  SV_EXPECT_OFFSET(ibv_device, _ops, 0);
  SV_EXPECT_OFFSET(ibv_device, node_type, 16);
  SV_EXPECT_OFFSET(ibv_device, transport_type, 20);
  SV_EXPECT_OFFSET(ibv_device, name, 24);
  SV_EXPECT_OFFSET(ibv_device, dev_name, 88);
  SV_EXPECT_OFFSET(ibv_device, dev_path, 152);
  SV_EXPECT_OFFSET(ibv_device, ibdev_path, 408);
}

TEST(HeaderLayout, ObjectSizes) {
  SV_EXPECT_SIZE(ibv_pd, 16);
  SV_EXPECT_SIZE(ibv_mr, 48);
  SV_EXPECT_SIZE(ibv_cq, 128);
  SV_EXPECT_SIZE(ibv_cq_ex, 288);
  SV_EXPECT_SIZE(ibv_qp, 160);
  SV_EXPECT_SIZE(ibv_qp_ex, 352);
  SV_EXPECT_SIZE(ibv_srq, 128);
  SV_EXPECT_SIZE(ibv_wq, 152);
  SV_EXPECT_SIZE(ibv_ah, 24);
  SV_EXPECT_SIZE(ibv_comp_channel, 16);
  SV_EXPECT_SIZE(ibv_mw, 32);
  SV_EXPECT_SIZE(ibv_xrcd, 8);
  SV_EXPECT_SIZE(ibv_dm, 32);
  SV_EXPECT_SIZE(ibv_flow, 24);
}

TEST(HeaderLayout, ObjectsStartWithTheirContext) {
  // Inline code reaches the context through obj->context (ibv_flow: after comp_mask).
  SV_EXPECT_OFFSET(ibv_pd, context, 0);
  SV_EXPECT_OFFSET(ibv_mr, context, 0);
  SV_EXPECT_OFFSET(ibv_cq, context, 0);
  SV_EXPECT_OFFSET(ibv_qp, context, 0);
  SV_EXPECT_OFFSET(ibv_srq, context, 0);
  SV_EXPECT_OFFSET(ibv_wq, context, 0);
  SV_EXPECT_OFFSET(ibv_ah, context, 0);
  SV_EXPECT_OFFSET(ibv_comp_channel, context, 0);
  SV_EXPECT_OFFSET(ibv_mw, context, 0);
  SV_EXPECT_OFFSET(ibv_xrcd, context, 0);
  SV_EXPECT_OFFSET(ibv_flow, comp_mask, 0);
  SV_EXPECT_OFFSET(ibv_flow, context, 8);
  // ibv_cq is a prefix of ibv_cq_ex, ibv_qp of ibv_qp_ex.
  SV_EXPECT_OFFSET(ibv_cq_ex, context, 0);
  SV_EXPECT_OFFSET(ibv_cq_ex, status, 132);
  SV_EXPECT_OFFSET(ibv_cq_ex, wr_id, 136);
  SV_EXPECT_OFFSET(ibv_qp_ex, qp_base, 0);
  SV_EXPECT_OFFSET(ibv_qp_ex, wr_id, 168);
  SV_EXPECT_OFFSET(ibv_qp_ex, wr_flags, 176);
}

TEST(HeaderLayout, AttributeSizes) {
  SV_EXPECT_SIZE(ibv_port_attr, 52);
  SV_EXPECT_OFFSET(ibv_port_attr, port_cap_flags2, 48);  // the first 48 bytes are the 1.1 struct
  SV_EXPECT_SIZE(ibv_device_attr, 232);
  SV_EXPECT_SIZE(ibv_device_attr_ex, 400);
  SV_EXPECT_OFFSET(ibv_device_attr_ex, orig_attr, 0);
  SV_EXPECT_SIZE(ibv_wc, 48);
  SV_EXPECT_SIZE(ibv_send_wr, 128);
  SV_EXPECT_SIZE(ibv_recv_wr, 32);
  SV_EXPECT_SIZE(ibv_sge, 16);
  SV_EXPECT_SIZE(ibv_qp_attr, 144);
  SV_EXPECT_SIZE(ibv_qp_init_attr, 64);
  SV_EXPECT_SIZE(ibv_qp_init_attr_ex, 136);
  SV_EXPECT_SIZE(ibv_cq_init_attr_ex, 56);
  SV_EXPECT_SIZE(ibv_gid_entry, 32);
  SV_EXPECT_SIZE(ibv_ah_attr, 32);
  SV_EXPECT_SIZE(ibv_async_event, 16);
}

// ---------------------------------------------------------------------------
// Run time: a context opened from our library.

std::string real_path(const char* p) {
  char buf[PATH_MAX];
  return ::realpath(p, buf) ? std::string(buf) : std::string(p);
}

// Whether [addr, addr+len) lies in a writable mapping of this process.
bool in_writable_mapping(const void* addr, size_t len) {
  auto a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    if (a >= lo && a + len <= hi) return perms[1] == 'w';
  }
  return false;
}

class OpenedContext : public ::testing::Test {
 protected:
  void SetUp() override {
    // The library this process runs on must be ours, not the distribution's.
    Dl_info info{};
    ASSERT_NE(::dladdr(reinterpret_cast<void*>(&ibv_open_device), &info), 0);
    ASSERT_EQ(real_path(info.dli_fname), real_path(SV_IBVERBS_FILE))
        << "ibv_open_device resolved to " << info.dli_fname << ", not to our library";

    int n = 0;
    list_ = ibv_get_device_list(&n);
    ASSERT_NE(list_, nullptr) << "ibv_get_device_list: " << std::strerror(errno);
    ASSERT_GE(n, 1) << "no emulated device (check SOFTVERBS_DEVICES)";
    dev_ = list_[0];
    ctx_ = ibv_open_device(dev_);
    ASSERT_NE(ctx_, nullptr) << "ibv_open_device(" << ibv_get_device_name(dev_) << "): " << std::strerror(errno);
  }
  void TearDown() override {
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    if (list_) ibv_free_device_list(list_);
  }

  ibv_device** list_ = nullptr;
  ibv_device* dev_ = nullptr;
  ibv_context* ctx_ = nullptr;
};

TEST_F(OpenedContext, IsAnExtendedVerbsContext) {
  EXPECT_EQ(ctx_->abi_compat, __VERBS_ABI_IS_EXTENDED);
  verbs_context* vctx = verbs_get_ctx(ctx_);
  ASSERT_NE(vctx, nullptr);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(vctx) + 320, reinterpret_cast<uint8_t*>(ctx_));
  EXPECT_EQ(vctx->sz, sizeof(verbs_context));
  EXPECT_EQ(vctx->sz, 648u);
  EXPECT_EQ(ctx_->device, dev_);
}

TEST_F(OpenedContext, UncheckedOpsSlotsAreSet) {
  // The inline ibv_post_send/ibv_post_recv/ibv_poll_cq/ibv_req_notify_cq/ibv_post_srq_recv
  // call these without a NULL check.
  EXPECT_NE(ctx_->ops.post_send, nullptr);
  EXPECT_NE(ctx_->ops.post_recv, nullptr);
  EXPECT_NE(ctx_->ops.poll_cq, nullptr);
  EXPECT_NE(ctx_->ops.req_notify_cq, nullptr);
  EXPECT_NE(ctx_->ops.post_srq_recv, nullptr);
}

TEST_F(OpenedContext, ExtendedSlotsAreSet) {
  verbs_context* vctx = verbs_get_ctx(ctx_);
  ASSERT_NE(vctx, nullptr);
  EXPECT_NE(vctx->query_port, nullptr);
  EXPECT_NE(vctx->query_device_ex, nullptr);
  EXPECT_NE(vctx->create_cq_ex, nullptr);
  // And visible through the header's own accessor (which also checks sz).
  EXPECT_NE(verbs_get_ctx_op(ctx_, query_port), nullptr);
  EXPECT_NE(verbs_get_ctx_op(ctx_, query_device_ex), nullptr);
  EXPECT_NE(verbs_get_ctx_op(ctx_, create_cq_ex), nullptr);
}

TEST_F(OpenedContext, DeviceIsLaidOutLikeAVerbsDevice) {
  EXPECT_EQ(dev_->_ops._dummy1, nullptr);
  EXPECT_EQ(dev_->_ops._dummy2, nullptr);
  // rdma-core providers (libmlx5, libefa) read verbs_device::ops at +664 of any device
  // handed to them and compare it with their own table; an emulated device must carry
  // NULL there so that they reject it.
  const void* ops = nullptr;
  std::memcpy(&ops, reinterpret_cast<const uint8_t*>(dev_) + kVerbsDeviceOpsOffset, sizeof ops);
  EXPECT_EQ(ops, nullptr) << "verbs_device::ops of " << dev_->name;
  EXPECT_STREQ(ibv_get_device_name(dev_), dev_->name);
  EXPECT_NE(dev_->name[0], '\0');
}

TEST_F(OpenedContext, CqExIsTheSameObjectAsItsCq) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 16;
  attr.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* cq_ex = ibv_create_cq_ex(ctx_, &attr);
  ASSERT_NE(cq_ex, nullptr) << "ibv_create_cq_ex: " << std::strerror(errno);
  ibv_cq* cq = ibv_cq_ex_to_cq(cq_ex);
  EXPECT_EQ(static_cast<void*>(cq), static_cast<void*>(cq_ex));
  // There is no library wrapper on the inline create path: the object must come back
  // initialised.
  EXPECT_EQ(cq->context, ctx_);
  EXPECT_EQ(cq_ex->context, ctx_);
  EXPECT_EQ(cq->channel, nullptr);
  EXPECT_GE(cq->cqe, 16);
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(cq, 1, &wc), 0) << "a new CQ is empty";
  ibv_poll_cq_attr pattr{};
  EXPECT_EQ(ibv_start_poll(cq_ex, &pattr), ENOENT) << "start_poll on an empty CQ";
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(OpenedContext, ExportedQueryPortWritesThe48ByteStruct) {
  void* handle = ::dlopen(SV_IBVERBS_FILE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << ::dlerror();
  using QueryPort = int (*)(ibv_context*, uint8_t, void*);
  auto query_port = reinterpret_cast<QueryPort>(::dlvsym(handle, "ibv_query_port", "IBVERBS_1.1"));
  ASSERT_NE(query_port, nullptr) << "dlvsym(ibv_query_port, IBVERBS_1.1): " << ::dlerror();

  // Two fills: every byte of the first 48 must be written (same result from both), and
  // the 4 bytes of port_cap_flags2 and padding must stay untouched.
  std::array<uint8_t, sizeof(ibv_port_attr)> a{}, b{};
  static_assert(sizeof a == 52);
  a.fill(0xAA);
  b.fill(0x55);
  ASSERT_EQ(query_port(ctx_, 1, a.data()), 0);
  ASSERT_EQ(query_port(ctx_, 1, b.data()), 0);
  for (size_t i = 48; i < a.size(); ++i) {
    EXPECT_EQ(a[i], 0xAA) << "byte " << i << " written past the 48-byte 1.1 struct";
    EXPECT_EQ(b[i], 0x55) << "byte " << i << " written past the 48-byte 1.1 struct";
  }
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 48), 0) << "not every byte of the 48-byte struct was written";

  // Same answer as the inline path, which goes through vctx->query_port with 52 bytes.
  ibv_port_attr full;
  std::memset(&full, 0xAA, sizeof full);
  ASSERT_EQ(ibv_query_port(ctx_, 1, &full), 0);
  EXPECT_EQ(std::memcmp(a.data(), &full, 48), 0);
  EXPECT_EQ(full.state, IBV_PORT_ACTIVE);
  ::dlclose(handle);
}

TEST_F(OpenedContext, QueryPortSlotHonoursTheCallersLength) {
  verbs_context* vctx = verbs_get_ctx(ctx_);
  ASSERT_NE(vctx, nullptr);
  ASSERT_NE(vctx->query_port, nullptr);
  // The full 52-byte struct: every byte is defined (memset before the query).
  std::array<uint8_t, 64> a{}, b{};
  a.fill(0xAA);
  b.fill(0x55);
  ASSERT_EQ(vctx->query_port(ctx_, 1, reinterpret_cast<ibv_port_attr*>(a.data()), sizeof(ibv_port_attr)), 0);
  ASSERT_EQ(vctx->query_port(ctx_, 1, reinterpret_cast<ibv_port_attr*>(b.data()), sizeof(ibv_port_attr)), 0);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(ibv_port_attr)), 0);
  for (size_t i = sizeof(ibv_port_attr); i < a.size(); ++i) {
    EXPECT_EQ(a[i], 0xAA) << "byte " << i;
    EXPECT_EQ(b[i], 0x55) << "byte " << i;
  }
  // An older, shorter struct: nothing past its end.
  a.fill(0xAA);
  ASSERT_EQ(vctx->query_port(ctx_, 1, reinterpret_cast<ibv_port_attr*>(a.data()), 40), 0);
  for (size_t i = 40; i < a.size(); ++i) EXPECT_EQ(a[i], 0xAA) << "byte " << i << " written past 40 bytes";
}

TEST_F(OpenedContext, QueryDeviceExDoesNotWritePastAttrSize) {
  verbs_context* vctx = verbs_get_ctx(ctx_);
  ASSERT_NE(vctx, nullptr);
  ASSERT_NE(vctx->query_device_ex, nullptr);
  constexpr size_t kSize = sizeof(ibv_device_attr) + 8;
  std::array<uint8_t, sizeof(ibv_device_attr_ex)> a{}, b{};
  a.fill(0xAA);
  b.fill(0x55);
  ASSERT_EQ(vctx->query_device_ex(ctx_, nullptr, reinterpret_cast<ibv_device_attr_ex*>(a.data()), kSize), 0);
  ASSERT_EQ(vctx->query_device_ex(ctx_, nullptr, reinterpret_cast<ibv_device_attr_ex*>(b.data()), kSize), 0);
  size_t first_bad = 0;
  int bad = 0;
  for (size_t i = kSize; i < a.size(); ++i) {
    if (a[i] != 0xAA || b[i] != 0x55) {
      if (!bad++) first_bad = i;
    }
  }
  EXPECT_EQ(bad, 0) << bad << " bytes written past attr_size=" << kSize << ", the first at offset " << first_bad;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), kSize), 0) << "bytes below attr_size left undefined";

  // The same prefix as the exported ibv_query_device.
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(ctx_, &attr), 0);
  EXPECT_EQ(std::memcmp(a.data(), &attr, sizeof attr), 0);
  EXPECT_GE(attr.phys_port_cnt, 1);
}

TEST_F(OpenedContext, QueryDeviceExRejectsAttrSizeBelowTheBaseStruct) {
  verbs_context* vctx = verbs_get_ctx(ctx_);
  ASSERT_NE(vctx, nullptr);
  ASSERT_NE(vctx->query_device_ex, nullptr);
  std::array<uint8_t, sizeof(ibv_device_attr_ex)> a{};
  a.fill(0xAA);
  EXPECT_EQ(vctx->query_device_ex(ctx_, nullptr, reinterpret_cast<ibv_device_attr_ex*>(a.data()),
                                  sizeof(ibv_device_attr) - 8),
            EINVAL);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], 0xAA) << "byte " << i;
}

TEST_F(OpenedContext, InlineQueryDeviceExUsesTheSlot) {
  ibv_device_attr_ex attr;
  std::memset(&attr, 0xAA, sizeof attr);
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &attr), 0);
  ibv_device_attr base{};
  ASSERT_EQ(ibv_query_device(ctx_, &base), 0);
  EXPECT_EQ(std::memcmp(&attr.orig_attr, &base, sizeof base), 0);
}

TEST(ExportedData, DisassociateDestroyIsWritableData) {
  // libmlx5/libefa store to it when RDMAV_ALLOW_DISASSOC_DESTROY is set.
  void* handle = ::dlopen(SV_IBVERBS_FILE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << ::dlerror();
  void* p = ::dlvsym(handle, "verbs_allow_disassociate_destroy", "IBVERBS_PRIVATE_34");
  ASSERT_NE(p, nullptr) << ::dlerror();
  EXPECT_TRUE(in_writable_mapping(p, 1)) << "verbs_allow_disassociate_destroy is not in writable memory";
  ::dlclose(handle);
}

}  // namespace
