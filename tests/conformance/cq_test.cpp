// Completion channels, completion queues, and completion events end to end:
// flushed receive completions stand in for traffic, so no data path is needed.
#include <fcntl.h>
#include <poll.h>

#include <chrono>

#include "conformance.hpp"

namespace conformance {
namespace {

class ChannelTest : public VerbsTest {};
CONFORMANCE_INSTANTIATE(ChannelTest);
class CqTest : public VerbsTest {
 protected:
  // Posts n receives (wr_id first, first+1, ...) to a QP in INIT, then moves
  // it to ERR: each comes back on the receive CQ flushed.
  void flush_receives(ibv_qp* qp, int n, uint64_t first) {
    ASSERT_EQ(move_to(qp, IBV_QPS_INIT), 0);
    for (int i = 0; i < n; ++i) {
      ibv_recv_wr wr{};
      wr.wr_id = first + static_cast<uint64_t>(i);
      wr.sg_list = nullptr;
      wr.num_sge = 0;
      ibv_recv_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0) << "receive " << i;
    }
    ASSERT_EQ(modify_min(qp, IBV_QPS_ERR), 0);
  }

  // Polls exactly n completions and checks they are the flushed receives.
  void expect_flushed(ibv_cq* cq, ibv_qp* qp, int n, uint64_t first) {
    std::vector<ibv_wc> wc = poll_completions(cq, n);
    ASSERT_EQ(static_cast<int>(wc.size()), n);
    for (int i = 0; i < n; ++i) {
      SCOPED_TRACE("completion " + std::to_string(i));
      EXPECT_EQ(wc[static_cast<size_t>(i)].status, IBV_WC_WR_FLUSH_ERR);
      EXPECT_EQ(wc[static_cast<size_t>(i)].wr_id, first + static_cast<uint64_t>(i));
      EXPECT_EQ(wc[static_cast<size_t>(i)].qp_num, qp->qp_num);
    }
    ibv_wc extra;
    EXPECT_EQ(ibv_poll_cq(cq, 1, &extra), 0) << "more completions than work requests";
  }
};
CONFORMANCE_INSTANTIATE(CqTest);

// ---- completion channels -------------------------------------------------

TEST_P(ChannelTest, CreateAndDestroy) {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
  ASSERT_NE(ch, nullptr) << std::strerror(errno);
  EXPECT_EQ(ch->context, ctx_);
  EXPECT_GE(ch->fd, 0);
  EXPECT_EQ(ch->refcnt, 0);
  // A real descriptor, pollable, nothing pending.
  EXPECT_GE(::fcntl(ch->fd, F_GETFL), 0);
  pollfd p{};
  p.fd = ch->fd;
  p.events = POLLIN;
  EXPECT_EQ(::poll(&p, 1, 0), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

TEST_P(ChannelTest, DestroyWhileACqUsesItIsBusy) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  Cq cq = make_cq(4, ch.get());
  ASSERT_TRUE(cq);
  EXPECT_EQ(ch->refcnt, 1);
  // rdma-core returns EBUSY itself (errno is not set).
  EXPECT_EQ(ch.destroy(), EBUSY);
  EXPECT_EQ(cq.destroy(), 0);
  EXPECT_EQ(ch->refcnt, 0);
  EXPECT_EQ(ch.destroy(), 0);
}

TEST_P(ChannelTest, SeveralCqsShareAChannel) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  Cq a = make_cq(4, ch.get());
  Cq b = make_cq(4, ch.get());
  ASSERT_TRUE(a && b);
  EXPECT_EQ(ch->refcnt, 2);
  a.reset();
  EXPECT_EQ(ch.destroy(), EBUSY);
  b.reset();
  EXPECT_EQ(ch.destroy(), 0);
}

TEST_P(ChannelTest, NonBlockingGetCqEventWithoutEvent) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  Cq cq = make_cq(4, ch.get());
  ASSERT_TRUE(cq);
  ASSERT_EQ(ibv_req_notify_cq(cq.get(), 0), 0);
  ASSERT_GE(set_nonblocking(ch->fd, true), 0);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(ch.get(), &ev_cq, &ev_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
}

// ---- create / destroy -----------------------------------------------------

TEST_P(CqTest, CreateFields) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  int tag = 0;
  Cq cq(ibv_create_cq(ctx_, 8, &tag, ch.get(), 0));
  ASSERT_TRUE(cq) << std::strerror(errno);
  EXPECT_EQ(cq->context, ctx_);
  EXPECT_EQ(cq->channel, ch.get());
  EXPECT_EQ(cq->cq_context, &tag);
  EXPECT_GE(cq->cqe, 8);
  Cq plain(ibv_create_cq(ctx_, 8, nullptr, nullptr, 0));
  ASSERT_TRUE(plain) << std::strerror(errno);
  EXPECT_EQ(plain->channel, nullptr);
  EXPECT_EQ(plain->cq_context, nullptr);
}

