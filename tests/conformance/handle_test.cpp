// Object numbers: a verb on a struct whose `handle` no longer names it (a
// destroyed object, or one the program garbled) fails with the kernel's errno
// and acts on nothing. The kernel finds every object of a command by its number
// in the file's object table (rdma_lookup_get_uobject): no object with that
// number is ENOENT, an object of another type EINVAL; the older write commands
// answer EINVAL for either (uobj_get_obj_read). rdma-core 44 sends the destroys,
// create_qp, create_srq and rereg_mr as ioctls, the rest as write commands.
#include <unistd.h>

#include "conformance.hpp"

namespace conformance {
namespace {

// A number no object of a test's context has.
constexpr uint32_t kNoObject = 0x7ffffff0u;

// Sets *field to value for the scope, then puts the real number back, so the
// object is destroyed normally afterwards.
class Garbled {
 public:
  Garbled(uint32_t* field, uint32_t value) : field_(field), saved_(*field) { *field = value; }
  ~Garbled() { *field_ = saved_; }
  Garbled(const Garbled&) = delete;
  Garbled& operator=(const Garbled&) = delete;

 private:
  uint32_t* field_;
  uint32_t saved_;
};

class HandleTest : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    cq_ = make_cq(16);
    ASSERT_TRUE(cq_);
    // An object of another type whose number the tests borrow.
    other_pd_ = Pd(ibv_alloc_pd(ctx_));
    ASSERT_TRUE(other_pd_);
  }
  void TearDown() override {
    other_pd_.reset();
    cq_.reset();
    VerbsTest::TearDown();
  }

  // The numbers a test garbles each object with, and the errno each gives for
  // a command sent as an ioctl: (value, errno).
  std::vector<std::pair<uint32_t, int>> ioctl_cases(uint32_t same_type_other) const {
    std::vector<std::pair<uint32_t, int>> v{{kNoObject, ENOENT}, {other_pd_->handle, EINVAL}};
    if (emulated()) v.emplace_back(same_type_other, EINVAL);
    return v;
  }
  std::vector<std::pair<uint32_t, int>> write_cases(uint32_t same_type_other) const {
    std::vector<std::pair<uint32_t, int>> v{{kNoObject, EINVAL}, {other_pd_->handle, EINVAL}};
    if (emulated()) v.emplace_back(same_type_other, EINVAL);
    return v;
  }
  // With another object's number of the same type the kernel acts on that other
  // object; the emulated device refuses (EINVAL). Only it is asked.
  bool emulated() const { return dattr_.vendor_id == 0x0053f5; }

  Cq cq_;
  Pd other_pd_;
};
CONFORMANCE_INSTANTIATE(HandleTest);

TEST_P(HandleTest, DeallocPd) {
  Pd pd(ibv_alloc_pd(ctx_));
  Pd second(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(pd && second);
  // other_pd_ is a PD too: the "another type" case borrows the CQ's number here.
  for (auto [value, err] : std::vector<std::pair<uint32_t, int>>{
           {kNoObject, ENOENT}, {cq_->handle, EINVAL}}) {
    SCOPED_TRACE(value);
    Garbled g(&pd->handle, value);
    errno = 0;
    EXPECT_EQ(ibv_dealloc_pd(pd.get()), err);
    EXPECT_EQ(errno, err);
  }
  if (emulated()) {
    Garbled g(&pd->handle, second->handle);
    EXPECT_EQ(ibv_dealloc_pd(pd.get()), EINVAL);
  }
  // Neither PD was deallocated: both are still usable.
  for (ibv_pd* p : {pd.get(), second.get()}) {
    std::vector<char> buf(64);
    ibv_mr* mr = ibv_reg_mr(p, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr) << std::strerror(errno);
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
  }
}

TEST_P(HandleTest, DestroyCq) {
  Cq cq = make_cq(4);
  Cq second = make_cq(4);
  ASSERT_TRUE(cq && second);
  for (auto [value, err] : ioctl_cases(second->handle)) {
    SCOPED_TRACE(value);
    Garbled g(&cq->handle, value);
    errno = 0;
    EXPECT_EQ(ibv_destroy_cq(cq.get()), err);
    EXPECT_EQ(errno, err);
  }
  // Both CQs are intact.
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(cq.get(), 1, &wc), 0);
  EXPECT_EQ(ibv_poll_cq(second.get(), 1, &wc), 0);
  EXPECT_EQ(cq.destroy(), 0);
  EXPECT_EQ(second.destroy(), 0);
}

