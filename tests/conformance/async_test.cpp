// Asynchronous events on the context's async_fd.
#include <fcntl.h>

#include "conformance.hpp"

namespace conformance {
namespace {

class AsyncTest : public VerbsTest {};
CONFORMANCE_INSTANTIATE(AsyncTest);

TEST_P(AsyncTest, NonBlockingWithNothingQueued) {
  const int flags = set_nonblocking(ctx_->async_fd, true);
  ASSERT_GE(flags, 0);
  ibv_async_event ev{};
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(ctx_, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_GE(::fcntl(ctx_->async_fd, F_SETFL, flags), 0);
}

TEST_P(AsyncTest, LastWqeReachedForAnSrqQpInError) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Srq srq(softverbs::testkit::create_srq(pd_, 8));
  ASSERT_TRUE(srq) << std::strerror(errno);
  Qp other = make_qp(IBV_QPT_RC, cq.get(), srq.get());
  Qp qp = make_qp(IBV_QPT_RC, cq.get(), srq.get());
  ASSERT_TRUE(qp && other);
  ASSERT_EQ(move_to(qp.get(), IBV_QPS_RTS), 0);
  ASSERT_EQ(modify_min(qp.get(), IBV_QPS_ERR), 0);

  ASSERT_TRUE(wait_readable(ctx_->async_fd)) << "no async event within " << kEventTimeoutMs << " ms";
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED) << ibv_event_type_str(ev.event_type);
  EXPECT_EQ(ev.element.qp, qp.get()) << "the event names another QP";
  ibv_ack_async_event(&ev);
  // Nothing else: the other QP on the SRQ is untouched.
  EXPECT_FALSE(wait_readable(ctx_->async_fd, 0));

  // Every reported event was acknowledged, so destroying does not wait.
  EXPECT_EQ(qp.destroy(), 0);
  EXPECT_EQ(other.destroy(), 0);
  EXPECT_EQ(srq.destroy(), 0);
}

TEST_P(AsyncTest, QpWithoutSrqRaisesNoLastWqeEvent) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ASSERT_EQ(move_to(qp.get(), IBV_QPS_ERR), 0);
  EXPECT_FALSE(wait_readable(ctx_->async_fd, 0)) << "an async event for a QP without an SRQ";
}

TEST_P(AsyncTest, EventsOfOneContextStayThere) {
  Context other(ibv_open_device(device_));
  ASSERT_TRUE(other);
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Srq srq(softverbs::testkit::create_srq(pd_, 4));
  ASSERT_TRUE(srq);
  Qp qp = make_qp(IBV_QPT_UD, cq.get(), srq.get());
  ASSERT_TRUE(qp);
  ASSERT_EQ(move_to(qp.get(), IBV_QPS_ERR), 0);
  ASSERT_TRUE(wait_readable(ctx_->async_fd));
  EXPECT_FALSE(wait_readable(other->async_fd, 0)) << "the event was delivered to another context";
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev.element.qp, qp.get());
  ibv_ack_async_event(&ev);
}

}  // namespace
}  // namespace conformance