TEST_P(CqTest, ActualSizeIsAtLeastRequested) {
  for (int cqe : {1, 2, 10, 100, 128, 4096}) {
    SCOPED_TRACE("cqe " + std::to_string(cqe));
    Cq cq(ibv_create_cq(ctx_, cqe, nullptr, nullptr, 0));
    ASSERT_TRUE(cq) << std::strerror(errno);
    observe("cqe", std::to_string(cqe) + "->" + std::to_string(cq->cqe));
    EXPECT_GE(cq->cqe, cqe);
  }
}

TEST_P(CqTest, CreateAtTheDeviceLimit) {
  Cq cq(ibv_create_cq(ctx_, dattr_.max_cqe, nullptr, nullptr, 0));
  ASSERT_TRUE(cq) << std::strerror(errno);
  EXPECT_GE(cq->cqe, dattr_.max_cqe);
}

TEST_P(CqTest, CreateRejectsBadSizes) {
  for (int cqe : {0, -1, dattr_.max_cqe + 1}) {
    SCOPED_TRACE("cqe " + std::to_string(cqe));
    errno = 0;
    ibv_cq* cq = ibv_create_cq(ctx_, cqe, nullptr, nullptr, 0);
    EXPECT_EQ(cq, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (cq) ibv_destroy_cq(cq);
  }
}

TEST_P(CqTest, CreateRejectsBadCompVector) {
  for (int vec : {ctx_->num_comp_vectors, ctx_->num_comp_vectors + 100, -1}) {
    SCOPED_TRACE("comp_vector " + std::to_string(vec));
    errno = 0;
    ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, nullptr, vec);
    EXPECT_EQ(cq, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (cq) ibv_destroy_cq(cq);
  }
  // Every valid vector works.
  for (int vec = 0; vec < ctx_->num_comp_vectors; ++vec) {
    Cq cq(ibv_create_cq(ctx_, 4, nullptr, nullptr, vec));
    EXPECT_TRUE(cq) << "comp_vector " << vec << ": " << std::strerror(errno);
  }
}

TEST_P(CqTest, DestroyWhileAQpUsesItIsBusy) {
  Cq send_cq = make_cq();
  Cq recv_cq = make_cq();
  ASSERT_TRUE(send_cq && recv_cq);
  ibv_qp_init_attr init = qp_init_attr(IBV_QPT_RC, send_cq.get());
  init.recv_cq = recv_cq.get();
  Qp qp = make_qp(init);
  ASSERT_TRUE(qp);
  errno = 0;
  EXPECT_EQ(send_cq.destroy(), EBUSY);
  EXPECT_EQ(errno, EBUSY);  // the kernel's errno, left by rdma-core
  errno = 0;
  EXPECT_EQ(recv_cq.destroy(), EBUSY);
  EXPECT_EQ(errno, EBUSY);
  EXPECT_EQ(qp.destroy(), 0);
  EXPECT_EQ(send_cq.destroy(), 0);
  EXPECT_EQ(recv_cq.destroy(), 0);
}

// ---- poll / notify / resize -----------------------------------------------

TEST_P(CqTest, PollEmpty) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  ibv_wc wc[4];
  EXPECT_EQ(ibv_poll_cq(cq.get(), 4, wc), 0);
  EXPECT_EQ(ibv_poll_cq(cq.get(), 1, wc), 0);
  EXPECT_EQ(ibv_poll_cq(cq.get(), 0, wc), 0);
}

