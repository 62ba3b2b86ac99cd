// Work queues (emu/qp/wq.hpp): sized at creation, allocated at the first post,
// so an idle queue holds no ring; posting past the capacity is ENOMEM.
#include <gtest/gtest.h>

#include <cerrno>

#include "emu/qp/wq.hpp"

namespace softverbs::emu {
namespace {

TEST(WorkQueue, RingIsAllocatedAtTheFirstPost) {
  WorkQueue<RecvWqe> rq(4, 2);
  // Before any post the queue reports its size and holds nothing.
  EXPECT_EQ(rq.capacity(), 4u);
  EXPECT_EQ(rq.max_sge(), 2u);
  EXPECT_TRUE(rq.empty());
  ibv_sge sges[2] = {{0x1000, 8, 7}, {0x2000, 16, 7}};
  ibv_recv_wr wr{};
  wr.wr_id = 42;
  wr.sg_list = sges;
  wr.num_sge = 2;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(post_recv_wqe(rq, wr), 0);
  EXPECT_EQ(post_recv_wqe(rq, wr), ENOMEM);  // full
  EXPECT_EQ(rq.size(), 4u);
  EXPECT_EQ(rq.front().wr_id, 42u);
  EXPECT_EQ(rq.front().total_length, 24u);
  EXPECT_EQ(rq.sges_at(0)[1].addr, 0x2000u);
  rq.pop();
  EXPECT_EQ(post_recv_wqe(rq, wr), 0);
  EXPECT_EQ(rq.reserve(), 0);  // already there: nothing changes
  EXPECT_EQ(rq.size(), 4u);
}

TEST(WorkQueue, TooManySgesIsRefusedBeforeAllocating) {
  WorkQueue<RecvWqe> rq(2, 1);
  ibv_sge sges[2] = {};
  ibv_recv_wr wr{};
  wr.sg_list = sges;
  wr.num_sge = 2;
  EXPECT_EQ(post_recv_wqe(rq, wr), EINVAL);
  EXPECT_TRUE(rq.empty());
}

TEST(WorkQueue, AQueueOfNoEntriesTakesNone) {
  WorkQueue<RecvWqe> rq(0, 0);
  ibv_recv_wr wr{};
  EXPECT_EQ(post_recv_wqe(rq, wr), ENOMEM);
  EXPECT_TRUE(rq.empty());
}

}  // namespace
}  // namespace softverbs::emu
