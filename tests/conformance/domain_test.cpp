// Thread domains and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)):
// the comp_mask checks and use counts of ConnectX's provider, a parent domain
// taken wherever a PD is, and its allocator called for the queue buffers of the
// QPs, CQs and SRQs created on it (with mlx5dv's resource types), holding the
// queues the device then really uses. A device without the verbs answers
// EOPNOTSUPP, and the tests skip there.
#include <infiniband/mlx5dv.h>

#include <cstring>
#include <vector>

#include "datapath.hpp"

namespace conformance {
namespace {

// An allocator that records every call, hands out zeroed heap blocks, and can
// be told to answer IBV_ALLOCATOR_USE_DEFAULT or NULL for one resource type.
struct Recorder {
  struct Call {
    bool alloc;
    size_t size;
    size_t alignment;
    uint64_t type;
    void* ptr;
  };
  std::vector<Call> calls;
  ibv_pd* expected_pd = nullptr;
  bool pd_ok = true;
  uint64_t refuse_type = 0;   // answer NULL for this type
  uint64_t default_type = 0;  // answer IBV_ALLOCATOR_USE_DEFAULT for this type

  static void* alloc(ibv_pd* pd, void* pd_context, size_t size, size_t alignment, uint64_t type) {
    auto* r = static_cast<Recorder*>(pd_context);
    if (pd != r->expected_pd) r->pd_ok = false;
    if (type == r->refuse_type) return nullptr;
    if (type == r->default_type) return IBV_ALLOCATOR_USE_DEFAULT;
    void* p = aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
    if (p) std::memset(p, 0, size);
    r->calls.push_back({true, size, alignment, type, p});
    return p;
  }
  static void release(ibv_pd* pd, void* pd_context, void* ptr, uint64_t type) {
    auto* r = static_cast<Recorder*>(pd_context);
    if (pd != r->expected_pd) r->pd_ok = false;
    r->calls.push_back({false, 0, 0, type, ptr});
    std::free(ptr);
  }

  // The live block of that type holding the 8 bytes of value, if any.
  bool holds(uint64_t type, uint64_t value) const {
    for (const Call& c : calls) {
      if (!c.alloc || c.type != type || !live(c.ptr)) continue;
      const auto* b = static_cast<const uint8_t*>(c.ptr);
      for (size_t i = 0; i + sizeof value <= c.size; i += sizeof value)
        if (std::memcmp(b + i, &value, sizeof value) == 0) return true;
    }
    return false;
  }
  bool live(void* p) const {
    int n = 0;
    for (const Call& c : calls)
      if (c.ptr == p) n += c.alloc ? 1 : -1;
    return n > 0;
  }
  size_t count(bool alloc, uint64_t type) const {
    size_t n = 0;
    for (const Call& c : calls) n += c.alloc == alloc && c.type == type;
    return n;
  }
};

class DomainTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure()) return;
    ibv_td_init_attr a{};
    errno = 0;
    ibv_td* td = ibv_alloc_td(ctx_, &a);
    if (!td) {
      EXPECT_EQ(errno, EOPNOTSUPP);
      GTEST_SKIP() << "the device has no thread domains";
    }
    EXPECT_EQ(ibv_dealloc_td(td), 0);
  }

  // A parent domain on the fixture's PD, with the recorder's allocator.
  ibv_pd* parent(Recorder* rec, ibv_td* td = nullptr) {
    ibv_parent_domain_init_attr a{};
    a.pd = pd_;
    a.td = td;
    if (rec) {
      a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
      a.alloc = Recorder::alloc;
      a.free = Recorder::release;
      a.pd_context = rec;
    }
    ibv_pd* pd = ibv_alloc_parent_domain(ctx_, &a);
    EXPECT_NE(pd, nullptr) << errno_name(errno);
    if (rec) rec->expected_pd = pd;
    return pd;
  }

  ibv_cq_ex* cq_on(ibv_pd* domain, int cqe = 16) {
    ibv_cq_init_attr_ex a{};
    a.cqe = static_cast<uint32_t>(cqe);
    a.wc_flags = IBV_WC_STANDARD_FLAGS;
    a.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
    a.parent_domain = domain;
    errno = 0;
    return ibv_create_cq_ex(ctx_, &a);
  }
};
CONFORMANCE_INSTANTIATE(DomainTest);