TEST_P(CqTest, ReqNotify) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  Cq cq = make_cq(4, ch.get());
  ASSERT_TRUE(cq);
  EXPECT_EQ(ibv_req_notify_cq(cq.get(), 0), 0);
  EXPECT_EQ(ibv_req_notify_cq(cq.get(), 1), 0);
  EXPECT_EQ(ibv_req_notify_cq(cq.get(), 0), 0);
  // Arming alone raises nothing.
  EXPECT_FALSE(wait_readable(ch->fd, 0));
}

TEST_P(CqTest, ResizeBiggerAndSmaller) {
  Cq cq = make_cq(16);
  ASSERT_TRUE(cq);
  ASSERT_EQ(ibv_resize_cq(cq.get(), 1000), 0);
  EXPECT_GE(cq->cqe, 1000);
  ASSERT_EQ(ibv_resize_cq(cq.get(), 8), 0);
  EXPECT_GE(cq->cqe, 8);
  ASSERT_EQ(ibv_resize_cq(cq.get(), 8), 0);
  EXPECT_GE(cq->cqe, 8);
}

TEST_P(CqTest, ResizeKeepsOutstandingCompletions) {
  Cq cq = make_cq(64);
  ASSERT_TRUE(cq);
  ibv_qp_init_attr init = qp_init_attr(IBV_QPT_RC, cq.get());
  init.cap.max_recv_wr = 8;
  Qp qp = make_qp(init);
  ASSERT_TRUE(qp);
  ASSERT_NO_FATAL_FAILURE(flush_receives(qp.get(), 6, 100));
  // Smaller, but still room for the six outstanding completions.
  ASSERT_EQ(ibv_resize_cq(cq.get(), 6), 0);
  EXPECT_GE(cq->cqe, 6);
  ASSERT_NO_FATAL_FAILURE(expect_flushed(cq.get(), qp.get(), 6, 100));
}

TEST_P(CqTest, ResizeRejectsBadSizes) {
  Cq cq = make_cq(16);
  ASSERT_TRUE(cq);
  const int before = cq->cqe;
  EXPECT_EQ(ibv_resize_cq(cq.get(), 0), EINVAL);
  EXPECT_EQ(ibv_resize_cq(cq.get(), -1), EINVAL);
  EXPECT_EQ(ibv_resize_cq(cq.get(), dattr_.max_cqe + 1), EINVAL);
  EXPECT_EQ(cq->cqe, before);
}

// ---- extended CQs -----------------------------------------------------------

TEST_P(CqTest, CreateCqExStandardFlags) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  int tag = 0;
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 16;
  attr.cq_context = &tag;
  attr.channel = ch.get();
  attr.comp_vector = 0;
  attr.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
  ASSERT_NE(cqx, nullptr) << std::strerror(errno);
  Cq cq(ibv_cq_ex_to_cq(cqx));
  EXPECT_EQ(cq->context, ctx_);
  EXPECT_EQ(cq->channel, ch.get());
  EXPECT_EQ(cq->cq_context, &tag);
  EXPECT_GE(cq->cqe, 16);
  // Nothing to read: ENOENT, and no end_poll is due.
  ibv_poll_cq_attr pa{};
  EXPECT_EQ(ibv_start_poll(cqx, &pa), ENOENT);
  // The classic poll works on it too.
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(cq.get(), 1, &wc), 0);
}

TEST_P(CqTest, CqExReadsFlushedCompletions) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 16;
  attr.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
  ASSERT_NE(cqx, nullptr) << std::strerror(errno);
  Cq cq(ibv_cq_ex_to_cq(cqx));
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ASSERT_NO_FATAL_FAILURE(flush_receives(qp.get(), 3, 7));
  ibv_poll_cq_attr pa{};
  ASSERT_EQ(ibv_start_poll(cqx, &pa), 0);
  for (uint64_t i = 0; i < 3; ++i) {
    if (i > 0) {
      ASSERT_EQ(ibv_next_poll(cqx), 0);
    }
    EXPECT_EQ(cqx->wr_id, 7 + i);
    EXPECT_EQ(cqx->status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(ibv_wc_read_qp_num(cqx), qp->qp_num);
  }
  EXPECT_EQ(ibv_next_poll(cqx), ENOENT);
  ibv_end_poll(cqx);
  EXPECT_EQ(ibv_start_poll(cqx, &pa), ENOENT);
}

