// Vendor personalities, the behaviours (docs/simulation.md, "Vendor
// personalities"): completion statuses, async events, posting, memory keys and
// the extended attributes, each observed through the public verbs API between
// two RC QPs of one device (or a UC QP connected to itself where a behaviour is
// UC's). Connectx* tests run by conformance.personality.connectx
// (the IBTA's and ConnectX's behaviour), Rxe* by conformance.personality.rxe
// (what docs/hardware.md records for the Soft-RoCE driver).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "tests/support/connect.hpp"
#include "tests/support/wait.hpp"

namespace {

using softverbs::testkit::ah_to_gid;
using softverbs::testkit::connect_pair;
using softverbs::testkit::poll_completions;
using softverbs::testkit::wait_readable;

constexpr int kWaitMs = 5000;

// True if fd is readable now (the events this suite looks for are raised
// before the completion or state the test has already observed).
bool readable_now(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

// Two RC QPs of the first device connected to each other (a sends, b
// receives), each with its own CQ, and a 4 KiB region per side.
class Behaviour : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ASSERT_NE(list, nullptr);
    ASSERT_GT(n, 0);
    ctx_ = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx_, nullptr);
    // The async fd is polled, never blocked on.
    const int flags = fcntl(ctx_->async_fd, F_GETFL);
    ASSERT_EQ(fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    channel_ = ibv_create_comp_channel(ctx_);
    ASSERT_NE(channel_, nullptr);
    cq_a_ = ibv_create_cq(ctx_, 32, nullptr, channel_, 0);
    cq_b_ = ibv_create_cq(ctx_, 32, nullptr, nullptr, 0);
    ASSERT_TRUE(cq_a_ && cq_b_);
    const unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    mr_a_ = ibv_reg_mr(pd_, buf_a_.data(), buf_a_.size(), access);
    mr_b_ = ibv_reg_mr(pd_, buf_b_.data(), buf_b_.size(), access);
    ASSERT_TRUE(mr_a_ && mr_b_);
  }
  void TearDown() override {
    for (ibv_qp* qp : {a_, b_})
      if (qp) ibv_destroy_qp(qp);
    if (srq_) ibv_destroy_srq(srq_);
    for (ibv_mr* mr : {mr_a_, mr_b_})
      if (mr) ibv_dereg_mr(mr);
    for (ibv_cq* cq : {cq_a_, cq_b_})
      if (cq) ibv_destroy_cq(cq);
    if (channel_) ibv_destroy_comp_channel(channel_);
    if (pd_) ibv_dealloc_pd(pd_);
    if (ctx_) ibv_close_device(ctx_);
  }

  ibv_qp* create_rc(ibv_cq* cq, ibv_srq* srq = nullptr) {
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.srq = srq;
    init.qp_type = IBV_QPT_RC;
    init.cap = {8, srq ? 0u : 8u, 2, srq ? 0u : 2u, 0};
    return ibv_create_qp(pd_, &init);
  }

