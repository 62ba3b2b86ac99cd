// UD multicast through the public verbs API (IBTA 10.5, RoCEv2 Annex A17): the
// errors of ibv_attach_mcast/ibv_detach_mcast, the limits, and a SEND to a
// group's address (DestQP 0xFFFFFF) reaching every QP attached to it, on both
// devices of this process, with the IPv4 header naming the group in the GRH
// area. Groups are 239.201.x.y, used by no other test.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <softverbs/faults.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <memory>
#include <vector>

namespace {

constexpr uint32_t kQkey = 0x01234567;
constexpr uint32_t kGrh = 40;
constexpr uint32_t kMcastQpn = 0xFFFFFF;

ibv_gid group_gid(const char* ipv4) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  inet_pton(AF_INET, ipv4, g.raw + 12);
  return g;
}

// One device opened, with a PD, a CQ and a buffer registered on it.
struct Dev {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(1 << 16);
  ibv_mr* mr = nullptr;

  explicit Dev(ibv_device* d) {
    ctx = ibv_open_device(d);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
    mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  }
  ~Dev() {
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }

  // create_flags != 0: created with ibv_create_qp_ex and those flags.
  ibv_qp* ud_qp(bool rts = true, uint32_t create_flags = 0) {
    ibv_qp_init_attr_ex ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_UD;
    ia.cap = {16, 16, 1, 1, 0};
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    ia.pd = pd;
    ia.create_flags = create_flags;
    ibv_qp* qp = create_flags ? ibv_create_qp_ex(ctx, &ia) : ibv_create_qp(pd, reinterpret_cast<ibv_qp_init_attr*>(&ia));
    if (!qp || !rts) return qp;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = kQkey;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return nullptr;
    a.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return nullptr;
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return nullptr;
    return qp;
  }

  // A receive of one message into slot `slot` (1 KiB slots from 32 KiB).
  void post_recv(ibv_qp* qp, int slot) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()) + 32768 + 1024u * slot, 1024, mr->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = static_cast<uint64_t>(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
  }

  // A SEND of 64 bytes to the group through a multicast address handle.
  int send_to_group(ibv_qp* qp, const ibv_gid& group, uint8_t fill) {
    ibv_ah_attr aa{};
    aa.is_global = 1;
    aa.grh.dgid = group;
    aa.grh.sgid_index = 1;
    aa.grh.hop_limit = 64;
    aa.port_num = 1;
    ibv_ah* ah = ibv_create_ah(pd, &aa);
    if (!ah) return errno;
    std::memset(buf.data(), fill, 64);
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 64, mr->lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = 1000;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = kMcastQpn;
    wr.wr.ud.remote_qkey = kQkey;
    int rc = ibv_post_send(qp, &wr, &bad);
    // The send completes when the packet is out; the AH may go then.
    ibv_wc wc{};
    if (rc == 0 && !next(&wc, 1000)) rc = ETIMEDOUT;
    ibv_destroy_ah(ah);
    return rc;
  }

  // The completion of wr_id (any if ~0), waiting up to ms.
  bool next(ibv_wc* out, uint64_t wr_id_or_any = ~0ull, int ms = 5000) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      ibv_wc wc;
      while (ibv_poll_cq(cq, 1, &wc) == 1) pending.push_back(wc);
      for (auto it = pending.begin(); it != pending.end(); ++it)
        if (wr_id_or_any == ~0ull || it->wr_id == wr_id_or_any) {
          *out = *it;
          pending.erase(it);
          return true;
        }
      if (std::chrono::steady_clock::now() >= end) return false;
    }
  }
  // Completions of receives on qp collected so far (after polling once more).
  int received_on(ibv_qp* qp) {
    ibv_wc wc;
    while (ibv_poll_cq(cq, 1, &wc) == 1) pending.push_back(wc);
    int n = 0;
    for (auto& w : pending) n += w.qp_num == qp->qp_num && w.opcode == IBV_WC_RECV;
    return n;
  }
  // Takes the receive completion of qp, waiting up to ms.
  bool recv_of(ibv_qp* qp, ibv_wc* out, int ms = 5000) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      ibv_wc wc;
      while (ibv_poll_cq(cq, 1, &wc) == 1) pending.push_back(wc);
      for (auto it = pending.begin(); it != pending.end(); ++it)
        if (it->qp_num == qp->qp_num && it->opcode == IBV_WC_RECV) {
          *out = *it;
          pending.erase(it);
          return true;
        }
      if (std::chrono::steady_clock::now() >= end) return false;
    }
  }
  std::vector<ibv_wc> pending;
};

