// The extended post API (ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
// ibv_qp_to_qp_ex, ibv_wr_*; man page ibv_wr_post(3)): which operations each QP
// type takes, every operation over RC (and UC, UD where the service has it) with
// its data and completions, SGE lists, inline data, batches, and the errors a
// batch reports (as ConnectX reports them: the first error of a batch is
// returned by ibv_wr_complete, and nothing of the batch is posted).
#include <arpa/inet.h>

#include <cstring>
#include <thread>
#include <vector>

#include "datapath.hpp"

namespace conformance {
namespace {

constexpr uint8_t kFill = 0xee;
constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kGrh = 40;

constexpr uint64_t kRcOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                            IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                            IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
constexpr uint64_t kUcOps =
    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
constexpr uint64_t kUdOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;

class WrApiTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &src_));
    ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &dst_));
    std::memset(dst_.data(), kFill, dst_.size());
  }
  void TearDown() override {
    p_.reset();
    src_ = Region{};
    dst_ = Region{};
    DataPathTest::TearDown();
  }

  void make(ibv_qp_type type, uint64_t ops, PairOptions o = {}) {
    o.type = type;
    o.extended = true;
    o.send_ops_flags = ops;
    ASSERT_NO_FATAL_FAILURE(make_pair(o, &p_));
  }

  // ibv_create_qp_ex on this fixture's PD and a fresh CQ: the QP or NULL/errno.
  ibv_qp* create_ex(ibv_qp_type type, uint64_t ops, ibv_cq* cq) {
    ibv_qp_init_attr_ex ex{};
    ex.qp_type = type;
    ex.send_cq = ex.recv_cq = cq;
    ex.cap.max_send_wr = ex.cap.max_recv_wr = 4;
    ex.cap.max_send_sge = ex.cap.max_recv_sge = 1;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ex.pd = pd_;
    ex.send_ops_flags = ops;
    return ibv_create_qp_ex(ctx_, &ex);
  }

  // One signaled completion of A's send CQ, checked.
  void expect_send_wc(uint64_t wr_id, ibv_wc_opcode op, uint32_t len) {
    std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    WcExpect e(wr_id, op, p_.a.qpn());
    if (op == IBV_WC_RDMA_READ || op == IBV_WC_COMP_SWAP || op == IBV_WC_FETCH_ADD) e.len(len);
    check_wc(wc[0], e);
  }

  ibv_qp_ex* a() { return p_.a.qpx; }
  uint64_t& remote64(size_t off) { return *reinterpret_cast<uint64_t*>(dst_.data() + off); }
  uint64_t& local64(size_t off) { return *reinterpret_cast<uint64_t*>(src_.data() + off); }

  Region src_;
  Region dst_;
  Pair p_;
};
CONFORMANCE_INSTANTIATE(WrApiTest);

// ---- ibv_create_qp_ex and ibv_qp_to_qp_ex ------------------------------------

TEST_P(WrApiTest, CreateQpExTakesEveryOperationOfItsQpType) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  for (auto [type, ops] : {std::pair{IBV_QPT_RC, kRcOps}, std::pair{IBV_QPT_UC, kUcOps}, std::pair{IBV_QPT_UD, kUdOps},
                           std::pair{IBV_QPT_RC, uint64_t{0}}}) {
    SCOPED_TRACE(qp_type_name(type));
    Qp qp(create_ex(type, ops, cq.get()));
    ASSERT_TRUE(qp) << std::strerror(errno);
    ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp.get());
    ASSERT_NE(qpx, nullptr);
    // The ibv_qp is the ibv_qp_ex's first member.
    EXPECT_EQ(static_cast<void*>(&qpx->qp_base), static_cast<void*>(qp.get()));
    EXPECT_NE(qpx->wr_start, nullptr);
    EXPECT_NE(qpx->wr_complete, nullptr);
    EXPECT_NE(qpx->wr_abort, nullptr);
    EXPECT_NE(qpx->wr_send, nullptr);
    EXPECT_NE(qpx->wr_send_imm, nullptr);
    EXPECT_NE(qpx->wr_set_sge, nullptr);
    EXPECT_NE(qpx->wr_set_sge_list, nullptr);
    EXPECT_NE(qpx->wr_set_inline_data, nullptr);
    EXPECT_NE(qpx->wr_set_inline_data_list, nullptr);
    if (type != IBV_QPT_UD) {
      EXPECT_NE(qpx->wr_rdma_write, nullptr);
      EXPECT_NE(qpx->wr_rdma_write_imm, nullptr);
    } else {
      EXPECT_NE(qpx->wr_set_ud_addr, nullptr);
    }
    if (type == IBV_QPT_RC) {
      EXPECT_NE(qpx->wr_rdma_read, nullptr);
      EXPECT_NE(qpx->wr_atomic_cmp_swp, nullptr);
      EXPECT_NE(qpx->wr_atomic_fetch_add, nullptr);
    }
  }
}