  // a and b in RTS, connected to each other over the RoCE GID.
  void connect() {
    a_ = create_rc(cq_a_);
    b_ = create_rc(cq_b_, srq_);
    ASSERT_TRUE(a_ && b_);
    ibv_gid gid{};
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 1, &gid), 0);
    const ibv_ah_attr ah = ah_to_gid(gid, 1);
    ASSERT_TRUE(connect_pair(a_, ah, b_, ah));
  }

  int post_recv_b(uint32_t length, uint32_t lkey = 0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_b_.data()), length, lkey ? lkey : mr_b_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = 2;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(b_, &wr, &bad);
  }

  // A SEND (or another opcode) of `length` bytes from a's region.
  int post_send_a(uint32_t length, ibv_wr_opcode op = IBV_WR_SEND, uint32_t lkey = 0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_a_.data()), length, lkey ? lkey : mr_a_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.opcode = op;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(a_, &wr, &bad);
  }

  // The one completion of cq (bounded wait).
  ibv_wc one(ibv_cq* cq) {
    std::vector<ibv_wc> wcs = poll_completions(cq, 1, kWaitMs);
    EXPECT_EQ(wcs.size(), 1u);
    return wcs.empty() ? ibv_wc{} : wcs[0];
  }

  bool has_async_event(ibv_event_type type) {
    bool found = false;
    while (readable_now(ctx_->async_fd)) {
      ibv_async_event ev{};
      if (ibv_get_async_event(ctx_, &ev)) break;
      found |= ev.event_type == type;
      ibv_ack_async_event(&ev);
    }
    return found;
  }

  ibv_qp_state state(ibv_qp* qp) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    EXPECT_EQ(ibv_query_qp(qp, &attr, IBV_QP_STATE, &init), 0);
    return attr.qp_state;
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_a_ = nullptr;
  ibv_cq* cq_b_ = nullptr;
  ibv_mr* mr_a_ = nullptr;
  ibv_mr* mr_b_ = nullptr;
  ibv_srq* srq_ = nullptr;
  ibv_qp* a_ = nullptr;
  ibv_qp* b_ = nullptr;
  std::vector<uint8_t> buf_a_ = std::vector<uint8_t>(4096);
  std::vector<uint8_t> buf_b_ = std::vector<uint8_t>(4096);
};

using ConnectxBehaviour = Behaviour;
using RxeBehaviour = Behaviour;

// ---- completion statuses -----------------------------------------------------

