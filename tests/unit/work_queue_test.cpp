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

// An SRQ resized with IBV_SRQ_MAX_WR (the personality's queues.srq_resize): the
// receives queued, wrapped round the old ring, come out in order with their
// SGEs; a depth below them, or a ring in storage the caller owns, is EINVAL.
TEST(WorkQueue, ResizeKeepsTheQueuedEntriesInOrder) {
  WorkQueue<RecvWqe> rq(3, 2);
  EXPECT_EQ(rq.resize(4), 0);  // no ring yet: only the depth changes
  EXPECT_EQ(rq.capacity(), 4u);
  ibv_sge sges[2] = {{0x1000, 8, 7}, {0x2000, 16, 7}};
  ibv_recv_wr wr{};
  wr.sg_list = sges;
  wr.num_sge = 2;
  for (uint64_t id = 0; id < 4; ++id) {
    wr.wr_id = id;
    ASSERT_EQ(post_recv_wqe(rq, wr), 0);
  }
  rq.pop();
  rq.pop();
  for (uint64_t id = 4; id < 6; ++id) {  // these wrap round the ring of 4
    wr.wr_id = id;
    sges[1].addr = 0x2000 + id;
    ASSERT_EQ(post_recv_wqe(rq, wr), 0);
  }
  EXPECT_EQ(rq.resize(3), EINVAL);  // 4 queued
  ASSERT_EQ(rq.resize(9), 0);
  EXPECT_EQ(rq.capacity(), 9u);
  ASSERT_EQ(rq.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(rq.at(i).wr_id, 2u + i);
  EXPECT_EQ(rq.sges_at(3)[1].addr, 0x2005u);
  for (uint64_t id = 6; id < 11; ++id) {
    wr.wr_id = id;
    ASSERT_EQ(post_recv_wqe(rq, wr), 0);
  }
  EXPECT_EQ(post_recv_wqe(rq, wr), ENOMEM);  // 9 now
  EXPECT_EQ(rq.at(8).wr_id, 10u);

  alignas(64) static uint8_t storage[4096];
  ASSERT_LE(WorkQueue<RecvWqe>::bytes_for(2, 1), sizeof storage);
  WorkQueue<RecvWqe> placed(2, 1, 0, storage);
  EXPECT_EQ(placed.resize(4), EINVAL);
}

}  // namespace
}  // namespace softverbs::emu