class Mcast : public ::testing::Test {
 protected:
  void SetUp() override {
    list_ = ibv_get_device_list(&n_);
    ASSERT_NE(list_, nullptr);
    ASSERT_GE(n_, 2) << "needs SOFTVERBS_DEVICES with two devices";
    a_ = std::make_unique<Dev>(list_[0]);
    b_ = std::make_unique<Dev>(list_[1]);
    ASSERT_TRUE(a_->mr && b_->mr);
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    ibv_free_device_list(list_);
  }
  ibv_device** list_ = nullptr;
  int n_ = 0;
  std::unique_ptr<Dev> a_, b_;
};

TEST_F(Mcast, AttachChecksTheQpTypeAndTheGid) {
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = a_->cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {4, 4, 1, 1, 0};
  ibv_qp* rc = ibv_create_qp(a_->pd, &ia);
  ASSERT_NE(rc, nullptr);
  const ibv_gid g = group_gid("239.201.0.1");
  EXPECT_EQ(ibv_attach_mcast(rc, &g, 0), EINVAL) << "only UD QPs join groups";
  EXPECT_EQ(ibv_detach_mcast(rc, &g, 0), EINVAL);
  ibv_qp* ud = a_->ud_qp(false);
  ASSERT_NE(ud, nullptr);
  ibv_gid unicast = group_gid("127.0.0.1");
  EXPECT_EQ(ibv_attach_mcast(ud, &unicast, 0), EINVAL) << "not a multicast GID";
  ibv_gid zero{};
  EXPECT_EQ(ibv_attach_mcast(ud, &zero, 0), EINVAL);
  EXPECT_EQ(ibv_detach_mcast(ud, &g, 0), EINVAL) << "not attached";
  // A QP in RESET may attach (the kernel does not look at the state); an IPv6
  // multicast GID (ff0e::/16) is a group too; on RoCE the LID is not checked.
  EXPECT_EQ(ibv_attach_mcast(ud, &g, 0), 0);
  EXPECT_EQ(ibv_attach_mcast(ud, &g, 0), 0) << "attaching again is a no-op";
  ibv_gid v6{};
  v6.raw[0] = 0xff;
  v6.raw[1] = 0x0e;
  v6.raw[15] = 1;
  EXPECT_EQ(ibv_attach_mcast(ud, &v6, 0x1234), 0);
  EXPECT_EQ(ibv_detach_mcast(ud, &v6, 0), EINVAL) << "attached with another LID";
  EXPECT_EQ(ibv_detach_mcast(ud, &v6, 0x1234), 0);
  EXPECT_EQ(ibv_destroy_qp(ud), EBUSY) << "the kernel keeps an attached QP";
  EXPECT_EQ(ibv_detach_mcast(ud, &g, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(ud, &g, 0), EINVAL) << "detached twice";
  EXPECT_EQ(ibv_destroy_qp(ud), 0);
  EXPECT_EQ(ibv_destroy_qp(rc), 0);
}

TEST_F(Mcast, AttachBeyondMaxMcastQpAttachIsEnomem) {
  ibv_device_attr da{};
  ASSERT_EQ(ibv_query_device(a_->ctx, &da), 0);
  ASSERT_GT(da.max_mcast_qp_attach, 0);
  ASSERT_LE(da.max_mcast_qp_attach, 1024) << "too many QPs for this test";
  const ibv_gid g = group_gid("239.201.0.2");
  std::vector<ibv_qp*> qps;
  for (int i = 0; i <= da.max_mcast_qp_attach; ++i) {
    ibv_qp* qp = a_->ud_qp(false);
    ASSERT_NE(qp, nullptr);
    qps.push_back(qp);
  }
  for (int i = 0; i < da.max_mcast_qp_attach; ++i) ASSERT_EQ(ibv_attach_mcast(qps[i], &g, 0), 0) << i;
  EXPECT_EQ(ibv_attach_mcast(qps.back(), &g, 0), ENOMEM) << "the group is full (mlx5: ENOMEM)";
  EXPECT_EQ(ibv_detach_mcast(qps[0], &g, 0), 0);
  EXPECT_EQ(ibv_attach_mcast(qps.back(), &g, 0), 0) << "room again after a detach";
  for (size_t i = 1; i < qps.size(); ++i) EXPECT_EQ(ibv_detach_mcast(qps[i], &g, 0), 0);
  for (ibv_qp* qp : qps) EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

// One SEND to the group reaches the QPs attached on both devices, the sender
// too if it is attached (multicast loopback, as mlx5 and rxe); a QP not
// attached gets nothing, and a detached QP nothing more.
TEST_F(Mcast, SendReachesEveryAttachedQpOnBothDevices) {
  const ibv_gid g = group_gid("239.201.0.3");
  ibv_qp* sender = a_->ud_qp();
  ibv_qp* a1 = a_->ud_qp();
  ibv_qp* b1 = b_->ud_qp();
  ibv_qp* b2 = b_->ud_qp();
  ibv_qp* bystander = b_->ud_qp();
  ASSERT_TRUE(sender && a1 && b1 && b2 && bystander);
  for (ibv_qp* qp : {sender, a1, b1, b2}) ASSERT_EQ(ibv_attach_mcast(qp, &g, 0), 0);
  for (int slot = 0; slot < 2; ++slot) {
    ASSERT_NO_FATAL_FAILURE(a_->post_recv(sender, slot));
    ASSERT_NO_FATAL_FAILURE(a_->post_recv(a1, 4 + slot));
    ASSERT_NO_FATAL_FAILURE(b_->post_recv(b1, slot));
    ASSERT_NO_FATAL_FAILURE(b_->post_recv(b2, 4 + slot));
    ASSERT_NO_FATAL_FAILURE(b_->post_recv(bystander, 8 + slot));
  }
  ASSERT_EQ(a_->send_to_group(sender, g, 0x5a), 0);
  for (auto [dev, qp] : {std::pair{a_.get(), sender}, {a_.get(), a1}, {b_.get(), b1}, {b_.get(), b2}}) {
    ibv_wc wc{};
    ASSERT_TRUE(dev->recv_of(qp, &wc)) << "QP " << qp->qp_num << " got nothing";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.byte_len, kGrh + 64);
    EXPECT_EQ(wc.src_qp, sender->qp_num) << "the sending QP, not the multicast QPN";
    EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
    const uint8_t* m = dev->buf.data() + 32768 + 1024 * wc.wr_id;
    EXPECT_EQ(m[kGrh], 0x5a);
    EXPECT_EQ(m[kGrh + 63], 0x5a);
    // The IPv4 header in the GRH area: from the sending device, to the group.
    EXPECT_EQ(m[20] >> 4, 4);
    EXPECT_EQ(std::memcmp(m + 20 + 16, g.raw + 12, 4), 0) << "destination is not the group";
    ibv_gid from{};
    ASSERT_EQ(ibv_query_gid(a_->ctx, 1, 1, &from), 0);
    EXPECT_EQ(std::memcmp(m + 20 + 12, from.raw + 12, 4), 0) << "source is not the sending device";
  }
  // b1 and b2 get their copies from the same delivery: the bystander's would
  // have come with them.
  EXPECT_EQ(b_->received_on(bystander), 0) << "a QP not attached received a multicast";

  ASSERT_EQ(ibv_detach_mcast(b1, &g, 0), 0);
  ASSERT_EQ(a_->send_to_group(sender, g, 0x6b), 0);
  ibv_wc wc{};
  ASSERT_TRUE(b_->recv_of(b2, &wc));
  EXPECT_EQ(b_->buf[32768 + 1024 * wc.wr_id + kGrh], 0x6b);
  EXPECT_EQ(b_->received_on(b1), 0) << "a detached QP still receives";
  ASSERT_TRUE(a_->recv_of(a1, &wc));
  ASSERT_TRUE(a_->recv_of(sender, &wc));

  for (ibv_qp* qp : {sender, a1, b2}) EXPECT_EQ(ibv_detach_mcast(qp, &g, 0), 0);
  for (ibv_qp* qp : {sender, a1, b1, b2, bystander}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

// IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: the QP created with it does not get the
// datagrams it sends itself, while every other attached QP does: one of the same
// context, one of another context of the same device, one of the other device.
// It still gets what other QPs send to the group.
TEST_F(Mcast, BlockSelfMulticastLoopbackSkipsOnlyTheSender) {
  const ibv_gid g = group_gid("239.201.0.6");
  Dev a2(list_[0]);  // a second context of device a
  ASSERT_TRUE(a2.mr);
  ibv_qp* sender = a_->ud_qp(true, IBV_QP_CREATE_BLOCK_SELF_MCAST_LB);
  ASSERT_NE(sender, nullptr) << std::strerror(errno);
  ibv_qp* a1 = a_->ud_qp();
  ibv_qp* other_ctx = a2.ud_qp();
  ibv_qp* b1 = b_->ud_qp();
  ASSERT_TRUE(a1 && other_ctx && b1);
  for (ibv_qp* qp : {sender, a1, other_ctx, b1}) ASSERT_EQ(ibv_attach_mcast(qp, &g, 0), 0);
  for (int slot = 0; slot < 2; ++slot) {
    ASSERT_NO_FATAL_FAILURE(a_->post_recv(sender, slot));
    ASSERT_NO_FATAL_FAILURE(a_->post_recv(a1, 4 + slot));
    ASSERT_NO_FATAL_FAILURE(a2.post_recv(other_ctx, slot));
    ASSERT_NO_FATAL_FAILURE(b_->post_recv(b1, slot));
  }
  ASSERT_EQ(a_->send_to_group(sender, g, 0x71), 0);
  ibv_wc wc{};
  ASSERT_TRUE(a_->recv_of(a1, &wc)) << "another QP of the sender's context";
  EXPECT_EQ(a_->buf[32768 + 1024 * wc.wr_id + kGrh], 0x71);
  ASSERT_TRUE(a2.recv_of(other_ctx, &wc)) << "a QP of another context of the device";
  EXPECT_EQ(a2.buf[32768 + 1024 * wc.wr_id + kGrh], 0x71);
  ASSERT_TRUE(b_->recv_of(b1, &wc)) << "a QP of the other device";
  // The sender's copy would have come in the same delivery as a1's.
  EXPECT_EQ(a_->received_on(sender), 0) << "the blocking QP received its own datagram";

  // What another QP sends still reaches the blocking QP, and a1 gets its own.
  ASSERT_EQ(a_->send_to_group(a1, g, 0x72), 0);
  ASSERT_TRUE(a_->recv_of(sender, &wc)) << "blocking is of the QP's own datagrams only";
  EXPECT_EQ(wc.src_qp, a1->qp_num);
  EXPECT_EQ(a_->buf[32768 + 1024 * wc.wr_id + kGrh], 0x72);
  ASSERT_TRUE(a_->recv_of(a1, &wc)) << "a QP without the flag gets its own datagram";
  ASSERT_TRUE(a2.recv_of(other_ctx, &wc));
  ASSERT_TRUE(b_->recv_of(b1, &wc));

  for (ibv_qp* qp : {sender, a1, other_ctx, b1}) EXPECT_EQ(ibv_detach_mcast(qp, &g, 0), 0);
  for (ibv_qp* qp : {sender, a1, other_ctx, b1}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

// Packet faults see multicast packets: a drop on the sending side loses the
// frame for every member; a drop on one receiving device loses only its copy.
TEST_F(Mcast, PacketFaultsApplyToTheFrameAndToEachCopy) {
  const ibv_gid g = group_gid("239.201.0.5");
  ibv_qp* sender = a_->ud_qp();
  ibv_qp* a1 = a_->ud_qp();
  ibv_qp* b1 = b_->ud_qp();
  ASSERT_TRUE(sender && a1 && b1);
  for (ibv_qp* qp : {a1, b1}) ASSERT_EQ(ibv_attach_mcast(qp, &g, 0), 0);
  for (int slot = 0; slot < 3; ++slot) {
    ASSERT_NO_FATAL_FAILURE(a_->post_recv(a1, slot));
    ASSERT_NO_FATAL_FAILURE(b_->post_recv(b1, slot));
  }
  const std::string scenario = std::string("[[rule]]\nname = \"mc-tx\"\ndirection = \"tx\"\ndevice = \"") +
                               ibv_get_device_name(list_[0]) +
                               "\"\nqpn = 16777215\ncount = 1\naction = \"drop\"\n"
                               "[[rule]]\nname = \"mc-rx\"\ndirection = \"rx\"\ndevice = \"" +
                               ibv_get_device_name(list_[1]) + "\"\nqpn = 16777215\nnth = 1\naction = \"drop\"\n";
  char err[256] = {};
  ASSERT_EQ(softverbs_faults_load(scenario.c_str(), err, sizeof err), 0) << err;
  ASSERT_EQ(a_->send_to_group(sender, g, 0x11), 0);  // dropped on the sender's wire
  ASSERT_EQ(a_->send_to_group(sender, g, 0x22), 0);  // b's copy dropped on arrival
  ASSERT_EQ(a_->send_to_group(sender, g, 0x33), 0);
  ibv_wc wc{};
  ASSERT_TRUE(a_->recv_of(a1, &wc));
  EXPECT_EQ(a_->buf[32768 + 1024 * wc.wr_id + kGrh], 0x22) << "the first frame should be lost for every member";
  ASSERT_TRUE(a_->recv_of(a1, &wc));
  EXPECT_EQ(a_->buf[32768 + 1024 * wc.wr_id + kGrh], 0x33);
  ASSERT_TRUE(b_->recv_of(b1, &wc));
  EXPECT_EQ(b_->buf[32768 + 1024 * wc.wr_id + kGrh], 0x33) << "b's copy of the second should be lost";
  EXPECT_EQ(b_->received_on(b1), 0);
  EXPECT_EQ(softverbs_fault_hits("mc-tx"), 1u);
  EXPECT_EQ(softverbs_fault_hits("mc-rx"), 1u);
  softverbs_faults_clear();
  for (ibv_qp* qp : {a1, b1}) EXPECT_EQ(ibv_detach_mcast(qp, &g, 0), 0);
  for (ibv_qp* qp : {sender, a1, b1}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

// A group with no member on the host: the SEND completes, nobody receives.
TEST_F(Mcast, SendToAnEmptyGroupCompletes) {
  ibv_qp* sender = a_->ud_qp();
  ASSERT_NE(sender, nullptr);
  EXPECT_EQ(a_->send_to_group(sender, group_gid("239.201.0.4"), 1), 0);
  EXPECT_EQ(ibv_destroy_qp(sender), 0);
}

}  // namespace