TEST_F(ConnectxBehaviour, BadLkeyIsALocalProtectionError) {
  connect();
  ASSERT_EQ(post_send_a(64, IBV_WR_SEND, mr_a_->lkey + 0x100000), 0);
  EXPECT_EQ(one(cq_a_).status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(RxeBehaviour, BadLkeyIsALocalQpOperationError) {
  connect();
  ASSERT_EQ(post_send_a(64, IBV_WR_SEND, mr_a_->lkey + 0x100000), 0);
  EXPECT_EQ(one(cq_a_).status, IBV_WC_LOC_QP_OP_ERR);
}

TEST_F(ConnectxBehaviour, ReceiveBufferTooSmall) {
  connect();
  ASSERT_EQ(post_recv_b(16), 0);
  ASSERT_EQ(post_send_a(64), 0);
  EXPECT_EQ(one(cq_a_).status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(one(cq_b_).status, IBV_WC_LOC_LEN_ERR);
}

TEST_F(RxeBehaviour, ReceiveBufferTooSmall) {
  connect();
  ASSERT_EQ(post_recv_b(16), 0);
  ASSERT_EQ(post_send_a(64), 0);
  EXPECT_EQ(one(cq_a_).status, IBV_WC_REM_OP_ERR);
  EXPECT_EQ(one(cq_b_).status, IBV_WC_LOC_QP_OP_ERR);
}

// SEND with Invalidate naming an ordinary region's rkey.
int post_send_with_inv(ibv_qp* qp, uint32_t rkey) {
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.opcode = IBV_WR_SEND_WITH_INV;
  wr.invalidate_rkey = rkey;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

TEST_F(ConnectxBehaviour, SendWithInvalidateOfARegionFails) {
  connect();
  ASSERT_EQ(post_recv_b(64), 0);
  ASSERT_EQ(post_send_with_inv(a_, mr_b_->rkey), 0);
  EXPECT_EQ(one(cq_a_).status, IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(RxeBehaviour, SendWithInvalidateOfARegionCompletes) {
  connect();
  ASSERT_EQ(post_recv_b(64), 0);
  ASSERT_EQ(post_send_with_inv(a_, mr_b_->rkey), 0);
  EXPECT_EQ(one(cq_a_).status, IBV_WC_SUCCESS);
  const ibv_wc wc = one(cq_b_);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(wc.invalidated_rkey, mr_b_->rkey);
}

TEST_F(ConnectxBehaviour, RcReceiveHasNoGrhFlag) {
  connect();
  ASSERT_EQ(post_recv_b(64), 0);
  ASSERT_EQ(post_send_a(64), 0);
  EXPECT_EQ(one(cq_a_).status, IBV_WC_SUCCESS);
  const ibv_wc wc = one(cq_b_);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_FALSE(wc.wc_flags & IBV_WC_GRH);
}

TEST_F(RxeBehaviour, RcReceiveHasTheGrhFlag) {
  connect();
  ASSERT_EQ(post_recv_b(64), 0);
  ASSERT_EQ(post_send_a(64), 0);
  EXPECT_EQ(one(cq_a_).status, IBV_WC_SUCCESS);
  const ibv_wc wc = one(cq_b_);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
}

// ---- async events --------------------------------------------------------------

// An RDMA WRITE to a bad rkey, until the sender's REM_ACCESS_ERR. The
// responder has then raised QP_ACCESS_ERR or not: it raises the event before
// it enters the error state, which the tests check first.
void write_to_bad_rkey(ibv_qp* a, ibv_cq* cq_a, ibv_mr* mr_a, uint8_t* remote) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(mr_a->addr), 64, mr_a->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(remote);
  wr.wr.rdma.rkey = 0x00ffff00;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a, &wr, &bad), 0);
  std::vector<ibv_wc> wcs = poll_completions(cq_a, 1, kWaitMs);
  EXPECT_EQ(wcs.size(), 1u);
  if (!wcs.empty()) {
    EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  }
}

TEST_F(ConnectxBehaviour, RemoteAccessErrorRaisesQpAccessErr) {
  connect();
  write_to_bad_rkey(a_, cq_a_, mr_a_, buf_b_.data());
  EXPECT_EQ(state(b_), IBV_QPS_ERR);
  EXPECT_TRUE(has_async_event(IBV_EVENT_QP_ACCESS_ERR));
}

TEST_F(RxeBehaviour, RemoteAccessErrorRaisesNoQpAccessErr) {
  connect();
  write_to_bad_rkey(a_, cq_a_, mr_a_, buf_b_.data());
  EXPECT_EQ(state(b_), IBV_QPS_ERR);  // the responder decided (and raised nothing)
  EXPECT_FALSE(has_async_event(IBV_EVENT_QP_ACCESS_ERR));
}

// A QP on an SRQ moved to the error state.
void to_error(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE), 0);
}

TEST_F(ConnectxBehaviour, SrqQpInErrorRaisesLastWqeReached) {
  ibv_srq_init_attr si{};
  si.attr.max_wr = 4;
  si.attr.max_sge = 1;
  srq_ = ibv_create_srq(pd_, &si);
  ASSERT_NE(srq_, nullptr);
  connect();
  to_error(b_);
  EXPECT_TRUE(has_async_event(IBV_EVENT_QP_LAST_WQE_REACHED));
}

TEST_F(RxeBehaviour, SrqQpInErrorRaisesNoLastWqeReached) {
  ibv_srq_init_attr si{};
  si.attr.max_wr = 4;
  si.attr.max_sge = 1;
  srq_ = ibv_create_srq(pd_, &si);
  ASSERT_NE(srq_, nullptr);
  connect();
  to_error(b_);
  EXPECT_FALSE(has_async_event(IBV_EVENT_QP_LAST_WQE_REACHED));
}

// RTS -> SQD without en_sqd_async_notify, nothing outstanding: the drain ends at once.
int to_sqd(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  attr.en_sqd_async_notify = 0;
  return ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY);
}

TEST_F(ConnectxBehaviour, DrainWithoutNotifyRaisesNoEvent) {
  connect();
  ASSERT_EQ(to_sqd(a_), 0);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(a_, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.sq_draining, 0);
  EXPECT_FALSE(has_async_event(IBV_EVENT_SQ_DRAINED));
}

