// Vendor personalities through the public verbs API (docs/simulation.md, "Vendor
// personalities"). One binary, several ctest entries: conformance.personality.connectx
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
  // rxe refuses receives in RESET (post.before_rts): INIT takes them.
  ibv_qp_attr to_init{};
  to_init.qp_state = IBV_QPS_INIT;
  to_init.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(qp, &to_init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
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

// ---- capability flags, port and extended attributes ------------------------------

TEST_F(Connectx, CapabilitiesPortAndExtendedAttributes) {
  EXPECT_FALSE(attr_.device_cap_flags & IBV_DEVICE_SRQ_RESIZE);
  EXPECT_TRUE(attr_.device_cap_flags & IBV_DEVICE_N_NOTIFY_CQ);
  EXPECT_EQ(attr_.max_pkeys, 1);  // a RoCE port's P_Key table
  ibv_port_attr port{};
  ASSERT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  EXPECT_EQ(port.max_mtu, IBV_MTU_4096);
  EXPECT_EQ(port.gid_tbl_len, 16);
  EXPECT_EQ(port.active_width, 2);
  EXPECT_EQ(port.active_speed, 32);
  EXPECT_EQ(port.max_msg_sz, 1u << 30);
  EXPECT_EQ(port.max_vl_num, 4);
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  EXPECT_NE(ex.odp_caps.general_caps & IBV_ODP_SUPPORT, 0u);
  EXPECT_GT(ex.max_dm_size, 0u);
  EXPECT_GT(ex.hca_core_clock, 0u);
  EXPECT_NE(ex.completion_timestamp_mask, 0u);
}

TEST_F(Rxe, CapabilitiesPortAndExtendedAttributes) {
  EXPECT_EQ(attr_.device_cap_flags, 0x1a23c76u);
  EXPECT_TRUE(attr_.device_cap_flags & IBV_DEVICE_UD_AV_PORT_ENFORCE);
  EXPECT_TRUE(attr_.device_cap_flags & IBV_DEVICE_SRQ_RESIZE);
  EXPECT_EQ(attr_.max_pkeys, 64);
  ibv_port_attr port{};
  ASSERT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  EXPECT_EQ(port.max_mtu, IBV_MTU_4096);
  EXPECT_EQ(port.gid_tbl_len, 1024);
  EXPECT_EQ(port.active_width, 1);
  EXPECT_EQ(port.active_speed, 1);
  EXPECT_EQ(port.max_msg_sz, 8u << 20);
  EXPECT_EQ(port.max_vl_num, 1);
  // The table is that long; entries past the port's own read as zero.
  ibv_gid gid{};
  EXPECT_EQ(ibv_query_gid(ctx_, 1, 1000, &gid), 0);
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  EXPECT_EQ(ex.odp_caps.general_caps, 0u);
  EXPECT_EQ(ex.max_dm_size, 0u);
  EXPECT_EQ(ex.hca_core_clock, 0u);
  EXPECT_EQ(ex.completion_timestamp_mask, 0u);
}

// ---- memory ------------------------------------------------------------------------

TEST_F(Connectx, OdpDeviceMemoryAndTimestampsWork) {
  static char buf[4096];
  ibv_mr* mr = ibv_reg_mr(pd_, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  EXPECT_NE(mr, nullptr);
  if (mr) ibv_dereg_mr(mr);
  ibv_alloc_dm_attr dm_attr{};
  dm_attr.length = 64;
  ibv_dm* dm = ibv_alloc_dm(ctx_, &dm_attr);
  EXPECT_NE(dm, nullptr);
  if (dm) ibv_free_dm(dm);
  ibv_cq_init_attr_ex cq_attr{};
  cq_attr.cqe = 4;
  cq_attr.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
  ibv_cq_ex* cq = ibv_create_cq_ex(ctx_, &cq_attr);
  EXPECT_NE(cq, nullptr);
  if (cq) ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
}

TEST_F(Rxe, OdpDeviceMemoryAndTimestampsAreRefused) {
  static char buf[4096];
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_alloc_dm_attr dm_attr{};
  dm_attr.length = 64;
  errno = 0;
  EXPECT_EQ(ibv_alloc_dm(ctx_, &dm_attr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_cq_init_attr_ex cq_attr{};
  cq_attr.cqe = 4;
  cq_attr.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &cq_attr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(Connectx, LocalOnlyRegionHasAnRkey) {
  static char buf[4096];
  ibv_mr* mr = ibv_reg_mr(pd_, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(mr->rkey, mr->lkey);
  ibv_dereg_mr(mr);
}

TEST_F(Rxe, LocalOnlyRegionHasRkeyZero) {
  static char buf[4096];
  ibv_mr* mr = ibv_reg_mr(pd_, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(mr->rkey, 0u);
  EXPECT_NE(mr->lkey, 0u);
  ibv_dereg_mr(mr);
  mr = ibv_reg_mr(pd_, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(mr, nullptr);
  EXPECT_NE(mr->rkey, 0u);
  ibv_dereg_mr(mr);
}

// ---- posting before RTS ----------------------------------------------------------------

// ConnectX queues a receive in RESET and a send in INIT; a receive on an SRQ
// QP is refused with bad_wr naming it.
TEST_F(Connectx, PostingBeforeRtsQueues) {
  ibv_qp_init_attr init{};
  init.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = create_rc(&init);
  ASSERT_NE(qp, nullptr);
  ibv_recv_wr rwr{};
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &rwr, &rbad), 0);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  ibv_send_wr swr{};
  swr.opcode = IBV_WR_SEND;
  ibv_send_wr* sbad = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &swr, &sbad), 0);
  ibv_destroy_qp(qp);

  ibv_srq_init_attr si{};
  si.attr.max_wr = 4;
  si.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &si);
  ASSERT_NE(srq, nullptr);
  init.srq = srq;
  qp = create_rc(&init);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_post_recv(qp, &rwr, &rbad), EINVAL);
  EXPECT_EQ(rbad, &rwr);
  ibv_destroy_qp(qp);
  ibv_destroy_srq(srq);
}

// rxe refuses both (as SOFTVERBS_POST_BEFORE_RTS=refuse does) and leaves
// bad_wr as it was, also for a receive on an SRQ QP.
TEST_F(Rxe, PostingBeforeRtsIsRefusedWithoutBadWr) {
  ibv_qp_init_attr init{};
  init.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = create_rc(&init);
  ASSERT_NE(qp, nullptr);
  ibv_recv_wr rwr{};
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &rwr, &rbad), EINVAL);
  EXPECT_EQ(rbad, nullptr);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  ibv_send_wr swr{};
  swr.opcode = IBV_WR_SEND;
  ibv_send_wr* sbad = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &swr, &sbad), EINVAL);
  EXPECT_EQ(sbad, nullptr);
  ibv_destroy_qp(qp);

  ibv_srq_init_attr si{};
  si.attr.max_wr = 4;
  si.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &si);
  ASSERT_NE(srq, nullptr);
  init.srq = srq;
  qp = create_rc(&init);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_post_recv(qp, &rwr, &rbad), EINVAL);
  EXPECT_EQ(rbad, nullptr);
  ibv_destroy_qp(qp);
  ibv_destroy_srq(srq);
}

