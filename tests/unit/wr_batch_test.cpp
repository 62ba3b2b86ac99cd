// The extended post API's handling of misuse (emu/qp/wr_batch.hpp): calls out of
// order, from the wrong thread, setters twice, missing or out of place, and the
// operations no emulated QP offers. mlx5 checks none of this and corrupts its queue; here each
// case changes nothing or fails the batch, and never touches memory it should not.
// Also the translation of each builder into the ibv_send_wr the post path takes.
#include <gtest/gtest.h>

#include <thread>

#include "emu/qp/qp.hpp"
#include "tests/unit/qp_harness.hpp"

namespace softverbs::emu {
namespace {

class WrBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EmuProvider& p = EmuProvider::instance();
    ctx_ = p.open_device(devs_.dev(0).ibv());
    ASSERT_NE(ctx_, nullptr);
    pd_ = p.alloc_pd(ctx_);
    cq_ = p.create_cq(ctx_, 16, nullptr, nullptr, 0);
    ASSERT_TRUE(pd_ && cq_);
    ud_ = create(IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
    rc_ = create(IBV_QPT_RC, 0, 8);
    ASSERT_TRUE(ud_ && rc_);
    // A UD QP reaches RTS without a peer, so an empty batch posts (0) and every
    // error below comes from the batch, not from the QP's state.
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = 0x1111;
    ASSERT_EQ(p.modify_qp(ud_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
    a.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(p.modify_qp(ud_, &a, IBV_QP_STATE), 0);
    a.qp_state = IBV_QPS_RTS;
    ASSERT_EQ(p.modify_qp(ud_, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
    x_ = p.qp_to_qp_ex(ud_);
    ASSERT_NE(x_, nullptr);
  }
  void TearDown() override {
    EmuProvider& p = EmuProvider::instance();
    if (ud_) p.destroy_qp(ud_);
    if (rc_) p.destroy_qp(rc_);
    if (cq_) p.destroy_cq(cq_);
    if (pd_) p.dealloc_pd(pd_);
    if (ctx_) p.close_device(ctx_);
  }

  ibv_qp* create(ibv_qp_type type, uint64_t ops, uint32_t depth = 4) {
    ibv_qp_init_attr_ex ex{};
    ex.qp_type = type;
    ex.send_cq = ex.recv_cq = cq_;
    ex.cap.max_send_wr = ex.cap.max_recv_wr = depth;
    ex.cap.max_send_sge = ex.cap.max_recv_sge = 1;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ex.pd = pd_;
    ex.send_ops_flags = ops;
    return EmuProvider::instance().create_qp_ex(ctx_, &ex);
  }
  // The work requests staged in qp's open batch (the calling thread's).
  static std::span<const ibv_send_wr> staged(ibv_qp* qp) { return Qp::from(qp)->batch()->wrs(); }
  // A complete UD send (with an address that is never resolved: not posted).
  void ud_send() {
    ibv_wr_send(x_);
    ibv_wr_set_sge(x_, 0, 0, 0);
    ibv_wr_set_ud_addr(x_, nullptr, 1, 1);
  }

  harness::TwoDevices devs_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* ud_ = nullptr;
  ibv_qp* rc_ = nullptr;
  ibv_qp_ex* x_ = nullptr;
};

TEST_F(WrBatchTest, EmptyBatchCompletes) {
  ibv_wr_start(x_);
  EXPECT_EQ(ibv_wr_complete(x_), 0);
}

TEST_F(WrBatchTest, CallsWithoutStartChangeNothing) {
  EXPECT_EQ(ibv_wr_complete(x_), EINVAL);
  ibv_wr_abort(x_);
  ud_send();
  ibv_wr_start(x_);
  EXPECT_TRUE(staged(ud_).empty()) << "a builder called before ibv_wr_start was kept";
  EXPECT_EQ(ibv_wr_complete(x_), 0);
  EXPECT_EQ(ibv_wr_complete(x_), EINVAL) << "complete twice";
}

TEST_F(WrBatchTest, SecondStartOnTheSameThreadFailsTheBatch) {
  ibv_wr_start(x_);
  ibv_wr_start(x_);
  EXPECT_EQ(ibv_wr_complete(x_), EINVAL);
  ibv_wr_start(x_);  // the QP is free again
  EXPECT_EQ(ibv_wr_complete(x_), 0);
}

TEST_F(WrBatchTest, SettersOutOfPlaceFailTheBatch) {
  struct Case {
    const char* what;
    void (*build)(ibv_qp_ex*);
  };
  const Case cases[] = {
      {"setter before any builder", [](ibv_qp_ex* x) { ibv_wr_set_sge(x, 0, 0, 0); }},
      {"no data setter", [](ibv_qp_ex* x) {
         ibv_wr_send(x);
         ibv_wr_set_ud_addr(x, nullptr, 1, 1);
       }},
      {"no UD address", [](ibv_qp_ex* x) {
         ibv_wr_send(x);
         ibv_wr_set_sge(x, 0, 0, 0);
       }},
      {"data set twice", [](ibv_qp_ex* x) {
         ibv_wr_send(x);
         ibv_wr_set_sge(x, 0, 0, 0);
         ibv_wr_set_inline_data(x, nullptr, 0);
         ibv_wr_set_ud_addr(x, nullptr, 1, 1);
       }},
      {"address set twice", [](ibv_qp_ex* x) {
         ibv_wr_send(x);
         ibv_wr_set_ud_addr(x, nullptr, 1, 1);
         ibv_wr_set_ud_addr(x, nullptr, 1, 1);
         ibv_wr_set_sge(x, 0, 0, 0);
       }},
      {"NULL SGE list", [](ibv_qp_ex* x) {
         ibv_wr_send(x);
         ibv_wr_set_sge_list(x, 1, nullptr);
       }},
      {"bind without bind_info", [](ibv_qp_ex* x) { ibv_wr_bind_mw(x, nullptr, 0, nullptr); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ibv_wr_start(x_);
    c.build(x_);
    EXPECT_EQ(ibv_wr_complete(x_), EINVAL);
  }
}

TEST_F(WrBatchTest, FirstErrorWins) {
  ibv_wr_start(x_);
  ibv_sge two[2] = {};
  ibv_wr_send(x_);
  ibv_wr_set_sge_list(x_, 2, two);  // max_send_sge is 1: ENOMEM, as mlx5
  ibv_wr_set_sge(x_, 0, 0, 0);      // data still missing, then set: no second error
  ibv_wr_set_sge(x_, 0, 0, 0);      // set twice: EINVAL, after the first
  EXPECT_EQ(ibv_wr_complete(x_), ENOMEM);
}

TEST_F(WrBatchTest, BatchDeeperThanTheQueueFailsAtTheBuilder) {
  ibv_wr_start(x_);
  for (int i = 0; i < 5; ++i) ud_send();
  EXPECT_EQ(staged(ud_).size(), 4u);
  EXPECT_EQ(ibv_wr_complete(x_), ENOMEM);
}

TEST_F(WrBatchTest, OperationsNoQpOffersFailWithEopnotsupp) {
  ibv_wr_start(x_);
  x_->wr_send_tso(x_, nullptr, 0, 0);
  EXPECT_EQ(ibv_wr_complete(x_), EOPNOTSUPP);
  ibv_wr_start(x_);
  uint64_t value = 0;
  ibv_wr_atomic_write(x_, 0, 0, &value);
  EXPECT_EQ(ibv_wr_complete(x_), EOPNOTSUPP);
}

// An SRQ number belongs to XRC_SEND work requests only (mlx5 sets the setter
// on XRC QPs alone): elsewhere it is a setter out of place.
TEST_F(WrBatchTest, XrcSrqnOnAnotherQpTypeFailsTheBatch) {
  ibv_wr_start(x_);
  ud_send();
  ibv_wr_set_xrc_srqn(x_, 1);
  EXPECT_EQ(ibv_wr_complete(x_), EINVAL);
}

TEST_F(WrBatchTest, OnlyTheStartingThreadBuilds) {
  ibv_wr_start(x_);
  ud_send();
  int other_complete = 0;
  std::thread t([&] {
    ud_send();
    ibv_wr_abort(x_);
    other_complete = ibv_wr_complete(x_);
  });
  t.join();
  EXPECT_EQ(other_complete, EINVAL);
  EXPECT_EQ(staged(ud_).size(), 1u) << "another thread's calls reached this thread's batch";
  ibv_wr_abort(x_);
}

// Each builder becomes the ibv_send_wr that ibv_post_send would take, with
// wr_id and wr_flags as they were at the builder's call.
TEST_F(WrBatchTest, BuildersTranslateToSendWorkRequests) {
  ibv_qp_ex* x = EmuProvider::instance().qp_to_qp_ex(rc_);
  ASSERT_NE(x, nullptr);
  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  ibv_wr_rdma_write(x, 0x1234, 0x5000);
  ibv_wr_set_sge(x, 7, 0x6000, 32);
  x->wr_id = 2;
  x->wr_flags = IBV_SEND_FENCE;
  ibv_wr_atomic_cmp_swp(x, 0x99, 0x7000, 5, 6);
  x->wr_id = 3;
  ibv_wr_local_inv(x, 0xabc);
  x->wr_id = 4;
  ibv_wr_send_inv(x, 0xdef);
  uint8_t byte = 1;
  ibv_wr_set_inline_data(x, &byte, 0);
  x->wr_id = 5;
  ibv_mw_bind_info info{};
  info.length = 64;
  ibv_wr_bind_mw(x, nullptr, 0x77, &info);
  std::span<const ibv_send_wr> w = staged(rc_);
  ASSERT_EQ(w.size(), 5u);
  EXPECT_EQ(w[0].wr_id, 1u);
  EXPECT_EQ(w[0].opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(w[0].send_flags, unsigned{IBV_SEND_SIGNALED}) << "the setter, not the flag, makes data inline";
  EXPECT_EQ(w[0].wr.rdma.rkey, 0x1234u);
  EXPECT_EQ(w[0].wr.rdma.remote_addr, 0x5000u);
  ASSERT_EQ(w[0].num_sge, 1);
  EXPECT_EQ(w[0].sg_list[0].addr, 0x6000u);
  EXPECT_EQ(w[0].sg_list[0].lkey, 7u);
  EXPECT_EQ(w[1].opcode, IBV_WR_ATOMIC_CMP_AND_SWP);
  EXPECT_EQ(w[1].send_flags, unsigned{IBV_SEND_FENCE});
  EXPECT_EQ(w[1].wr.atomic.compare_add, 5u);
  EXPECT_EQ(w[1].wr.atomic.swap, 6u);
  EXPECT_EQ(w[1].wr.atomic.rkey, 0x99u);
  EXPECT_EQ(w[2].opcode, IBV_WR_LOCAL_INV);
  EXPECT_EQ(w[2].invalidate_rkey, 0xabcu);
  EXPECT_EQ(w[3].opcode, IBV_WR_SEND_WITH_INV);
  EXPECT_EQ(w[3].invalidate_rkey, 0xdefu);
  EXPECT_TRUE(w[3].send_flags & IBV_SEND_INLINE);
  EXPECT_EQ(w[4].opcode, IBV_WR_BIND_MW);
  EXPECT_EQ(w[4].bind_mw.rkey, 0x77u);
  EXPECT_EQ(w[4].bind_mw.bind_info.length, 64u);
  ibv_wr_abort(x);
}

}  // namespace
}  // namespace softverbs::emu