TEST_P(WrApiTest, QpWithoutSendOpsFlagsHasNoQpEx) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  EXPECT_EQ(ibv_qp_to_qp_ex(qp.get()), nullptr);
}

// mlx5 refuses, with EOPNOTSUPP, every operation its per-type table lacks: reads
// and atomics on UC, all but sends on UD, TSO (raw packet QPs only), atomic
// write, and bits no rdma-core defines.
TEST_P(WrApiTest, CreateQpExRefusesOperationsTheQpTypeLacks) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  struct Case {
    ibv_qp_type type;
    uint64_t ops;
    const char* what;
  };
  const Case cases[] = {
      {IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ, "UC read"},
      {IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, "UC compare and swap"},
      {IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, "UC fetch and add"},
      {IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE, "UD write"},
      {IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ, "UD send and read"},
      {IBV_QPT_UD, IBV_QP_EX_WITH_SEND_WITH_INV, "UD send with invalidate"},
      {IBV_QPT_RC, IBV_QP_EX_WITH_TSO, "RC TSO"},
      {IBV_QPT_UD, IBV_QP_EX_WITH_TSO, "UD TSO"},
      {IBV_QPT_RC, IBV_QP_EX_WITH_ATOMIC_WRITE, "RC atomic write"},
      {IBV_QPT_RC, IBV_QP_EX_WITH_SEND | (uint64_t{1} << 40), "RC unknown bit"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    errno = 0;
    ibv_qp* qp = create_ex(c.type, c.ops, cq.get());
    EXPECT_EQ(qp, nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP) << errno_name(errno);
    if (qp) ibv_destroy_qp(qp);
  }
}

// ---- every operation ------------------------------------------------------------

TEST_P(WrApiTest, RdmaWriteAndWriteWithImmRc) {
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps));
  fill_pattern(src_.data(), 3000, 1);
  ibv_wr_start(a());
  a()->wr_id = 11;
  a()->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr());
  ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 3000);
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  ASSERT_NO_FATAL_FAILURE(expect_send_wc(11, IBV_WC_RDMA_WRITE, 3000));
  EXPECT_EQ(first_pattern_mismatch(dst_.data(), 3000, 1), -1);
  EXPECT_EQ(first_byte_not(dst_.data() + 3000, 64, kFill), -1);

  // With immediate: B's receive completes with the data, no bytes placed there.
  ibv_sge rs = src_.sge(32 * 1024, 16);
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p_.b.qp.get(), 21, &rs, 1));
  fill_pattern(src_.data(), 100, 2);
  ibv_wr_start(a());
  a()->wr_id = 12;
  a()->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write_imm(a(), dst_.rkey(), dst_.addr(4096), htonl(0xfeed));
  ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 100);
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  ASSERT_NO_FATAL_FAILURE(expect_send_wc(12, IBV_WC_RDMA_WRITE, 100));
  std::vector<ibv_wc> wc = expect_wcs(p_.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(21, IBV_WC_RECV_RDMA_WITH_IMM, p_.b.qpn()).len(100).imm(htonl(0xfeed)));
  EXPECT_EQ(first_pattern_mismatch(dst_.data() + 4096, 100, 2), -1);
}