TEST_P(CqTest, CreateCqExUnknownWcFlags) {
  // Bits rdma-core does not know: the library answers EOPNOTSUPP.
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 16;
  attr.wc_flags = IBV_WC_STANDARD_FLAGS | (uint64_t{1} << 20);
  errno = 0;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
  EXPECT_EQ(cqx, nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  if (cqx) ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
}

TEST_P(CqTest, CreateCqExFlagsTheDeviceMayNotSupport) {
  // Flow tags and tag-matching info are known to rdma-core but optional for a
  // device: it either provides them or answers EOPNOTSUPP (ConnectX supports
  // both).
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 16;
  attr.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_FLOW_TAG | IBV_WC_EX_WITH_TM_INFO;
  errno = 0;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
  observe("ibv_create_cq_ex.flow_tag_tm_info", outcome(cqx));
  if (cqx) {
    EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
  } else {
    EXPECT_EQ(errno, EOPNOTSUPP);
  }
}

// Every wc_flags bit ConnectX accepts (mlx5's CREATE_CQ_SUPPORTED_WC_FLAGS), and
// each reader returning a real value: timestamps of the completion (the raw one
// on the clock ibv_query_rt_values_ex reads, within the timestamp mask), no
// VLAN, flow tag or tag-matching info on a flushed receive.
TEST_P(CqTest, CreateCqExConnectXWcFlags) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 16;
  attr.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_CVLAN |
                  IBV_WC_EX_WITH_FLOW_TAG | IBV_WC_EX_WITH_TM_INFO |
                  IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
  ASSERT_NE(cqx, nullptr) << std::strerror(errno);
  Cq cq(ibv_cq_ex_to_cq(cqx));
  ibv_device_attr_ex dx{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &dx), 0);
  EXPECT_NE(dx.hca_core_clock, 0u);
  EXPECT_NE(dx.completion_timestamp_mask, 0u);
  ibv_values_ex before{};
  before.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  ASSERT_EQ(ibv_query_rt_values_ex(ctx_, &before), 0);
  EXPECT_EQ(before.comp_mask, uint32_t{IBV_VALUES_MASK_RAW_CLOCK});
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ASSERT_NO_FATAL_FAILURE(flush_receives(qp.get(), 1, 77));
  ibv_poll_cq_attr pa{};
  // The flush runs on the device's own time: poll until it is there (bounded).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kEventTimeoutMs);
  int started = ENOENT;
  while ((started = ibv_start_poll(cqx, &pa)) == ENOENT && std::chrono::steady_clock::now() < deadline) {
  }
  ASSERT_EQ(started, 0);
  ibv_values_ex after{};
  after.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  EXPECT_EQ(ibv_query_rt_values_ex(ctx_, &after), 0);
  EXPECT_EQ(cqx->wr_id, 77u);
  EXPECT_EQ(cqx->status, IBV_WC_WR_FLUSH_ERR);
  const uint64_t ts = ibv_wc_read_completion_ts(cqx);
  const uint64_t raw_before = static_cast<uint64_t>(before.raw_clock.tv_sec) * 1000000000u +
                              static_cast<uint64_t>(before.raw_clock.tv_nsec);
  const uint64_t raw_after = static_cast<uint64_t>(after.raw_clock.tv_sec) * 1000000000u +
                             static_cast<uint64_t>(after.raw_clock.tv_nsec);
  EXPECT_EQ(ts & ~dx.completion_timestamp_mask, 0u);
  EXPECT_LE(raw_before & dx.completion_timestamp_mask, ts);
  EXPECT_LE(ts, raw_after & dx.completion_timestamp_mask);
  EXPECT_NE(ibv_wc_read_completion_wallclock_ns(cqx), 0u);
  EXPECT_EQ(ibv_wc_read_cvlan(cqx), 0u);
  EXPECT_EQ(ibv_wc_read_flow_tag(cqx), 0u);
  ibv_wc_tm_info tm;
  std::memset(&tm, 0xff, sizeof tm);
  ibv_wc_read_tm_info(cqx, &tm);
  EXPECT_EQ(tm.tag, 0u);
  EXPECT_EQ(tm.priv, 0u);
  ibv_end_poll(cqx);
}

// IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN (ConnectX accepts it): a CQ that takes more
// completions than it holds reports no overrun (no IBV_EVENT_CQ_ERR) and its
// QP does not fail (no IBV_EVENT_QP_FATAL); polling still works.
TEST_P(CqTest, CreateCqExIgnoreOverrun) {
  ibv_cq_init_attr_ex attr{};
  attr.cqe = 1;
  attr.wc_flags = IBV_WC_STANDARD_FLAGS;
  attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  attr.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
  ASSERT_NE(cqx, nullptr) << std::strerror(errno);
  Cq cq(ibv_cq_ex_to_cq(cqx));
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  const int n = cq->cqe + 3;  // more flushed receives than the CQ holds
  ASSERT_NO_FATAL_FAILURE(flush_receives(qp.get(), n, 500));
  std::vector<ibv_wc> wc = poll_completions(cq.get(), 1);
  ASSERT_FALSE(wc.empty());
  EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
  // No asynchronous event for the CQ or the QP within the quiet window.
  ibv_async_event ev{};
  if (softverbs::testkit::next_async_event(ctx_, &ev, 100)) {
    ADD_FAILURE() << "unexpected async event " << ibv_event_type_str(ev.event_type);
    ibv_ack_async_event(&ev);
  }
  wc = poll_completions(cq.get(), n, 100);  // whatever is left: at most the CQ's size
  EXPECT_LE(static_cast<int>(wc.size()), cq->cqe);
}

TEST_P(CqTest, CreateCqExBadAttributes) {
  {
    SCOPED_TRACE("cqe 0");
    ibv_cq_init_attr_ex attr{};
    attr.cqe = 0;
    attr.wc_flags = IBV_WC_STANDARD_FLAGS;
    errno = 0;
    ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
    EXPECT_EQ(cqx, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (cqx) ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
  }
  {
    SCOPED_TRACE("cqe above max_cqe");
    ibv_cq_init_attr_ex attr{};
    attr.cqe = static_cast<uint32_t>(dattr_.max_cqe) + 1;
    errno = 0;
    ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
    EXPECT_EQ(cqx, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (cqx) ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
  }
  {
    SCOPED_TRACE("comp_vector out of range");
    ibv_cq_init_attr_ex attr{};
    attr.cqe = 4;
    attr.comp_vector = static_cast<uint32_t>(ctx_->num_comp_vectors);
    errno = 0;
    ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
    EXPECT_EQ(cqx, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (cqx) ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
  }
  {
    // ConnectX (mlx5): an unknown comp_mask bit or creation flag is EINVAL.
    SCOPED_TRACE("unknown comp_mask bit");
    ibv_cq_init_attr_ex attr{};
    attr.cqe = 4;
    attr.comp_mask = 1u << 10;
    errno = 0;
    ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
    EXPECT_EQ(cqx, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (cqx) ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
  }
  {
    SCOPED_TRACE("unknown creation flag");
    ibv_cq_init_attr_ex attr{};
    attr.cqe = 4;
    attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
    attr.flags = 1u << 7;
    errno = 0;
    ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &attr);
    EXPECT_EQ(cqx, nullptr);
    EXPECT_EQ(errno, EINVAL);
    if (cqx) ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
  }
}

// ---- completion events end to end ------------------------------------------

TEST_P(CqTest, FlushedReceivesComplete) {
  Cq cq = make_cq(16);
  ASSERT_TRUE(cq);
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ASSERT_NO_FATAL_FAILURE(flush_receives(qp.get(), 3, 0x1000));
  ASSERT_NO_FATAL_FAILURE(expect_flushed(cq.get(), qp.get(), 3, 0x1000));
}

TEST_P(CqTest, FlushedReceivesGoToTheReceiveCq) {
  Cq send_cq = make_cq(16);
  Cq recv_cq = make_cq(16);
  ASSERT_TRUE(send_cq && recv_cq);
  ibv_qp_init_attr init = qp_init_attr(IBV_QPT_UD, send_cq.get());
  init.recv_cq = recv_cq.get();
  Qp qp = make_qp(init);
  ASSERT_TRUE(qp);
  ASSERT_NO_FATAL_FAILURE(flush_receives(qp.get(), 2, 42));
  ASSERT_NO_FATAL_FAILURE(expect_flushed(recv_cq.get(), qp.get(), 2, 42));
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(send_cq.get(), 1, &wc), 0);
}

TEST_P(CqTest, CompletionEventOnArmedCq) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  int tag = 0;
  Cq cq(ibv_create_cq(ctx_, 16, &tag, ch.get(), 0));
  ASSERT_TRUE(cq);
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ASSERT_EQ(ibv_req_notify_cq(cq.get(), 0), 0);
  ASSERT_NO_FATAL_FAILURE(flush_receives(qp.get(), 3, 1));
  ASSERT_TRUE(wait_readable(ch->fd)) << "no completion event within " << kEventTimeoutMs << " ms";
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch.get(), &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, cq.get());
  EXPECT_EQ(ev_ctx, &tag);
  ibv_ack_cq_events(cq.get(), 1);
  ASSERT_NO_FATAL_FAILURE(expect_flushed(cq.get(), qp.get(), 3, 1));
  // One arm, one event.
  EXPECT_FALSE(wait_readable(ch->fd, 0)) << "a second event for a single arm";
  EXPECT_EQ(qp.destroy(), 0);
  EXPECT_EQ(cq.destroy(), 0);
  EXPECT_EQ(ch.destroy(), 0);
}