TEST_F(RxeBehaviour, DrainWithoutNotifyRaisesSqDrained) {
  connect();
  ASSERT_EQ(to_sqd(a_), 0);
  ASSERT_TRUE(wait_readable(ctx_->async_fd, kWaitMs));
  EXPECT_TRUE(has_async_event(IBV_EVENT_SQ_DRAINED));
}

// ---- QP attributes -------------------------------------------------------------

// The modifies of a connection, each with one value out of range: a P_Key
// index past the table (RESET->INIT), path_mtu 0 and min_rnr_timer 32
// (INIT->RTR), retry_cnt 8 (RTR->RTS); the results in order.
std::vector<int> modify_with_bad_values(ibv_qp* qp, ibv_context* ctx) {
  std::vector<int> rcs;
  softverbs::testkit::QpPath path;
  path.pkey_index = 5;  // a RoCE port has one P_Key
  rcs.push_back(softverbs::testkit::modify_to_init(qp, path));
  if (rcs.back()) rcs.back() = softverbs::testkit::modify_to_init(qp, {}) ? -1 : rcs.back();
  ibv_gid gid{};
  EXPECT_EQ(ibv_query_gid(ctx, 1, 1, &gid), 0);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(0);
  a.dest_qp_num = qp->qp_num;
  a.ah_attr = ah_to_gid(gid, 1);
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 32;
  const int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  rcs.push_back(ibv_modify_qp(qp, &a, rtr));
  if (rcs.back()) {  // go on with valid values
    a.path_mtu = IBV_MTU_1024;
    a.min_rnr_timer = 1;
    EXPECT_EQ(ibv_modify_qp(qp, &a, rtr), 0);
  }
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.timeout = 14;
  r.retry_cnt = 8;
  r.rnr_retry = 7;
  r.max_rd_atomic = 1;
  rcs.push_back(ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                          IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC));
  return rcs;
}

TEST_F(ConnectxBehaviour, QpAttributesAreRangeChecked) {
  a_ = create_rc(cq_a_);
  ASSERT_NE(a_, nullptr);
  EXPECT_EQ(modify_with_bad_values(a_, ctx_), (std::vector<int>{EINVAL, EINVAL, EINVAL}));
}

TEST_F(RxeBehaviour, QpAttributesAreNotRangeChecked) {
  a_ = create_rc(cq_a_);
  ASSERT_NE(a_, nullptr);
  EXPECT_EQ(modify_with_bad_values(a_, ctx_), (std::vector<int>{0, 0, 0}));
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(a_, &attr, IBV_QP_STATE | IBV_QP_PATH_MTU, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_RTS);
  EXPECT_GE(attr.path_mtu, IBV_MTU_256) << "path_mtu 0 keeps the port's MTU";
}

// A UC QP connected to itself, drained to SQD, then SQD->SQD with a new
// address vector (IBTA 10.3.1 lists it among UC's optional attributes): the
// result of that modify, or -1 if the QP could not be set up.
int uc_sqd_to_sqd_with_av(ibv_pd* pd, ibv_cq* cq, ibv_context* ctx) {
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_UC;
  init.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &init);
  if (!qp) return -1;
  ibv_gid gid{};
  EXPECT_EQ(ibv_query_gid(ctx, 1, 1, &gid), 0);
  const ibv_ah_attr ah = ah_to_gid(gid, 1);
  int rc = -1;
  if (softverbs::testkit::connect_qp(qp, qp->qp_num, ah, {}) && to_sqd(qp) == 0 &&
      softverbs::testkit::query_state(qp) == IBV_QPS_SQD) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_SQD;
    attr.ah_attr = ah;
    rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV);
  }
  ibv_destroy_qp(qp);
  return rc;
}

TEST_F(ConnectxBehaviour, UcSqdToSqdTakesAnAddressVector) {
  EXPECT_EQ(uc_sqd_to_sqd_with_av(pd_, cq_a_, ctx_), 0);
}

TEST_F(RxeBehaviour, UcSqdToSqdRefusesAnAddressVector) {
  EXPECT_EQ(uc_sqd_to_sqd_with_av(pd_, cq_a_, ctx_), EINVAL);
}