TEST_P(WrApiTest, SendAndSendWithImmRc) {
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps));
  for (bool imm : {false, true}) {
    SCOPED_TRACE(imm ? "SEND with immediate" : "SEND");
    ibv_sge rs = dst_.sge(0, 2048);
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(p_.b.qp.get(), 30 + imm, &rs, 1));
    fill_pattern(src_.data(), 1500, 3 + imm);
    ibv_wr_start(a());
    a()->wr_id = 40 + imm;
    a()->wr_flags = IBV_SEND_SIGNALED;
    if (imm)
      ibv_wr_send_imm(a(), htonl(0x1234));
    else
      ibv_wr_send(a());
    ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 1500);
    ASSERT_EQ(ibv_wr_complete(a()), 0);
    ASSERT_NO_FATAL_FAILURE(expect_send_wc(40 + imm, IBV_WC_SEND, 1500));
    std::vector<ibv_wc> wc = expect_wcs(p_.b.rcq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    WcExpect e(30 + imm, IBV_WC_RECV, p_.b.qpn());
    e.len(1500);
    if (imm) e.imm(htonl(0x1234));
    check_wc(wc[0], e);
    EXPECT_EQ(first_pattern_mismatch(dst_.data(), 1500, 3 + imm), -1);
  }
}

TEST_P(WrApiTest, RdmaReadRc) {
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps));
  fill_pattern(dst_.data(), 5000, 5);
  std::memset(src_.data(), kFill, 6000);
  ibv_wr_start(a());
  a()->wr_id = 50;
  a()->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_read(a(), dst_.rkey(), dst_.addr());
  ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 5000);
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  ASSERT_NO_FATAL_FAILURE(expect_send_wc(50, IBV_WC_RDMA_READ, 5000));
  EXPECT_EQ(first_pattern_mismatch(src_.data(), 5000, 5), -1);
  EXPECT_EQ(first_byte_not(src_.data() + 5000, 64, kFill), -1);
}

TEST_P(WrApiTest, AtomicsRc) {
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps));
  remote64(64) = 100;
  // Compare and swap that matches, then one that does not.
  ibv_wr_start(a());
  a()->wr_id = 60;
  a()->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_cmp_swp(a(), dst_.rkey(), dst_.addr(64), 100, 200);
  ibv_wr_set_sge(a(), src_.lkey(), src_.addr(0), 8);
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  ASSERT_NO_FATAL_FAILURE(expect_send_wc(60, IBV_WC_COMP_SWAP, 8));
  EXPECT_EQ(local64(0), 100u);
  EXPECT_EQ(remote64(64), 200u);
  ibv_wr_start(a());
  a()->wr_id = 61;
  ibv_wr_atomic_cmp_swp(a(), dst_.rkey(), dst_.addr(64), 100, 300);
  ibv_wr_set_sge(a(), src_.lkey(), src_.addr(8), 8);
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  ASSERT_NO_FATAL_FAILURE(expect_send_wc(61, IBV_WC_COMP_SWAP, 8));
  EXPECT_EQ(local64(8), 200u);
  EXPECT_EQ(remote64(64), 200u);
  // Fetch and add.
  ibv_wr_start(a());
  a()->wr_id = 62;
  ibv_wr_atomic_fetch_add(a(), dst_.rkey(), dst_.addr(64), 5);
  ibv_wr_set_sge(a(), src_.lkey(), src_.addr(16), 8);
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  ASSERT_NO_FATAL_FAILURE(expect_send_wc(62, IBV_WC_FETCH_ADD, 8));
  EXPECT_EQ(local64(16), 200u);
  EXPECT_EQ(remote64(64), 205u);
}