TEST_P(DomainTest, ThreadDomains) {
  ibv_td_init_attr a{};
  a.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(ibv_alloc_td(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.comp_mask = 0;
  ibv_td* td = ibv_alloc_td(ctx_, &a);
  ASSERT_NE(td, nullptr) << errno_name(errno);
  EXPECT_EQ(td->context, ctx_);
  // A parent domain holds it: deallocating it is refused (mlx5: EBUSY).
  ibv_pd* pd = parent(nullptr, td);
  ASSERT_NE(pd, nullptr);
  EXPECT_EQ(ibv_dealloc_td(td), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_dealloc_td(td), 0);
}

TEST_P(DomainTest, ParentDomainChecks) {
  ibv_parent_domain_init_attr a{};
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &a), nullptr);  // no PD
  EXPECT_EQ(errno, EINVAL);
  a.pd = pd_;
  a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT << 1;
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &a), nullptr);  // an unknown comp_mask bit
  EXPECT_EQ(errno, EINVAL);
  ibv_pd* pd = parent(nullptr);
  ASSERT_NE(pd, nullptr);
  // Interchangeable with its PD (ibv_initialize_parent_domain): same context, same number.
  EXPECT_NE(pd, pd_);
  EXPECT_EQ(pd->context, ctx_);
  EXPECT_EQ(pd->handle, pd_->handle);
  // The PD is held while the parent domain exists.
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// A parent domain is taken wherever a PD is: regions, address handles, SRQs
// and QPs; the objects name it, and it cannot go while QPs, CQs or SRQs use it.
TEST_P(DomainTest, UsableWhereAPdIs) {
  ibv_pd* pd = parent(nullptr);
  ASSERT_NE(pd, nullptr);
  Buffer buf(4096);
  Mr mr(ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr) << errno_name(errno);
  EXPECT_EQ(mr->pd, pd);
  ibv_ah_attr ah_attr = loopback_ah_attr();
  Ah ah(ibv_create_ah(pd, &ah_attr));
  ASSERT_TRUE(ah) << errno_name(errno);
  EXPECT_EQ(ah->pd, pd);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  Srq srq(ibv_create_srq(pd, &sa));
  ASSERT_TRUE(srq) << errno_name(errno);
  EXPECT_EQ(srq->pd, pd);
  Cq cq = make_cq();
  ibv_qp_init_attr qa = qp_init_attr(IBV_QPT_RC, cq.get());
  Qp qp(ibv_create_qp(pd, &qa));
  ASSERT_TRUE(qp) << errno_name(errno);
  EXPECT_EQ(qp->pd, pd);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  qp.reset();
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);  // the SRQ
  srq.reset();
  ah.reset();
  mr.reset();
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// IBV_CQ_INIT_ATTR_MASK_PD names a parent domain; a plain PD is EINVAL (mlx5).
TEST_P(DomainTest, CqOnAParentDomain) {
  EXPECT_EQ(cq_on(pd_), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_pd* pd = parent(nullptr);
  ASSERT_NE(pd, nullptr);
  ibv_cq_ex* cq = cq_on(pd);
  ASSERT_NE(cq, nullptr) << errno_name(errno);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// The allocator is called for each queue buffer, then its doorbell record, with
// mlx5dv's resource types, and every block is freed at destroy.
TEST_P(DomainTest, AllocatorCalledForQueueBuffers) {
  Recorder rec;
  ibv_pd* pd = parent(&rec);
  ASSERT_NE(pd, nullptr);
  ibv_cq_ex* cq = cq_on(pd);
  ASSERT_NE(cq, nullptr) << errno_name(errno);
  ASSERT_EQ(rec.calls.size(), 2u);
  EXPECT_EQ(rec.calls[0].type, MLX5DV_RES_TYPE_CQ);
  EXPECT_GT(rec.calls[0].size, 0u);
  EXPECT_EQ(rec.calls[1].type, MLX5DV_RES_TYPE_DBR);
  EXPECT_EQ(rec.calls[1].size, 8u);
  ibv_qp_init_attr qa = qp_init_attr(IBV_QPT_RC, ibv_cq_ex_to_cq(cq));
  Qp qp(ibv_create_qp(pd, &qa));
  ASSERT_TRUE(qp) << errno_name(errno);
  EXPECT_EQ(rec.count(true, MLX5DV_RES_TYPE_QP), 1u);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  Srq srq(ibv_create_srq(pd, &sa));
  ASSERT_TRUE(srq) << errno_name(errno);
  EXPECT_EQ(rec.count(true, MLX5DV_RES_TYPE_SRQ), 1u);
  EXPECT_EQ(rec.count(true, MLX5DV_RES_TYPE_DBR), 3u);
  // Posted receive WQEs live in the buffers the allocator gave.
  const uint64_t qp_id = 0x5156aa0011223344, srq_id = 0x5352bb5566778899;
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = qp_id;
  ASSERT_EQ(ibv_post_recv(qp.get(), &wr, &bad), 0);
  wr.wr_id = srq_id;
  ASSERT_EQ(ibv_post_srq_recv(srq.get(), &wr, &bad), 0);
  EXPECT_TRUE(rec.holds(MLX5DV_RES_TYPE_QP, qp_id));
  EXPECT_TRUE(rec.holds(MLX5DV_RES_TYPE_SRQ, srq_id));
  qp.reset();
  srq.reset();
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  // Everything allocated was freed, with the type it was allocated for.
  for (const Recorder::Call& c : rec.calls) {
    if (!c.alloc) continue;
    EXPECT_FALSE(rec.live(c.ptr)) << "type " << std::hex << c.type;
  }
  EXPECT_EQ(rec.count(false, MLX5DV_RES_TYPE_DBR), 3u);
  EXPECT_TRUE(rec.pd_ok);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// An XRC initiator QP on a parent domain: its send queue is allocated too.
TEST_P(DomainTest, XrcSendQpOnAParentDomain) {
  Recorder rec;
  ibv_pd* pd = parent(&rec);
  ASSERT_NE(pd, nullptr);
  Cq cq = make_cq();
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_XRC_SEND;
  a.send_cq = cq.get();
  a.cap.max_send_wr = 4;
  a.cap.max_send_sge = 1;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = pd;
  errno = 0;
  Qp qp(ibv_create_qp_ex(ctx_, &a));
  if (!qp && errno == EOPNOTSUPP) GTEST_SKIP() << "no XRC";
  ASSERT_TRUE(qp) << errno_name(errno);
  EXPECT_EQ(qp->pd, pd);
  EXPECT_EQ(rec.count(true, MLX5DV_RES_TYPE_QP), 1u);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  qp.reset();
  EXPECT_EQ(rec.count(false, MLX5DV_RES_TYPE_QP), 1u);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// IBV_ALLOCATOR_USE_DEFAULT falls back to the provider's memory (nothing to
// free); NULL fails the creation with ENOMEM, freeing what was already taken.
TEST_P(DomainTest, AllocatorDefaultAndRefusal) {
  Recorder rec;
  ibv_pd* pd = parent(&rec);
  ASSERT_NE(pd, nullptr);
  Cq cq = make_cq();
  rec.default_type = MLX5DV_RES_TYPE_QP;
  ibv_qp_init_attr qa = qp_init_attr(IBV_QPT_RC, cq.get());
  Qp qp(ibv_create_qp(pd, &qa));
  ASSERT_TRUE(qp) << errno_name(errno);
  EXPECT_EQ(rec.count(true, MLX5DV_RES_TYPE_QP), 0u);
  EXPECT_EQ(rec.count(true, MLX5DV_RES_TYPE_DBR), 1u);
  qp.reset();
  EXPECT_EQ(rec.count(false, MLX5DV_RES_TYPE_DBR), 1u);
  rec.default_type = 0;
  rec.refuse_type = MLX5DV_RES_TYPE_QP;
  qa = qp_init_attr(IBV_QPT_UD, cq.get());
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd, &qa), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  // The doorbell refused after the buffer: the buffer is given back.
  rec.refuse_type = MLX5DV_RES_TYPE_DBR;
  const size_t before = rec.count(true, MLX5DV_RES_TYPE_SRQ);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_srq(pd, &sa), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(rec.count(true, MLX5DV_RES_TYPE_SRQ), before + 1);
  EXPECT_EQ(rec.count(false, MLX5DV_RES_TYPE_SRQ), before + 1);
  errno = 0;
  EXPECT_EQ(cq_on(pd), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(rec.count(true, MLX5DV_RES_TYPE_CQ), rec.count(false, MLX5DV_RES_TYPE_CQ));
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// RC traffic between QPs and CQs made on a parent domain: the completions are
// written into the CQ rings the allocator gave, and a resized CQ takes a new one.
TEST_P(DomainTest, TrafficThroughAllocatedQueues) {
  Recorder rec;
  ibv_pd* pd = parent(&rec);
  ASSERT_NE(pd, nullptr);
  ibv_cq_ex* cq = cq_on(pd, 64);
  ASSERT_NE(cq, nullptr) << errno_name(errno);
  Region src, dst;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &src));
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &dst));
  ibv_pd* plain = pd_;
  pd_ = pd;  // make_pair creates its QPs on the fixture's PD
  Pair p;
  make_pair(PairOptions{}, &p);
  pd_ = plain;
  ASSERT_FALSE(HasFatalFailure());
  fill_pattern(src.data(), 1000, 7);
  ibv_sge rsge = dst.sge(0, 1000);
  const uint64_t recv_id = 0x7265637600000001;
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), recv_id, &rsge, 1));
  ibv_sge ssge = src.sge(0, 1000);
  ibv_send_wr wr = send_wr(0x73656e6400000002, IBV_WR_SEND, &ssge, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &wr));
  std::vector<ibv_wc> wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(recv_id, IBV_WC_RECV, p.b.qpn()).len(1000));
  EXPECT_EQ(first_pattern_mismatch(dst.data(), 1000, 7), -1);
  ASSERT_EQ(expect_wcs(p.a.scq.get(), 1).size(), 1u);
  EXPECT_TRUE(rec.holds(MLX5DV_RES_TYPE_QP, 0x73656e6400000002));  // the send WQE
  // A completion on the allocated CQ: from a QP created on the parent domain.
  Cq scq = make_cq();
  ibv_qp_init_attr qa = qp_init_attr(IBV_QPT_RC, scq.get());
  qa.recv_cq = ibv_cq_ex_to_cq(cq);
  Qp qp(ibv_create_qp(pd, &qa));
  ASSERT_TRUE(qp) << errno_name(errno);
  ibv_recv_wr rwr{};
  ibv_recv_wr* bad = nullptr;
  rwr.wr_id = 0x666c757368000003;
  ASSERT_EQ(ibv_post_recv(qp.get(), &rwr, &bad), 0);
  ASSERT_EQ(move_to(qp.get(), IBV_QPS_ERR), 0);  // flushes the receive into the CQ
  const size_t cq_blocks = rec.count(true, MLX5DV_RES_TYPE_CQ);
  EXPECT_TRUE(rec.holds(MLX5DV_RES_TYPE_CQ, 0x666c757368000003));
  EXPECT_EQ(ibv_resize_cq(ibv_cq_ex_to_cq(cq), 200), 0);
  EXPECT_EQ(rec.count(true, MLX5DV_RES_TYPE_CQ), cq_blocks + 1);
  EXPECT_EQ(rec.count(false, MLX5DV_RES_TYPE_CQ), cq_blocks);
  EXPECT_TRUE(rec.holds(MLX5DV_RES_TYPE_CQ, 0x666c757368000003));  // moved along
  ibv_wc flushed{};
  EXPECT_EQ(ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &flushed), 1);
  EXPECT_EQ(flushed.wr_id, 0x666c757368000003u);
  EXPECT_EQ(flushed.status, IBV_WC_WR_FLUSH_ERR);
  qp.reset();
  p.reset();
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_TRUE(rec.pd_ok);
}

}  // namespace
}  // namespace conformance
