// Shared receive queues.
#include "conformance.hpp"

namespace conformance {
namespace {

class SrqTest : public VerbsTest {
 protected:
  Srq make_srq(uint32_t max_wr, uint32_t max_sge, ibv_srq_init_attr* out = nullptr) {
    ibv_srq_init_attr attr{};
    attr.attr.max_wr = max_wr;
    attr.attr.max_sge = max_sge;
    attr.attr.srq_limit = 0;
    ibv_srq* srq = ibv_create_srq(pd_, &attr);
    if (!srq) {
      ADD_FAILURE() << "ibv_create_srq: " << std::strerror(errno);
    }
    if (out) *out = attr;
    return Srq(srq);
  }
};
CONFORMANCE_INSTANTIATE(SrqTest);

TEST_P(SrqTest, CreateWritesBackActualSizes) {
  int tag = 0;
  ibv_srq_init_attr attr{};
  attr.srq_context = &tag;
  attr.attr.max_wr = 10;
  attr.attr.max_sge = 2;
  Srq srq(ibv_create_srq(pd_, &attr));
  ASSERT_TRUE(srq) << std::strerror(errno);
  observe("max_wr", "10->" + std::to_string(attr.attr.max_wr));
  observe("max_sge", "2->" + std::to_string(attr.attr.max_sge));
  EXPECT_GE(attr.attr.max_wr, 10u);
  EXPECT_GE(attr.attr.max_sge, 2u);
  EXPECT_EQ(srq->context, ctx_);
  EXPECT_EQ(srq->pd, pd_);
  EXPECT_EQ(srq->srq_context, &tag);
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq.get(), &q), 0);
  EXPECT_EQ(q.max_wr, attr.attr.max_wr);
  EXPECT_EQ(q.max_sge, attr.attr.max_sge);
  EXPECT_EQ(q.srq_limit, 0u);
}

TEST_P(SrqTest, CreateAtTheDeviceLimits) {
  ibv_srq_init_attr attr{};
  Srq srq = make_srq(static_cast<uint32_t>(dattr_.max_srq_wr), static_cast<uint32_t>(dattr_.max_srq_sge), &attr);
  ASSERT_TRUE(srq);
  EXPECT_GE(attr.attr.max_wr, static_cast<uint32_t>(dattr_.max_srq_wr));
  EXPECT_GE(attr.attr.max_sge, static_cast<uint32_t>(dattr_.max_srq_sge));
}

TEST_P(SrqTest, CreateRejectsBadSizes) {
  struct Case {
    const char* what;
    uint32_t max_wr;
    uint32_t max_sge;
  };
  // (ConnectX rounds max_wr 0 up rather than refusing it; IBTA asks for at
  // least one work request.)
  const Case cases[] = {
      {"max_wr 0", 0, 1},
      {"max_wr above max_srq_wr", static_cast<uint32_t>(dattr_.max_srq_wr) + 1, 1},
      {"max_sge above max_srq_sge", 4, static_cast<uint32_t>(dattr_.max_srq_sge) + 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ibv_srq_init_attr attr{};
    attr.attr.max_wr = c.max_wr;
    attr.attr.max_sge = c.max_sge;
    errno = 0;
    ibv_srq* srq = ibv_create_srq(pd_, &attr);
    EXPECT_EQ(srq, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (srq) ibv_destroy_srq(srq);
  }
}

TEST_P(SrqTest, ModifyLimit) {
  ibv_srq_init_attr init{};
  Srq srq = make_srq(16, 1, &init);
  ASSERT_TRUE(srq);
  ibv_srq_attr attr{};
  attr.srq_limit = 4;
  ASSERT_EQ(ibv_modify_srq(srq.get(), &attr, IBV_SRQ_LIMIT), 0);
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq.get(), &q), 0);
  EXPECT_EQ(q.srq_limit, 4u);
  EXPECT_EQ(q.max_wr, init.attr.max_wr);
  // 0 disarms.
  attr.srq_limit = 0;
  ASSERT_EQ(ibv_modify_srq(srq.get(), &attr, IBV_SRQ_LIMIT), 0);
  ASSERT_EQ(ibv_query_srq(srq.get(), &q), 0);
  EXPECT_EQ(q.srq_limit, 0u);
}