// SOFTVERBS_POST_BEFORE_RTS, when set, overrides the personality: run by
// conformance.personality.rxe_queue with SOFTVERBS_POST_BEFORE_RTS=queue.
TEST_F(Personality, RxeWithPostBeforeRtsQueueQueues) {
  ibv_qp_init_attr init{};
  init.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = create_rc(&init);
  ASSERT_NE(qp, nullptr);
  ibv_recv_wr rwr{};
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &rwr, &rbad), 0);
  ibv_destroy_qp(qp);
}

// ---- SRQ resize ------------------------------------------------------------------------

// Posts up to `count` receives to srq; the number accepted.
int post_srq_recvs(ibv_srq* srq, int count) {
  for (int i = 0; i < count; ++i) {
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<uint64_t>(i);
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_srq_recv(srq, &wr, &bad) != 0) return i;
  }
  return count;
}

TEST_F(Connectx, SrqResizeIsRefused) {
  ibv_srq_init_attr init{};
  init.attr.max_wr = 4;
  init.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &init);
  ASSERT_NE(srq, nullptr);
  ibv_srq_attr attr{};
  attr.max_wr = 64;
  EXPECT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), EINVAL);
  ibv_destroy_srq(srq);
}

// rxe resizes: the receives already posted stay, and the queue then holds the
// new depth (2^n - 1, as at creation); it cannot shrink below what it holds.
TEST_F(Rxe, SrqResizeKeepsTheReceivesPosted) {
  ibv_srq_init_attr init{};
  init.attr.max_wr = 4;
  init.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &init);
  ASSERT_NE(srq, nullptr);
  ASSERT_EQ(post_srq_recvs(srq, 7), 7);  // a ring of 7
  ibv_srq_attr attr{};
  attr.max_wr = 2;
  EXPECT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), EINVAL) << "below the 7 receives posted";
  attr.max_wr = 64;
  ASSERT_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), 0);
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.max_wr, 127u);
  EXPECT_EQ(post_srq_recvs(srq, 200), 120);  // 127 in all
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