// ---- posting -----------------------------------------------------------------

// A QP with nothing queued moved to the error state, then one receive posted.
int post_after_error(ibv_qp* qp) {
  to_error(qp);
  ibv_recv_wr wr{};
  wr.wr_id = 9;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

// An atomic on a misaligned remote address (buf_b_ + 4); ibv_post_send's result.
int post_misaligned_atomic(ibv_qp* qp, ibv_mr* local, ibv_mr* remote, ibv_send_wr* wr, ibv_send_wr** bad) {
  static ibv_sge sge;
  sge = {reinterpret_cast<uintptr_t>(local->addr), 8, local->lkey};
  *wr = {};
  wr->wr_id = 7;
  wr->opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr->sg_list = &sge;
  wr->num_sge = 1;
  wr->send_flags = IBV_SEND_SIGNALED;
  wr->wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(remote->addr) + 4;
  wr->wr.atomic.rkey = remote->rkey;
  wr->wr.atomic.compare_add = 1;
  return ibv_post_send(qp, wr, bad);
}

TEST_F(ConnectxBehaviour, MisalignedAtomicFailsAtTheResponder) {
  connect();
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(post_misaligned_atomic(a_, mr_a_, mr_b_, &wr, &bad), 0);
  EXPECT_EQ(one(cq_a_).status, IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(RxeBehaviour, MisalignedAtomicIsRefusedAtPost) {
  connect();
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(post_misaligned_atomic(a_, mr_a_, mr_b_, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  EXPECT_EQ(state(a_), IBV_QPS_RTS);
}

// An RDMA READ posted to a UC QP (UC has no reads) connected to itself.
int post_read_on_uc(ibv_pd* pd, ibv_cq* cq, ibv_context* ctx, ibv_mr* mr, ibv_send_wr** bad, ibv_send_wr* wr) {
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_UC;
  init.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &init);
  if (!qp) return -1;
  ibv_gid gid{};
  EXPECT_EQ(ibv_query_gid(ctx, 1, 1, &gid), 0);
  int rc = -1;
  if (softverbs::testkit::connect_qp(qp, qp->qp_num, ah_to_gid(gid, 1), {})) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(mr->addr), 8, mr->lkey};
    *wr = {};
    wr->wr_id = 5;
    wr->opcode = IBV_WR_RDMA_READ;
    wr->sg_list = &sge;
    wr->num_sge = 1;
    wr->send_flags = IBV_SEND_SIGNALED;
    wr->wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(mr->addr);
    wr->wr.rdma.rkey = mr->rkey;
    rc = ibv_post_send(qp, wr, bad);
  }
  // Its completion, if any, is read before the QP goes.
  if (rc == 0) {
    std::vector<ibv_wc> wcs = poll_completions(cq, 1, kWaitMs);
    rc = wcs.size() == 1 && wcs[0].status == IBV_WC_LOC_QP_OP_ERR ? 0 : -2;
  }
  ibv_destroy_qp(qp);
  return rc;
}

TEST_F(ConnectxBehaviour, OpcodeAServiceLacksFailsAtExecution) {
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(post_read_on_uc(pd_, cq_a_, ctx_, mr_a_, &bad, &wr), 0) << "posted, then IBV_WC_LOC_QP_OP_ERR";
}

TEST_F(RxeBehaviour, OpcodeAServiceLacksIsRefusedAtPost) {
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(post_read_on_uc(pd_, cq_a_, ctx_, mr_a_, &bad, &wr), EINVAL);
  EXPECT_EQ(bad, &wr);
}

TEST_F(ConnectxBehaviour, WorkPostedInErrorIsFlushed) {
  connect();
  ASSERT_EQ(post_after_error(b_), 0);
  const ibv_wc wc = one(cq_b_);
  EXPECT_EQ(wc.wr_id, 9u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(RxeBehaviour, WorkPostedInErrorNeverCompletes) {
  connect();
  ASSERT_EQ(post_after_error(b_), 0);
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(cq_b_, 1, &wc), 0);  // the post itself would have flushed it
}

// A valid SEND, a SEND whose SGE no region covers and another valid SEND,
// posted at once (b has receives for all): the send completions in order.
std::vector<ibv_wc> valid_bad_valid(ibv_qp* a, ibv_cq* cq, ibv_mr* mr) {
  ibv_sge good{reinterpret_cast<uintptr_t>(mr->addr), 64, mr->lkey};
  ibv_sge broken = good;
  broken.lkey = mr->lkey + 0x100000;
  ibv_send_wr wr[3]{};
  ibv_sge* sges[3] = {&good, &broken, &good};
  for (int i = 0; i < 3; ++i) {
    wr[i].wr_id = 10 + static_cast<uint64_t>(i);
    wr[i].opcode = IBV_WR_SEND;
    wr[i].sg_list = sges[i];
    wr[i].num_sge = 1;
    wr[i].send_flags = IBV_SEND_SIGNALED;
    if (i) wr[i - 1].next = &wr[i];
  }
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a, wr, &bad), 0);
  std::vector<ibv_wc> wcs = poll_completions(cq, 3, kWaitMs);
  EXPECT_EQ(wcs.size(), 3u);
  for (size_t i = 0; i < wcs.size(); ++i) EXPECT_EQ(wcs[i].wr_id, 10 + i);
  return wcs;
}

TEST_F(ConnectxBehaviour, LocalErrorFailsAtOnceFlushingTheUnacknowledgedSend) {
  connect();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(post_recv_b(4096), 0);
  const std::vector<ibv_wc> wcs = valid_bad_valid(a_, cq_a_, mr_a_);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wcs[1].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(wcs[2].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(state(a_), IBV_QPS_ERR);
}

TEST_F(RxeBehaviour, LocalErrorWaitsForTheEarlierSendsAcknowledgement) {
  connect();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(post_recv_b(4096), 0);
  const std::vector<ibv_wc> wcs = valid_bad_valid(a_, cq_a_, mr_a_);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(wcs[1].status, IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(wcs[2].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(state(a_), IBV_QPS_ERR);
  // The receiver got the first SEND only.
  const ibv_wc recv = one(cq_b_);
  EXPECT_EQ(recv.status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv.byte_len, 64u);
  ibv_wc more{};
  EXPECT_EQ(ibv_poll_cq(cq_b_, 1, &more), 0);
}

// An error completion on a CQ armed for solicited completions only.
// expect_wake: wait (bounded) for the event; otherwise look once, after the
// completion is in the CQ (the wake-up is decided when it is queued).
bool error_completion_wakes(ibv_cq* cq, ibv_comp_channel* ch, ibv_qp* qp, ibv_mr* mr, bool expect_wake) {
  EXPECT_EQ(ibv_req_notify_cq(cq, 1), 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(mr->addr), 64, mr->lkey + 0x100000};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &wr, &bad), 0);
  std::vector<ibv_wc> wcs = poll_completions(cq, 1, kWaitMs);
  EXPECT_EQ(wcs.size(), 1u);
  if (!wcs.empty()) {
    EXPECT_NE(wcs[0].status, IBV_WC_SUCCESS);
  }
  if (!(expect_wake ? wait_readable(ch->fd, kWaitMs) : readable_now(ch->fd))) return false;
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
  return true;
}

TEST_F(ConnectxBehaviour, ErrorCompletionWakesASolicitedOnlyCq) {
  connect();
  EXPECT_TRUE(error_completion_wakes(cq_a_, channel_, a_, mr_a_, true));
}

TEST_F(RxeBehaviour, ErrorCompletionDoesNotWakeASolicitedOnlyCq) {
  connect();
  EXPECT_FALSE(error_completion_wakes(cq_a_, channel_, a_, mr_a_, false));
}

}  // namespace