TEST_P(WrApiTest, WriteAndSendUc) {
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_UC, kUcOps));
  fill_pattern(src_.data(), 2000, 7);
  ibv_sge rs = dst_.sge(8192, 16);
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p_.b.qp.get(), 70, &rs, 1));
  // A write, then a send with immediate behind it in the same batch: the
  // receive completing means the write before it has landed.
  ibv_wr_start(a());
  a()->wr_id = 71;
  a()->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr());
  ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 2000);
  a()->wr_id = 72;
  ibv_wr_send_imm(a(), htonl(77));
  ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 0);
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  check_wc(wc[0], WcExpect(71, IBV_WC_RDMA_WRITE, p_.a.qpn()));
  check_wc(wc[1], WcExpect(72, IBV_WC_SEND, p_.a.qpn()));
  wc = expect_wcs(p_.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(70, IBV_WC_RECV, p_.b.qpn()).len(0).imm(htonl(77)));
  EXPECT_EQ(first_pattern_mismatch(dst_.data(), 2000, 7), -1);
}

TEST_P(WrApiTest, SendAndSendWithImmUd) {
  PairOptions o;
  o.type = IBV_QPT_UD;
  o.extended = true;
  o.send_ops_flags = kUdOps;
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &p_.a));
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &p_.b));
  ASSERT_EQ(move_to(p_.a.qp.get(), IBV_QPS_RTS), 0);
  ASSERT_EQ(move_to(p_.b.qp.get(), IBV_QPS_RTS), 0);
  ibv_ah_attr ah_attr = loopback_ah_attr();
  Ah ah(ibv_create_ah(pd_, &ah_attr));
  ASSERT_TRUE(ah) << std::strerror(errno);
  for (bool imm : {false, true}) {
    SCOPED_TRACE(imm ? "SEND with immediate" : "SEND");
    std::memset(dst_.data(), kFill, 1024);
    ibv_sge rs = dst_.sge(0, kGrh + 512);
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(p_.b.qp.get(), 80 + imm, &rs, 1));
    fill_pattern(src_.data(), 512, 8 + imm);
    ibv_wr_start(a());
    a()->wr_id = 90 + imm;
    a()->wr_flags = IBV_SEND_SIGNALED;
    if (imm)
      ibv_wr_send_imm(a(), htonl(0xabcd));
    else
      ibv_wr_send(a());
    // The two setters of a UD work request, in either order.
    if (imm) {
      ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 512);
      ibv_wr_set_ud_addr(a(), ah.get(), p_.b.qpn(), kQkey);
    } else {
      ibv_wr_set_ud_addr(a(), ah.get(), p_.b.qpn(), kQkey);
      ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 512);
    }
    ASSERT_EQ(ibv_wr_complete(a()), 0);
    ASSERT_NO_FATAL_FAILURE(expect_send_wc(90 + imm, IBV_WC_SEND, 512));
    std::vector<ibv_wc> wc = expect_wcs(p_.b.rcq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS) << describe(wc[0]);
    EXPECT_EQ(wc[0].wr_id, 80u + imm);
    EXPECT_EQ(wc[0].byte_len, kGrh + 512);
    EXPECT_EQ(wc[0].src_qp, p_.a.qpn());
    if (imm) {
      EXPECT_TRUE(wc[0].wc_flags & IBV_WC_WITH_IMM);
      EXPECT_EQ(wc[0].imm_data, htonl(0xabcd));
    }
    EXPECT_EQ(first_pattern_mismatch(dst_.data() + kGrh, 512, 8 + imm), -1);
  }
  ah.reset();
}

// ---- SGE lists, inline data, batches ------------------------------------------