TEST_P(CqTest, NoEventWithoutArming) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  Cq cq = make_cq(16, ch.get());
  ASSERT_TRUE(cq);
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ASSERT_NO_FATAL_FAILURE(flush_receives(qp.get(), 1, 1));
  ASSERT_NO_FATAL_FAILURE(expect_flushed(cq.get(), qp.get(), 1, 1));
  EXPECT_FALSE(wait_readable(ch->fd, 0)) << "an event although the CQ was never armed";
}

TEST_P(CqTest, SolicitedOnlyArmingStillReportsErrors) {
  // Completions in error always raise the event (IBTA 11.4.2.2), even when the
  // CQ was armed for solicited completions only.
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  Cq cq = make_cq(16, ch.get());
  ASSERT_TRUE(cq);
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ASSERT_EQ(ibv_req_notify_cq(cq.get(), 1), 0);
  ASSERT_NO_FATAL_FAILURE(flush_receives(qp.get(), 2, 5));
  ASSERT_TRUE(wait_readable(ch->fd)) << "no event for flushed completions with solicited-only arming";
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch.get(), &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, cq.get());
  ibv_ack_cq_events(ev_cq, 1);
  ASSERT_NO_FATAL_FAILURE(expect_flushed(cq.get(), qp.get(), 2, 5));
}

TEST_P(CqTest, NonBlockingChannelAfterTheEventWasTaken) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  Cq cq = make_cq(16, ch.get());
  ASSERT_TRUE(cq);
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ASSERT_GE(set_nonblocking(ch->fd, true), 0);
  ASSERT_EQ(ibv_req_notify_cq(cq.get(), 0), 0);
  ASSERT_NO_FATAL_FAILURE(flush_receives(qp.get(), 1, 9));
  ASSERT_TRUE(wait_readable(ch->fd));
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch.get(), &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(ch.get(), &ev_cq, &ev_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_NO_FATAL_FAILURE(expect_flushed(cq.get(), qp.get(), 1, 9));
}

TEST_P(CqTest, RearmAfterPollingRaisesAnotherEvent) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  Cq cq = make_cq(16, ch.get());
  ASSERT_TRUE(cq);
  Qp a = make_qp(IBV_QPT_RC, cq.get());
  Qp b = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(a && b);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_req_notify_cq(cq.get(), 0), 0);
  ASSERT_NO_FATAL_FAILURE(flush_receives(a.get(), 1, 1));
  ASSERT_TRUE(wait_readable(ch->fd));
  ASSERT_EQ(ibv_get_cq_event(ch.get(), &ev_cq, &ev_ctx), 0);
  ASSERT_NO_FATAL_FAILURE(expect_flushed(cq.get(), a.get(), 1, 1));
  ASSERT_EQ(ibv_req_notify_cq(cq.get(), 0), 0);
  ASSERT_NO_FATAL_FAILURE(flush_receives(b.get(), 1, 2));
  ASSERT_TRUE(wait_readable(ch->fd)) << "no event after re-arming";
  ASSERT_EQ(ibv_get_cq_event(ch.get(), &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, cq.get());
  // Acknowledging several events at once is allowed.
  ibv_ack_cq_events(cq.get(), 2);
  ASSERT_NO_FATAL_FAILURE(expect_flushed(cq.get(), b.get(), 1, 2));
}

}  // namespace
}  // namespace conformance
