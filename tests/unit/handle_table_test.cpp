// A context's object numbers (emu/objects/handle.hpp): numbered as the kernel's
// per-file object table numbers them, and looked up by (struct, number).
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "emu/objects/handle.hpp"

namespace softverbs::emu {
namespace {

TEST(HandleTable, NumbersAreTheLowestFreeAcrossTypes) {
  HandleTable t;
  int a = 0, b = 0, c = 0, d = 0;
  EXPECT_EQ(t.add(ObjectType::pd, &a), 0u);
  EXPECT_EQ(t.add(ObjectType::cq, &b), 1u);
  EXPECT_EQ(t.add(ObjectType::qp, &c), 2u);
  t.remove(1);
  // A freed number is given again, to an object of any type (xa_alloc).
  EXPECT_EQ(t.add(ObjectType::mr, &d), 1u);
  EXPECT_EQ(t.add(ObjectType::srq, &b), 3u);
}

TEST(HandleTable, LookupByStructAndNumber) {
  HandleTable t;
  int pd1 = 0, pd2 = 0, cq = 0;
  const uint32_t h1 = t.add(ObjectType::pd, &pd1);
  const uint32_t h2 = t.add(ObjectType::pd, &pd2);
  const uint32_t hc = t.add(ObjectType::cq, &cq);
  EXPECT_EQ(t.check(ObjectType::pd, &pd1, h1), 0);
  EXPECT_EQ(t.check(ObjectType::cq, &cq, hc), 0);
  // No object with that number: ENOENT (lookup_get_idr_uobject).
  EXPECT_EQ(t.check(ObjectType::pd, &pd1, 1000), ENOENT);
  // An object of another type: EINVAL (rdma_lookup_get_uobject).
  EXPECT_EQ(t.check(ObjectType::pd, &pd1, hc), EINVAL);
  // Another object of the same type: refused, never acted on.
  EXPECT_EQ(t.check(ObjectType::pd, &pd1, h2), EINVAL);
  // The right number asked with the wrong type.
  EXPECT_EQ(t.check(ObjectType::cq, &pd1, h1), EINVAL);
  // A removed number is free: its old struct is not found any more.
  t.remove(h1);
  EXPECT_EQ(t.check(ObjectType::pd, &pd1, h1), ENOENT);
  t.remove(h1);  // twice is harmless
  t.remove(5000);
  EXPECT_EQ(t.check(ObjectType::pd, &pd2, h2), 0);
}

// Numbers freed in any order come back lowest first, however many there are.
TEST(HandleTable, FreedNumbersComeBackLowestFirst) {
  HandleTable t;
  int obj = 0;
  constexpr uint32_t kCount = 10000;
  for (uint32_t i = 0; i < kCount; ++i) ASSERT_EQ(t.add(ObjectType::pd, &obj), i);
  // Free every third number, from the top down, then a few more from the bottom up.
  std::vector<uint32_t> freed;
  for (uint32_t i = kCount; i-- > 0;)
    if (i % 3 == 0) freed.push_back(i);
  for (uint32_t i = 1; i < 200; i += 3) freed.push_back(i);
  for (uint32_t h : freed) t.remove(h);
  std::sort(freed.begin(), freed.end());
  for (uint32_t h : freed) ASSERT_EQ(t.add(ObjectType::mr, &obj), h);
  EXPECT_EQ(t.add(ObjectType::mr, &obj), kCount);  // none free: the next new number
}

}  // namespace
}  // namespace softverbs::emu