TEST_P(WrApiTest, SgeListGathersRc) {
  const uint32_t sges = std::min<uint32_t>(usable_sges(IBV_QPT_RC, true, 4), 4);
  PairOptions o;
  o.max_send_sge = sges;
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps, o));
  fill_pattern(src_.data(), 16 * 1024, 9);
  // Pieces from separate places of src_, written back to back at dst_.
  std::vector<ibv_sge> list;
  uint32_t total = 0;
  for (uint32_t i = 0; i < sges; ++i) {
    list.push_back(src_.sge(i * 4096, 1000 + i));
    total += 1000 + i;
  }
  ibv_wr_start(a());
  a()->wr_id = 100;
  a()->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr());
  ibv_wr_set_sge_list(a(), list.size(), list.data());
  list.assign(list.size(), ibv_sge{});  // the list was copied at the call
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  ASSERT_NO_FATAL_FAILURE(expect_send_wc(100, IBV_WC_RDMA_WRITE, total));
  size_t at = 0;
  for (uint32_t i = 0; i < sges; ++i) {
    for (uint32_t k = 0; k < 1000 + i; ++k)
      ASSERT_EQ(dst_.data()[at + k], pattern_byte(i * 4096 + k, 9)) << "piece " << i << " byte " << k;
    at += 1000 + i;
  }
  EXPECT_EQ(first_byte_not(dst_.data() + total, 64, kFill), -1);
}

TEST_P(WrApiTest, InlineDataIsCopiedAtTheCallRc) {
  PairOptions o;
  o.max_inline_data = 64;
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps, o));
  uint8_t one[40];
  uint8_t two[20];
  std::memset(one, 0x11, sizeof one);
  std::memset(two, 0x22, sizeof two);
  ibv_wr_start(a());
  a()->wr_id = 110;
  a()->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr());
  ibv_wr_set_inline_data(a(), one, sizeof one);
  a()->wr_id = 111;
  ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr(100));
  const ibv_data_buf bufs[] = {{one, 8}, {two, sizeof two}};
  ibv_wr_set_inline_data_list(a(), 2, bufs);
  // The buffers may be reused as soon as the setter returns.
  std::memset(one, 0x99, sizeof one);
  std::memset(two, 0x99, sizeof two);
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  check_wc(wc[0], WcExpect(110, IBV_WC_RDMA_WRITE, p_.a.qpn()));
  check_wc(wc[1], WcExpect(111, IBV_WC_RDMA_WRITE, p_.a.qpn()));
  EXPECT_EQ(first_byte_not(dst_.data(), 40, 0x11), -1);
  EXPECT_EQ(first_byte_not(dst_.data() + 40, 60, kFill), -1);
  EXPECT_EQ(first_byte_not(dst_.data() + 100, 8, 0x11), -1);
  EXPECT_EQ(first_byte_not(dst_.data() + 108, 20, 0x22), -1);
  EXPECT_EQ(first_byte_not(dst_.data() + 128, 64, kFill), -1);
}

// Many work requests in one batch, signaled or not as wr_flags says at each
// builder: they run in order and only the signaled ones complete.
TEST_P(WrApiTest, ManyWorkRequestsInOneBatchRc) {
  constexpr int kCount = 48;
  PairOptions o;
  o.max_send_wr = 64;
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps, o));
  fill_pattern(src_.data(), kCount * 256, 12);
  ibv_wr_start(a());
  for (int i = 0; i < kCount; ++i) {
    a()->wr_id = 1000 + i;
    a()->wr_flags = i % 4 == 3 ? IBV_SEND_SIGNALED : 0;
    ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr(i * 256));
    ibv_wr_set_sge(a(), src_.lkey(), src_.addr(i * 256), 256);
  }
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), kCount / 4);
  ASSERT_EQ(wc.size(), static_cast<size_t>(kCount / 4));
  for (int k = 0; k < kCount / 4; ++k) check_wc(wc[k], WcExpect(1000 + 4 * k + 3, IBV_WC_RDMA_WRITE, p_.a.qpn()));
  EXPECT_EQ(first_pattern_mismatch(dst_.data(), kCount * 256, 12), -1);
  expect_no_wc(p_.a.scq.get());
}

