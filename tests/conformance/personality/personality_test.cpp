// Vendor personalities through the public verbs API (docs/simulation.md, "Vendor
// personalities"). One binary, two ctest entries: conformance.personality.connectx
// runs the Connectx tests with no SOFTVERBS_PERSONALITY, and
// conformance.personality.rxe the Rxe tests with SOFTVERBS_PERSONALITY=rxe; each
// checks the deviations docs/hardware.md records for rxe (and their absence on the
// default). conformance.personality.unknown checks that a personality that
// cannot be loaded lists no device.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <memory>

namespace {

// The first device, opened, with a PD and a CQ.
class Personality : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ASSERT_NE(list, nullptr);
    ASSERT_GT(n, 0) << "no device: a bad SOFTVERBS_PERSONALITY lists none";
    ctx_ = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx_, nullptr);
    ASSERT_EQ(ibv_query_device(ctx_, &attr_), 0);
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    cq_ = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
    ASSERT_NE(cq_, nullptr);
  }
  void TearDown() override {
    if (cq_) ibv_destroy_cq(cq_);
    if (pd_) ibv_dealloc_pd(pd_);
    if (ctx_) ibv_close_device(ctx_);
  }

  ibv_qp* create_rc(ibv_qp_init_attr* init) {
    init->send_cq = cq_;
    init->recv_cq = cq_;
    init->qp_type = IBV_QPT_RC;
    return ibv_create_qp(pd_, init);
  }

  // Posts `count` receives of no buffer; the number accepted.
  static int post_recvs(ibv_qp* qp, int count) {
    for (int i = 0; i < count; ++i) {
      ibv_recv_wr wr{};
      wr.wr_id = static_cast<uint64_t>(i);
      ibv_recv_wr* bad = nullptr;
      if (ibv_post_recv(qp, &wr, &bad) != 0) return i;
    }
    return count;
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_device_attr attr_{};
};

using Connectx = Personality;
using Rxe = Personality;

TEST_F(Connectx, DeviceAttributesAreTheDefaults) {
  EXPECT_EQ(attr_.vendor_id, 0x0053f5u);
  EXPECT_EQ(attr_.max_sge, 30);
  EXPECT_EQ(attr_.max_qp_wr, 32768);
  EXPECT_EQ(attr_.max_cqe, 4194303);
  EXPECT_EQ(attr_.max_qp_rd_atom, 16);
  EXPECT_EQ(attr_.max_srq_sge, 31);
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  EXPECT_EQ(ex.orig_attr.vendor_id, attr_.vendor_id);
  EXPECT_EQ(ex.orig_attr.max_sge, attr_.max_sge);
}

TEST_F(Rxe, DeviceAttributesAreRxes) {
  EXPECT_EQ(attr_.vendor_id, 0xffffffu);
  EXPECT_EQ(attr_.vendor_part_id, 0u);
  EXPECT_EQ(attr_.hw_ver, 0u);
  EXPECT_EQ(attr_.max_sge, 32);
  EXPECT_EQ(attr_.max_qp_wr, 1048576);
  EXPECT_EQ(attr_.max_cqe, 32767);
  EXPECT_EQ(attr_.max_qp_rd_atom, 128);
  EXPECT_EQ(attr_.max_qp_init_rd_atom, 128);
  EXPECT_EQ(attr_.max_srq_sge, 27);
  EXPECT_EQ(attr_.max_mw, 4096);
  EXPECT_EQ(attr_.local_ca_ack_delay, 15);
  EXPECT_EQ(attr_.page_size_cap, 0xfffff000ull);
  EXPECT_EQ(attr_.atomic_cap, IBV_ATOMIC_HCA);
  // query_device_ex carries the same attributes.
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  EXPECT_EQ(ex.orig_attr.vendor_id, 0xffffffu);
  EXPECT_EQ(ex.orig_attr.max_cqe, 32767);
}