TEST_P(SrqTest, ModifyLimitAboveTheQueueSize) {
  ibv_srq_init_attr init{};
  Srq srq = make_srq(16, 1, &init);
  ASSERT_TRUE(srq);
  for (uint32_t limit : {init.attr.max_wr + 1, static_cast<uint32_t>(dattr_.max_srq_wr) + 1}) {
    SCOPED_TRACE("srq_limit " + std::to_string(limit));
    ibv_srq_attr attr{};
    attr.srq_limit = limit;
    EXPECT_EQ(ibv_modify_srq(srq.get(), &attr, IBV_SRQ_LIMIT), EINVAL);
  }
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq.get(), &q), 0);
  EXPECT_EQ(q.srq_limit, 0u);
}

TEST_P(SrqTest, ModifyMaxWr) {
  // Resizing an SRQ is a device capability (IBV_DEVICE_SRQ_RESIZE). ConnectX
  // does not have it and refuses IBV_SRQ_MAX_WR with EINVAL.
  ibv_srq_init_attr init{};
  Srq srq = make_srq(16, 1, &init);
  ASSERT_TRUE(srq);
  ibv_srq_attr attr{};
  attr.max_wr = 64;
  int rc = ibv_modify_srq(srq.get(), &attr, IBV_SRQ_MAX_WR);
  observe("ibv_modify_srq.max_wr", errno_name(rc));
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq.get(), &q), 0);
  if (dattr_.device_cap_flags & IBV_DEVICE_SRQ_RESIZE) {
    EXPECT_EQ(rc, 0);
    EXPECT_GE(q.max_wr, 64u);
  } else {
    EXPECT_EQ(rc, EINVAL);
    EXPECT_EQ(q.max_wr, init.attr.max_wr);
  }
}

TEST_P(SrqTest, DestroyWhileAQpIsAttachedIsBusy) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Srq srq = make_srq(8, 1);
  ASSERT_TRUE(srq);
  Qp qp = make_qp(IBV_QPT_RC, cq.get(), srq.get());
  ASSERT_TRUE(qp);
  EXPECT_EQ(qp->srq, srq.get());
  errno = 0;
  EXPECT_EQ(srq.destroy(), EBUSY);
  EXPECT_EQ(errno, EBUSY);  // the kernel's errno, left by rdma-core
  EXPECT_EQ(qp.destroy(), 0);
  EXPECT_EQ(srq.destroy(), 0);
}

TEST_P(SrqTest, PostRecvUpToCapacityThenEnomem) {
  ibv_srq_init_attr init{};
  Srq srq = make_srq(8, 1, &init);
  ASSERT_TRUE(srq);
  const uint32_t cap = init.attr.max_wr;
  std::vector<ibv_recv_wr> wrs(cap + 2);
  for (size_t i = 0; i < wrs.size(); ++i) {
    wrs[i] = ibv_recv_wr{};
    wrs[i].wr_id = i;
    wrs[i].num_sge = 0;
    wrs[i].next = i + 1 < wrs.size() ? &wrs[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_srq_recv(srq.get(), wrs.data(), &bad), ENOMEM);
  EXPECT_EQ(bad, &wrs[cap]) << "bad_wr must be the first work request that did not fit";
  // Still full.
  ibv_recv_wr one{};
  bad = nullptr;
  EXPECT_EQ(ibv_post_srq_recv(srq.get(), &one, &bad), ENOMEM);
  EXPECT_EQ(bad, &one);
}

TEST_P(SrqTest, PostRecvTooManySges) {
  ibv_srq_init_attr init{};
  Srq srq = make_srq(8, 1, &init);
  ASSERT_TRUE(srq);
  std::vector<ibv_sge> sges(init.attr.max_sge + 1);
  static char buf[64];
  for (ibv_sge& s : sges) {
    s.addr = reinterpret_cast<uintptr_t>(buf);
    s.length = sizeof buf;
    s.lkey = 0;
  }
  ibv_recv_wr ok{};
  ok.wr_id = 1;
  ibv_recv_wr wr{};
  wr.wr_id = 2;
  wr.sg_list = sges.data();
  wr.num_sge = static_cast<int>(sges.size());
  ok.next = &wr;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_srq_recv(srq.get(), &ok, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
}

}  // namespace
}  // namespace conformance