// Two threads post to one QP at once, one in ibv_wr_* batches, the other with
// ibv_post_send: every work request runs exactly once (the batch is posted under
// the lock ibv_post_send takes).
TEST_P(WrApiTest, BatchesAndPostSendFromTwoThreadsRc) {
  constexpr int kEach = 100;
  PairOptions o;
  o.max_send_wr = 2 * kEach + 8;  // room for everything: no thread waits for completions
  o.cqe = 4 * kEach;
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps, o));
  fill_pattern(src_.data(), 2 * kEach * 64, 15);
  int batch_errors = 0, post_errors = 0;
  std::thread batches([&] {
    for (int i = 0; i < kEach; ++i) {
      ibv_wr_start(a());
      a()->wr_id = 2000 + i;
      a()->wr_flags = IBV_SEND_SIGNALED;
      ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr(i * 64));
      ibv_wr_set_sge(a(), src_.lkey(), src_.addr(i * 64), 64);
      if (ibv_wr_complete(a())) ++batch_errors;
    }
  });
  for (int i = kEach; i < 2 * kEach; ++i) {
    ibv_sge sge = src_.sge(i * 64, 64);
    ibv_send_wr w = send_wr(2000 + i, IBV_WR_RDMA_WRITE, &sge, 1);
    w.wr.rdma.remote_addr = dst_.addr(i * 64);
    w.wr.rdma.rkey = dst_.rkey();
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(p_.a.qp.get(), &w, &bad)) ++post_errors;
  }
  batches.join();
  EXPECT_EQ(batch_errors, 0);
  EXPECT_EQ(post_errors, 0);
  std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), 2 * kEach);
  std::vector<int> seen(2 * kEach, 0);
  for (const ibv_wc& w : wc) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS) << describe(w);
    if (w.wr_id >= 2000 && w.wr_id < 2000u + 2 * kEach) ++seen[w.wr_id - 2000];
  }
  for (int i = 0; i < 2 * kEach; ++i) EXPECT_EQ(seen[i], 1) << "wr_id " << 2000 + i;
  EXPECT_EQ(first_pattern_mismatch(dst_.data(), 2 * kEach * 64, 15), -1);
}

// ---- errors of a batch --------------------------------------------------------

// One more work request than the send queue holds: ibv_wr_complete answers
// ENOMEM and none of the batch runs; the QP stays usable.
TEST_P(WrApiTest, QueueFullFailsTheWholeBatchRc) {
  PairOptions o;
  o.max_send_wr = 8;
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps, o));
  const uint32_t depth = p_.a.cap.max_send_wr;
  observe("send_queue_depth", depth);
  fill_pattern(src_.data(), 64, 13);
  ibv_wr_start(a());
  for (uint32_t i = 0; i <= depth; ++i) {
    a()->wr_id = 200 + i;
    a()->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr(i));
    ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 1);
  }
  EXPECT_EQ(ibv_wr_complete(a()), ENOMEM);
  expect_no_wc(p_.a.scq.get());
  EXPECT_EQ(first_byte_not(dst_.data(), depth + 1, kFill), -1) << "a write of the failed batch ran";
  // A batch that fits goes through.
  ibv_wr_start(a());
  a()->wr_id = 299;
  a()->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr());
  ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 64);
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  ASSERT_NO_FATAL_FAILURE(expect_send_wc(299, IBV_WC_RDMA_WRITE, 64));
  EXPECT_EQ(first_pattern_mismatch(dst_.data(), 64, 13), -1);
}