// The limits are enforced as reported: rxe takes 32 SGEs, ConnectX 30.
TEST_F(Connectx, LimitsAreEnforcedAsReported) {
  ibv_qp_init_attr init{};
  init.cap = {4, 4, static_cast<uint32_t>(attr_.max_sge) + 1, 1, 0};
  errno = 0;
  EXPECT_EQ(create_rc(&init), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_cq* big = ibv_create_cq(ctx_, 32768, nullptr, nullptr, 0);
  EXPECT_NE(big, nullptr) << "32768 CQEs are within max_cqe";
  if (big) ibv_destroy_cq(big);
}

TEST_F(Rxe, LimitsAreEnforcedAsReported) {
  ibv_qp_init_attr init{};
  init.cap = {4, 4, 32, 1, 0};
  ibv_qp* qp = create_rc(&init);
  ASSERT_NE(qp, nullptr) << "rxe takes max_sge = 32";
  ibv_destroy_qp(qp);
  init.cap = {4, 4, 33, 1, 0};
  errno = 0;
  EXPECT_EQ(create_rc(&init), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 32768, nullptr, nullptr, 0), nullptr) << "above rxe's max_cqe";
  EXPECT_EQ(errno, EINVAL);
}

// ConnectX-like: the queue holds what was asked for, and says so.
TEST_F(Connectx, QpReportsTheDepthItHolds) {
  ibv_qp_init_attr init{};
  init.cap = {5, 5, 1, 1, 0};
  ibv_qp* qp = create_rc(&init);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr attr{};
  ibv_qp_init_attr queried{};
  ASSERT_EQ(ibv_query_qp(qp, &attr, IBV_QP_CAP, &queried), 0);
  EXPECT_EQ(queried.cap.max_recv_wr, init.cap.max_recv_wr);
  EXPECT_EQ(post_recvs(qp, 8), static_cast<int>(init.cap.max_recv_wr));
  ibv_destroy_qp(qp);
}

// rxe (docs/hardware.md): create writes back the depth asked for while the
// queue holds 2^n - 1; posting past the reported depth succeeds and query
// reports the real depth.
TEST_F(Rxe, QpWritesBackTheRequestedDepth) {
  ibv_qp_init_attr init{};
  init.cap = {5, 5, 1, 1, 0};
  ibv_qp* qp = create_rc(&init);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(init.cap.max_send_wr, 5u);
  EXPECT_EQ(init.cap.max_recv_wr, 5u);
  ibv_qp_attr attr{};
  ibv_qp_init_attr queried{};
  ASSERT_EQ(ibv_query_qp(qp, &attr, IBV_QP_CAP, &queried), 0);
  EXPECT_EQ(queried.cap.max_send_wr, 7u);
  EXPECT_EQ(queried.cap.max_recv_wr, 7u);
  EXPECT_EQ(post_recvs(qp, 8), 7);
  ibv_destroy_qp(qp);
}

TEST_F(Connectx, SrqReportsTheDepthItHolds) {
  ibv_srq_init_attr init{};
  init.attr.max_wr = 5;
  init.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &init);
  ASSERT_NE(srq, nullptr);
  EXPECT_EQ(init.attr.max_wr, 5u);
  ibv_srq_attr attr{};
  ASSERT_EQ(ibv_query_srq(srq, &attr), 0);
  EXPECT_EQ(attr.max_wr, 5u);
  ibv_destroy_srq(srq);
}

TEST_F(Rxe, SrqWritesBackTheRequestedDepth) {
  ibv_srq_init_attr init{};
  init.attr.max_wr = 5;
  init.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &init);
  ASSERT_NE(srq, nullptr);
  EXPECT_EQ(init.attr.max_wr, 5u);
  ibv_srq_attr attr{};
  ASSERT_EQ(ibv_query_srq(srq, &attr), 0);
  EXPECT_EQ(attr.max_wr, 7u);
  int accepted = 0;
  for (int i = 0; i < 8; ++i) {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_srq_recv(srq, &wr, &bad) != 0) break;
    ++accepted;
  }
  EXPECT_EQ(accepted, 7);
  ibv_destroy_srq(srq);
}

// A personality that cannot be loaded lists no device (docs/configuration.md):
// run by conformance.personality.unknown with SOFTVERBS_PERSONALITY=no-such-nic.
TEST(BadPersonality, ListsNoDevice) {
  int n = -1;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(n, 0);
  ibv_free_device_list(list);
}

}  // namespace