TEST_P(HandleTest, DeregMr) {
  std::vector<char> buf(256);
  Mr mr(ibv_reg_mr(pd_, buf.data(), 128, IBV_ACCESS_LOCAL_WRITE));
  Mr second(ibv_reg_mr(pd_, buf.data() + 128, 128, IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(mr && second);
  for (auto [value, err] : ioctl_cases(second->handle)) {
    SCOPED_TRACE(value);
    Garbled g(&mr->handle, value);
    errno = 0;
    EXPECT_EQ(ibv_dereg_mr(mr.get()), err);
    EXPECT_EQ(errno, err);
  }
  EXPECT_EQ(mr.destroy(), 0);
  EXPECT_EQ(second.destroy(), 0);
}

TEST_P(HandleTest, DestroySrq) {
  ibv_srq_init_attr attr{};
  attr.attr.max_wr = 4;
  attr.attr.max_sge = 1;
  Srq srq(ibv_create_srq(pd_, &attr));
  ibv_srq_init_attr attr2 = attr;
  Srq second(ibv_create_srq(pd_, &attr2));
  ASSERT_TRUE(srq && second);
  for (auto [value, err] : ioctl_cases(second->handle)) {
    SCOPED_TRACE(value);
    Garbled g(&srq->handle, value);
    errno = 0;
    EXPECT_EQ(ibv_destroy_srq(srq.get()), err);
    EXPECT_EQ(errno, err);
    // Query and modify are write commands: EINVAL for any of them.
    ibv_srq_attr a{};
    EXPECT_EQ(ibv_query_srq(srq.get(), &a), EINVAL);
    a.srq_limit = 1;
    EXPECT_EQ(ibv_modify_srq(srq.get(), &a, IBV_SRQ_LIMIT), EINVAL);
  }
  ibv_srq_attr a{};
  EXPECT_EQ(ibv_query_srq(srq.get(), &a), 0);
  EXPECT_EQ(srq.destroy(), 0);
  EXPECT_EQ(second.destroy(), 0);
}

TEST_P(HandleTest, DestroyQp) {
  Qp qp = make_qp(IBV_QPT_RC, cq_.get());
  Qp second = make_qp(IBV_QPT_RC, cq_.get());
  ASSERT_TRUE(qp && second);
  for (auto [value, err] : ioctl_cases(second->handle)) {
    SCOPED_TRACE(value);
    Garbled g(&qp->handle, value);
    errno = 0;
    EXPECT_EQ(ibv_destroy_qp(qp.get()), err);
    EXPECT_EQ(errno, err);
  }
  // Neither QP was destroyed: each still moves to INIT.
  EXPECT_EQ(move_to(qp.get(), IBV_QPS_INIT), 0);
  EXPECT_EQ(move_to(second.get(), IBV_QPS_INIT), 0);
  EXPECT_EQ(qp.destroy(), 0);
  EXPECT_EQ(second.destroy(), 0);
}

// modify_qp and query_qp are write commands: EINVAL for any number that is not
// the QP's.
TEST_P(HandleTest, ModifyAndQueryQp) {
  Qp qp = make_qp(IBV_QPT_RC, cq_.get());
  Qp second = make_qp(IBV_QPT_RC, cq_.get());
  ASSERT_TRUE(qp && second);
  for (auto [value, err] : write_cases(second->handle)) {
    SCOPED_TRACE(value);
    Garbled g(&qp->handle, value);
    EXPECT_EQ(modify_min(qp.get(), IBV_QPS_INIT), err);
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    EXPECT_EQ(ibv_query_qp(qp.get(), &attr, IBV_QP_STATE, &init), err);
  }
  expect_state(qp.get(), IBV_QPS_RESET);
  expect_state(second.get(), IBV_QPS_RESET);
}

// create_qp and create_srq are ioctls naming the PD, the CQs and the SRQ by
// number: a garbled one is refused and nothing is created.
TEST_P(HandleTest, CreateQpWithGarbledObjects) {
  Cq second_cq = make_cq(4);
  ibv_srq_init_attr sattr{};
  sattr.attr.max_wr = 4;
  sattr.attr.max_sge = 1;
  Srq srq(ibv_create_srq(pd_, &sattr));
  Pd second_pd(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(second_cq && srq && second_pd);
  struct Case {
    const char* what;
    uint32_t* field;
    uint32_t same_type_other;
  };
  const Case cases[] = {{"pd", &pd_->handle, second_pd->handle},
                        {"cq", &cq_->handle, second_cq->handle},
                        {"srq", &srq->handle, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    for (auto [value, err] : ioctl_cases(c.same_type_other)) {
      if (c.field == &srq->handle && value == c.same_type_other) continue;  // one SRQ only
      if (value == other_pd_->handle && c.field == &pd_->handle) value = cq_->handle;  // another type
      SCOPED_TRACE(value);
      Garbled g(c.field, value);
      ibv_qp_init_attr init = qp_init_attr(IBV_QPT_RC, cq_.get(), srq.get());
      errno = 0;
      ibv_qp* qp = ibv_create_qp(pd_, &init);
      EXPECT_EQ(qp, nullptr);
      EXPECT_EQ(errno, err);
      if (qp) ibv_destroy_qp(qp);
    }
  }
  // And the same objects, intact, create a QP.
  ibv_qp_init_attr init = qp_init_attr(IBV_QPT_RC, cq_.get(), srq.get());
  Qp qp(ibv_create_qp(pd_, &init));
  EXPECT_TRUE(qp) << std::strerror(errno);
}

TEST_P(HandleTest, CreateSrqAndRegMrWithGarbledPd) {
  Pd second_pd(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(second_pd);
  std::vector<std::pair<uint32_t, int>> cases{{kNoObject, ENOENT}, {cq_->handle, EINVAL}};
  if (emulated()) cases.emplace_back(second_pd->handle, EINVAL);
  for (auto [value, err] : cases) {
    SCOPED_TRACE(value);
    Garbled g(&pd_->handle, value);
    ibv_srq_init_attr attr{};
    attr.attr.max_wr = 4;
    attr.attr.max_sge = 1;
    errno = 0;
    ibv_srq* srq = ibv_create_srq(pd_, &attr);
    EXPECT_EQ(srq, nullptr);
    EXPECT_EQ(errno, err);
    if (srq) ibv_destroy_srq(srq);
    // ibv_reg_mr is a write command: EINVAL for any of them.
    std::vector<char> buf(64);
    errno = 0;
    ibv_mr* mr = ibv_reg_mr(pd_, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    EXPECT_EQ(mr, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (mr) ibv_dereg_mr(mr);
  }
}

// ibv_dealloc_mw is an ioctl naming the window by number; ibv_alloc_mw a write
// command naming the PD (EINVAL for any bad number). The window survives.
TEST_P(HandleTest, DeallocAndAllocMw) {
  if (dattr_.max_mw == 0) GTEST_SKIP() << "no memory windows";
  ibv_mw* mw = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr) << std::strerror(errno);
  ibv_mw* second = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
  ASSERT_NE(second, nullptr) << std::strerror(errno);
  for (auto [value, err] : ioctl_cases(second->handle)) {
    SCOPED_TRACE(value);
    Garbled g(&mw->handle, value);
    errno = 0;
    EXPECT_EQ(ibv_dealloc_mw(mw), err);
    EXPECT_EQ(errno, err);
  }
  std::vector<std::pair<uint32_t, int>> pd_cases{{kNoObject, EINVAL}, {cq_->handle, EINVAL}};
  if (emulated()) pd_cases.emplace_back(other_pd_->handle, EINVAL);
  for (auto [value, err] : pd_cases) {
    SCOPED_TRACE(value);
    Garbled g(&pd_->handle, value);
    errno = 0;
    ibv_mw* bad = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
    EXPECT_EQ(bad, nullptr);
    EXPECT_EQ(errno, err);
    if (bad) ibv_dealloc_mw(bad);
  }
  // Numbers are shared by every type: a window's is none of the others'.
  EXPECT_NE(mw->handle, second->handle);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  EXPECT_EQ(ibv_dealloc_mw(second), 0);
}

// The data path is the provider's own, in user space: it reads no number, so a
// post on a QP whose number is garbled still works.
TEST_P(HandleTest, DataPathDoesNotLookNumbersUp) {
  Qp qp = make_qp(IBV_QPT_RC, cq_.get());
  ASSERT_TRUE(qp);
  ASSERT_EQ(move_to(qp.get(), IBV_QPS_INIT), 0);
  Garbled g(&qp->handle, kNoObject);
  ibv_recv_wr wr{};
  wr.wr_id = 1;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp.get(), &wr, &bad), 0);
}

}  // namespace
}  // namespace conformance