// Too many SGEs and too much inline data are recorded when the setter is
// called; ibv_wr_complete returns that error (mlx5: ENOMEM) and posts nothing,
// not even the valid work request before the bad one.
TEST_P(WrApiTest, SetterErrorsFailTheWholeBatchRc) {
  PairOptions o;
  o.max_inline_data = 32;
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps, o));
  const uint32_t max_sge = p_.a.cap.max_send_sge;
  const uint32_t max_inline = p_.a.cap.max_inline_data;
  std::vector<ibv_sge> too_many(max_sge + 1, src_.sge(0, 1));
  std::vector<uint8_t> big(max_inline + 1, 0x55);
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "one SGE more than max_send_sge" : "one inline byte more than max_inline_data");
    ibv_wr_start(a());
    a()->wr_id = 300;
    a()->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr());
    ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 16);
    a()->wr_id = 301;
    ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr(1024));
    if (which == 0)
      ibv_wr_set_sge_list(a(), too_many.size(), too_many.data());
    else
      ibv_wr_set_inline_data(a(), big.data(), big.size());
    const int rc = ibv_wr_complete(a());
    observe(which == 0 ? "too_many_sges" : "inline_too_large", errno_name(rc));
    EXPECT_EQ(rc, ENOMEM) << errno_name(rc);
    expect_no_wc(p_.a.scq.get());
    EXPECT_EQ(first_byte_not(dst_.data(), 2048, kFill), -1);
  }
}

TEST_P(WrApiTest, AbortDiscardsTheBatchRc) {
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps));
  fill_pattern(src_.data(), 512, 14);
  ibv_wr_start(a());
  for (int i = 0; i < 3; ++i) {
    a()->wr_id = 400 + i;
    a()->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr(i * 128));
    ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 128);
  }
  ibv_wr_abort(a());
  expect_no_wc(p_.a.scq.get());
  EXPECT_EQ(first_byte_not(dst_.data(), 512, kFill), -1);
  // The next batch starts empty.
  ibv_wr_start(a());
  a()->wr_id = 410;
  a()->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(a(), dst_.rkey(), dst_.addr());
  ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 512);
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(410, IBV_WC_RDMA_WRITE, p_.a.qpn()));
  EXPECT_EQ(first_pattern_mismatch(dst_.data(), 512, 14), -1);
}

// Before RTS a batch cannot be posted: ibv_wr_complete answers EINVAL, as
// ibv_post_send does (mlx5 installs a failing wr_complete until RTS).
TEST_P(WrApiTest, BatchBeforeRtsFailsWithEinval) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Qp qp(create_ex(IBV_QPT_RC, kRcOps, cq.get()));
  ASSERT_TRUE(qp) << std::strerror(errno);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp.get());
  ASSERT_NE(qpx, nullptr);
  for (ibv_qp_state target : {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR}) {
    SCOPED_TRACE(qp_state_name(target));
    if (target != IBV_QPS_RESET) {
      ASSERT_EQ(modify_min(qp.get(), target), 0);
    }
    ibv_wr_start(qpx);
    qpx->wr_id = 1;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qpx);
    ibv_wr_set_sge(qpx, src_.lkey(), src_.addr(), 8);
    EXPECT_EQ(ibv_wr_complete(qpx), EINVAL);
    ibv_wr_start(qpx);
    EXPECT_EQ(ibv_wr_complete(qpx), EINVAL) << "an empty batch";
  }
  expect_no_wc(cq.get());
}

// In the error state a batch is accepted and every work request of it
// completes flushed, as ibv_post_send's do.
TEST_P(WrApiTest, BatchInTheErrorStateIsFlushedRc) {
  ASSERT_NO_FATAL_FAILURE(make(IBV_QPT_RC, kRcOps));
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(p_.a.qp.get(), &attr, IBV_QP_STATE), 0);
  ibv_wr_start(a());
  for (int i = 0; i < 2; ++i) {
    a()->wr_id = 500 + i;
    a()->wr_flags = 0;
    ibv_wr_send(a());
    ibv_wr_set_sge(a(), src_.lkey(), src_.addr(), 8);
  }
  ASSERT_EQ(ibv_wr_complete(a()), 0);
  std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  for (int i = 0; i < 2; ++i) check_wc(wc[i], WcExpect::error(500 + i, IBV_WC_WR_FLUSH_ERR, p_.a.qpn()));
}

}  // namespace
}  // namespace conformance
